//! The coordinator's view of a run: every worker's latest state, the
//! per-second timeline, live progress and the server's /stats.
//!
//! Workloads drive the run through a [`Monitor`]: spawn workers by group,
//! wait for a condition while events are pumped and samples taken, send
//! start/stop to a group, and at the end collect every worker's final
//! report. Ctrl-C ends the current wait early so a partial run still
//! reports.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::coordinator::cli::Global;
use crate::coordinator::fleet::{Event, Fleet};
use crate::coordinator::node_api::StatsPoller;
use crate::coordinator::progress::Progress;
use crate::measurements::{Group, LatencyPoint, Sample, ServerPoint};
use crate::schema::{Control, Done, Msg, Snapshot, Spec};
use crate::util::counters::Counters;
use crate::util::error::BenchError;
use crate::util::histogram::{self, Micros};
use crate::util::stats::ServerFigures;

/// One worker process as the coordinator knows it: its state, not the
/// process (that is the [`Fleet`]'s).
pub struct WorkerState {
    /// Its group.
    pub group: Group,
    /// Its latest snapshot.
    pub last: Option<Snapshot>,
    /// It said ready.
    pub ready: bool,
    /// Its final report, once sent.
    pub done: Option<Box<Done>>,
}

/// A run in progress.
pub struct Monitor {
    fleet: Fleet,
    /// Every worker, by id.
    pub workers: Vec<WorkerState>,
    start: Instant,
    /// The timeline, one sample per second.
    pub samples: Vec<Sample>,
    interval: Micros,
    prev: (f64, Counters, f64, Option<ServerFigures>),
    next_sample: f64,
    progress: Progress,
    /// The server's /stats poller, with --admin-url.
    pub stats: Option<StatsPoller>,
    /// How long the subscribers took to connect and subscribe, seconds.
    pub setup_secs: Option<f64>,
    /// Subscribed connections when set-up ended (the `subscribed` count
    /// goes on growing when subscribers reconnect).
    pub subscribed_at_setup: Option<u64>,
    interrupted: Arc<AtomicBool>,
}

impl Monitor {
    /// A monitor for a run with `global` options.
    pub fn new(global: &Global) -> Monitor {
        let interrupted = Arc::new(AtomicBool::new(false));
        // Without the flag, Ctrl-C would kill the coordinator before it
        // could stop its workers and report. A second Ctrl-C (flag already
        // set) exits at once.
        let sigint = signal_hook::consts::SIGINT;
        let _ =
            signal_hook::flag::register_conditional_shutdown(sigint, 1, Arc::clone(&interrupted));
        let _ = signal_hook::flag::register(sigint, Arc::clone(&interrupted));
        Monitor {
            fleet: Fleet::new(),
            workers: Vec::new(),
            start: Instant::now(),
            samples: Vec::new(),
            interval: histogram::new(),
            prev: (0.0, Counters::default(), 0.0, None),
            next_sample: 1.0,
            progress: Progress::new(global.progress, global.progress_every.0),
            stats: (!global.admin_urls.is_empty())
                .then(|| StatsPoller::start(global.admin_urls.clone(), global.admin_headers())),
            setup_secs: None,
            subscribed_at_setup: None,
            interrupted,
        }
    }

    /// Seconds since the run began.
    pub fn elapsed(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Whether Ctrl-C was pressed.
    pub fn interrupted(&self) -> bool {
        self.interrupted.load(Ordering::Relaxed)
    }

    /// Prints a line above the live display.
    pub fn note(&self, text: &str) {
        self.progress.note(text);
    }

    /// Spawns a worker.
    pub fn spawn(&mut self, spec: &Spec, group: Group) -> Result<usize, BenchError> {
        let id = self.fleet.spawn(spec)?;
        self.workers.push(WorkerState {
            group,
            last: None,
            ready: false,
            done: None,
        });
        Ok(id)
    }

    /// Ids of the workers in `group`.
    pub fn ids(&self, group: Group) -> Vec<usize> {
        (0..self.workers.len())
            .filter(|&i| self.workers[i].group == group)
            .collect()
    }

    /// Sends `c` to every worker in `group`.
    pub fn send(&mut self, group: Group, c: Control) {
        let ids = self.ids(group);
        self.fleet.send(&ids, c);
    }

    /// Whether every worker in `group` said ready.
    pub fn all_ready(&self, group: Group) -> bool {
        self.workers
            .iter()
            .filter(|w| w.group == group)
            .all(|w| w.ready || w.done.is_some())
    }

    /// Whether every worker in `group` sent its final report.
    pub fn all_done(&self, group: Group) -> bool {
        self.workers
            .iter()
            .filter(|w| w.group == group)
            .all(|w| w.done.is_some())
    }

    /// Latest counters of `group`'s workers, summed (final ones when done).
    pub fn totals(&self, group: Option<Group>) -> Counters {
        let mut sum = Counters::default();
        for w in self
            .workers
            .iter()
            .filter(|w| group.is_none() || group == Some(w.group))
        {
            match (&w.done, &w.last) {
                (Some(d), _) => sum.add(&d.counters),
                (None, Some(s)) => sum.add(&s.counters),
                (None, None) => {}
            }
        }
        sum
    }

    /// Pumps events until `cond` holds (true), `timeout` passes or Ctrl-C
    /// (false).
    pub fn wait_for(
        &mut self,
        timeout: Option<f64>,
        cond: impl FnMut(&Monitor) -> bool,
    ) -> Result<bool, BenchError> {
        self.wait(timeout, true, cond)
    }

    /// Like [`wait_for`](Self::wait_for), but Ctrl-C does not end it: for
    /// collecting final reports after the run was interrupted.
    pub fn wait_out(
        &mut self,
        timeout: f64,
        cond: impl FnMut(&Monitor) -> bool,
    ) -> Result<bool, BenchError> {
        self.wait(Some(timeout), false, cond)
    }

    fn wait(
        &mut self,
        timeout: Option<f64>,
        interruptible: bool,
        mut cond: impl FnMut(&Monitor) -> bool,
    ) -> Result<bool, BenchError> {
        let until = timeout.map(|t| self.elapsed() + t);
        loop {
            if cond(self) {
                return Ok(true);
            }
            let interrupted = interruptible && self.interrupted();
            if interrupted || until.is_some_and(|u| self.elapsed() >= u) {
                return Ok(false);
            }
            self.pump(Duration::from_millis(100))?;
        }
    }

    /// Handles worker events for up to `wait`, sampling each second.
    fn pump(&mut self, wait: Duration) -> Result<(), BenchError> {
        let deadline = Instant::now() + wait;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let Some((id, event)) = self.fleet.recv(left) else {
                break;
            };
            self.handle(id, event)?;
        }
        while self.elapsed() >= self.next_sample {
            self.sample();
            self.next_sample += 1.0;
        }
        Ok(())
    }

    fn handle(&mut self, id: usize, event: Event) -> Result<(), BenchError> {
        let w = &mut self.workers[id];
        match event {
            Event::Msg(Msg::Snapshot(s)) => {
                if !s.latency.is_empty() {
                    histogram::merge_encoded(&mut self.interval, &s.latency)?;
                }
                w.last = Some(*s);
            }
            Event::Msg(Msg::Ready) => w.ready = true,
            Event::Msg(Msg::Done(d)) => w.done = Some(d),
            Event::Msg(Msg::Failed { error }) => {
                return Err(BenchError::Worker { worker: id, error })
            }
            Event::Exited if w.done.is_none() => return Err(BenchError::WorkerLost(id)),
            Event::Exited => {}
        }
        Ok(())
    }

    /// Appends one timeline sample from the latest snapshots.
    fn sample(&mut self) {
        let t = self.elapsed();
        let totals = self.totals(None);
        let live = self
            .workers
            .iter()
            .filter(|w| w.done.is_none())
            .filter_map(|w| w.last.as_ref());
        let (open, in_setup, rss, cpu) = live.fold((0, 0, 0, 0.0), |(o, i, r, c), s| {
            (o + s.open, i + s.in_setup, r + s.rss_bytes, c + s.cpu_secs)
        });
        let (pt, pc, pcpu, pserver) = &self.prev;
        let dt = (t - pt).max(1e-3);
        let rate = |now: u64, before: u64| now.saturating_sub(before) as f64 / dt;
        let latency = (!self.interval.is_empty()).then(|| LatencyPoint::of(&self.interval));
        self.interval.reset();
        let server = self
            .stats
            .as_ref()
            .and_then(StatsPoller::latest)
            .map(|v| ServerFigures::total(&v));
        let server_point = server.map(|s| ServerPoint {
            connections: s.connections,
            rss_bytes: s.rss_bytes,
            cpu_per_s: pserver.map_or(0.0, |p| (s.cpu_seconds - p.cpu_seconds).max(0.0) / dt),
            messages_out_per_s: pserver.map_or(0.0, |p| rate(s.messages_out, p.messages_out)),
            socket_writes_per_s: pserver.map_or(0.0, |p| rate(s.socket_writes, p.socket_writes)),
            rss_per_connection: s.rss_per_connection(),
        });
        let sample = Sample {
            t,
            open,
            in_setup,
            upgraded_per_s: rate(totals.upgraded, pc.upgraded),
            failures_per_s: rate(totals.failed(), pc.failed()),
            failures: totals.failed(),
            messages_in_per_s: rate(totals.messages_in, pc.messages_in),
            published_per_s: rate(totals.published, pc.published),
            reconnects_per_s: rate(totals.reconnects, pc.reconnects),
            latency,
            bench_rss_bytes: rss,
            bench_cpu_per_s: ((cpu - pcpu) / dt).max(0.0),
            server: server_point,
        };
        self.progress.update(&sample, &totals);
        self.prev = (t, totals, cpu, server.or(*pserver));
        self.samples.push(sample);
    }

    /// Ends the live display.
    pub fn finish_progress(&self) {
        self.progress.finish();
    }
}
