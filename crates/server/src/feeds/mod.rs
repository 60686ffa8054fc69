//! Feeds: the follow graph wired into delivery ("send as user X").
//!
//! User X's feed is the subject `@X`. A connection that acts as a user is
//! subscribed, through the ordinary subscription path, to its own feed and
//! to the feed of everyone its user follows; sending as X is publishing to
//! `@X`. So a send costs what any publish to a subject with that many
//! subscribers costs, fans out per worker like every other publication, and
//! touches no graph data: nothing on the send path looks up followers, takes
//! a graph lock, or waits on disk. docs/architecture.md ("Feeds") gives the
//! measurements behind choosing this over expanding followers on each send.
//!
//! This module owns what the graph needs beyond the engine:
//! - [`Keeper`](keeper): the one thread that holds the [`Store`]. It reads
//!   whom a user follows when the user connects and applies follows and
//!   unfollows, telling the workers of affected connections in the same
//!   order, so a connection's feeds never disagree with the graph.
//! - [`Presence`](presence): which users are connected to this node, on
//!   which connections.
//! - [`KnownUsers`]: the ids the graph knows, kept in memory so that a
//!   connect or a send can be refused for an unknown user without a read.
//!
//! With the graph in Redis, shared by a cluster's nodes, a follow made
//! through one node must reach its follower's connections on every node:
//! each node's keeper applies the store's announced changes, in the
//! store's order (the keeper's module docs).
//!
//! [`Store`]: myriad_graph::Store

pub mod keeper;
pub mod presence;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use myriad_graph::{Edge, StoreError, UserId};
use myriad_protocol::subject::FEED_PREFIX;
use roaring::RoaringTreemap;
use tokio::sync::oneshot;

// The feed changes are defined below the hub (see `crate::messages`).
use crate::messages::engine::ConnRequest;
pub(crate) use crate::messages::feeds::{settling, AckMaker};
pub use crate::messages::feeds::{Ack, Apply, FeedChange};
pub use keeper::Keeper;
pub use presence::Presence;

/// The subject of `user`'s feed.
pub fn feed_subject(user: UserId) -> String {
    format!("{FEED_PREFIX}{user}")
}

/// The ids the graph knows (contract clause 1 of `myriad_graph::store`).
/// A compressed bitmap: a million dense ids take about 130 KB.
#[derive(Debug, Default)]
pub struct KnownUsers(RwLock<RoaringTreemap>);

impl KnownUsers {
    pub fn contains(&self, user: UserId) -> bool {
        self.0
            .read()
            .expect("known-users lock poisoned")
            .contains(user.get())
    }

    pub fn extend(&self, users: impl IntoIterator<Item = UserId>) {
        let mut known = self.0.write().expect("known-users lock poisoned");
        for user in users {
            known.insert(user.get());
        }
    }

    pub fn count(&self) -> u64 {
        self.0.read().expect("known-users lock poisoned").len()
    }
}

/// Which way a change goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Follow,
    Unfollow,
}

/// A follow or unfollow batch, as applied.
#[derive(Debug)]
pub struct Applied {
    /// Edges that changed (new follows, or removed ones).
    pub changed: u64,
    /// Fires when every connected follower's worker has applied the batch.
    pub settled: oneshot::Receiver<()>,
}

/// A paged read of the graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    Followers,
    Following,
}

/// What the rest of the node holds of the feeds: a handle to the keeper,
/// presence, the known users, and what following a shared store cost.
pub struct Feeds {
    keeper: keeper::Handle,
    pub presence: Arc<Presence>,
    pub known: Arc<KnownUsers>,
    stream: Arc<StreamCounts>,
}

/// How following a shared store's announcements went (all 0 with SQLite).
#[derive(Debug, Default)]
pub struct StreamCounts {
    /// Times the subscription to the announcements failed or broke.
    pub listen_failures: AtomicU64,
    /// Times the keeper read the follows of every present user again.
    pub resyncs: AtomicU64,
}

/// What `/stats` and `/metrics` show of the graph on this node.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FeedStats {
    /// Users the graph knows.
    pub users_known: u64,
    /// Users with a connection on this node.
    pub users_present: u64,
    /// See [`StreamCounts::listen_failures`].
    pub listen_failures: u64,
    /// See [`StreamCounts::resyncs`].
    pub resyncs: u64,
}

impl Feeds {
    pub fn stats(&self) -> FeedStats {
        FeedStats {
            users_known: self.known.count(),
            users_present: self.presence.users() as u64,
            listen_failures: self.stream.listen_failures.load(Ordering::Relaxed),
            resyncs: self.stream.resyncs.load(Ordering::Relaxed),
        }
    }

    /// A connection of `user` opened: its worker hears which feeds to add.
    pub fn opened(&self, user: UserId, to: ConnRequest) {
        self.keeper.send(keeper::Job::Open { user, to });
    }

    /// The engine refused to attach a feed the keeper asked for on `to`:
    /// the keeper reads `user`'s feeds for it again after a pause.
    pub fn refused(&self, user: UserId, to: ConnRequest) {
        self.keeper.send(keeper::Job::Refused { user, to });
    }

    /// Applies a follow or unfollow batch.
    pub async fn change(
        &self,
        direction: Direction,
        edges: Vec<Edge>,
    ) -> Result<Applied, FeedsError> {
        let (reply, answer) = oneshot::channel();
        self.keeper.send(keeper::Job::Change {
            direction,
            edges,
            reply,
        });
        answer.await.map_err(|_| FeedsError::Stopped)?
    }

    /// Makes `users` known; answers how many were new.
    pub async fn add_users(&self, users: Vec<UserId>) -> Result<u64, FeedsError> {
        let (reply, answer) = oneshot::channel();
        self.keeper.send(keeper::Job::AddUsers { users, reply });
        answer.await.map_err(|_| FeedsError::Stopped)?
    }

    /// One page of a user's followers or followings.
    pub async fn read(
        &self,
        relation: Relation,
        user: UserId,
        after: Option<UserId>,
        limit: usize,
    ) -> Result<Vec<UserId>, FeedsError> {
        let (reply, answer) = oneshot::channel();
        self.keeper.send(keeper::Job::Read {
            relation,
            user,
            after,
            limit,
            reply,
        });
        answer.await.map_err(|_| FeedsError::Stopped)?
    }

    /// Stops the keeper once it has finished the jobs already sent, and
    /// waits for it.
    pub fn stop(&self) {
        self.keeper.stop();
    }
}

/// Why a feeds request failed.
#[derive(Debug, thiserror::Error)]
pub enum FeedsError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the graph keeper has stopped")]
    Stopped,
}
