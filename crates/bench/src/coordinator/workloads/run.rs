//! `myriad bench run`: subscribers and publishers at once, the
//! MigratoryData shape (one subject per connection, 512-byte messages,
//! open-loop publishing) scaled to this box, so the headline figures —
//! connections held, deliveries/s, latency percentiles, bench and server
//! cost — come from one command.

use crate::coordinator::cli::{BenchCommand, RunArgs};
use crate::coordinator::groups::{
    expected_deliveries, measurements, publish_schedule, publish_to_subscribers, Setup,
    SubscriberGroup, DEFAULT_RATE,
};
use crate::coordinator::monitor::Monitor;
use crate::measurements::Measurements;
use crate::util::error::BenchError;

/// Runs the combined scenario.
pub fn run(cmd: &BenchCommand, args: &RunArgs) -> Result<Measurements, BenchError> {
    let mut setup = Setup::new(cmd)?;
    let mut m = Monitor::new(&cmd.global);
    let assignment = args.subs.assignment(cmd.global.seed);
    let group = SubscriberGroup {
        conns: args.subs.connections,
        assignment: Some(assignment.clone()),
        broadcast_messages: None,
        connect_rate: args.subs.connect_rate,
        churn: None,
        receive: args.subs.receive.clone(),
    };
    let schedule = publish_schedule(&args.publish, DEFAULT_RATE, args.duration.0);
    let measured =
        publish_to_subscribers(&mut m, cmd, &mut setup, &group, &args.publish, schedule)?;
    let mut out = measurements(cmd, &setup, &m, measured)?;
    out.deliveries = Some(expected_deliveries(
        &m,
        &assignment,
        group.conns,
        &args.publish,
        cmd.global.seed,
    ));
    Ok(out)
}
