//! Incremental UTF-8 validation for text messages that arrive in fragments.
//!
//! RFC 6455 §8.1 lets an endpoint fail the connection as soon as text is
//! known to be invalid, and Autobahn 6.4.x checks that it does so before the
//! final fragment arrives. A fragment boundary may fall inside a character,
//! so the validator carries the (at most 3) bytes of an unfinished sequence
//! from one fragment to the next. It must not buffer the text itself: the
//! reader keeps the bytes, this only judges them.
//!
//! The byte-level rules (overlong forms, surrogates, code points above
//! U+10FFFF) are std's: `str::from_utf8` reports an impossible sequence with
//! `error_len() == Some(_)` and a merely truncated one with `None`, which is
//! exactly the distinction needed here.

use super::frame::FrameError;

/// Validates UTF-8 fed in arbitrary pieces. Four bytes of state.
#[derive(Default, Clone, Debug)]
pub struct Utf8Validator {
    /// The unfinished trailing sequence of the bytes fed so far: a valid
    /// prefix of some character, never a whole one.
    pending: [u8; 3],
    /// How many bytes of `pending` are in use (0-3).
    pending_len: u8,
}

impl Utf8Validator {
    /// A validator that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks the next piece of text. Fails as soon as the bytes seen so far
    /// cannot be the start of valid UTF-8, even if the sequence is not
    /// complete yet (e.g. `F4 90`, which can only encode > U+10FFFF).
    pub fn feed(&mut self, bytes: &[u8]) -> Result<(), FrameError> {
        let rest = self.complete_pending(bytes)?;
        match std::str::from_utf8(rest) {
            Ok(_) => Ok(()),
            Err(e) if e.error_len().is_some() => Err(FrameError::InvalidUtf8),
            Err(e) => {
                // A truncated final sequence: at most 3 bytes by definition.
                let tail = &rest[e.valid_up_to()..];
                self.pending[..tail.len()].copy_from_slice(tail);
                self.pending_len = tail.len() as u8;
                Ok(())
            }
        }
    }

    /// Checks that the text ended on a character boundary.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.pending_len == 0 {
            Ok(())
        } else {
            Err(FrameError::InvalidUtf8)
        }
    }

    /// Feeds bytes into the pending sequence one at a time until it is a
    /// whole character, and returns the input after it. One byte at a time
    /// because the sequence's length is whatever std decides, which keeps
    /// the width rules out of this file; it runs at most 3 times per call.
    fn complete_pending<'b>(&mut self, mut bytes: &'b [u8]) -> Result<&'b [u8], FrameError> {
        while self.pending_len > 0 {
            let Some((&next, rest)) = bytes.split_first() else {
                return Ok(bytes);
            };
            let mut seq = [0u8; 4];
            let len = usize::from(self.pending_len);
            seq[..len].copy_from_slice(&self.pending[..len]);
            seq[len] = next;
            match std::str::from_utf8(&seq[..=len]) {
                Ok(_) => self.pending_len = 0,
                Err(e) if e.error_len().is_some() => return Err(FrameError::InvalidUtf8),
                Err(_) => {
                    // Still a valid prefix; a prefix is at most 3 bytes long.
                    self.pending[len] = next;
                    self.pending_len += 1;
                }
            }
            bytes = rest;
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_all(pieces: &[&[u8]]) -> Result<(), FrameError> {
        let mut v = Utf8Validator::new();
        for p in pieces {
            v.feed(p)?;
        }
        v.finish()
    }

    #[test]
    fn whole_and_split_characters() {
        let euro = "€".as_bytes(); // E2 82 AC
        assert_eq!(feed_all(&[euro]), Ok(()));
        assert_eq!(feed_all(&[&euro[..1], &euro[1..]]), Ok(()));
        assert_eq!(feed_all(&[&euro[..1], &euro[1..2], &euro[2..]]), Ok(()));
        assert_eq!(feed_all(&[&euro[..2]]), Err(FrameError::InvalidUtf8));
    }

    #[test]
    fn fails_fast_on_impossible_prefix() {
        let mut v = Utf8Validator::new();
        v.feed(&[0xF4]).unwrap();
        // F4 90 can only start a code point above U+10FFFF.
        assert_eq!(v.feed(&[0x90]), Err(FrameError::InvalidUtf8));
    }

    #[test]
    fn size_is_four_bytes() {
        assert_eq!(std::mem::size_of::<Utf8Validator>(), 4);
    }
}
