//! The results of a run: one [`Report`] value that the terminal summary,
//! the JSON file and the HTML page are all rendered from, so the three can
//! never disagree.
//!
//! Workloads fill the parts they measure; everything common (totals,
//! merged histograms, the bench's own cost, the server's /stats, the
//! timeline) is collected here from the monitor.

pub mod html;
pub mod json;
pub mod summary;

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::admin::ServerFigures;
use crate::cli::BenchCommand;
use crate::clock::Span;
use crate::counters::Counters;
use crate::error::BenchError;
use crate::histogram::{self, Micros, Summary};
use crate::monitor::{Monitor, Role};
use crate::sys::ListenCounters;
use crate::workloads::Setup;

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

/// Broadcast (seed 002) figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BroadcastReport {
    /// Messages published (K).
    pub messages: u64,
    /// Subscribers (N).
    pub subscribers: u64,
    /// Messages every subscriber received.
    pub complete: u64,
    /// Per message: time from publish until the LAST subscriber had it.
    pub until_last: Summary,
    /// Deliveries per second while messages were arriving.
    pub deliveries_per_s: f64,
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
    /// Resubscribes with `since` answered `recovered: true`.
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
        [
            (self.lost, "messages lost"),
            (self.duplicates, "duplicates"),
            (self.gaps, "gaps"),
            (self.unrecovered, "resubscribes not recovered"),
            (self.broken, "positions that could not be followed"),
            (unanswered, "reconnects never answered"),
        ]
        .into_iter()
        .filter(|&(n, _)| n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect()
    }
}

/// What the bench itself cost.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SelfCost {
    /// Worker processes.
    pub processes: u64,
    /// Open-file cap per process.
    pub fd_cap: u64,
    /// Connections planned per process at most.
    pub conns_per_process: u64,
    /// Peak RSS of all workers together, bytes.
    pub rss_peak_bytes: u64,
    /// RSS added per connection held by subscriber workers (idle, set up), bytes.
    pub rss_per_conn_bytes: Option<f64>,
    /// CPU seconds of all workers.
    pub cpu_secs: f64,
    /// Of which in user space: the bench's own code, as opposed to the
    /// kernel's TCP work (on loopback that includes the server's receive side).
    pub cpu_user_secs: f64,
    /// Subscriber CPU per delivery received, µs (after set-up).
    pub cpu_us_per_message_in: Option<f64>,
}

/// The server's own figures from /stats, summed over its nodes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerReport {
    /// Nodes polled.
    pub nodes: u64,
    /// /stats of each node before the load.
    pub before: Option<Vec<Value>>,
    /// /stats of each node at the end.
    pub after: Option<Vec<Value>>,
    /// Peak RSS seen, bytes.
    pub rss_peak_bytes: u64,
    /// Connections at the timeline's peak.
    pub peak_connections: u64,
    /// RSS over connections at that peak, bytes: everything the process
    /// holds, its code and idle heap included.
    pub rss_per_connection: Option<f64>,
    /// RSS gained since before the load over connections at the peak,
    /// bytes: what one more connection costs.
    pub rss_added_per_connection: Option<f64>,
    /// CPU seconds used during the run.
    pub cpu_secs: f64,
    /// Server CPU per message written, µs (its kernel time included, which
    /// on loopback holds the receiving side's TCP work too).
    pub cpu_us_per_message_out: Option<f64>,
    /// Messages written per write/writev call: 1.0 when every message cost
    /// a system call, more when queued messages shared one.
    pub messages_per_write: Option<f64>,
}

/// Everything a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `myriad bench` and its version.
    pub tool: String,
    /// The workload's name.
    pub workload: String,
    /// The full command line configuration.
    pub config: Value,
    /// The protocol profile's name.
    pub profile: String,
    /// Unix time the run started, seconds.
    pub started_unix: f64,
    /// Length of the run, seconds.
    pub duration_secs: f64,
    /// Length of the measured part (start to stop), seconds.
    pub measured_secs: f64,
    /// Time the subscribers took to connect and subscribe, seconds.
    pub setup_secs: Option<f64>,
    /// All counters, summed over workers.
    pub totals: Counters,
    /// Failures by kind.
    pub failures: BTreeMap<&'static str, u64>,
    /// Latency of every delivery.
    pub latency: Option<Summary>,
    /// TCP connect latency.
    pub connect: Option<Summary>,
    /// Handshake latency: request sent to its 101 (or HTTP transport 200).
    pub handshake: Option<Summary>,
    /// How late publishes left against their schedule.
    pub publish_lag: Option<Summary>,
    /// HTTP publish response time (from the due time).
    pub http_response: Option<Summary>,
    /// Churn: from a reconnect's connect() to each subject's `subscribed`
    /// (over long-poll, to the reconnect's first answer).
    pub resubscribe: Option<Summary>,
    /// Upgrades per second over the measured part.
    pub handshakes_per_s: f64,
    /// Deliveries per second from the first delivery to the last, across
    /// every process (over the measured part when there were fewer than two).
    pub messages_in_per_s: f64,
    /// Publishes per second from the first publish to the last, likewise.
    pub published_per_s: f64,
    /// connect-rate phases.
    pub phases: Vec<PhaseReport>,
    /// Listen-queue overflow and drop deltas (local server only).
    pub listen_queue: Option<ListenCounters>,
    /// Delivery accounting (workloads that publish).
    pub deliveries: Option<Deliveries>,
    /// broadcast figures.
    pub broadcast: Option<BroadcastReport>,
    /// churn figures.
    pub churn: Option<ChurnReport>,
    /// The bench's own cost.
    pub bench: SelfCost,
    /// The server's figures (with --admin-url).
    pub server: Option<ServerReport>,
    /// One sample per second.
    pub timeline: Vec<Sample>,
}

impl Report {
    /// The common part of a report from a finished monitor of a run set up
    /// by `setup`; the workload fills in the rest. `measured_secs` is the
    /// span rates are taken over when no span of deliveries is known.
    pub fn collect(
        cmd: &BenchCommand,
        setup: &Setup,
        m: &Monitor,
        measured_secs: f64,
    ) -> Result<Report, BenchError> {
        let hists = merged_histograms(m)?;
        let mut totals = Counters::default();
        let (mut rss_peak, mut cpu, mut cpu_user) = (0, 0.0, 0.0);
        let (mut sub_rss, mut sub_conns, mut sub_cpu) = (0i64, 0u64, 0.0);
        let (mut received, mut sent) = (None, None);
        for w in &m.workers {
            let Some(d) = &w.done else { continue };
            totals.add(&d.counters);
            received = Span::union(received, d.received);
            sent = Span::union(sent, d.sent);
            rss_peak += d.rss_peak;
            cpu += d.cpu_end;
            cpu_user += d.cpu_user_end;
            if w.role == Role::Subscribers {
                sub_rss += d.rss_ready as i64 - d.rss_start as i64;
                sub_conns += d.conns_ready;
                sub_cpu += d.cpu_end - d.cpu_ready;
            }
        }
        let summary = |name: &str| {
            hists
                .get(name)
                .filter(|h| !h.is_empty())
                .map(histogram::summary)
        };
        let per_s = |v: u64| {
            if measured_secs > 0.0 {
                v as f64 / measured_secs
            } else {
                0.0
            }
        };
        let messages_in = m.totals(Some(Role::Subscribers)).messages_in;
        let bench = SelfCost {
            processes: m.workers.len() as u64,
            fd_cap: setup.fd_cap,
            conns_per_process: setup.per_process,
            rss_peak_bytes: rss_peak,
            rss_per_conn_bytes: (sub_conns > 0).then(|| sub_rss.max(0) as f64 / sub_conns as f64),
            cpu_secs: cpu,
            cpu_user_secs: cpu_user,
            cpu_us_per_message_in: (messages_in > 0).then(|| sub_cpu * 1e6 / messages_in as f64),
        };
        let server = m
            .admin
            .as_ref()
            .map(|a| server_report(a.first.clone(), a.final_answers(), &m.samples));
        Ok(Report {
            tool: format!("myriad bench {}", env!("CARGO_PKG_VERSION")),
            workload: workload_name(cmd),
            config: serde_json::to_value(cmd)?,
            profile: setup.profile.name.clone(),
            started_unix: setup.started_unix,
            duration_secs: m.elapsed(),
            measured_secs,
            setup_secs: m.setup_secs,
            failures: totals.failure_table().into_iter().collect(),
            latency: summary("latency"),
            connect: summary("connect"),
            handshake: summary("handshake"),
            publish_lag: summary("lag"),
            http_response: summary("ack"),
            resubscribe: summary("resubscribe"),
            handshakes_per_s: per_s(totals.upgraded),
            messages_in_per_s: received
                .and_then(|r| r.rate(totals.messages_in))
                .unwrap_or_else(|| per_s(totals.messages_in)),
            published_per_s: sent
                .and_then(|r| r.rate(totals.published))
                .unwrap_or_else(|| per_s(totals.published)),
            totals,
            phases: Vec::new(),
            listen_queue: None,
            deliveries: None,
            broadcast: None,
            churn: None,
            bench,
            server,
            timeline: m.samples.clone(),
        })
    }

    /// The latency histograms this run has, named, in report order.
    pub fn latency_rows(&self) -> Vec<(&'static str, &Summary)> {
        [
            ("delivery", &self.latency),
            ("connect", &self.connect),
            ("handshake", &self.handshake),
            ("publish lag", &self.publish_lag),
            ("http response", &self.http_response),
            ("resubscribe", &self.resubscribe),
        ]
        .into_iter()
        .filter_map(|(name, s)| Some((name, s.as_ref()?)))
        .collect()
    }

    /// Prints the summary and writes the files the options ask for.
    pub fn emit(&self, cmd: &BenchCommand) -> Result<(), BenchError> {
        print!("{}", summary::render(self));
        if let Some(path) = &cmd.global.json {
            json::write(self, path)?;
        }
        if let Some(path) = &cmd.global.html {
            html::write(self, path)?;
        }
        Ok(())
    }

    /// Whether the run passed what it verifies: an error naming every
    /// problem otherwise, so the command exits non-zero after reporting.
    pub fn verdict(&self) -> Result<(), BenchError> {
        let problems = self.churn.as_ref().map(ChurnReport::problems);
        match problems {
            Some(p) if !p.is_empty() => Err(BenchError::Checks(p.join(", "))),
            _ => Ok(()),
        }
    }
}

/// Every histogram the workers shipped in their final reports, merged by
/// name (latency, connect, handshake, lag, ack, replay, resubscribe).
pub fn merged_histograms(m: &Monitor) -> Result<BTreeMap<String, Micros>, BenchError> {
    let mut hists: BTreeMap<String, Micros> = BTreeMap::new();
    for d in m.workers.iter().filter_map(|w| w.done.as_ref()) {
        for (name, text) in &d.histograms {
            let h = hists.entry(name.clone()).or_insert_with(histogram::new);
            histogram::merge_encoded(h, text)?;
        }
    }
    Ok(hists)
}

/// The workload's subcommand name.
fn workload_name(cmd: &BenchCommand) -> String {
    serde_json::to_value(&cmd.workload)
        .ok()
        .and_then(|v| v["workload"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Server figures from the first and last /stats and the timeline.
fn server_report(
    before: Option<Vec<Value>>,
    after: Option<Vec<Value>>,
    samples: &[Sample],
) -> ServerReport {
    let b = before
        .as_deref()
        .map(ServerFigures::total)
        .unwrap_or_default();
    let a = after
        .as_deref()
        .map(ServerFigures::total)
        .unwrap_or_default();
    let points = samples.iter().filter_map(|s| s.server);
    let peak = points
        .clone()
        .max_by_key(|p| p.connections)
        .filter(|p| p.connections > 0);
    let rss_peak = points.map(|p| p.rss_bytes).max().unwrap_or(a.rss_bytes);
    let cpu = (a.cpu_seconds - b.cpu_seconds).max(0.0);
    let out = a.messages_out.saturating_sub(b.messages_out);
    let writes = a.socket_writes.saturating_sub(b.socket_writes);
    ServerReport {
        nodes: after.as_ref().or(before.as_ref()).map_or(0, Vec::len) as u64,
        rss_peak_bytes: rss_peak,
        peak_connections: peak.map_or(0, |p| p.connections),
        rss_per_connection: peak.and_then(|p| p.rss_per_connection),
        rss_added_per_connection: peak
            .map(|p| p.rss_bytes.saturating_sub(b.rss_bytes) as f64 / p.connections as f64),
        cpu_secs: cpu,
        cpu_us_per_message_out: (out > 0).then(|| cpu * 1e6 / out as f64),
        messages_per_write: (writes > 0).then(|| out as f64 / writes as f64),
        before,
        after,
    }
}
