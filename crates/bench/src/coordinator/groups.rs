//! What every workload's coordinator shares (one file per workload sits in
//! `workloads/` and uses this, never another workload's file): planning
//! processes against the open-file cap, building worker specs,
//! spawning subscriber (or churning subscriber) and publisher groups,
//! waiting for deliveries to drain, and replaying what the publishers
//! published to compute what a run must see, and filling the run's
//! [`Measurements`] for the report.

use std::collections::HashSet;
use std::net::Ipv4Addr;

use crate::coordinator::cli::{BenchCommand, PublishOpts, ReceiveOpts};
use crate::coordinator::monitor::Monitor;
use crate::measurements::{Deliveries, Group, Measurements, ServerStats};
use crate::schema::{
    ChurnTask, CloseMode, Control, Done, PublishTask, PublishTransport, Spec, SubscribeTask, Task,
    SETUP_ATTEMPTS,
};
use crate::util::addr::{PortMode, Sources, EXPLICIT_PORT_MIN, MAX_TARGETS};
use crate::util::clock::realtime_ns;
use crate::util::error::BenchError;
use crate::util::pacing::{Schedule, Share};
use crate::util::pattern::{publish_subject, Assignment, Pattern};
use crate::util::plan;
use crate::util::profile::Profile;

/// Publishes per second when `--rate` is not given (broadcast has its own).
pub const DEFAULT_RATE: f64 = 1000.0;

/// How long stopped workers have to send their final reports.
const STOP_SECS: f64 = 30.0;

/// Largest subject count for which the coordinator replays deliveries
/// (a u32 and a u64 per subject).
pub const MAX_REPLAY_SUBJECTS: u64 = 50_000_000;

/// What every coordinator works out first.
pub struct Setup {
    /// The loaded profile.
    pub profile: Profile,
    /// Open files per process.
    pub fd_cap: u64,
    /// Connections per worker process.
    pub per_process: u64,
    /// Wall-clock start, Unix seconds.
    pub started_unix: f64,
    /// Source addresses workers connect from (see [`Setup::plan_sources`]).
    pub sources: Sources,
}

impl Setup {
    /// Loads the profile and reads the open-file cap.
    pub fn new(cmd: &BenchCommand) -> Result<Setup, BenchError> {
        if cmd.global.urls.len() > MAX_TARGETS {
            return Err(BenchError::Config(format!(
                "at most {MAX_TARGETS} --url targets"
            )));
        }
        let fd_cap = plan::fd_cap();
        Ok(Setup {
            profile: Profile::load(&cmd.global.profile)?,
            fd_cap,
            per_process: plan::conns_per_process(fd_cap),
            started_unix: realtime_ns() as f64 / 1e9,
            sources: cmd.global.local_addrs.clone().unwrap_or_default(),
        })
    }

    /// A worker spec; `worker` of `workers` share the port space.
    pub fn spec(&self, cmd: &BenchCommand, worker: u64, workers: u64, task: Task) -> Spec {
        let g = &cmd.global;
        Spec {
            worker,
            workers,
            targets: g.urls.clone(),
            tls_ca: g.tls_ca.clone(),
            sources: self.sources.clone(),
            port_mode: g.source_ports,
            max_conns: self.per_process,
            setup_timeout: g.connect_timeout.0,
            profile: self.profile.clone(),
            seed: cmd.global.seed.wrapping_add(worker),
            task,
        }
    }

    /// Chooses source addresses for `conns` simultaneous connections.
    /// Given `--local-addrs`, uses them (warning if their ports cannot hold
    /// the load); otherwise, against loopback IPv4 targets, spreads over
    /// 127.0.0.1–127.0.0.N when one source's ports would fill past
    /// 1/[`plan::PORT_FILL`] — the seed-004 move, made automatically.
    pub fn plan_sources(&mut self, cmd: &BenchCommand, m: &Monitor, conns: u64) {
        let g = &cmd.global;
        let ports = match g.source_ports {
            PortMode::Auto => plan::ephemeral_ports(),
            PortMode::Explicit => u64::from(u16::MAX - EXPLICIT_PORT_MIN) + 1,
        };
        let targets = g.urls.len().max(1) as u64;
        if g.local_addrs.is_some() {
            let cap = plan::port_capacity(self.sources.0.len() as u64, targets, ports);
            if conns > cap {
                m.note(&format!(
                    "warning: {conns} connections but only ~{cap} source ports for {} source address(es) × {targets} target(s)",
                    self.sources.0.len()
                ));
            }
            return;
        }
        let loopback = g
            .urls
            .iter()
            .all(|t| t.addr.is_ipv4() && t.addr.ip().is_loopback());
        let needed =
            plan::sources_needed(conns.div_ceil(targets), ports).min(u64::from(u8::MAX) - 1);
        if loopback && needed > 1 {
            self.sources = Sources(
                (1..=needed as u8)
                    .map(|i| Ipv4Addr::new(127, 0, 0, i))
                    .collect(),
            );
            m.note(&format!(
                "connecting from 127.0.0.1-127.0.0.{needed} so no source address fills more than 1/{} of its ports (override with --local-addrs)",
                plan::PORT_FILL
            ));
        }
    }
}

/// A subscriber group to start.
pub struct SubscriberGroup {
    /// Connections in all.
    pub conns: u64,
    /// What they subscribe to.
    pub assignment: Option<Assignment>,
    /// Broadcast: messages to tally individually.
    pub broadcast_messages: Option<u64>,
    /// Overall connect-rate cap (0: none).
    pub connect_rate: f64,
    /// Churn: how the subscribers reconnect once started; None: they stay.
    pub churn: Option<ChurnPlan>,
    /// How they receive.
    pub receive: ReceiveOpts,
}

/// How many subscriber processes `conns` need.
pub fn subscriber_processes(cmd: &BenchCommand, setup: &Setup, conns: u64) -> u64 {
    cmd.global
        .processes
        .unwrap_or_else(|| plan::processes_for(conns, setup.per_process))
        .max(1)
}

/// Spawns subscriber workers `first_worker..` out of `workers` in all.
/// Returns the reconnects their schedules hold (0 without churn).
pub fn spawn_subscribers(
    m: &mut Monitor,
    cmd: &BenchCommand,
    setup: &Setup,
    g: &SubscriberGroup,
    first_worker: u64,
    workers: u64,
) -> Result<u64, BenchError> {
    let path = g.receive.http_path();
    if path.is_some() && setup.profile.name != "myriad" {
        return Err(BenchError::Config(
            "the HTTP subscribe transports are myriad's (--profile myriad)".into(),
        ));
    }
    let procs = subscriber_processes(cmd, setup, g.conns);
    let mut reconnects = 0;
    for (i, range) in plan::split(g.conns, procs).into_iter().enumerate() {
        let task = SubscribeTask {
            first: range.start,
            count: range.end - range.start,
            assignment: g.assignment.clone(),
            in_flight: cmd.global.in_flight,
            connect_rate: g.connect_rate / procs as f64,
            broadcast_messages: g.broadcast_messages,
            transport: g.receive.transport,
        };
        let task = match &g.churn {
            None => Task::Subscribe(task),
            Some(churn) => {
                let task = churn.task(task, g.conns);
                reconnects += task.reconnects.total_events();
                Task::Churn(task)
            }
        };
        let mut spec = setup.spec(cmd, first_worker + i as u64, workers, task);
        // The HTTP transports listen beside WebSocket, on the same port.
        if let Some(path) = &path {
            for target in &mut spec.targets {
                target.path.clone_from(path);
            }
        }
        spec.setup_timeout += g.receive.first_answer_secs();
        m.spawn(&spec, Group::Subscribers)?;
    }
    Ok(reconnects)
}

/// One publisher worker to start.
pub struct PublisherPlan<'a> {
    /// How it publishes.
    pub opts: &'a PublishOpts,
    /// Subjects it draws from.
    pub subjects: Pattern,
    /// When each publish is due.
    pub schedule: Schedule,
    /// Global index of its first connection (after the subscribers', so
    /// routes and handshake keys never repeat).
    pub first_index: u64,
    /// Its worker number among `workers` sharing the source-port space.
    pub worker: u64,
    /// Workers in the run.
    pub workers: u64,
}

/// Spawns one publisher worker.
pub fn spawn_publisher(
    m: &mut Monitor,
    cmd: &BenchCommand,
    setup: &Setup,
    plan: PublisherPlan<'_>,
) -> Result<(), BenchError> {
    let opts = plan.opts;
    let mut spec_targets = None;
    let api_key_header = match opts.transport {
        PublishTransport::Ws => None,
        PublishTransport::Http => {
            let admin = cmd.global.admin_urls.first().cloned().ok_or_else(|| {
                BenchError::Config("--publish-transport http needs --admin-url".into())
            })?;
            spec_targets = Some(vec![admin]);
            let header = setup.profile.http()?.api_key_header.clone();
            header
                .zip(cmd.global.publishing_key())
                .map(|(h, k)| format!("{h}: {k}\r\n"))
        }
    };
    let task = PublishTask {
        schedule: plan.schedule,
        share: Share::ALL,
        max_events: opts.count,
        size: opts.size,
        subjects: plan.subjects,
        order: opts.order,
        seed: cmd.global.seed,
        transport: opts.transport,
        conns: opts.publisher_conns.max(1),
        first_index: plan.first_index,
        api_key_header,
        drain_secs: opts.drain.0,
    };
    let mut spec = setup.spec(cmd, plan.worker, plan.workers, Task::Publish(task));
    if let Some(t) = spec_targets {
        spec.targets = t;
    }
    m.spawn(&spec, Group::Publishers)?;
    Ok(())
}

/// How long the coordinator waits for publishers of a `publish_secs` schedule
/// to end by themselves before it stops them. A publisher ends once its
/// queues drained, or its drain bound passed after its last event fired;
/// behind a server that holds it back, that last event fires late, so the
/// bound allows the schedule twice over.
pub fn publishers_bound(publish_secs: f64, opts: &PublishOpts) -> f64 {
    publish_secs * 2.0 + opts.drain.0 + 15.0
}

/// The shape `run`, `broadcast` and `churn` share: set up every subscriber
/// of `group`, then publish to its subjects on `schedule` (while the group
/// churns, if it does) and wait until every delivery is in and every
/// reconnect answered (or the drain bound passes). Returns the measured
/// seconds, from the start signal until drained.
pub fn publish_to_subscribers(
    m: &mut Monitor,
    cmd: &BenchCommand,
    setup: &mut Setup,
    group: &SubscriberGroup,
    opts: &PublishOpts,
    schedule: Schedule,
) -> Result<f64, BenchError> {
    let assignment = group
        .assignment
        .as_ref()
        .ok_or_else(|| BenchError::Config("publishing needs subscribed connections".into()))?;
    setup.plan_sources(cmd, m, group.conns);
    let sub_procs = subscriber_processes(cmd, setup, group.conns);
    let workers = sub_procs + 1;
    let reconnects = spawn_subscribers(m, cmd, setup, group, 0, workers)?;
    await_subscribers(m, cmd, group)?;
    let publish_secs = schedule.secs();
    spawn_publisher(
        m,
        cmd,
        setup,
        PublisherPlan {
            opts,
            subjects: assignment.pattern.clone(),
            schedule,
            first_index: group.conns,
            worker: sub_procs,
            workers,
        },
    )?;
    m.wait_for(Some(cmd.global.connect_timeout.0 + 5.0), |m| {
        m.all_ready(Group::Publishers)
    })?;
    m.send(Group::Subscribers, Control::Start);
    m.send(Group::Publishers, Control::Start);
    let t0 = m.elapsed();
    let bound = publishers_bound(publish_secs, opts);
    if !m.wait_for(Some(bound), |m| m.all_done(Group::Publishers))? {
        stop(m, Group::Publishers)?;
    }
    let expected = expected_deliveries(m, assignment, group.conns, opts, cmd.global.seed).expected;
    drain(m, expected, reconnects, opts.drain.0)?;
    let measured = m.elapsed() - t0;
    stop(m, Group::Subscribers)?;
    m.finish_progress();
    Ok(measured)
}

/// Sends Stop to `group` and waits (bounded) for every final report.
pub fn stop(m: &mut Monitor, group: Group) -> Result<(), BenchError> {
    m.send(group, Control::Stop);
    if !m.wait_out(STOP_SECS, |m| m.all_done(group))? {
        return Err(BenchError::Unresponsive(STOP_SECS));
    }
    Ok(())
}

/// Waits until subscribers have received `expected` deliveries (or, when
/// that is unknown, until no delivery arrived for two seconds), every one
/// of `reconnects` scheduled reconnects was made and answered (or
/// skipped), and every subscriber that failed over is back; at most
/// `max_secs` either way.
pub fn drain(
    m: &mut Monitor,
    expected: Option<u64>,
    reconnects: u64,
    max_secs: f64,
) -> Result<(), BenchError> {
    let received = |m: &Monitor| m.totals(Some(Group::Subscribers)).messages_in;
    // Counters are cumulative and each worker's come from one snapshot, so
    // once every scheduled reconnect shows as made or skipped, `reconnected`
    // catching up with `reconnects` means none is still on its way.
    let settled = |m: &Monitor| {
        let t = m.totals(Some(Group::Subscribers));
        t.reconnects + t.reconnects_skipped >= reconnects
            && t.reconnected >= t.reconnects
            && t.failed_over >= t.failovers
    };
    match expected {
        Some(e) => {
            m.wait_for(Some(max_secs), |m| received(m) >= e && settled(m))?;
        }
        None => {
            let deadline = m.elapsed() + max_secs;
            let mut last = (received(m), m.elapsed());
            m.wait_for(Some(max_secs), |m| {
                let now = (received(m), m.elapsed());
                if now.0 != last.0 {
                    last = now;
                }
                (now.1 - last.1 >= 2.0 && settled(m)) || now.1 >= deadline
            })?;
        }
    }
    Ok(())
}

/// What the publishers published, replayed from their subject choices.
pub struct PublishedCounts {
    /// Publishes made, to every subject together.
    pub total: u64,
    /// Per subject index, publishes made to it; None when there are too
    /// many subjects to replay.
    pub per_subject: Option<Vec<u64>>,
    /// False when a publisher did not report or lost a connection: what it
    /// sent is then uncertain.
    pub exact: bool,
}

/// Replays every publisher's events (fired and not dropped) against
/// `subjects` subjects drawn in `opts.order` with `seed`.
pub fn published_counts(
    m: &Monitor,
    opts: &PublishOpts,
    seed: u64,
    subjects: u64,
) -> PublishedCounts {
    let mut per_subject = (subjects <= MAX_REPLAY_SUBJECTS).then(|| vec![0u64; subjects as usize]);
    let (mut total, mut exact) = (0, true);
    for w in m.workers.iter().filter(|w| w.group == Group::Publishers) {
        let Some(p) = w.done.as_ref().and_then(|d| d.published.as_ref()) else {
            exact = false;
            continue;
        };
        exact &= p.conns_lost == 0;
        let dropped: HashSet<u64> = p.dropped.iter().copied().collect();
        for k in 0..p.fired {
            let n = p.share.event(k);
            if dropped.contains(&n) {
                continue;
            }
            total += 1;
            if let Some(counts) = &mut per_subject {
                counts[publish_subject(opts.order, seed, n, subjects) as usize] += 1;
            }
        }
    }
    PublishedCounts {
        total,
        per_subject,
        exact,
    }
}

/// How many deliveries the publishes must produce, replaying every
/// publisher's subject choices against the subscriber assignment of
/// `subscribers` connections. None when there are too many subjects to
/// replay.
pub fn expected_deliveries(
    m: &Monitor,
    assignment: &Assignment,
    subscribers: u64,
    opts: &PublishOpts,
    seed: u64,
) -> Deliveries {
    let published = published_counts(m, opts, seed, assignment.pattern.len());
    let expected = published.per_subject.map(|per_subject| {
        let counts = assignment.subscriber_counts(subscribers);
        per_subject
            .iter()
            .zip(counts)
            .map(|(&p, c)| p * u64::from(c))
            .sum()
    });
    Deliveries {
        published: published.total,
        expected,
        received: m.totals(Some(Group::Subscribers)).messages_in,
        // Replay assumes every subscriber connection was subscribed before
        // publishing began.
        exact: published.exact && m.subscribed_at_setup == Some(subscribers),
    }
}

/// The publish schedule of `opts` over `secs` seconds.
pub fn publish_schedule(opts: &PublishOpts, default_rate: f64, secs: f64) -> Schedule {
    Schedule::constant(opts.rate.unwrap_or(default_rate), secs)
}

/// How a subscriber group churns: the coordinator's plan.
#[derive(Debug, Clone, Copy)]
pub struct ChurnPlan {
    /// Reconnects per second, the whole group together.
    pub rate: f64,
    /// How long reconnects go on after the start, seconds.
    pub secs: f64,
    /// How long a subscriber stays away between closing and reconnecting.
    pub offline: f64,
    /// How the old connection ends.
    pub close: CloseMode,
}

impl ChurnPlan {
    /// The task of a worker holding `subscribe.count` of the group's
    /// `conns` subscribers: its share of the rate, so that every subscriber
    /// of the group reconnects at the same interval.
    pub fn task(&self, subscribe: SubscribeTask, conns: u64) -> ChurnTask {
        let share = subscribe.count as f64 / conns.max(1) as f64;
        ChurnTask {
            reconnects: Schedule::constant(self.rate * share, self.secs),
            offline: self.offline,
            close: self.close,
            subscribe,
        }
    }
}

/// Waits for the set-up of `group` ([`await_set_up`]).
pub fn await_subscribers(
    m: &mut Monitor,
    cmd: &BenchCommand,
    group: &SubscriberGroup,
) -> Result<(), BenchError> {
    await_set_up(m, cmd, group.conns, group.receive.first_answer_secs())
}

/// Waits for the set-up of `conns` subscribing connections, each allowed
/// `extra_secs` beyond connect and handshake, noting how long it took;
/// proceeds with what is up after a bound that scales with the population.
pub fn await_set_up(
    m: &mut Monitor,
    cmd: &BenchCommand,
    conns: u64,
    extra_secs: f64,
) -> Result<(), BenchError> {
    let t0 = m.elapsed();
    let attempt = cmd.global.connect_timeout.0 + extra_secs;
    let bound = attempt * f64::from(SETUP_ATTEMPTS) + 10.0 + conns as f64 / 500.0;
    let ready = m.wait_for(Some(bound), |m| m.all_ready(Group::Subscribers))?;
    let c = m.totals(Some(Group::Subscribers));
    let secs = m.elapsed() - t0;
    m.setup_secs = Some(secs);
    m.subscribed_at_setup = Some(c.subscribed);
    m.note(&format!(
        "{} of {} subscribers set up in {secs:.1}s ({} failed){}",
        c.subscribed,
        conns,
        c.failed(),
        if ready {
            ""
        } else {
            "; going on without the rest"
        }
    ));
    Ok(())
}

/// The run as plain data for the report: what the monitor `m` saw of a run
/// set up by `setup`, rates taken over `measured_secs` when no span of
/// deliveries is known. The workload adds its own figures.
pub fn measurements(
    cmd: &BenchCommand,
    setup: &Setup,
    m: &Monitor,
    measured_secs: f64,
) -> Result<Measurements, BenchError> {
    Ok(Measurements {
        workload: workload_name(cmd),
        config: serde_json::to_value(cmd)?,
        profile: setup.profile.name.clone(),
        started_unix: setup.started_unix,
        duration_secs: m.elapsed(),
        measured_secs,
        setup_secs: m.setup_secs,
        processes: m.workers.len() as u64,
        fd_cap: setup.fd_cap,
        conns_per_process: setup.per_process,
        finished: m
            .workers
            .iter()
            .filter_map(|w| Some((w.group, Done::clone(w.done.as_ref()?))))
            .collect(),
        subscriber_messages_in: m.totals(Some(Group::Subscribers)).messages_in,
        server_stats: m.stats.as_ref().map(|a| ServerStats {
            before: a.first.clone(),
            after: a.final_answers(),
        }),
        timeline: m.samples.clone(),
        phases: Vec::new(),
        listen_queue: None,
        deliveries: None,
        broadcast: None,
        churn: None,
        social: None,
    })
}

/// The workload's subcommand name.
fn workload_name(cmd: &BenchCommand) -> String {
    serde_json::to_value(&cmd.workload)
        .ok()
        .and_then(|v| v["workload"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::SubscribeTransport;

    #[test]
    fn a_churning_worker_takes_its_share_of_the_reconnect_rate() {
        let subscribe = SubscribeTask {
            first: 10,
            count: 2,
            assignment: None,
            in_flight: 10,
            connect_rate: 0.0,
            broadcast_messages: None,
            transport: SubscribeTransport::Ws,
        };
        let plan = ChurnPlan {
            rate: 10.0,
            secs: 1.0,
            offline: 0.0,
            close: CloseMode::Reset,
        };
        let task = plan.task(subscribe, 4);
        assert_eq!(task.reconnects.total_events(), 5, "half of 10/s for 1 s");
    }
}
