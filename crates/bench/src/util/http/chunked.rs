//! Reading a chunked body of newline-delimited JSON (RFC 9112 §7.1): the
//! HTTP streaming ("comet") transport, one protocol v1 message per line.
//!
//! The unit handed out is a run of chunks whose data ends at a line end:
//! whole lines, however the sender cut them into chunks. myriad sends each
//! line in a chunk of its own, so a run is one chunk and its data is
//! borrowed; lines cut over several chunks are gathered into one buffer.
//! An empty line is the stream's heartbeat. Chunk extensions and trailers
//! are read past.

use std::borrow::Cow;

use memchr::memchr;
use thiserror::Error;

use super::{incomplete, TooLarge};

/// One unit of a chunked body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk<'a> {
    /// One or more lines, each with its `\n` (the last may lack it only
    /// when the body ends right after).
    Lines(Cow<'a, [u8]>),
    /// The last chunk and its trailers: the body is over.
    End,
}

/// Why a chunked body cannot be read on.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ChunkError {
    /// A chunk size that is not hex digits, or too many of them.
    #[error("malformed chunk size")]
    Size,
    /// Chunk data not followed by CRLF, or a size line not ended by one.
    #[error("chunk framing without its CRLF")]
    Crlf,
    /// A chunk, or a line over several, past the limit.
    #[error(transparent)]
    TooLarge(#[from] TooLarge),
}

/// Hex digits a chunk size may have: enough for any size a `usize` holds.
const MAX_SIZE_DIGITS: usize = 15;

/// The unit at the front of `buf` and the bytes it used, or None while it
/// is incomplete. A run of chunks may not pass `max` bytes.
pub fn next_lines(buf: &[u8], max: usize) -> Result<Option<(usize, Chunk<'_>)>, ChunkError> {
    let mut pos = 0;
    let mut run: Option<Cow<'_, [u8]>> = None;
    loop {
        let Some((size, data_at)) = size_line(&buf[pos..])? else {
            return Ok(incomplete(buf, max)?);
        };
        let data_at = pos + data_at;
        if size == 0 {
            // The body ends; a line left without its newline is still one.
            if let Some(run) = run {
                return Ok(Some((pos, Chunk::Lines(run))));
            }
            return Ok(trailers_end(&buf[data_at..]).map(|len| (data_at + len, Chunk::End)));
        }
        if size > max {
            return Err(TooLarge(max).into());
        }
        let Some(after) = buf.get(data_at + size..data_at + size + 2) else {
            return Ok(incomplete(buf, max)?);
        };
        if after != b"\r\n" {
            return Err(ChunkError::Crlf);
        }
        let data = &buf[data_at..data_at + size];
        run = Some(match run {
            None => Cow::Borrowed(data),
            Some(before) => Cow::Owned([&before[..], data].concat()),
        });
        pos = data_at + size + 2;
        if data.ends_with(b"\n") {
            return Ok(run.map(|run| (pos, Chunk::Lines(run))));
        }
    }
}

/// The size of the chunk whose size line starts `buf`, and where its data
/// starts; None while the line is incomplete.
fn size_line(buf: &[u8]) -> Result<Option<(usize, usize)>, ChunkError> {
    let Some(lf) = memchr(b'\n', buf) else {
        return Ok(None);
    };
    let line = buf[..lf].strip_suffix(b"\r").ok_or(ChunkError::Crlf)?;
    let digits = line.split(|&b| b == b';').next().unwrap_or_default();
    if digits.is_empty() || digits.len() > MAX_SIZE_DIGITS {
        return Err(ChunkError::Size);
    }
    let size = digits
        .iter()
        .try_fold(0usize, |size, &b| -> Result<usize, ChunkError> {
            let digit = (b as char).to_digit(16).ok_or(ChunkError::Size)?;
            Ok(size * 16 + digit as usize)
        })?;
    Ok(Some((size, lf + 1)))
}

/// Bytes of the trailer section at the front of `buf` up to and including
/// its closing blank line; None while it is incomplete.
fn trailers_end(buf: &[u8]) -> Option<usize> {
    let mut pos = 0;
    loop {
        let lf = memchr(b'\n', &buf[pos..])?;
        let line = &buf[pos..pos + lf];
        pos += lf + 1;
        if line == b"\r" || line.is_empty() {
            return Some(pos);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::http::testing::same_at_every_split;

    fn units(stream: &[u8]) -> Vec<String> {
        same_at_every_split(stream, |buf| {
            let (used, chunk) = next_lines(buf, 1 << 20).unwrap()?;
            let shown = match chunk {
                Chunk::Lines(lines) => String::from_utf8(lines.into_owned()).unwrap(),
                Chunk::End => "END".into(),
            };
            Some((used, shown))
        })
    }

    #[test]
    fn what_myriad_sends() {
        let stream = b"13\r\n{\"op\":\"msg\",\"n\":1}\n\r\n\
            1\r\n\n\r\n\
            b\r\n{\"op\":\"x\"}\n\r\n\
            0\r\n\r\n";
        assert_eq!(
            units(stream),
            [
                "{\"op\":\"msg\",\"n\":1}\n",
                "\n",
                "{\"op\":\"x\"}\n",
                "END"
            ]
        );
    }

    #[test]
    fn lines_cut_anyhow_come_out_whole() {
        // A line over three chunks, a chunk of two lines whose third goes
        // on in the next, extensions, trailers, and a last line without its
        // newline.
        let stream = b"2\r\n{\"\r\n3;ext=1\r\na\":\r\n3\r\n1}\n\r\n\
            6\r\na\nbc\nd\r\n2\r\nef\r\n\
            0;x\r\nTrailer: y\r\n\r\n";
        assert_eq!(units(stream), ["{\"a\":1}\n", "a\nbc\ndef", "END"]);
        let (_, first) = next_lines(b"3\r\nab\n\r\n", 64).unwrap().unwrap();
        assert!(matches!(first, Chunk::Lines(Cow::Borrowed(b"ab\n"))));
    }

    #[test]
    fn broken_framing_is_refused() {
        assert_eq!(next_lines(b"zz\r\n", 64), Err(ChunkError::Size));
        assert_eq!(next_lines(b"\r\n", 64), Err(ChunkError::Size));
        assert_eq!(
            next_lines(b"1234567890abcdef0\r\n", 64),
            Err(ChunkError::Size)
        );
        assert_eq!(next_lines(b"2\n", 64), Err(ChunkError::Crlf));
        assert_eq!(next_lines(b"2\r\nab\n\n", 64), Err(ChunkError::Crlf));
        assert_eq!(next_lines(b"41\r\n", 64), Err(TooLarge(64).into()));
        assert_eq!(next_lines(b"4\r\nab", 64), Ok(None));
        assert_eq!(
            next_lines(b"4\r\nabcd\r\n4\r\nefgh\r\n", 8),
            Err(TooLarge(8).into()),
            "a line growing over chunks is bounded too"
        );
    }
}
