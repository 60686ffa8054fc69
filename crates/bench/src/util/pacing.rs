//! Open-loop arrival schedules: when event `n` is due, fixed before the run.
//!
//! A schedule is a list of phases, each with a linear rate from `start_rate`
//! to `end_rate` (events/s) over its duration: a constant rate, or the
//! ramp-up / sustain / ramp-down of seed 000. Event `n` (0-based) is due at
//! the time `t` where the cumulative count `N(t) = ∫ rate` reaches `n`.
//! Senders fire every event whose due time has passed and stamp it with its
//! DUE time, not the time it was actually sent: a server that stalls the
//! sender then shows up as latency instead of as a quietly lower rate (no
//! coordinated omission). This module is pure math; the event loops own the
//! clock.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One stretch of the schedule with a linearly changing rate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// Length of the phase, seconds.
    pub secs: f64,
    /// Rate at the phase's start, events/s.
    pub start_rate: f64,
    /// Rate at the phase's end, events/s.
    pub end_rate: f64,
}

impl Phase {
    /// Events that fall in the whole phase: the area under the rate line.
    fn events(&self) -> f64 {
        self.secs * (self.start_rate + self.end_rate) / 2.0
    }

    /// Seconds into the phase at which the cumulative count reaches `m`.
    /// Solves `a·t + (b−a)·t²/(2D) = m` in the form `2m / (a + √(a² + 4km))`,
    /// which stays exact when the rate is constant (k = 0) and avoids the
    /// cancellation of the textbook quadratic formula.
    fn time_of(&self, m: f64) -> f64 {
        if m <= 0.0 {
            return 0.0;
        }
        let a = self.start_rate;
        let k = (self.end_rate - self.start_rate) / (2.0 * self.secs);
        let disc = (a * a + 4.0 * k * m).max(0.0);
        let denom = a + disc.sqrt();
        if denom <= 0.0 {
            // Rate zero at the start and no slope: never happens inside a
            // phase that still has events left, but stay finite.
            return self.secs;
        }
        (2.0 * m / denom).min(self.secs)
    }
}

/// An arrival schedule: phases back to back, starting at t = 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// The phases in order.
    pub phases: Vec<Phase>,
}

impl Schedule {
    /// `rate` events/s for `secs` seconds.
    pub fn constant(rate: f64, secs: f64) -> Schedule {
        Schedule {
            phases: vec![Phase {
                secs,
                start_rate: rate,
                end_rate: rate,
            }],
        }
    }

    /// Seed 000's shape: 0 → `peak` over `up`, `peak` for `sustain`, then
    /// `peak` → 0 over `down`. Phases of zero length are left out.
    pub fn ramp(peak: f64, up: f64, sustain: f64, down: f64) -> Schedule {
        let phases = [(up, 0.0, peak), (sustain, peak, peak), (down, peak, 0.0)]
            .into_iter()
            .filter(|&(secs, _, _)| secs > 0.0)
            .map(|(secs, start_rate, end_rate)| Phase {
                secs,
                start_rate,
                end_rate,
            })
            .collect();
        Schedule { phases }
    }

    /// Total length, seconds.
    pub fn secs(&self) -> f64 {
        self.phases.iter().map(|p| p.secs).sum()
    }

    /// How many events the schedule holds: those due strictly before its end.
    pub fn total_events(&self) -> u64 {
        let area: f64 = self.phases.iter().map(Phase::events).sum();
        // Round away float noise first (100.0000000001 is 100 events), then
        // count the events at 0, 1, … below the area.
        let rounded = (area * 1e6).round() / 1e6;
        rounded.ceil() as u64
    }

    /// Seconds from the start at which event `n` (0-based) is due, or None
    /// when the schedule has fewer events.
    pub fn due_secs(&self, n: u64) -> Option<f64> {
        if n >= self.total_events() {
            return None;
        }
        let mut before = 0.0; // events in earlier phases
        let mut start = 0.0; // start time of the current phase
        let n = n as f64;
        for phase in &self.phases {
            let events = phase.events();
            if n < before + events {
                return Some(start + phase.time_of(n - before));
            }
            before += events;
            start += phase.secs;
        }
        // Rounding in total_events admitted an event at the very end.
        Some(start)
    }

    /// [`due_secs`](Self::due_secs) as a Duration.
    pub fn due(&self, n: u64) -> Option<Duration> {
        self.due_secs(n).map(Duration::from_secs_f64)
    }

    /// Index of the phase that time `t` (seconds) falls in.
    pub fn phase_at(&self, t: f64) -> usize {
        let mut end = 0.0;
        for (i, phase) in self.phases.iter().enumerate() {
            end += phase.secs;
            if t < end {
                return i;
            }
        }
        self.phases.len().saturating_sub(1)
    }
}

/// The share of a schedule one of `stride` processes fires: events
/// `offset`, `offset + stride`, … — together the processes fire every event
/// exactly once and each keeps the global timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    /// This process's position, `0..stride`.
    pub offset: u64,
    /// Number of processes sharing the schedule.
    pub stride: u64,
}

impl Share {
    /// The whole schedule, for a single process.
    pub const ALL: Share = Share {
        offset: 0,
        stride: 1,
    };

    /// The k-th event index of this share.
    pub fn event(&self, k: u64) -> u64 {
        self.offset + k * self.stride
    }

    /// How many of events `0..total` fall in this share.
    pub fn len_of(&self, total: u64) -> u64 {
        if total <= self.offset {
            0
        } else {
            (total - self.offset).div_ceil(self.stride)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn constant_rate_is_evenly_spaced() {
        let s = Schedule::constant(1000.0, 2.0);
        assert_eq!(s.total_events(), 2000);
        assert!(close(s.due_secs(0).unwrap(), 0.0));
        assert!(close(s.due_secs(1).unwrap(), 0.001));
        assert!(close(s.due_secs(1999).unwrap(), 1.999));
        assert_eq!(s.due_secs(2000), None);
    }

    #[test]
    fn ramp_follows_the_integral() {
        // 0 → 100/s over 10 s holds 500 events; event m is due at
        // t = sqrt(2·m·10/100) = sqrt(m/5).
        let s = Schedule::ramp(100.0, 10.0, 0.0, 0.0);
        assert_eq!(s.total_events(), 500);
        for m in [1u64, 20, 125, 499] {
            assert!(
                close(s.due_secs(m).unwrap(), (m as f64 / 5.0).sqrt()),
                "m={m}"
            );
        }
    }

    #[test]
    fn up_sustain_down_counts_and_order() {
        let s = Schedule::ramp(200.0, 5.0, 10.0, 5.0);
        assert_eq!(s.total_events(), 500 + 2000 + 500);
        // Due times never go backwards and stay inside the schedule.
        let mut last = 0.0;
        for n in 0..s.total_events() {
            let t = s.due_secs(n).unwrap();
            assert!(t >= last && t <= s.secs(), "n={n} t={t} last={last}");
            last = t;
        }
        // The sustain phase starts at event 500, at t = 5 s, and runs at 200/s.
        assert!(close(s.due_secs(500).unwrap(), 5.0));
        assert!(close(s.due_secs(700).unwrap(), 6.0));
        // Ramp-down mirrors ramp-up: the last of its 500 events comes when
        // one event's worth of area is left, at 5·(1 − √(1/500)) s into it.
        let last_due = 15.0 + 5.0 * (1.0 - (1.0f64 / 500.0).sqrt());
        assert!(close(s.due_secs(2999).unwrap(), last_due));
        assert_eq!(s.phase_at(4.9), 0);
        assert_eq!(s.phase_at(5.0), 1);
        assert_eq!(s.phase_at(19.0), 2);
        assert_eq!(s.phase_at(99.0), 2);
    }

    #[test]
    fn open_loop_count_due_by_any_time() {
        // However late a sender wakes, the number of events due by t is
        // fixed by the schedule, not by how many were sent so far.
        let s = Schedule::constant(250.0, 4.0);
        let due_by = |t: f64| {
            (0..s.total_events())
                .take_while(|&n| s.due_secs(n).unwrap() <= t)
                .count()
        };
        assert_eq!(due_by(0.0), 1);
        assert_eq!(due_by(1.0), 251);
        assert_eq!(due_by(3.996), 1000);
    }

    #[test]
    fn shares_partition_the_events() {
        let total = 103;
        let mut seen = vec![0u8; total];
        for offset in 0..4 {
            let share = Share { offset, stride: 4 };
            let mut k = 0;
            while share.event(k) < total as u64 {
                seen[share.event(k) as usize] += 1;
                k += 1;
            }
            assert_eq!(share.len_of(total as u64), k, "offset {offset}");
        }
        assert!(seen.iter().all(|&c| c == 1));
        assert_eq!(
            Share {
                offset: 5,
                stride: 8
            }
            .len_of(3),
            0
        );
    }
}
