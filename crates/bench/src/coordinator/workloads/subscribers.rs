//! `myriad bench subscribers` (seed 001's Benchsub), the coordinator side:
//! plans the processes, sets the subscribers up, holds for the duration and
//! reports. The connections are `worker/subscriber.rs`.

use crate::coordinator::cli::{BenchCommand, SubscribersArgs};
use crate::coordinator::groups::{
    await_subscribers, measurements, spawn_subscribers, stop, subscriber_processes, Setup,
    SubscriberGroup,
};
use crate::coordinator::monitor::Monitor;
use crate::measurements::{Group, Measurements};
use crate::schema::Control;
use crate::util::error::BenchError;

/// `myriad bench subscribers`: hold N subscribed connections for the
/// duration and time whatever is published to them (by `publishers`, the
/// HTTP API, or anything else).
pub fn run(cmd: &BenchCommand, args: &SubscribersArgs) -> Result<Measurements, BenchError> {
    let mut setup = Setup::new(cmd)?;
    let mut m = Monitor::new(&cmd.global);
    let group = SubscriberGroup {
        conns: args.subs.connections,
        assignment: Some(args.subs.assignment(cmd.global.seed)),
        broadcast_messages: None,
        connect_rate: args.subs.connect_rate,
        churn: None,
        receive: args.subs.receive.clone(),
    };
    setup.plan_sources(cmd, &m, group.conns);
    let procs = subscriber_processes(cmd, &setup, group.conns);
    spawn_subscribers(&mut m, cmd, &setup, &group, 0, procs)?;
    await_subscribers(&mut m, cmd, &group)?;
    m.send(Group::Subscribers, Control::Start);
    let t0 = m.elapsed();
    m.wait_for(Some(args.duration.0), |_| false)?;
    let measured = m.elapsed() - t0;
    stop(&mut m, Group::Subscribers)?;
    m.finish_progress();
    measurements(cmd, &setup, &m, measured)
}
