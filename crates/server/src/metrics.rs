//! Counters and gauges of a node, exported as Prometheus text (`/metrics`)
//! and summed into the `/stats` JSON.
//!
//! Hot-path counters are labelled by worker and each worker holds its own
//! handles, so a delivery increments a cache line only its own core touches.
//! Rare events (closes by reason, errors by kind) share one family each;
//! the kinds of error and their labels are [`errors`]'s.

mod compression;
mod errors;
mod hooks;
mod proxy;

use std::sync::atomic::AtomicU64;

use myriad_protocol::close::CloseReason;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Metric, Registry};

use crate::feeds::Direction;
use crate::transport::TransportKind;
use compression::CompressionMetrics;
use hooks::HookMetrics;
use proxy::ProxyMetrics;
pub use proxy::ProxyOutcome;

pub use self::errors::ErrorKind;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerLabel {
    worker: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransportLabel {
    worker: String,
    transport: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

/// One worker's handles to the series of one transport.
#[derive(Clone, Debug, Default)]
pub struct TransportMetrics {
    pub connections: Gauge,
    pub messages_out: Counter,
}

/// One worker's own handles to the per-worker series.
#[derive(Clone, Debug, Default)]
pub struct WorkerMetrics {
    /// Indexed by `TransportKind::index`.
    pub transports: [TransportMetrics; TransportKind::COUNT],
    pub connections: Gauge,
    pub accepted: Counter,
    pub subscriptions: Gauge,
    pub messages_in: Counter,
    pub messages_out: Counter,
    pub bytes_in: Counter,
    pub bytes_out: Counter,
    pub writes: Counter,
    pub tls_handshakes: Counter,
    pub reads_paused: Counter,
    /// Bytes held for messages and requests not yet whole, summed by the
    /// worker's sweep.
    pub partial_input_bytes: Gauge,
    /// Bytes queued for sockets and not yet written, summed by the
    /// worker's sweep.
    pub outbound_bytes: Gauge,
}

/// What history holds, mirrored from the engine when metrics are read.
struct HistoryGauges {
    subjects: Gauge,
    positions: Gauge,
    messages: Gauge,
    bytes: Gauge,
    evictions: Counter,
    evicted_positions: Counter,
    /// Subjects with subscribers, and what the engine keeps for them.
    routed: Gauge,
    routed_bytes: Gauge,
}

/// What presence holds and has done, mirrored from the engine when
/// metrics are read.
struct PresenceMetrics {
    members: Gauge,
    joined: Counter<u64, AtomicU64>,
    left: Counter<u64, AtomicU64>,
    refused: Counter<u64, AtomicU64>,
    expired: Counter<u64, AtomicU64>,
}

/// All metrics of a node.
pub struct Metrics {
    registry: Registry,
    history: HistoryGauges,
    presence: PresenceMetrics,
    workers: Vec<WorkerMetrics>,
    closes: Family<ReasonLabel, Counter>,
    errors: Family<KindLabel, Counter>,
    engine_failures: Family<KindLabel, Counter>,
    publishes: Counter<u64, AtomicU64>,
    publishes_unrouted: Counter<u64, AtomicU64>,
    engine_round_trips: Counter<u64, AtomicU64>,
    engine_failovers: Counter<u64, AtomicU64>,
    engine_unavailable_ms: Counter<u64, AtomicU64>,
    engine_waiting_attaches: Gauge,
    tls_reloads: Counter<u64, AtomicU64>,
    token_key_reloads: Counter<u64, AtomicU64>,
    sockets_aborted: Counter<u64, AtomicU64>,
    feeds: FeedMetrics,
    admin: AdminMetrics,
    compression: CompressionMetrics,
    hooks: HookMetrics,
    proxy: ProxyMetrics,
}

/// The admin listener's series (its refusals are in `errors`).
struct AdminMetrics {
    connections: Gauge,
    idle_closes: Counter<u64, AtomicU64>,
    unauthenticated_closes: Counter<u64, AtomicU64>,
}

/// The follow graph's series.
struct FeedMetrics {
    sends: Counter<u64, AtomicU64>,
    follows: Counter<u64, AtomicU64>,
    unfollows: Counter<u64, AtomicU64>,
    users_known: Gauge,
    users_present: Gauge,
    listen_failures: Counter<u64, AtomicU64>,
    resyncs: Counter<u64, AtomicU64>,
}

/// Registers a fresh metric (or family) as `name` and returns a handle to
/// it: every handle clones one shared value, so what the node counts
/// through the handle is what `/metrics` reads from the registry.
fn registered<M>(registry: &mut Registry, name: &str, help: &str) -> M
where
    M: Metric + Clone + Default,
{
    let metric = M::default();
    registry.register(name, help, metric.clone());
    metric
}

/// Raises `counter` to `total`, a count kept elsewhere (the engine, the
/// graph keeper) and copied in when metrics are read.
fn catch_up(counter: &Counter<u64, AtomicU64>, total: u64) {
    counter.inc_by(total.saturating_sub(counter.get()));
}

fn gauge(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Metrics {
    pub fn new(worker_count: usize) -> Metrics {
        let mut registry = Registry::with_prefix("myriad");
        let r = &mut registry;
        let connections: Family<WorkerLabel, Gauge> =
            registered(r, "connections", "Open client connections");
        let accepted: Family<WorkerLabel, Counter> =
            registered(r, "connections_accepted", "Client connections accepted");
        let subscriptions: Family<WorkerLabel, Gauge> = registered(
            r,
            "subscriptions",
            "Subscriptions held (subject, connection pairs)",
        );
        let messages_in: Family<WorkerLabel, Counter> = registered(
            r,
            "messages_in",
            "Messages received from clients: WebSocket messages and posted commands",
        );
        let messages_out: Family<WorkerLabel, Counter> = registered(
            r,
            "messages_out",
            "Data messages queued to clients on every transport (deliveries, replies, echoes)",
        );
        let bytes_in: Family<WorkerLabel, Counter> =
            registered(r, "bytes_in", "Bytes read from client sockets");
        let bytes_out: Family<WorkerLabel, Counter> =
            registered(r, "bytes_out", "Bytes written to client sockets");
        let writes: Family<WorkerLabel, Counter> =
            registered(r, "socket_writes", "write/writev calls on client sockets");
        let tls_handshakes: Family<WorkerLabel, Counter> = registered(
            r,
            "tls_handshakes",
            "TLS handshakes completed on the client listener",
        );
        let reads_paused: Family<WorkerLabel, Counter> = registered(
            r,
            "reads_paused",
            "Times a worker held a connection's reading because the node was congested \
             (mailboxes past mailbox_high_water, or a queue towards Redis past redis_queue_high_water); \
             a connection held already (for its read budget) is not counted, one resumed and held again is",
        );
        let partial_input_bytes: Family<WorkerLabel, Gauge> = registered(
            r,
            "partial_input_bytes",
            "Bytes client connections hold for input not yet whole (a frame or request \
             split across reads, the fragments of a message), summed once a second",
        );
        let outbound_bytes: Family<WorkerLabel, Gauge> = registered(
            r,
            "outbound_bytes",
            "Bytes queued for client sockets and not yet written (each within \
             max_outbound_bytes), summed once a second",
        );
        let transport_connections: Family<TransportLabel, Gauge> = registered(
            r,
            "transport_connections",
            "Open client connections, by transport (once their request is accepted)",
        );
        let transport_messages: Family<TransportLabel, Counter> = registered(
            r,
            "transport_messages_out",
            "Data messages queued to clients, by transport",
        );
        let workers = (0..worker_count)
            .map(|w| {
                let label = WorkerLabel {
                    worker: w.to_string(),
                };
                let transports = TransportKind::ALL.map(|kind| {
                    let label = TransportLabel {
                        worker: w.to_string(),
                        transport: kind.name(),
                    };
                    TransportMetrics {
                        connections: transport_connections.get_or_create(&label).clone(),
                        messages_out: transport_messages.get_or_create(&label).clone(),
                    }
                });
                WorkerMetrics {
                    transports,
                    connections: connections.get_or_create(&label).clone(),
                    accepted: accepted.get_or_create(&label).clone(),
                    subscriptions: subscriptions.get_or_create(&label).clone(),
                    messages_in: messages_in.get_or_create(&label).clone(),
                    messages_out: messages_out.get_or_create(&label).clone(),
                    bytes_in: bytes_in.get_or_create(&label).clone(),
                    bytes_out: bytes_out.get_or_create(&label).clone(),
                    writes: writes.get_or_create(&label).clone(),
                    tls_handshakes: tls_handshakes.get_or_create(&label).clone(),
                    reads_paused: reads_paused.get_or_create(&label).clone(),
                    partial_input_bytes: partial_input_bytes.get_or_create(&label).clone(),
                    outbound_bytes: outbound_bytes.get_or_create(&label).clone(),
                }
            })
            .collect();

        let closes: Family<ReasonLabel, Counter> = registered(
            r,
            "connections_closed",
            "Client connections closed, by reason",
        );
        // Create every reason's series up front so each shows as 0, not absent.
        for reason in CloseReason::ALL {
            drop(closes.get_or_create(&ReasonLabel {
                reason: reason.name(),
            }));
        }
        let errors = registered(r, "errors", "Refused input and failures, by kind");
        let engine_failures: Family<KindLabel, Counter> = registered(
            r,
            "engine_failures",
            "Requests the engine could not serve (Redis down, slow or full), by kind",
        );
        for kind in crate::engine::EngineFailures::KINDS {
            drop(engine_failures.get_or_create(&KindLabel { kind }));
        }
        let publishes = registered(r, "publishes", "Messages published");
        let publishes_unrouted = registered(
            r,
            "publishes_unrouted",
            "Messages published to a subject with no subscribers",
        );
        let engine_round_trips = registered(
            r,
            "engine_round_trips",
            "Round trips to Redis carrying publishes, attaches and reads (a pipeline of scripts each; 0 on the memory engine)",
        );
        let engine_failovers = registered(
            r,
            "engine_failovers",
            "Failovers the Redis engine followed: connects that reached another master than the one before (redis_sentinel)",
        );
        let engine_unavailable_ms = registered(
            r,
            "engine_redis_unavailable_milliseconds",
            "Milliseconds the Redis engine's instances spent without a connection (no master during a failover, or unreachable), summed over instances",
        );
        let engine_waiting_attaches = registered(
            r,
            "engine_waiting_attaches",
            "Attaches for users' graph feeds waiting for room in a full queue towards Redis (redis_feed_backlog)",
        );
        let tls_reloads = registered(
            r,
            "tls_reloads",
            "TLS certificate reloads (SIGHUP) that took effect",
        );
        let token_key_reloads = registered(
            r,
            "token_key_reloads",
            "Token key file reloads (SIGHUP) that took effect",
        );
        let sockets_aborted = registered(
            r,
            "sockets_aborted",
            "Client sockets aborted (SO_LINGER 0) at a deadline because the peer had not taken everything sent",
        );
        let history = HistoryGauges {
            subjects: registered(r, "history_subjects", "Subjects holding history"),
            positions: registered(
                r,
                "history_positions",
                "Subjects kept with neither subscribers nor history, for their position only",
            ),
            messages: registered(r, "history_messages", "Publications held in history"),
            bytes: registered(
                r,
                "history_bytes",
                "Bytes charged to history_max_bytes: publications (shared with live fan-out) \
                 with their compressed frames once made, history queues, and subjects kept \
                 without subscribers",
            ),
            evictions: registered(
                r,
                "history_evictions",
                "Publications evicted from history to stay within history_max_bytes",
            ),
            evicted_positions: registered(
                r,
                "history_positions_evicted",
                "Idle positions forgotten to stay within history_max_bytes",
            ),
            routed: registered(r, "subjects", "Subjects with subscribers on this node"),
            routed_bytes: registered(
                r,
                "subject_bytes",
                "Bytes the engine keeps for subjects with subscribers on this node",
            ),
        };
        let presence = PresenceMetrics {
            members: registered(
                r,
                "presence_members",
                "Members of presence subjects held by this node's engine",
            ),
            joined: registered(
                r,
                "presence_joined",
                "Connections that joined a presence subject",
            ),
            left: registered(r, "presence_left", "Members that left a presence subject"),
            refused: registered(
                r,
                "presence_refused",
                "Subscribes refused because the subject had presence_max_members members",
            ),
            expired: registered(
                r,
                "presence_expired",
                "Members removed because their node's presence_lease ended (cluster-wide, Redis engine)",
            ),
        };
        let hooks = HookMetrics::new(r);
        let proxy = ProxyMetrics::new(r);
        let compression = CompressionMetrics::new(r);
        let feeds = FeedMetrics {
            sends: registered(
                r,
                "feed_sends",
                "Sends as a user (the send command and /api/publish_as)",
            ),
            follows: registered(r, "follows", "Follow edges added to the graph"),
            unfollows: registered(r, "unfollows", "Follow edges removed from the graph"),
            users_known: registered(r, "graph_users", "Users the follow graph knows"),
            users_present: registered(
                r,
                "users_present",
                "Users with at least one connection on this node",
            ),
            listen_failures: registered(
                r,
                "graph_listen_failures",
                "Times the subscription to the shared graph store's changes failed or broke",
            ),
            resyncs: registered(
                r,
                "graph_resyncs",
                "Times the node read every present user's follows again (it may have missed changes)",
            ),
        };
        let admin = AdminMetrics {
            connections: registered(
                r,
                "admin_connections",
                "Open connections of the admin listener",
            ),
            unauthenticated_closes: registered(
                r,
                "admin_unauthenticated_closes",
                "Admin connections that had presented no key, closed to make room for a new connection",
            ),
            idle_closes: registered(
                r,
                "admin_idle_closes",
                "Admin connections closed after admin_idle_timeout without a request",
            ),
        };
        Metrics {
            compression,
            registry,
            history,
            presence,
            workers,
            closes,
            errors,
            engine_failures,
            publishes,
            publishes_unrouted,
            engine_round_trips,
            engine_failovers,
            engine_unavailable_ms,
            engine_waiting_attaches,
            tls_reloads,
            token_key_reloads,
            sockets_aborted,
            feeds,
            admin,
            hooks,
            proxy,
        }
    }

    /// Worker `w`'s handles.
    pub fn worker(&self, w: usize) -> WorkerMetrics {
        self.workers[w].clone()
    }

    pub fn closed(&self, reason: CloseReason) {
        self.closes
            .get_or_create(&ReasonLabel {
                reason: reason.name(),
            })
            .inc();
    }

    /// A SIGHUP reload put new certificate files in force.
    pub fn tls_reloaded(&self) {
        self.tls_reloads.inc();
    }

    /// A SIGHUP reload put new token key files in force.
    pub fn token_keys_reloaded(&self) {
        self.token_key_reloads.inc();
    }

    /// Counts a socket reset at a deadline rather than closed, so that the
    /// kernel does not keep it for data its peer is not taking.
    pub fn socket_aborted(&self) {
        self.sockets_aborted.inc();
    }

    pub fn feed_send(&self) {
        self.feeds.sends.inc();
    }

    /// Counts a follow or unfollow batch's changed edges.
    pub fn graph_changed(&self, direction: Direction, edges: u64) {
        let counter = match direction {
            Direction::Follow => &self.feeds.follows,
            Direction::Unfollow => &self.feeds.unfollows,
        };
        counter.inc_by(edges);
    }

    /// A hook batch was delivered `latency` after its oldest event was
    /// ready; called by the delivery thread.
    pub fn hook_delivered(&self, latency: std::time::Duration) {
        self.hooks.delivered(latency);
    }

    /// A proxy call of `kind` came to `outcome`, after `latency` when it
    /// was made.
    pub fn proxy_call(
        &self,
        kind: &'static str,
        outcome: ProxyOutcome,
        latency: Option<std::time::Duration>,
    ) {
        self.proxy
            .call(kind, outcome, latency.map(|l| l.as_secs_f64()));
    }

    /// A command was held behind a parked one of its connection.
    pub fn proxy_held(&self) {
        self.proxy.held();
    }

    /// Copies the proxy calls out now in, before metrics are read.
    pub fn mirror_proxy(&self, in_flight: usize) {
        self.proxy.in_flight(in_flight);
    }

    /// Copies the hooks' counts in, before metrics are read.
    pub fn mirror_hooks(
        &self,
        snapshot: &crate::hooks::Snapshot,
        stage: Option<&crate::hooks::cluster::StageCounts>,
    ) {
        self.hooks.mirror(snapshot, stage);
    }

    /// Copies the node's compression counts in, before metrics are read.
    pub fn mirror_deflate(&self, counts: &crate::deflate::DeflateCounts) {
        self.compression.mirror(counts);
    }

    /// Copies the graph's gauges and counts in, before metrics are read.
    pub fn mirror_feeds(&self, stats: &crate::feeds::FeedStats) {
        self.feeds.users_known.set(gauge(stats.users_known));
        self.feeds.users_present.set(gauge(stats.users_present));
        catch_up(&self.feeds.listen_failures, stats.listen_failures);
        catch_up(&self.feeds.resyncs, stats.resyncs);
    }

    /// The gauge of open admin connections: each connection holds a
    /// handle, raising it on accept and lowering it when dropped.
    pub fn admin_connections(&self) -> Gauge {
        self.admin.connections.clone()
    }

    pub fn admin_unauthenticated_closed(&self) {
        self.admin.unauthenticated_closes.inc();
    }

    pub fn admin_idle_closed(&self) {
        self.admin.idle_closes.inc();
    }

    pub fn error(&self, kind: ErrorKind) {
        self.errors
            .get_or_create(&KindLabel { kind: kind.label() })
            .inc();
    }

    /// Mirrors what the engine counts (publishes, history) into these
    /// metrics; called before they are read. The engine keeps the counts
    /// because only it sees every publish's outcome (a publish that nobody
    /// asked to hear about is never answered).
    pub fn mirror_engine(&self, stats: &crate::engine::EngineStats) {
        catch_up(&self.publishes, stats.publishes);
        catch_up(&self.publishes_unrouted, stats.publishes_unrouted);
        catch_up(&self.engine_round_trips, stats.round_trips);
        catch_up(&self.engine_failovers, stats.failovers);
        catch_up(&self.engine_unavailable_ms, stats.unavailable_ms);
        self.engine_waiting_attaches
            .set(gauge(stats.waiting_attaches));
        let history = &stats.history;
        self.history.subjects.set(gauge(history.subjects));
        self.history.positions.set(gauge(history.positions));
        self.history.messages.set(gauge(history.messages));
        self.history.bytes.set(gauge(history.bytes));
        catch_up(&self.history.evictions, history.evictions);
        catch_up(&self.history.evicted_positions, history.evicted_positions);
        self.history.routed.set(gauge(stats.subjects));
        self.history.routed_bytes.set(gauge(stats.subject_bytes));
        let presence = &stats.presence;
        self.presence.members.set(gauge(presence.members));
        catch_up(&self.presence.joined, presence.joined);
        catch_up(&self.presence.left, presence.left);
        catch_up(&self.presence.refused, presence.refused);
        catch_up(&self.presence.expired, presence.expired);
        for (kind, total) in stats.failures.by_kind() {
            catch_up(
                &self.engine_failures.get_or_create(&KindLabel { kind }),
                total,
            );
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// A summed snapshot for `/stats`.
    pub fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot::default();
        for w in &self.workers {
            s.connections += w.connections.get().max(0) as u64;
            s.accepted += w.accepted.get();
            s.subscriptions += w.subscriptions.get().max(0) as u64;
            s.messages_in += w.messages_in.get();
            s.messages_out += w.messages_out.get();
            s.bytes_in += w.bytes_in.get();
            s.bytes_out += w.bytes_out.get();
            s.socket_writes += w.writes.get();
            s.tls_handshakes += w.tls_handshakes.get();
            s.partial_input_bytes += w.partial_input_bytes.get().max(0) as u64;
            s.outbound_bytes += w.outbound_bytes.get().max(0) as u64;
            for (total, t) in s.transports.iter_mut().zip(&w.transports) {
                total.connections += t.connections.get().max(0) as u64;
                total.messages_out += t.messages_out.get();
            }
        }
        s.admin_connections = self.admin.connections.get().max(0) as u64;
        s.admin_idle_closes = self.admin.idle_closes.get();
        s.admin_unauthenticated_closes = self.admin.unauthenticated_closes.get();
        s.publishes = self.publishes.get();
        s.publishes_unrouted = self.publishes_unrouted.get();
        s.tls_reloads = self.tls_reloads.get();
        s.token_key_reloads = self.token_key_reloads.get();
        s.closes = CloseReason::ALL
            .iter()
            .map(|r| {
                let n = self
                    .closes
                    .get_or_create(&ReasonLabel { reason: r.name() })
                    .get();
                (r.name(), n)
            })
            .collect();
        s.errors = ErrorKind::labels()
            .into_iter()
            .filter_map(|kind| {
                let n = self.errors.get(&KindLabel { kind })?.get();
                Some((kind, n))
            })
            .collect();
        s
    }
}

/// Node-wide totals.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    pub connections: u64,
    pub accepted: u64,
    pub subscriptions: u64,
    pub messages_in: u64,
    pub messages_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub socket_writes: u64,
    pub tls_handshakes: u64,
    pub partial_input_bytes: u64,
    pub outbound_bytes: u64,
    pub tls_reloads: u64,
    pub token_key_reloads: u64,
    pub publishes: u64,
    pub publishes_unrouted: u64,
    pub admin_connections: u64,
    pub admin_idle_closes: u64,
    pub admin_unauthenticated_closes: u64,
    pub closes: Vec<(&'static str, u64)>,
    pub errors: Vec<(&'static str, u64)>,
    /// Indexed by `TransportKind::index`.
    pub transports: [TransportTotals; TransportKind::COUNT],
}

impl Snapshot {
    /// Connections closed for `reason` so far.
    pub fn closed(&self, reason: CloseReason) -> u64 {
        self.closes
            .iter()
            .find(|(name, _)| *name == reason.name())
            .map_or(0, |(_, n)| *n)
    }
}

/// One transport's node-wide totals.
#[derive(Debug, Default, Clone, Copy)]
pub struct TransportTotals {
    pub connections: u64,
    pub messages_out: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names_every_family_and_sums_workers() {
        let m = Metrics::new(2);
        m.worker(0).messages_out.inc_by(3);
        m.worker(1).messages_out.inc_by(4);
        m.closed(CloseReason::SlowConsumer);
        m.error(ErrorKind::Handshake(404));
        let text = m.render();
        for name in [
            "myriad_connections",
            "myriad_messages_out_total",
            "myriad_connections_closed_total{reason=\"slow_consumer\"} 1",
            "myriad_errors_total{kind=\"handshake_404_not_found\"} 1",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
        let s = m.snapshot();
        assert_eq!(s.messages_out, 7);
        assert!(s.closes.contains(&("slow_consumer", 1)));
        assert_eq!(s.closed(CloseReason::SlowConsumer), 1);
        assert_eq!(s.closed(CloseReason::Normal), 0);
        assert!(s.errors.contains(&("handshake_404_not_found", 1)));
    }
}
