//! The transport seam: how a connection's traffic is put on the wire.
//!
//! The worker loop, the session and the engine know nothing of wire
//! formats; whatever they send to a client goes through the connection's
//! [`Transport`]: the response that opens an HTTP transport, a
//! publication, a protocol reply, the heartbeat, a long-poll's answer, and
//! the last words when the server ends the connection for a
//! [`CloseReason`]. A transport says what it can do in its
//! [`Capabilities`], so the worker asks instead of testing which transport
//! it has.
//!
//! A connection stores only its [`TransportKind`] (one byte); the
//! transports themselves are stateless statics. Each lives in one module:
//! WebSocket ([`ws`]), Server-Sent Events ([`sse`]), HTTP streaming of
//! newline-delimited JSON ([`stream`]), long-poll ([`poll`]), and the
//! command endpoint ([`cmd`]), which answers one posted command. What the
//! HTTP ones share (reading the request's subjects and cursor, response
//! heads, CORS) is in [`http`]. Adding a transport is one module here and
//! one variant of [`TransportKind`].

pub mod cmd;
pub mod http;
pub mod poll;
pub mod sse;
pub mod stream;
pub mod ws;

use bytes::Bytes;
use myriad_protocol::close::CloseReason;

use crate::config::Config;
use crate::publication::Publication;
use crate::session::Session;

/// How a transport keeps a connection alive while nothing is published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heartbeat {
    /// A ping the client answers, after between half of
    /// `heartbeat_interval` and all of it of client silence (`ping_after`);
    /// silence after it means the client is gone.
    Answered,
    /// Bytes the client ignores, at least every `stream_heartbeat_interval`
    /// (each stream at a period of its own from half of it, `ping_after`), so that
    /// proxies and clients see a live stream. Nothing comes back.
    OneWay,
    /// None: each exchange is short (long-poll answers within `poll_timeout`).
    None,
}

/// What a transport can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// The client can send commands on the same connection.
    pub bidirectional: bool,
    pub heartbeat: Heartbeat,
    /// The session keeps a cursor (see `session.rs`): the transport tells
    /// the client its positions as one value.
    pub keeps_cursor: bool,
    /// One answer per request: output is held until the answer is ready,
    /// then sent whole, and the connection may carry another request.
    pub answers_once: bool,
}

/// How one kind of connection is written to.
pub trait Transport: Sync {
    fn capabilities(&self) -> Capabilities;

    /// The response head (and anything else) that opens the stream, sent
    /// once the request is accepted. WebSocket's is the 101, sent by the
    /// upgrade code; a long-poll's waits for its answer.
    fn opening(&self, _config: &Config) -> Option<Bytes> {
        None
    }

    /// The bytes carrying `publication`. Called once per publication per
    /// worker, the result shared by every recipient on this transport: it
    /// must not copy per call what it can share.
    fn publication(&self, publication: &Publication, config: &Config) -> Bytes;

    /// For a session that keeps a cursor: what it gets for `publication`
    /// given the shared `form`, when what the form says of the cursor does
    /// not fit the session (an SSE form's id is the publication's position,
    /// the whole cursor of a one-subject stream only). Slices of the form
    /// and static bytes: this runs per delivery. The session's cursor has
    /// already been advanced past `publication`. By default, the shared
    /// form alone.
    fn addressed(
        &self,
        form: &Bytes,
        _publication: &Publication,
        _session: &Session,
    ) -> (Bytes, Option<Bytes>) {
        (form.clone(), None)
    }

    /// The bytes carrying one protocol v1 reply (a JSON object) to `session`.
    fn reply(&self, json: &[u8], session: &Session) -> Bytes;

    /// For a session that keeps a cursor: the bytes that tell the client
    /// the cursor alone, sent at the end of a worker's turn in which it
    /// moved with no event carrying it (the engine answered the last
    /// subject of the opening request, subjects' streams broke, a
    /// publication was [deferred](Transport::defers_cursor)). By default
    /// nothing: the cursor travels otherwise.
    fn cursor(&self, _session: &Session) -> Option<Bytes> {
        None
    }

    /// For a session that keeps a cursor: whether a publication delivered
    /// to it leaves the cursor to [`Transport::cursor`] at the end of the
    /// worker's turn instead of carrying it, so that a burst costs one
    /// cursor, not one per publication. By default not.
    fn defers_cursor(&self, _session: &Session) -> bool {
        false
    }

    /// Whether a subscription that went live unasked (no request id) is
    /// announced with a `subscribed` reply, given its recovery outcome and
    /// whether it is a user's feed (which the server may add unasked). By
    /// default always: a client that resumes from positions it was told
    /// needs the position of a subject it has seen nothing of yet. A failed
    /// recovery must be told on every transport.
    fn announces(&self, _recovered: Option<bool>, _feed: bool) -> bool {
        true
    }

    /// The heartbeat (see [`Heartbeat`]); never called for `Heartbeat::None`.
    fn heartbeat(&self) -> Bytes;

    /// For a transport that [answers once](Capabilities::answers_once): the
    /// head sent before the `body_len` bytes collected, and the tail after
    /// them, carrying `session`'s cursor.
    fn answer(
        &self,
        _body_len: usize,
        _session: &Session,
        _keep_alive: bool,
        _config: &Config,
    ) -> (Bytes, Bytes) {
        unreachable!("only long-poll and the command endpoint answer once")
    }

    /// The last bytes sent when the server ends the connection for `reason`,
    /// if any can be.
    fn close(&self, reason: CloseReason) -> Option<Bytes>;
}

/// Which transport a connection speaks; what the connection stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    WebSocket,
    /// WebSocket with permessage-deflate: publications go compressed.
    WebSocketDeflate,
    /// WebSocket with permessage-deflate whose client limited the server's
    /// window below the one it compresses with: compressed messages are
    /// read, everything is sent uncompressed (see `transport::ws`).
    WebSocketInflateOnly,
    Sse,
    Stream,
    Poll,
    /// `POST` of one command, answered with its reply.
    Command,
}

impl TransportKind {
    /// How many kinds there are, for per-kind caches and metrics.
    pub const COUNT: usize = 7;
    pub const ALL: [TransportKind; Self::COUNT] = [
        TransportKind::WebSocket,
        TransportKind::WebSocketDeflate,
        TransportKind::WebSocketInflateOnly,
        TransportKind::Sse,
        TransportKind::Stream,
        TransportKind::Poll,
        TransportKind::Command,
    ];

    /// The transport itself.
    pub fn get(self) -> &'static dyn Transport {
        match self {
            TransportKind::WebSocket | TransportKind::WebSocketInflateOnly => &ws::WebSocket,
            TransportKind::WebSocketDeflate => &ws::WebSocketDeflate,
            TransportKind::Sse => &sse::ServerSentEvents,
            TransportKind::Stream => &stream::HttpStream,
            TransportKind::Poll => &poll::LongPoll,
            TransportKind::Command => &cmd::CommandPost,
        }
    }

    /// Whether the connection is a WebSocket, with or without
    /// permessage-deflate: the transports that carry server-sent events
    /// other than publications (presence's join and leave).
    pub fn is_websocket(self) -> bool {
        matches!(
            self,
            TransportKind::WebSocket
                | TransportKind::WebSocketDeflate
                | TransportKind::WebSocketInflateOnly
        )
    }

    /// Whether the connection negotiated permessage-deflate, so that its
    /// compressed messages are read (RFC 7692 §6.2).
    pub fn inflates(self) -> bool {
        matches!(
            self,
            TransportKind::WebSocketDeflate | TransportKind::WebSocketInflateOnly
        )
    }

    /// Index for per-kind caches.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The name used in metrics labels, `/stats` and docs.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::WebSocket => "websocket",
            TransportKind::WebSocketDeflate => "websocket_deflate",
            TransportKind::WebSocketInflateOnly => "websocket_inflate_only",
            TransportKind::Sse => "sse",
            TransportKind::Stream => "stream",
            TransportKind::Poll => "poll",
            TransportKind::Command => "cmd",
        }
    }
}

/// What `session` is sent for `publication`, whose form on `kind` is
/// `form`; advances the session's cursor if it keeps one. The one path for
/// live deliveries and replays alike. The flag is true when the delivery
/// left the cursor owed and it was not owed already: the caller lists the
/// connection for the end of its turn (see `Transport::defers_cursor`).
pub fn addressed(
    kind: TransportKind,
    form: &Bytes,
    publication: &Publication,
    session: &mut Session,
) -> (Bytes, Option<Bytes>, bool) {
    if !session.keeps_cursor() {
        return (form.clone(), None, false);
    }
    session.advance(&publication.subject, publication.position);
    let transport = kind.get();
    let (bytes, more) = transport.addressed(form, publication, session);
    // While the stream opens the cursor is owed at its end anyway.
    let owed = session.cursor_settled() && transport.defers_cursor(session) && session.owe_cursor();
    (bytes, more, owed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ALL` is kept by hand; per-transport metrics and `/stats`
    /// read it. A variant added to the enum
    /// breaks the build of `every_variant!` below until it is named here, and
    /// then this fails until `ALL` names it too.
    #[test]
    fn all_names_every_transport() {
        let every = myriad_protocol::every_variant!(
            TransportKind: WebSocket,
            WebSocketDeflate,
            WebSocketInflateOnly,
            Sse,
            Stream,
            Poll,
            Command
        );
        assert_eq!(every, TransportKind::ALL);
        // Per-kind caches index by `index()`, so ALL is in that order too.
        for (at, kind) in TransportKind::ALL.into_iter().enumerate() {
            assert_eq!(kind.index(), at);
        }
    }
}
