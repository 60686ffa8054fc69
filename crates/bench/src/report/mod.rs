//! The results of a run: one [`Report`] value that the terminal summary,
//! the JSON file and the HTML page are all rendered from, so the three can
//! never disagree.
//!
//! Layer 5, the top: built from a [`Measurements`], the plain data the
//! coordinator fills; everything common (totals, merged histograms, rates,
//! the bench's own cost, the server's /stats) is computed here. Must not
//! import the coordinator or the worker: a report renders a run, it does
//! not take part in one.

pub mod html;
pub mod json;
pub mod summary;

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::measurements::{
    ChurnReport, Deliveries, Group, Measurements, PhaseReport, Sample, SocialReport,
};
use crate::schema::merge_histograms;
use crate::util::clock::Extent;
use crate::util::counters::Counters;
use crate::util::error::BenchError;
use crate::util::histogram::{self, Summary};
use crate::util::stats::ServerFigures;
use crate::util::sys::ListenCounters;

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
    /// social figures.
    pub social: Option<SocialReport>,
    /// The bench's own cost.
    pub bench: SelfCost,
    /// The server's figures (with --admin-url).
    pub server: Option<ServerReport>,
    /// One sample per second.
    pub timeline: Vec<Sample>,
}

impl Report {
    /// The report of a finished run: the figures computed from `o`, the
    /// plain data its coordinator collected.
    pub fn build(o: Measurements) -> Result<Report, BenchError> {
        let hists = merge_histograms(o.finished.iter().map(|(_, d)| d))?;
        let mut totals = Counters::default();
        let (mut rss_peak, mut cpu, mut cpu_user) = (0, 0.0, 0.0);
        let (mut sub_rss, mut sub_conns, mut sub_cpu) = (0i64, 0u64, 0.0);
        let (mut received, mut sent) = (None, None);
        for (group, d) in &o.finished {
            totals.add(&d.counters);
            received = Extent::union(received, d.received);
            sent = Extent::union(sent, d.sent);
            rss_peak += d.rss_peak;
            cpu += d.cpu_end;
            cpu_user += d.cpu_user_end;
            if *group == Group::Subscribers {
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
        let measured_secs = o.measured_secs;
        let per_s = |v: u64| {
            if measured_secs > 0.0 {
                v as f64 / measured_secs
            } else {
                0.0
            }
        };
        let messages_in = o.subscriber_messages_in;
        let bench = SelfCost {
            processes: o.processes,
            fd_cap: o.fd_cap,
            conns_per_process: o.conns_per_process,
            rss_peak_bytes: rss_peak,
            rss_per_conn_bytes: (sub_conns > 0).then(|| sub_rss.max(0) as f64 / sub_conns as f64),
            cpu_secs: cpu,
            cpu_user_secs: cpu_user,
            cpu_us_per_message_in: (messages_in > 0).then(|| sub_cpu * 1e6 / messages_in as f64),
        };
        let server = o
            .server_stats
            .map(|s| server_report(s.before, s.after, &o.timeline));
        let messages_in_per_s = received
            .and_then(|r| r.rate(totals.messages_in))
            .unwrap_or_else(|| per_s(totals.messages_in));
        Ok(Report {
            tool: format!("myriad bench {}", env!("CARGO_PKG_VERSION")),
            workload: o.workload,
            config: o.config,
            profile: o.profile,
            started_unix: o.started_unix,
            duration_secs: o.duration_secs,
            measured_secs,
            setup_secs: o.setup_secs,
            failures: totals.failure_table().into_iter().collect(),
            latency: summary("latency"),
            connect: summary("connect"),
            handshake: summary("handshake"),
            publish_lag: summary("lag"),
            http_response: summary("ack"),
            resubscribe: summary("resubscribe"),
            handshakes_per_s: per_s(totals.upgraded),
            messages_in_per_s,
            published_per_s: sent
                .and_then(|r| r.rate(totals.published))
                .unwrap_or_else(|| per_s(totals.published)),
            totals,
            phases: o.phases,
            listen_queue: o.listen_queue,
            deliveries: o.deliveries,
            broadcast: o.broadcast.map(|b| BroadcastReport {
                messages: b.messages,
                subscribers: b.subscribers,
                complete: b.complete,
                until_last: b.until_last,
                deliveries_per_s: messages_in_per_s,
            }),
            churn: o.churn,
            social: o.social,
            bench,
            server,
            timeline: o.timeline,
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
    pub fn emit(&self, json: Option<&Path>, html: Option<&Path>) -> Result<(), BenchError> {
        print!("{}", summary::render(self));
        if let Some(path) = json {
            json::write(self, path)?;
        }
        if let Some(path) = html {
            html::write(self, path)?;
        }
        Ok(())
    }

    /// Whether the run passed what it verifies: an error naming every
    /// problem otherwise, so the command exits non-zero after reporting.
    pub fn verdict(&self) -> Result<(), BenchError> {
        let problems: Vec<String> = (self.churn.iter().flat_map(ChurnReport::problems))
            .chain(self.social.iter().flat_map(SocialReport::problems))
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(BenchError::Checks(problems.join(", ")))
        }
    }
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
