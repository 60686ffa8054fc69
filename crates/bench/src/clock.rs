//! The two clocks of the bench.
//!
//! Pacing and timeouts use a monotonic clock (nanoseconds since the
//! worker's start). Timestamps that travel inside messages use the wall
//! clock (CLOCK_REALTIME nanoseconds): it is the one clock every process,
//! and any other client tool, reads the same on one host.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Wall-clock nanoseconds since the Unix epoch.
pub fn realtime_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A worker's time origin: monotonic offsets, and their wall-clock values.
#[derive(Debug, Clone, Copy)]
pub struct Epoch {
    start: Instant,
    start_real_ns: u64,
}

impl Epoch {
    /// Now is zero.
    pub fn now() -> Epoch {
        Epoch {
            start: Instant::now(),
            start_real_ns: realtime_ns(),
        }
    }

    /// Monotonic nanoseconds since the epoch.
    pub fn elapsed_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// The wall-clock time of monotonic offset `ns`: how a due time in a
    /// schedule becomes the timestamp a message carries.
    pub fn real_at(&self, ns: u64) -> u64 {
        self.start_real_ns + ns
    }
}
