//! Cursors: the positions of every subject of one HTTP request, as one
//! string a client can hand back.
//!
//! The HTTP transports take their subjects as a list (`?subject=a&subject=b`)
//! and resume all of them from one value: a Server-Sent Events `id:` (which
//! the browser returns as `Last-Event-ID`), or the `since` of a long-poll or
//! stream. That value is a cursor: one entry per subject, in the order the
//! request listed them, separated by commas. An entry is `epoch:offset`
//! (the epoch as 16 hex digits, see [`crate::position`]), or empty where
//! the client knows no position for that subject yet.
//!
//! `0123456789abcdef:17,,0123456789abcdef:4` names positions for the first
//! and third subjects and none for the second. The form uses no character
//! that a query string or an SSE field would need to escape.

use std::io::Write;
use thiserror::Error;

use crate::position::{Epoch, Position, EPOCH_LEN};

/// The longest entry: a 16-digit epoch, `:`, and an offset of up to 20
/// digits (`u64::MAX`).
pub const MAX_ENTRY_LEN: usize = EPOCH_LEN + 1 + 20;

/// The longest cursor of `subjects` entries. A request that leaves room
/// for it can be resumed whatever positions its subjects reach.
pub fn max_cursor_len(subjects: usize) -> usize {
    (subjects * (MAX_ENTRY_LEN + 1)).saturating_sub(1)
}

/// Why a cursor string was refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CursorError {
    /// An entry is neither empty nor `epoch:offset`.
    #[error("cursor entry {index} is not epoch:offset: {entry:?}")]
    Entry { index: usize, entry: String },
    /// The cursor names more or fewer subjects than the request lists.
    #[error("cursor has {found} entries for {expected} subjects")]
    Length { found: usize, expected: usize },
}

/// Parses a cursor for a request listing `subjects` subjects.
pub fn parse_cursor(text: &str, subjects: usize) -> Result<Vec<Option<Position>>, CursorError> {
    let positions = text
        .split(',')
        .enumerate()
        .map(|(index, entry)| {
            parse_entry(entry).ok_or_else(|| CursorError::Entry {
                index,
                entry: entry.chars().take(64).collect(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if positions.len() != subjects {
        return Err(CursorError::Length {
            found: positions.len(),
            expected: subjects,
        });
    }
    Ok(positions)
}

/// One entry: empty, or `epoch:offset`.
fn parse_entry(entry: &str) -> Option<Option<Position>> {
    if entry.is_empty() {
        return Some(None);
    }
    let (epoch, offset) = entry.split_once(':')?;
    let epoch: Epoch = epoch.parse().ok()?;
    // `u64::from_str` takes a leading `+`; a cursor never has one.
    if !offset.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Some(Position::new(epoch, offset.parse().ok()?)))
}

/// Appends the cursor naming `positions`, in order.
pub fn write_cursor(positions: &[Option<Position>], out: &mut Vec<u8>) {
    for (i, position) in positions.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        if let Some(position) = position {
            write_position(*position, out);
        }
    }
}

/// Appends one entry, `epoch:offset`.
pub fn write_position(position: Position, out: &mut Vec<u8>) {
    position.epoch.write_hex(out);
    out.push(b':');
    // Into the buffer directly: this runs per delivery on cursor transports.
    let _ = write!(out, "{}", position.offset);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn written(positions: &[Option<Position>]) -> String {
        let mut out = Vec::new();
        write_cursor(positions, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn literal_cursors() {
        let p = Position::new(Epoch(0x0123_4567_89ab_cdef), 17);
        assert_eq!(written(&[Some(p)]), "0123456789abcdef:17");
        assert_eq!(
            written(&[Some(p), None, Some(p)]),
            "0123456789abcdef:17,,0123456789abcdef:17"
        );
        assert_eq!(written(&[None]), "");
        assert_eq!(parse_cursor("", 1).unwrap(), vec![None]);
        assert_eq!(parse_cursor(",", 2).unwrap(), vec![None, None]);
        assert_eq!(
            parse_cursor("0123456789abcdef:17,", 2).unwrap(),
            vec![Some(p), None]
        );
    }

    #[test]
    fn the_longest_cursor_is_bounded() {
        let last = Some(Position::new(Epoch(u64::MAX), u64::MAX));
        for n in [1, 2, 500] {
            assert_eq!(written(&vec![last; n]).len(), max_cursor_len(n), "{n}");
        }
        assert_eq!(max_cursor_len(0), 0);
    }

    #[test]
    fn malformed_cursors_are_refused() {
        for bad in [
            "0123456789abcdef",
            "0123456789abcdef:",
            "0123456789abcdef:+1",
            "0123456789abcdef:-1",
            "0123456789ABCDEF:1",
            "123:1",
            "0123456789abcdef:99999999999999999999",
            "0123456789abcdef:1:2",
        ] {
            assert!(
                matches!(parse_cursor(bad, 1), Err(CursorError::Entry { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(
            parse_cursor("0123456789abcdef:1", 2),
            Err(CursorError::Length {
                found: 1,
                expected: 2
            })
        );
    }

    proptest! {
        #[test]
        fn every_cursor_round_trips(
            positions in prop::collection::vec(
                prop::option::of((any::<u64>(), any::<u64>())
                    .prop_map(|(e, o)| Position::new(Epoch(e), o))),
                1..8,
            )
        ) {
            let text = written(&positions);
            prop_assert_eq!(parse_cursor(&text, positions.len()).unwrap(), positions);
        }
    }
}
