//! The HTTP request every client connection opens with, and the long-poll
//! answers after which a kept-alive connection waits for the next one.
//!
//! A request is routed by path to an endpoint: the WebSocket pub/sub or
//! echo endpoint (an upgrade), or one of the HTTP transports, which the
//! request opens with its subjects and cursor. Refusals get their status
//! and close. What each transport puts on the wire is its own module's
//! business (`crate::transport`); this file only moves a connection
//! between phases and subscribes it, the same way for every transport.

use std::sync::Arc;

use bytes::Bytes;
use myriad_protocol::close::CloseReason;
use myriad_protocol::handshake::{parse_request, switching_protocols, RequestHead};
use myriad_protocol::message::{parse_command, Command, ErrorCode};

use super::{Flow, Worker};
use crate::auth::Verified;
use crate::config::Config;
use crate::conn::{flags, Phase};
use crate::metrics::ErrorKind;
use crate::registry::ConnId;
use crate::sessions::Bucket;
use crate::transport::http::{
    check_origin, error_response, parse_stream_request, parse_upgrade_query, preflight_response,
    RequestError, StreamRequest,
};
use crate::transport::{self, TransportKind};

/// Where a request path leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    /// A WebSocket upgrade, into this phase.
    WebSocket(Phase),
    Http(TransportKind),
}

fn route(config: &Config, path: &str) -> Option<Endpoint> {
    if path == config.ws_path {
        Some(Endpoint::WebSocket(Phase::PubSub))
    } else if config.echo_path.as_deref() == Some(path) {
        Some(Endpoint::WebSocket(Phase::Echo))
    } else if path == config.sse_path {
        Some(Endpoint::Http(TransportKind::Sse))
    } else if path == config.stream_path {
        Some(Endpoint::Http(TransportKind::Stream))
    } else if path == config.poll_path {
        Some(Endpoint::Http(TransportKind::Poll))
    } else if path == config.cmd_path {
        Some(Endpoint::Http(TransportKind::Command))
    } else {
        None
    }
}

impl Worker {
    /// Handles the request at the front of `buf`. Returns the bytes it
    /// consumed, or `None` while the request is incomplete. A refused
    /// request consumes the whole buffer: nothing after it is read.
    pub(super) fn on_request(&mut self, id: ConnId, buf: &[u8]) -> Option<usize> {
        let shared = Arc::clone(&self.shared);
        let config = &shared.config;
        let head = match parse_request(buf, config.max_request_head) {
            Ok(None) => return None,
            Ok(Some(head)) => head,
            Err(e) => {
                self.refuse_request(id, ErrorKind::Handshake(e.status()), e.response());
                return Some(buf.len());
            }
        };
        let Some(endpoint) = route(config, head.path) else {
            let response = error_response(404, "not_found", "no such endpoint", &[]);
            self.refuse_request(id, ErrorKind::Handshake(404), response);
            return Some(buf.len());
        };
        // Admission refusals, decided at accept: both say when to come back.
        let refusal = if self.conns[id as usize].has_flag(flags::OVER_CAPACITY) {
            Some((
                503,
                "over_capacity",
                "server at max_connections",
                ErrorKind::OverCapacity,
            ))
        } else if self.sessions.abuse.over_ip_limit(id) {
            Some((
                429,
                "too_many_connections",
                "this address holds max_connections_per_ip connections",
                ErrorKind::OverIpLimit,
            ))
        } else {
            None
        };
        if let Some((status, code, message, kind)) = refusal {
            let response = error_response(status, code, message, &[("Retry-After", "1")]);
            self.refuse_request(id, kind, response);
            return Some(buf.len());
        }
        if let Err(e) = check_origin(&head, config) {
            self.refuse_request(id, ErrorKind::Request(e.label()), e.response(config));
            return Some(buf.len());
        }
        match endpoint {
            Endpoint::WebSocket(phase) => match head.upgrade() {
                Ok(upgrade) => {
                    let who = match self.sessions.upgrade_credentials(id, &head) {
                        Ok(who) => who,
                        Err(e) => {
                            self.refuse_request(
                                id,
                                ErrorKind::Request(e.label()),
                                e.response(config),
                            );
                            return Some(buf.len());
                        }
                    };
                    let (kind, extensions) =
                        transport::ws::upgrade(head.extension_offers(), config);
                    self.set_transport(id, kind);
                    let now = self.clock.tick();
                    let conn = &mut self.conns[id as usize];
                    conn.enter(phase, now);
                    conn.last_message = now;
                    // The request was whole, so the peer is live; a ping
                    // a long-poll left on a kept-alive connection is moot.
                    conn.last_heard = now;
                    conn.ping_sent = 0;
                    let accept = switching_protocols(upgrade.key, None, extensions.as_deref());
                    self.send(id, Bytes::from(accept));
                    // The echo endpoint carries no pub/sub, so no feeds.
                    if phase == Phase::PubSub {
                        let (user, access) = who.user_and_access();
                        if let Some(user) = user {
                            let (sessions, mut out) = self.split();
                            sessions.open_as_user(id, user, access, &mut out);
                        }
                    }
                    Some(upgrade.header_len)
                }
                Err(e) => {
                    self.refuse_request(id, ErrorKind::Handshake(e.status()), e.response());
                    Some(buf.len())
                }
            },
            Endpoint::Http(kind) if head.method == "OPTIONS" => {
                // A CORS preflight: answered, then the connection ends.
                let post = kind == TransportKind::Command;
                self.end_after(id, Bytes::from(preflight_response(config, post)), None);
                Some(buf.len())
            }
            Endpoint::Http(kind)
                if kind.get().capabilities().answers_once
                    && self.conns[id as usize].pending_bytes() > 0 =>
            {
                // The previous answer is not out yet: the client pipelined.
                let response =
                    error_response(400, "pipelined", "wait for the previous answer", &[]);
                self.refuse_request(id, ErrorKind::Handshake(400), response);
                Some(buf.len())
            }
            Endpoint::Http(TransportKind::Command) => self.on_posted_command(id, &head, buf),
            Endpoint::Http(kind) => {
                let admitted = parse_stream_request(&head, config)
                    .and_then(|r| self.sessions.admit_stream(id, &head, r))
                    .and_then(|(request, who)| {
                        // Each request subscribes anew, so a loop of polls
                        // spends subscription changes like subscribes do.
                        let changes = request.subjects.len() as u32;
                        if self.sessions.abuse.take(id, Bucket::Subscribe, changes) {
                            Ok((request, who))
                        } else {
                            Err(RequestError::RateLimited)
                        }
                    });
                match admitted {
                    Ok((request, who)) => {
                        self.open_http(id, kind, request, who, !head.connection_close);
                        Some(head.header_len)
                    }
                    Err(e) => {
                        self.refuse_request(id, ErrorKind::Request(e.label()), e.response(config));
                        Some(buf.len())
                    }
                }
            }
        }
    }

    /// A command posted to the command endpoint (see `transport::cmd`):
    /// `None` until its body is whole. It is admitted as a WebSocket's
    /// upgrade would be (its token in `Authorization`, or `?user=` on a
    /// node that checks none), then run as that WebSocket's command would
    /// be, and answered with its reply once the engine has it.
    fn on_posted_command(
        &mut self,
        id: ConnId,
        head: &RequestHead<'_>,
        buf: &[u8],
    ) -> Option<usize> {
        let shared = Arc::clone(&self.shared);
        let config = &shared.config;
        let limit = config.max_message_size;
        let length = match head.content_length {
            _ if head.method != "POST" => Err(RequestError::MethodNotAllowed("POST")),
            None if head.has_body => Err(RequestError::LengthRequired),
            None => Ok(0),
            Some(len) if len > limit as u64 => Err(RequestError::BodyTooLarge { len, limit }),
            Some(len) => Ok(len as usize),
        };
        let admitted = length.and_then(|len| {
            // The token travels in a header, never in a URL that logs keep.
            match parse_upgrade_query(head.query)? {
                q if q.token.is_some() => Err(RequestError::UnknownParameter("token".into())),
                _ => Ok(len),
            }
        });
        let len = match admitted {
            Ok(len) => len,
            Err(e) => {
                self.refuse_request(id, ErrorKind::Request(e.label()), e.response(config));
                return Some(buf.len());
            }
        };
        let end = head.header_len + len;
        let body = buf.get(head.header_len..end)?;
        let who = match self.sessions.upgrade_credentials(id, head) {
            Ok(who) => who,
            Err(e) => {
                self.refuse_request(id, ErrorKind::Request(e.label()), e.response(config));
                return Some(buf.len());
            }
        };
        let now = self.clock.tick();
        self.set_transport(id, TransportKind::Command);
        let conn = &mut self.conns[id as usize];
        conn.enter(Phase::PubSub, now);
        conn.last_message = now;
        conn.last_heard = now;
        conn.ping_sent = 0;
        conn.set_flag(flags::HELD);
        if head.connection_close {
            conn.clear_flag(flags::KEEP_ALIVE);
        } else {
            conn.set_flag(flags::KEEP_ALIVE);
        }
        self.metrics.messages_in.inc();
        // As on a stream: the caller's identity for this one request, with
        // no feeds, so the user is not made present.
        let (user, access) = who.user_and_access();
        let (sessions, mut out) = self.split();
        sessions.act_as(id, user, access);
        let Ok(text) = std::str::from_utf8(body) else {
            let detail = "the body is not UTF-8";
            sessions.refuse(id, None, ErrorCode::InvalidJson, detail, &mut out);
            return Some(end);
        };
        let command = match parse_command(text, config.max_subject_len) {
            Ok(command) => command,
            Err(e) => {
                sessions.refuse(id, e.id, e.code, &e.detail, &mut out);
                return Some(end);
            }
        };
        match command {
            Command::Publish { id: None, .. }
            | Command::Send { id: None, .. }
            | Command::History { id: None, .. }
            | Command::Presence { id: None, .. }
            | Command::PresenceStats { id: None, .. } => {
                let detail = "a posted command needs an id: its reply is the answer";
                sessions.refuse(id, None, ErrorCode::MissingField, detail, &mut out);
            }
            Command::Publish { .. }
            | Command::Send { .. }
            | Command::History { .. }
            | Command::Presence { .. }
            | Command::PresenceStats { .. } => {
                // A congested engine pauses a WebSocket's reading; here the
                // held answer already keeps one command in flight.
                let _ = sessions.run_command(id, command, &mut out);
            }
            other => {
                let detail =
                    "only publish, send, history, presence and presence_stats are posted; \
                              a stream changes its subjects by reopening with its cursor";
                sessions.refuse(id, other.id(), ErrorCode::UnknownOp, detail, &mut out);
            }
        }
        Some(end)
    }

    /// Answers a request with an error and ends the connection.
    fn refuse_request(&mut self, id: ConnId, kind: ErrorKind, response: Vec<u8>) {
        self.shared.metrics.error(kind);
        self.end_after(
            id,
            Bytes::from(response),
            Some(CloseReason::HandshakeRejected),
        );
    }

    /// Sends `bytes` and closes once they are out, counting `reason`
    /// (`None`: a normal end).
    fn end_after(&mut self, id: ConnId, bytes: Bytes, reason: Option<CloseReason>) {
        let now = self.clock.tick();
        self.conns[id as usize].enter(Phase::Closing, now);
        self.decide_close(id, reason.unwrap_or(CloseReason::Normal));
        self.send(id, bytes);
    }

    /// Opens an HTTP transport: the response starts (unless it is a
    /// long-poll, whose head waits for its answer) and each subject is
    /// subscribed from its cursor entry.
    fn open_http(
        &mut self,
        id: ConnId,
        kind: TransportKind,
        request: StreamRequest,
        who: Option<Verified>,
        keep_alive: bool,
    ) {
        let now = self.clock.tick();
        let transport = kind.get();
        let can = transport.capabilities();
        self.set_transport(id, kind);
        let conn = &mut self.conns[id as usize];
        conn.enter(Phase::PubSub, now);
        conn.last_message = now;
        conn.ping_sent = now;
        if can.answers_once {
            conn.set_flag(flags::HELD);
            if keep_alive {
                conn.set_flag(flags::KEEP_ALIVE);
            } else {
                conn.clear_flag(flags::KEEP_ALIVE);
            }
        }
        if let Some(opening) = transport.opening(&self.shared.config) {
            self.send(id, opening);
        }
        let (sessions, mut out) = self.split();
        // Each request of a kept-alive connection brings its own token. An
        // HTTP transport carries no feeds, so the user is not made present.
        let (user, access) = who.map_or((None, None), |v| (Some(v.user), Some(v.access)));
        sessions.act_as(id, user, access);
        if can.keeps_cursor {
            sessions.keep_cursor(id, &request.since);
        }
        for (subject, since) in request.subjects.iter().zip(request.since) {
            sessions.add_subscription(id, subject, since, None, &mut out);
        }
    }

    /// Input after an HTTP transport's request. The streams have nothing
    /// to hear, so it is read and dropped. A client that sends again before
    /// its long-poll is answered is pipelining, which no browser does and
    /// this server does not take: the next request is refused (400
    /// `pipelined`) and the connection closed. HTTP answers in order, so the
    /// held poll is answered first, as soon as none of its subscriptions is
    /// still attaching: before that its cursor would not hold the client's
    /// position yet (a subject polled without `since` has none until its
    /// attach says where it stands).
    pub(super) fn after_request(
        &mut self,
        id: ConnId,
        unread: usize,
        used: usize,
    ) -> (Flow, usize) {
        let conn = &mut self.conns[id as usize];
        if unread > 0 && conn.has_flag(flags::HELD) && conn.close_reason.is_none() {
            // The close reason marks the refusal owed after the answer (see
            // `answer_now`); NEWS lets the answer go once it is whole.
            conn.set_flag(flags::NEWS);
            self.shared.metrics.error(ErrorKind::Handshake(400));
            self.decide_close(id, CloseReason::HandshakeRejected);
            self.answering.push(id);
        }
        (Flow::Continue, used + unread)
    }

    /// Records `id`'s transport, moving it between the per-transport
    /// connection gauges.
    pub(super) fn set_transport(&mut self, id: ConnId, kind: TransportKind) {
        let conn = &mut self.conns[id as usize];
        if conn.has_flag(flags::COUNTED) {
            if conn.transport == kind {
                return;
            }
            self.metrics.transports[conn.transport.index()]
                .connections
                .dec();
        }
        conn.transport = kind;
        conn.set_flag(flags::COUNTED);
        self.metrics.transports[kind.index()].connections.inc();
    }

    /// Sends the long-polls that became ready this turn: something was
    /// delivered and no subscription is still waiting for its replay.
    pub(super) fn settle_answers(&mut self) {
        for id in std::mem::take(&mut self.answering) {
            let Some(conn) = self.conns.get(id as usize) else {
                continue;
            };
            let ready = conn.has_flag(flags::HELD)
                && conn.has_flag(flags::NEWS)
                && !self.sessions.attaching_any(id);
            if ready {
                self.answer_now(id, true);
            }
        }
    }

    /// Sends a held long-poll's answer: the head and tail around what it
    /// collected. The subscriptions end with it (the cursor in the answer is
    /// where the next poll resumes); a kept-alive connection then waits for
    /// its next request, any other closes, one with a request pipelined
    /// behind the poll after that request's refusal.
    pub(super) fn answer_now(&mut self, id: ConnId, keep_alive_allowed: bool) {
        let now = self.clock.tick();
        let conn = &mut self.conns[id as usize];
        conn.clear_flag(flags::HELD | flags::NEWS);
        // Only `after_request` decides a close on a poll it still holds.
        let pipelined = conn.close_reason == Some(CloseReason::HandshakeRejected);
        let keep_alive = keep_alive_allowed && conn.has_flag(flags::KEEP_ALIVE) && !pipelined;
        let (head, tail) = conn.transport.get().answer(
            conn.pending_bytes(),
            self.sessions.session(id),
            keep_alive,
            &self.shared.config,
        );
        conn.outbound
            .get_or_insert_with(Box::default)
            .push_front(head);
        self.queued_frames += 1;
        self.sessions.unsubscribe_all(id);
        if keep_alive {
            // The next request brings its own token, or none.
            self.sessions.act_as(id, None, None);
            self.conns[id as usize].enter(Phase::Request, now);
            self.send(id, tail);
        } else if pipelined {
            // Counted when the request was read; its answer comes now.
            self.send(id, tail);
            let refusal = error_response(400, "pipelined", "wait for the previous answer", &[]);
            self.end_after(id, Bytes::from(refusal), None);
        } else {
            self.end_after(id, tail, None);
        }
    }
}
