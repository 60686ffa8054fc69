//! The subscribing connections every receiving workload holds (Benchsub,
//! seed 001): N long-lived connections, each subscribed to its subjects,
//! timing every delivery against the timestamp it carries.
//!
//! [`SubscribeDriver`] opens its slice of the connection indices with a
//! bounded number of handshakes in flight, retries failed set-ups (each
//! on the next target, so that a node that is gone is left behind), then
//! holds the connections and records the latency of every delivery in an
//! HDR histogram (and, for broadcast, which message reached how many
//! subscribers and how late the last one was). It is the worker side of
//! `subscribers`, `broadcast` and `run` as it stands, and the base that
//! `workloads/churn.rs` and `workloads/social.rs` build on through
//! [`OnSubscribers`]; it sits below the workloads so that no workload
//! imports another. Knows nothing of the coordinator.

use std::collections::HashMap;

use crate::schema::{BroadcastTally, Spec, SubscribeTask, SubscribeTransport, SETUP_ATTEMPTS};
use crate::util::clock::Extent;
use crate::util::counters::{Counters, Failure};
use crate::util::error::BenchError;
use crate::util::histogram::{self, Micros};
use crate::util::payload::StampFinder;
use crate::util::profile::{Template, Values};
use crate::worker::client_conn::{Ending, Handler, Opening, Wire};
use crate::worker::driver::{Driver, DriverResult};
use crate::worker::reactor::Reactor;

/// The worker side of subscribers.
pub struct SubscribeDriver {
    task: SubscribeTask,
    subscribe: Option<Template>,
    stamps: StampFinder,
    /// Next position in `0..count` to open.
    next: u64,
    /// Indices whose set-up failed and are due another try.
    retry: Vec<u32>,
    /// Set-up attempts so far of indices that failed at least once.
    attempts: HashMap<u32, u8>,
    /// Targets the run has (`--url`s).
    targets: usize,
    /// How many targets on from its first each index that moved is: it
    /// opens there next (see `util::addr::route`). Absent: on its first.
    hops: HashMap<u32, u32>,
    /// Monotonic ns of the first connect, for --connect-rate.
    first_ns: Option<u64>,
    /// connect() calls made, for --connect-rate.
    opens: u64,
    latency: Micros,
    interval: Micros,
    tally: Option<BroadcastTally>,
    /// When the first and last delivery arrived.
    received: Option<Extent>,
    /// Monotonic ns of the start signal.
    started_ns: Option<u64>,
    stopped: bool,
    /// Connections still owed answers (by a workload built on these) before
    /// they count as set up: the worker is ready only at zero.
    unsettled: usize,
    /// Scratch for subject choice and rendering.
    subject_ids: Vec<u64>,
    subject_names: Vec<String>,
}

impl SubscribeDriver {
    /// A driver for `task` under `spec`'s profile.
    pub fn new(task: SubscribeTask, spec: &Spec) -> Result<SubscribeDriver, BenchError> {
        let subscribe = match (&task.assignment, &spec.profile.subscribe) {
            (Some(_), Some(t)) => Some(Template::compile("subscribe", t)?),
            _ => None,
        };
        let tally = task.broadcast_messages.map(|k| BroadcastTally {
            count: vec![0; k as usize],
            max_us: vec![0; k as usize],
        });
        Ok(SubscribeDriver {
            subscribe,
            stamps: StampFinder::new(&spec.profile.timestamp_marker),
            next: 0,
            retry: Vec::new(),
            attempts: HashMap::new(),
            targets: spec.targets.len(),
            hops: HashMap::new(),
            first_ns: None,
            opens: 0,
            latency: histogram::new(),
            interval: histogram::new(),
            tally,
            received: None,
            started_ns: None,
            stopped: false,
            unsettled: 0,
            subject_ids: Vec::new(),
            subject_names: Vec::new(),
            task,
        })
    }

    /// A set-up failed, or a set-up connection was lost: try again later
    /// on the next target, or give up after a few attempts.
    fn setup_failed(&mut self, index: u32) {
        let tries = self.attempts.entry(index).or_insert(0);
        *tries += 1;
        if *tries < SETUP_ATTEMPTS {
            self.retry.push(index);
        }
        self.move_on(index);
    }

    /// Connection `index` opens on the next target from now on.
    pub(super) fn move_on(&mut self, index: u32) {
        if self.targets > 1 {
            let hop = self.hops.entry(index).or_insert(0);
            *hop = hop.wrapping_add(1);
        }
    }

    /// How many targets on from its first connection `index` opens.
    pub(super) fn hop(&self, index: u32) -> u32 {
        self.hops.get(&index).copied().unwrap_or(0)
    }

    /// Opens connection `index` where it stands (its first target, or as
    /// far on as it moved); a failure is counted by the reactor.
    pub(super) fn open(&mut self, reactor: &mut Reactor, index: u32) -> Result<usize, Failure> {
        let hop = self.hop(index);
        reactor.open_moved(index, hop, Wire::from(self.task.transport))
    }

    /// Connection `index` ended before it was set up, or was lost: set it
    /// up again later, unless the worker is stopping.
    pub(super) fn retry_later(&mut self, index: u32) {
        if !self.stopped {
            self.setup_failed(index);
        }
    }

    /// Connection `index` is set up again: the next failure starts a fresh
    /// count of attempts (a churning subscriber sets up many times).
    pub(super) fn set_up(&mut self, index: u32) {
        self.attempts.remove(&index);
    }

    /// Position in `first..first + count` of global connection `index`,
    /// if it is this worker's.
    pub fn local(&self, index: u32) -> Option<usize> {
        let i = u64::from(index).checked_sub(self.task.first)?;
        (i < self.task.count).then_some(i as usize)
    }

    /// A connection owed `before` answers is now owed `now`: while any is
    /// owed one, the worker is not ready.
    pub fn owe(&mut self, before: u32, now: u32) {
        match (before > 0, now > 0) {
            (false, true) => self.unsettled += 1,
            (true, false) => self.unsettled -= 1,
            _ => {}
        }
    }

    /// Connections still owed answers.
    pub fn unsettled(&self) -> usize {
        self.unsettled
    }

    /// Monotonic ns of the start signal, from then until stopped.
    pub fn started(&self) -> Option<u64> {
        self.started_ns.filter(|_| !self.stopped)
    }

    /// Whether --connect-rate allows another connect() now.
    fn rate_allows(&mut self, now: u64) -> bool {
        if self.task.connect_rate <= 0.0 {
            return true;
        }
        let t0 = *self.first_ns.get_or_insert(now);
        let allowed = ((now - t0) as f64 / 1e9 * self.task.connect_rate) as u64 + 1;
        self.opens < allowed
    }
}

impl Handler for SubscribeDriver {
    fn on_open(&mut self, _key: usize, index: u32, _now_ns: u64, out: &mut Opening) {
        // Over an HTTP transport the request subscribes, live from now.
        let ws = self.task.transport == SubscribeTransport::Ws;
        let (Some(tpl), Some(a), true) = (&self.subscribe, &self.task.assignment, ws) else {
            return;
        };
        a.subjects_for(u64::from(index), &mut self.subject_ids);
        self.subject_names.clear();
        self.subject_names
            .extend(self.subject_ids.iter().map(|&s| a.pattern.subject(s)));
        tpl.render(
            &Values {
                subjects: &self.subject_names,
                data: "",
                id: 1,
            },
            out.message(),
        );
    }

    fn on_message(&mut self, _index: u32, data: &[u8], now_real: u64, _: &mut Counters) -> bool {
        let Some(stamp) = self.stamps.find(data) else {
            return false;
        };
        // A stamp from the future (clock adjusted mid-run) counts as 0.
        let us = now_real.saturating_sub(stamp.ts_ns) / 1000;
        Extent::extend(&mut self.received, now_real);
        histogram::record(&mut self.latency, us);
        histogram::record(&mut self.interval, us);
        if let (Some(t), Some(n)) = (&mut self.tally, stamp.n) {
            if let Some(c) = t.count.get_mut(n as usize) {
                *c += 1;
                t.max_us[n as usize] = t.max_us[n as usize].max(us);
            }
        }
        true
    }

    fn on_raw(&mut self, _: u32, _: &[u8], _: u64, _: &mut Counters) -> usize {
        0
    }

    fn on_closed(&mut self, _: usize, index: u32, _: Ending, was_open: bool, _: &mut Counters) {
        if !was_open {
            self.retry_later(index);
        }
    }
}

impl Driver for SubscribeDriver {
    fn tick(&mut self, reactor: &mut Reactor) -> Option<u64> {
        if self.stopped {
            return None;
        }
        let now = reactor.refresh_now();
        while reactor.in_setup() < self.task.in_flight as usize
            && (self.next < self.task.count || !self.retry.is_empty())
        {
            if !self.rate_allows(now) {
                // The next connect is allowed one rate-period later.
                return Some(now + (1e9 / self.task.connect_rate) as u64);
            }
            let index = match self.retry.pop() {
                Some(i) => i,
                None => {
                    self.next += 1;
                    (self.task.first + self.next - 1) as u32
                }
            };
            self.opens += 1;
            if self.open(reactor, index).is_err() {
                self.setup_failed(index);
            }
        }
        None
    }

    fn start(&mut self, reactor: &mut Reactor) {
        self.started_ns = Some(reactor.refresh_now());
    }

    fn stop(&mut self, _reactor: &mut Reactor) {
        self.stopped = true;
    }

    fn is_ready(&self, reactor: &Reactor) -> bool {
        self.next == self.task.count
            && self.retry.is_empty()
            && reactor.in_setup() == 0
            && self.unsettled == 0
    }

    fn is_done(&self, _reactor: &Reactor) -> bool {
        self.stopped
    }

    fn take_interval(&mut self) -> Option<Micros> {
        let fresh = histogram::new();
        Some(std::mem::replace(&mut self.interval, fresh))
    }

    fn finish(self) -> DriverResult {
        DriverResult {
            latency: Some(self.latency),
            broadcast: self.tally,
            received: self.received,
            ..DriverResult::default()
        }
    }
}

/// A workload that is these subscribing connections plus work of its own
/// once the run starts (churn's reconnects, social's sends). The set-up,
/// readiness, stop and delivery latency stay the connections'; the blanket
/// impl below makes every such workload a [`Driver`], so none repeats
/// that part.
pub trait OnSubscribers: Handler {
    /// The connections it builds on.
    fn base(&self) -> &SubscribeDriver;
    /// The same, to change.
    fn base_mut(&mut self) -> &mut SubscribeDriver;
    /// Does its own work due by monotonic `now`, the run having started at
    /// `start`; returns when it next has some.
    fn due(&mut self, reactor: &mut Reactor, start: u64, now: u64) -> Option<u64>;
    /// As [`Driver::precise`].
    fn paced(&self) -> bool {
        false
    }
    /// The final report: the connections' part and its own.
    fn report(self) -> DriverResult;
}

impl<W: OnSubscribers> Driver for W {
    fn tick(&mut self, reactor: &mut Reactor) -> Option<u64> {
        let setup = self.base_mut().tick(reactor);
        let Some(start) = self.base().started() else {
            return setup;
        };
        let now = reactor.refresh_now();
        earliest(setup, self.due(reactor, start, now))
    }

    fn start(&mut self, reactor: &mut Reactor) {
        self.base_mut().start(reactor);
    }

    fn stop(&mut self, reactor: &mut Reactor) {
        self.base_mut().stop(reactor);
    }

    fn is_ready(&self, reactor: &Reactor) -> bool {
        self.base().is_ready(reactor)
    }

    fn is_done(&self, reactor: &Reactor) -> bool {
        self.base().is_done(reactor)
    }

    fn take_interval(&mut self) -> Option<Micros> {
        self.base_mut().take_interval()
    }

    fn precise(&self) -> bool {
        self.paced()
    }

    fn finish(self) -> DriverResult {
        self.report()
    }
}

/// The earlier of two due times.
pub fn earliest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
