//! The text the Redis engine's scripts write and its nodes read back: a
//! publication's history entry (`<epoch> <order> <offset> <ms> <data>`;
//! see lib.lua), which is also what the subject's channel carries.
//!
//! Pure parsing, tested with byte strings: whatever is in Redis is
//! untrusted input to the node, so a malformed message is an error, never
//! a panic.

use std::sync::Arc;

use myriad_protocol::position::{Epoch, Position};
use thiserror::Error;

use crate::publication::Publication;

/// Why a message from Redis could not be read.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error("malformed {what} from Redis: {text:?}")]
pub struct CodecError {
    what: &'static str,
    text: String,
}

impl CodecError {
    fn new(what: &'static str, text: &[u8]) -> CodecError {
        let shown = &text[..text.len().min(80)];
        CodecError {
            what,
            text: String::from_utf8_lossy(shown).into_owned(),
        }
    }
}

/// Splits off `fields` space-separated numbers-or-words from the front;
/// the rest (which may hold spaces) is the data.
fn split<const N: usize>(text: &str) -> Option<([&str; N], &str)> {
    let mut fields = [""; N];
    let mut rest = text;
    for field in &mut fields {
        let (head, tail) = rest.split_once(' ')?;
        *field = head;
        rest = tail;
    }
    Some((fields, rest))
}

/// A publication of `subject` as an entry reads, `what` naming where it
/// came from for the error.
fn entry(subject: &Arc<str>, what: &'static str, text: &[u8]) -> Result<Publication, CodecError> {
    let bad = || CodecError::new(what, text);
    let text = std::str::from_utf8(text).map_err(|_| bad())?;
    let ([epoch, order, offset, ms], data) = split::<4>(text).ok_or_else(bad)?;
    let epoch: Epoch = epoch.parse().map_err(|_| bad())?;
    order.parse::<u64>().map_err(|_| bad())?;
    let offset: u64 = offset.parse().map_err(|_| bad())?;
    let ms: u64 = ms.parse().map_err(|_| bad())?;
    Ok(Publication::new(
        Arc::clone(subject),
        Position::new(epoch, offset),
        data,
        ms,
    ))
}

/// A publication as it arrives on `subject`'s channel.
pub fn channel_message(subject: &Arc<str>, payload: &[u8]) -> Result<Publication, CodecError> {
    entry(subject, "channel message", payload)
}

/// A history entry of `subject`, whose stream is in `epoch`: an entry of
/// another epoch is malformed, since a stream's history is all of one.
pub fn history_entry(
    subject: &Arc<str>,
    epoch: Epoch,
    text: &[u8],
) -> Result<Arc<Publication>, CodecError> {
    let publication = entry(subject, "history entry", text)?;
    if publication.position.epoch != epoch {
        return Err(CodecError::new("history entry", text));
    }
    Ok(Arc::new(publication))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subject() -> Arc<str> {
        Arc::from("chat.room1")
    }

    #[test]
    fn a_channel_message_keeps_spaces_in_its_data() {
        let p = channel_message(
            &subject(),
            b"00000000000000ff 31 7 1700000000123 {\"a\": \"b c\"}",
        )
        .unwrap();
        assert_eq!(p.position, Position::new(Epoch(255), 7));
        assert_eq!(p.published_ms, 1_700_000_000_123);
        assert_eq!(
            p.envelope(),
            br#"{"op":"msg","subject":"chat.room1","epoch":"00000000000000ff","offset":7,"data":{"a": "b c"}}"#
        );
    }

    #[test]
    fn a_history_entry_reads_offset_time_and_data() {
        let p = history_entry(
            &subject(),
            Epoch(1),
            b"0000000000000001 42 9 1700000000000 \"x y\"",
        )
        .unwrap();
        assert_eq!(p.position, Position::new(Epoch(1), 9));
        assert_eq!(p.published_ms, 1_700_000_000_000);
        assert_eq!(
            p.envelope(),
            br#"{"op":"msg","subject":"chat.room1","epoch":"0000000000000001","offset":9,"data":"x y"}"#
        );
    }

    #[test]
    fn malformed_messages_are_errors() {
        for bad in [
            &b""[..],
            b"00000000000000ff 1 7",
            b"00000000000000ff 1 seven 1 {}",
            b"ff 1 7 1 {}",
            b"00000000000000ff 1 7 -1 {}",
            b"00000000000000ff x 7 1 {}",
            b"\xff\xfe 1 1 1 {}",
        ] {
            assert!(channel_message(&subject(), bad).is_err(), "{bad:?}");
            assert!(
                history_entry(&subject(), Epoch(255), bad).is_err(),
                "{bad:?}"
            );
        }
        // Well formed, but of another epoch than its stream's.
        let other = b"0000000000000002 1 2 3 {}";
        assert!(history_entry(&subject(), Epoch(2), other).is_ok());
        assert!(history_entry(&subject(), Epoch(1), other).is_err());
    }
}
