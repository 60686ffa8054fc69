//! Layer 2, the coordinator↔worker schema: every value the coordinator and
//! its worker processes say to each other, as JSON lines.
//!
//! The coordinator re-executes its own binary as `bench __worker`, writes a
//! [`Spec`] as one JSON line on the child's stdin, and later [`Control`]
//! lines (start, stop). The worker answers on stdout with JSON lines
//! ([`Msg`]): a snapshot every second, `ready` once its connections are set
//! up, and `done` with its final counters and full histograms (HDR V2,
//! base64, so the coordinator merges them exactly). A [`Task`] is one
//! workload's job, one variant and one struct per worker-side workload.
//!
//! Owns the shape of these messages and nothing else: plain values over the
//! helpers in `util`, no I/O, and no import of the worker, the coordinator
//! or the report, which both sides depend on instead.

use std::collections::BTreeMap;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use crate::util::addr::{PortMode, Sources, Target};
use crate::util::clock::Extent;
use crate::util::continuity::Reached;
use crate::util::counters::Counters;
use crate::util::graph::Senders;
use crate::util::histogram::{self, HistogramError, Micros};
use crate::util::judge::{FeedReceipt, SendRecord};
use crate::util::pacing::{Schedule, Share};
use crate::util::pattern::{Assignment, Pattern, PublishOrder};
use crate::util::profile::Profile;

/// Everything a worker needs, sent as its first stdin line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Spec {
    /// This worker's number within its group.
    pub worker: u64,
    /// Workers in its group (they share port slices and schedules).
    pub workers: u64,
    /// Server endpoints.
    pub targets: Vec<Target>,
    /// PEM certificates to trust for `wss://` targets.
    #[serde(default)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Source addresses.
    pub sources: Sources,
    /// Source port mode.
    pub port_mode: PortMode,
    /// Connections this worker may hold at once.
    pub max_conns: u64,
    /// Bound on connect + handshake + subscribe ack, seconds.
    pub setup_timeout: f64,
    /// The server's dialect.
    pub profile: Profile,
    /// Seed for masks and random choices.
    pub seed: u64,
    /// The job.
    pub task: Task,
}

#[cfg(test)]
impl Spec {
    /// A lone worker's spec for `task`: no targets, myriad's profile, seed
    /// 1, for drivers' unit tests.
    pub(crate) fn for_tests(task: Task) -> Spec {
        Spec {
            worker: 0,
            workers: 1,
            targets: Vec::new(),
            tls_ca: None,
            sources: Sources::default(),
            port_mode: PortMode::Auto,
            max_conns: 10,
            setup_timeout: 1.0,
            profile: Profile::load("myriad").expect("the built-in profile"),
            seed: 1,
            task,
        }
    }
}

/// A worker's job.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Task {
    /// Arrivals of short-lived connections.
    ConnectRate(ConnectRateTask),
    /// Long-lived subscribed connections.
    Subscribe(SubscribeTask),
    /// Subscribed connections that reconnect and resubscribe with `since`.
    Churn(ChurnTask),
    /// Paced publishing.
    Publish(PublishTask),
    /// Users of a follow graph that send as themselves and receive the
    /// feeds they follow.
    Social(SocialTask),
}

/// Coordinator → worker, after the spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "cmd")]
pub enum Control {
    /// Every worker is ready: begin the measured part.
    Start,
    /// Wind down and report.
    Stop,
}

/// Worker → coordinator.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "msg")]
pub enum Msg {
    /// Progress, every second.
    Snapshot(Box<Snapshot>),
    /// Set-up finished (connections open and subscribed).
    Ready,
    /// Final figures; the worker exits after this.
    Done(Box<Done>),
    /// The worker could not run.
    Failed {
        /// Why.
        error: String,
    },
}

/// A worker's state at one moment.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    /// Cumulative counters.
    pub counters: Counters,
    /// Connections held.
    pub open: u64,
    /// Connections in setup.
    pub in_setup: u64,
    /// Message latency of this interval only.
    pub latency: String,
    /// The worker's RSS, bytes.
    pub rss_bytes: u64,
    /// The worker's CPU time so far, seconds.
    pub cpu_secs: f64,
}

/// One connect-rate worker's job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConnectRateTask {
    /// The global arrival schedule.
    pub schedule: Schedule,
    /// This worker's share of arrivals.
    pub share: Share,
    /// Mean hold, seconds.
    pub hold: f64,
    /// Relative hold jitter (0.05 = ± 5 %).
    pub jitter: f64,
    /// Subscribe each device to subject `index mod M` of this pattern.
    pub subscribe: Option<Pattern>,
    /// How devices close.
    pub close: CloseMode,
}

/// One subscriber worker's job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubscribeTask {
    /// First global connection index of this worker.
    pub first: u64,
    /// Connections this worker holds.
    pub count: u64,
    /// What each connection subscribes to; None: connections only listen.
    pub assignment: Option<Assignment>,
    /// Handshakes in flight at most.
    pub in_flight: u32,
    /// New connections per second at most (0: no limit).
    pub connect_rate: f64,
    /// Broadcast: track messages 0..K individually.
    pub broadcast_messages: Option<u64>,
    /// How connections receive.
    pub transport: SubscribeTransport,
}

/// One publisher worker's job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PublishTask {
    /// The global schedule of publish events.
    pub schedule: Schedule,
    /// Which of its events this worker fires.
    pub share: Share,
    /// Stop after this many events overall.
    pub max_events: Option<u64>,
    /// Data size, bytes.
    pub size: usize,
    /// Subjects to publish to.
    pub subjects: Pattern,
    /// How subjects are drawn.
    pub order: PublishOrder,
    /// Seed of the subject draws (shared by all publishers; they fire
    /// different events, so they draw different subjects).
    pub seed: u64,
    /// WebSocket frames or HTTP requests.
    pub transport: PublishTransport,
    /// Connections to publish over.
    pub conns: u32,
    /// Index of the first connection (routes and keys follow from it).
    pub first_index: u64,
    /// HTTP only: `X-Api-Key: …` style header line to add, if any.
    pub api_key_header: Option<String>,
    /// After the last event fired, how long to wait for queues to drain
    /// (and HTTP answers to arrive) before reporting anyway, seconds.
    pub drain_secs: f64,
}

/// One churning subscriber worker's job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChurnTask {
    /// Its subscribers, set up as the `subscribers` workload sets them up.
    pub subscribe: SubscribeTask,
    /// When its reconnects are due after the start: reconnect n is that of
    /// its subscriber n mod count.
    pub reconnects: Schedule,
    /// Seconds a subscriber stays away between its close and its reconnect.
    pub offline: f64,
    /// How the old connection ends.
    pub close: CloseMode,
}

/// One social worker's job: some of the connected users, every connection
/// of each, and the sends of those users.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SocialTask {
    /// Slot of its first user among the connected users; user slot s holds
    /// connections `s × conns_per_user ..` of the run.
    pub first_user: u64,
    /// Its users, in slot order.
    pub users: Vec<SocialUser>,
    /// Connections each user holds.
    pub conns_per_user: u32,
    /// Handshakes in flight at most.
    pub in_flight: u32,
    /// New connections per second at most (0: no limit).
    pub connect_rate: f64,
    /// When every send of the run is due; a worker fires those whose
    /// sender it holds.
    pub sends: Schedule,
    /// Who sends each send (a user slot).
    pub senders: Senders,
    /// Size of each send's data, bytes.
    pub size: usize,
}

/// A connected user, as its worker needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocialUser {
    /// Its id: connections ask for `?user=ID`.
    pub id: u64,
    /// Whom it follows in the graph file, ascending: with its own, the
    /// feeds each connection must be subscribed to before the run starts.
    pub follows: Vec<u64>,
}

/// What a social worker's users sent and its connections received.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SocialDone {
    /// Every send answered with a position.
    pub sends: Vec<SendRecord>,
    /// Sends fired but never answered.
    pub unanswered: u64,
    /// Every connection it held (set up or not), with what it received.
    pub receipts: Vec<ConnReceipts>,
}

/// What one connection received, feed by feed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ConnReceipts {
    /// The connection's global index (its user is slot index ÷ connections per user).
    pub index: u64,
    /// Its feeds, one entry per (feed, epoch).
    pub feeds: Vec<FeedReceipt>,
}

/// How a connection ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CloseMode {
    /// Send a close frame and wait (bounded) for the server to close TCP,
    /// so TIME_WAIT lands on the server's side as RFC 6455 intends.
    Graceful,
    /// Abort with RST (SO_LINGER 0): no close handshake, no TIME_WAIT.
    Reset,
}

/// How publishes reach the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PublishTransport {
    /// Publish frames over WebSocket connections.
    Ws,
    /// POST requests to the HTTP API, pipelined on keep-alive connections.
    Http,
}

/// How subscribers receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SubscribeTransport {
    /// WebSocket: subscribe commands, deliveries in text frames.
    Ws,
    /// Server-Sent Events (GET /sse): an endless text/event-stream,
    /// resumed with Last-Event-ID.
    Sse,
    /// HTTP streaming (GET /stream): an endless chunked response of
    /// newline-delimited JSON, resumed with `since`.
    Stream,
    /// Long-poll (GET /poll): one answer per request, polled again at once
    /// with its cursor on the same kept-alive connection.
    Poll,
}

/// Per broadcast message: how many subscribers got it, and the latest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BroadcastTally {
    /// Deliveries of message n.
    pub count: Vec<u32>,
    /// Slowest delivery of message n, µs.
    pub max_us: Vec<u64>,
}

/// The events a publisher worker published: `fired` events of its share of
/// the schedule, less the `dropped` ones; exact unless a connection was lost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    /// Events of its share fired (share positions 0..fired).
    pub fired: u64,
    /// Event numbers that could not be sent.
    pub dropped: Vec<u64>,
    /// Its schedule share.
    pub share: Share,
    /// Publishing connections lost mid-run (queued publishes may be gone).
    pub conns_lost: u64,
}

/// A worker's final report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Done {
    /// Final counters.
    pub counters: Counters,
    /// Histograms, V2 + base64, keyed by name: latency, connect, handshake,
    /// lag, ack, replay, resubscribe (only those the workload keeps).
    pub histograms: Vec<(String, String)>,
    /// Connect-rate: upgrades per phase.
    pub phase_upgrades: Vec<u64>,
    /// Broadcast tallies.
    pub broadcast: Option<BroadcastTally>,
    /// Publisher events.
    pub published: Option<Published>,
    /// When the first and last delivery arrived (subscribers).
    pub received: Option<Extent>,
    /// When the first and last publish left (publishers).
    pub sent: Option<Extent>,
    /// Where each subscription joined and stopped (churn).
    pub reached: Option<Vec<Reached>>,
    /// Sends and receipts (social).
    pub social: Option<SocialDone>,
    /// RSS before any connection, bytes.
    pub rss_start: u64,
    /// RSS when set-up finished, bytes.
    pub rss_ready: u64,
    /// Connections held when set-up finished.
    pub conns_ready: u64,
    /// CPU seconds when set-up finished.
    pub cpu_ready: f64,
    /// CPU seconds at the end.
    pub cpu_end: f64,
    /// Of which in user space (the bench's own code).
    pub cpu_user_end: f64,
    /// Peak RSS seen at snapshots, bytes.
    pub rss_peak: u64,
}

/// Set-up attempts per connection before a worker gives it up; the
/// coordinator bounds its wait for the subscribers' set-up by them.
pub const SETUP_ATTEMPTS: u8 = 3;

/// Every histogram the workers shipped in their final reports, merged by
/// name (latency, connect, handshake, lag, ack, replay, resubscribe).
pub fn merge_histograms<'a>(
    done: impl IntoIterator<Item = &'a Done>,
) -> Result<BTreeMap<String, Micros>, HistogramError> {
    let mut hists: BTreeMap<String, Micros> = BTreeMap::new();
    for d in done {
        for (name, text) in &d.histograms {
            let h = hists.entry(name.clone()).or_insert_with(histogram::new);
            histogram::merge_encoded(h, text)?;
        }
    }
    Ok(hists)
}
