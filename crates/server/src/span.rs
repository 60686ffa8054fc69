//! [`Span`]: a length of time as settings write it ("90s", "5m",
//! "1h 30m"): history ages, timeouts, stall limits and lingers alike.
//!
//! A leaf: both `config` and `namespace` read settings of this type, so it
//! sits below them and must not name any other module of the crate.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A span of time written the human way ("90s", "5m", "1h 30m"), in flags,
/// the environment and the config file alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span(pub Duration);

impl FromStr for Span {
    type Err = humantime::DurationError;

    fn from_str(s: &str) -> Result<Span, Self::Err> {
        humantime::parse_duration(s).map(Span)
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_zero() {
            return f.write_str("0s");
        }
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl From<Span> for Duration {
    fn from(span: Span) -> Duration {
        span.0
    }
}

impl Serialize for Span {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Span, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}
