//! The lifecycle hooks' series: mirrored from the delivery thread's counts,
//! and the delivery latency it observes itself.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::{catch_up, gauge, registered, ReasonLabel};

/// The lifecycle hooks' series, mirrored from the delivery thread's counts.
pub(super) struct HookMetrics {
    sent: Counter<u64, AtomicU64>,
    retried: Counter<u64, AtomicU64>,
    cancelled: Counter<u64, AtomicU64>,
    dropped: Family<ReasonLabel, Counter>,
    queued: Gauge,
    /// From a batch's oldest event being ready to the receiver's 2xx,
    /// through the batch window and any retries.
    latency: Histogram,
}

impl HookMetrics {
    pub(super) fn new(r: &mut Registry) -> HookMetrics {
        let hooks = HookMetrics {
            sent: registered(r, "hook_events_sent", "Hook events the receiver took (2xx)"),
            retried: registered(
                r,
                "hook_events_retried",
                "Hook events sent again after a 5xx, 408, 429 or no answer, once per retry",
            ),
            cancelled: registered(
                r,
                "hook_events_cancelled",
                "Hook events never sent because a return came within hook_delay (both of a pair)",
            ),
            dropped: registered(
                r,
                "hook_events_dropped",
                "Hook events dropped: full (hook_queue), refused (a 4xx), retries (hook_retries spent)",
            ),
            queued: registered(
                r,
                "hook_events_queued",
                "Hook events held, ready, out or waiting to be retried",
            ),
            latency: Histogram::new(exponential_buckets(0.005, 2.0, 15)),
        };
        r.register(
            "hook_delivery_seconds",
            "From a hook batch's oldest event being ready to its 2xx, retries included",
            hooks.latency.clone(),
        );
        hooks
    }

    /// A hook batch was delivered `latency` after its oldest event was
    /// ready.
    pub(super) fn delivered(&self, latency: std::time::Duration) {
        self.latency.observe(latency.as_secs_f64());
    }

    /// Copies the hooks' counts in, before metrics are read.
    pub(super) fn mirror(&self, snapshot: &crate::hooks::Snapshot) {
        let counts = &snapshot.counts;
        catch_up(&self.sent, counts.sent);
        catch_up(&self.retried, counts.retried);
        catch_up(&self.cancelled, counts.cancelled);
        for (reason, total) in [
            ("full", counts.dropped_full),
            ("refused", counts.dropped_refused),
            ("retries", counts.dropped_retries),
        ] {
            catch_up(&self.dropped.get_or_create(&ReasonLabel { reason }), total);
        }
        self.queued.set(gauge(snapshot.queued as u64));
    }
}
