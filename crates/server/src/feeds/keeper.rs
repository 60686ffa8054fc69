//! The keeper: the one thread that holds the graph [`Store`].
//!
//! Store calls block (SQLite reads pages from disk, a network store waits
//! for a round trip), so they never run on a worker or on the admin
//! listener's event loop: both hand the keeper a [`Job`] and go on. Sends
//! never come here at all (see the module above).
//!
//! # One order
//! Being one thread is what keeps feeds right without locks across the
//! store and the workers. Every change to the graph reaches this node's
//! connections as an [`Announcement`], numbered in the store's one change
//! sequence, and the keeper applies them in that order, one at a time,
//! telling each affected connection's worker through its mailbox. With
//! SQLite this node is the store's only writer, so the keeper numbers its
//! own writes and applies each as it makes it. With a shared store (Redis)
//! every node writes, and the store announces each change, numbered, from
//! the script that applies it; a [`ChangeStream`] thread hands what it hears
//! to the keeper, which applies it here, the node that wrote it included.
//! A write's answer waits until this keeper has applied its announcement
//! (`waiting`), so once a follow is answered, the follower's connections
//! on this node follow.
//!
//! # Reads and announcements
//! A connection is in [`Presence`] before its connect-time read is asked
//! for, so no change can fall between the two. The read returns the number
//! of the last change it includes (with Redis, read in one `MULTI` with the
//! list); an announcement of a change up to that number is already in it
//! and is not applied to that connection again (`ahead`), so a read is
//! never undone by an older change still on its way, nor repeated. With
//! SQLite every change is applied before the next job, so a read includes
//! exactly the changes applied so far. Connects come in bursts, so the
//! connects queued right behind one are read with it, in one store call
//! ([`Store::following_each`]; one `MULTI` with Redis), and each
//! connection is told its whole list ([`Apply::Replace`]).
//!
//! # Catching up
//! A subscription hears nothing while it is broken (a Redis restart, a cut
//! connection). So whenever the change stream subscribes again, and whenever an
//! announcement skips a number, does not parse, or is a bulk change too big
//! to list, the keeper **resyncs**: it reads the last change number, then
//! the known users, then every present user's whole following list, and
//! tells each connection to hold exactly that list ([`Apply::Replace`]).
//! Announcements up to the number read are then skipped, and writes of this
//! node waiting for one of them settle with the resync. A resync that fails
//! (the store unreachable) is tried again every [`RETRY`] until it passes.
//! So are the feeds of a connection whose attach the engine refused (it
//! could not reach Redis either), or whose read at connect failed: the
//! keeper reads them again and sends them on, and the worker attaches the
//! ones it lacks.

use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use myriad_graph::redis_store::Heard;
use myriad_graph::store::read_pages;
use myriad_graph::{
    Announced, Announcement, ChangeStream, DataDir, Edge, Store, StoreError, UserId,
};
use tokio::sync::oneshot;
use tracing::{info, warn};

use super::{
    settling, AckMaker, Applied, Apply, Direction, FeedChange, Feeds, FeedsError, KnownUsers,
    Presence, Relation, StreamCounts,
};
use crate::hub::{Event, Hub, Wakeups};
use crate::messages::engine::ConnRequest;

/// Users read per page when loading the known users.
const KNOWN_PAGE: usize = 100_000;

/// Users whose following lists one store call reads at most: a burst of
/// connects, or a resync, shares a round trip per this many.
const READ_BATCH: usize = 256;

/// How soon a failed resync is tried again.
const RETRY: Duration = Duration::from_millis(500);

/// The longest pause between attempts to subscribe again.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Work for the keeper.
pub(crate) enum Job {
    /// A connection of `user` opened: tell its worker whom the user follows.
    Open { user: UserId, to: ConnRequest },
    Change {
        direction: Direction,
        edges: Vec<Edge>,
        reply: oneshot::Sender<Result<Applied, FeedsError>>,
    },
    AddUsers {
        users: Vec<UserId>,
        reply: oneshot::Sender<Result<u64, FeedsError>>,
    },
    Read {
        relation: Relation,
        user: UserId,
        after: Option<UserId>,
        limit: usize,
        reply: oneshot::Sender<Result<Vec<UserId>, FeedsError>>,
    },
    /// The engine refused a feed of `to`'s: read its feeds again later.
    Refused { user: UserId, to: ConnRequest },
    /// What the change stream heard from a shared store.
    Heard(Heard),
    /// The change stream could not subscribe, or its subscription broke.
    Broken(StoreError),
    /// The node is shutting down: the keeper ends.
    Stop,
}

/// The keeper's queue and thread, as the node holds them.
pub(crate) struct Handle {
    jobs: Sender<Job>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Tells the change stream thread, if any, to end.
    stop_listening: Arc<AtomicBool>,
}

impl Handle {
    pub(crate) fn send(&self, job: Job) {
        // Fails only once the keeper has stopped, at shutdown; a job's
        // reply channel then closes, which its caller reports.
        let _ = self.jobs.send(job);
    }

    pub(crate) fn stop(&self) {
        // The change stream ends within its idle poll; nothing waits for it,
        // as nothing it could still hear matters at shutdown.
        self.stop_listening.store(true, Ordering::Release);
        self.send(Job::Stop);
        if let Some(thread) = self.thread.lock().expect("keeper lock poisoned").take() {
            if thread.join().is_err() {
                warn!("the graph keeper panicked");
            }
        }
    }
}

/// A connection as the keeper tells it apart: worker, slot and life.
type ConnKey = (usize, u32, u32);

fn key(to: &ConnRequest) -> ConnKey {
    (to.worker, to.conn, to.life)
}

/// The keeper thread's state.
pub struct Keeper {
    /// Held for the node's life when the store is in it (SQLite).
    _dir: Option<DataDir>,
    store: Box<dyn Store>,
    hub: Arc<Hub>,
    presence: Arc<Presence>,
    known: Arc<KnownUsers>,
    stream: Arc<StreamCounts>,
    max_following: u64,
    /// Whether the store announces its changes (shared by several nodes),
    /// or this keeper numbers its own writes.
    shared: bool,
    /// The last change applied to this node's connections.
    applied: u64,
    /// This node's writes whose announcements have not been applied yet,
    /// by change number: the acks their answers wait for.
    waiting: BTreeMap<u64, AckMaker>,
    /// Connections whose connect-time read includes changes past
    /// `applied`, up to which change.
    ahead: HashMap<ConnKey, u64>,
    /// A resync is owed: one failed and is to be tried again.
    owed: bool,
    /// Connections whose feeds the engine refused to attach (it could not
    /// reach Redis), or whose connect-time read failed (without a shared
    /// store; with one a resync is owed): their feeds are read and sent
    /// again.
    refused: Vec<(UserId, ConnRequest)>,
    /// When the owed resync and the refused connections are tried again.
    retry_at: Option<Instant>,
    /// The jobs workers, the admin API and the change stream send.
    queue: Receiver<Job>,
    /// A job taken from `queue` while gathering connects: handled next.
    next: Option<Job>,
}

impl Keeper {
    /// Starts the keeper over `store`. With a `changes` stream (a shared store),
    /// first subscribes to the store's announcements, failing the start
    /// when that fails, so that no change after the reads below goes
    /// unheard; then loads the known users and starts the keeper thread.
    pub fn start(
        dir: Option<DataDir>,
        mut store: Box<dyn Store>,
        changes: Option<ChangeStream>,
        hub: Arc<Hub>,
        max_following: u64,
    ) -> Result<Feeds, StoreError> {
        let (jobs, queue) = crossbeam_channel::unbounded();
        let stop_listening = Arc::new(AtomicBool::new(false));
        let stream = Arc::new(StreamCounts::default());
        let shared = changes.is_some();
        if let Some(changes) = changes {
            spawn_change_stream(changes, jobs.clone(), Arc::clone(&stop_listening))?;
            match queue.recv() {
                Ok(Job::Heard(Heard::Subscribed)) => {}
                Ok(Job::Broken(e)) => {
                    stop_listening.store(true, Ordering::Release);
                    return Err(e);
                }
                _ => unreachable!("only the change stream sends before the keeper runs"),
            }
        }
        let applied = store.last_change()?;
        let known = Arc::new(KnownUsers::default());
        let mut users = Vec::new();
        read_pages(&mut users, KNOWN_PAGE, u64::MAX, |after, n| {
            store.users(after, n)
        })?;
        known.extend(users);
        let presence = Arc::new(Presence::default());
        let keeper = Keeper {
            _dir: dir,
            store,
            hub,
            presence: Arc::clone(&presence),
            known: Arc::clone(&known),
            stream: Arc::clone(&stream),
            max_following,
            shared,
            applied,
            waiting: BTreeMap::new(),
            ahead: HashMap::new(),
            owed: false,
            refused: Vec::new(),
            retry_at: None,
            queue,
            next: None,
        };
        let thread = std::thread::Builder::new()
            .name("myriad-graph".into())
            .spawn(move || keeper.run())
            .map_err(|e| StoreError::Backend(format!("cannot start the graph keeper: {e}")))?;
        Ok(Feeds {
            keeper: Handle {
                jobs,
                thread: Mutex::new(Some(thread)),
                stop_listening,
            },
            presence,
            known,
            stream,
        })
    }

    fn run(mut self) {
        loop {
            let job = match (self.next.take(), self.retry_at) {
                (Some(job), _) => Ok(job),
                (None, None) => self
                    .queue
                    .recv()
                    .map_err(|_| RecvTimeoutError::Disconnected),
                (None, Some(at)) => self.queue.recv_deadline(at),
            };
            match job {
                Ok(job) => {
                    if self.handle(job).is_break() {
                        return;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => {}
            }
            if self.retry_at.is_some_and(|at| Instant::now() >= at) {
                self.retry();
            }
        }
    }

    /// Does `job`; breaks on [`Job::Stop`].
    fn handle(&mut self, job: Job) -> ControlFlow<()> {
        match job {
            Job::Open { user, to } => {
                let opened = self.gather_opens((user, to));
                self.open(&opened);
            }
            Job::Change {
                direction,
                edges,
                reply,
            } => {
                let _ = reply.send(self.change(direction, edges));
            }
            Job::AddUsers { users, reply } => {
                let _ = reply.send(self.add_users(users));
            }
            Job::Read {
                relation,
                user,
                after,
                limit,
                reply,
            } => {
                let page = match relation {
                    Relation::Followers => self.store.followers(user, after, limit),
                    Relation::Following => self.store.following(user, after, limit),
                };
                let _ = reply.send(page.map_err(FeedsError::from));
            }
            Job::Refused { user, to } => self.read_again_later(user, to),
            Job::Heard(Heard::Subscribed) => {
                info!(
                    "subscribed to the graph's changes again: reading every present user's follows"
                );
                self.resync(Vec::new());
            }
            Job::Heard(Heard::Change(announcement)) => self.heard(announcement),
            Job::Heard(Heard::Garbled(e)) => {
                warn!(error = %e, "reading every present user's follows again");
                self.resync(Vec::new());
            }
            Job::Broken(e) => {
                self.stream.listen_failures.fetch_add(1, Ordering::Relaxed);
                warn!(error = %e, "the subscription to the graph's changes failed");
            }
            Job::Stop => return ControlFlow::Break(()),
        }
        ControlFlow::Continue(())
    }

    /// `first` and the connects queued right behind it, up to
    /// [`READ_BATCH`]: connections come in bursts, and their lists are
    /// read in one store call. The first other job is kept for next, so
    /// jobs keep their order.
    fn gather_opens(&mut self, first: (UserId, ConnRequest)) -> Vec<(UserId, ConnRequest)> {
        let mut opened = vec![first];
        while opened.len() < READ_BATCH {
            match self.queue.try_recv() {
                Ok(Job::Open { user, to }) => opened.push((user, to)),
                Ok(other) => {
                    self.next = Some(other);
                    break;
                }
                Err(_) => break,
            }
        }
        opened
    }

    /// Reads `to`'s feeds again at the next retry: the engine refused one
    /// of them, or reading them failed. One refusal per feed of the
    /// connection comes; one read tells it all of them again.
    fn read_again_later(&mut self, user: UserId, to: ConnRequest) {
        if !self.refused.iter().any(|(_, c)| key(c) == key(&to)) {
            self.refused.push((user, to));
        }
        self.retry_later();
    }

    /// Tries again, [`RETRY`] from the first thing that needs it.
    fn retry_later(&mut self) {
        self.retry_at.get_or_insert_with(|| Instant::now() + RETRY);
    }

    /// The owed resync, then the connections whose feeds were refused and
    /// are still open here (a resync told them their feeds already).
    fn retry(&mut self) {
        self.retry_at = None;
        let refused = std::mem::take(&mut self.refused);
        if self.owed {
            self.resync(Vec::new());
            return;
        }
        let open: Vec<(UserId, ConnRequest)> = refused
            .into_iter()
            .filter(|(user, to)| {
                self.presence
                    .connections(*user)
                    .iter()
                    .any(|c| key(c) == key(to))
            })
            .collect();
        for chunk in open.chunks(READ_BATCH) {
            self.open(chunk);
        }
    }

    /// Tells each of `opened` its user's whole following list, read in one
    /// store call.
    fn open(&mut self, opened: &[(UserId, ConnRequest)]) {
        let users: Vec<UserId> = opened.iter().map(|&(user, _)| user).collect();
        let reads = match self.store.following_each(&users, self.max_following) {
            Ok(reads) => reads,
            Err(e) => {
                warn!(connections = opened.len(), error = %e,
                    "cannot read whom connecting users follow; trying again");
                if self.shared {
                    // The owed resync reads every present user's list,
                    // these too.
                    self.owed = true;
                    self.retry_later();
                } else {
                    for &(user, to) in opened {
                        self.read_again_later(user, to);
                    }
                }
                return;
            }
        };
        let mut changes = Vec::with_capacity(opened.len());
        for (&(_, to), read) in opened.iter().zip(reads) {
            if read.change > self.applied {
                self.ahead.insert(key(&to), read.change);
            }
            changes.push(FeedChange {
                to,
                how: Apply::Replace,
                feeds: read.users,
                acks: Vec::new(),
            });
        }
        self.send(changes.into_iter());
    }

    fn change(&mut self, direction: Direction, edges: Vec<Edge>) -> Result<Applied, FeedsError> {
        let changed = match direction {
            Direction::Follow => self.store.follow(&edges)?,
            Direction::Unfollow => self.store.unfollow(&edges)?,
        };
        let what = match direction {
            Direction::Follow => {
                // Known here at once, before the announcement comes back.
                self.known
                    .extend(edges.iter().flat_map(|e| [e.follower, e.followee]));
                Announced::Follow {
                    users: Vec::new(),
                    edges,
                }
            }
            Direction::Unfollow => Announced::Unfollow { edges },
        };
        let (maker, settled) = settling();
        self.wrote(what, maker);
        Ok(Applied { changed, settled })
    }

    fn add_users(&mut self, users: Vec<UserId>) -> Result<u64, FeedsError> {
        let added = self.store.add_users(&users)?;
        self.known.extend(users.iter().copied());
        let (maker, _) = settling();
        self.wrote(
            Announced::Follow {
                users,
                edges: Vec::new(),
            },
            maker,
        );
        Ok(added)
    }

    /// After a write of this node: with a shared store, its announcement
    /// is on its way (the write's answer waits for it); otherwise it is
    /// announced here, numbered by this keeper.
    fn wrote(&mut self, what: Announced, maker: AckMaker) {
        match self.store.written() {
            Some(change) if self.shared => {
                if change > self.applied {
                    self.waiting.insert(change, maker);
                }
                // Else a resync already read it: `maker` settles as it goes.
            }
            _ => {
                let change = self.applied + 1;
                self.apply(Announcement { change, what }, Some(maker));
            }
        }
    }

    /// An announcement from the shared store's channel.
    fn heard(&mut self, announcement: Announcement) {
        if announcement.change <= self.applied {
            // Read already, by the start or a resync.
            return;
        }
        if announcement.change != self.applied + 1 {
            warn!(
                applied = self.applied,
                heard = announcement.change,
                "graph changes were missed: reading every present user's follows again"
            );
            self.resync(Vec::new());
            return;
        }
        let maker = self.waiting.remove(&announcement.change);
        self.apply(announcement, maker);
    }

    /// Applies the next change to this node's connections; `maker` makes
    /// the acks of the write of this node that made it.
    fn apply(&mut self, announcement: Announcement, maker: Option<AckMaker>) {
        let Announcement { change, what } = announcement;
        self.applied = change;
        let (how, edges) = match what {
            Announced::Follow { users, edges } => {
                // A write of this node's own (it has a maker) made its
                // users known when it was made.
                if maker.is_none() {
                    self.known.extend(users);
                    self.known
                        .extend(edges.iter().flat_map(|e| [e.follower, e.followee]));
                }
                (Apply::Add, edges)
            }
            Announced::Unfollow { edges } => (Apply::Drop, edges),
            Announced::Reread => {
                self.resync(maker.into_iter().collect());
                return;
            }
        };
        // Every edge of the batch, changed or not, is sent on: a connection
        // that already agrees ignores it. Grouped per connection, one event
        // each; none to a connection whose read already includes it.
        let mut per_conn: HashMap<ConnKey, FeedChange> = HashMap::new();
        for edge in &edges {
            for to in self.presence.connections(edge.follower) {
                if self
                    .ahead
                    .get(&key(&to))
                    .is_some_and(|&read| read >= change)
                {
                    continue;
                }
                per_conn
                    .entry(key(&to))
                    .or_insert_with(|| FeedChange {
                        to,
                        how,
                        feeds: Vec::new(),
                        acks: maker.iter().map(AckMaker::ack).collect(),
                    })
                    .feeds
                    .push(edge.followee);
            }
        }
        drop(maker);
        if !self.ahead.is_empty() {
            self.ahead.retain(|_, read| *read > change);
        }
        self.send(per_conn.into_values());
    }

    /// Reads everything this node holds of the graph again: see the module
    /// docs. `makers` are writes of this node that settle with it, besides
    /// those `waiting` that it covers.
    fn resync(&mut self, mut makers: Vec<AckMaker>) {
        self.stream.resyncs.fetch_add(1, Ordering::Relaxed);
        let last = match self.store.last_change() {
            Ok(last) => last,
            Err(e) => return self.resync_failed(&e),
        };
        let mut users = Vec::new();
        let store = &mut self.store;
        if let Err(e) = read_pages(&mut users, KNOWN_PAGE, u64::MAX, |after, n| {
            store.users(after, n)
        }) {
            return self.resync_failed(&e);
        }
        self.known.extend(users);
        let mut changes = Vec::new();
        let mut ahead = HashMap::new();
        for users in self.presence.users_present().chunks(READ_BATCH) {
            let reads = match self.store.following_each(users, self.max_following) {
                Ok(reads) => reads,
                Err(e) => return self.resync_failed(&e),
            };
            for (&user, read) in users.iter().zip(reads) {
                for to in self.presence.connections(user) {
                    if read.change > last {
                        ahead.insert(key(&to), read.change);
                    }
                    changes.push(FeedChange {
                        to,
                        how: Apply::Replace,
                        feeds: read.users.clone(),
                        acks: Vec::new(),
                    });
                }
            }
        }
        // Every write this covers settles once every connection has its
        // list: broader than the write's own followers, and rare.
        if last < self.applied {
            // Numbers start again after Redis lost its data: what waited
            // was lost with it, and the numbers will be given again.
            warn!(
                applied = self.applied,
                last, "the graph's change numbers went back: Redis lost its data"
            );
            self.waiting.split_off(&0)
        } else {
            let later = self.waiting.split_off(&(last + 1));
            std::mem::replace(&mut self.waiting, later)
        }
        .into_values()
        .for_each(|maker| makers.push(maker));
        for change in &mut changes {
            change.acks = makers.iter().map(AckMaker::ack).collect();
        }
        self.applied = last;
        self.ahead = ahead;
        self.owed = false;
        self.send(changes.into_iter());
    }

    fn resync_failed(&mut self, e: &StoreError) {
        warn!(error = %e, "cannot read the graph again; trying again");
        self.owed = true;
        self.retry_later();
    }

    fn send(&self, changes: impl Iterator<Item = FeedChange>) {
        let mut wakeups = Wakeups::default();
        for change in changes {
            self.hub.send(
                change.to.worker,
                Event::Feeds(Box::new(change)),
                &mut wakeups,
            );
        }
        self.hub.wake(wakeups);
    }
}

/// Starts the thread that listens to a shared store's announcements and
/// hands them to the keeper, subscribing again after each failure, after a
/// pause that grows while failures repeat.
fn spawn_change_stream(
    changes: ChangeStream,
    jobs: Sender<Job>,
    stop: Arc<AtomicBool>,
) -> Result<(), StoreError> {
    let run = move || {
        let mut pause = Duration::from_millis(50);
        while !stop.load(Ordering::Acquire) {
            let mut subscribed = false;
            let outcome = changes.listen(&stop, |heard| {
                subscribed |= matches!(heard, Heard::Subscribed);
                let _ = jobs.send(Job::Heard(heard));
            });
            match outcome {
                Ok(()) => return,
                Err(e) => {
                    if jobs.send(Job::Broken(e)).is_err() {
                        return;
                    }
                }
            }
            if subscribed {
                pause = Duration::from_millis(50);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(MAX_BACKOFF);
        }
    };
    std::thread::Builder::new()
        .name("myriad-graph-listen".into())
        .spawn(run)
        .map(drop)
        .map_err(|e| StoreError::Backend(format!("cannot start the graph's change stream: {e}")))
}

#[cfg(test)]
mod tests;
