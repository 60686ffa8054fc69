//! One file per workload's worker-side driver, each a [`Driver`] the
//! worker loop runs for one kind of [`Task`]: connect-rate devices,
//! publishers, churning subscribers, and the users of a follow graph
//! (social). The plain subscribers of
//! `subscribers`, `broadcast` and `run` are `worker/subscriber.rs`, which
//! churn builds on. A workload file imports no other workload file.
//!
//! [`Driver`]: crate::worker::driver::Driver
//! [`Task`]: crate::schema::Task

pub mod churn;
pub mod connect_rate;
pub mod publishers;
pub mod social;
