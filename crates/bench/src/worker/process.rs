//! The worker process's main loop: read the [`Spec`], pick the task's
//! driver, turn the reactor and tick the driver, and report as JSON lines
//! (a snapshot every second, `ready`, `done`).
//!
//! Owns the loop and its timing only; what is said is the schema's, what
//! each workload does is its driver's. stdin closing means the coordinator
//! is gone, and the worker stops.

use std::io::{self, BufRead, Write};
use std::sync::mpsc;
use std::time::Duration;

use crate::schema::{ChurnTask, Control, Done, Msg, Snapshot, Spec, Task};
use crate::util::error::BenchError;
use crate::util::{histogram, plan, sys};
use crate::worker::driver::Driver;
use crate::worker::reactor::{NetConfig, Reactor};
use crate::worker::subscriber::SubscribeDriver;
use crate::worker::tls;
use crate::worker::workloads::churn::ChurnDriver;
use crate::worker::workloads::connect_rate::ConnectRateDriver;
use crate::worker::workloads::publishers::PublishDriver;
use crate::worker::workloads::social::SocialDriver;

/// How often a worker reports; the charts' time resolution.
pub const SNAPSHOT_NS: u64 = 1_000_000_000;

/// Waits shorter than this are slept precisely instead of in epoll.
const PRECISE_BELOW: Duration = Duration::from_millis(1);

/// Longest a worker's loop sleeps, so control messages and snapshots are
/// never late by more than this.
const MAX_WAIT: Duration = Duration::from_millis(50);

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
    plan::fd_cap();
    let net = NetConfig {
        targets: spec.targets.clone(),
        sources: spec.sources.clone(),
        port_mode: spec.port_mode,
        worker: spec.worker,
        workers: spec.workers,
        max_conns: spec.max_conns as usize,
        setup_timeout_ns: (spec.setup_timeout * 1e9) as u64,
        // Publishers and social users send small frames that must leave
        // at once.
        nodelay: matches!(spec.task, Task::Publish(_) | Task::Social(_)),
        tls: match spec.targets.iter().any(|t| t.tls) {
            true => Some(
                tls::client_config(spec.tls_ca.as_deref())
                    .map_err(|e| BenchError::Config(e.to_string()))?,
            ),
            false => None,
        },
    };
    let mut reactor = Reactor::new(
        net,
        spec.profile.subscribe_ack.as_deref(),
        spec.profile.error_marker.as_deref(),
        spec.seed,
    )?;
    // An HTTP transport's request names its connection's subjects.
    reactor.cx.subjects = match &spec.task {
        Task::Subscribe(t) | Task::Churn(ChurnTask { subscribe: t, .. }) => t.assignment.clone(),
        Task::ConnectRate(_) | Task::Publish(_) | Task::Social(_) => None,
    };
    let (tx, rx) = mpsc::channel();
    let waker = reactor.waker();
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
        Task::ConnectRate(t) => run_worker(reactor, ConnectRateDriver::new(t.clone(), &spec), &rx),
        Task::Subscribe(t) => run_worker(reactor, SubscribeDriver::new(t.clone(), &spec)?, &rx),
        Task::Churn(t) => run_worker(reactor, ChurnDriver::new(t.clone(), &spec)?, &rx),
        Task::Publish(t) => run_worker(reactor, PublishDriver::new(t.clone(), &spec)?, &rx),
        Task::Social(t) => run_worker(reactor, SocialDriver::new(t.clone(), &spec)?, &rx),
    }
}

/// The worker loop: turn the reactor, tick the driver, report.
fn run_worker<D: Driver>(
    mut reactor: Reactor,
    mut driver: D,
    rx: &mpsc::Receiver<Control>,
) -> Result<(), BenchError> {
    let rss_start = sys::rss_bytes();
    let (mut rss_ready, mut cpu_ready, mut conns_ready) = (rss_start, 0.0, 0);
    let mut rss_peak = rss_start;
    let mut ready_sent = false;
    let mut next_snapshot = SNAPSHOT_NS;
    loop {
        let now = reactor.refresh_now();
        let due = driver.tick(&mut reactor);
        let becomes_ready = !ready_sent && driver.is_ready(&reactor);
        // A snapshot goes out with Ready, so the coordinator sees the
        // set-up counts at once.
        if now >= next_snapshot || becomes_ready {
            next_snapshot = now + SNAPSHOT_NS;
            let rss = sys::rss_bytes();
            rss_peak = rss_peak.max(rss);
            emit(&Msg::Snapshot(Box::new(Snapshot {
                counters: reactor.cx.counters.clone(),
                open: reactor.open_conns() as u64,
                in_setup: reactor.in_setup() as u64,
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
            conns_ready = reactor.open_conns() as u64;
            emit(&Msg::Ready)?;
        }
        if driver.is_done(&reactor) {
            break;
        }
        let wake = due.unwrap_or(u64::MAX).min(next_snapshot);
        let wait = Duration::from_nanos(wake.saturating_sub(now)).min(MAX_WAIT);
        if driver.precise() && wait < PRECISE_BELOW {
            // epoll waits in whole milliseconds, which would send every
            // event up to 1 ms late: look at the sockets without waiting,
            // then sleep the exact remainder.
            reactor.turn(&mut driver, Duration::ZERO)?;
            std::thread::sleep(wait);
        } else if driver.precise() {
            // Wake a millisecond early (epoll rounds up): the remainder
            // is then slept precisely on the next pass.
            reactor.turn(&mut driver, wait - PRECISE_BELOW)?;
        } else {
            reactor.turn(&mut driver, wait)?;
        }
        if reactor.take_woken() {
            while let Ok(c) = rx.try_recv() {
                match c {
                    Control::Start => driver.start(&mut reactor),
                    Control::Stop => driver.stop(&mut reactor),
                }
            }
        }
    }
    let workload = driver.finish();
    let mut counters = reactor.cx.counters.clone();
    if let Some(p) = &workload.published {
        counters.publish_dropped = p.dropped.len() as u64;
    }
    let mut histograms = vec![
        (
            "connect".to_owned(),
            histogram::encode(&reactor.cx.connect_hist),
        ),
        (
            "handshake".to_owned(),
            histogram::encode(&reactor.cx.handshake_hist),
        ),
    ];
    for (name, h) in [
        ("latency", &workload.latency),
        ("lag", &workload.lag),
        ("ack", &workload.ack),
        ("replay", &workload.replay),
        ("resubscribe", &workload.resubscribe),
    ] {
        if let Some(h) = h {
            histograms.push((name.to_owned(), histogram::encode(h)));
        }
    }
    emit(&Msg::Done(Box::new(Done {
        counters,
        histograms,
        phase_upgrades: workload.phase_upgrades,
        broadcast: workload.broadcast,
        published: workload.published,
        received: workload.received,
        sent: workload.sent,
        reached: workload.reached,
        social: workload.social,
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
