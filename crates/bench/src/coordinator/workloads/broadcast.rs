//! `myriad bench broadcast` (seed 002): N subscribers of one subject, K
//! publishes; for each message, the time from its publish until the LAST
//! subscriber had it, and the deliveries per second.
//!
//! Subscribers tally every message by its number (deliveries and the
//! slowest one); the coordinator adds the tallies of all processes, so
//! "until the last subscriber" is exact across processes. This is the
//! coordinator side; the subscribers are `worker/subscriber.rs`.

use crate::coordinator::cli::{BenchCommand, BroadcastArgs};
use crate::coordinator::groups::{
    expected_deliveries, measurements, publish_schedule, publish_to_subscribers, Setup,
    SubscriberGroup,
};
use crate::coordinator::monitor::Monitor;
use crate::measurements::{Broadcast, Group, Measurements};
use crate::schema::BroadcastTally;
use crate::util::error::BenchError;
use crate::util::histogram;
use crate::util::pattern::{AssignMode, Assignment};

/// Default K.
const DEFAULT_MESSAGES: u64 = 100;
/// Default publish rate, messages/s.
const DEFAULT_RATE: f64 = 10.0;

/// Runs the broadcast workload.
pub fn run(cmd: &BenchCommand, args: &BroadcastArgs) -> Result<Measurements, BenchError> {
    let mut setup = Setup::new(cmd)?;
    let mut m = Monitor::new(&cmd.global);
    let messages = args.publish.count.unwrap_or(DEFAULT_MESSAGES);
    let rate = args.publish.rate.unwrap_or(DEFAULT_RATE).max(1e-3);
    let mut publish = args.publish.clone();
    publish.count = Some(messages);
    let assignment = Assignment {
        pattern: args.subject.clone(),
        per_conn: 1,
        mode: AssignMode::OneToOne,
        seed: cmd.global.seed,
    };
    let group = SubscriberGroup {
        conns: args.subscribers,
        assignment: Some(assignment.clone()),
        broadcast_messages: Some(messages),
        connect_rate: 0.0,
        churn: None,
        receive: args.receive.clone(),
    };
    // K events at `rate`: the schedule is exactly K/rate seconds long.
    let schedule = publish_schedule(&publish, DEFAULT_RATE, messages as f64 / rate);
    let measured = publish_to_subscribers(&mut m, cmd, &mut setup, &group, &publish, schedule)?;
    let mut out = measurements(cmd, &setup, &m, measured)?;
    let deliveries = expected_deliveries(&m, &assignment, group.conns, &publish, cmd.global.seed);
    let tally = merge_tallies(&m, messages as usize);
    let subscribed = m.totals(Some(Group::Subscribers)).subscribed;
    let mut until_last = histogram::new();
    for &us in tally
        .max_us
        .iter()
        .zip(&tally.count)
        .filter(|(_, &c)| c > 0)
        .map(|(us, _)| us)
    {
        histogram::record(&mut until_last, us);
    }
    out.broadcast = Some(Broadcast {
        messages: deliveries.published,
        subscribers: subscribed,
        complete: tally
            .count
            .iter()
            .filter(|&&c| u64::from(c) >= subscribed && c > 0)
            .count() as u64,
        until_last: histogram::summary(&until_last),
    });
    out.deliveries = Some(deliveries);
    Ok(out)
}

/// Adds the per-message tallies of every subscriber worker.
fn merge_tallies(m: &Monitor, messages: usize) -> BroadcastTally {
    let mut out = BroadcastTally {
        count: vec![0; messages],
        max_us: vec![0; messages],
    };
    for t in m
        .workers
        .iter()
        .filter_map(|w| w.done.as_ref()?.broadcast.as_ref())
    {
        for i in 0..messages.min(t.count.len()) {
            out.count[i] += t.count[i];
            out.max_us[i] = out.max_us[i].max(t.max_us[i]);
        }
    }
    out
}
