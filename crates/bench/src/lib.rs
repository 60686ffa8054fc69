//! myriad-bench: the load tools of the seeds as one multi-process CLI,
//! `myriad bench <workload>`.
//!
//! Map of the crate, from the command line down to the sockets:
//! - [`cli`]: the command line ([`BenchCommand`]), every option and default.
//! - [`workloads`]: connect-rate, subscribers, publishers, broadcast, run
//!   and churn; each file holds its worker-side driver and its coordinator.
//! - [`monitor`], [`fleet`], [`progress`], [`admin`]: the coordinator — worker
//!   processes, the per-second timeline, live progress, the server's /stats.
//! - [`child`]: the worker process: its JSON-lines protocol and main loop.
//! - [`engine`] and [`conn`]: one mio event loop per worker, connections in a
//!   slab, each a compact state machine over the shared protocol crate.
//! - [`http`]: the client side of HTTP/1.1 (response heads, the requests of
//!   the receive-only transports) and one pure reader per transport:
//!   Server-Sent Events, chunked NDJSON, long-poll answers.
//! - Pure planning and math, each with its own tests: [`plan`] (processes
//!   against the open-file cap), [`pacing`] (open-loop schedules),
//!   [`pattern`] (subjects and who subscribes to what), [`continuity`]
//!   (one subscriber's offsets of one subject, across reconnects),
//!   [`addr`] (targets, source addresses and ports), [`histogram`] (HDR
//!   ship and merge), [`payload`] (timestamps in and out of messages),
//!   [`profile`] (other servers' dialects), [`counters`], [`clock`],
//!   [`sys`].
//! - [`report`]: the terminal summary, `--json` and `--html`.

pub mod addr;
pub mod admin;
pub mod child;
pub mod cli;
pub mod clock;
pub mod conn;
pub mod continuity;
pub mod counters;
pub mod engine;
pub mod error;
pub mod fleet;
pub mod histogram;
pub mod http;
pub mod monitor;
pub mod pacing;
pub mod pattern;
pub mod payload;
pub mod plan;
pub mod profile;
pub mod progress;
pub mod report;
pub mod sys;
pub mod workloads;

use std::process::ExitCode;

pub use cli::BenchCommand;
use cli::Workload;

/// Runs `myriad bench …`: a workload (printing its summary and writing its
/// reports, then failing if the run failed its checks), or, when
/// re-executed as a worker, the worker loop.
pub fn run(cmd: BenchCommand) -> ExitCode {
    let result = match &cmd.workload {
        Workload::Worker => return child::worker_main(),
        Workload::ConnectRate(a) => workloads::connect_rate::run(&cmd, a),
        Workload::Subscribers(a) => workloads::subscribers::run(&cmd, a),
        Workload::Publishers(a) => workloads::publishers::run(&cmd, a),
        Workload::Broadcast(a) => workloads::broadcast::run(&cmd, a),
        Workload::Run(a) => workloads::run::run(&cmd, a),
        Workload::Churn(a) => workloads::churn::run(&cmd, a),
    };
    match result.and_then(|report| report.emit(&cmd).and_then(|()| report.verdict())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("myriad bench: {e}");
            ExitCode::FAILURE
        }
    }
}
