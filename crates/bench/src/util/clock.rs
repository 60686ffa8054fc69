//! The two clocks of the bench.
//!
//! Pacing and timeouts use a monotonic clock (nanoseconds since the
//! worker's start). Timestamps that travel inside messages use the wall
//! clock (CLOCK_REALTIME nanoseconds): it is the one clock every process,
//! and any other client tool, reads the same on one host.
//!
//! A worker's zero is its [`Origin`]; "epoch" stays the protocol crate's
//! word for a subject's stream generation. The first and last moment of
//! something is an [`Extent`]; a span in the server is a length of time.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Wall-clock nanoseconds since the Unix epoch.
pub fn realtime_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A worker's time origin: monotonic offsets, and their wall-clock values.
#[derive(Debug, Clone, Copy)]
pub struct Origin {
    start: Instant,
    start_real_ns: u64,
}

impl Origin {
    /// Now is zero.
    pub fn now() -> Origin {
        Origin {
            start: Instant::now(),
            start_real_ns: realtime_ns(),
        }
    }

    /// Monotonic nanoseconds since the origin.
    pub fn elapsed_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// The wall-clock time of monotonic offset `ns`: how a due time in a
    /// schedule becomes the timestamp a message carries.
    pub fn real_at(&self, ns: u64) -> u64 {
        self.start_real_ns + ns
    }
}

/// The first and last moment something happened, wall-clock ns: how rates
/// are taken over the time messages actually flowed, not over a window that
/// also holds set-up and the wait for stragglers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extent {
    /// The first event.
    pub first_ns: u64,
    /// The last event.
    pub last_ns: u64,
}

impl Extent {
    /// Widens `extent` (None: nothing yet) to take in an event at `ns`.
    pub fn extend(extent: &mut Option<Extent>, ns: u64) {
        match extent {
            Some(s) => {
                s.first_ns = s.first_ns.min(ns);
                s.last_ns = s.last_ns.max(ns);
            }
            None => {
                *extent = Some(Extent {
                    first_ns: ns,
                    last_ns: ns,
                })
            }
        }
    }

    /// The extent covering both.
    pub fn union(a: Option<Extent>, b: Option<Extent>) -> Option<Extent> {
        match (a, b) {
            (Some(a), Some(b)) => Some(Extent {
                first_ns: a.first_ns.min(b.first_ns),
                last_ns: a.last_ns.max(b.last_ns),
            }),
            (a, b) => a.or(b),
        }
    }

    /// `count` events per second over the extent; None when it is too short
    /// to divide by (a single event, or all in the same nanosecond).
    pub fn rate(&self, count: u64) -> Option<f64> {
        let secs = self.last_ns.saturating_sub(self.first_ns) as f64 / 1e9;
        (count > 1 && secs > 0.0).then(|| count as f64 / secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_widen_and_merge() {
        let mut s = None;
        Extent::extend(&mut s, 5_000_000_000);
        assert_eq!(s.unwrap().rate(1), None, "one event has no rate");
        Extent::extend(&mut s, 3_000_000_000);
        Extent::extend(&mut s, 4_000_000_000);
        assert_eq!(
            s,
            Some(Extent {
                first_ns: 3_000_000_000,
                last_ns: 5_000_000_000
            })
        );
        assert_eq!(s.unwrap().rate(1000), Some(500.0));
        let other = Some(Extent {
            first_ns: 1_000_000_000,
            last_ns: 2_000_000_000,
        });
        let both = Extent::union(s, other).unwrap();
        assert_eq!(
            (both.first_ns, both.last_ns),
            (1_000_000_000, 5_000_000_000)
        );
        assert_eq!(Extent::union(None, other), other);
    }
}
