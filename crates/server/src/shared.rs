//! [`Shared`]: the node-wide state every worker and the admin API hold a
//! handle to (settings, hub, engine, auth, feeds, counters, admission).
//!
//! Its own module, below `worker`, `admin` and `status`, so that the admin
//! API and the status page reach the node's state without standing on the
//! workers. It owns no behaviour beyond reading what it holds: it must not
//! name `worker`, `admin` or `status`.

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;

use crate::auth::Auth;
use crate::config::Config;
use crate::engine::Engine;
use crate::feeds::Feeds;
use crate::hooks::cluster::Stage;
use crate::hooks::{Hooks, Signal};
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::namespace::{Namespaces, PresencePolicy};
use crate::peers::{PeerCounts, TokenFailures};
use crate::proxy::Proxy;
use crate::tls::Certificates;

/// State shared by all workers and the admin API.
pub struct Shared {
    pub config: Config,
    pub hub: Arc<Hub>,
    pub engine: Arc<dyn Engine>,
    /// Token verification and who may do what with each subject.
    pub auth: Auth,
    /// Which subjects keep presence, and their caps.
    pub presence: Namespaces<PresencePolicy>,
    /// Open connections per source address (`max_connections_per_ip`).
    pub peers: PeerCounts,
    /// Failed token checks per source address (`token_failures_per_ip`).
    pub token_failures: TokenFailures,
    /// The follow graph's keeper, presence and known users.
    pub feeds: Feeds,
    pub metrics: Arc<Metrics>,
    /// Open client connections on the node, checked against `max_connections`.
    pub connections: AtomicUsize,
    /// Client sockets held only to answer 429 (`max_connections_per_ip`):
    /// not in `connections`, so one address cannot take others' places,
    /// and within `fds::CLIENT_REFUSALS` with the 503s.
    pub refusing: AtomicUsize,
    /// Connections admitted before new ones get 503: the configured
    /// `max_connections`, lowered to what the open-file limit allows.
    pub max_connections: usize,
    /// Set once by the signal handler; every worker then drains and exits.
    pub shutting_down: AtomicBool,
    /// The client listener's certificates, when it speaks TLS.
    pub tls: Option<Arc<Certificates>>,
    /// Resident memory once the node had started, before any connection:
    /// what memory per connection is counted from.
    pub baseline_rss_bytes: u64,
    /// The lifecycle hooks' delivery thread, when `hook_url` is set.
    pub hooks: Option<Hooks>,
    /// The proxies' thread, when a proxy URL is set.
    pub proxy: Option<Proxy>,
    /// The lifecycle stage in front of it, when nodes share a tally (the
    /// Redis engine): the workers' signals go there instead.
    pub lifecycle: Option<Stage>,
}

impl Shared {
    /// Hands a lifecycle signal to the hooks' thread, without waiting; a
    /// no-op without `hook_url`, where `signal` is never called: a
    /// connection's open and close then allocate nothing for the hooks.
    pub fn hook(&self, signal: impl FnOnce() -> Signal) {
        if let Some(stage) = &self.lifecycle {
            stage.signal(signal());
        } else if let Some(hooks) = &self.hooks {
            hooks.signal(signal());
        }
    }

    /// Where the node's memory goes now (see [`crate::process::Memory`]).
    pub fn memory(
        &self,
        usage: &crate::process::Usage,
        engine: &crate::engine::EngineStats,
        metrics: &crate::metrics::Snapshot,
    ) -> crate::process::Memory {
        let held = crate::process::Held {
            history_bytes: engine.history.bytes,
            history_max_bytes: self.config.history_max_bytes as u64,
            subject_bytes: engine.subject_bytes,
            partial_input_bytes: metrics.partial_input_bytes,
            outbound_bytes: metrics.outbound_bytes,
        };
        crate::process::Memory::new(
            usage.rss_bytes,
            self.baseline_rss_bytes,
            held,
            metrics.connections,
        )
    }
}
