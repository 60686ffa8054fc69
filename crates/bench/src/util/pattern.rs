//! Subject patterns and who subscribes to what.
//!
//! A pattern names a set of subjects the way MigratoryData's Benchsub does:
//! a literal (`bcast`) or one numeric range (`/p/s{1..1000}` is `/p/s1` …
//! `/p/s1000`). Subjects are addressed by index (0-based) so that workers in
//! different processes, and the coordinator replaying them, agree on every
//! choice without exchanging subject lists. This module owns that agreement:
//! which subjects connection `i` subscribes to ([`Assignment`]) and which
//! subject publish event `n` goes to ([`publish_subject`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Why a pattern string was rejected.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PatternError {
    /// The empty string names no subject.
    #[error("empty subject pattern")]
    Empty,
    /// A `{` without its `}`, or a `}` alone.
    #[error("unbalanced braces in pattern {0:?}")]
    Unbalanced(String),
    /// More than one `{lo..hi}` group; ranges do not nest or multiply.
    #[error("pattern {0:?} has more than one {{lo..hi}} range")]
    TooManyRanges(String),
    /// The braces did not hold `lo..hi` with integers lo <= hi.
    #[error("pattern {0:?}: the range must be {{lo..hi}} with integers lo <= hi")]
    BadRange(String),
    /// A subject count that is zero or does not fit.
    #[error("{0:?}: a subject count must be from 1 to 2^64-1")]
    BadCount(String),
}

/// A set of subjects: `prefix` + each integer of `range` + `suffix`, or just
/// `prefix` when there is no range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Pattern {
    prefix: String,
    /// Inclusive bounds.
    range: Option<(u64, u64)>,
    suffix: String,
}

impl Pattern {
    /// `/p/s{1..n}` (n at least 1): n subjects with the bench's default names.
    pub fn numbered(n: u64) -> Pattern {
        Pattern {
            prefix: "/p/s".to_owned(),
            range: Some((1, n.max(1))),
            suffix: String::new(),
        }
    }

    /// A command-line subject set: a count `N` for [`numbered`](Self::numbered)
    /// subjects, or a pattern.
    pub fn parse_set(s: &str) -> Result<Pattern, PatternError> {
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            return match s.parse::<u64>() {
                Ok(n) if n > 0 => Ok(Pattern::numbered(n)),
                _ => Err(PatternError::BadCount(s.to_owned())),
            };
        }
        s.parse()
    }

    /// How many subjects the pattern names (at least 1).
    pub fn len(&self) -> u64 {
        match self.range {
            Some((lo, hi)) => hi - lo + 1,
            None => 1,
        }
    }

    /// Always false: a pattern names at least one subject. Present because
    /// a `len` without `is_empty` surprises readers (and clippy).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Appends subject number `index` (0-based, taken modulo [`len`](Self::len)) to `out`.
    pub fn write_subject(&self, index: u64, out: &mut String) {
        use std::fmt::Write;
        out.push_str(&self.prefix);
        if let Some((lo, _)) = self.range {
            // Writing to a String cannot fail.
            let _ = write!(out, "{}", lo + index % self.len());
        }
        out.push_str(&self.suffix);
    }

    /// Subject number `index` as an owned string.
    pub fn subject(&self, index: u64) -> String {
        let mut s = String::with_capacity(self.prefix.len() + self.suffix.len() + 20);
        self.write_subject(index, &mut s);
        s
    }

    /// The index of subject `name`, the inverse of
    /// [`write_subject`](Self::write_subject): how a reply or delivery that
    /// names its subject is matched to a subscription without rendering
    /// every candidate. None for a name the pattern does not produce.
    pub fn index_of(&self, name: &str) -> Option<u64> {
        let number = name
            .strip_prefix(self.prefix.as_str())?
            .strip_suffix(self.suffix.as_str())?;
        let Some((lo, hi)) = self.range else {
            return number.is_empty().then_some(0);
        };
        // Only the digits write_subject writes: no sign, no leading zero.
        let canonical = !number.is_empty()
            && number.bytes().all(|b| b.is_ascii_digit())
            && (number == "0" || !number.starts_with('0'));
        let n: u64 = number.parse().ok().filter(|_| canonical)?;
        (lo..=hi).contains(&n).then(|| n - lo)
    }
}

impl FromStr for Pattern {
    type Err = PatternError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err(PatternError::Empty);
        }
        let unbalanced = || PatternError::Unbalanced(s.to_owned());
        let Some(open) = s.find('{') else {
            if s.contains('}') {
                return Err(unbalanced());
            }
            return Ok(Pattern {
                prefix: s.to_owned(),
                range: None,
                suffix: String::new(),
            });
        };
        let close = s[open..]
            .find('}')
            .map(|i| open + i)
            .ok_or_else(unbalanced)?;
        let (prefix, inner, suffix) = (&s[..open], &s[open + 1..close], &s[close + 1..]);
        if prefix.contains('}') {
            return Err(unbalanced());
        }
        if suffix.contains('{') {
            return Err(PatternError::TooManyRanges(s.to_owned()));
        }
        if suffix.contains('}') {
            return Err(unbalanced());
        }
        let bad = || PatternError::BadRange(s.to_owned());
        let (lo, hi) = inner.split_once("..").ok_or_else(bad)?;
        let lo: u64 = lo.trim().parse().map_err(|_| bad())?;
        let hi: u64 = hi.trim().parse().map_err(|_| bad())?;
        if lo > hi {
            return Err(bad());
        }
        Ok(Pattern {
            prefix: prefix.to_owned(),
            range: Some((lo, hi)),
            suffix: suffix.to_owned(),
        })
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.range {
            Some((lo, hi)) => write!(f, "{}{{{lo}..{hi}}}{}", self.prefix, self.suffix),
            None => f.write_str(&self.prefix),
        }
    }
}

impl TryFrom<String> for Pattern {
    type Error = PatternError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Pattern> for String {
    fn from(p: Pattern) -> String {
        p.to_string()
    }
}

/// How connections pick their subjects from a pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum AssignMode {
    /// Connection i takes subjects i·k … i·k+k−1 (mod M): with k = 1 and
    /// M = N, one distinct subject per connection, as in seed 001.
    OneToOne,
    /// Each connection takes k distinct subjects drawn at random out of M.
    Random,
}

/// Which subjects each connection subscribes to: a pure function of the
/// connection's global index, so every process computes it alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// The subjects to draw from.
    pub pattern: Pattern,
    /// Subjects per connection (k).
    pub per_conn: u32,
    /// How they are drawn.
    pub mode: AssignMode,
    /// Seed of the random draws, so runs repeat.
    pub seed: u64,
}

impl Assignment {
    /// Subject indices for connection `conn`, into `out` (cleared first).
    /// Never more than M subjects, never a subject twice.
    pub fn subjects_for(&self, conn: u64, out: &mut Vec<u64>) {
        out.clear();
        let m = self.pattern.len();
        let k = u64::from(self.per_conn).min(m);
        match self.mode {
            AssignMode::OneToOne => {
                let start = conn.wrapping_mul(u64::from(self.per_conn));
                out.extend((0..k).map(|j| start.wrapping_add(j) % m));
            }
            AssignMode::Random => {
                let mut state = mix(self.seed ^ conn.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                while (out.len() as u64) < k {
                    state = mix(state);
                    let pick = state % m;
                    // k is small (a handful of subjects per connection), so
                    // a linear duplicate check beats any set.
                    if !out.contains(&pick) {
                        out.push(pick);
                    }
                }
            }
        }
    }

    /// How many of connections `0..conns` subscribe to each subject index:
    /// the coordinator's side of the agreement, used to compute how many
    /// deliveries a run must see.
    pub fn subscriber_counts(&self, conns: u64) -> Vec<u32> {
        let mut counts = vec![0u32; self.pattern.len() as usize];
        let mut subjects = Vec::new();
        for conn in 0..conns {
            self.subjects_for(conn, &mut subjects);
            for &s in &subjects {
                counts[s as usize] += 1;
            }
        }
        counts
    }
}

/// How publishers pick the subject of each message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum PublishOrder {
    /// Uniformly at random (Benchpub's choice).
    Random,
    /// Event n goes to subject n mod M.
    Sequential,
}

/// The subject index of publish event `n`: stateless, so the coordinator can
/// replay exactly what every publisher process chose.
pub fn publish_subject(order: PublishOrder, seed: u64, n: u64, subjects: u64) -> u64 {
    match order {
        PublishOrder::Sequential => n % subjects,
        PublishOrder::Random => mix(seed ^ n.wrapping_mul(0xD1B5_4A32_D192_ED03)) % subjects,
    }
}

/// SplitMix64's finaliser: a cheap, well-spread hash of a 64-bit value, the
/// one source of repeatable pseudo-randomness in subject choice.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ranges_and_literals() {
        let p: Pattern = "/p/s{1..1000}".parse().unwrap();
        assert_eq!(p.len(), 1000);
        assert_eq!(p.subject(0), "/p/s1");
        assert_eq!(p.subject(999), "/p/s1000");
        assert_eq!(p.subject(1000), "/p/s1", "indices wrap");
        let p: Pattern = "/p/s{5..6}/-".parse().unwrap();
        assert_eq!(
            (p.subject(0), p.subject(1)),
            ("/p/s5/-".into(), "/p/s6/-".into())
        );
        let p: Pattern = "bcast".parse().unwrap();
        assert_eq!((p.len(), p.subject(7)), (1, "bcast".into()));
        assert_eq!(p.to_string(), "bcast");
        assert_eq!(
            "/p/s{1..9}".parse::<Pattern>().unwrap().to_string(),
            "/p/s{1..9}"
        );
    }

    #[test]
    fn a_set_is_a_count_or_a_pattern() {
        let p = Pattern::parse_set("1000").unwrap();
        assert_eq!(p.to_string(), "/p/s{1..1000}");
        assert_eq!(p, Pattern::numbered(1000));
        assert_eq!(Pattern::parse_set("/c/{1..3}").unwrap().len(), 3);
        assert_eq!(Pattern::parse_set("news").unwrap().to_string(), "news");
        assert!(matches!(
            Pattern::parse_set("0"),
            Err(PatternError::BadCount(_))
        ));
        assert!(matches!(
            Pattern::parse_set("99999999999999999999"),
            Err(PatternError::BadCount(_))
        ));
        assert_eq!(Pattern::parse_set(""), Err(PatternError::Empty));
    }

    #[test]
    fn names_map_back_to_their_index() {
        for text in ["/p/s{1..1000}", "a{0..20}5", "{7..9}", "bcast"] {
            let p: Pattern = text.parse().unwrap();
            for i in 0..p.len() {
                assert_eq!(p.index_of(&p.subject(i)), Some(i), "{text} {i}");
            }
        }
        let p: Pattern = "/p/s{1..1000}".parse().unwrap();
        for foreign in [
            "/p/s0", "/p/s1001", "/p/s", "/p/s01", "/p/s+1", "/q/s1", "/p/s1/", "",
        ] {
            assert_eq!(p.index_of(foreign), None, "{foreign}");
        }
        let p: Pattern = "a{0..20}5".parse().unwrap();
        assert_eq!(p.index_of("a05"), Some(0), "0 is written as 0");
        assert_eq!(p.index_of("a5"), None);
        assert_eq!("bcast".parse::<Pattern>().unwrap().index_of("bcas"), None);
    }

    #[test]
    fn rejects_malformed() {
        assert_eq!("".parse::<Pattern>(), Err(PatternError::Empty));
        assert!(matches!(
            "a{1..2".parse::<Pattern>(),
            Err(PatternError::Unbalanced(_))
        ));
        assert!(matches!(
            "a}".parse::<Pattern>(),
            Err(PatternError::Unbalanced(_))
        ));
        assert!(matches!(
            "a{2..1}".parse::<Pattern>(),
            Err(PatternError::BadRange(_))
        ));
        assert!(matches!(
            "a{x..1}".parse::<Pattern>(),
            Err(PatternError::BadRange(_))
        ));
        assert!(matches!(
            "a{1-3}".parse::<Pattern>(),
            Err(PatternError::BadRange(_))
        ));
        assert!(matches!(
            "a{1..2}b{1..2}".parse::<Pattern>(),
            Err(PatternError::TooManyRanges(_))
        ));
    }

    fn assignment(pattern: &str, per_conn: u32, mode: AssignMode) -> Assignment {
        Assignment {
            pattern: pattern.parse().unwrap(),
            per_conn,
            mode,
            seed: 7,
        }
    }

    #[test]
    fn one_to_one_gives_each_connection_its_own_subject() {
        let a = assignment("/p/s{1..100}", 1, AssignMode::OneToOne);
        let counts = a.subscriber_counts(100);
        assert!(counts.iter().all(|&c| c == 1));
        let mut out = Vec::new();
        a.subjects_for(41, &mut out);
        assert_eq!(a.pattern.subject(out[0]), "/p/s42");
    }

    #[test]
    fn random_draws_distinct_repeatable_subjects() {
        let a = assignment("s{1..50}", 5, AssignMode::Random);
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for conn in 0..200 {
            a.subjects_for(conn, &mut x);
            a.subjects_for(conn, &mut y);
            assert_eq!(x, y, "same connection, same subjects");
            assert_eq!(x.len(), 5);
            let mut sorted = x.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), 5, "no subject twice");
            assert!(x.iter().all(|&s| s < 50));
        }
        assert_eq!(
            a.subscriber_counts(200)
                .iter()
                .map(|&c| u64::from(c))
                .sum::<u64>(),
            1000
        );
        // k larger than M is capped at M.
        let small = assignment("s{1..3}", 9, AssignMode::Random);
        small.subjects_for(0, &mut x);
        assert_eq!(x.len(), 3);
    }

    #[test]
    fn publish_subjects_are_stateless_and_in_range() {
        for n in 0..1000 {
            let s = publish_subject(PublishOrder::Random, 3, n, 17);
            assert!(s < 17);
            assert_eq!(s, publish_subject(PublishOrder::Random, 3, n, 17));
            assert_eq!(publish_subject(PublishOrder::Sequential, 3, n, 17), n % 17);
        }
    }
}
