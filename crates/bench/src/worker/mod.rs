//! Layer 3, the worker process (`bench __worker`): its main loop
//! ([`process`]), one mio event loop per worker ([`engine`]) with its
//! connections in a slab, each a compact state machine over the shared
//! protocol crate ([`conn`]), and what a workload does on the worker side
//! ([`driver`]): the subscribing connections most workloads hold
//! ([`subscriber`]) and one file per workload's own driver
//! ([`workloads`]); [`tls`] for `wss://` targets.
//!
//! Uses the helpers and the schema only; knows nothing of the coordinator
//! or the report, which see a worker only through its JSON lines.

pub mod conn;
pub mod driver;
pub mod engine;
pub mod process;
pub mod subscriber;
pub mod tls;
pub mod workloads;
