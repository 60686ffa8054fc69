//! myriad-bench: the load tools of the seeds as one multi-process CLI,
//! `myriad bench <workload>`.
//!
//! Map of the crate, in layers from the bottom up. A module imports only
//! from its own layer or those below it (`tests/layers.rs` checks), and a
//! workload's file never imports another workload's:
//! 1. [`util`], the helpers, each pure or a leaf with its own tests:
//!    planning ([`util::plan`]: processes against the open-file cap),
//!    open-loop schedules ([`util::pacing`]), subjects and who subscribes
//!    to what ([`util::pattern`]), continuity across reconnects
//!    ([`util::continuity`]), targets and source ports ([`util::addr`]),
//!    HDR ship and merge ([`util::histogram`]), numbers for people
//!    ([`util::fmt`]), timestamps in messages ([`util::payload`]), other
//!    servers' dialects ([`util::profile`]), the client side of HTTP/1.1
//!    with one pure reader per receive-only transport ([`util::http`]),
//!    compressed deliveries inflated once per distinct message
//!    ([`util::inflate_cache`]),
//!    /stats figures ([`util::stats`]), the follow graph and who sends
//!    ([`util::graph`]), received offsets ([`util::offsets`]), the social
//!    workload's judge of every send ([`util::judge`]) and its follow churn
//!    ([`util::toggles`]), counters, clocks, errors, and this process's
//!    usage ([`util::sys`]).
//! 2. The data between layers: [`schema`], the JSON lines the coordinator
//!    and its workers exchange (spec, tasks, control, snapshots, final
//!    reports), and [`measurements`], a finished run as plain data for the
//!    report.
//! 3. [`worker`], the worker process (`bench __worker`): its loop, the mio
//!    reactor and connection state machine, the subscribing connections,
//!    and one driver per workload in `worker/workloads/`.
//! 4. [`coordinator`], the `myriad bench` process: the command line
//!    ([`BenchCommand`]), worker processes, the per-second monitor, live
//!    progress, the server's /stats, and one coordinator per workload in
//!    `coordinator/workloads/`.
//! 5. [`report`]: the terminal summary, `--json` and `--html`, built from
//!    a [`measurements::Measurements`].
//!
//! This file, above them all, only dispatches the command line.

pub mod coordinator;
pub mod measurements;
pub mod report;
pub mod schema;
pub mod util;
pub mod worker;

use std::process::ExitCode;

pub use coordinator::cli::BenchCommand;
use coordinator::cli::Workload;
use coordinator::workloads as w;
use report::Report;

/// Runs `myriad bench …`: a workload (printing its summary and writing its
/// reports, then failing if the run failed its checks), or, when
/// re-executed as a worker, the worker loop.
pub fn run(cmd: BenchCommand) -> ExitCode {
    let measured = match &cmd.workload {
        Workload::Worker => return worker::process::worker_main(),
        Workload::ConnectRate(a) => w::connect_rate::run(&cmd, a),
        Workload::Subscribers(a) => w::subscribers::run(&cmd, a),
        Workload::Publishers(a) => w::publishers::run(&cmd, a),
        Workload::Broadcast(a) => w::broadcast::run(&cmd, a),
        Workload::Run(a) => w::run::run(&cmd, a),
        Workload::Churn(a) => w::churn::run(&cmd, a),
        Workload::Social(a) => w::social::run(&cmd, a),
    };
    let g = &cmd.global;
    let result = measured.and_then(Report::build).and_then(|report| {
        report.emit(g.json.as_deref(), g.html.as_deref())?;
        report.verdict()
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("myriad bench: {e}");
            ExitCode::FAILURE
        }
    }
}
