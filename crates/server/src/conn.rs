//! One client connection's state, as the worker's slab stores it.
//!
//! This struct is what a million idle connections cost, so every field earns
//! its bytes: timestamps are `u32` seconds on the worker's clock, buffers
//! exist only while they hold data (`Option<Box<_>>`). What the connection
//! is subscribed to and who it is (its `Session`, 40 bytes) is not here but
//! in the subscription core's table (`crate::sessions`), one per slab slot.
//! There is no timer and no task per connection: the worker sweeps the
//! slab once a second instead. `tests::connection_state_is_compact` guards
//! the size.

use bytes::Bytes;
use mio::net::TcpStream;
use myriad_protocol::close::CloseReason;
use myriad_protocol::ws::MessageReader;

use crate::link::{Link, Tls};
use crate::outbound::Outbound;
use crate::transport::TransportKind;

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for (the rest of) an HTTP request: the WebSocket upgrade, an
    /// HTTP transport's request, or a kept-alive long-poll's next one.
    Request,
    /// Speaking protocol v1: on the WebSocket pub/sub endpoint, or an HTTP
    /// transport streaming or collecting its answer.
    PubSub,
    /// Echoing every message back (the conformance endpoint).
    Echo,
    /// The server sent its close frame (or an HTTP error). Once the queue
    /// drains the write side is shut; the connection is dropped when the
    /// peer's close frame or EOF arrives, or at the close timeout.
    Closing,
    /// Answering the peer's close: dropped as soon as the queue drains.
    Draining,
}

impl Phase {
    /// True while application messages flow (deliveries are queued only then).
    pub fn is_open(self) -> bool {
        matches!(self, Phase::PubSub | Phase::Echo)
    }
}

/// Bit flags kept in one byte.
pub mod flags {
    /// Listed in the worker's flush list for this turn.
    pub const DIRTY: u8 = 1;
    /// Listed in the worker's read-resume list (input left unread).
    pub const READ_DEFERRED: u8 = 1 << 1;
    /// Arrived while the node was at `max_connections`: refused at handshake.
    pub const OVER_CAPACITY: u8 = 1 << 2;
    /// The write half has been shut after the close frame went out.
    pub const WRITE_SHUT: u8 = 1 << 3;
    /// A long-poll is collecting its answer: output is held, not flushed.
    pub const HELD: u8 = 1 << 4;
    /// The held answer may be sent: a publication is in it, or a request
    /// was pipelined behind it.
    pub const NEWS: u8 = 1 << 5;
    /// The HTTP client allows another request on this connection.
    pub const KEEP_ALIVE: u8 = 1 << 6;
    /// Counted in its transport's connection gauge.
    pub const COUNTED: u8 = 1 << 7;
}

/// Input held until it is whole: a request or frame split across reads,
/// or a fragmented message the connection's `reader` is reassembling. It
/// exists only while there is some, so the stamp costs an idle connection
/// nothing.
#[derive(Default)]
pub struct Inbound {
    /// Bytes read but not yet parsed (empty while only fragments are held).
    pub bytes: Vec<u8>,
    /// When the unit these bytes or fragments belong to began to arrive
    /// (`partial_message_timeout`).
    pub since: u32,
}

/// A client connection.
pub struct Conn {
    /// Read and written through [`Conn::link`], never directly.
    pub socket: TcpStream,
    /// `None` on a plain listener (a null pointer: nothing allocated).
    pub tls: Option<Box<Tls>>,
    pub phase: Phase,
    /// How everything sent to it is encoded.
    pub transport: TransportKind,
    pub flags: u8,
    /// Why it is closing, once decided (and counted, at that moment); a
    /// connection dropped without one is counted by its phase (`drop_conn`).
    /// On a long-poll still held, `HandshakeRejected` means a request was
    /// pipelined behind it: its refusal follows the poll's answer.
    pub close_reason: Option<CloseReason>,
    /// When the current phase began (request, close and long-poll timeouts).
    pub since: u32,
    /// Last time a whole frame arrived (heartbeat liveness). Bytes of a
    /// frame still incomplete do not count: a peer that trickles them holds
    /// its buffer without ever being live.
    pub last_heard: u32,
    /// Last time a message (not a control frame) arrived (idle timeout).
    pub last_message: u32,
    /// When the outstanding heartbeat ping was sent; 0 when none is. On
    /// one-way heartbeats, when the last one was sent.
    pub ping_sent: u32,
    /// Fragmentation state; 8 bytes, boxed state only mid-message.
    pub reader: MessageReader,
    /// Input that is not whole yet; `None` when there is none.
    pub inbound: Option<Box<Inbound>>,
    /// Frames waiting for the socket.
    pub outbound: Option<Box<Outbound>>,
}

impl Conn {
    pub fn new(socket: TcpStream, tls: Option<Box<Tls>>, now: u32) -> Conn {
        Conn {
            socket,
            tls,
            phase: Phase::Request,
            transport: TransportKind::WebSocket,
            flags: 0,
            close_reason: None,
            since: now,
            last_heard: now,
            last_message: now,
            ping_sent: 0,
            reader: MessageReader::new(),
            inbound: None,
            outbound: None,
        }
    }

    /// The connection's byte stream, plain or TLS: the seam every read,
    /// write and shutdown goes through.
    pub fn link(&mut self) -> Link<'_> {
        Link::new(&mut self.socket, &mut self.tls)
    }

    /// Queues a frame; returns the bytes now waiting.
    pub fn queue(&mut self, frame: Bytes) -> usize {
        let out = self.outbound.get_or_insert_with(Box::default);
        out.push(frame);
        out.pending_bytes()
    }

    /// Bytes queued and not yet written.
    pub fn pending_bytes(&self) -> usize {
        self.outbound.as_ref().map_or(0, |out| out.pending_bytes())
    }

    /// Whether anything for the peer waits in userland: queued frames, or
    /// TLS records sealed from them and not yet written.
    pub fn has_unsent(&self) -> bool {
        self.pending_bytes() > 0 || self.tls.as_deref().is_some_and(Tls::has_unsent)
    }

    /// Sets a flag; returns whether it was newly set.
    pub fn set_flag(&mut self, flag: u8) -> bool {
        let was_clear = self.flags & flag == 0;
        self.flags |= flag;
        was_clear
    }

    pub fn clear_flag(&mut self, flag: u8) {
        self.flags &= !flag;
    }

    pub fn has_flag(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// Bytes allocated for input that is not whole yet: the unparsed tail
    /// and the fragments being reassembled.
    pub fn partial_bytes(&self) -> usize {
        self.inbound.as_ref().map_or(0, |i| i.bytes.capacity()) + self.reader.held_bytes()
    }

    /// Enters `phase` at time `now`.
    pub fn enter(&mut self, phase: Phase, now: u32) {
        self.phase = phase;
        self.since = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_state_is_compact() {
        // Slab entries add a discriminant word. Growing this struct grows RSS
        // per idle connection directly: see docs/benchmarks.md before changing.
        // mio's socket carries a selector id in debug builds only (16 bytes
        // instead of the 4-byte descriptor, plus padding). The TLS pointer
        // is 8 of the 56 (null on a plain listener). With the session's 40
        // in the core's table, a connection costs the 96 it did when the
        // session was a field here.
        let limit = if cfg!(debug_assertions) { 72 } else { 56 };
        let size = std::mem::size_of::<Conn>();
        assert!(size <= limit, "Conn is {size} bytes");
    }
}
