//! Stream positions: where a publication sits in its subject's stream.
//!
//! A position is an `epoch` and an `offset`. The offset counts publishes to
//! one subject: it grows by exactly one per publish and never goes back
//! within an epoch. The epoch names one unbroken run of offsets; whoever
//! assigns positions picks a new epoch whenever it cannot promise that the
//! offsets continue what came before (a node restarted and lost its
//! in-memory history, or a subject's state was forgotten). A client that sees
//! a different epoch for a subject knows it may have missed messages.
//!
//! On the wire the epoch is an opaque string (16 lowercase hex digits, so
//! it survives JavaScript, whose numbers cannot hold a `u64`) and the offset
//! a JSON number.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserializer};
use serde::Deserialize;
use thiserror::Error;

/// Width of an epoch on the wire.
pub const EPOCH_LEN: usize = 16;

/// One unbroken run of a subject's offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Epoch(pub u64);

/// Why an epoch string was refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("epoch must be {EPOCH_LEN} lowercase hex digits, got {0:?}")]
pub struct EpochError(pub String);

impl Epoch {
    /// Appends the 16 hex digits, without going through `fmt` (this runs
    /// once per publication, on the publish path).
    pub fn write_hex(self, out: &mut Vec<u8>) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut digits = [0u8; EPOCH_LEN];
        for (i, digit) in digits.iter_mut().enumerate() {
            let shift = 4 * (EPOCH_LEN - 1 - i);
            *digit = DIGITS[((self.0 >> shift) & 0xf) as usize];
        }
        out.extend_from_slice(&digits);
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl FromStr for Epoch {
    type Err = EpochError;

    fn from_str(s: &str) -> Result<Epoch, EpochError> {
        let well_formed = s.len() == EPOCH_LEN
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !well_formed {
            return Err(EpochError(s.to_owned()));
        }
        u64::from_str_radix(s, 16)
            .map(Epoch)
            .map_err(|_| EpochError(s.to_owned()))
    }
}

impl<'de> Deserialize<'de> for Epoch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Epoch, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

/// Where a publication sits in its subject's stream. Offset 0 is "before
/// the first publish": a subject nobody has published to yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
pub struct Position {
    pub epoch: Epoch,
    pub offset: u64,
}

impl Position {
    pub fn new(epoch: Epoch, offset: u64) -> Position {
        Position { epoch, offset }
    }

    /// `{"epoch":"…","offset":N}`.
    pub fn to_json(self) -> String {
        format!(
            "{{\"epoch\":\"{}\",\"offset\":{}}}",
            self.epoch, self.offset
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn epochs_are_fixed_width_hex() {
        assert_eq!(Epoch(0xab).to_string(), "00000000000000ab");
        assert_eq!("00000000000000ab".parse::<Epoch>().unwrap(), Epoch(0xab));
        for bad in [
            "",
            "ab",
            "00000000000000AB",
            "0000000000000g00",
            "00000000000000ab0",
        ] {
            assert!(bad.parse::<Epoch>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_position_reads_back_from_its_json() {
        let p = Position::new(Epoch(u64::MAX), 42);
        let back: Position = serde_json::from_str(&p.to_json()).unwrap();
        assert_eq!(back, p);
        assert!(serde_json::from_str::<Position>(r#"{"epoch":1,"offset":2}"#).is_err());
        assert!(serde_json::from_str::<Position>(r#"{"epoch":"x","offset":2}"#).is_err());
    }

    proptest! {
        #[test]
        fn every_epoch_round_trips(e in any::<u64>()) {
            prop_assert_eq!(Epoch(e).to_string().parse::<Epoch>().unwrap(), Epoch(e));
            let mut hex = Vec::new();
            Epoch(e).write_hex(&mut hex);
            prop_assert_eq!(hex, Epoch(e).to_string().into_bytes());
        }
    }
}
