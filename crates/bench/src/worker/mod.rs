//! Layer 3, the worker process (`bench __worker`): its main loop
//! ([`process`]), one mio event loop per worker ([`reactor`]) with its
//! connections in a slab, each a compact state machine over the shared
//! protocol crate ([`client_conn`]), and what a workload does on the worker
//! side ([`driver`]): the subscribing connections most workloads hold
//! ([`subscriber`]) and one file per workload's own driver
//! ([`workloads`]); [`tls`] for `wss://` targets.
//!
//! A worker here is a process, as a worker in the server is a thread: in
//! both, the unit that owns a share of the connections and runs one event
//! loop over them.
//!
//! Uses the helpers and the schema only; knows nothing of the coordinator
//! or the report, which see a worker only through its JSON lines.

pub mod client_conn;
pub mod driver;
pub mod process;
pub mod reactor;
pub mod subscriber;
pub mod tls;
pub mod workloads;
