//! Layer 4, the coordinator: the `myriad bench` process that plans a run,
//! spawns and watches its worker processes ([`fleet`]), samples the
//! per-second timeline ([`monitor`]), shows live progress ([`progress`]),
//! polls the node's /stats and writes its follow graph ([`node_api`]), and
//! runs each workload ([`workloads`], sharing [`groups`]), taking its
//! options from [`cli`].
//!
//! Uses the helpers, the schema and the worker's entry point only through
//! processes: it never calls the worker's code, and it hands the report its
//! [`Measurements`](crate::measurements::Measurements), never its own types.

pub mod cli;
pub mod fleet;
pub mod groups;
pub mod monitor;
pub mod node_api;
pub mod progress;
pub mod workloads;
