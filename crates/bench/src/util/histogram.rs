//! Latency histograms: recording, shipping between processes, merging.
//!
//! Every latency is recorded in microseconds in an HDR histogram (3
//! significant digits, up to one hour). Workers ship histograms to the
//! coordinator serialized with HdrHistogram's V2 format and base64, and the
//! coordinator adds them: HDR addition is exact, so the merged percentiles
//! are the percentiles of every message in every process, not an average of
//! per-process percentiles.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use hdrhistogram::Histogram;
use serde::Serialize;
use thiserror::Error;

use crate::util::fmt::{fmt_micros, thousands};

/// Largest recordable latency: one hour, in microseconds. Longer values are
/// clamped to it rather than dropped, so counts stay exact.
pub const MAX_MICROS: u64 = 3_600_000_000;

/// Why a shipped histogram could not be used.
#[derive(Debug, Error)]
pub enum HistogramError {
    /// Not base64.
    #[error("histogram is not valid base64: {0}")]
    Base64(#[from] base64::DecodeError),
    /// Base64, but not a V2 histogram.
    #[error("histogram does not deserialize: {0:?}")]
    Deserialize(hdrhistogram::serialization::DeserializeError),
    /// Adding would need a range the target does not cover.
    #[error("histograms do not merge: {0:?}")]
    Merge(hdrhistogram::AdditionError),
}

/// A latency histogram in microseconds.
pub type Micros = Histogram<u64>;

/// An empty latency histogram with the bench's fixed bounds.
pub fn new() -> Micros {
    // Bounds are constants that hdrhistogram accepts; failure is a bug here.
    Histogram::new_with_bounds(1, MAX_MICROS, 3).expect("constant histogram bounds are valid")
}

/// Records `micros`, clamped into range.
pub fn record(h: &mut Micros, micros: u64) {
    h.saturating_record(micros.min(MAX_MICROS));
}

/// V2 serialization, base64: how a histogram crosses a process boundary.
pub fn encode(h: &Micros) -> String {
    let mut bytes = Vec::with_capacity(256);
    // Serializing into a Vec cannot fail for a valid histogram.
    V2Serializer::new()
        .serialize(h, &mut bytes)
        .expect("serializing into memory cannot fail");
    STANDARD.encode(bytes)
}

/// Inverse of [`encode`].
pub fn decode(text: &str) -> Result<Micros, HistogramError> {
    let bytes = STANDARD.decode(text)?;
    Deserializer::new()
        .deserialize(&mut bytes.as_slice())
        .map_err(HistogramError::Deserialize)
}

/// Adds `from` into `into`.
pub fn merge(into: &mut Micros, from: &Micros) -> Result<(), HistogramError> {
    into.add(from).map_err(HistogramError::Merge)
}

/// Decodes `text` and adds it into `into`.
pub fn merge_encoded(into: &mut Micros, text: &str) -> Result<(), HistogramError> {
    merge(into, &decode(text)?)
}

/// The figures a report shows for one histogram, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Summary {
    /// Number of values recorded.
    pub count: u64,
    /// Smallest value.
    pub min_us: u64,
    /// Arithmetic mean.
    pub mean_us: f64,
    /// Standard deviation.
    pub stdev_us: f64,
    /// Median.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 95th percentile.
    pub p95_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Largest value.
    pub max_us: u64,
}

impl Summary {
    /// The column names of [`cells`](Self::cells), for table headers.
    pub const COLUMNS: [&'static str; 9] = [
        "count", "mean", "stdev", "p50", "p90", "p95", "p99", "p99.9", "max",
    ];

    /// The figures as table cells for people, in [`COLUMNS`](Self::COLUMNS) order.
    pub fn cells(&self) -> [String; 9] {
        let f = |v: u64| fmt_micros(v as f64);
        [
            thousands(self.count),
            fmt_micros(self.mean_us),
            fmt_micros(self.stdev_us),
            f(self.p50_us),
            f(self.p90_us),
            f(self.p95_us),
            f(self.p99_us),
            f(self.p999_us),
            f(self.max_us),
        ]
    }
}

/// Summarises `h`; all zero when it is empty.
pub fn summary(h: &Micros) -> Summary {
    if h.is_empty() {
        return Summary::default();
    }
    let q = |q: f64| h.value_at_quantile(q);
    Summary {
        count: h.len(),
        min_us: h.min(),
        mean_us: h.mean(),
        stdev_us: h.stdev(),
        p50_us: q(0.50),
        p90_us: q(0.90),
        p95_us: q(0.95),
        p99_us: q(0.99),
        p999_us: q(0.999),
        max_us: h.max(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_is_exact() {
        let mut h = new();
        for v in [0, 1, 17, 999, 1_000_000, MAX_MICROS + 5] {
            record(&mut h, v);
        }
        let back = decode(&encode(&h)).unwrap();
        assert_eq!(back, h);
        assert_eq!(back.max(), h.max());
        assert_eq!(back.len(), 6);
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(matches!(decode("%%%"), Err(HistogramError::Base64(_))));
        assert!(matches!(
            decode("AAAA"),
            Err(HistogramError::Deserialize(_))
        ));
    }
}
