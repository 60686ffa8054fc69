//! What a shared store says of each change it applies (the contract's
//! clause 6), and the text it says it in.
//!
//! Several nodes share one Redis store; each holds connections whose feeds
//! must follow the graph. So every write script of the store also
//! announces what it applied, numbered from one global sequence in the
//! same script, and every node applies the announcements in that order.
//! This module owns the announcement's shape and its wire text, which the
//! Lua scripts write (`redis_store/lua/keys.lua`, `announce`) and
//! [`Announcement::parse`] reads:
//!
//! - `N f U u1 … uU a1 b1 a2 b2 …`: change `N` made users `u1 … uU` known
//!   and followed the edges `a1 → b1`, … (both ends become known);
//! - `N u a1 b1 …`: change `N` removed those edges;
//! - `N r`: change `N` was a bulk change, too big to announce edge by edge:
//!   read again whatever depends on the graph.
//!
//! Ids are decimal. The batch is announced as it was asked, edges that
//! changed nothing included, so that it costs the script no bookkeeping.

use thiserror::Error;

use crate::user::{Edge, UserId};

/// One change, numbered in the store's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcement {
    /// Its number in the store's one change sequence, from 1.
    pub change: u64,
    pub what: Announced,
}

/// What a change did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Announced {
    /// Users made known, and edges followed (whose ends became known).
    Follow {
        users: Vec<UserId>,
        edges: Vec<Edge>,
    },
    Unfollow {
        edges: Vec<Edge>,
    },
    /// A bulk change: its edges are not listed.
    Reread,
}

/// A user's following list as one read saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The last change the read includes (0 from a store that announces
    /// nothing).
    pub change: u64,
    pub users: Vec<UserId>,
}

/// An announcement that does not read as one.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("a graph change announcement that does not parse: {0}")]
pub struct ParseError(String);

impl Announcement {
    pub fn parse(text: &str) -> Result<Announcement, ParseError> {
        let odd = || ParseError(text.chars().take(80).collect());
        let words: Vec<&str> = text.split_ascii_whitespace().collect();
        let [change, kind, rest @ ..] = words.as_slice() else {
            return Err(odd());
        };
        let change: u64 = change.parse().map_err(|_| odd())?;
        let id = |word: &&str| {
            word.parse::<u64>()
                .ok()
                .and_then(|id| UserId::new(id).ok())
                .ok_or_else(odd)
        };
        let edges = |words: &[&str]| {
            if !words.len().is_multiple_of(2) {
                return Err(odd());
            }
            words
                .chunks_exact(2)
                .map(|pair| Ok(Edge::new(id(&pair[0])?, id(&pair[1])?)))
                .collect::<Result<Vec<Edge>, ParseError>>()
        };
        let what = match *kind {
            "f" => {
                let (count, rest) = rest.split_first().ok_or_else(odd)?;
                let count: usize = count.parse().map_err(|_| odd())?;
                if rest.len() < count {
                    return Err(odd());
                }
                Announced::Follow {
                    users: rest[..count].iter().map(id).collect::<Result<_, _>>()?,
                    edges: edges(&rest[count..])?,
                }
            }
            "u" => Announced::Unfollow {
                edges: edges(rest)?,
            },
            "r" if rest.is_empty() => Announced::Reread,
            _ => return Err(odd()),
        };
        Ok(Announcement { change, what })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(id: u64) -> UserId {
        UserId::new(id).unwrap()
    }

    #[test]
    fn each_kind_reads_back() {
        assert_eq!(
            Announcement::parse("7 f 2 5 6 1 2 3 4").unwrap(),
            Announcement {
                change: 7,
                what: Announced::Follow {
                    users: vec![user(5), user(6)],
                    edges: vec![Edge::new(user(1), user(2)), Edge::new(user(3), user(4))],
                },
            }
        );
        assert_eq!(
            Announcement::parse("8 f 0 1 2").unwrap().what,
            Announced::Follow {
                users: vec![],
                edges: vec![Edge::new(user(1), user(2))],
            }
        );
        assert_eq!(
            Announcement::parse("9 u 1 2").unwrap().what,
            Announced::Unfollow {
                edges: vec![Edge::new(user(1), user(2))],
            }
        );
        assert_eq!(Announcement::parse("10 r").unwrap().what, Announced::Reread);
    }

    #[test]
    fn malformed_announcements_are_refused() {
        for text in [
            "",
            "x f 0",
            "7",
            "7 z",
            "7 f",
            "7 f 2 5",
            "7 u 1",
            "7 u 1 -2",
            "7 r 1",
            "7 f 0 1 x",
        ] {
            assert!(Announcement::parse(text).is_err(), "{text:?}");
        }
    }
}
