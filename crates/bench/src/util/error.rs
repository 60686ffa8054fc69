//! The crate's top-level error: every way a bench run can fail before or
//! while it measures. Per-layer errors convert into it with `?`.

use thiserror::Error;

/// Why a run (or a worker) could not go on.
#[derive(Debug, Error)]
pub enum BenchError {
    /// A system call failed: spawning, pipes, epoll, files.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A JSON line or file did not parse.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The protocol profile is unusable.
    #[error(transparent)]
    Profile(#[from] crate::util::profile::ProfileError),
    /// A worker shipped a histogram that does not decode or merge.
    #[error(transparent)]
    Histogram(#[from] crate::util::histogram::HistogramError),
    /// A worker reported that it could not run.
    #[error("worker {worker}: {error}")]
    Worker {
        /// Which worker.
        worker: usize,
        /// What it said.
        error: String,
    },
    /// A worker exited without its final report.
    #[error("worker {0} exited without reporting")]
    WorkerLost(usize),
    /// Workers did not send their final reports after being told to stop.
    #[error("workers did not report within {0} s of stop")]
    Unresponsive(f64),
    /// The options contradict each other or this host's limits.
    #[error("{0}")]
    Config(String),
    /// The run completed and reported, but what it verifies did not hold
    /// (churn: messages lost, duplicated or not recovered; social:
    /// deliveries lost, duplicated or unexpected).
    #[error("the run failed its checks: {0}")]
    Checks(String),
}
