//! Long-poll as a transport: `GET /poll?subject=a&since=<cursor>`.
//!
//! A poll answers at once when anything is past `since`, and otherwise is
//! held until a publication arrives or `poll_timeout` passes. The answer
//! is one JSON array of protocol v1 messages, oldest first, whose last
//! element carries the cursor for the next poll:
//!
//! ```text
//! [{"op":"msg",…},{"op":"msg",…},{"op":"poll","since":"…"}]
//! ```
//!
//! A `subscribed` element with `"recovered":false` reports a subject whose
//! missed publications are no longer in history. The worker collects the
//! elements as they come (each publication's form is the envelope and a
//! comma, shared by every poller on the worker) and holds them until the
//! answer is ready; only then are the head, with its `Content-Length`, and
//! the tail known. The connection is kept alive for the next poll unless
//! the client asked otherwise.

use bytes::Bytes;
use myriad_protocol::close::CloseReason;
use myriad_protocol::message::encode_poll_end;

use super::http::cors_headers;
use super::{Capabilities, Heartbeat, Transport};
use crate::config::Config;
use crate::publication::Publication;
use crate::session::Session;

pub struct LongPoll;

/// `json` as one element of the answer array.
fn element(json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 1);
    out.extend_from_slice(json);
    out.push(b',');
    Bytes::from(out)
}

impl Transport for LongPoll {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            bidirectional: false,
            heartbeat: Heartbeat::None,
            keeps_cursor: true,
            answers_once: true,
        }
    }

    fn publication(&self, publication: &Publication, _config: &Config) -> Bytes {
        element(publication.envelope())
    }

    fn reply(&self, json: &[u8], _session: &Session) -> Bytes {
        element(json)
    }

    fn announces(&self, recovered: Option<bool>, _feed: bool) -> bool {
        // The answer's cursor already says where each subject is; only a
        // gap needs saying.
        recovered == Some(false)
    }

    fn heartbeat(&self) -> Bytes {
        unreachable!("long-poll has no heartbeat")
    }

    fn answer(
        &self,
        body_len: usize,
        session: &Session,
        keep_alive: bool,
        config: &Config,
    ) -> (Bytes, Bytes) {
        let mut cursor = Vec::new();
        session.write_cursor(&mut cursor);
        let mut tail = encode_poll_end(&cursor);
        tail.push(b']');
        let len = 1 + body_len + tail.len();
        let mut head = String::with_capacity(256);
        head.push_str("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n");
        head.push_str("Cache-Control: no-cache, no-store\r\n");
        for (name, value) in cors_headers(config) {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!("Content-Length: {len}\r\n"));
        head.push_str(if keep_alive {
            "Connection: keep-alive\r\n\r\n["
        } else {
            "Connection: close\r\n\r\n["
        });
        (Bytes::from(head), Bytes::from(tail))
    }

    fn close(&self, _reason: CloseReason) -> Option<Bytes> {
        // A poll always ends with its answer (the worker sends it); between
        // polls there is nothing to say.
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use myriad_protocol::position::{Epoch, Position};
    use std::sync::Arc;

    #[test]
    fn an_answer_is_one_json_array() {
        let poll = LongPoll;
        let p = Publication::new(Arc::from("a"), Position::new(Epoch(1), 2), "[1]", 0);
        let mut session = Session::default();
        session.keep_cursor(&[None]);
        session.subscriptions.push(Arc::from("a"));
        session.advance("a", p.position);
        let body = [
            poll.publication(&p, &Config::default()),
            poll.publication(&p, &Config::default()),
        ]
        .concat();
        let (head, tail) = poll.answer(body.len(), &session, true, &Config::default());
        let head = std::str::from_utf8(&head).unwrap();
        let json = [&head.as_bytes()[head.len() - 1..], &body, &tail].concat();
        let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(value[0]["offset"], 2);
        assert_eq!(value[2]["op"], "poll");
        assert_eq!(value[2]["since"], "0000000000000001:2");
        assert!(head.contains(&format!("Content-Length: {}\r\n", json.len())));
        assert!(head.contains("Connection: keep-alive\r\n"));
        assert!(!poll.announces(Some(true), false) && poll.announces(Some(false), false));
        assert!(
            !poll.announces(None, true),
            "a feed's position is in the cursor"
        );
    }
}
