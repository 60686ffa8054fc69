//! What a workload's worker side is to the worker loop: a [`Driver`] that
//! the loop ticks and the reactor hands connection events to, and the
//! [`DriverResult`] it leaves for the final report.
//!
//! Owns that contract only; the loop is `process.rs`, each workload's
//! driver one file in `workloads/`.

use crate::schema::{BroadcastTally, Published, SocialDone};
use crate::util::clock::Extent;
use crate::util::continuity::Reached;
use crate::util::histogram::Micros;
use crate::worker::client_conn::Handler;
use crate::worker::reactor::Reactor;

/// Most events (arrivals, publishes, closes) a driver handles per tick:
/// a driver that has fallen behind catches up in batches, between which
/// the reactor still reads its sockets and the worker still reports.
pub const MAX_BATCH: u64 = 256;

/// What a workload adds to a worker's final report.
#[derive(Debug, Default)]
pub struct DriverResult {
    /// Latency of every delivery received.
    pub latency: Option<Micros>,
    /// How late each publish left against its due time.
    pub lag: Option<Micros>,
    /// HTTP publish response latency (from due time).
    pub ack: Option<Micros>,
    /// Connect-rate: upgrades completed in each schedule phase.
    pub phase_upgrades: Vec<u64>,
    /// Broadcast: per message, deliveries and the slowest delivery (µs).
    pub broadcast: Option<BroadcastTally>,
    /// Publishers: which events they published.
    pub published: Option<Published>,
    /// Subscribers: when the first and last delivery arrived.
    pub received: Option<Extent>,
    /// Publishers: when the first and last publish left.
    pub sent: Option<Extent>,
    /// Churn: publications replayed per recovered resubscribe.
    pub replay: Option<Micros>,
    /// Churn: from a reconnect's connect() to its subject's `subscribed`
    /// (over long-poll, to the reconnect's first answer).
    pub resubscribe: Option<Micros>,
    /// Churn: where each subscription joined and stopped.
    pub reached: Option<Vec<Reached>>,
    /// Social: what its users sent and its connections received.
    pub social: Option<SocialDone>,
}

/// A workload's worker-side logic, driven by the worker loop (`process.rs`).
pub trait Driver: Handler {
    /// Does whatever is due (open connections, publish). Returns the
    /// monotonic ns at which it next has something due, if anything.
    fn tick(&mut self, reactor: &mut Reactor) -> Option<u64>;
    /// The coordinator says every worker is ready.
    fn start(&mut self, reactor: &mut Reactor);
    /// The coordinator says stop.
    fn stop(&mut self, reactor: &mut Reactor);
    /// Set-up is complete.
    fn is_ready(&self, reactor: &Reactor) -> bool;
    /// Nothing left to do: the worker reports and exits.
    fn is_done(&self, reactor: &Reactor) -> bool;
    /// Message latency recorded since the last call.
    fn take_interval(&mut self) -> Option<Micros>;
    /// Whether its due times must be met to well under a millisecond
    /// (publishers, whose lateness becomes measured latency). Others are
    /// served by epoll's millisecond timeouts, which cost no extra wake-ups.
    fn precise(&self) -> bool {
        false
    }
    /// The workload's part of the final report.
    fn finish(self) -> DriverResult;
}
