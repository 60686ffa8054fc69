//! The lifecycle stage: the cluster's view of who is here, between the
//! workers and the delivery task, over a [`Tally`]: the cluster's in
//! Redis with the Redis engine, else the node's own in memory.
//!
//! One thread of its own, fed by a bounded channel (a worker never waits:
//! a full channel drops the signal and counts it; a dropped disconnect
//! leaves its user held by this node until the node dies or restarts),
//! which may wait on the tally's round trips. It turns the workers'
//! signals into this node's transitions (a node-wide [`Lifecycle`]), asks
//! the tally whether each is the cluster's, and hands the delivery task
//! only the events the cluster makes, as [`Signal::Cluster`]:
//! `online`/`occupied` when the tally answers [`Up::First`];
//! `offline`/`vacated` when, `hook_delay` after this node let go of the
//! last holder anywhere, the tally confirms nobody returned. The delay is
//! thus waited here, against the whole cluster, and the delivery task is
//! started with none. Every third of a lease it renews this node's lease,
//! which also lets go a dead node's keys: those confirms are this node's
//! then. A call that fails is made again, in order, at each renewal.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::deliver::Hooks;
use super::event::{EventKind, Key};
use super::lifecycle::{Lifecycle, Signal};
use super::tally::{Tally, TallyError, Up};

/// What the stage has done, for the metrics.
#[derive(Debug, Default)]
pub struct StageCounts {
    /// Pending let-gos cancelled by a return on this node (each a pair of
    /// events never sent).
    pub cancelled: AtomicU64,
    /// Keys of dead nodes this node let go (or whose pending let-go it
    /// took over).
    pub swept: AtomicU64,
    /// Tally calls that failed (its Redis away), each made again at the
    /// next renewals, and calls lost past `capacity` waiting.
    pub failures: AtomicU64,
    /// Calls waiting to be made again.
    pub retrying: AtomicU64,
    /// Signals dropped because the stage's channel was full.
    pub dropped_full: AtomicU64,
    /// Let-gos waiting out the delay for their confirm.
    pub pending: AtomicU64,
}

/// The node's handle on the stage thread.
pub struct Stage {
    signals: SyncSender<Signal>,
    counts: Arc<StageCounts>,
}

/// How the stage runs.
#[derive(Clone, Copy, Debug)]
pub struct StageSettings {
    /// `hook_delay`: how long after the cluster's last holder let go the
    /// stage confirms it.
    pub delay: Duration,
    /// How often the lease is renewed (a third of it).
    pub renew_every: Duration,
    /// Signals the channel holds (`hook_queue`).
    pub capacity: usize,
}

impl Stage {
    /// Starts the stage thread over `tally`, handing events to `hooks`.
    pub fn start(
        tally: Box<dyn Tally>,
        hooks: Hooks,
        settings: StageSettings,
    ) -> std::io::Result<Stage> {
        let (signals, inbox) = mpsc::sync_channel(settings.capacity);
        let counts = Arc::new(StageCounts::default());
        let mut run = Run {
            tally,
            hooks,
            settings,
            node: Lifecycle::new(""),
            owed: VecDeque::new(),
            retrying: VecDeque::new(),
            calls: 0,
            counts: Arc::clone(&counts),
        };
        std::thread::Builder::new()
            .name("myriad-lifecycle".into())
            .spawn(move || run.run(&inbox))?;
        Ok(Stage { signals, counts })
    }

    /// Hands a worker's signal to the stage without waiting.
    pub fn signal(&self, signal: Signal) {
        if let Err(TrySendError::Full(_)) = self.signals.try_send(signal) {
            self.counts.dropped_full.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn counts(&self) -> &StageCounts {
        &self.counts
    }
}

/// A tally call the stage makes, kept to be made again when it fails;
/// `up` and `down` with their call numbers, so that a call made again
/// answers as it did (contract clause 4).
#[derive(Debug)]
enum Op {
    /// The node's first holder of the key (its event kind, to send on
    /// [`Up::First`]).
    Up(Key, EventKind, u64),
    /// The node's last holder of the key is gone.
    Down(Key, u64),
    /// The delay after a let-go is over.
    Confirm(Key, String),
}

/// The stage thread's state.
struct Run {
    tally: Box<dyn Tally>,
    hooks: Hooks,
    settings: StageSettings,
    /// This node's own counts: which signals are its transitions.
    node: Lifecycle,
    /// Confirms this node owes, in due order (the delay is one for all).
    owed: VecDeque<(Instant, Key, String)>,
    /// Calls that failed (the tally's store away), made again in order at
    /// each renewal; while any waits, later calls wait behind it, so a
    /// key's up and down never swap. At most `capacity`; past it a call is
    /// lost (counted in `failures`).
    retrying: VecDeque<Op>,
    /// Numbers this node's `up` and `down` calls.
    calls: u64,
    counts: Arc<StageCounts>,
}

impl Run {
    fn run(&mut self, inbox: &mpsc::Receiver<Signal>) {
        let mut renew_at = Instant::now();
        loop {
            let now = Instant::now();
            if now >= renew_at {
                self.retry();
                self.renew(now);
                renew_at = now + self.settings.renew_every;
            }
            while self.owed.front().is_some_and(|(due, _, _)| *due <= now) {
                let (_, key, generation) = self.owed.pop_front().expect("just seen");
                self.make(Op::Confirm(key, generation));
            }
            self.counts
                .pending
                .store(self.owed.len() as u64, Ordering::Relaxed);
            self.counts
                .retrying
                .store(self.retrying.len() as u64, Ordering::Relaxed);
            let next = self.owed.front().map_or(renew_at, |(due, _, _)| *due);
            match inbox.recv_timeout(next.min(renew_at).saturating_duration_since(now)) {
                Ok(signal) => self.take(signal),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// One worker signal: the tally is asked only at this node's own
    /// transitions.
    fn take(&mut self, signal: Signal) {
        let Some(event) = self.node.apply(signal, 0) else {
            return;
        };
        let key = event.key();
        match event.kind {
            EventKind::Online | EventKind::Occupied => {
                let call = self.call_number();
                self.make(Op::Up(key, event.kind, call));
            }
            EventKind::Offline | EventKind::Vacated => {
                let call = self.call_number();
                self.make(Op::Down(key, call));
            }
            EventKind::Join | EventKind::Leave => {}
        }
    }

    fn call_number(&mut self) -> u64 {
        self.calls += 1;
        self.calls
    }

    /// Makes `op` now, or behind the calls waiting to be made again.
    fn make(&mut self, op: Op) {
        if !self.retrying.is_empty() {
            self.keep(op);
            return;
        }
        if let Err(error) = self.call(&op) {
            self.failed(&error);
            self.keep(op);
        }
    }

    fn keep(&mut self, op: Op) {
        if self.retrying.len() < self.settings.capacity {
            self.retrying.push_back(op);
        } else {
            self.counts.failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(?op, "a lifecycle transition was lost: too many waiting");
        }
    }

    /// Makes again, in order, the calls that failed, up to the first that
    /// fails again.
    fn retry(&mut self) {
        while let Some(op) = self.retrying.pop_front() {
            if let Err(error) = self.call(&op) {
                self.failed(&error);
                self.retrying.push_front(op);
                return;
            }
        }
    }

    /// One tally call, and what it makes this node send or owe.
    fn call(&mut self, op: &Op) -> Result<(), TallyError> {
        match op {
            Op::Up(key, kind, call) => match self.tally.up(key, *call)? {
                Up::First => self.emit(*kind, key.clone()),
                Up::Returned => {
                    self.counts.cancelled.fetch_add(2, Ordering::Relaxed);
                }
                Up::Held => {}
            },
            Op::Down(key, call) => {
                if let Some(generation) = self.tally.down(key, *call)? {
                    let due = Instant::now() + self.settings.delay;
                    self.owed.push_back((due, key.clone(), generation));
                }
            }
            Op::Confirm(key, generation) => {
                if self.tally.confirm(key, generation)? {
                    let kind = match key {
                        Key::User(_) => EventKind::Offline,
                        Key::Subject(_) => EventKind::Vacated,
                    };
                    self.emit(kind, key.clone());
                }
            }
        }
        Ok(())
    }

    fn renew(&mut self, now: Instant) {
        let renewed = match self.tally.renew() {
            Ok(renewed) => renewed,
            Err(error) => return self.failed(&error),
        };
        let swept = renewed.emptied.len() as u64;
        for (key, generation) in renewed.emptied {
            self.owed
                .push_back((now + self.settings.delay, key, generation));
        }
        if swept > 0 {
            self.counts.swept.fetch_add(swept, Ordering::Relaxed);
            tracing::info!(keys = swept, "let go a dead node's users and subjects");
        }
        if renewed.lost {
            // Taken for dead (the others sent these keys' offline and
            // vacated), or the store lost the tally: held again, and
            // `online`/`occupied` sent where this makes them first.
            let held = self.node.held();
            if !held.is_empty() {
                tracing::warn!(
                    keys = held.len(),
                    "this node's lifecycle lease was lost; holding its keys again"
                );
            }
            for key in held {
                let kind = match key {
                    Key::User(_) => EventKind::Online,
                    Key::Subject(_) => EventKind::Occupied,
                };
                let call = self.call_number();
                self.make(Op::Up(key, kind, call));
            }
        }
    }

    fn emit(&self, kind: EventKind, key: Key) {
        self.hooks.signal(Signal::Cluster(kind, key));
    }

    fn failed(&self, error: &TallyError) {
        self.counts.failures.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%error, "a lifecycle tally call failed; made again at the next renewal");
    }
}

#[cfg(test)]
mod tests;
