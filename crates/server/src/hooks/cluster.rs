//! The lifecycle stage: the cluster's view of who is here, between the
//! workers and the delivery task when nodes share a [`Tally`] (the Redis
//! engine).
//!
//! One thread of its own, fed by a bounded channel (a worker never waits:
//! a full channel drops the signal and counts it; a dropped disconnect
//! leaves its user held by this node until the node dies or restarts),
//! which may wait on the tally's round trips. It turns the workers' signals into this node's
//! transitions (a node-wide [`Lifecycle`], as the delivery task keeps
//! without a cluster), asks the tally whether each is the cluster's, and
//! hands the delivery task only the events the cluster makes, as
//! [`Signal::Cluster`]: `online`/`occupied` when the tally answers
//! [`Up::First`]; `offline`/`vacated` when, `hook_delay` after this node
//! let go of the last holder anywhere, the tally confirms nobody returned.
//! The delay is thus waited here, against the whole cluster, and the
//! delivery task is started with none. Every third of a lease it renews
//! this node's lease, which also lets go a dead node's keys: those
//! confirms are this node's then.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::deliver::Hooks;
use super::event::{EventKind, Key};
use super::lifecycle::{Lifecycle, Signal};
use super::tally::{Tally, Up};

/// What the stage has done, for the metrics.
#[derive(Debug, Default)]
pub struct StageCounts {
    /// Pending let-gos cancelled by a return on this node (each a pair of
    /// events never sent).
    pub cancelled: AtomicU64,
    /// Keys of dead nodes this node let go (or whose pending let-go it
    /// took over).
    pub swept: AtomicU64,
    /// Tally calls that failed (its Redis away): that transition is lost.
    pub failures: AtomicU64,
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

/// The stage thread's state.
struct Run {
    tally: Box<dyn Tally>,
    hooks: Hooks,
    settings: StageSettings,
    /// This node's own counts: which signals are its transitions.
    node: Lifecycle,
    /// Confirms this node owes, in due order (the delay is one for all).
    owed: VecDeque<(Instant, Key, String)>,
    counts: Arc<StageCounts>,
}

impl Run {
    fn run(&mut self, inbox: &mpsc::Receiver<Signal>) {
        let mut renew_at = Instant::now();
        loop {
            let now = Instant::now();
            if now >= renew_at {
                self.renew(now);
                renew_at = now + self.settings.renew_every;
            }
            while self.owed.front().is_some_and(|(due, _, _)| *due <= now) {
                let (_, key, generation) = self.owed.pop_front().expect("just seen");
                self.confirm(&key, &generation);
            }
            self.counts
                .pending
                .store(self.owed.len() as u64, Ordering::Relaxed);
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
            EventKind::Online | EventKind::Occupied => match self.tally.up(&key) {
                Ok(Up::First) => self.emit(event.kind, key),
                Ok(Up::Returned) => {
                    self.counts.cancelled.fetch_add(2, Ordering::Relaxed);
                }
                Ok(Up::Held) => {}
                Err(error) => self.failed(&error),
            },
            EventKind::Offline | EventKind::Vacated => match self.tally.down(&key) {
                Ok(Some(generation)) => self.owe(key, generation),
                Ok(None) => {}
                Err(error) => self.failed(&error),
            },
            EventKind::Join | EventKind::Leave => {}
        }
    }

    fn owe(&mut self, key: Key, generation: String) {
        let due = Instant::now() + self.settings.delay;
        self.owed.push_back((due, key, generation));
    }

    fn confirm(&mut self, key: &Key, generation: &str) {
        match self.tally.confirm(key, generation) {
            Ok(true) => {
                let kind = match key {
                    Key::User(_) => EventKind::Offline,
                    Key::Subject(_) => EventKind::Vacated,
                };
                self.emit(kind, key.clone());
            }
            Ok(false) => {}
            Err(error) => self.failed(&error),
        }
    }

    fn renew(&mut self, now: Instant) {
        match self.tally.renew() {
            Ok(emptied) => {
                let swept = emptied.len() as u64;
                for (key, generation) in emptied {
                    self.owed
                        .push_back((now + self.settings.delay, key, generation));
                }
                if swept > 0 {
                    self.counts.swept.fetch_add(swept, Ordering::Relaxed);
                    tracing::info!(keys = swept, "let go a dead node's users and subjects");
                }
            }
            Err(error) => self.failed(&error),
        }
    }

    fn emit(&self, kind: EventKind, key: Key) {
        self.hooks.signal(Signal::Cluster(kind, key));
    }

    fn failed(&self, error: &super::tally::TallyError) {
        self.counts.failures.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%error, "a lifecycle transition was lost");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooks::tally::MemoryTally;

    /// Two stages on one memory world, their events in two receivers.
    fn two_nodes(delay: Duration) -> [(Stage, tokio::sync::mpsc::Receiver<Signal>); 2] {
        let world = MemoryTally::new("a", Duration::from_secs(15), Arc::new(|| 0));
        let settings = StageSettings {
            delay,
            renew_every: Duration::from_secs(5),
            capacity: 100,
        };
        ["a", "b"].map(|node| {
            let (hooks, events) = Hooks::tap(100);
            let stage = Stage::start(Box::new(world.join(node)), hooks, settings).unwrap();
            (stage, events)
        })
    }

    fn next(events: &mut tokio::sync::mpsc::Receiver<Signal>) -> Signal {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(signal) = events.try_recv() {
                return signal;
            }
            assert!(Instant::now() < deadline, "no event");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn ann() -> String {
        "ann".to_owned()
    }

    #[test]
    fn a_user_on_two_nodes_is_online_once_and_offline_once_after_the_last() {
        let [(a, mut a_events), (b, mut b_events)] = two_nodes(Duration::from_millis(50));
        a.signal(Signal::Connected(ann()));
        assert_eq!(
            next(&mut a_events),
            Signal::Cluster(EventKind::Online, Key::User(ann()))
        );
        b.signal(Signal::Connected(ann()));
        b.signal(Signal::Connected(ann()));
        a.signal(Signal::Disconnected(ann()));
        b.signal(Signal::Disconnected(ann()));
        std::thread::sleep(Duration::from_millis(200));
        assert!(a_events.try_recv().is_err() && b_events.try_recv().is_err());
        b.signal(Signal::Disconnected(ann()));
        assert_eq!(
            next(&mut b_events),
            Signal::Cluster(EventKind::Offline, Key::User(ann()))
        );
        assert!(a_events.try_recv().is_err());
    }

    #[test]
    fn a_return_on_another_node_within_the_delay_sends_nothing() {
        let [(a, mut a_events), (b, mut b_events)] = two_nodes(Duration::from_millis(300));
        a.signal(Signal::Attached("room".into()));
        let room = Key::Subject("room".into());
        assert_eq!(
            next(&mut a_events),
            Signal::Cluster(EventKind::Occupied, room.clone())
        );
        a.signal(Signal::Detached("room".into()));
        // The return must come after the let-go, not before it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while a.counts().pending.load(Ordering::Relaxed) == 0 {
            assert!(Instant::now() < deadline, "a never let go");
            std::thread::sleep(Duration::from_millis(5));
        }
        b.signal(Signal::Attached("room".into()));
        std::thread::sleep(Duration::from_millis(600));
        assert!(a_events.try_recv().is_err() && b_events.try_recv().is_err());
        assert_eq!(b.counts().cancelled.load(Ordering::Relaxed), 2);
        b.signal(Signal::Detached("room".into()));
        assert_eq!(
            next(&mut b_events),
            Signal::Cluster(EventKind::Vacated, room)
        );
    }
}
