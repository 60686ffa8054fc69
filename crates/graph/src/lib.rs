//! The follow graph: who follows whom, kept behind one [`Store`] contract.
//!
//! A user follows other users; "send as user X" reaches everyone who
//! follows X (and X). This crate owns the graph's data and nothing about
//! connections or delivery: the node asks it who a user follows when the
//! user connects, and writes follows and unfollows through it.
//!
//! - [`user`]: user ids and edges, with their range rules.
//! - [`announce`]: what a shared store says of each change it applies,
//!   numbered in the store's order, so every node can follow along.
//! - [`dir`]: the lock that gives one process at a time a node's data
//!   directory (a node while it runs, or a bulk load).
//! - [`edgelist`]: the text file a graph is generated into and loaded from.
//! - [`generate`]: seed 004's Barabási–Albert graph, deterministic per seed.
//! - [`store`]: the [`Store`] contract every backend keeps.
//! - [`sqlite`]: the embedded default, one SQLite file in WAL mode.
//! - [`redis_store`]: the graph in one Redis 7, shared by a cluster's
//!   nodes; a batch is one Lua script, a bulk one a journal in Redis.
//! - `conformance` (tests, or the `conformance` feature): the suite that
//!   states the contract; every store runs it unchanged.

pub mod announce;
pub mod dir;
pub mod edgelist;
pub mod generate;
pub mod redis_store;
pub mod sqlite;
mod sqlite_load;
pub mod store;
pub mod user;

// Both stores live in this crate, so their tests are the suite's only users.
#[cfg(test)]
pub mod conformance;

pub use announce::{Announced, Announcement, Snapshot};
pub use dir::{DataDir, DataDirError};
pub use redis_store::{ChangeStream, RedisStore, RedisTimeouts};
pub use sqlite::SqliteStore;
pub use store::{Counts, Store, StoreError, StoreOptions, Totals};
pub use user::{Edge, UserId, UserIdError};
