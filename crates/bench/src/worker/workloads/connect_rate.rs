//! Connection rate (seed 000): virtual devices arrive on a ramp-up /
//! sustain / ramp-down schedule; each connects, upgrades, optionally
//! subscribes, holds for ~1 s ± 5 %, and closes.
//!
//! This worker side ([`ConnectRateDriver`]) fires its share of the arrival
//! schedule open-loop (a slow server makes connects slower, not rarer),
//! keeps one heap of hold deadlines, and counts upgrades per phase. The
//! coordinator side is `coordinator/workloads/connect_rate.rs`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::schema::{CloseMode, ConnectRateTask, Spec};
use crate::util::counters::Counters;
use crate::util::histogram::Micros;
use crate::util::pattern::mix;
use crate::util::profile::{Template, Values};
use crate::worker::client_conn::{Ending, Handler, Opening, Wire};
use crate::worker::driver::{Driver, DriverResult, MAX_BATCH};
use crate::worker::reactor::Reactor;

/// The worker side of connect-rate.
pub struct ConnectRateDriver {
    task: ConnectRateTask,
    subscribe: Option<Template>,
    events: u64,
    started_ns: Option<u64>,
    /// Next position in the share.
    k: u64,
    /// (close at, key, index) of every open device.
    holds: BinaryHeap<Reverse<(u64, usize, u32)>>,
    /// Upgrades completed per schedule phase.
    phase_upgrades: Vec<u64>,
    stopped: bool,
    /// Reused for the subject name.
    subject: Vec<String>,
    /// Reused for expired holds.
    expired: Vec<(usize, u32)>,
}

impl ConnectRateDriver {
    /// A driver for `task` under `spec`'s profile.
    pub fn new(task: ConnectRateTask, spec: &Spec) -> ConnectRateDriver {
        let subscribe = task
            .subscribe
            .as_ref()
            .and(spec.profile.subscribe.as_deref())
            .and_then(|t| Template::compile("subscribe", t).ok());
        ConnectRateDriver {
            subscribe,
            events: task.schedule.total_events(),
            started_ns: None,
            k: 0,
            holds: BinaryHeap::new(),
            phase_upgrades: vec![0; task.schedule.phases.len()],
            stopped: false,
            subject: vec![String::new()],
            expired: Vec::new(),
            task,
        }
    }

    fn share_len(&self) -> u64 {
        self.task.share.len_of(self.events)
    }
}

impl Handler for ConnectRateDriver {
    fn on_open(&mut self, key: usize, index: u32, now_ns: u64, out: &mut Opening) {
        let start = self.started_ns.unwrap_or(now_ns);
        let phase = self.task.schedule.phase_at((now_ns - start) as f64 / 1e9);
        if let Some(p) = self.phase_upgrades.get_mut(phase) {
            *p += 1;
        }
        // Uniform in [-1, 1), fixed per device.
        let u = (mix(u64::from(index)) >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
        let hold = self.task.hold * (1.0 + self.task.jitter * u);
        self.holds
            .push(Reverse((now_ns + (hold.max(0.0) * 1e9) as u64, key, index)));
        if let (Some(tpl), Some(p)) = (&self.subscribe, &self.task.subscribe) {
            self.subject[0].clear();
            p.write_subject(u64::from(index), &mut self.subject[0]);
            tpl.render(
                &Values {
                    subjects: &self.subject,
                    data: "",
                    id: 1,
                },
                out.message(),
            );
        }
    }

    fn on_message(&mut self, _: u32, _: &[u8], _: u64, _: &mut Counters) -> bool {
        false
    }

    fn on_raw(&mut self, _: u32, _: &[u8], _: u64, _: &mut Counters) -> usize {
        0
    }

    fn on_closed(&mut self, _: usize, _: u32, _: Ending, _: bool, _: &mut Counters) {}
}

impl Driver for ConnectRateDriver {
    fn tick(&mut self, reactor: &mut Reactor) -> Option<u64> {
        let now = reactor.refresh_now();
        let start = self.started_ns?;
        if self.stopped {
            return None;
        }
        let mut next = None;
        let share_len = self.share_len();
        let mut batch = 0;
        while self.k < share_len {
            if batch == MAX_BATCH {
                // More are due: come straight back after a look at the sockets.
                next = Some(now);
                break;
            }
            batch += 1;
            let n = self.task.share.event(self.k);
            let due = start + self.task.schedule.due(n).map_or(0, |d| d.as_nanos() as u64);
            if due > now {
                next = Some(due);
                break;
            }
            // A failed open is counted by the reactor; the device is gone.
            let _ = reactor.open(n as u32, Wire::WebSocket);
            self.k += 1;
        }
        while let Some(&Reverse((at, key, index))) = self.holds.peek() {
            if self.expired.len() as u64 == MAX_BATCH {
                next = Some(now);
                break;
            }
            if at > now {
                next = Some(next.map_or(at, |n: u64| n.min(at)));
                break;
            }
            self.holds.pop();
            self.expired.push((key, index));
        }
        let reset = self.task.close == CloseMode::Reset;
        let mut expired = std::mem::take(&mut self.expired);
        for (key, index) in expired.drain(..) {
            reactor.close(key, index, reset, self);
        }
        self.expired = expired;
        next
    }

    fn start(&mut self, reactor: &mut Reactor) {
        self.started_ns = Some(reactor.refresh_now());
    }

    fn stop(&mut self, _reactor: &mut Reactor) {
        self.stopped = true;
    }

    fn is_ready(&self, _reactor: &Reactor) -> bool {
        true
    }

    fn is_done(&self, reactor: &Reactor) -> bool {
        self.stopped
            || (self.started_ns.is_some()
                && self.k >= self.share_len()
                && reactor.open_conns() == 0)
    }

    fn take_interval(&mut self) -> Option<Micros> {
        None
    }

    fn finish(self) -> DriverResult {
        DriverResult {
            phase_upgrades: self.phase_upgrades,
            ..DriverResult::default()
        }
    }
}
