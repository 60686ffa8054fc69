//! The delivery queue: holds `vacated` and `offline` for the delay and
//! cancels them on a quick return, batches ready events by a window and a
//! size, keeps each key's events in order across retries, bounds what it
//! holds, and counts what it sends, retries, cancels and drops.
//!
//! It is driven, not running: the delivery task calls [`Queue::take`] when
//! [`Queue::next_due`] comes, sends the batch, and reports the answer with
//! [`Queue::finish`]. Time comes in as an argument, so the rules are
//! tested here without a clock or a socket.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use super::event::{Event, Key};
use super::settings::HookSettings;

/// What the receiver's answer means for a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx: taken.
    Delivered,
    /// 5xx, 408, 429 or no answer (connection error, timeout): sent again
    /// after a back-off, within the retry bound.
    Retryable,
    /// Any other status: the receiver refused it; not sent again.
    Refused,
}

impl Outcome {
    /// The outcome of an HTTP status, `None` when no answer came.
    pub fn of_status(status: Option<u16>) -> Outcome {
        match status {
            Some(200..=299) => Outcome::Delivered,
            None | Some(408) | Some(429) | Some(500..=599) => Outcome::Retryable,
            Some(_) => Outcome::Refused,
        }
    }
}

/// Events sent in one request, and sent again as they are on a retry
/// (same ids, so the receiver can drop a repeat).
#[derive(Debug)]
pub struct Batch {
    pub events: Vec<Event>,
    /// How many times it was sent before this try.
    pub retries: u32,
    /// When its oldest event became ready to go: the start of its
    /// delivery latency.
    pub ready_since: Instant,
    /// When a retry may go out.
    due: Instant,
}

impl Batch {
    /// The request body: `{"events":[…]}`, the bytes that are signed.
    pub fn body(&self) -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct Body<'a> {
            events: &'a [Event],
        }
        serde_json::to_vec(&Body {
            events: &self.events,
        })
        .expect("events serialize to JSON")
    }
}

/// What the queue has done, for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Events in batches the receiver took.
    pub sent: u64,
    /// Events sent again after a retryable failure (once per retry).
    pub retried: u64,
    /// Events never sent because their opposite came within the delay
    /// (both the held one and the one that cancelled it).
    pub cancelled: u64,
    /// Dropped: the queue was at its bound.
    pub dropped_full: u64,
    /// Dropped: the receiver refused the batch (a 4xx other than 408/429).
    pub dropped_refused: u64,
    /// Dropped: still failing after the retry bound.
    pub dropped_retries: u64,
}

/// An event waiting out `hook_delay`.
#[derive(Debug)]
struct Held {
    event: Event,
    due: Instant,
    /// Arrival order, so events due at the same instant leave in order.
    seq: u64,
}

/// An event ready to be batched.
#[derive(Debug)]
struct Ready {
    event: Event,
    since: Instant,
}

/// See the module header.
#[derive(Debug)]
pub struct Queue {
    settings: HookSettings,
    held: HashMap<Key, Held>,
    ready: VecDeque<Ready>,
    /// Keys with a batch out or waiting to be retried: their later events
    /// wait, so a retry never lands after a newer event of the same key.
    busy: HashSet<Key>,
    retrying: Vec<Batch>,
    /// Events in batches out or waiting to be retried.
    in_batches: usize,
    seq: u64,
    counts: Counts,
}

impl Queue {
    pub fn new(settings: HookSettings) -> Queue {
        Queue {
            settings,
            held: HashMap::new(),
            ready: VecDeque::new(),
            busy: HashSet::new(),
            retrying: Vec::new(),
            in_batches: 0,
            seq: 0,
            counts: Counts::default(),
        }
    }

    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Events held, ready, out or waiting to be retried: the queued gauge,
    /// and what `hook_queue` bounds.
    pub fn queued(&self) -> usize {
        self.held.len() + self.ready.len() + self.in_batches
    }

    /// Takes one event that happened at `now`.
    pub fn push(&mut self, event: Event, now: Instant) {
        let key = event.key();
        if let Some(held) = self.held.get(&key) {
            if event.kind.cancels() == Some(held.event.kind) {
                // A return within the delay: neither event goes out.
                self.held.remove(&key);
                self.counts.cancelled += 2;
                return;
            }
            // Anything else about a held key lands after the held event.
            let held = self.held.remove(&key).expect("held just seen");
            self.enqueue(held.event, now);
        }
        if event.kind.delayed() && !self.settings.delay.is_zero() {
            if self.queued() >= self.settings.queue_bound {
                self.counts.dropped_full += 1;
                return;
            }
            // Held even when its kind is not sent, so that its opposite,
            // which may be sent, is still cancelled by it.
            self.seq += 1;
            let due = now + self.settings.delay;
            let seq = self.seq;
            self.held.insert(key, Held { event, due, seq });
        } else {
            self.enqueue(event, now);
        }
    }

    /// Puts an event among the ready ones, if its kind is sent and the
    /// bound allows.
    fn enqueue(&mut self, event: Event, now: Instant) {
        if !self.settings.events.contains(&event.kind) {
            return;
        }
        if self.queued() >= self.settings.queue_bound {
            self.counts.dropped_full += 1;
            return;
        }
        self.ready.push_back(Ready { event, since: now });
    }

    /// Moves the held events whose delay is over among the ready ones.
    fn release_held(&mut self, now: Instant) {
        let mut due: Vec<(Instant, u64, Key)> = self
            .held
            .iter()
            .filter(|(_, held)| held.due <= now)
            .map(|(key, held)| (held.due, held.seq, key.clone()))
            .collect();
        due.sort_by_key(|(at, seq, _)| (*at, *seq));
        for (at, _, key) in due {
            let held = self.held.remove(&key).expect("held just seen");
            // Out of the bound's count while moved, so it is not dropped
            // for taking its own place.
            if self.settings.events.contains(&held.event.kind) {
                self.ready.push_back(Ready {
                    event: held.event,
                    since: at,
                });
            }
        }
    }

    /// When [`Queue::take`] next has something to give, `None` when the
    /// queue is idle.
    pub fn next_due(&self) -> Option<Instant> {
        let held = self.held.values().map(|held| held.due);
        let retries = self.retrying.iter().map(|batch| batch.due);
        let mut eligible = self
            .ready
            .iter()
            .filter(|ready| !self.busy.contains(&ready.event.key()));
        let ready = eligible.next().map(|first| {
            if 1 + eligible.count() >= self.settings.batch_size {
                first.since
            } else {
                first.since + self.settings.batch_window
            }
        });
        held.chain(retries).chain(ready).min()
    }

    /// The next batch to send at `now`: a retry whose back-off is over
    /// first, else the ready events of keys not busy, once the batch is
    /// full or its oldest event has waited the batch window.
    pub fn take(&mut self, now: Instant) -> Option<Batch> {
        self.release_held(now);
        if let Some(at) = self.retrying.iter().position(|batch| batch.due <= now) {
            return Some(self.retrying.swap_remove(at));
        }
        let size = self.settings.batch_size;
        let mut eligible = self
            .ready
            .iter()
            .filter(|ready| !self.busy.contains(&ready.event.key()));
        let first_since = eligible.next()?.since;
        let full = 1 + eligible.count() >= size;
        if !full && now < first_since + self.settings.batch_window {
            return None;
        }
        let mut events = Vec::with_capacity(size);
        let mut kept = VecDeque::with_capacity(self.ready.len());
        for ready in self.ready.drain(..) {
            let key = ready.event.key();
            // A key already in this batch is not busy yet, so its later
            // events join the batch behind it, in order.
            if events.len() < size && !self.busy.contains(&key) {
                events.push(ready.event);
            } else {
                kept.push_back(ready);
            }
        }
        self.ready = kept;
        for event in &events {
            self.busy.insert(event.key());
        }
        self.in_batches += events.len();
        Some(Batch {
            events,
            retries: 0,
            ready_since: first_since,
            due: now,
        })
    }

    /// Reports how a batch taken from [`Queue::take`] went, at `now`.
    pub fn finish(&mut self, mut batch: Batch, outcome: Outcome, now: Instant) {
        let count = batch.events.len() as u64;
        match outcome {
            Outcome::Retryable if batch.retries < self.settings.retry_bound => {
                batch.retries += 1;
                batch.due = now + self.settings.backoff_before(batch.retries);
                self.counts.retried += count;
                // Its keys stay busy until it is through.
                self.retrying.push(batch);
                return;
            }
            Outcome::Delivered => self.counts.sent += count,
            Outcome::Retryable => self.counts.dropped_retries += count,
            Outcome::Refused => self.counts.dropped_refused += count,
        }
        self.in_batches -= batch.events.len();
        for event in &batch.events {
            self.busy.remove(&event.key());
        }
    }

    /// How long the oldest ready event of a batch waited: the delivery
    /// latency the metrics record once it is delivered.
    pub fn latency(batch: &Batch, now: Instant) -> Duration {
        now.saturating_duration_since(batch.ready_since)
    }
}

#[cfg(test)]
mod tests;
