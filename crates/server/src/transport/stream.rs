//! HTTP streaming ("comet") as a transport: `GET /stream?subject=a`
//! answered with an endless chunked response of newline-delimited JSON,
//! one protocol v1 message per line, readable with `curl -N`.
//!
//! Every publication line is the envelope a WebSocket client gets, so it
//! names its subject and position; a client resumes with
//! `since=<cursor>` built from the last line of each subject (see
//! `myriad_protocol::cursor`). A `subscribed` line opens each subject with
//! its position, so even a stream that saw no publication can resume. Each
//! line travels in its own chunk (RFC 9112 §7.1), so the line's form is the
//! same for every recipient and built once per worker. The heartbeat is an
//! empty line, which NDJSON readers skip; the end is a `close` line, then
//! the last chunk.

use bytes::Bytes;
use myriad_protocol::close::CloseReason;

use super::http::{close_notice, push_one_line, stream_head};
use super::{Capabilities, Heartbeat, Transport};
use crate::config::Config;
use crate::publication::Publication;
use crate::session::Session;

/// One chunk holding an empty line.
static HEARTBEAT: &[u8] = b"1\r\n\n\r\n";
/// The chunk that ends a chunked body (no trailers).
const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

pub struct HttpStream;

/// `json` and a newline as one chunk: size in hex, CRLF, data, CRLF.
fn line_chunk(json: &[u8]) -> Vec<u8> {
    let len = json.len() + 1;
    let mut out = Vec::with_capacity(len + 16);
    out.extend_from_slice(format!("{len:x}\r\n").as_bytes());
    push_one_line(&mut out, json);
    out.extend_from_slice(b"\n\r\n");
    out
}

impl Transport for HttpStream {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            bidirectional: false,
            heartbeat: Heartbeat::OneWay,
            keeps_cursor: false,
            answers_once: false,
        }
    }

    fn opening(&self, config: &Config) -> Option<Bytes> {
        let head = stream_head(
            config,
            "application/x-ndjson",
            &[("Transfer-Encoding", "chunked"), ("Connection", "close")],
        );
        Some(Bytes::from(head))
    }

    fn publication(&self, publication: &Publication, _config: &Config) -> Bytes {
        Bytes::from(line_chunk(publication.envelope()))
    }

    fn reply(&self, json: &[u8], _session: &Session) -> Bytes {
        Bytes::from(line_chunk(json))
    }

    fn heartbeat(&self) -> Bytes {
        Bytes::from_static(HEARTBEAT)
    }

    fn close(&self, reason: CloseReason) -> Option<Bytes> {
        let mut out = line_chunk(close_notice(reason)?.as_bytes());
        out.extend_from_slice(LAST_CHUNK);
        Some(Bytes::from(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use myriad_protocol::position::{Epoch, Position};
    use std::sync::Arc;

    #[test]
    fn lines_in_chunks() {
        let s = HttpStream;
        let p = Publication::new(Arc::from("a"), Position::new(Epoch(1), 2), "true", 0);
        let form = s.publication(&p, &Config::default());
        let line = [p.envelope(), b"\n"].concat();
        let expected = [format!("{:x}\r\n", line.len()).as_bytes(), &line, b"\r\n"].concat();
        assert_eq!(&form[..], &expected[..]);
        assert_eq!(&s.reply(b"{}", &Session::default())[..], b"3\r\n{}\n\r\n");
        assert_eq!(&s.heartbeat()[..], b"1\r\n\n\r\n");
        let close = s.close(CloseReason::GoingAway).unwrap();
        assert!(close.ends_with(b"}\n\r\n0\r\n\r\n"));
        let head = s.opening(&Config::default()).unwrap();
        assert!(std::str::from_utf8(&head)
            .unwrap()
            .contains("Transfer-Encoding: chunked\r\n"));
    }
}
