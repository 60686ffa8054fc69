//! The [`Store`] contract: what every graph backend keeps.
//!
//! # The contract
//! The conformance suite (`crate::conformance`) checks each clause; every
//! store runs it unchanged.
//! 1. **Users.** A user is known once it has been added, or once it has
//!    been an end of an edge that was followed or loaded. Known users stay
//!    known (an unfollow does not forget them).
//! 2. **Batches are atomic and idempotent.** `follow`, `unfollow`,
//!    `add_users` and `load` apply every entry of a batch or, when any
//!    entry is refused, none. Following an edge that exists, or unfollowing
//!    one that does not, is accepted and changes nothing; the answer counts
//!    only what changed.
//! 3. **Refusals.** A user cannot follow itself ([`StoreError::SelfFollow`],
//!    naming the entry), and no user may follow more than
//!    [`StoreOptions::max_following`] others ([`StoreError::FollowingLimit`]).
//! 4. **Reads page by id.** `followers` and `following` answer ids in
//!    ascending order, after `after` when given, at most `limit` of them,
//!    so a hub with a million followers is read in pages, each a bounded
//!    amount of work. `users` pages the known users the same way.
//! 5. **Durability.** A batch is durable once its call returns `Ok`: it
//!    survives the process being killed at any moment after that, and a
//!    batch whose call had not returned is either wholly there or wholly
//!    absent after a restart.
//! 6. **Announcements** (a store several processes share). Every write
//!    call is given the next number of one global change sequence, in the
//!    same atomic step that applies it, and is announced with that number
//!    ([`crate::announce`]), so the announcements' order is the store's
//!    order; [`Store::written`] answers the number of this client's last
//!    write. [`Store::following_all`] reads a user's whole following list
//!    together with the number of the last change it includes, and
//!    [`Store::following_each`] several users' lists, each with the number
//!    of the last change it includes. A store
//!    with one process as its only writer (SQLite) announces nothing: that
//!    process's own calls are the whole order, and both numbers are 0.
//!
//! Calls block; the node runs its store on a thread of its own, never on a
//! worker.

use thiserror::Error;

use crate::announce::Snapshot;
use crate::user::{Edge, UserId};

/// How a store is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// Clause 3: the most users one user may follow.
    pub max_following: u64,
    /// Memory the store may keep as a page cache, in bytes.
    pub cache_bytes: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_following: 5_000,
            cache_bytes: 64 << 20,
        }
    }
}

/// A user's follower and following counts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub followers: u64,
    pub following: u64,
}

/// The whole graph's size.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    pub users: u64,
    pub edges: u64,
}

/// Why a store refused or failed a call.
#[derive(Debug, Error)]
pub enum StoreError {
    /// Entry `index` of the batch has a user following itself.
    #[error("entry {index}: user {user} cannot follow itself")]
    SelfFollow { index: usize, user: UserId },
    /// The batch would leave `user` following more than `limit` users.
    #[error("user {user} would follow more than {limit} users")]
    FollowingLimit { user: UserId, limit: u64 },
    /// The backend refused or failed the call (SQLite's error, Redis's
    /// error reply); nothing of the batch was applied.
    #[error("graph store failed: {0}")]
    Backend(String),
    /// The store cannot be opened as asked (a malformed Redis URL, more
    /// than one).
    #[error("graph store configuration: {0}")]
    Config(String),
    /// The store's server could not be reached; nothing was sent.
    #[error("graph store unreachable: {0}")]
    Unreachable(String),
    /// The call was sent but no answer came (a timeout, a broken
    /// connection). A batch it carried was applied wholly or not at all,
    /// and which is unknown: batches are idempotent, so sending it again
    /// is safe (its answer then counts only what the second send changed).
    #[error("graph store did not answer: {0}")]
    NoAnswer(String),
    /// Another client's bulk change held the store's writes for longer
    /// than a write waits; nothing of the batch was applied.
    #[error("graph store busy: another client's bulk change holds its writes")]
    Busy,
    /// This client's bulk change went silent for longer than its lease,
    /// and another client took it over: that client finished it whole, or
    /// discarded it whole if it had not been committed.
    #[error("graph store: this bulk change outlived its lease and was taken over")]
    LeaseLost,
}

/// Clause 3's first refusal: it depends on the batch alone, so deciding it
/// before anything is sent keeps the batch atomic in every store.
pub(crate) fn refuse_self_follows(edges: &[Edge]) -> Result<(), StoreError> {
    match edges.iter().position(|e| e.follower == e.followee) {
        Some(index) => Err(StoreError::SelfFollow {
            index,
            user: edges[index].follower,
        }),
        None => Ok(()),
    }
}

/// A follow-graph backend; see the module contract.
pub trait Store: Send {
    /// Makes `users` known; answers how many were new.
    fn add_users(&mut self, users: &[UserId]) -> Result<u64, StoreError>;

    /// Adds `edges`; answers how many were new.
    fn follow(&mut self, edges: &[Edge]) -> Result<u64, StoreError>;

    /// Removes `edges`; answers how many existed.
    fn unfollow(&mut self, edges: &[Edge]) -> Result<u64, StoreError>;

    /// Bulk-adds a whole dataset: `users` and `edges` in one atomic step,
    /// with the same refusals as `follow`. Answers how many edges were new.
    /// Stores may take a faster path than `follow` here, because a dataset
    /// is large and arrives whole.
    fn load(&mut self, users: Vec<UserId>, edges: Vec<Edge>) -> Result<u64, StoreError>;

    /// Who follows `user`, ascending, after `after`, at most `limit`.
    fn followers(
        &mut self,
        user: UserId,
        after: Option<UserId>,
        limit: usize,
    ) -> Result<Vec<UserId>, StoreError>;

    /// Whom `user` follows, ascending, after `after`, at most `limit`.
    fn following(
        &mut self,
        user: UserId,
        after: Option<UserId>,
        limit: usize,
    ) -> Result<Vec<UserId>, StoreError>;

    /// Known users, ascending, after `after`, at most `limit`.
    fn users(&mut self, after: Option<UserId>, limit: usize) -> Result<Vec<UserId>, StoreError>;

    fn contains(&mut self, user: UserId) -> Result<bool, StoreError>;

    fn counts(&mut self, user: UserId) -> Result<Counts, StoreError>;

    fn totals(&mut self) -> Result<Totals, StoreError>;

    /// Clause 6: the change number of this client's last write, which its
    /// announcement carries; `None` from a store that announces nothing.
    fn written(&self) -> Option<u64> {
        None
    }

    /// Clause 6: the number of the last change applied in the store.
    fn last_change(&mut self) -> Result<u64, StoreError> {
        Ok(0)
    }

    /// Whom `user` follows, ascending, at most `limit`, with the number of
    /// the last change the read includes (clause 6).
    fn following_all(&mut self, user: UserId, limit: u64) -> Result<Snapshot, StoreError> {
        let mut users = Vec::new();
        read_pages(&mut users, FOLLOWING_PAGE, limit, |after, n| {
            self.following(user, after, n)
        })?;
        Ok(Snapshot { change: 0, users })
    }

    /// [`Store::following_all`] for each of `users`, answered in their
    /// order. A store with round trips reads them all in one, so a node
    /// that a thousand users reach at once, or that reads every present
    /// user again, does not wait a thousand times; the caller bounds how
    /// many users a call carries.
    fn following_each(
        &mut self,
        users: &[UserId],
        limit: u64,
    ) -> Result<Vec<Snapshot>, StoreError> {
        users
            .iter()
            .map(|&user| self.following_all(user, limit))
            .collect()
    }
}

/// Rows per read when a whole following list is read in pages.
const FOLLOWING_PAGE: usize = 1_000;

/// Reads a paged store read into `all` to its end, `page` ids at a time,
/// keeping at most `cap`. On an error, `all` holds the pages read before it.
pub fn read_pages(
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
