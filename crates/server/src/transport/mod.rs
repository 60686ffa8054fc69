//! The transport seam: how a connection's traffic is put on the wire.
//!
//! The worker loop, the session and the engine know nothing of wire
//! formats; whatever they send to a client goes through the connection's
//! [`Transport`]: a publication, a protocol reply, the heartbeat, and the
//! last words when the server ends the connection for a [`CloseReason`].
//! A transport says what it can do in its [`Capabilities`], so the worker
//! asks instead of testing which transport it has.
//!
//! A connection stores only its [`TransportKind`] (one byte); the
//! transports themselves are stateless statics. WebSocket ([`ws`]) is the
//! first; Server-Sent Events, HTTP streaming and long-poll plug in here as
//! one module each plus a variant of [`TransportKind`].

pub mod ws;

use bytes::Bytes;
use myriad_protocol::close::CloseReason;

use crate::publication::Publication;

/// What a transport can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// The client can send commands on the same connection.
    pub bidirectional: bool,
    /// The client answers heartbeats, so silence after one means it is gone.
    pub heartbeat_answered: bool,
}

/// How one kind of connection is written to.
pub trait Transport: Sync {
    fn capabilities(&self) -> Capabilities;

    /// The bytes carrying `publication`. Called once per publication per
    /// worker, the result shared by every recipient on this transport: it
    /// must not copy per call what it can share.
    fn publication(&self, publication: &Publication) -> Bytes;

    /// The bytes carrying one protocol v1 reply (a JSON object).
    fn reply(&self, json: &[u8]) -> Bytes;

    /// The heartbeat, sent after `heartbeat_interval` of client silence.
    fn heartbeat(&self) -> Bytes;

    /// The last bytes sent when the server ends the connection for `reason`,
    /// if any can be.
    fn close(&self, reason: CloseReason) -> Option<Bytes>;
}

/// Which transport a connection speaks; what the connection stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    WebSocket,
}

impl TransportKind {
    /// How many kinds there are, for per-kind caches.
    pub const COUNT: usize = 1;

    /// The transport itself.
    pub fn get(self) -> &'static dyn Transport {
        match self {
            TransportKind::WebSocket => &ws::WebSocket,
        }
    }

    /// Index for per-kind caches.
    pub fn index(self) -> usize {
        self as usize
    }
}
