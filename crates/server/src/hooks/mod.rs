//! Lifecycle webhooks (issue 29, item 2): what a hook event is, the hook
//! settings and their checks, the request signature, the delivery queue
//! that holds, batches, orders and retries events, and the tally contract
//! (`tally.rs`) and lifecycle stage (`cluster.rs`) that make `online`,
//! `offline`, `occupied` and `vacated` the cluster's.
//!
//! The queue owns no socket and no thread: it is the pure core that the
//! delivery task (`deliver.rs`, its one thread) drives with the time and
//! the receiver's answers; `lifecycle.rs` turns what the workers report
//! into this node's transitions, which the stage (`cluster.rs`) checks
//! with the tally. The module must not name any other module of the
//! crate but `backend`, the HTTP client it shares with the proxies
//! (layer 1 in tests/layers.rs), so the sessions and the hub can feed it
//! without a circle.

pub mod cluster;
pub mod deliver;
pub mod event;
pub mod lifecycle;
pub mod queue;
pub mod settings;
pub mod sign;
pub mod tally;

pub use deliver::{Hooks, Snapshot};
pub use event::{Event, EventKind, Key};
pub use lifecycle::{Lifecycle, Signal};
pub use queue::{Batch, Outcome, Queue};
pub use settings::{HookSettings, HookSettingsError};
pub use sign::{sign, SIGNATURE_HEADER, TIMESTAMP_HEADER};
