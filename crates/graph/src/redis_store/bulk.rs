//! Bulk changes: a batch too large for one script (a big follow, a whole
//! `load`), all or nothing all the same (clause 2), and whole after any
//! crash of the client or of Redis (clause 5).
//!
//! # The journal
//! One bulk change at a time holds the store, through `P bulk:lock`: the
//! holder's random token, under a lease ([`RedisTimeouts::lease`]) that
//! every step renews. While it is held, every other write waits (and gives
//! up with [`StoreError::Busy`] after [`RedisTimeouts::response`]), so
//! clause 3 can be checked over many steps against a store nobody else
//! changes meanwhile. Each step is one script:
//! 1. **Begin**: take the lock; open `P bulk:journal`, state `staging`.
//! 2. **Validate** (adds only): clause 3, follower by follower in
//!    ascending order, `chunk` edges a step, skipped when the store holds
//!    no edge (then the batch's own counts are exact, and counted here).
//!    A refusal discards the change, of which nothing was written yet.
//! 3. **Stage**: the change in parts of `chunk` ids or pairs, as
//!    `P bulk:N`, which nothing reads until the commit: the users to add
//!    (given, and both ends of every edge), then every edge as
//!    `follower followee` sorted by follower, then again as
//!    `followee follower` sorted by followee. Sorted, a part adds to a few
//!    lists with one variadic command each rather than one per edge.
//! 4. **Commit**: the journal's state becomes `committed`, in one command.
//!    Before it, the change is discarded whenever it cannot go on; from it
//!    on, the change is finished.
//! 5. **Apply**: a part a step. A step applies its part, deletes it and
//!    counts it applied, in one script, so no part is applied twice or
//!    skipped, whoever runs the steps. The last step drops the journal
//!    and the lock.
//!
//! Every step stays bounded (one part), so other clients are answered
//! between steps: the 1 M-user graph is about 6,200 steps, not one script
//! of most of a minute.
//!
//! # When a client dies
//! A client killed in the middle of a change leaves the journal and, until
//! its lease runs out, the lock. After that, the next client to open the
//! store or to write finds the journal without a lock, takes it over with
//! a lock of its own, and finishes it from its next part if it was
//! committed, or discards it if not. The journal and the parts are keys
//! like any other, in Redis's append-only file, so a Redis restart
//! changes nothing of this. After any crash, then, a change is wholly
//! there or wholly absent once any client has opened the store or written.
//! A client that was only slow, and finds its lock taken, gets
//! [`StoreError::LeaseLost`].
//!
//! # What readers see
//! Reads take no lock, so a read during the apply steps sees part of a
//! committed change (some of its users, one side of its edges before the
//! other); never anything of a refused or discarded change, and the
//! change is all there once the call returns. SQLite's readers see a load
//! before or after, never between; here, load a graph before the nodes
//! serve it (as `myriad graph load` into a data directory must be), or
//! accept that window.
//!
//! [`RedisTimeouts::lease`]: super::RedisTimeouts::lease
//! [`RedisTimeouts::response`]: super::RedisTimeouts::response

use std::fmt::Write;

use redis::{Script, ScriptInvocation};

use super::scripts::{self, count, Reply};
use super::{out_of_turn, Changed, RedisStore};
use crate::store::StoreError;
use crate::user::{Edge, UserId};

/// Which way a bulk change goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Change {
    Add,
    Remove,
}

/// What a staged part holds, named as `apply.lua` reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Users,
    /// `follower followee`, into following lists.
    Follow,
    /// `followee follower`, into followers lists.
    Followed,
    Unfollow,
    Unfollowed,
}

impl Part {
    fn name(self) -> &'static str {
        match self {
            Part::Users => "users",
            Part::Follow => "follow",
            Part::Followed => "followed",
            Part::Unfollow => "unfollow",
            Part::Unfollowed => "unfollowed",
        }
    }
}

impl RedisStore {
    /// Applies a batch as a bulk change; `edges` hold no self-follow.
    pub(super) fn bulk(
        &mut self,
        change: Change,
        users: Vec<UserId>,
        mut edges: Vec<Edge>,
    ) -> Result<Changed, StoreError> {
        // By follower, each edge once: the order clause 3 is checked in
        // and the first staging order.
        edges.sort_unstable();
        edges.dedup();
        let max = self.options.max_following;
        let (over, users) = match change {
            Change::Add => (first_over(&edges, max), known_users(users, &edges)),
            Change::Remove => (None, Vec::new()),
        };
        let (token, edges_held) = self.begin()?;
        let staged = match change {
            Change::Add if edges_held > 0 => self.validate(&token, over, &edges),
            _ => over.map_or(Ok(()), |user| {
                Err(StoreError::FollowingLimit { user, limit: max })
            }),
        }
        .and_then(|()| self.stage_all(&token, change, &users, &mut edges));
        let parts = match staged {
            Ok(parts) => parts,
            Err(e) => {
                if !matches!(e, StoreError::LeaseLost) {
                    // If this fails too, the lease runs out and the next
                    // writer discards the change: the error to report is
                    // the first one either way.
                    let _ = self.discard(&token);
                }
                return Err(e);
            }
        };
        self.step(&token, &scripts::COMMIT, |_| {})?;
        self.apply_all(&token, &parts).map_err(|e| match e {
            // Committed: whoever comes next finishes it, so the batch is
            // not "nothing sent" but "applied, answer lost".
            StoreError::Unreachable(why) => StoreError::NoAnswer(why),
            e => e,
        })
    }

    /// Takes the lock; answers the token and how many edges the store holds.
    fn begin(&mut self) -> Result<(String, u64), StoreError> {
        let token = new_token();
        let lease = self.lease_ms();
        match self.write(&scripts::BEGIN, |invocation| {
            invocation.arg(&token).arg(lease);
        })? {
            Reply::Ok(values) => Ok((token, count(&values, 0)?)),
            other => Err(out_of_turn(&other)),
        }
    }

    /// Runs a step of the change that `token` holds.
    fn step(
        &mut self,
        token: &str,
        script: &Script,
        args: impl Fn(&mut ScriptInvocation<'_>),
    ) -> Result<Vec<i64>, StoreError> {
        let lease = self.lease_ms();
        match self.invoke(script, |invocation| {
            invocation.arg(token).arg(lease);
            args(invocation);
        })? {
            Reply::Ok(values) => Ok(values),
            Reply::Limit(user) => Err(StoreError::FollowingLimit {
                user,
                limit: self.options.max_following,
            }),
            Reply::Lost => Err(StoreError::LeaseLost),
            other => Err(out_of_turn(&other)),
        }
    }

    /// Clause 3 against what the store holds, for the followers below
    /// `over` (the lowest the batch alone takes past the limit), lowest
    /// first; `edges` are sorted by follower.
    fn validate(
        &mut self,
        token: &str,
        over: Option<UserId>,
        edges: &[Edge],
    ) -> Result<(), StoreError> {
        let max = self.options.max_following;
        let mut groups: Vec<u64> = Vec::new();
        let mut in_groups = 0;
        for run in edges.chunk_by(|a, b| a.follower == b.follower) {
            let follower = run[0].follower;
            if over.is_some_and(|over| follower >= over) {
                break;
            }
            groups.extend([follower.get(), run.len() as u64]);
            groups.extend(run.iter().map(|e| e.followee.get()));
            in_groups += run.len();
            if in_groups >= self.chunk {
                self.step(token, &scripts::VALIDATE, |i| {
                    i.arg(max).arg(&groups);
                })?;
                groups.clear();
                in_groups = 0;
            }
        }
        if !groups.is_empty() {
            self.step(token, &scripts::VALIDATE, |i| {
                i.arg(max).arg(&groups);
            })?;
        }
        over.map_or(Ok(()), |user| {
            Err(StoreError::FollowingLimit { user, limit: max })
        })
    }

    /// Stages every part, in the order they are applied; answers their kinds.
    fn stage_all(
        &mut self,
        token: &str,
        change: Change,
        users: &[UserId],
        edges: &mut [Edge],
    ) -> Result<Vec<Part>, StoreError> {
        let mut parts = Vec::new();
        for ids in users.chunks(self.chunk) {
            self.stage(token, Part::Users, ids.iter().map(|u| u.get()))?;
            parts.push(Part::Users);
        }
        let (forward, backward) = match change {
            Change::Add => (Part::Follow, Part::Followed),
            Change::Remove => (Part::Unfollow, Part::Unfollowed),
        };
        self.stage_edges(
            token,
            forward,
            edges,
            |e| [e.follower, e.followee],
            &mut parts,
        )?;
        edges.sort_unstable_by_key(|e| (e.followee, e.follower));
        self.stage_edges(
            token,
            backward,
            edges,
            |e| [e.followee, e.follower],
            &mut parts,
        )?;
        Ok(parts)
    }

    /// Stages `edges` as pairs of `ends`, in their order.
    fn stage_edges(
        &mut self,
        token: &str,
        part: Part,
        edges: &[Edge],
        ends: fn(&Edge) -> [UserId; 2],
        parts: &mut Vec<Part>,
    ) -> Result<(), StoreError> {
        for run in edges.chunks(self.chunk) {
            let ids = run.iter().flat_map(ends).map(UserId::get);
            self.stage(token, part, ids)?;
            parts.push(part);
        }
        Ok(())
    }

    fn stage(
        &mut self,
        token: &str,
        part: Part,
        ids: impl Iterator<Item = u64>,
    ) -> Result<(), StoreError> {
        let mut text = String::with_capacity(2 * 9 * self.chunk);
        text.push_str(part.name());
        text.push('\n');
        for id in ids {
            // A String takes every write.
            let _ = write!(text, "{id} ");
        }
        self.step(token, &scripts::STAGE, |invocation| {
            invocation.arg(&text);
        })?;
        Ok(())
    }

    /// Applies the staged `parts`, one a step; answers what they changed.
    fn apply_all(&mut self, token: &str, parts: &[Part]) -> Result<Changed, StoreError> {
        let mut changed = Changed::default();
        for (index, part) in parts.iter().enumerate() {
            let values = self.step(token, &scripts::APPLY, |_| {})?;
            let n = count(&values, 0)?;
            match part {
                Part::Users => changed.users += n,
                Part::Follow | Part::Unfollow => changed.edges += n,
                Part::Followed | Part::Unfollowed => {}
            }
            let done = count(&values, 1)? == 1;
            if done {
                changed.change = count(&values, 2)?;
            }
            if done != (index + 1 == parts.len()) {
                return Err(StoreError::Backend(format!(
                    "the bulk journal ended after {} of {} parts",
                    index + 1,
                    parts.len()
                )));
            }
        }
        Ok(changed)
    }

    /// Throws away the uncommitted change that `token` holds.
    fn discard(&mut self, token: &str) -> Result<(), StoreError> {
        loop {
            let values = self.step(token, &scripts::DISCARD, |_| {})?;
            if count(&values, 0)? == 0 {
                return Ok(());
            }
        }
    }

    /// Finishes or discards what a dead client's bulk change left, if
    /// anything; leaves a change that still holds its lease alone.
    pub(super) fn recover(&mut self) -> Result<(), StoreError> {
        let token = new_token();
        let lease = self.lease_ms();
        let values = match self.invoke(&scripts::TAKEOVER, |invocation| {
            invocation.arg(&token).arg(lease);
        })? {
            Reply::Ok(values) => values,
            Reply::Busy => return Ok(()),
            other => return Err(out_of_turn(&other)),
        };
        if count(&values, 0)? == 0 {
            return Ok(());
        }
        if count(&values, 1)? == 0 {
            return self.discard(&token);
        }
        loop {
            let values = self.step(&token, &scripts::APPLY, |_| {})?;
            if count(&values, 1)? == 1 {
                return Ok(());
            }
        }
    }

    fn lease_ms(&self) -> u64 {
        u64::try_from(self.timeouts.lease.as_millis()).unwrap_or(u64::MAX)
    }
}

/// A lock holder's name: random, so that no two clients share one.
fn new_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// The lowest follower that `edges` alone (sorted by follower, each once)
/// take past `max`.
fn first_over(edges: &[Edge], max: u64) -> Option<UserId> {
    edges
        .chunk_by(|a, b| a.follower == b.follower)
        .find(|run| run.len() as u64 > max)
        .map(|run| run[0].follower)
}

/// Every user an add makes known, ascending, each once: `users` and both
/// ends of every edge (clause 1).
fn known_users(mut users: Vec<UserId>, edges: &[Edge]) -> Vec<UserId> {
    users.extend(edges.iter().flat_map(|e| [e.follower, e.followee]));
    users.sort_unstable();
    users.dedup();
    users
}

#[cfg(test)]
mod tests {
    use std::thread;
    use std::time::Duration;

    use myriad_testkit::RedisServer;

    use super::*;
    use crate::conformance::OPTIONS;
    use crate::redis_store::testing::{fresh_prefix, keys, url};
    use crate::redis_store::RedisTimeouts;
    use crate::store::{Store, Totals};

    /// A lease a test can outwait, and writes patient enough to outwait it
    /// however loaded the box.
    const SHORT_LEASE: RedisTimeouts = RedisTimeouts {
        connect: Duration::from_secs(2),
        response: Duration::from_secs(10),
        lease: Duration::from_millis(300),
    };

    fn user(id: u64) -> UserId {
        UserId::new(id).unwrap()
    }

    fn edge(follower: u64, followee: u64) -> Edge {
        Edge::new(user(follower), user(followee))
    }

    fn open(urls: &[String], prefix: &str, timeouts: RedisTimeouts) -> RedisStore {
        RedisStore::open_with(urls, prefix, OPTIONS, timeouts, None)
            .unwrap()
            .with_chunk(3)
    }

    /// Twelve edges to user 2 and user 30's three: a bulk change of
    /// several parts at a chunk of 3.
    fn batch() -> Vec<Edge> {
        let mut edges: Vec<Edge> = (10..22).map(|f| edge(f, 2)).collect();
        edges.extend((31..34).map(|f| edge(30, f)));
        edges
    }

    /// Runs a bulk follow of `edges` as far as a client killed there
    /// would: staged, then committed and `applied` parts applied when
    /// `commit`. Answers the token.
    fn stop_after(
        store: &mut RedisStore,
        mut edges: Vec<Edge>,
        commit: bool,
        applied: usize,
    ) -> String {
        edges.sort_unstable();
        let users = known_users(Vec::new(), &edges);
        let (token, _) = store.begin().unwrap();
        store
            .stage_all(&token, Change::Add, &users, &mut edges)
            .unwrap();
        if commit {
            store.step(&token, &scripts::COMMIT, |_| {}).unwrap();
            for _ in 0..applied {
                store.step(&token, &scripts::APPLY, |_| {}).unwrap();
            }
        }
        token
    }

    #[test]
    fn a_committed_change_is_finished_after_its_client_and_redis_are_killed() {
        let mut server = RedisServer::start_persistent();
        let urls = vec![server.url()];
        let prefix = fresh_prefix();
        let mut dying = open(&urls, &prefix, SHORT_LEASE);
        dying.follow(&[edge(1, 2)]).unwrap();
        stop_after(&mut dying, batch(), true, 3);
        drop(dying);
        let mut reader = open(&urls, &prefix, SHORT_LEASE);
        let partial = reader.totals().unwrap();
        assert!(partial.edges < 16, "{partial:?}: the test stops halfway");
        server.kill();
        server.restart();
        thread::sleep(SHORT_LEASE.lease * 2);
        let mut store = open(&urls, &prefix, SHORT_LEASE);
        let mut expected: Vec<u64> = vec![1];
        expected.extend(10..22);
        let followers = store.followers(user(2), None, 100).unwrap();
        assert_eq!(
            followers.iter().map(|u| u.get()).collect::<Vec<_>>(),
            expected
        );
        assert_eq!(store.counts(user(30)).unwrap().following, 3);
        assert_eq!(
            store.totals().unwrap(),
            Totals {
                users: 18,
                edges: 16
            }
        );
        assert!(keys(&urls[0], &format!("{prefix}bulk")).is_empty());
    }

    #[test]
    fn an_uncommitted_change_is_discarded_by_the_next_writer_once_its_lease_ends() {
        let urls = url();
        let prefix = fresh_prefix();
        let mut dying = open(&urls, &prefix, SHORT_LEASE);
        dying.follow(&[edge(1, 2)]).unwrap();
        stop_after(&mut dying, batch(), false, 0);
        drop(dying);
        assert!(!keys(&urls[0], &format!("{prefix}bulk")).is_empty());
        // Opened within the lease: the change is still someone's.
        let mut store = open(&urls, &prefix, SHORT_LEASE);
        assert!(!keys(&urls[0], &format!("{prefix}bulk")).is_empty());
        // The write waits out the lease, then discards the change.
        assert_eq!(store.follow(&[edge(5, 6)]).unwrap(), 1);
        assert!(keys(&urls[0], &format!("{prefix}bulk")).is_empty());
        assert_eq!(store.totals().unwrap(), Totals { users: 4, edges: 2 });
        assert!(!store.contains(user(10)).unwrap());
    }

    #[test]
    fn writes_wait_for_a_live_change_then_give_up_busy_while_reads_go_on() {
        let urls = url();
        let prefix = fresh_prefix();
        let mut holder = open(&urls, &prefix, RedisTimeouts::default());
        let (token, _) = holder.begin().unwrap();
        let impatient = RedisTimeouts {
            response: Duration::from_millis(300),
            ..RedisTimeouts::default()
        };
        let mut other = open(&urls, &prefix, impatient);
        let refused = other.follow(&[edge(1, 2)]);
        assert!(matches!(refused, Err(StoreError::Busy)), "{refused:?}");
        let refused = other.unfollow(&[edge(1, 2)]);
        assert!(matches!(refused, Err(StoreError::Busy)), "{refused:?}");
        assert_eq!(other.totals().unwrap(), Totals::default());
        holder.discard(&token).unwrap();
        assert_eq!(other.follow(&[edge(1, 2)]).unwrap(), 1);
    }

    #[test]
    fn a_client_past_its_lease_finds_its_change_taken_over() {
        let urls = url();
        let prefix = fresh_prefix();
        let mut slow = open(&urls, &prefix, SHORT_LEASE);
        let token = stop_after(&mut slow, batch(), false, 0);
        thread::sleep(SHORT_LEASE.lease * 2);
        let mut other = open(&urls, &prefix, SHORT_LEASE);
        assert_eq!(other.follow(&[edge(1, 2)]).unwrap(), 1);
        let late = slow.step(&token, &scripts::COMMIT, |_| {});
        assert!(matches!(late, Err(StoreError::LeaseLost)), "{late:?}");
        assert_eq!(other.totals().unwrap(), Totals { users: 2, edges: 1 });
    }

    #[test]
    fn the_lowest_follower_over_the_limit_is_named_and_nothing_is_written() {
        let limit = OPTIONS.max_following;
        let mut store = open(&url(), &fresh_prefix(), RedisTimeouts::default());
        // User 5 follows 15; the batch takes it to 21 with what it holds,
        // and user 9 to 21 on its own.
        let held: Vec<Edge> = (0..15).map(|i| edge(5, 100 + i)).collect();
        store.follow(&held).unwrap();
        let mut batch: Vec<Edge> = (0..=limit).map(|i| edge(9, 200 + i)).collect();
        batch.extend((0..6).map(|i| edge(5, 300 + i)));
        batch.push(edge(7, 8));
        let refused = store.follow(&batch);
        assert!(
            matches!(refused, Err(StoreError::FollowingLimit { user, .. }) if user.get() == 5),
            "{refused:?}"
        );
        assert_eq!(
            store.totals().unwrap(),
            Totals {
                users: 16,
                edges: 15
            }
        );
        assert!(!store.contains(user(7)).unwrap());
        // On an empty store the batch's own counts decide: 5 and 9 are
        // both over, and 5 is named.
        let mut empty = open(&url(), &fresh_prefix(), RedisTimeouts::default());
        let mut batch: Vec<Edge> = (0..=limit).map(|i| edge(9, 200 + i)).collect();
        batch.extend((0..=limit).map(|i| edge(5, 300 + i)));
        let refused = empty.load(vec![user(1)], batch);
        assert!(
            matches!(refused, Err(StoreError::FollowingLimit { user, .. }) if user.get() == 5),
            "{refused:?}"
        );
        assert_eq!(empty.totals().unwrap(), Totals::default());
    }
}
