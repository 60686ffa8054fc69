//! [`SqliteStore`]: the follow graph in one embedded SQLite file.
//!
//! Two tables: `users(id)` and `follows(followee, follower)`. `follows` is
//! a `WITHOUT ROWID` table keyed by followee, so a user's followers are one
//! contiguous range of the primary key, read in id order; an index keyed by
//! follower serves "whom does this user follow". The file is in WAL mode
//! with `synchronous = NORMAL`: a committed batch is in the WAL before its
//! call returns, so it survives the process being killed (clause 5);
//! surviving power loss as well would need `FULL`, at a sync per batch.
//! `load` takes a bulk path of its own (`crate::sqlite_load`), still one
//! transaction.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::store::{refuse_self_follows, Counts, Store, StoreError, StoreOptions, Totals};
use crate::user::{Edge, UserId};

/// The graph's file name inside a node's data directory.
pub const FILE_NAME: &str = "graph.sqlite3";

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS users (id INTEGER PRIMARY KEY);
    CREATE TABLE IF NOT EXISTS follows (
        followee INTEGER NOT NULL,
        follower INTEGER NOT NULL,
        PRIMARY KEY (followee, follower)
    ) WITHOUT ROWID;
";

/// "Whom does this user follow": its own constant because a bulk load
/// into an empty store drops it and builds it again (`crate::sqlite_load`).
pub(crate) const FOLLOWER_INDEX: &str =
    "CREATE INDEX IF NOT EXISTS follows_by_follower ON follows (follower, followee)";

/// The embedded graph store; see the module docs.
pub struct SqliteStore {
    db: Connection,
    options: StoreOptions,
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> StoreError {
        StoreError::Backend(e.to_string())
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the graph file at `path`.
    pub fn open(path: &Path, options: StoreOptions) -> Result<SqliteStore, StoreError> {
        let db = Connection::open(path)?;
        Self::configure(db, options)
    }

    /// A store that lives only as long as the value (tests).
    pub fn in_memory(options: StoreOptions) -> Result<SqliteStore, StoreError> {
        Self::configure(Connection::open_in_memory()?, options)
    }

    fn configure(db: Connection, options: StoreOptions) -> Result<SqliteStore, StoreError> {
        // Another process (a bulk load) may hold the write lock for a while.
        db.busy_timeout(Duration::from_secs(30))?;
        db.pragma_update(None, "journal_mode", "WAL")?;
        db.pragma_update(None, "synchronous", "NORMAL")?;
        // Negative: a size in KiB rather than in pages.
        let cache_kib = (options.cache_bytes / 1024).max(1) as i64;
        db.pragma_update(None, "cache_size", -cache_kib)?;
        db.execute_batch(SCHEMA)?;
        db.execute_batch(FOLLOWER_INDEX)?;
        Ok(SqliteStore { db, options })
    }

    /// The users with the most followers, most first, with their counts.
    /// It reads every edge: for tools and stats, never a node's hot path.
    pub fn biggest_hubs(&mut self, limit: usize) -> Result<Vec<(UserId, u64)>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut statement = self.db.prepare(
            "SELECT followee, count(*) AS n FROM follows GROUP BY followee \
             ORDER BY n DESC, followee LIMIT ?1",
        )?;
        let hubs = statement
            .query_map([limit], |r| {
                Ok((UserId::from_stored(r.get(0)?), r.get::<_, i64>(1)? as u64))
            })?
            .collect::<Result<_, _>>()?;
        Ok(hubs)
    }

    fn page(
        &mut self,
        sql: &'static str,
        user: Option<UserId>,
        after: Option<UserId>,
        limit: usize,
    ) -> Result<Vec<UserId>, StoreError> {
        let after = after.map_or(-1, UserId::stored);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut statement = self.db.prepare_cached(sql)?;
        let id = |row: &rusqlite::Row<'_>| row.get::<_, i64>(0);
        let ids: Vec<i64> = match user {
            Some(user) => statement
                .query_map(params![user.stored(), after, limit], id)?
                .collect::<Result<_, _>>()?,
            None => statement
                .query_map(params![after, limit], id)?
                .collect::<Result<_, _>>()?,
        };
        Ok(ids.into_iter().map(UserId::from_stored).collect())
    }
}

/// Adds `edges` inside an open transaction; answers how many were new.
fn insert_edges(
    tx: &rusqlite::Transaction<'_>,
    edges: &[Edge],
    max_following: u64,
) -> Result<u64, StoreError> {
    let mut add_user = tx.prepare_cached("INSERT OR IGNORE INTO users (id) VALUES (?1)")?;
    let mut add_edge =
        tx.prepare_cached("INSERT OR IGNORE INTO follows (followee, follower) VALUES (?1, ?2)")?;
    let mut added = 0u64;
    let mut followers = BTreeSet::new();
    for edge in edges {
        add_user.execute([edge.follower.stored()])?;
        add_user.execute([edge.followee.stored()])?;
        added += add_edge.execute([edge.followee.stored(), edge.follower.stored()])? as u64;
        followers.insert(edge.follower);
    }
    let mut count = tx.prepare_cached("SELECT count(*) FROM follows WHERE follower = ?1")?;
    for user in followers {
        let following: i64 = count.query_row([user.stored()], |r| r.get(0))?;
        if following as u64 > max_following {
            return Err(StoreError::FollowingLimit {
                user,
                limit: max_following,
            });
        }
    }
    Ok(added)
}

impl Store for SqliteStore {
    fn add_users(&mut self, users: &[UserId]) -> Result<u64, StoreError> {
        let tx = self
            .db
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut added = 0u64;
        {
            let mut add = tx.prepare_cached("INSERT OR IGNORE INTO users (id) VALUES (?1)")?;
            for user in users {
                added += add.execute([user.stored()])? as u64;
            }
        }
        tx.commit()?;
        Ok(added)
    }

    fn follow(&mut self, edges: &[Edge]) -> Result<u64, StoreError> {
        refuse_self_follows(edges)?;
        let tx = self
            .db
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        // Dropping `tx` on an error rolls the whole batch back.
        let added = insert_edges(&tx, edges, self.options.max_following)?;
        tx.commit()?;
        Ok(added)
    }

    fn unfollow(&mut self, edges: &[Edge]) -> Result<u64, StoreError> {
        let tx = self
            .db
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut removed = 0u64;
        {
            let mut remove =
                tx.prepare_cached("DELETE FROM follows WHERE followee = ?1 AND follower = ?2")?;
            for edge in edges {
                removed += remove.execute([edge.followee.stored(), edge.follower.stored()])? as u64;
            }
        }
        tx.commit()?;
        Ok(removed)
    }

    fn load(&mut self, users: Vec<UserId>, edges: Vec<Edge>) -> Result<u64, StoreError> {
        crate::sqlite_load::load(&mut self.db, &self.options, users, edges)
    }

    fn followers(
        &mut self,
        user: UserId,
        after: Option<UserId>,
        limit: usize,
    ) -> Result<Vec<UserId>, StoreError> {
        self.page(
            "SELECT follower FROM follows WHERE followee = ?1 AND follower > ?2 \
             ORDER BY follower LIMIT ?3",
            Some(user),
            after,
            limit,
        )
    }

    fn following(
        &mut self,
        user: UserId,
        after: Option<UserId>,
        limit: usize,
    ) -> Result<Vec<UserId>, StoreError> {
        self.page(
            "SELECT followee FROM follows WHERE follower = ?1 AND followee > ?2 \
             ORDER BY followee LIMIT ?3",
            Some(user),
            after,
            limit,
        )
    }

    fn users(&mut self, after: Option<UserId>, limit: usize) -> Result<Vec<UserId>, StoreError> {
        self.page(
            "SELECT id FROM users WHERE id > ?1 ORDER BY id LIMIT ?2",
            None,
            after,
            limit,
        )
    }

    fn contains(&mut self, user: UserId) -> Result<bool, StoreError> {
        let found = self
            .db
            .prepare_cached("SELECT 1 FROM users WHERE id = ?1")?
            .query_row([user.stored()], |_| Ok(()))
            .optional()?;
        Ok(found.is_some())
    }

    fn counts(&mut self, user: UserId) -> Result<Counts, StoreError> {
        let count = |db: &Connection, sql: &str| -> Result<u64, StoreError> {
            let n: i64 = db
                .prepare_cached(sql)?
                .query_row([user.stored()], |r| r.get(0))?;
            Ok(n as u64)
        };
        Ok(Counts {
            followers: count(&self.db, "SELECT count(*) FROM follows WHERE followee = ?1")?,
            following: count(&self.db, "SELECT count(*) FROM follows WHERE follower = ?1")?,
        })
    }

    fn totals(&mut self) -> Result<Totals, StoreError> {
        let users: i64 = self
            .db
            .query_row("SELECT count(*) FROM users", [], |r| r.get(0))?;
        let edges: i64 = self
            .db
            .query_row("SELECT count(*) FROM follows", [], |r| r.get(0))?;
        Ok(Totals {
            users: users as u64,
            edges: edges as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::conformance_suite!(
        in_memory,
        SqliteStore::in_memory(crate::conformance::OPTIONS).unwrap()
    );

    #[test]
    fn the_graph_survives_reopening_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("graph.sqlite3");
        let edge = Edge::new(UserId::new(1).unwrap(), UserId::new(2).unwrap());
        {
            let mut store = SqliteStore::open(&path, StoreOptions::default()).unwrap();
            assert_eq!(store.follow(&[edge]).unwrap(), 1);
        }
        let mut store = SqliteStore::open(&path, StoreOptions::default()).unwrap();
        assert_eq!(
            store.followers(edge.followee, None, 10).unwrap(),
            vec![edge.follower]
        );
    }
}
