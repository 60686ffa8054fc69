//! `myriad bench publishers` (seed 001's Benchpub), the coordinator side:
//! publishes for the duration and reports rates. The publishers are
//! `worker/workloads/publishers.rs`.

use crate::coordinator::cli::{BenchCommand, PublishersArgs};
use crate::coordinator::groups::{
    measurements, publish_schedule, publishers_bound, spawn_publisher, stop, PublisherPlan, Setup,
    DEFAULT_RATE,
};
use crate::coordinator::monitor::Monitor;
use crate::measurements::{Group, Measurements};
use crate::schema::Control;
use crate::util::error::BenchError;

/// `myriad bench publishers`: publish at the rate for the duration (or
/// `--count` messages) and report what was sent and how late.
pub fn run(cmd: &BenchCommand, args: &PublishersArgs) -> Result<Measurements, BenchError> {
    let setup = Setup::new(cmd)?;
    let mut m = Monitor::new(&cmd.global);
    let schedule = publish_schedule(&args.publish, DEFAULT_RATE, args.duration.0);
    spawn_publisher(
        &mut m,
        cmd,
        &setup,
        PublisherPlan {
            opts: &args.publish,
            subjects: args.subjects.clone(),
            schedule,
            first_index: 0,
            worker: 0,
            workers: 1,
        },
    )?;
    m.wait_for(Some(cmd.global.connect_timeout.0 + 5.0), |m| {
        m.all_ready(Group::Publishers)
    })?;
    m.send(Group::Publishers, Control::Start);
    let t0 = m.elapsed();
    let bound = publishers_bound(args.duration.0, &args.publish);
    if !m.wait_for(Some(bound), |m| m.all_done(Group::Publishers))? {
        stop(&mut m, Group::Publishers)?;
    }
    let measured = (m.elapsed() - t0).min(args.duration.0.max(1e-3));
    m.finish_progress();
    measurements(cmd, &setup, &m, measured)
}
