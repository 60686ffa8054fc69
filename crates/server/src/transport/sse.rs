//! Server-Sent Events (HTML Living Standard, "Server-sent events") as a
//! transport: `GET /sse?subject=a&subject=b` answered with an endless
//! `text/event-stream`.
//!
//! Each publication is one unnamed event, so `EventSource.onmessage` gets
//! it: `data:` holds the protocol v1 envelope. The stream's cursor (see
//! `myriad_protocol::cursor`) travels as event ids; the browser sends the
//! last id back as `Last-Event-ID` when it reconnects, which resumes every
//! subject of the stream at once. For a one-subject stream the cursor is
//! the publication's own position, so each event carries it as its `id:`,
//! the same for every recipient and built once per worker; a stream of
//! several subjects gets the shared `data:` line and the cursor later
//! (below). Protocol replies are named events (`event: subscribed`,
//! `event: close`).
//!
//! The opening writes the cursor once. A cursor has one entry per subject,
//! so an id on each of N `subscribed` events would make the opening N²
//! bytes (2.5 MB for 500 subjects, past `max_outbound_bytes`). Until the
//! engine has answered every subject, events carry no id (a one-subject
//! stream's publications excepted: their id is the whole cursor anyway);
//! then one event with only an id hands out the cursor, so a stream that
//! has seen no publication yet still resumes where it was. An event with
//! no data sets the browser's last event id without reaching the page (the
//! standard's "dispatch the event", step 1). A stream cut during its
//! opening thus reconnects with the id it opened with, as if the opening
//! had not happened: nothing is skipped, and what it had delivered comes
//! again (each message names its subject and position, so repeats can be
//! told). Afterwards publications carry no id either: each leaves the
//! cursor owed, and the worker sends it in an id-only event at the end of
//! its turn, once for all the publications the turn delivered to the
//! stream, so a burst costs one cursor (up to 3.8 KB at 100 subjects),
//! not one per publication. A stream cut between a publication and the
//! turn's cursor reconnects with the cursor before it, and is sent again
//! what it had from there (each message names its subject and position,
//! so the repeat can be told). Replies never carry it either: one that moves it
//! (a `subscribed` telling that a subject's stream broke) leaves it owed
//! too, once for all the subjects that broke together (a Redis that
//! restarted empty breaks them all).
//!
//! The body is delimited by the connection's end (no chunked encoding):
//! the last event names why the server ended it, then the socket closes.

use bytes::Bytes;
use myriad_protocol::close::CloseReason;
use myriad_protocol::cursor::write_position;

use super::http::{close_notice, push_one_line, stream_head};
use super::{Capabilities, Heartbeat, Transport};
use crate::config::Config;
use crate::publication::Publication;
use crate::session::Session;

/// A comment line: ignored by EventSource, enough to keep proxies from
/// timing the stream out.
static HEARTBEAT: &[u8] = b": heartbeat\n\n";

pub struct ServerSentEvents;

impl ServerSentEvents {
    /// Length of the `data:` line at the front of a publication's form.
    fn data_line_len(publication: &Publication) -> usize {
        b"data: ".len() + publication.envelope().len() + 1
    }

    /// A named event carrying `json`. It has no id: a reply that moves the
    /// cursor (a `subscribed`) leaves it owed, and the worker hands it out
    /// once its turn is done (see [`Transport::cursor`]).
    fn event(name: &str, json: &[u8]) -> Bytes {
        let mut out = Vec::with_capacity(32 + name.len() + json.len());
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\ndata: ");
        push_one_line(&mut out, json);
        out.extend_from_slice(b"\n\n");
        Bytes::from(out)
    }
}

impl Transport for ServerSentEvents {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            bidirectional: false,
            heartbeat: Heartbeat::OneWay,
            keeps_cursor: true,
            answers_once: false,
        }
    }

    fn opening(&self, config: &Config) -> Option<Bytes> {
        let mut head = stream_head(config, "text/event-stream", &[("Connection", "close")]);
        // How long the browser waits before reconnecting (the spec's default
        // is the browser's choice, commonly 3 s).
        head.push_str(&format!("retry: {}\n\n", config.sse_retry_ms));
        Some(Bytes::from(head))
    }

    fn publication(&self, publication: &Publication, _config: &Config) -> Bytes {
        let mut out = Vec::with_capacity(Self::data_line_len(publication) + 48);
        out.extend_from_slice(b"data: ");
        push_one_line(&mut out, publication.envelope());
        out.extend_from_slice(b"\nid: ");
        write_position(publication.position, &mut out);
        out.extend_from_slice(b"\n\n");
        Bytes::from(out)
    }

    fn addressed(
        &self,
        form: &Bytes,
        publication: &Publication,
        session: &Session,
    ) -> (Bytes, Option<Bytes>) {
        if session.cursor_len() <= 1 {
            // The cursor of a one-subject stream is the position in the form.
            return (form.clone(), None);
        }
        // The shared data line and the event's end, with no id: the cursor
        // follows once, at the end of the opening or of the worker's turn.
        let data = form.slice(..Self::data_line_len(publication));
        (data, Some(Bytes::from_static(b"\n")))
    }

    fn defers_cursor(&self, session: &Session) -> bool {
        session.cursor_len() > 1
    }

    fn reply(&self, json: &[u8], _session: &Session) -> Bytes {
        // Every reply starts `{"op":"NAME"`; the op names the event.
        let name = json
            .strip_prefix(b"{\"op\":\"")
            .and_then(|rest| rest.split(|&b| b == b'"').next())
            .and_then(|op| std::str::from_utf8(op).ok())
            .unwrap_or("reply");
        Self::event(name, json)
    }

    fn cursor(&self, session: &Session) -> Option<Bytes> {
        // An id and no data: the browser keeps the id, the page sees nothing.
        let mut out = Vec::with_capacity(8 + 40 * session.cursor_len());
        out.extend_from_slice(b"id: ");
        session.write_cursor(&mut out);
        out.extend_from_slice(b"\n\n");
        Some(Bytes::from(out))
    }

    fn heartbeat(&self) -> Bytes {
        Bytes::from_static(HEARTBEAT)
    }

    fn close(&self, reason: CloseReason) -> Option<Bytes> {
        let notice = close_notice(reason)?;
        Some(Self::event("close", notice.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use myriad_protocol::position::{Epoch, Position};
    use std::sync::Arc;

    fn publication(subject: &str, offset: u64, data: &str) -> Publication {
        Publication::new(Arc::from(subject), Position::new(Epoch(1), offset), data, 0)
    }

    #[test]
    fn one_subject_events_are_shared() {
        let sse = ServerSentEvents;
        let p = publication("a", 7, "{\"x\":\n1}");
        let form = sse.publication(&p, &Config::default());
        assert_eq!(
            &form[..],
            &b"data: {\"op\":\"msg\",\"subject\":\"a\",\"epoch\":\"0000000000000001\",\"offset\":7,\"data\":{\"x\": 1}}\nid: 0000000000000001:7\n\n"[..]
        );
        let mut session = Session::default();
        session.keep_cursor(&[None]);
        session.subscriptions.push(Arc::from("a"));
        session.advance("a", p.position);
        let (bytes, tail) = sse.addressed(&form, &p, &session);
        assert_eq!(bytes.as_ptr(), form.as_ptr(), "shared, not copied");
        assert!(tail.is_none());
    }

    #[test]
    fn several_subjects_leave_the_cursor_to_the_turn_s_end() {
        let sse = ServerSentEvents;
        let p = publication("b", 3, "1");
        let form = sse.publication(&p, &Config::default());
        let mut session = Session::default();
        session.keep_cursor(&[Some(Position::new(Epoch(1), 9)), None]);
        session.subscriptions.push(Arc::from("a"));
        session.subscriptions.push(Arc::from("b"));
        assert!(sse.defers_cursor(&session));
        // Opening or open: the shared data line and the event's end, no id
        // and nothing built per recipient.
        for settled in [false, true] {
            if settled {
                assert!(!session.answered() && session.answered());
            }
            let (data, end) = sse.addressed(&form, &p, &session);
            assert!(data.starts_with(b"data: {") && data.ends_with(b"}\n"));
            assert_eq!(data.as_ptr(), form.as_ptr(), "shared, not copied");
            assert_eq!(&end.unwrap()[..], b"\n");
        }
        // The cursor the turn's end hands out covers the publication.
        session.advance("b", p.position);
        assert_eq!(
            &sse.cursor(&session).unwrap()[..],
            b"id: 0000000000000001:9,0000000000000001:3\n\n"
        );
        let mut one = Session::default();
        one.keep_cursor(&[None]);
        assert!(!sse.defers_cursor(&one), "its events carry the cursor");
    }

    #[test]
    fn the_opening_hands_out_the_cursor_once() {
        let sse = ServerSentEvents;
        let mut session = Session::default();
        session.keep_cursor(&[None, Some(Position::new(Epoch(1), 4))]);
        for (name, offset) in [("a", 7), ("b", 4)] {
            session.subscriptions.push(Arc::from(name));
            session.advance(name, Position::new(Epoch(1), offset));
            let json = format!(r#"{{"op":"subscribed","subject":"{name}"}}"#);
            let reply = sse.reply(json.as_bytes(), &session);
            assert!(!reply.windows(3).any(|w| w == b"id:"), "a reply has no id");
            session.answered();
        }
        assert_eq!(
            &sse.cursor(&session).unwrap()[..],
            b"id: 0000000000000001:7,0000000000000001:4\n\n"
        );
    }

    #[test]
    fn replies_heartbeats_and_endings() {
        let sse = ServerSentEvents;
        let mut session = Session::default();
        session.keep_cursor(&[Some(Position::new(Epoch(2), 5))]);
        session.subscriptions.push(Arc::from("a"));
        session.answered();
        let reply = sse.reply(br#"{"op":"subscribed","subject":"a"}"#, &session);
        assert_eq!(
            &reply[..],
            b"event: subscribed\ndata: {\"op\":\"subscribed\",\"subject\":\"a\"}\n\n"
        );
        assert_eq!(
            &sse.cursor(&session).unwrap()[..],
            b"id: 0000000000000002:5\n\n"
        );
        assert_eq!(&sse.heartbeat()[..], b": heartbeat\n\n");
        let close = sse.close(CloseReason::SlowConsumer).unwrap();
        assert!(close.starts_with(b"event: close\ndata: {\"op\":\"close\",\"code\":4001"));
        assert!(sse.close(CloseReason::Abnormal).is_none());
        let opening = sse.opening(&Config::default()).unwrap();
        let text = std::str::from_utf8(&opening).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"));
        assert!(text.contains("Access-Control-Allow-Origin: *\r\n"));
        assert!(text.ends_with("\r\n\r\nretry: 2000\n\n"));
    }
}
