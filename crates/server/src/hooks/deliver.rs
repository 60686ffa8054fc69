//! The delivery task: one thread running a tokio current-thread runtime
//! that takes signals from the lifecycle stage (`cluster.rs`) through a
//! bounded channel, turns them into events with its [`Lifecycle`], drives the
//! [`Queue`], and POSTs each batch, signed, to `hook_url`.
//!
//! Whoever reports never waits: [`Hooks::signal`] is a `try_send`, and a
//! signal that finds the channel full is dropped and counted like an event
//! over the queue's bound (a dropped `Disconnected` then leaves its user
//! online on this node until the node restarts: the channel holds
//! `hook_queue` signals, so only a task that far behind loses one). Batches go one at a time, each
//! on a connection of its own, within [`REQUEST_TIMEOUT`], through the
//! crate's one backend client (`crate::backend`), over TLS for an
//! `https://` URL.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::mpsc;

use super::lifecycle::{Lifecycle, Signal};
use super::queue::{Counts, Outcome, Queue};
use super::settings::HookSettings;
use super::sign::headers;
use crate::backend::{self, Target};

/// How long one request may take, connect to status line, before it
/// counts as no answer (retryable).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Told each delivered batch's latency, on the delivery thread.
pub type Delivered = Box<dyn Fn(Duration) + Send>;

/// What the task has done so far, for the metrics and the tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub counts: Counts,
    /// Events held, ready, out or waiting to be retried.
    pub queued: usize,
}

/// The node's handle on the delivery task.
#[derive(Clone)]
pub struct Hooks {
    signals: mpsc::Sender<Signal>,
    /// The queue's counts as of its last change; the lock is only taken to
    /// copy a `Snapshot` in or out, never across an `.await`.
    snapshot: Arc<Mutex<Snapshot>>,
    /// Signals refused because the channel to the task was full.
    refused_full: Arc<AtomicU64>,
}

/// Why the delivery task could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("hook_url {0:?}: {1}")]
    Target(String, backend::TargetError),
    #[error("cannot start the hook delivery thread: {0}")]
    Thread(std::io::Error),
}

impl Hooks {
    /// Starts the delivery thread for checked `settings`; `node` names
    /// this node in every event and its ids; `delivered` is told each
    /// delivered batch's latency (the metrics' histogram).
    pub fn start(
        settings: HookSettings,
        node: &str,
        delivered: Delivered,
    ) -> Result<Hooks, StartError> {
        let target = Target::parse(&settings.url, settings.ca.as_deref())
            .map_err(|e| StartError::Target(settings.url.clone(), e))?;
        let (signals, inbox) = mpsc::channel(settings.queue_bound);
        let lifecycle = Lifecycle::new(node);
        let snapshot = Arc::new(Mutex::new(Snapshot::default()));
        let shared = Arc::clone(&snapshot);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(StartError::Thread)?;
        std::thread::Builder::new()
            .name("myriad-hooks".into())
            .spawn(move || {
                runtime.block_on(run(settings, target, lifecycle, inbox, shared, delivered))
            })
            .map_err(StartError::Thread)?;
        Ok(Hooks {
            signals,
            snapshot,
            refused_full: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Hands a signal to the task without waiting; a full channel drops
    /// it and counts it as `dropped_full`.
    pub fn signal(&self, signal: Signal) {
        if self.signals.try_send(signal).is_err() {
            self.refused_full.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A handle whose signals land in the returned receiver instead of a
    /// delivery task: for tests of what the workers report.
    #[cfg(test)]
    pub(crate) fn tap(capacity: usize) -> (Hooks, mpsc::Receiver<Signal>) {
        let (signals, inbox) = mpsc::channel(capacity);
        let hooks = Hooks {
            signals,
            snapshot: Arc::default(),
            refused_full: Arc::default(),
        };
        (hooks, inbox)
    }

    /// The counts so far.
    pub fn snapshot(&self) -> Snapshot {
        let mut snapshot = *self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
        snapshot.counts.dropped_full += self.refused_full.load(Ordering::Relaxed);
        snapshot
    }
}

/// The task: wait for a signal or the queue's next due time, send what is
/// due, repeat until the node drops its [`Hooks`].
async fn run(
    settings: HookSettings,
    target: Target,
    mut lifecycle: Lifecycle,
    mut inbox: mpsc::Receiver<Signal>,
    snapshot: Arc<Mutex<Snapshot>>,
    delivered: Delivered,
) {
    let secret = settings.secret.clone();
    let mut queue = Queue::new(settings);
    loop {
        while let Some(batch) = queue.take(Instant::now()) {
            let outcome = post(&target, &secret, &batch.body()).await;
            let now = Instant::now();
            if outcome == Outcome::Delivered {
                delivered(Queue::latency(&batch, now));
            }
            queue.finish(batch, outcome, now);
            publish(&queue, &snapshot);
        }
        let due = queue.next_due();
        let wait = async {
            match due {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            signal = inbox.recv() => match signal {
                Some(signal) => {
                    if let Some(event) = lifecycle.apply(signal, unix_millis()) {
                        queue.push(event, Instant::now());
                    }
                }
                None => return,
            },
            () = wait => {}
        }
        publish(&queue, &snapshot);
    }
}

/// Milliseconds since the Unix epoch, an event's `time`.
fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn publish(queue: &Queue, snapshot: &Mutex<Snapshot>) {
    *snapshot.lock().unwrap_or_else(|e| e.into_inner()) = Snapshot {
        counts: queue.counts(),
        queued: queue.queued(),
    };
}

/// Sends one body; what its status (or its absence) means.
async fn post(target: &Target, secret: &[u8], body: &[u8]) -> Outcome {
    let headers = headers(secret, body);
    let body = Bytes::copy_from_slice(body);
    // Only the status counts: the receiver's body is not read.
    let status = match backend::post(target, None, &headers, body, REQUEST_TIMEOUT, 0).await {
        Ok(answer) => Some(answer.status),
        Err(error) => {
            tracing::warn!(%error, "hook request failed");
            None
        }
    };
    Outcome::of_status(status)
}

#[cfg(test)]
mod tests;
