//! The bulk path of [`SqliteStore::load`](crate::SqliteStore): a whole
//! dataset (seed 004's 15 M edges) in one transaction, fast.
//!
//! What makes it fast, each step measured on that graph (the figures are
//! in docs/benchmarks.md, "Follow graph: generate and load"):
//! - The edges are sorted by `(followee, follower)` and deduplicated in
//!   memory, so `follows` grows in primary-key order: every insert lands
//!   on the rightmost leaf, and each page is written once.
//! - On an empty store the follower index is dropped inside the
//!   transaction and built again by one `CREATE INDEX` (one sort) before
//!   the commit, instead of taking 15 M inserts in random order: 17 s for
//!   the whole load against 52 s with the index kept. A store that already
//!   holds edges keeps its index (rebuilding it would cost in proportion to
//!   what is there, not to what is loaded).
//! - Clause 3 is counted in memory: per follower from the batch when the
//!   store is empty (exact, since nothing is followed yet), checked before
//!   anything is written. Otherwise edges already there must not count
//!   twice, so the table is asked once per distinct follower of the batch,
//!   after the inserts and before the commit: a query per follower, never
//!   one per edge.
//! - The page cache stays the store's own: a larger one during the load
//!   made it slower (256 MiB: 21 s, 1 GiB: 24 s, against 17 s with 64 MiB),
//!   because `CREATE INDEX` sorts runs as large as the cache in memory.
//!
//! # Atomic and durable
//! Everything, dropping and rebuilding the index included, happens in one
//! `IMMEDIATE` transaction on the store's own connection, in WAL mode, so
//! SQLite's own guarantee is the contract's (clause 5): pages spill to the
//! WAL while the load runs, but readers and a reopened file see none of
//! them until the commit record is written; a `kill -9` before it leaves
//! the store as it was (uncommitted frames are ignored on reopening), and
//! after it, all of the load. The committed WAL is then checkpointed into
//! the main file and truncated, here rather than by the next writer; a
//! checkpoint cut short is redone from the WAL on reopening.
//!
//! The cost of going through the WAL is writing each page twice (WAL, then
//! main file); the commit and the checkpoint took about a second of the 17. Building a side file with the
//! journal off and renaming it over an empty store would save that, but it
//! needs every other connection to the file closed (a rename under an open
//! connection splits it from its WAL), and it would be a second way to be
//! atomic to get right. One transaction keeps one.

use std::collections::HashMap;

use rusqlite::{Connection, TransactionBehavior};

use crate::sqlite::FOLLOWER_INDEX;
use crate::store::{refuse_self_follows, StoreError, StoreOptions};
use crate::user::{Edge, UserId};

pub(crate) fn load(
    db: &mut Connection,
    options: &StoreOptions,
    users: Vec<UserId>,
    mut edges: Vec<Edge>,
) -> Result<u64, StoreError> {
    refuse_self_follows(&edges)?;
    // Primary-key order, each edge once.
    edges.sort_unstable_by_key(|e| (e.followee, e.follower));
    edges.dedup();
    let following = count_following(&edges);
    let users = known_users(users, &edges, &following);

    let added = load_in_one_transaction(db, options.max_following, &users, &edges, &following)?;
    // Committed: copy the load from the WAL into the main file now, and
    // empty the WAL, rather than leave it to the next writer.
    db.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    Ok(added)
}

fn load_in_one_transaction(
    db: &mut Connection,
    max_following: u64,
    users: &[i64],
    edges: &[Edge],
    following: &HashMap<UserId, u64>,
) -> Result<u64, StoreError> {
    let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let empty: bool = tx.query_row("SELECT NOT EXISTS (SELECT 1 FROM follows)", [], |r| {
        r.get(0)
    })?;
    if empty {
        // Nothing is followed yet, so the batch's own counts are exact.
        if let Some(user) = first_over(following.iter().map(|(&u, &n)| (u, n)), max_following) {
            return Err(StoreError::FollowingLimit {
                user,
                limit: max_following,
            });
        }
        tx.execute_batch("DROP INDEX follows_by_follower")?;
    }
    {
        let mut add = tx.prepare("INSERT OR IGNORE INTO users (id) VALUES (?1)")?;
        for &id in users {
            add.execute([id])?;
        }
    }
    let added = {
        let sql = if empty {
            "INSERT INTO follows (followee, follower) VALUES (?1, ?2)"
        } else {
            "INSERT OR IGNORE INTO follows (followee, follower) VALUES (?1, ?2)"
        };
        let mut add = tx.prepare(sql)?;
        let mut added = 0u64;
        for edge in edges {
            added += add.execute([edge.followee.stored(), edge.follower.stored()])? as u64;
        }
        added
    };
    if empty {
        tx.execute_batch(FOLLOWER_INDEX)?;
    } else {
        // Edges that were there already do not count twice, so ask the
        // table, once per follower of the batch.
        let mut count = tx.prepare("SELECT count(*) FROM follows WHERE follower = ?1")?;
        let mut counted = Vec::with_capacity(following.len());
        for &user in following.keys() {
            let n: i64 = count.query_row([user.stored()], |r| r.get(0))?;
            counted.push((user, n as u64));
        }
        if let Some(user) = first_over(counted.into_iter(), max_following) {
            return Err(StoreError::FollowingLimit {
                user,
                limit: max_following,
            });
        }
    }
    tx.commit()?;
    Ok(added)
}

/// How many users each follower of the batch follows in it.
fn count_following(edges: &[Edge]) -> HashMap<UserId, u64> {
    let mut following: HashMap<UserId, u64> = HashMap::new();
    for edge in edges {
        *following.entry(edge.follower).or_default() += 1;
    }
    following
}

/// The lowest user whose count passes `limit`: the same user whichever
/// order the counts come in.
fn first_over(counts: impl Iterator<Item = (UserId, u64)>, limit: u64) -> Option<UserId> {
    counts.filter(|&(_, n)| n > limit).map(|(u, _)| u).min()
}

/// Every user the load makes known, ascending, each once: the `users`
/// given and both ends of every edge (clause 1).
fn known_users(users: Vec<UserId>, edges: &[Edge], following: &HashMap<UserId, u64>) -> Vec<i64> {
    let mut ids: Vec<i64> = users.into_iter().map(UserId::stored).collect();
    ids.extend(following.keys().map(|u| u.stored()));
    // Sorted by followee, so each followee's run is contiguous.
    let mut last = None;
    for edge in edges {
        if last != Some(edge.followee) {
            ids.push(edge.followee.stored());
            last = Some(edge.followee);
        }
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::conformance::OPTIONS;
    use crate::store::{Store, Totals};
    use crate::SqliteStore;

    fn user(id: u64) -> UserId {
        UserId::new(id).unwrap()
    }

    fn edge(follower: u64, followee: u64) -> Edge {
        Edge::new(user(follower), user(followee))
    }

    fn has_follower_index(path: &Path) -> bool {
        let db = Connection::open(path).unwrap();
        db.query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = 'follows_by_follower'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
            == 1
    }

    #[test]
    fn a_load_into_an_empty_file_rebuilds_the_index_and_empties_the_wal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("graph.sqlite3");
        let mut store = SqliteStore::open(&path, OPTIONS).unwrap();
        // Scrambled and repeated: the load sorts and deduplicates.
        let edges: Vec<Edge> = (0..300u64)
            .map(|i| edge(1 + (i * 7) % 50, 100 + (i * 13) % 40))
            .collect();
        let distinct: std::collections::BTreeSet<Edge> = edges.iter().copied().collect();
        assert_eq!(
            store.load(vec![user(7_000)], edges).unwrap(),
            distinct.len() as u64
        );
        assert!(has_follower_index(&path));
        let wal = dir.path().join("graph.sqlite3-wal");
        assert_eq!(std::fs::metadata(&wal).map_or(0, |m| m.len()), 0);
        let mut expected: Vec<UserId> = distinct
            .iter()
            .filter(|e| e.follower == user(8))
            .map(|e| e.followee)
            .collect();
        expected.sort_unstable();
        assert_eq!(store.following(user(8), None, 100).unwrap(), expected);
        drop(store);
        let mut reopened = SqliteStore::open(&path, OPTIONS).unwrap();
        assert_eq!(reopened.totals().unwrap().edges, distinct.len() as u64);
        assert!(reopened.contains(user(7_000)).unwrap());
    }

    #[test]
    fn a_refused_load_into_an_empty_file_leaves_it_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("graph.sqlite3");
        let mut store = SqliteStore::open(&path, OPTIONS).unwrap();
        let limit = OPTIONS.max_following;
        // Users 9 and 5 both pass the limit; the lower one is named.
        let mut edges: Vec<Edge> = (0..=limit).map(|i| edge(9, 100 + i)).collect();
        edges.extend((0..=limit).map(|i| edge(5, 100 + i)));
        let refused = store.load(vec![], edges);
        assert!(
            matches!(refused, Err(StoreError::FollowingLimit { user, .. }) if user.get() == 5),
            "{refused:?}"
        );
        assert_eq!(store.totals().unwrap(), Totals::default());
        assert!(
            has_follower_index(&path),
            "refused before the index is dropped, so the index is still there"
        );
    }

    #[test]
    fn a_load_into_a_store_with_edges_counts_what_is_there() {
        let mut store = SqliteStore::in_memory(OPTIONS).unwrap();
        let limit = OPTIONS.max_following;
        let held: Vec<Edge> = (0..limit - 1).map(|i| edge(1, 100 + i)).collect();
        store.follow(&held).unwrap();
        // Edges already there are accepted again and not counted twice...
        let mut again = held.clone();
        again.push(edge(1, 99));
        again.push(edge(2, 1));
        assert_eq!(store.load(vec![], again).unwrap(), 2);
        assert_eq!(store.counts(user(1)).unwrap().following, limit);
        // ...but the ones there count toward the limit.
        let refused = store.load(vec![user(3)], vec![edge(2, 5), edge(1, 98)]);
        assert!(
            matches!(refused, Err(StoreError::FollowingLimit { user, .. }) if user.get() == 1),
            "{refused:?}"
        );
        assert!(
            !store.contains(user(3)).unwrap(),
            "nothing of the refused load"
        );
        assert_eq!(store.totals().unwrap().edges, limit + 1);
    }
}
