//! Connection rate (seed 000): virtual devices arrive on a ramp-up /
//! sustain / ramp-down schedule; each connects, upgrades, optionally
//! subscribes, holds for ~1 s ± 5 %, and closes.
//!
//! The worker side ([`ConnectRateDriver`]) fires its share of the arrival
//! schedule open-loop (a slow server makes connects slower, not rarer),
//! keeps one heap of hold deadlines, and counts upgrades per phase. The
//! coordinator side ([`run`]) sizes the process count from the peak
//! concurrency (Little's law) against the open-file cap, and reports the
//! achieved rate per phase, connect and handshake latency, errors by kind
//! and, for a local server, the kernel's listen-queue overflows.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};

use crate::child::{Driver, RoleResult, Spec, MAX_BATCH};
use crate::cli::CloseMode;
use crate::conn::{Handler, Opening, Outcome, Wire};
use crate::counters::Counters;
use crate::engine::Engine;
use crate::histogram::Micros;
use crate::pacing::{Schedule, Share};
use crate::pattern::{mix, Pattern};
use crate::profile::{Template, Values};

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

/// The worker side of connect-rate.
pub struct ConnectRateDriver {
    task: ConnectRateTask,
    subscribe: Option<Template>,
    events: u64,
    started_ns: Option<u64>,
    /// Next position in the share.
    k: u64,
    /// (close at, key, index) of every open device.
    holds: BinaryHeap<Reverse<(u64, usize, u32)>>,
    /// Upgrades completed per schedule phase.
    phase_upgrades: Vec<u64>,
    stopped: bool,
    /// Reused for the subject name.
    subject: Vec<String>,
    /// Reused for expired holds.
    expired: Vec<(usize, u32)>,
}

impl ConnectRateDriver {
    /// A driver for `task` under `spec`'s profile.
    pub fn new(task: ConnectRateTask, spec: &Spec) -> ConnectRateDriver {
        let subscribe = task
            .subscribe
            .as_ref()
            .and(spec.profile.subscribe.as_deref())
            .and_then(|t| Template::compile("subscribe", t).ok());
        ConnectRateDriver {
            subscribe,
            events: task.schedule.total_events(),
            started_ns: None,
            k: 0,
            holds: BinaryHeap::new(),
            phase_upgrades: vec![0; task.schedule.phases.len()],
            stopped: false,
            subject: vec![String::new()],
            expired: Vec::new(),
            task,
        }
    }

    fn share_len(&self) -> u64 {
        self.task.share.len_of(self.events)
    }
}

impl Handler for ConnectRateDriver {
    fn on_open(&mut self, key: usize, index: u32, now_ns: u64, out: &mut Opening) {
        let start = self.started_ns.unwrap_or(now_ns);
        let phase = self.task.schedule.phase_at((now_ns - start) as f64 / 1e9);
        if let Some(p) = self.phase_upgrades.get_mut(phase) {
            *p += 1;
        }
        // Uniform in [-1, 1), fixed per device.
        let u = (mix(u64::from(index)) >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
        let hold = self.task.hold * (1.0 + self.task.jitter * u);
        self.holds
            .push(Reverse((now_ns + (hold.max(0.0) * 1e9) as u64, key, index)));
        if let (Some(tpl), Some(p)) = (&self.subscribe, &self.task.subscribe) {
            self.subject[0].clear();
            p.write_subject(u64::from(index), &mut self.subject[0]);
            tpl.render(
                &Values {
                    subjects: &self.subject,
                    data: "",
                    id: 1,
                },
                out.message(),
            );
        }
    }

    fn on_message(&mut self, _: u32, _: &[u8], _: u64, _: &mut Counters) -> bool {
        false
    }

    fn on_raw(&mut self, _: u32, _: &[u8], _: u64, _: &mut Counters) -> usize {
        0
    }

    fn on_closed(&mut self, _: usize, _: u32, _: Outcome, _: bool) {}
}

impl Driver for ConnectRateDriver {
    fn tick(&mut self, engine: &mut Engine) -> Option<u64> {
        let now = engine.refresh_now();
        let start = self.started_ns?;
        if self.stopped {
            return None;
        }
        let mut next = None;
        let share_len = self.share_len();
        let mut batch = 0;
        while self.k < share_len {
            if batch == MAX_BATCH {
                // More are due: come straight back after a look at the sockets.
                next = Some(now);
                break;
            }
            batch += 1;
            let n = self.task.share.event(self.k);
            let due = start + self.task.schedule.due(n).map_or(0, |d| d.as_nanos() as u64);
            if due > now {
                next = Some(due);
                break;
            }
            // A failed open is counted by the engine; the device is gone.
            let _ = engine.open(n as u32, Wire::WebSocket);
            self.k += 1;
        }
        while let Some(&Reverse((at, key, index))) = self.holds.peek() {
            if self.expired.len() as u64 == MAX_BATCH {
                next = Some(now);
                break;
            }
            if at > now {
                next = Some(next.map_or(at, |n: u64| n.min(at)));
                break;
            }
            self.holds.pop();
            self.expired.push((key, index));
        }
        let reset = self.task.close == CloseMode::Reset;
        let mut expired = std::mem::take(&mut self.expired);
        for (key, index) in expired.drain(..) {
            engine.close(key, index, reset, self);
        }
        self.expired = expired;
        next
    }

    fn start(&mut self, engine: &mut Engine) {
        self.started_ns = Some(engine.refresh_now());
    }

    fn stop(&mut self, _engine: &mut Engine) {
        self.stopped = true;
    }

    fn is_ready(&self, _engine: &Engine) -> bool {
        true
    }

    fn is_done(&self, engine: &Engine) -> bool {
        self.stopped
            || (self.started_ns.is_some() && self.k >= self.share_len() && engine.open_conns() == 0)
    }

    fn take_interval(&mut self) -> Option<Micros> {
        None
    }

    fn finish(self) -> RoleResult {
        RoleResult {
            phase_upgrades: self.phase_upgrades,
            ..RoleResult::default()
        }
    }
}

/// Names of the schedule phases, in `Schedule::ramp` order (zero-length
/// phases are left out of both).
fn phase_names(args: &crate::cli::ConnectRateArgs) -> Vec<&'static str> {
    [
        ("ramp-up", args.ramp_up.0),
        ("sustain", args.sustain.0),
        ("ramp-down", args.ramp_down.0),
    ]
    .into_iter()
    .filter(|&(_, secs)| secs > 0.0)
    .map(|(name, _)| name)
    .collect()
}

/// `myriad bench connect-rate`.
pub fn run(
    cmd: &crate::cli::BenchCommand,
    args: &crate::cli::ConnectRateArgs,
) -> Result<crate::report::Report, crate::error::BenchError> {
    use crate::child::{Control, Task};
    use crate::monitor::{Monitor, Role};
    use crate::plan;
    use crate::report::PhaseReport;
    use crate::sys::ListenCounters;

    let mut setup = super::Setup::new(cmd)?;
    let mut m = Monitor::new(&cmd.global);
    let schedule = Schedule::ramp(args.rate, args.ramp_up.0, args.sustain.0, args.ramp_down.0);
    // Setup time is bounded by the timeout, but normally a fraction of a
    // second: plan for a quarter second of it at the peak.
    let peak_open =
        plan::connect_rate_concurrency(args.rate, args.hold.0 * (1.0 + args.hold_jitter), 0.25);
    let procs = cmd
        .global
        .processes
        .unwrap_or_else(|| plan::processes_for(peak_open, setup.per_process))
        .max(1);
    // Every device takes a port for its hold, and (graceful close) the
    // server keeps the TIME_WAIT, so the live count is what matters.
    setup.plan_sources(cmd, &m, peak_open);
    let local = cmd.global.urls.iter().all(crate::addr::Target::is_local);
    let netstat_before = local.then(ListenCounters::read).flatten();
    for w in 0..procs {
        let task = ConnectRateTask {
            schedule: schedule.clone(),
            share: Share {
                offset: w,
                stride: procs,
            },
            hold: args.hold.0,
            jitter: args.hold_jitter,
            subscribe: args.subscribe.clone(),
            close: args.close,
        };
        m.spawn(
            &setup.spec(cmd, w, procs, Task::ConnectRate(task)),
            Role::Devices,
        )?;
    }
    m.wait_for(Some(10.0), |m| m.all_ready(Role::Devices))?;
    m.note(&format!(
        "{} arrivals over {:.0}s, peak {:.0}/s, ~{peak_open} open at the peak, {procs} worker process(es)",
        schedule.total_events(),
        schedule.secs(),
        args.rate
    ));
    m.send(Role::Devices, Control::Start);
    let t0 = m.elapsed();
    let bound = schedule.secs()
        + args.hold.0 * (1.0 + args.hold_jitter)
        + cmd.global.connect_timeout.0
        + 5.0;
    if !m.wait_for(Some(bound), |m| m.all_done(Role::Devices))? {
        super::stop(&mut m, Role::Devices)?;
    }
    let measured = schedule.secs().min(m.elapsed() - t0);
    m.finish_progress();
    let mut report = crate::report::Report::collect(cmd, &setup, &m, measured)?;
    let mut upgrades = vec![0u64; schedule.phases.len()];
    for d in m.workers.iter().filter_map(|w| w.done.as_ref()) {
        for (u, v) in upgrades.iter_mut().zip(&d.phase_upgrades) {
            *u += v;
        }
    }
    report.phases = schedule
        .phases
        .iter()
        .zip(phase_names(args))
        .zip(upgrades)
        .map(|((p, name), upgrades)| PhaseReport {
            name: name.to_owned(),
            secs: p.secs,
            planned_per_s: (p.start_rate + p.end_rate) / 2.0,
            upgrades,
            achieved_per_s: upgrades as f64 / p.secs,
        })
        .collect();
    report.listen_queue = netstat_before.and_then(|b| Some(ListenCounters::read()?.since(&b)));
    Ok(report)
}
