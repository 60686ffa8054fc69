//! The client side of the HTTP/1.1 the bench speaks besides WebSocket:
//! response heads (the publish API's answers and the receive transports'),
//! the requests that open the server's receive-only transports, the
//! `?user=` of a connection acting as a user, and one
//! reader per transport: [`sse`] (Server-Sent Events), [`chunked`]
//! (newline-delimited JSON in a chunked body) and [`poll`] (long-poll
//! answers).
//!
//! Pure, as the protocol crate is: bytes in, whole units out, and `None`
//! while a unit is incomplete, which is a normal answer and not an error.
//! A reader looks at the unread bytes at the front of a connection's
//! buffer, says how many bytes its next unit used, and keeps nothing
//! between calls, so a connection with nothing half-read holds no state
//! and no buffer (what makes an idle stream cheap). Messages come out as
//! the protocol v1 JSON the server wrote; reading them is the protocol
//! crate's business. Sockets, timing and what a message means belong to
//! `conn.rs` and the workloads.

pub mod chunked;
pub mod poll;
pub mod sse;

use myriad_protocol::cursor::write_cursor;
use myriad_protocol::position::Position;
use thiserror::Error;

/// Largest response head the bench waits for before calling it broken.
pub const MAX_HEAD: usize = 8 * 1024;

/// Headers read from one response head.
const MAX_HEADERS: usize = 32;

/// One of the server's receive-only HTTP transports (docs/protocol.md,
/// "HTTP transports").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receive {
    /// `text/event-stream`, delimited by the connection's end.
    Sse,
    /// Chunked `application/x-ndjson`, one message per line.
    Stream,
    /// One JSON array per request, the connection kept alive for the next.
    Poll,
}

/// What a response head says about the body that follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseHead {
    /// Bytes of the head, blank line included.
    pub len: usize,
    /// The status code.
    pub status: u16,
    /// `Content-Length`, if given.
    pub content_length: Option<usize>,
    /// `Transfer-Encoding: chunked`.
    pub chunked: bool,
}

/// A unit still incomplete past the reader's limit: the peer is not
/// sending what the transport frames, or sends more than the bench holds.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("unit still incomplete past {0} bytes")]
pub struct TooLarge(pub usize);

/// What a reader answers while the unit at the front of `buf` is not whole:
/// wait for more bytes, unless `buf` already passes `max`.
fn incomplete<T>(buf: &[u8], max: usize) -> Result<Option<T>, TooLarge> {
    if buf.len() > max {
        Err(TooLarge(max))
    } else {
        Ok(None)
    }
}

/// Why a response head was refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum HeadError {
    /// Not an HTTP/1.x response head.
    #[error("malformed response head: {0}")]
    Malformed(httparse::Error),
    /// Still incomplete past [`MAX_HEAD`] bytes.
    #[error("response head over {MAX_HEAD} bytes")]
    TooLarge,
    /// A `Content-Length` that is not a number.
    #[error("unreadable Content-Length")]
    ContentLength,
    /// Not the `200` a transport's request must get.
    #[error("status {0}")]
    Status(u16),
    /// A body framed other than the transport's (SSE ends with the
    /// connection, a stream is chunked, a poll answer has a length).
    #[error("unexpected body framing for {0:?}")]
    Framing(Receive),
}

/// The response head at the front of `buf`, or None while it is incomplete.
pub fn parse_head(buf: &[u8]) -> Result<Option<ResponseHead>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let len = match response.parse(buf).map_err(HeadError::Malformed)? {
        httparse::Status::Complete(len) => len,
        httparse::Status::Partial if buf.len() > MAX_HEAD => return Err(HeadError::TooLarge),
        httparse::Status::Partial => return Ok(None),
    };
    let mut head = ResponseHead {
        len,
        status: response.code.unwrap_or(0),
        content_length: None,
        chunked: false,
    };
    for h in response.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let value = std::str::from_utf8(h.value).map_err(|_| HeadError::ContentLength)?;
            head.content_length = Some(value.trim().parse().map_err(|_| HeadError::ContentLength)?);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            // RFC 9112 §6.1: chunked is the last coding when present.
            head.chunked = h
                .value
                .rsplit(|&b| b == b',')
                .next()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        }
    }
    Ok(Some(head))
}

impl ResponseHead {
    /// Checks that this head opens `kind`'s body: a 200, framed as that
    /// transport frames it.
    pub fn expect(&self, kind: Receive) -> Result<(), HeadError> {
        if self.status != 200 {
            return Err(HeadError::Status(self.status));
        }
        let framed = match kind {
            Receive::Sse => !self.chunked && self.content_length.is_none(),
            Receive::Stream => self.chunked,
            Receive::Poll => !self.chunked && self.content_length.is_some(),
        };
        if framed {
            Ok(())
        } else {
            Err(HeadError::Framing(kind))
        }
    }
}

/// Where a request resumes its subjects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume<'a> {
    /// One position per subject, in request order (None: live from now).
    /// Written only if one is known.
    Positions(&'a [Option<Position>]),
    /// A cursor the server handed out (a long-poll answer's `since`).
    Cursor(&'a str),
}

/// Appends the `GET` that opens `kind` for `subjects` at `path` on `host`,
/// resuming as `resume` says: as `Last-Event-ID` for Server-Sent Events
/// (what a browser's EventSource sends when it reconnects), as `since`
/// otherwise.
pub fn write_request(
    kind: Receive,
    host: &str,
    path: &str,
    subjects: &[String],
    resume: Resume<'_>,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(b"GET ");
    out.extend_from_slice(path.as_bytes());
    for (i, subject) in subjects.iter().enumerate() {
        out.extend_from_slice(if i == 0 { b"?subject=" } else { b"&subject=" });
        for piece in form_urlencoded::byte_serialize(subject.as_bytes()) {
            out.extend_from_slice(piece.as_bytes());
        }
    }
    let resumes = match resume {
        Resume::Positions(p) => p.iter().any(Option::is_some),
        Resume::Cursor(_) => true,
    };
    // A cursor needs no escaping in a query or a header (see
    // `myriad_protocol::cursor`).
    let cursor = |out: &mut Vec<u8>| match resume {
        Resume::Positions(p) => write_cursor(p, out),
        Resume::Cursor(c) => out.extend_from_slice(c.as_bytes()),
    };
    if resumes && kind != Receive::Sse {
        out.extend_from_slice(b"&since=");
        cursor(out);
    }
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(host.as_bytes());
    out.extend_from_slice(b"\r\n");
    if resumes && kind == Receive::Sse {
        out.extend_from_slice(b"Last-Event-ID: ");
        cursor(out);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// `path` asking for the connection to act as `user` (`?user=ID`, or
/// `&user=ID` after a query the path already has).
pub fn with_user(path: &str, user: u64) -> String {
    let join = if path.contains('?') { '&' } else { '?' };
    format!("{path}{join}user={user}")
}

/// What the readers' tests share.
#[cfg(test)]
pub(crate) mod testing {
    use std::fmt::Debug;

    /// Reads every unit at the front of `buf` with `next`; returns them and
    /// the bytes used.
    fn drain<T>(buf: &[u8], next: &mut impl FnMut(&[u8]) -> Option<(usize, T)>) -> (Vec<T>, usize) {
        let (mut units, mut pos) = (Vec::new(), 0);
        while let Some((used, unit)) = next(&buf[pos..]) {
            assert!(used > 0, "a unit uses bytes");
            units.push(unit);
            pos += used;
        }
        (units, pos)
    }

    /// Reads `stream` with `next` whole, then as two reads split at every
    /// byte position (what the first leaves unread is kept and read again
    /// with the second, as a connection does), and checks that every split
    /// yields the same units and uses every byte. Returns the units.
    pub fn same_at_every_split<T: PartialEq + Debug>(
        stream: &[u8],
        mut next: impl FnMut(&[u8]) -> Option<(usize, T)>,
    ) -> Vec<T> {
        let (whole, used) = drain(stream, &mut next);
        assert_eq!(used, stream.len(), "the whole stream is read");
        for cut in 0..=stream.len() {
            let (mut units, used) = drain(&stream[..cut], &mut next);
            let rest = [&stream[used..cut], &stream[cut..]].concat();
            let (more, used) = drain(&rest, &mut next);
            assert_eq!(used, rest.len(), "split at {cut}: all read");
            units.extend(more);
            assert_eq!(units, whole, "split at {cut}");
        }
        whole
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use myriad_protocol::position::Epoch;

    fn request(kind: Receive, subjects: &[&str], resume: Resume<'_>) -> String {
        let subjects: Vec<String> = subjects.iter().map(|s| (*s).to_owned()).collect();
        let mut out = Vec::new();
        write_request(kind, "h:1", "/x", &subjects, resume, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn requests_name_their_subjects_and_resume_by_transport() {
        let at = [Some(Position::new(Epoch(0xab), 7)), None];
        assert_eq!(
            request(
                Receive::Stream,
                &["/p/s1", "a&b+c"],
                Resume::Positions(&[None, None])
            ),
            "GET /x?subject=%2Fp%2Fs1&subject=a%26b%2Bc HTTP/1.1\r\nHost: h:1\r\n\r\n"
        );
        assert_eq!(
            request(Receive::Poll, &["a", "b"], Resume::Positions(&at)),
            "GET /x?subject=a&subject=b&since=00000000000000ab:7, HTTP/1.1\r\nHost: h:1\r\n\r\n"
        );
        assert_eq!(
            request(Receive::Sse, &["a", "b"], Resume::Positions(&at)),
            "GET /x?subject=a&subject=b HTTP/1.1\r\nHost: h:1\r\nLast-Event-ID: 00000000000000ab:7,\r\n\r\n"
        );
        assert_eq!(
            request(Receive::Poll, &["a"], Resume::Cursor("00000000000000ab:9")),
            "GET /x?subject=a&since=00000000000000ab:9 HTTP/1.1\r\nHost: h:1\r\n\r\n"
        );
    }

    #[test]
    fn a_user_joins_the_query() {
        assert_eq!(with_user("/ws", 17), "/ws?user=17");
        assert_eq!(with_user("/ws?x=1", 17), "/ws?x=1&user=17");
    }

    #[test]
    fn heads_say_how_the_body_is_framed() {
        let head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked\r\n\r\nrest";
        let h = parse_head(head).unwrap().unwrap();
        assert_eq!((h.len, h.status, h.chunked), (head.len() - 4, 200, true));
        assert_eq!(h.expect(Receive::Stream), Ok(()));
        assert_eq!(
            h.expect(Receive::Sse),
            Err(HeadError::Framing(Receive::Sse))
        );
        let h = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.content_length, Some(12));
        assert_eq!(h.expect(Receive::Poll), Ok(()));
        let h = parse_head(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.expect(Receive::Sse), Ok(()));
        let h = parse_head(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.expect(Receive::Poll), Err(HeadError::Status(503)));
    }

    #[test]
    fn incomplete_and_broken_heads() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n";
        for cut in 0..head.len() {
            assert_eq!(parse_head(&head[..cut]), Ok(None), "cut at {cut}");
        }
        assert!(matches!(
            parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"),
            Err(HeadError::ContentLength)
        ));
        assert!(matches!(
            parse_head(b"SSH-2.0\r\n\r\n"),
            Err(HeadError::Malformed(_))
        ));
        let mut long = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
        long.resize(MAX_HEAD + 1, b'a');
        assert_eq!(parse_head(&long), Err(HeadError::TooLarge));
    }
}
