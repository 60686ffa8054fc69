//! The follow graph: who follows whom, kept behind one [`Store`] contract.
//!
//! A user follows other users; "send as user X" reaches everyone who
//! follows X (and X). This crate owns the graph's data and nothing about
//! connections or delivery: the node asks it who a user follows when the
//! user connects, and writes follows and unfollows through it.
//!
//! - [`user`]: user ids and edges, with their range rules.
//! - [`edgelist`]: the text file a graph is generated into and loaded from.
//! - [`store`]: the [`Store`] contract every backend keeps.
//! - [`sqlite`]: the embedded default, one SQLite file in WAL mode.
//! - `conformance` (tests, or the `conformance` feature): the suite that
//!   states the contract; every store runs it unchanged.

pub mod edgelist;
pub mod sqlite;
pub mod store;
pub mod user;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

pub use sqlite::SqliteStore;
pub use store::{Counts, Store, StoreError, StoreOptions, Totals};
pub use user::{Edge, UserId, UserIdError};
