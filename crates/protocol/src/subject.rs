//! Subject syntax: what a subject name may contain and how long it may be.
//!
//! A subject is 1 to `max_len` bytes drawn from URL-path-safe ASCII. The
//! alphabet deliberately has no `"`, `\\` or control characters, so a valid
//! subject can be copied into a JSON string without escaping (the delivery
//! encoder relies on this), and no `*`, `>`, `?`, `#` or `%`, which stay
//! reserved for wildcards and future syntax. Subjects starting with `@` are
//! users' feeds ([`FEED_PREFIX`]).

use thiserror::Error;

/// What starts a user's feed subject, `@<user id>`: the subject that
/// "send as user" publishes to and that followers are subscribed to.
/// Clients may read a feed like any subject, but only `send` (or the admin
/// API's `publish_as`) publishes to one.
pub const FEED_PREFIX: char = '@';

/// Whether `subject` is a user's feed (see [`FEED_PREFIX`]).
pub fn is_feed(subject: &str) -> bool {
    subject.starts_with(FEED_PREFIX)
}

/// The default maximum subject length in bytes (`--max-subject-len`).
pub const DEFAULT_MAX_SUBJECT_LEN: usize = 128;

/// Why a subject was refused.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum SubjectError {
    #[error("subject is empty")]
    Empty,
    #[error("subject is {len} bytes, the limit is {limit}")]
    TooLong { len: usize, limit: usize },
    #[error("subject contains byte 0x{byte:02x} at offset {offset}, outside the allowed alphabet")]
    InvalidByte { byte: u8, offset: usize },
}

/// Whether `b` may appear in a subject.
const fn is_subject_byte(b: u8) -> bool {
    matches!(b,
        b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9'
        | b'.' | b'_' | b'~' | b':' | b'/' | b'@' | b'!' | b'$' | b'&' | b'\''
        | b'(' | b')' | b'+' | b',' | b';' | b'=' | b'-')
}

/// Checks `subject` against the syntax and the length limit.
pub fn validate(subject: &str, max_len: usize) -> Result<(), SubjectError> {
    let bytes = subject.as_bytes();
    if bytes.is_empty() {
        return Err(SubjectError::Empty);
    }
    if bytes.len() > max_len {
        return Err(SubjectError::TooLong {
            len: bytes.len(),
            limit: max_len,
        });
    }
    match bytes.iter().position(|&b| !is_subject_byte(b)) {
        Some(offset) => Err(SubjectError::InvalidByte {
            byte: bytes[offset],
            offset,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_the_seed_shapes() {
        for s in [
            "/p/s1",
            "chat.room-42",
            "user:1234",
            "a",
            "news/eu_west;v=2",
        ] {
            assert_eq!(validate(s, 128), Ok(()), "{s}");
        }
    }

    #[test]
    fn refuses_empty_long_and_reserved() {
        assert_eq!(validate("", 128), Err(SubjectError::Empty));
        assert_eq!(
            validate("abcd", 3),
            Err(SubjectError::TooLong { len: 4, limit: 3 })
        );
        for (s, offset) in [
            ("a b", 1),
            ("x\"", 1),
            ("\\", 0),
            ("ab*", 2),
            ("é", 0),
            ("a>", 1),
        ] {
            assert!(
                matches!(validate(s, 128), Err(SubjectError::InvalidByte { offset: o, .. }) if o == offset),
                "{s}"
            );
        }
    }

    proptest! {
        #[test]
        fn valid_subjects_need_no_json_escaping(s in "[A-Za-z0-9._~:/@!$&'()+,;=-]{1,64}") {
            prop_assert!(validate(&s, 128).is_ok());
            let quoted = serde_json::to_string(&s).unwrap();
            prop_assert_eq!(quoted, format!("\"{s}\""));
        }
    }
}
