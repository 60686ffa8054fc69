//! The keeper: the one thread that holds the graph [`Store`].
//!
//! Store calls block (SQLite reads pages from disk, a network store waits
//! for a round trip), so they never run on a worker or on the admin
//! listener's event loop: both hand the keeper a [`Job`] and go on. Sends
//! never come here at all (see the module above).
//!
//! Being one thread is what keeps feeds right without locks across the
//! store and the workers. Every follow, unfollow and connect-time read is
//! applied in one order, and the keeper tells a worker about each in that
//! order, through the worker's mailbox. So when a connection opens while
//! its user's follows are changing, the read of whom the user follows and
//! each change reach its worker in the order they happened in the store,
//! and the worker ends with the store's answer: a change made before the
//! read is in the read, and one made after arrives after it. A connection
//! is in [`Presence`] before its read is asked for, so no change can fall
//! between the two.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use myriad_graph::{DataDir, Edge, Store, StoreError, UserId};
use tokio::sync::oneshot;
use tracing::warn;

use super::{
    settling, Applied, Direction, FeedChange, Feeds, FeedsError, KnownUsers, Presence, Relation,
};
use crate::engine::ConnRequest;
use crate::hub::{Event, Hub, Wakeups};

/// Rows per store read when paging through a user's followings at connect.
const OPEN_PAGE: usize = 1_000;

/// Users read per page when loading the known users at start.
const KNOWN_PAGE: usize = 100_000;

/// Work for the keeper.
pub(crate) enum Job {
    /// A connection of `user` opened: tell its worker whom the user follows.
    Open {
        user: UserId,
        to: ConnRequest,
    },
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
    Stop,
}

/// The keeper's queue and thread, as the node holds them.
pub(crate) struct Handle {
    jobs: Sender<Job>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Handle {
    pub(crate) fn send(&self, job: Job) {
        // Fails only once the keeper has stopped, at shutdown; a job's
        // reply channel then closes, which its caller reports.
        let _ = self.jobs.send(job);
    }

    pub(crate) fn stop(&self) {
        self.send(Job::Stop);
        if let Some(thread) = self.thread.lock().expect("keeper lock poisoned").take() {
            if thread.join().is_err() {
                warn!("the graph keeper panicked");
            }
        }
    }
}

/// The keeper thread's state.
pub struct Keeper {
    /// Held for the node's life: the store's directory is this node's.
    _dir: DataDir,
    store: Box<dyn Store>,
    hub: Arc<Hub>,
    presence: Arc<Presence>,
    known: Arc<KnownUsers>,
    max_following: u64,
}

impl Keeper {
    /// Loads the known users from `store` and starts the keeper thread.
    pub fn start(
        dir: DataDir,
        mut store: Box<dyn Store>,
        hub: Arc<Hub>,
        max_following: u64,
    ) -> Result<Feeds, StoreError> {
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
            max_following,
        };
        let (jobs, queue) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name("myriad-graph".into())
            .spawn(move || keeper.run(queue))
            .map_err(|e| StoreError::Backend(format!("cannot start the graph keeper: {e}")))?;
        Ok(Feeds {
            keeper: Handle {
                jobs,
                thread: Mutex::new(Some(thread)),
            },
            presence,
            known,
        })
    }

    fn run(mut self, queue: Receiver<Job>) {
        while let Ok(job) = queue.recv() {
            match job {
                Job::Open { user, to } => self.open(user, to),
                Job::Change {
                    direction,
                    edges,
                    reply,
                } => {
                    let _ = reply.send(self.change(direction, &edges));
                }
                Job::AddUsers { users, reply } => {
                    let added = self.store.add_users(&users).map_err(FeedsError::from);
                    if added.is_ok() {
                        self.known.extend(users);
                    }
                    let _ = reply.send(added);
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
                Job::Stop => return,
            }
        }
    }

    fn open(&mut self, user: UserId, to: ConnRequest) {
        let store = &mut self.store;
        let mut feeds = Vec::new();
        let read = read_pages(&mut feeds, OPEN_PAGE, self.max_following, |after, n| {
            store.following(user, after, n)
        });
        if let Err(e) = read {
            // The connection gets the feeds read before the failure.
            warn!(%user, error = %e, "cannot read whom a connecting user follows");
        }
        let change = FeedChange {
            to,
            direction: Direction::Follow,
            feeds,
            ack: None,
        };
        let mut wakeups = Wakeups::default();
        self.hub
            .send(to.worker, Event::Feeds(Box::new(change)), &mut wakeups);
        self.hub.wake(wakeups);
    }

    fn change(&mut self, direction: Direction, edges: &[Edge]) -> Result<Applied, FeedsError> {
        let changed = match direction {
            Direction::Follow => self.store.follow(edges)?,
            Direction::Unfollow => self.store.unfollow(edges)?,
        };
        if direction == Direction::Follow {
            self.known
                .extend(edges.iter().flat_map(|e| [e.follower, e.followee]));
        }
        // Every edge of the batch, changed or not, is sent on: a connection
        // that already agrees ignores it, and one that had drifted is put
        // right. Grouped per connection, one event each.
        let mut per_conn: HashMap<(usize, u32, u32), FeedChange> = HashMap::new();
        let (maker, settled) = settling();
        for edge in edges {
            for to in self.presence.connections(edge.follower) {
                per_conn
                    .entry((to.worker, to.conn, to.life))
                    .or_insert_with(|| FeedChange {
                        to,
                        direction,
                        feeds: Vec::new(),
                        ack: Some(maker.ack()),
                    })
                    .feeds
                    .push(edge.followee);
            }
        }
        drop(maker);
        let mut wakeups = Wakeups::default();
        for (_, change) in per_conn {
            self.hub.send(
                change.to.worker,
                Event::Feeds(Box::new(change)),
                &mut wakeups,
            );
        }
        self.hub.wake(wakeups);
        Ok(Applied { changed, settled })
    }
}

/// Reads a paged store read into `all` to its end, `page` ids at a time,
/// keeping at most `cap`. On an error, `all` holds the pages read before it.
fn read_pages(
    all: &mut Vec<UserId>,
    page: usize,
    cap: u64,
    mut read: impl FnMut(Option<UserId>, usize) -> Result<Vec<UserId>, StoreError>,
) -> Result<(), StoreError> {
    loop {
        let got = read(all.last().copied(), page)?;
        let full = got.len() == page;
        all.extend(got);
        if !full || all.len() as u64 >= cap {
            all.truncate(usize::try_from(cap).unwrap_or(usize::MAX));
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use myriad_graph::{SqliteStore, StoreOptions};

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
        let polls: Vec<mio::Poll> = (0..2).map(|_| mio::Poll::new().unwrap()).collect();
        let wakers = polls
            .iter()
            .map(|p| mio::Waker::new(p.registry(), mio::Token(0)).unwrap())
            .collect();
        let (hub, mailboxes) = Hub::new(wakers, 65_536);
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::in_memory(StoreOptions::default()).unwrap();
        let feeds = Keeper::start(
            DataDir::lock(dir.path()).unwrap(),
            Box::new(store),
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
        assert_eq!(first.direction, Direction::Follow);
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
        assert_eq!(
            (opened.feeds, opened.direction),
            (vec![user(2)], Direction::Follow)
        );
        assert!(opened.ack.is_none());
        let unfollowed = feed_change(&mailboxes[0]);
        assert_eq!(
            (unfollowed.feeds, unfollowed.direction),
            (vec![user(2)], Direction::Unfollow)
        );
        feeds.stop();
    }
}
