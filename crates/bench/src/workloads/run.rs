//! `myriad bench run`: subscribers and publishers at once, the
//! MigratoryData shape (one subject per connection, 512-byte messages,
//! open-loop publishing) scaled to this box, so the headline figures —
//! connections held, deliveries/s, latency percentiles, bench and server
//! cost — come from one command.

use crate::child::Control;
use crate::cli::{BenchCommand, RunArgs};
use crate::error::BenchError;
use crate::monitor::{Monitor, Role};
use crate::pattern::Assignment;
use crate::report::Report;

use super::subscribers::await_subscribers;
use super::{
    drain, expected_deliveries, publish_schedule, spawn_publisher, spawn_subscribers, stop,
    subscriber_processes, Setup, SubscriberGroup,
};

/// Runs the combined scenario.
pub fn run(cmd: &BenchCommand, args: &RunArgs) -> Result<Report, BenchError> {
    let mut setup = Setup::new(cmd)?;
    let mut m = Monitor::new(&cmd.global);
    let assignment = Assignment {
        pattern: args.subs.pattern(),
        per_conn: args.subs.subjects_per_conn,
        mode: args.subs.assign,
        seed: cmd.global.seed,
    };
    let group = SubscriberGroup {
        conns: args.subs.connections,
        assignment: Some(assignment.clone()),
        broadcast_messages: None,
        connect_rate: args.subs.connect_rate,
    };
    setup.plan_sources(cmd, &m, group.conns);
    let sub_procs = subscriber_processes(cmd, &setup, group.conns);
    let workers = sub_procs + 1;
    spawn_subscribers(&mut m, cmd, &setup, &group, 0, workers)?;
    await_subscribers(&mut m, cmd, group.conns)?;
    let schedule = publish_schedule(&args.publish, 1000.0, args.duration.0);
    spawn_publisher(
        &mut m,
        cmd,
        &setup,
        &args.publish,
        assignment.pattern.clone(),
        schedule,
        group.conns,
        (sub_procs, workers),
    )?;
    m.wait_for(Some(cmd.global.connect_timeout.0 + 5.0), |m| {
        m.all_ready(Role::Publishers)
    })?;
    m.send(Role::Subscribers, Control::Start);
    m.send(Role::Publishers, Control::Start);
    let t0 = m.elapsed();
    let bound = args.duration.0 + 15.0;
    if !m.wait_for(Some(bound), |m| m.all_done(Role::Publishers))? {
        stop(&mut m, Role::Publishers)?;
    }
    let expected =
        expected_deliveries(&m, &assignment, group.conns, &args.publish, cmd.global.seed).expected;
    drain(&mut m, expected, args.publish.drain.0)?;
    let measured = m.elapsed() - t0;
    stop(&mut m, Role::Subscribers)?;
    m.finish_progress();
    let mut report = Report::collect(cmd, &setup.profile.name, &m, measured, setup.started_unix)?;
    report.deliveries = Some(expected_deliveries(
        &m,
        &assignment,
        group.conns,
        &args.publish,
        cmd.global.seed,
    ));
    Ok(report)
}
