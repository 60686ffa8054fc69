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
mod tests {
    use std::time::{Duration, Instant};

    use myriad_graph::{RedisStore, SqliteStore, StoreOptions};

    use super::*;

    fn user(id: u64) -> UserId {
        UserId::new(id).unwrap()
    }

    fn conn(worker: usize, conn: u32) -> ConnRequest {
        ConnRequest {
            worker,
            conn,
            life: 1,
            request: None,
        }
    }

    /// A keeper over an in-memory store and a hub of two workers whose
    /// mailboxes the test reads itself.
    fn keeper() -> (
        Feeds,
        Vec<Receiver<Event>>,
        Vec<mio::Poll>,
        tempfile::TempDir,
    ) {
        let (hub, mailboxes, polls) = crate::hub::test_hub(2, 65_536);
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::in_memory(StoreOptions::default()).unwrap();
        let feeds = Keeper::start(
            Some(DataDir::lock(dir.path()).unwrap()),
            Box::new(store),
            None,
            hub,
            100,
        )
        .unwrap();
        (feeds, mailboxes, polls, dir)
    }

    fn feed_change(mailbox: &Receiver<Event>) -> FeedChange {
        match mailbox.recv_timeout(Duration::from_secs(10)) {
            Ok(Event::Feeds(change)) => *change,
            other => panic!("expected a feed change, got {other:?}"),
        }
    }

    #[test]
    fn a_follow_is_settled_only_when_every_connection_of_the_follower_applied_it() {
        let (feeds, mailboxes, _polls, _dir) = keeper();
        feeds.presence.add(user(1), conn(0, 5));
        feeds.presence.add(user(1), conn(1, 9));
        feeds.presence.add(user(3), conn(0, 6));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let edges = vec![Edge::new(user(1), user(2)), Edge::new(user(1), user(4))];
        let mut applied = runtime
            .block_on(feeds.change(Direction::Follow, edges))
            .unwrap();
        assert_eq!(applied.changed, 2);
        assert!(feeds.known.contains(user(4)), "both ends are known at once");
        // One change per connection of the follower, none for user 3.
        let first = feed_change(&mailboxes[0]);
        let second = feed_change(&mailboxes[1]);
        assert!(mailboxes[0].is_empty() && mailboxes[1].is_empty());
        assert_eq!((first.to.conn, second.to.conn), (5, 9));
        assert_eq!(first.feeds, vec![user(2), user(4)]);
        assert_eq!(first.how, Apply::Add);
        // Not settled while either worker still holds its change.
        assert!(applied.settled.try_recv().is_err());
        drop(first);
        assert!(applied.settled.try_recv().is_err());
        drop(second);
        assert_eq!(applied.settled.try_recv(), Ok(()));
        feeds.stop();
    }

    #[test]
    fn a_connecting_user_is_told_whom_it_follows_in_store_order() {
        let (feeds, mailboxes, _polls, _dir) = keeper();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let change =
            |edges: Vec<Edge>, direction| runtime.block_on(feeds.change(direction, edges)).unwrap();
        // Nobody is connected: settled at once.
        let applied = change(vec![Edge::new(user(1), user(2))], Direction::Follow);
        runtime.block_on(applied.settled).unwrap();
        // The connection is present before its read is asked for; a change
        // made after the read arrives after the read's answer.
        feeds.presence.add(user(1), conn(0, 5));
        feeds.opened(user(1), conn(0, 5));
        let unfollowed = change(vec![Edge::new(user(1), user(2))], Direction::Unfollow);
        assert_eq!(unfollowed.changed, 1);
        let opened = feed_change(&mailboxes[0]);
        assert_eq!((opened.feeds, opened.how), (vec![user(2)], Apply::Replace));
        assert!(opened.acks.is_empty());
        let unfollowed = feed_change(&mailboxes[0]);
        assert_eq!(
            (unfollowed.feeds, unfollowed.how),
            (vec![user(2)], Apply::Drop)
        );
        feeds.stop();
    }

    /// A keeper over the Redis store under a fresh prefix on `server`, as a
    /// node with a change stream would run it, but driven by the test: it hands
    /// the keeper what the change stream would have heard, in the order the
    /// test needs. Also a second store under the same prefix: another node.
    fn shared_keeper(
        server: &myriad_testkit::RedisServer,
        prefix: &str,
    ) -> (Keeper, Vec<Receiver<Event>>, Vec<mio::Poll>, RedisStore) {
        let urls = vec![server.url()];
        let open = || RedisStore::open(&urls, prefix, StoreOptions::default()).unwrap();
        let (keeper, mailboxes, polls) = driven_keeper(Box::new(open()), true);
        (keeper, mailboxes, polls, open())
    }

    /// A keeper over `store` that the test drives itself (no thread), and
    /// the mailbox of its hub's one worker.
    fn driven_keeper(
        store: Box<dyn Store>,
        shared: bool,
    ) -> (Keeper, Vec<Receiver<Event>>, Vec<mio::Poll>) {
        let (hub, mailboxes, polls) = crate::hub::test_hub(1, 65_536);
        let keeper = Keeper {
            _dir: None,
            store,
            hub,
            presence: Arc::default(),
            known: Arc::default(),
            stream: Arc::default(),
            max_following: 100,
            shared,
            applied: 0,
            waiting: BTreeMap::new(),
            ahead: HashMap::new(),
            owed: false,
            refused: Vec::new(),
            retry_at: None,
            queue: crossbeam_channel::never(),
            next: None,
        };
        (keeper, mailboxes, polls)
    }

    fn announced(text: &str) -> Announcement {
        Announcement::parse(text).unwrap()
    }

    #[test]
    fn an_announcement_a_connect_time_read_includes_is_not_applied_again() {
        let server = myriad_testkit::RedisServer::start();
        let (mut keeper, mailboxes, _polls, mut other) = shared_keeper(&server, "k:");
        // Another node follows and unfollows 1 -> 2 (changes 1 and 2)
        // before this node hears either.
        other.follow(&[Edge::new(user(1), user(2))]).unwrap();
        other.unfollow(&[Edge::new(user(1), user(2))]).unwrap();
        keeper.presence.add(user(1), conn(0, 5));
        keeper.open(&[(user(1), conn(0, 5))]);
        let opened = feed_change(&mailboxes[0]);
        assert_eq!((opened.how, opened.feeds), (Apply::Replace, vec![]));
        // The read includes both: hearing them changes nothing for it
        // (applying change 1 would subscribe it to @2 until change 2).
        keeper.heard(announced("1 f 0 1 2"));
        keeper.heard(announced("2 u 1 2"));
        assert!(mailboxes[0].is_empty());
        // A later change reaches it.
        other.follow(&[Edge::new(user(1), user(3))]).unwrap();
        keeper.heard(announced("3 f 0 1 3"));
        let later = feed_change(&mailboxes[0]);
        assert_eq!((later.how, later.feeds), (Apply::Add, vec![user(3)]));
        assert!(keeper.ahead.is_empty(), "forgotten once passed");
    }

    /// How many `EXEC`s (one per read of following lists) `server` ran.
    fn execs(server: &myriad_testkit::RedisServer) -> u64 {
        let mut con = redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut con)
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_exec:calls="))
            .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
    }

    #[test]
    fn connects_queued_together_are_read_in_one_round_trip_in_order() {
        let server = myriad_testkit::RedisServer::start();
        let (mut keeper, mailboxes, _polls, mut other) = shared_keeper(&server, "k:");
        other.follow(&[Edge::new(user(1), user(2))]).unwrap();
        let (jobs, queue) = crossbeam_channel::unbounded();
        keeper.queue = queue;
        let open = |id: u32| Job::Open {
            user: user(u64::from(id)),
            to: conn(0, id),
        };
        // 100 connects, a job of another kind, then 300 connects.
        for id in 1..=100 {
            jobs.send(open(id)).unwrap();
        }
        jobs.send(Job::Refused {
            user: user(1),
            to: conn(0, 1),
        })
        .unwrap();
        for id in 101..=400 {
            jobs.send(open(id)).unwrap();
        }
        let before = execs(&server);
        let first = keeper.queue.recv().unwrap();
        assert!(keeper.handle(first).is_continue());
        assert_eq!(execs(&server) - before, 1, "100 connects, one read");
        let told: Vec<FeedChange> = mailboxes[0]
            .try_iter()
            .map(|e| match e {
                Event::Feeds(change) => *change,
                other => panic!("expected a feed change, got {other:?}"),
            })
            .collect();
        let conns: Vec<u32> = told.iter().map(|c| c.to.conn).collect();
        assert_eq!(conns, (1..=100).collect::<Vec<_>>());
        assert_eq!(told[0].feeds, vec![user(2)]);
        assert!(told[1..].iter().all(|c| c.feeds.is_empty()));
        // The other job is next, before any later connect.
        assert!(matches!(keeper.next, Some(Job::Refused { .. })));
        let refusal = keeper.next.take().unwrap();
        assert!(keeper.handle(refusal).is_continue());
        assert!(mailboxes[0].is_empty(), "a refusal is read again later");
        // Then at most READ_BATCH connects a read.
        let first = keeper.queue.recv().unwrap();
        assert!(keeper.handle(first).is_continue());
        assert_eq!(execs(&server) - before, 2);
        assert_eq!(mailboxes[0].try_iter().count(), READ_BATCH);
        assert!(keeper.next.is_none());
        assert_eq!(keeper.queue.len(), 300 - READ_BATCH);
    }

    #[test]
    fn a_write_settles_when_its_own_announcement_is_applied() {
        let server = myriad_testkit::RedisServer::start();
        let (mut keeper, mailboxes, _polls, mut other) = shared_keeper(&server, "k:");
        keeper.presence.add(user(1), conn(0, 5));
        other.follow(&[Edge::new(user(7), user(8))]).unwrap();
        let mut applied = keeper
            .change(Direction::Follow, vec![Edge::new(user(1), user(2))])
            .unwrap();
        assert!(keeper.known.contains(user(2)));
        // Change 2 waits for its announcement, which comes after change 1's.
        assert!(mailboxes[0].is_empty());
        keeper.heard(announced("1 f 0 7 8"));
        assert!(applied.settled.try_recv().is_err());
        keeper.heard(announced("2 f 0 1 2"));
        let change = feed_change(&mailboxes[0]);
        assert_eq!(
            (change.how, change.feeds.clone()),
            (Apply::Add, vec![user(2)])
        );
        assert!(applied.settled.try_recv().is_err());
        drop(change);
        assert_eq!(applied.settled.try_recv(), Ok(()));
    }

    #[test]
    fn a_missed_change_is_read_again_and_settles_the_writes_it_covers() {
        let server = myriad_testkit::RedisServer::start();
        let (mut keeper, mailboxes, _polls, mut other) = shared_keeper(&server, "k:");
        keeper.presence.add(user(1), conn(0, 5));
        keeper.presence.add(user(4), conn(0, 6));
        // This node's write (change 1), then another's (change 2), whose
        // announcements never come: the subscription was down.
        let mut applied = keeper
            .change(Direction::Follow, vec![Edge::new(user(1), user(2))])
            .unwrap();
        other.follow(&[Edge::new(user(4), user(5))]).unwrap();
        other.add_users(&[user(9)]).unwrap();
        // Change 4 is heard: 2 and 3 were missed.
        other.follow(&[Edge::new(user(1), user(3))]).unwrap();
        keeper.heard(announced("4 f 0 1 3"));
        let mut replaced: Vec<FeedChange> =
            vec![feed_change(&mailboxes[0]), feed_change(&mailboxes[0])];
        assert!(mailboxes[0].is_empty());
        replaced.sort_by_key(|c| c.to.conn);
        assert_eq!(replaced[0].how, Apply::Replace);
        assert_eq!(replaced[0].feeds, vec![user(2), user(3)]);
        assert_eq!(replaced[1].feeds, vec![user(5)]);
        assert!(keeper.known.contains(user(9)), "known users read again");
        assert_eq!(keeper.applied, 4);
        assert_eq!(keeper.stream.resyncs.load(Ordering::Relaxed), 1);
        assert!(applied.settled.try_recv().is_err());
        drop(replaced);
        assert_eq!(applied.settled.try_recv(), Ok(()));
        // What it read is not heard again.
        keeper.heard(announced("4 f 0 1 3"));
        assert!(mailboxes[0].is_empty());
    }

    #[test]
    fn a_connect_time_read_that_fails_is_tried_again_without_a_shared_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(myriad_graph::sqlite::FILE_NAME);
        let mut store = SqliteStore::open(&path, StoreOptions::default()).unwrap();
        store.follow(&[Edge::new(user(1), user(2))]).unwrap();
        let (mut keeper, mailboxes, _polls) = driven_keeper(Box::new(store), false);
        // Another process takes the table away: the keeper's reads fail
        // as SQLite fails them.
        let other = rusqlite::Connection::open(&path).unwrap();
        other
            .execute_batch("ALTER TABLE follows RENAME TO follows_away")
            .unwrap();
        keeper.presence.add(user(1), conn(0, 5));
        keeper.open(&[(user(1), conn(0, 5))]);
        assert!(
            mailboxes[0].is_empty(),
            "no list is told from a failed read"
        );
        assert!(keeper.retry_at.is_some(), "a retry is due");
        // Still failing: tried again later, once per connection.
        keeper.retry();
        assert!(mailboxes[0].is_empty());
        assert_eq!(keeper.refused.len(), 1);
        other
            .execute_batch("ALTER TABLE follows_away RENAME TO follows")
            .unwrap();
        keeper.retry();
        let again = feed_change(&mailboxes[0]);
        assert_eq!((again.to.conn, again.how), (5, Apply::Replace));
        assert_eq!(again.feeds, vec![user(2)]);
        assert!(keeper.retry_at.is_none() && keeper.refused.is_empty());
    }

    /// The engine refused a feed of `to`'s, as the keeper hears it.
    fn refused(keeper: &mut Keeper, user: UserId, to: ConnRequest) {
        assert!(keeper.handle(Job::Refused { user, to }).is_continue());
    }

    #[test]
    fn a_connection_whose_feed_was_refused_is_told_its_feeds_again_while_open() {
        let server = myriad_testkit::RedisServer::start();
        let (mut keeper, mailboxes, _polls, mut other) = shared_keeper(&server, "k:");
        other.follow(&[Edge::new(user(1), user(2))]).unwrap();
        keeper.presence.add(user(1), conn(0, 5));
        refused(&mut keeper, user(1), conn(0, 5));
        // Each refused feed of a connection says so; it is read once.
        refused(&mut keeper, user(1), conn(0, 5));
        // A connection gone since is not told.
        refused(&mut keeper, user(3), conn(0, 6));
        assert_eq!(keeper.refused.len(), 2);
        assert!(mailboxes[0].is_empty(), "not before the pause");
        let at = keeper.retry_at.expect("a retry is due");
        assert!(at > Instant::now() + RETRY / 2);
        keeper.retry();
        let again = feed_change(&mailboxes[0]);
        assert_eq!((again.to.conn, again.how), (5, Apply::Replace));
        assert_eq!(again.feeds, vec![user(2)]);
        assert!(mailboxes[0].is_empty());
        assert!(keeper.retry_at.is_none() && keeper.refused.is_empty());
    }
}
