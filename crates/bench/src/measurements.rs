//! Layer 2, a finished run as plain data: what the coordinator hands to the
//! report. The coordinator fills a [`Measurements`] from its monitor and each
//! workload's own figures; the report layer turns it into the terminal
//! summary, `--json` and `--html` without knowing the coordinator.
//!
//! Owns these values only: no I/O and no import of the worker, the
//! coordinator or the report. The timeline types ([`Sample`] and its
//! points) live here because the coordinator's monitor and progress line
//! build them and the report charts them.
//!
//! Named [`Measurements`], not an outcome (how one connection ended is the
//! worker's `Ending`). Which workers a figure belongs to is a [`Group`], not
//! a role: the protocol crate's `ws::Role` is the side of a WebSocket.

use serde::Serialize;
use serde_json::Value;

use crate::schema::Done;
use crate::util::histogram::{Micros, Summary};
use crate::util::judge::Tally;
use crate::util::sys::ListenCounters;

/// The group a worker process belongs to, by what it does: figures are
/// summed per group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// connect-rate devices.
    Devices,
    /// Subscribed connections.
    Subscribers,
    /// Publishers.
    Publishers,
}

/// Everything a run measured, before the report computes its figures.
#[derive(Debug, Clone)]
pub struct Measurements {
    /// The workload's subcommand name.
    pub workload: String,
    /// The full command line configuration.
    pub config: Value,
    /// The protocol profile's name.
    pub profile: String,
    /// Unix time the run started, seconds.
    pub started_unix: f64,
    /// Length of the run, seconds.
    pub duration_secs: f64,
    /// The span rates are taken over when no span of deliveries is known.
    pub measured_secs: f64,
    /// Time the subscribers took to connect and subscribe, seconds.
    pub setup_secs: Option<f64>,
    /// Worker processes spawned (whether or not they reported).
    pub processes: u64,
    /// Open-file cap per process.
    pub fd_cap: u64,
    /// Connections planned per process at most.
    pub conns_per_process: u64,
    /// The final report of every worker that sent one, with its group.
    pub finished: Vec<(Group, Done)>,
    /// Deliveries the subscriber workers counted (from their last snapshot
    /// when a worker sent no final report).
    pub subscriber_messages_in: u64,
    /// The server's /stats of each node, with --admin-url.
    pub server_stats: Option<ServerStats>,
    /// One sample per second.
    pub timeline: Vec<Sample>,
    /// connect-rate phases.
    pub phases: Vec<PhaseReport>,
    /// Listen-queue overflow and drop deltas (local server only).
    pub listen_queue: Option<ListenCounters>,
    /// Delivery accounting (workloads that publish).
    pub deliveries: Option<Deliveries>,
    /// broadcast tallies.
    pub broadcast: Option<Broadcast>,
    /// churn figures.
    pub churn: Option<ChurnReport>,
    /// social figures.
    pub social: Option<SocialReport>,
}

/// /stats of every node before the load and at the end.
#[derive(Debug, Clone)]
pub struct ServerStats {
    /// One answer per node before the load, if all answered.
    pub before: Option<Vec<Value>>,
    /// One answer per node at the end, if all answered.
    pub after: Option<Vec<Value>>,
}

/// Broadcast (seed 002) tallies, merged over every subscriber process.
#[derive(Debug, Clone, PartialEq)]
pub struct Broadcast {
    /// Messages published (K).
    pub messages: u64,
    /// Subscribers (N).
    pub subscribers: u64,
    /// Messages every subscriber received.
    pub complete: u64,
    /// Per message: time from publish until the LAST subscriber had it.
    pub until_last: Summary,
}

/// Latency percentiles of one timeline interval, µs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencyPoint {
    /// Median.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// Maximum.
    pub max_us: u64,
}

impl LatencyPoint {
    /// The point of histogram `h` (not empty).
    pub fn of(h: &Micros) -> LatencyPoint {
        LatencyPoint {
            p50_us: h.value_at_quantile(0.5),
            p90_us: h.value_at_quantile(0.9),
            p99_us: h.value_at_quantile(0.99),
            max_us: h.max(),
        }
    }
}

/// The server's figures at one timeline point.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ServerPoint {
    /// Connections it reports.
    pub connections: u64,
    /// Its RSS, bytes.
    pub rss_bytes: u64,
    /// CPU seconds per second (1.0 = one core busy).
    pub cpu_per_s: f64,
    /// Messages it wrote per second.
    pub messages_out_per_s: f64,
    /// write/writev calls per second that carried them.
    pub socket_writes_per_s: f64,
    /// RSS per open connection.
    pub rss_per_connection: Option<f64>,
}

/// One second of the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds since the run began.
    pub t: f64,
    /// Connections held by the bench.
    pub open: u64,
    /// Connections in setup.
    pub in_setup: u64,
    /// WebSocket upgrades completed per second.
    pub upgraded_per_s: f64,
    /// Failures per second.
    pub failures_per_s: f64,
    /// Failures so far.
    pub failures: u64,
    /// Deliveries received per second.
    pub messages_in_per_s: f64,
    /// Publishes sent per second.
    pub published_per_s: f64,
    /// Churn: reconnects made per second.
    pub reconnects_per_s: f64,
    /// Delivery latency of the interval.
    pub latency: Option<LatencyPoint>,
    /// The bench's RSS (all workers), bytes.
    pub bench_rss_bytes: u64,
    /// The bench's CPU seconds per second.
    pub bench_cpu_per_s: f64,
    /// The server's figures, with --admin-url.
    pub server: Option<ServerPoint>,
}

/// A connect-rate schedule phase, planned and achieved.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseReport {
    /// ramp-up, sustain or ramp-down.
    pub name: String,
    /// Length, seconds.
    pub secs: f64,
    /// Mean arrival rate the schedule asked for.
    pub planned_per_s: f64,
    /// Upgrades completed in the phase.
    pub upgrades: u64,
    /// Upgrades per second achieved.
    pub achieved_per_s: f64,
}

/// Did every published message reach every subscriber?
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Deliveries {
    /// Messages published.
    pub published: u64,
    /// Deliveries expected: Σ over publishes of the subject's subscribers.
    pub expected: Option<u64>,
    /// Deliveries received with a timestamp.
    pub received: u64,
    /// Whether `expected` is exact (no publisher connection was lost).
    pub exact: bool,
}

/// How many of something per event (publications per replay), from a
/// histogram of counts.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Sizes {
    /// Events recorded.
    pub count: u64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Largest.
    pub max: u64,
}

impl Sizes {
    /// The figures of `h`; all zero when it is empty.
    pub fn of(h: &Micros) -> Sizes {
        if h.is_empty() {
            return Sizes::default();
        }
        Sizes {
            count: h.len(),
            mean: h.mean(),
            p50: h.value_at_quantile(0.5),
            p99: h.value_at_quantile(0.99),
            max: h.max(),
        }
    }
}

/// Churn figures: reconnects, recoveries, and whether every subscriber got
/// every message of its subjects once, in order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChurnReport {
    /// Reconnects per second asked for, all subscribers together.
    pub reconnect_rate: f64,
    /// Subscriptions (subscriber × subject) followed to the end.
    pub subscriptions: u64,
    /// Reconnects made.
    pub reconnects: u64,
    /// Reconnects due while their subscriber was still away or waiting for
    /// answers, not made.
    pub reconnects_skipped: u64,
    /// Reconnects whose new connection had every subject answered.
    pub reconnected: u64,
    /// Subscriber connections lost without the bench closing them (their
    /// node died), each subscriber failing over to the next node.
    pub failovers: u64,
    /// Of those, subscribers back with every subject answered.
    pub failed_over: u64,
    /// Resubscribes with `since` answered `recovered: true` (the
    /// failovers' included).
    pub recovered: u64,
    /// Resubscribes with `since` answered `recovered: false`.
    pub unrecovered: u64,
    /// recovered / (recovered + unrecovered), percent.
    pub recovered_percent: Option<f64>,
    /// Deliveries that were replays of recoveries.
    pub replayed: u64,
    /// Publications replayed per recovered resubscribe.
    pub replay: Sizes,
    /// Deliveries of an offset already received.
    pub duplicates: u64,
    /// Deliveries past the next offset.
    pub gaps: u64,
    /// Publications some subscriber never received: skipped by gaps and
    /// failed recoveries, plus `short_at_end`.
    pub lost: u64,
    /// Of `lost`, those a subscription had not reached when the run ended:
    /// its subject's last offset (where it joined plus what the publishers
    /// published to it) less the last offset it received.
    pub short_at_end: u64,
    /// Positions a subscriber could not continue from (another epoch, a
    /// delivery of a subject it held no position in), where what it missed
    /// cannot be counted.
    pub broken: u64,
}

impl ChurnReport {
    /// What went wrong, one phrase each; empty when every subscriber got
    /// every message of its subjects exactly once, in order.
    pub fn problems(&self) -> Vec<String> {
        let unanswered = self.reconnects.saturating_sub(self.reconnected);
        let stranded = self.failovers.saturating_sub(self.failed_over);
        [
            (self.lost, "messages lost"),
            (self.duplicates, "duplicates"),
            (self.gaps, "gaps"),
            (self.unrecovered, "resubscribes not recovered"),
            (self.broken, "positions that could not be followed"),
            (unanswered, "reconnects never answered"),
            (stranded, "failovers that found no node"),
        ]
        .into_iter()
        .filter(|&(n, _)| n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect()
    }
}

/// Social figures: the graph, the sends, the follow churn, and the verdict
/// on every (send, connection) pair.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SocialReport {
    /// Users in the graph file.
    pub graph_users: u64,
    /// Edges in the graph file.
    pub graph_edges: u64,
    /// Connected users.
    pub users: u64,
    /// Connections each holds.
    pub connections_per_user: u64,
    /// Edges among the connected users at the start.
    pub edges_among_users: u64,
    /// How senders were drawn (uniform, degree).
    pub sender: String,
    /// Sends per second asked for.
    pub rate: f64,
    /// Sends fired.
    pub sends: u64,
    /// Sends answered `ok`.
    pub acked: u64,
    /// Sends answered with an error.
    pub refused: u64,
    /// Sends fired and never answered.
    pub unanswered: u64,
    /// Sends due from a connection that was gone, not made.
    pub not_made: u64,
    /// Connections the node said the answered sends reached, summed.
    pub reached: u64,
    /// The verdict on every (send, connection) pair.
    #[serde(flatten)]
    pub tally: Tally,
    /// Follow and unfollow operations per second asked for.
    pub follow_rate: f64,
    /// Follows made.
    pub follows: u64,
    /// Unfollows made.
    pub unfollows: u64,
    /// Admin requests that carried them.
    pub follow_requests: u64,
    /// Of those, not answered 2xx: their edges are in flight from then on.
    pub follow_requests_failed: u64,
    /// Time from a follow or unfollow request to its answer.
    pub follow_latency: Summary,
    /// `subscribed` notices the connections had for follows made.
    pub follow_notices: u64,
    /// Notices owed: one per connection of the follower per follow made.
    pub follow_notices_expected: u64,
    /// Feeds a connection was subscribed to at connect that its user does
    /// not follow in the file (or twice): the node holds another graph.
    pub feeds_mismatched: u64,
    /// Connections that never had all their feeds at connect.
    pub not_set_up: u64,
    /// The node's CPU seconds from the first send until the drain ended
    /// (the follows and unfollows made meanwhile included).
    pub server_cpu_secs: Option<f64>,
    /// Of that, per answered send, µs.
    pub server_cpu_us_per_send: Option<f64>,
    /// Of that, per delivery received, µs.
    pub server_cpu_us_per_delivery: Option<f64>,
}

impl SocialReport {
    /// What went wrong, one phrase each; empty when every connection got
    /// every send it was owed exactly once and nothing else, and every
    /// request was answered.
    pub fn problems(&self) -> Vec<String> {
        let notices = self.follow_notices.abs_diff(self.follow_notices_expected);
        let mut out = self.tally.problems();
        out.extend(
            [
                (self.refused, "sends refused"),
                (self.unanswered, "sends never answered"),
                (self.not_made, "sends not made (their connection was gone)"),
                (self.follow_requests_failed, "follow requests failed"),
                (notices, "follow notices missing or extra"),
                (
                    self.feeds_mismatched,
                    "feeds at connect not in the graph file",
                ),
                (self.not_set_up, "connections never set up"),
            ]
            .into_iter()
            .filter(|&(n, _)| n > 0)
            .map(|(n, what)| format!("{n} {what}")),
        );
        out
    }
}
