//! One file per workload's coordinator: each plans its worker processes,
//! drives the run through the monitor and fills the run's
//! [`Measurements`](crate::measurements::Measurements). What they share is
//! `coordinator/groups.rs`; a workload file imports no other workload file.

pub mod broadcast;
pub mod churn;
pub mod connect_rate;
pub mod publishers;
pub mod run;
pub mod social;
pub mod subscribers;
