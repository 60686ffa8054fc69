//! The messages a worker's mailbox carries, defined below the hub that
//! carries them and the modules that send them, so that none of those
//! needs another above it: [`engine`] (the engine's answers), [`feeds`]
//! (the graph keeper's feed changes) and [`proxy`] (the backend's verdicts
//! on parked commands).
//!
//! Owns only type definitions and their small helpers; it must not name
//! the hub, the engine, the feeds or anything above them.

pub mod engine;
pub mod feeds;
pub mod proxy;
