//! Layer 1, the helpers: everything the bench computes without knowing
//! about processes, workers or reports.
//!
//! A module here imports no other layer (only its siblings in `util`), so
//! each is tested on its own. All are pure functions and values except
//! [`sys`] and [`plan::fd_cap`], which read and raise this process's limits
//! and usage, and [`clock`], which reads the clocks.

pub mod addr;
pub mod clock;
pub mod continuity;
pub mod counters;
pub mod error;
pub mod fmt;
pub mod graph;
pub mod histogram;
pub mod http;
pub mod inflate_cache;
pub mod judge;
pub mod offsets;
pub mod pacing;
pub mod pattern;
pub mod payload;
pub mod plan;
pub mod profile;
pub mod stats;
pub mod sys;
pub mod toggles;
