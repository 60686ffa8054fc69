//! The command endpoint as a transport: `POST /cmd` with one protocol v1
//! command as the body, answered with its reply.
//!
//! A client on a one-way transport (SSE, HTTP streaming, long-poll) still
//! publishes, sends to its feed and reads history: it posts the command it
//! would have sent on a WebSocket, with the same `id`, and the response
//! body is the reply the WebSocket would have carried (`ok`, `history`, or
//! `error` with the same code). The request is admitted like a stream's
//! (origin, token in `Authorization`), and the command runs through the
//! same code as on a WebSocket, so it meets the same rules and limits.
//!
//! Like a long-poll, the connection answers once: the reply is held until
//! the engine has it, then sent whole with its `Content-Length`, and a
//! kept-alive connection waits for its next request. Subscription changes
//! are not taken here: a one-way stream changes its subjects by reopening
//! with its cursor (docs/protocol.md).

use bytes::Bytes;
use myriad_protocol::close::CloseReason;
use myriad_protocol::message::{encode_error, ErrorCode};

use super::http::cors_headers;
use super::{Capabilities, Heartbeat, Transport};
use crate::config::Config;
use crate::publication::Publication;
use crate::session::Session;

pub struct CommandPost;

impl Transport for CommandPost {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            bidirectional: false,
            heartbeat: Heartbeat::None,
            keeps_cursor: false,
            answers_once: true,
        }
    }

    fn publication(&self, publication: &Publication, _config: &Config) -> Bytes {
        // Never subscribed, so never delivered to; the form is the
        // envelope all the same, for callers that build every form.
        Bytes::copy_from_slice(publication.envelope())
    }

    fn reply(&self, json: &[u8], _session: &Session) -> Bytes {
        Bytes::copy_from_slice(json)
    }

    fn heartbeat(&self) -> Bytes {
        unreachable!("the command endpoint has no heartbeat")
    }

    fn answer(
        &self,
        body_len: usize,
        _session: &Session,
        keep_alive: bool,
        config: &Config,
    ) -> (Bytes, Bytes) {
        // Nothing collected means `poll_timeout` passed with no answer
        // from the engine: say so in the reply's own terms.
        let tail = if body_len == 0 {
            encode_error(
                None,
                ErrorCode::Unavailable,
                "no answer within poll_timeout",
            )
        } else {
            String::new()
        };
        let len = body_len + tail.len();
        let mut head = String::with_capacity(256);
        head.push_str("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n");
        head.push_str("Cache-Control: no-cache, no-store\r\n");
        for (name, value) in cors_headers(config) {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!("Content-Length: {len}\r\n"));
        head.push_str(if keep_alive {
            "Connection: keep-alive\r\n\r\n"
        } else {
            "Connection: close\r\n\r\n"
        });
        (Bytes::from(head), Bytes::from(tail))
    }

    fn close(&self, _reason: CloseReason) -> Option<Bytes> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_the_reply_with_its_length() {
        let reply = br#"{"op":"ok","id":7}"#;
        let session = Session::default();
        let body = CommandPost.reply(reply, &session);
        assert_eq!(&body[..], reply);
        let (head, tail) = CommandPost.answer(body.len(), &session, true, &Config::default());
        let head = std::str::from_utf8(&head).unwrap();
        assert!(tail.is_empty());
        assert!(head.contains(&format!("Content-Length: {}\r\n", reply.len())));
        assert!(head.ends_with("Connection: keep-alive\r\n\r\n"), "{head}");
        let (head, tail) = CommandPost.answer(0, &session, false, &Config::default());
        let value: serde_json::Value = serde_json::from_slice(&tail).unwrap();
        assert_eq!(value["code"], "unavailable");
        let head = std::str::from_utf8(&head).unwrap();
        assert!(head.contains(&format!("Content-Length: {}\r\n", tail.len())));
    }
}
