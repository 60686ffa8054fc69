//! The read side of a worker: socket bytes → request (see `request`) →
//! WebSocket frames → messages.
//!
//! Reads land in the worker's scratch buffer and are parsed in place there.
//! Only bytes that end mid-request or mid-frame are copied into the
//! connection's own `inbound` buffer, which exists only until the rest
//! arrives (or a fragmented message is whole); an idle connection has no
//! read buffer. That buffer grows within one largest frame and one read,
//! and says since when it holds an unfinished unit, which the sweep ends
//! at `partial_message_timeout`. Only a whole frame stamps the peer live.

use bytes::Bytes;
use myriad_protocol::close::CloseReason;
use myriad_protocol::ws::{encode_close, encode_frame, Message, MessageReader, OpCode, Read};

use super::{Flow, Worker};
use crate::conn::{flags, Inbound, Phase};
use crate::registry::ConnId;

impl Worker {
    /// Reads from `id` until the socket is drained, the per-turn budget is
    /// spent, or publishing must pause.
    ///
    /// A read shorter than the buffer means the socket was drained: epoll is
    /// edge-triggered and reports anything arriving later as a new event, so
    /// the loop stops there instead of paying for a read that only says
    /// EAGAIN. With `drain_to_eof` it reads on until EAGAIN, EOF or an error:
    /// when the peer has shut its side or the socket has an error (so the end
    /// is seen now), and when resuming a deferred read, whose edge has been
    /// spent already.
    pub(super) fn on_readable(&mut self, id: ConnId, drain_to_eof: bool) {
        let mut budget = super::READ_BUDGET_BYTES;
        loop {
            if self.shared.engine.congested() && self.conns.contains(id as usize) {
                self.pause_read(id);
                return;
            }
            let Some(conn) = self.conns.get_mut(id as usize) else {
                return;
            };
            let mut scratch = std::mem::take(&mut self.scratch);
            let result = conn.link().read(&mut scratch);
            let input = match result {
                Ok(input) => input,
                Err(e) => {
                    self.scratch = scratch;
                    self.on_link_error(id, e);
                    return;
                }
            };
            if input.established {
                self.metrics.tls_handshakes.inc();
            }
            if input.wire > 0 {
                self.metrics.bytes_in.inc_by(input.wire as u64);
                // A fresh reading per read: what it brought arrived by
                // now, so stamps made while handling it are not early.
                // Liveness is stamped per whole frame, in `parse`: bytes
                // alone prove nothing (a frame trickled a byte at a time
                // would keep a connection and its buffer forever).
                self.clock.tick();
                budget = budget.saturating_sub(input.wire);
            }
            let flow = if input.plain > 0 {
                self.ingest(id, &mut scratch[..input.plain])
            } else {
                Flow::Continue
            };
            self.scratch = scratch;
            if input.end {
                // EOF or TLS close_notify: mid-close this is the expected
                // end (the reason is already set); otherwise it ends
                // without a close frame.
                self.drop_conn(id);
                return;
            }
            if input.wire == 0 || (input.drained && !drain_to_eof && flow == Flow::Continue) {
                return;
            }
            match flow {
                Flow::Stop => return,
                Flow::Pause => {
                    self.pause_read(id);
                    return;
                }
                Flow::Continue if budget == 0 => {
                    self.defer_read(id);
                    return;
                }
                Flow::Continue => {}
            }
        }
    }

    /// Holds `id`'s reading until [`Worker::resume_deferred_reads`];
    /// returns whether it was not held already.
    fn defer_read(&mut self, id: ConnId) -> bool {
        let fresh = self.conns[id as usize].set_flag(flags::READ_DEFERRED);
        if fresh {
            self.deferred_reads.push(id);
        }
        fresh
    }

    /// Holds `id`'s reading because the node is congested, and counts it:
    /// a publisher held here is what an operator sees as backpressure.
    fn pause_read(&mut self, id: ConnId) {
        if self.defer_read(id) {
            self.metrics.reads_paused.inc();
        }
    }

    /// Continues connections whose reading was cut short, unless publishers
    /// must still wait for the mailboxes to drain.
    pub(super) fn resume_deferred_reads(&mut self) {
        if self.deferred_reads.is_empty() || self.shared.engine.congested() {
            return;
        }
        for id in std::mem::take(&mut self.deferred_reads) {
            let Some(conn) = self.conns.get_mut(id as usize) else {
                continue;
            };
            conn.clear_flag(flags::READ_DEFERRED);
            // Input already buffered goes first, then the socket. Paused
            // again means back on the list: its readiness edge is spent, so
            // nothing else would ever come back to it.
            match self.ingest(id, &mut []) {
                Flow::Continue => self.on_readable(id, true),
                Flow::Pause => self.pause_read(id),
                Flow::Stop => {}
            }
        }
    }

    /// Parses `fresh` bytes (behind any buffered remainder) as far as whole
    /// units go and keeps the rest for the next read, with when the unit
    /// it is part of began (`partial_message_timeout`).
    fn ingest(&mut self, id: ConnId, fresh: &mut [u8]) -> Flow {
        let bound = self.inbound_bound();
        let mut whole = false;
        let (flow, inbound) = match self.conns[id as usize].inbound.take() {
            Some(mut inbound) => {
                append_bounded(&mut inbound.bytes, fresh, bound);
                let (flow, used) = self.parse(id, &mut inbound.bytes, &mut whole);
                inbound.bytes.drain(..used);
                (flow, Some(inbound))
            }
            None => {
                let (flow, used) = self.parse(id, fresh, &mut whole);
                let rest = &fresh[used..];
                let inbound = (!rest.is_empty()).then(|| {
                    Box::new(Inbound {
                        bytes: rest.to_vec(),
                        since: 0,
                    })
                });
                (flow, inbound)
            }
        };
        if flow == Flow::Stop {
            return flow;
        }
        let now = self.clock.now;
        if let Some(conn) = self.conns.get_mut(id as usize) {
            let unparsed = inbound.as_ref().is_some_and(|i| !i.bytes.is_empty());
            conn.inbound = if unparsed || conn.reader.in_message() {
                let mut inbound = inbound.unwrap_or_default();
                if inbound.bytes.is_empty() {
                    // Fragments only: the read buffer goes, the stamp stays.
                    inbound.bytes = Vec::new();
                }
                // What is held began in this read if a whole unit came
                // before it; otherwise it goes on from before. The reading
                // is this read's, or a later one's for input held back:
                // never before the bytes arrived (see `Clock`).
                if whole || inbound.since == 0 {
                    inbound.since = now;
                }
                Some(inbound)
            } else {
                None
            };
        }
        flow
    }

    /// The most one incomplete unit can need: a request head with a posted
    /// command of the largest message, or a frame of the largest message
    /// with the longest header.
    fn inbound_bound(&self) -> usize {
        let frame = self.limits.max_message + myriad_protocol::ws::MAX_HEADER_LEN;
        frame.max(self.shared.config.max_request_head + self.shared.config.max_message_size)
    }

    /// Consumes whole requests and frames from the front of `buf`; returns
    /// how far it got, and sets `whole` once it consumed a whole unit (a
    /// request, a message, or a control frame between messages). Once an
    /// HTTP transport is open the client has nothing more to say on it but
    /// its next request (see `after_request`).
    fn parse(&mut self, id: ConnId, buf: &mut [u8], whole: &mut bool) -> (Flow, usize) {
        let mut used = 0;
        loop {
            let Some(conn) = self.conns.get_mut(id as usize) else {
                return (Flow::Stop, used);
            };
            if used == buf.len() {
                return (Flow::Continue, used);
            }
            if conn.phase != Phase::Request && !conn.transport.get().capabilities().bidirectional {
                return self.after_request(id, buf.len() - used, used);
            }
            match conn.phase {
                Phase::Request => match self.on_request(id, &buf[used..]) {
                    Some(n) => {
                        used += n;
                        *whole = true;
                    }
                    None => return (Flow::Continue, used),
                },
                // Answering the peer's close, or refused at handshake: the
                // rest of the input has no meaning any more.
                Phase::Draining => return (Flow::Continue, buf.len()),
                Phase::Closing if conn.close_reason == Some(CloseReason::HandshakeRejected) => {
                    return (Flow::Continue, buf.len())
                }
                Phase::PubSub | Phase::Echo | Phase::Closing => {
                    let mut reader = std::mem::take(&mut conn.reader);
                    let (flow, n) = self.next_frame(id, &mut reader, &mut buf[used..]);
                    reader.release();
                    if let Some(conn) = self.conns.get_mut(id as usize) {
                        if n > 0 {
                            // A whole frame: the peer is live, and any frame
                            // answers a ping. The reading is the read's that
                            // brought it, or later (see `Clock`).
                            conn.last_heard = self.clock.now;
                            conn.ping_sent = 0;
                            *whole |= !reader.in_message();
                        }
                        conn.reader = reader;
                    }
                    used += n;
                    match flow {
                        Flow::Continue if n > 0 => {}
                        Flow::Continue => return (Flow::Continue, used),
                        other => return (other, used),
                    }
                }
            }
        }
    }

    /// Reads one frame; `(Continue, 0)` means it is not complete yet.
    fn next_frame(
        &mut self,
        id: ConnId,
        reader: &mut MessageReader,
        buf: &mut [u8],
    ) -> (Flow, usize) {
        // The worker's one inflater, lent for the frame (see `deflate`).
        let inflates = self.conns[id as usize].transport.inflates();
        let mut inflater = std::mem::take(&mut self.inflater);
        let read = reader.read_deflate(buf, &self.limits, inflates.then_some(&mut inflater));
        let outcome = match read {
            Ok(Read::Incomplete { .. }) => (Flow::Continue, 0),
            Ok(Read::Frame { consumed, message }) => {
                let flow = match message {
                    Some(message) => self.on_message(id, message),
                    None => Flow::Continue,
                };
                (flow, consumed)
            }
            Err(e) => {
                crate::deflate::count_refusal(&e);
                let reason = e.close_reason();
                debug_assert!(matches!(
                    reason,
                    CloseReason::ProtocolError
                        | CloseReason::InvalidUtf8
                        | CloseReason::MessageTooBig
                ));
                self.fail(id, reason);
                (Flow::Stop, buf.len())
            }
        };
        self.inflater = inflater;
        outcome
    }

    /// Ends a connection whose peer broke the protocol: close frame, then
    /// nothing more is read from it (RFC 6455 §7.1.7, "fail the connection").
    fn fail(&mut self, id: ConnId, reason: CloseReason) {
        if self.conns[id as usize].phase == Phase::Closing {
            self.drop_conn(id);
            return;
        }
        self.close(id, reason);
    }

    /// Handles one complete message or control frame.
    fn on_message(&mut self, id: ConnId, message: Message<'_>) -> Flow {
        let now = self.clock.now;
        let phase = self.conns[id as usize].phase;
        if phase == Phase::Closing {
            // After our close frame only the peer's close matters (§5.5.1).
            if let Message::Close(_) = message {
                self.drop_conn(id);
                return Flow::Stop;
            }
            return Flow::Continue;
        }
        match message {
            Message::Ping(payload) => {
                self.send(id, Bytes::from(encode_frame(OpCode::Pong, payload, None)));
                Flow::Continue
            }
            Message::Pong(_) => Flow::Continue,
            Message::Close(status) => {
                // Echo the peer's code (or none) and close once it is sent.
                let reply = match status {
                    Some((code, _)) => encode_close(code, "", None),
                    None => encode_frame(OpCode::Close, &[], None),
                };
                self.conns[id as usize].enter(Phase::Draining, self.clock.tick());
                self.decide_close(id, CloseReason::Normal);
                self.sessions.unsubscribe_all(id);
                self.send(id, Bytes::from(reply));
                Flow::Stop
            }
            Message::Text(text) => {
                self.metrics.messages_in.inc();
                self.conns[id as usize].last_message = now;
                if phase == Phase::Echo {
                    self.send_message(
                        id,
                        Bytes::from(encode_frame(OpCode::Text, text.as_bytes(), None)),
                    );
                    Flow::Continue
                } else {
                    let (sessions, mut out) = self.split();
                    sessions.on_command(id, text, &mut out)
                }
            }
            Message::Binary(data) => {
                self.metrics.messages_in.inc();
                self.conns[id as usize].last_message = now;
                if phase == Phase::Echo {
                    self.send_message(id, Bytes::from(encode_frame(OpCode::Binary, data, None)));
                    Flow::Continue
                } else {
                    // Protocol v1 is JSON text only.
                    self.close(id, CloseReason::UnsupportedData);
                    Flow::Stop
                }
            }
        }
    }
}

/// Appends `fresh` to `buffered`, doubling its room as `Vec` would but
/// not past `bound` unless these bytes need more: the room a connection
/// holds stays within one largest unit and one read, where doubling alone
/// could reach twice that.
fn append_bounded(buffered: &mut Vec<u8>, fresh: &[u8], bound: usize) {
    let needed = buffered.len() + fresh.len();
    if needed > buffered.capacity() {
        let target = (buffered.capacity() * 2).clamp(needed, bound.max(needed));
        buffered.reserve_exact(target - buffered.len());
    }
    buffered.extend_from_slice(fresh);
}

#[cfg(test)]
mod tests {
    use super::append_bounded;

    #[test]
    fn held_input_doubles_but_never_past_its_bound() {
        let mut buffered = Vec::new();
        append_bounded(&mut buffered, &[1; 100], 1_000);
        append_bounded(&mut buffered, &[2; 1], 1_000);
        assert!(
            buffered.capacity() >= 200,
            "doubles: {}",
            buffered.capacity()
        );
        for _ in 0..8 {
            append_bounded(&mut buffered, &[3; 100], 1_000);
            assert!(buffered.capacity() <= 1_000, "{}", buffered.capacity());
        }
        // Bytes that need more than the bound get exactly what they need.
        append_bounded(&mut buffered, &[4; 500], 1_000);
        assert_eq!(buffered.len(), 1_401);
        assert!(buffered.capacity() < 1_500, "{}", buffered.capacity());
        assert_eq!(buffered[0], 1);
        assert_eq!(buffered[1_400], 4);
    }
}
