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
    /// The lifecycle stage's: keys of dead nodes this node let go, tally
    /// calls that failed and those waiting to be made again, let-gos
    /// awaiting their confirm.
    swept: Counter<u64, AtomicU64>,
    tally_failures: Counter<u64, AtomicU64>,
    tally_retrying: Gauge,
    pending: Gauge,
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
            swept: registered(
                r,
                "hook_dead_node_keys",
                "Users and subjects of dead nodes this node let go (their offline/vacated owed here)",
            ),
            tally_failures: registered(
                r,
                "hook_tally_failures",
                "Lifecycle tally calls that failed (made again at each lease renewal, in order)",
            ),
            tally_retrying: registered(
                r,
                "hook_tally_retrying",
                "Lifecycle tally calls waiting to be made again (at most hook_queue)",
            ),
            pending: registered(
                r,
                "hook_let_go_pending",
                "Cluster-wide offline/vacated waiting out hook_delay before their confirm",
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
    /// With the lifecycle stage's counts: its cancels and full channel
    /// are added to the queue's, one meaning each.
    pub(super) fn mirror(
        &self,
        snapshot: &crate::hooks::Snapshot,
        stage: Option<&crate::hooks::cluster::StageCounts>,
    ) {
        use std::sync::atomic::Ordering::Relaxed;
        let counts = &snapshot.counts;
        let of = |read: fn(&crate::hooks::cluster::StageCounts) -> u64| stage.map_or(0, read);
        catch_up(&self.sent, counts.sent);
        catch_up(&self.retried, counts.retried);
        catch_up(
            &self.cancelled,
            counts.cancelled + of(|s| s.cancelled.load(Relaxed)),
        );
        catch_up(&self.swept, of(|s| s.swept.load(Relaxed)));
        catch_up(&self.tally_failures, of(|s| s.failures.load(Relaxed)));
        self.pending.set(gauge(of(|s| s.pending.load(Relaxed))));
        self.tally_retrying
            .set(gauge(of(|s| s.retrying.load(Relaxed))));
        for (reason, total) in [
            (
                "full",
                counts.dropped_full + of(|s| s.dropped_full.load(Relaxed)),
            ),
            ("refused", counts.dropped_refused),
            ("retries", counts.dropped_retries),
        ] {
            catch_up(&self.dropped.get_or_create(&ReasonLabel { reason }), total);
        }
        self.queued.set(gauge(snapshot.queued as u64));
    }
}
