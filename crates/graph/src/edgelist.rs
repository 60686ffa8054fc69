//! The edge-list file: the follow graph as text, one edge per line.
//!
//! ```text
//! # comment lines start with '#'; blank lines are skipped
//! 17 3
//! ```
//!
//! Each line is `<follower> <followee>`: two user ids separated by spaces
//! or tabs. It is the shape seed 004 loaded (two ids per line, the first
//! subscribing to the second). A file is read whole before anything is
//! loaded from it, so a file that fails loads nothing, and the error names
//! the line and the reason.

use std::io::{self, BufRead, Write};

use thiserror::Error;

use crate::user::{Edge, UserId, UserIdError};

/// Why an edge-list file could not be read.
#[derive(Debug, Error)]
pub enum EdgeListError {
    #[error("line {line}: {reason}")]
    Malformed { line: u64, reason: LineError },
    #[error("reading the edge list: {0}")]
    Io(#[from] io::Error),
}

/// What is wrong with one line.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LineError {
    #[error("expected two user ids, found {0}")]
    FieldCount(usize),
    #[error("{0}")]
    User(#[from] UserIdError),
    #[error("user {0} follows itself")]
    SelfFollow(UserId),
    #[error("not UTF-8")]
    NotUtf8,
}

/// Parses one line; `None` for blank and comment lines.
pub fn parse_line(line: &[u8]) -> Result<Option<Edge>, LineError> {
    let text = std::str::from_utf8(line).map_err(|_| LineError::NotUtf8)?;
    let text = text.trim();
    if text.is_empty() || text.starts_with('#') {
        return Ok(None);
    }
    let mut fields = text.split_ascii_whitespace();
    let (Some(a), Some(b), None) = (fields.next(), fields.next(), fields.next()) else {
        return Err(LineError::FieldCount(text.split_ascii_whitespace().count()));
    };
    let edge = Edge::new(a.parse()?, b.parse()?);
    if edge.follower == edge.followee {
        return Err(LineError::SelfFollow(edge.follower));
    }
    Ok(Some(edge))
}

/// Reads a whole edge list; the first bad line fails the read.
pub fn read_edges(mut input: impl BufRead) -> Result<Vec<Edge>, EdgeListError> {
    let mut edges = Vec::new();
    let mut line = Vec::with_capacity(64);
    let mut number = 0u64;
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line)? == 0 {
            return Ok(edges);
        }
        number += 1;
        match parse_line(&line) {
            Ok(Some(edge)) => edges.push(edge),
            Ok(None) => {}
            Err(reason) => {
                return Err(EdgeListError::Malformed {
                    line: number,
                    reason,
                })
            }
        }
    }
}

/// Writes one edge as a line.
pub fn write_edge(out: &mut impl Write, edge: Edge) -> io::Result<()> {
    writeln!(out, "{} {}", edge.follower, edge.followee)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edge(a: u64, b: u64) -> Edge {
        Edge::new(UserId::new(a).unwrap(), UserId::new(b).unwrap())
    }

    #[test]
    fn lines_parse_with_comments_blanks_and_either_separator() {
        let text = b"# a graph\n1 2\n\n  3\t4  \r\n5 1\n";
        assert_eq!(
            read_edges(&text[..]).unwrap(),
            vec![edge(1, 2), edge(3, 4), edge(5, 1)]
        );
        assert_eq!(read_edges(&b"7 8"[..]).unwrap(), vec![edge(7, 8)]);
    }

    #[test]
    fn a_bad_line_is_named_with_its_reason() {
        let cases: [(&[u8], u64, LineError); 5] = [
            (b"1 2\n3\n", 2, LineError::FieldCount(1)),
            (b"1 2\n3 4 5\n", 2, LineError::FieldCount(3)),
            (
                b"# x\n1 1\n",
                2,
                LineError::SelfFollow(UserId::new(1).unwrap()),
            ),
            (
                b"1 2\n\n1 x\n",
                3,
                LineError::User(UserIdError::NotANumber("x".into())),
            ),
            (b"1 \xff\n", 1, LineError::NotUtf8),
        ];
        for (text, at, why) in cases {
            match read_edges(text) {
                Err(EdgeListError::Malformed { line, reason }) => {
                    assert_eq!((line, reason), (at, why));
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
        let out_of_range = read_edges(&b"1 9007199254740992\n"[..]).unwrap_err();
        assert_eq!(
            out_of_range.to_string(),
            "line 1: user id 9007199254740992 is out of range (0 to 9007199254740991)"
        );
    }

    #[test]
    fn written_edges_read_back() {
        let edges = vec![edge(1, 2), edge(9_007_199_254_740_991, 0)];
        let mut out = Vec::new();
        for &e in &edges {
            write_edge(&mut out, e).unwrap();
        }
        assert_eq!(read_edges(&out[..]).unwrap(), edges);
    }
}
