//! The proxies' series: calls by kind and outcome, their latency by kind,
//! the calls out now, and the commands held behind a parked one. Counted by the worker that gets each verdict
//! (every call's verdict comes back to its worker, even for a connection
//! closed since), and `busy` where the call was refused.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::{gauge, registered, KindLabel};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabel {
    kind: &'static str,
    outcome: &'static str,
}

/// What a proxy call came to, the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyOutcome {
    Allowed,
    Refused,
    Timeout,
    /// Unreachable, a non-2xx status or a malformed answer.
    Error,
    /// Not made: `proxy_max_in_flight` calls were out.
    Busy,
}

impl ProxyOutcome {
    const fn name(self) -> &'static str {
        match self {
            ProxyOutcome::Allowed => "allowed",
            ProxyOutcome::Refused => "refused",
            ProxyOutcome::Timeout => "timeout",
            ProxyOutcome::Error => "error",
            ProxyOutcome::Busy => "busy",
        }
    }
}

type Latency = Family<KindLabel, Histogram, fn() -> Histogram>;

pub(super) struct ProxyMetrics {
    calls: Family<CallLabel, Counter>,
    latency: Latency,
    in_flight: Gauge,
    held: Counter,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_5, 2.0, 16))
}

impl ProxyMetrics {
    pub(super) fn new(r: &mut Registry) -> ProxyMetrics {
        let latency: Latency = Family::new_with_constructor(latency_histogram);
        r.register(
            "proxy_call_seconds",
            "From a proxy call's start to its verdict (or timeout), by kind",
            latency.clone(),
        );
        ProxyMetrics {
            calls: registered(
                r,
                "proxy_calls",
                "Proxy calls by kind (connect, subscribe, publish) and outcome (allowed, refused, \
                 timeout, error, busy)",
            ),
            latency,
            in_flight: registered(
                r,
                "proxy_in_flight",
                "Proxy calls out now (proxy_max_in_flight)",
            ),
            held: registered(
                r,
                "proxy_held",
                "Commands held behind an earlier command of their connection parked for a \
                 proxy verdict (proxy_max_held)",
            ),
        }
    }

    pub(super) fn call(&self, kind: &'static str, outcome: ProxyOutcome, seconds: Option<f64>) {
        self.calls
            .get_or_create(&CallLabel {
                kind,
                outcome: outcome.name(),
            })
            .inc();
        if let Some(seconds) = seconds {
            self.latency
                .get_or_create(&KindLabel { kind })
                .observe(seconds);
        }
    }

    pub(super) fn held(&self) {
        self.held.inc();
    }

    pub(super) fn in_flight(&self, n: usize) {
        self.in_flight.set(gauge(n as u64));
    }
}
