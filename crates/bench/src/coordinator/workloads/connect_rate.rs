//! `myriad bench connect-rate` (seed 000), the coordinator side: sizes the
//! process count from the peak concurrency (Little's law) against the
//! open-file cap, and reports the achieved rate per phase, connect and
//! handshake latency, errors by kind and, for a local server, the kernel's
//! listen-queue overflows. The devices are `worker/workloads/connect_rate.rs`.

use crate::coordinator::cli::{BenchCommand, ConnectRateArgs};
use crate::coordinator::groups::{measurements, stop, Setup};
use crate::coordinator::monitor::Monitor;
use crate::measurements::{Group, Measurements, PhaseReport};
use crate::schema::{ConnectRateTask, Control, Task};
use crate::util::addr::Target;
use crate::util::error::BenchError;
use crate::util::pacing::{Schedule, Share};
use crate::util::plan;
use crate::util::sys::ListenCounters;

/// Names of the schedule phases, in `Schedule::ramp` order (zero-length
/// phases are left out of both).
fn phase_names(args: &ConnectRateArgs) -> Vec<&'static str> {
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
pub fn run(cmd: &BenchCommand, args: &ConnectRateArgs) -> Result<Measurements, BenchError> {
    let mut setup = Setup::new(cmd)?;
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
    let local = cmd.global.urls.iter().all(Target::is_local);
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
            Group::Devices,
        )?;
    }
    m.wait_for(Some(10.0), |m| m.all_ready(Group::Devices))?;
    m.note(&format!(
        "{} arrivals over {:.0}s, peak {:.0}/s, ~{peak_open} open at the peak, {procs} worker process(es)",
        schedule.total_events(),
        schedule.secs(),
        args.rate
    ));
    m.send(Group::Devices, Control::Start);
    let t0 = m.elapsed();
    let bound = schedule.secs()
        + args.hold.0 * (1.0 + args.hold_jitter)
        + cmd.global.connect_timeout.0
        + 5.0;
    if !m.wait_for(Some(bound), |m| m.all_done(Group::Devices))? {
        stop(&mut m, Group::Devices)?;
    }
    let measured = schedule.secs().min(m.elapsed() - t0);
    m.finish_progress();
    let mut out = measurements(cmd, &setup, &m, measured)?;
    let mut upgrades = vec![0u64; schedule.phases.len()];
    for d in m.workers.iter().filter_map(|w| w.done.as_ref()) {
        for (u, v) in upgrades.iter_mut().zip(&d.phase_upgrades) {
            *u += v;
        }
    }
    out.phases = schedule
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
    out.listen_queue = netstat_before.and_then(|b| Some(ListenCounters::read()?.since(&b)));
    Ok(out)
}
