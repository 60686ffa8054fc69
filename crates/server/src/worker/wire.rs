//! The worker's side of [`Wire`]: what the subscription core queues lands
//! on the connections of the worker's slab, with the bookkeeping the loop
//! needs to write it (the turn's flush list, the connections over their
//! outbound limit, the long-polls that may be answered, the frames queued
//! across all of them).
//!
//! [`Out`] borrows those parts of the worker for one call into the core,
//! so the core and the loop never hold each other; the worker's own
//! queueing (handshake responses, close frames, pings) goes through it as
//! well, so there is one way to queue.

use bytes::Bytes;
use slab::Slab;

use crate::conn::{flags, Conn};
use crate::metrics::WorkerMetrics;
use crate::registry::ConnId;
use crate::sessions::Wire;
use crate::transport::TransportKind;

/// The worker's slab and turn lists, borrowed for one call (see the
/// module header).
pub(super) struct Out<'a> {
    pub conns: &'a mut Slab<Conn>,
    /// Connections with output queued this turn.
    pub dirty: &'a mut Vec<ConnId>,
    /// Connections found over their outbound limit while queueing.
    pub slow: &'a mut Vec<ConnId>,
    /// Held long-polls that got something this turn.
    pub answering: &'a mut Vec<ConnId>,
    /// Frames queued on the worker's connections, across all of them.
    pub queued_frames: &'a mut usize,
    /// Live publications queued this turn, per transport: counted into
    /// `messages_out` once per mailbox batch, not once per recipient.
    pub delivered: &'a mut [u64; TransportKind::COUNT],
    pub metrics: &'a WorkerMetrics,
    pub max_outbound_bytes: usize,
}

impl Out<'_> {
    /// Queues `bytes` (a frame or an HTTP response) for `id` and schedules
    /// a flush this turn. Control frames and handshake responses go
    /// straight here: they are not messages.
    pub fn queue(&mut self, id: ConnId, bytes: Bytes) {
        let conn = &mut self.conns[id as usize];
        let pending = conn.queue(bytes);
        *self.queued_frames += 1;
        if conn.set_flag(flags::DIRTY) {
            self.dirty.push(id);
        }
        if pending > self.max_outbound_bytes && conn.phase.is_open() {
            self.slow.push(id);
        }
    }

    /// Queues a data message (reply or echo) for `id`: counted in
    /// `messages_out`, like deliveries.
    pub fn queue_message(&mut self, id: ConnId, bytes: Bytes) {
        self.metrics.messages_out.inc();
        let kind = self.conns[id as usize].transport;
        self.metrics.transports[kind.index()].messages_out.inc();
        self.queue(id, bytes);
    }
}

impl Wire for Out<'_> {
    fn transport(&self, id: ConnId) -> TransportKind {
        self.conns[id as usize].transport
    }

    fn open_transport(&self, id: ConnId) -> Option<TransportKind> {
        self.conns
            .get(id as usize)
            .filter(|c| c.phase.is_open())
            .map(|c| c.transport)
    }

    fn pending_bytes(&self, id: ConnId) -> usize {
        self.conns[id as usize].pending_bytes()
    }

    fn reply(&mut self, id: ConnId, bytes: Bytes) {
        let conn = &mut self.conns[id as usize];
        // A posted command is answered by its one reply.
        if conn.transport == TransportKind::Command && conn.has_flag(flags::HELD) {
            conn.set_flag(flags::NEWS);
            self.answering.push(id);
        }
        self.queue_message(id, bytes);
    }

    fn message(&mut self, id: ConnId, bytes: Bytes) {
        self.queue_message(id, bytes);
    }

    fn send(&mut self, id: ConnId, bytes: Bytes) {
        self.queue(id, bytes);
    }

    fn deliver(&mut self, id: ConnId, kind: TransportKind, bytes: Bytes, more: Option<Bytes>) {
        let conn = &mut self.conns[id as usize];
        let mut pending = conn.queue(bytes);
        if let Some(more) = more {
            pending = conn.queue(more);
            *self.queued_frames += 1;
        }
        self.delivered[kind.index()] += 1;
        *self.queued_frames += 1;
        if conn.set_flag(flags::DIRTY) {
            self.dirty.push(id);
        }
        if conn.has_flag(flags::HELD) && conn.set_flag(flags::NEWS) {
            self.answering.push(id);
        }
        if pending > self.max_outbound_bytes {
            self.slow.push(id);
        }
    }

    fn settled(&mut self, id: ConnId, replayed: bool) {
        let conn = &mut self.conns[id as usize];
        if conn.has_flag(flags::HELD) {
            if replayed {
                conn.set_flag(flags::NEWS);
            }
            self.answering.push(id);
        }
    }
}
