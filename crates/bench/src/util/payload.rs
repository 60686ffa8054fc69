//! What publishers send and how subscribers read it back.
//!
//! The published data is a JSON object `{"ts":T,"n":N,"pad":"…"}`: `ts` is
//! the DUE time of the publish event (wall-clock nanoseconds, comparable
//! across processes on one host), `n` the event number, and `pad` random
//! characters that bring the data to the requested size (512 bytes by
//! default, as in seed 001), or, with [`Pad::Words`], words drawn from a
//! small vocabulary: text that compresses about as chat or news text does,
//! for permessage-deflate, where random characters would understate it. A subscriber finds `ts` in the delivered frame
//! with a substring search for the profile's marker, never a JSON parse:
//! reading a delivery must cost the bench far less than sending it costs
//! the server.

use clap::ValueEnum;
use memchr::memmem::Finder;
use serde::{Deserialize, Serialize};

use crate::util::pattern::mix;

/// What fills a message's data up to its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pad {
    /// Random ASCII letters and digits: next to incompressible.
    #[default]
    Random,
    /// Words of a small English vocabulary, space-separated, in random
    /// order: compressible like real text.
    Words,
}

/// The vocabulary of [`Pad::Words`]: common words of short messages.
const WORDS: [&str; 64] = [
    "the",
    "meeting",
    "is",
    "moved",
    "to",
    "room",
    "and",
    "we",
    "will",
    "start",
    "at",
    "three",
    "please",
    "bring",
    "your",
    "laptop",
    "because",
    "projector",
    "broken",
    "again",
    "thanks",
    "for",
    "update",
    "order",
    "shipped",
    "today",
    "price",
    "changed",
    "from",
    "score",
    "now",
    "game",
    "team",
    "won",
    "lost",
    "match",
    "new",
    "message",
    "in",
    "channel",
    "reply",
    "later",
    "weather",
    "rain",
    "expected",
    "this",
    "evening",
    "train",
    "delayed",
    "by",
    "minutes",
    "station",
    "platform",
    "stock",
    "rose",
    "fell",
    "percent",
    "after",
    "report",
    "user",
    "joined",
    "left",
    "the",
    "call",
];

/// What a delivered frame carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// Due time of the publish, wall-clock ns.
    pub ts_ns: u64,
    /// Event number, when the frame has our `"n":` right after the stamp.
    pub n: Option<u64>,
}

/// Size of the random character pool pads are cut from: large enough that
/// consecutive messages differ, small enough to stay in cache.
const POOL: usize = 64 * 1024;

/// Builds publish data of a fixed size.
#[derive(Debug, Clone)]
pub struct PayloadBuilder {
    size: usize,
    pool: Vec<u8>,
}

impl PayloadBuilder {
    /// Data of `size` bytes (or the minimum that holds the stamp, if larger),
    /// padded with `pad` from a pool drawn with `seed`.
    pub fn new(size: usize, pad: Pad, seed: u64) -> PayloadBuilder {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        let mut state = seed;
        let mut draw = |n: usize| {
            state = mix(state);
            (state % n as u64) as usize
        };
        let mut pool = Vec::with_capacity(POOL + size + 16);
        while pool.len() < POOL + size {
            match pad {
                Pad::Random => pool.push(ALPHABET[draw(ALPHABET.len())]),
                Pad::Words => {
                    pool.extend_from_slice(WORDS[draw(WORDS.len())].as_bytes());
                    pool.push(b' ');
                }
            }
        }
        PayloadBuilder { size, pool }
    }

    /// Appends the data JSON for event `n` due at `ts_ns` to `out`.
    pub fn write(&self, ts_ns: u64, n: u64, out: &mut String) {
        use std::fmt::Write;
        let start = out.len();
        // Writing to a String cannot fail.
        let _ = write!(out, "{{\"ts\":{ts_ns},\"n\":{n}");
        const PAD_OPEN: &str = ",\"pad\":\"";
        const PAD_CLOSE: &str = "\"}";
        let used = out.len() - start + PAD_OPEN.len() + PAD_CLOSE.len();
        match self.size.checked_sub(used) {
            Some(pad) => {
                out.push_str(PAD_OPEN);
                let at = (n as usize).wrapping_mul(7919) % POOL;
                // The pool is ASCII letters, digits and spaces, so any
                // slice is UTF-8 and needs no JSON escape.
                out.push_str(std::str::from_utf8(&self.pool[at..at + pad]).unwrap_or_default());
                out.push_str(PAD_CLOSE);
            }
            None => out.push('}'),
        }
    }
}

/// Finds the stamp in delivered frames.
#[derive(Debug, Clone)]
pub struct StampFinder {
    marker: Finder<'static>,
}

impl StampFinder {
    /// A finder for `marker`, the text right before the timestamp digits
    /// (`"ts":` for every shipped profile).
    pub fn new(marker: &str) -> StampFinder {
        StampFinder {
            marker: Finder::new(marker.as_bytes()).into_owned(),
        }
    }

    /// The stamp in `frame`, if it holds the marker followed by digits.
    pub fn find(&self, frame: &[u8]) -> Option<Stamp> {
        let at = self.marker.find(frame)? + self.marker.needle().len();
        let (ts_ns, used) = digits(&frame[at..])?;
        let rest = &frame[at + used..];
        let n = rest
            .strip_prefix(b",\"n\":")
            .and_then(digits)
            .map(|(n, _)| n);
        Some(Stamp { ts_ns, n })
    }
}

/// The unsigned integer at the front of `b` and how many bytes it used.
fn digits(b: &[u8]) -> Option<(u64, usize)> {
    let len = b.iter().take_while(|c| c.is_ascii_digit()).count();
    if len == 0 || len > 19 {
        return None;
    }
    let value = b[..len]
        .iter()
        .fold(0u64, |v, &c| v * 10 + u64::from(c - b'0'));
    Some((value, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_has_the_requested_size_and_is_json() {
        let b = PayloadBuilder::new(512, Pad::Random, 1);
        for n in [0u64, 9, 123_456_789] {
            let mut s = String::new();
            b.write(1_700_000_000_123_456_789, n, &mut s);
            assert_eq!(s.len(), 512);
            let v: serde_json::Value = serde_json::from_str(&s).unwrap();
            assert_eq!(v["n"], n);
        }
        // Too small for a pad: the stamp alone.
        let mut s = String::new();
        PayloadBuilder::new(10, Pad::Random, 1).write(5, 6, &mut s);
        assert_eq!(s, r#"{"ts":5,"n":6}"#);
    }

    #[test]
    fn word_padding_is_json_text_that_compresses() {
        let b = PayloadBuilder::new(512, Pad::Words, 1);
        let mut s = String::new();
        b.write(1_700_000_000_123_456_789, 4, &mut s);
        assert_eq!(s.len(), 512);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        let pad = v["pad"].as_str().unwrap();
        assert!(
            pad.split(' ').filter(|w| !w.is_empty()).count() > 50,
            "{pad}"
        );
        // What permessage-deflate makes of each, with the server's codec:
        // words to under 60 % (a message compressed on its own has no
        // earlier text to refer to), random characters barely.
        let deflated = |text: &str| {
            let mut out = Vec::new();
            myriad_protocol::ws::deflate::Deflater::new(2)
                .compress(text.as_bytes(), &mut out)
                .map_or(text.len(), |len| len)
        };
        let mut random = String::new();
        PayloadBuilder::new(512, Pad::Random, 1).write(1, 4, &mut random);
        assert!(deflated(&s) * 10 < s.len() * 6, "words: {}", deflated(&s));
        assert!(
            deflated(&random) * 4 > random.len() * 3,
            "random: {}",
            deflated(&random)
        );
    }

    #[test]
    fn finds_the_stamp_in_a_delivery() {
        let f = StampFinder::new("\"ts\":");
        let mut data = String::new();
        PayloadBuilder::new(100, Pad::Random, 2).write(1_700_000_000_000_000_042, 77, &mut data);
        let frame = format!(r#"{{"op":"msg","subject":"/p/s1","seq":3,"data":{data}}}"#);
        assert_eq!(
            f.find(frame.as_bytes()),
            Some(Stamp {
                ts_ns: 1_700_000_000_000_000_042,
                n: Some(77)
            })
        );
        assert_eq!(f.find(br#"{"op":"ok","id":1}"#), None);
        assert_eq!(f.find(br#"{"ts":12}"#), Some(Stamp { ts_ns: 12, n: None }));
        assert_eq!(f.find(br#"{"ts":"x"}"#), None);
    }
}
