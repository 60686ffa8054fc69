//! Worker processes: what the coordinator and its workers say to each
//! other, and the worker's main loop.
//!
//! The coordinator re-executes its own binary as `bench __worker`, writes a
//! [`Spec`] as one JSON line on the child's stdin, and later [`Control`]
//! lines (start, stop). The worker answers on stdout with JSON lines
//! ([`Msg`]): a snapshot every second, `ready` once its connections are set
//! up, and `done` with its final counters and full histograms (HDR V2,
//! base64, so the coordinator merges them exactly). stdin closing means the
//! coordinator is gone, and the worker stops.

use std::io::{self, BufRead, Write};
use std::sync::mpsc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::addr::{PortMode, Sources, Target};
use crate::clock::Span;
use crate::conn::Handler;
use crate::continuity::Reached;
use crate::counters::Counters;
use crate::engine::{Engine, NetConfig};
use crate::error::BenchError;
use crate::histogram::{self, Micros};
use crate::profile::Profile;
use crate::sys;
use crate::workloads::churn::{ChurnDriver, ChurnTask};
use crate::workloads::connect_rate::{ConnectRateDriver, ConnectRateTask};
use crate::workloads::publishers::{PublishDriver, PublishTask};
use crate::workloads::subscribers::{SubscribeDriver, SubscribeTask};

/// How often a worker reports; the charts' time resolution.
pub const SNAPSHOT_NS: u64 = 1_000_000_000;

/// Most events (arrivals, publishes, closes) a driver handles per tick:
/// a driver that has fallen behind catches up in batches, between which
/// the engine still reads its sockets and the worker still reports.
pub const MAX_BATCH: u64 = 256;

/// Waits shorter than this are slept precisely instead of in epoll.
const PRECISE_BELOW: Duration = Duration::from_millis(1);

/// Longest a worker's loop sleeps, so control messages and snapshots are
/// never late by more than this.
const MAX_WAIT: Duration = Duration::from_millis(50);

/// Everything a worker needs, sent as its first stdin line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Spec {
    /// This worker's number within its group.
    pub worker: u64,
    /// Workers in its group (they share port slices and schedules).
    pub workers: u64,
    /// Server endpoints.
    pub targets: Vec<Target>,
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

/// What a workload adds to a worker's final report.
#[derive(Debug, Default)]
pub struct RoleResult {
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
    pub received: Option<Span>,
    /// Publishers: when the first and last publish left.
    pub sent: Option<Span>,
    /// Churn: publications replayed per recovered resubscribe.
    pub replay: Option<Micros>,
    /// Churn: from a reconnect's connect() to its subject's `subscribed`
    /// (over long-poll, to the reconnect's first answer).
    pub resubscribe: Option<Micros>,
    /// Churn: where each subscription joined and stopped.
    pub reached: Option<Vec<Reached>>,
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
    pub share: crate::pacing::Share,
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
    pub received: Option<Span>,
    /// When the first and last publish left (publishers).
    pub sent: Option<Span>,
    /// Where each subscription joined and stopped (churn).
    pub reached: Option<Vec<Reached>>,
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

/// A workload's worker-side logic, driven by [`run_worker`].
pub trait Driver: Handler {
    /// Does whatever is due (open connections, publish). Returns the
    /// monotonic ns at which it next has something due, if anything.
    fn tick(&mut self, engine: &mut Engine) -> Option<u64>;
    /// The coordinator says every worker is ready.
    fn start(&mut self, engine: &mut Engine);
    /// The coordinator says stop.
    fn stop(&mut self, engine: &mut Engine);
    /// Set-up is complete.
    fn is_ready(&self, engine: &Engine) -> bool;
    /// Nothing left to do: the worker reports and exits.
    fn is_done(&self, engine: &Engine) -> bool;
    /// Message latency recorded since the last call.
    fn take_interval(&mut self) -> Option<Micros>;
    /// Whether its due times must be met to well under a millisecond
    /// (publishers, whose lateness becomes measured latency). Others are
    /// served by epoll's millisecond timeouts, which cost no extra wake-ups.
    fn precise(&self) -> bool {
        false
    }
    /// The workload's part of the final report.
    fn finish(self) -> RoleResult;
}

/// Writes one message as a JSON line on stdout.
pub fn emit(msg: &Msg) -> io::Result<()> {
    let mut out = io::stdout().lock();
    serde_json::to_writer(&mut out, msg)?;
    out.write_all(b"\n")?;
    out.flush()
}

/// The `bench __worker` entry point.
pub fn worker_main() -> std::process::ExitCode {
    // Ctrl-C reaches the whole process group; the coordinator handles it
    // and stops its workers in order, so a worker must not die of it.
    // SAFETY: setting a signal's disposition to SIG_IGN has no preconditions.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
    }
    let mut line = String::new();
    // The stdin lock must be released before run_spec: its control thread
    // reads the following lines.
    let read = io::stdin().lock().read_line(&mut line);
    let result = read
        .map_err(BenchError::from)
        .and_then(|_| serde_json::from_str::<Spec>(&line).map_err(BenchError::from))
        .and_then(run_spec);
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let _ = emit(&Msg::Failed {
                error: e.to_string(),
            });
            std::process::ExitCode::FAILURE
        }
    }
}

fn run_spec(spec: Spec) -> Result<(), BenchError> {
    crate::plan::fd_cap();
    let net = NetConfig {
        targets: spec.targets.clone(),
        sources: spec.sources.clone(),
        port_mode: spec.port_mode,
        worker: spec.worker,
        workers: spec.workers,
        max_conns: spec.max_conns as usize,
        setup_timeout_ns: (spec.setup_timeout * 1e9) as u64,
        nodelay: matches!(spec.task, Task::Publish(_)),
    };
    let mut engine = Engine::new(
        net,
        spec.profile.subscribe_ack.as_deref(),
        spec.profile.error_marker.as_deref(),
        spec.seed,
    )?;
    // An HTTP transport's request names its connection's subjects.
    engine.cx.subjects = match &spec.task {
        Task::Subscribe(t) | Task::Churn(ChurnTask { subscribe: t, .. }) => t.assignment.clone(),
        Task::ConnectRate(_) | Task::Publish(_) => None,
    };
    let (tx, rx) = mpsc::channel();
    let waker = engine.waker();
    std::thread::spawn(move || {
        for line in io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if let Ok(c) = serde_json::from_str::<Control>(&line) {
                if tx.send(c).is_err() {
                    return;
                }
                let _ = waker.wake();
            }
        }
        // stdin closed: the coordinator is gone.
        let _ = tx.send(Control::Stop);
        let _ = waker.wake();
    });
    match &spec.task {
        Task::ConnectRate(t) => run_worker(engine, ConnectRateDriver::new(t.clone(), &spec), &rx),
        Task::Subscribe(t) => run_worker(engine, SubscribeDriver::new(t.clone(), &spec)?, &rx),
        Task::Churn(t) => run_worker(engine, ChurnDriver::new(t.clone(), &spec)?, &rx),
        Task::Publish(t) => run_worker(engine, PublishDriver::new(t.clone(), &spec)?, &rx),
    }
}

/// The worker loop: turn the engine, tick the driver, report.
fn run_worker<D: Driver>(
    mut engine: Engine,
    mut driver: D,
    rx: &mpsc::Receiver<Control>,
) -> Result<(), BenchError> {
    let rss_start = sys::rss_bytes();
    let (mut rss_ready, mut cpu_ready, mut conns_ready) = (rss_start, 0.0, 0);
    let mut rss_peak = rss_start;
    let mut ready_sent = false;
    let mut next_snapshot = SNAPSHOT_NS;
    loop {
        let now = engine.refresh_now();
        let due = driver.tick(&mut engine);
        let becomes_ready = !ready_sent && driver.is_ready(&engine);
        // A snapshot goes out with Ready, so the coordinator sees the
        // set-up counts at once.
        if now >= next_snapshot || becomes_ready {
            next_snapshot = now + SNAPSHOT_NS;
            let rss = sys::rss_bytes();
            rss_peak = rss_peak.max(rss);
            emit(&Msg::Snapshot(Box::new(Snapshot {
                counters: engine.cx.counters.clone(),
                open: engine.open_conns() as u64,
                in_setup: engine.in_setup() as u64,
                latency: driver
                    .take_interval()
                    .map(|h| histogram::encode(&h))
                    .unwrap_or_default(),
                rss_bytes: rss,
                cpu_secs: sys::cpu_secs(),
            })))?;
        }
        if becomes_ready {
            ready_sent = true;
            rss_ready = sys::rss_bytes();
            cpu_ready = sys::cpu_secs();
            conns_ready = engine.open_conns() as u64;
            emit(&Msg::Ready)?;
        }
        if driver.is_done(&engine) {
            break;
        }
        let wake = due.unwrap_or(u64::MAX).min(next_snapshot);
        let wait = Duration::from_nanos(wake.saturating_sub(now)).min(MAX_WAIT);
        if driver.precise() && wait < PRECISE_BELOW {
            // epoll waits in whole milliseconds, which would send every
            // event up to 1 ms late: look at the sockets without waiting,
            // then sleep the exact remainder.
            engine.turn(&mut driver, Duration::ZERO)?;
            std::thread::sleep(wait);
        } else if driver.precise() {
            // Wake a millisecond early (epoll rounds up): the remainder
            // is then slept precisely on the next pass.
            engine.turn(&mut driver, wait - PRECISE_BELOW)?;
        } else {
            engine.turn(&mut driver, wait)?;
        }
        if engine.take_woken() {
            while let Ok(c) = rx.try_recv() {
                match c {
                    Control::Start => driver.start(&mut engine),
                    Control::Stop => driver.stop(&mut engine),
                }
            }
        }
    }
    let role = driver.finish();
    let mut counters = engine.cx.counters.clone();
    if let Some(p) = &role.published {
        counters.publish_dropped = p.dropped.len() as u64;
    }
    let mut histograms = vec![
        (
            "connect".to_owned(),
            histogram::encode(&engine.cx.connect_hist),
        ),
        (
            "handshake".to_owned(),
            histogram::encode(&engine.cx.handshake_hist),
        ),
    ];
    for (name, h) in [
        ("latency", &role.latency),
        ("lag", &role.lag),
        ("ack", &role.ack),
        ("replay", &role.replay),
        ("resubscribe", &role.resubscribe),
    ] {
        if let Some(h) = h {
            histograms.push((name.to_owned(), histogram::encode(h)));
        }
    }
    emit(&Msg::Done(Box::new(Done {
        counters,
        histograms,
        phase_upgrades: role.phase_upgrades,
        broadcast: role.broadcast,
        published: role.published,
        received: role.received,
        sent: role.sent,
        reached: role.reached,
        rss_start,
        rss_ready,
        conns_ready,
        cpu_ready,
        cpu_end: sys::cpu_secs(),
        cpu_user_end: sys::cpu_times().0,
        rss_peak: rss_peak.max(sys::rss_bytes()),
    })))?;
    Ok(())
}
