//! A worker: one thread, one `epoll` loop, one `SO_REUSEPORT` listener, and
//! the connections it accepted, in a slab.
//!
//! Everything a connection touches on its hot path is owned by the worker
//! that accepted it: its slab entry, the local subject registry and the
//! per-worker scratch buffer all reads land in. Other threads reach a worker
//! only through its hub mailbox (publications and the engine's answers) and
//! the shutdown flag, both of which come with a wake-up.
//!
//! One turn of the loop: poll; accept; read what is readable; take a batch of
//! events from the mailbox (unless its queues are past their high water and
//! still draining) and queue what they carry; then flush every connection
//! that got output this turn, each with one `writev` per 64 frames queued.
//! Queueing first and writing once per turn is what coalesces a burst of
//! publishes into few system calls. Once a second the worker sweeps the slab
//! for timeouts and heartbeats: no connection has a timer of its own.
//!
//! What connections are subscribed to, who they are and what their
//! commands do is the subscription core's (`crate::sessions`): the loop
//! hands it messages and mailbox events, and it answers through the
//! worker's side of its `Wire` (`wire`), so nothing here decides a
//! subscription and nothing there touches a socket.
//!
//! Submodules: `read` (bytes → requests, frames, messages), `request` (the
//! opening request of every transport, and long-poll answers), `wire`
//! (what the core queues, landing on the slab), `sweep` (the clock and the
//! once-a-second pass that is every timer), `shutdown` (draining for a
//! graceful exit) and `abort` (ending connections at their deadlines
//! without leaving their data to the kernel).

mod abort;
mod read;
mod request;
mod shutdown;
mod sweep;
mod wire;

use std::io;
use std::net::TcpListener as StdListener;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::Receiver;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use myriad_protocol::close::CloseReason;
use myriad_protocol::ws::deflate::Inflater;
use myriad_protocol::ws::{ReadLimits, Role};
use slab::Slab;
use tracing::{debug, warn};

use crate::conn::{flags, Conn, Phase};
use crate::fds;
use crate::hub::Event;
use crate::link::{Link, LinkError, Tls, SEAL_BYTES};
use crate::metrics::{ErrorKind, WorkerMetrics};
use crate::outbound::Flushed;
use crate::registry::ConnId;
use crate::sessions::{Flow, Sessions};
use crate::shared::Shared;
use crate::tls::{self, Acceptor, Handshake, TlsFailure};
use crate::transport::http::error_response;
use crate::transport::TransportKind;
use shutdown::Draining;
use sweep::Clock;

const LISTENER: Token = Token(usize::MAX - 1);
pub const WAKER: Token = Token(usize::MAX - 2);

/// Size of the per-worker read buffer every socket read lands in.
const SCRATCH_BYTES: usize = 64 * 1024;
// A TLS read puts a partial record, or a handshake's plaintext, in front.
const _: () = assert!(
    SCRATCH_BYTES >= 2 * tls::record::MAX_RECORD && SCRATCH_BYTES >= tls::handshake::MAX_INPUT
);
/// Bytes read from one connection per turn before others get a go.
const READ_BUDGET_BYTES: usize = 256 * 1024;
/// Connections accepted per turn before the loop serves the others.
const ACCEPT_BATCH: usize = 256;
/// Events taken from the mailbox per turn before flushing.
const MAILBOX_BATCH: usize = 1024;
/// Frames queued on connections per turn before flushing. A broadcast
/// delivery fans out to every local subscriber; without this bound a full
/// batch to 5,000 subscribers queued 5 M frame handles (32 B each, 160 MiB)
/// before the first write. 256 Ki handles (8 MiB) still give each socket
/// ~50 frames per `writev` at that fan-out (one `writev` takes 64, see
/// `outbound.rs`) and leave the backlog in the mailbox, where it costs one
/// entry per publish and pauses publishers past `mailbox_high_water`.
const QUEUE_BUDGET: u64 = 256 * 1024;
/// Pause after `accept` fails for lack of resources (EMFILE and friends).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Events taken from one `epoll_wait`.
const EVENTS_CAPACITY: usize = 1024;

pub struct Worker {
    index: usize,
    poll: Poll,
    listener: Option<TcpListener>,
    conns: Slab<Conn>,
    /// The subscription core: sessions, registry, attaching, rate limits.
    sessions: Sessions,
    mailbox: Receiver<Event>,
    shared: Arc<Shared>,
    metrics: WorkerMetrics,
    limits: ReadLimits,
    /// Inflates the compressed messages of every permessage-deflate
    /// connection here (see `deflate`); its stream exists after the first.
    inflater: Inflater,
    clock: Clock,
    /// Where every socket read lands; taken out while a read is processed.
    scratch: Box<[u8]>,
    /// Where a TLS flush seals records before writing them; empty without TLS.
    seal: Box<[u8]>,
    /// The configuration new TLS handshakes start from; `None` without TLS.
    acceptor: Option<Acceptor>,
    /// TLS connections whose sending key nears its limit, closed at the sweep.
    worn_out: Vec<ConnId>,
    /// Connections with output queued this turn.
    dirty: Vec<ConnId>,
    /// Connections with input left to read (budget or back-pressure).
    deferred_reads: Vec<ConnId>,
    /// Connections found over their outbound limit while fanning out.
    slow: Vec<ConnId>,
    /// Held long-polls that got something this turn: answered at its end
    /// unless a subscription is still attaching.
    answering: Vec<ConnId>,
    /// Frames queued on this worker's connections, across all of them.
    queued_frames: usize,
    /// Live publications queued in the current mailbox batch, per
    /// transport (see `wire::Out::delivered`).
    delivered: [u64; TransportKind::COUNT],
    /// A socket took bytes since `last_drained` was last brought up to date.
    drained: bool,
    /// When a socket last took bytes. While the queues drain, a worker over
    /// `worker_queue_high_water` leaves its mailbox alone; once nothing has
    /// drained for `worker_intake_stall`, it reads on (and cuts the readers that
    /// stalled), so stalled readers cannot hold up a worker.
    last_drained: Instant,
    /// The mailbox is being left alone this turn.
    intake_paused: bool,
    accept_more: bool,
    accept_paused_until: Option<Instant>,
    last_sweep: u32,
    /// Graceful shutdown, once begun.
    draining: Option<Draining>,
}

impl Worker {
    pub fn new(
        index: usize,
        poll: Poll,
        listener: StdListener,
        mailbox: Receiver<Event>,
        shared: Arc<Shared>,
    ) -> io::Result<Worker> {
        let mut listener = TcpListener::from_std(listener);
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let limits = ReadLimits {
            role: Role::Server,
            max_message: shared.config.max_message_size,
        };
        let acceptor = shared.tls.clone().map(Acceptor::new);
        Ok(Worker {
            index,
            poll,
            listener: Some(listener),
            conns: Slab::new(),
            sessions: Sessions::new(index, Arc::clone(&shared)),
            mailbox,
            metrics: shared.metrics.worker(index),
            shared,
            limits,
            inflater: Inflater::new(),
            clock: Clock::new(),
            scratch: vec![0; SCRATCH_BYTES].into_boxed_slice(),
            seal: vec![0; if acceptor.is_some() { SEAL_BYTES } else { 0 }].into_boxed_slice(),
            acceptor,
            worn_out: Vec::new(),
            dirty: Vec::new(),
            deferred_reads: Vec::new(),
            slow: Vec::new(),
            answering: Vec::new(),
            queued_frames: 0,
            delivered: [0; TransportKind::COUNT],
            drained: false,
            last_drained: Instant::now(),
            intake_paused: false,
            accept_more: false,
            accept_paused_until: None,
            last_sweep: 1,
            draining: None,
        })
    }

    /// Runs until shutdown completes.
    pub fn run(mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(EVENTS_CAPACITY);
        loop {
            let timeout = self.poll_timeout();
            let mailbox = self.shared.hub.mailbox(self.index);
            let may_block = timeout != Some(Duration::ZERO);
            let timeout = if self.intake_paused {
                // Waiting in the mailbox is the point: sleep for sockets, and
                // look again once the queues could have stalled.
                let stall = self.shared.config.worker_intake_stall.0;
                timeout.map_or(Some(stall), |t| Some(t.min(stall)))
            } else if may_block && !mailbox.prepare_to_sleep(&self.mailbox) {
                Some(Duration::ZERO)
            } else {
                timeout
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            mailbox.awake();
            let now = self.clock.tick();

            for event in events.iter() {
                match event.token() {
                    LISTENER => self.accept_more = true,
                    WAKER => {}
                    Token(id) => {
                        let id = id as ConnId;
                        if event.is_readable() || event.is_read_closed() || event.is_error() {
                            let drain_to_eof = event.is_read_closed() || event.is_error();
                            self.on_readable(id, drain_to_eof);
                        }
                        if event.is_writable() && self.conns.contains(id as usize) {
                            self.flush(id);
                        }
                    }
                }
            }
            if self.accept_more && self.accept_paused_until.is_none_or(|t| Instant::now() >= t) {
                self.accept_paused_until = None;
                self.accept();
            }
            self.resume_deferred_reads();
            self.shared.hub.wake(self.sessions.take_wakeups());
            self.take_events();
            let (sessions, mut out) = self.split();
            sessions.hand_out_cursors(&mut out);
            self.settle_answers();
            self.flush_dirty();

            if now != self.last_sweep {
                self.last_sweep = now;
                self.sweep(now);
                self.flush_dirty();
            }
            if self.shared.shutting_down.load(Ordering::Acquire) && self.drain_for_shutdown(now) {
                return Ok(());
            }
        }
    }

    /// How long the next poll may block.
    fn poll_timeout(&self) -> Option<Duration> {
        let pending_work = (self.accept_more && self.accept_paused_until.is_none())
            || (!self.deferred_reads.is_empty() && !self.shared.engine.congested());
        if pending_work {
            return Some(Duration::ZERO);
        }
        if !self.deferred_reads.is_empty() {
            // Publishers wait for the mailboxes to drain; look again soon.
            return Some(Duration::from_millis(1));
        }
        // Wake for the next whole second of the sweep, or the accept back-off.
        let to_next_second = Duration::from_secs(1)
            - Duration::from_nanos(u64::from(self.clock.start.elapsed().subsec_nanos()));
        let to_accept = self
            .accept_paused_until
            .map(|t| t.saturating_duration_since(Instant::now()));
        Some(to_accept.map_or(to_next_second, |a| a.min(to_next_second)))
    }

    // ---- accepting ------------------------------------------------------

    fn accept(&mut self) {
        for _ in 0..ACCEPT_BATCH {
            let Some(listener) = &self.listener else {
                self.accept_more = false;
                return;
            };
            match listener.accept() {
                Ok((socket, peer)) => self.admit(socket, peer.ip()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.accept_more = false;
                    return;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => {
                    // EMFILE/ENFILE/ENOBUFS: the pending connection stays in the
                    // backlog; back off instead of spinning on the same error.
                    self.shared.metrics.error(ErrorKind::Accept);
                    warn!(worker = self.index, error = %e, "accept failed; backing off");
                    self.accept_paused_until = Some(Instant::now() + ACCEPT_BACKOFF);
                    return;
                }
            }
        }
        // Budget spent with connections possibly still waiting: come back next turn.
    }

    /// Takes an accepted socket into the slab. `TCP_NODELAY` and `SO_SNDBUF`
    /// came with it from the listener (see `listener.rs`). On a TLS
    /// listener its handshake starts with the certificate in force now.
    fn admit(&mut self, mut socket: TcpStream, ip: std::net::IpAddr) {
        let ceiling = self
            .shared
            .max_connections
            .saturating_add(fds::CLIENT_REFUSALS);
        let held = self.shared.connections.load(Ordering::Relaxed)
            + self.shared.refusing.load(Ordering::Relaxed);
        if held >= ceiling {
            // Even the room for 503s is full; the descriptors past it are
            // the admin listener's. Dropping the socket closes it.
            self.shared.metrics.error(ErrorKind::OverCapacityDropped);
            return;
        }
        let entry = self.conns.vacant_entry();
        let id = entry.key();
        if id >= WAKER.0 {
            return; // unreachable with 20k descriptors; keeps the tokens apart
        }
        if let Err(e) = self.poll.registry().register(
            &mut socket,
            Token(id),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            warn!(error = %e, "registering a connection failed");
            return;
        }
        let tls = match self.acceptor.as_mut() {
            None => None,
            Some(acceptor) => match Handshake::new(acceptor.config()) {
                Ok(handshake) => Some(Tls::handshaking(handshake)),
                Err(e) => {
                    self.shared
                        .metrics
                        .error(ErrorKind::Tls(TlsFailure::HandshakeFailed));
                    warn!(error = %e, "cannot start a TLS handshake");
                    return;
                }
            },
        };
        let mut conn = Conn::new(socket, tls, self.clock.tick());
        if self
            .sessions
            .abuse
            .admit(id as ConnId, ip, &self.shared.peers)
        {
            let open = self.shared.connections.fetch_add(1, Ordering::Relaxed) + 1;
            if open > self.shared.max_connections {
                conn.set_flag(flags::OVER_CAPACITY);
            }
        } else if self.shared.refusing.fetch_add(1, Ordering::Relaxed) >= fds::CLIENT_REFUSALS {
            // The room for refusals is full: closed unanswered.
            self.shared.refusing.fetch_sub(1, Ordering::Relaxed);
            self.shared.metrics.error(ErrorKind::OverIpLimit);
            return;
        }
        entry.insert(conn);
        self.sessions.opened(id as ConnId);
        self.metrics.accepted.inc();
        self.metrics.connections.inc();
    }

    // ---- output -----------------------------------------------------------

    /// The subscription core, and the slab and turn lists it queues onto,
    /// borrowed apart for one call into it.
    fn split(&mut self) -> (&mut Sessions, wire::Out<'_>) {
        let out = wire::Out {
            conns: &mut self.conns,
            dirty: &mut self.dirty,
            slow: &mut self.slow,
            answering: &mut self.answering,
            queued_frames: &mut self.queued_frames,
            delivered: &mut self.delivered,
            metrics: &self.metrics,
            max_outbound_bytes: self.shared.config.max_outbound_bytes,
        };
        (&mut self.sessions, out)
    }

    /// Queues a data message (an echo) for `id`: counted in `messages_out`.
    fn send_message(&mut self, id: ConnId, frame: Bytes) {
        self.split().1.queue_message(id, frame);
    }

    /// Queues `bytes` (a frame or an HTTP response) for `id` and schedules a
    /// flush this turn. Control frames and handshake responses go straight
    /// here: they are not messages.
    fn send(&mut self, id: ConnId, frame: Bytes) {
        self.split().1.queue(id, frame);
    }

    /// Takes up to a batch of events off the mailbox: publications are
    /// queued for every local subscriber of their subject, answers go to
    /// the connections that asked.
    fn take_events(&mut self) {
        let mut taken = 0;
        // Publications wait in the mailbox (pausing publishers past
        // mailbox_high_water) while queues this deep are still draining.
        if self.pause_intake() {
            return;
        }
        self.delivered = [0; TransportKind::COUNT];
        while taken < MAILBOX_BATCH && self.delivered.iter().sum::<u64>() < QUEUE_BUDGET {
            let Ok(event) = self.mailbox.try_recv() else {
                break;
            };
            taken += 1;
            let (sessions, mut out) = self.split();
            match event {
                Event::Publication(publication) => sessions.deliver(&publication, &mut out),
                // A replay may have filled a queue: written before more.
                Event::Attached(attached) => sessions.on_attached(*attached, &mut out),
                Event::Answer(answer) => sessions.on_answer(*answer, &mut out),
                Event::Feeds(change) => sessions.on_feed_change(*change, &mut out),
                Event::Broken(broken) => sessions.on_stream_broken(&broken, &mut out),
                Event::Presence(change) => sessions.on_presence_change(&change, &mut out),
                Event::Proxied(proxied) => sessions.on_proxied(*proxied, &mut out),
            }
            // Before queueing more, give over-limit connections a chance to
            // write: only a queue still over the limit then is a slow consumer.
            self.relieve_over_limit();
        }
        if taken > 0 {
            self.shared.hub.mailbox(self.index).taken(taken);
            let delivered = self.delivered;
            self.metrics
                .messages_out
                .inc_by(delivered.iter().sum::<u64>());
            for (kind, queued) in delivered.into_iter().enumerate() {
                if queued > 0 {
                    self.metrics.transports[kind].messages_out.inc_by(queued);
                }
            }
        }
    }

    /// Whether to leave the mailbox alone this turn: the queues are past the
    /// high water and a socket took bytes within `worker_intake_stall`.
    fn pause_intake(&mut self) -> bool {
        let now = Instant::now();
        if std::mem::take(&mut self.drained) {
            self.last_drained = now;
        }
        let config = &self.shared.config;
        self.intake_paused = self.queued_frames > config.worker_queue_high_water
            && now.duration_since(self.last_drained) < config.worker_intake_stall.0;
        self.intake_paused
    }

    /// Flushes connections found over their outbound limit and cuts those
    /// whose socket would not take enough.
    fn relieve_over_limit(&mut self) {
        if self.slow.is_empty() {
            return;
        }
        let limit = self.shared.config.max_outbound_bytes;
        for id in std::mem::take(&mut self.slow) {
            // A long-poll past the limit is not slow: it has its answer.
            if self
                .conns
                .get(id as usize)
                .is_some_and(|c| c.has_flag(flags::HELD))
            {
                self.answer_now(id, true);
            }
            self.flush(id);
            let still_over = self
                .conns
                .get(id as usize)
                .is_some_and(|conn| conn.phase.is_open() && conn.pending_bytes() > limit);
            if still_over {
                self.cut_slow_consumer(id);
            }
        }
    }

    /// Flushes every connection that got output this turn.
    fn flush_dirty(&mut self) {
        self.relieve_over_limit();
        let mut dirty = std::mem::take(&mut self.dirty);
        for &id in &dirty {
            if let Some(conn) = self.conns.get_mut(id as usize) {
                conn.clear_flag(flags::DIRTY);
                self.flush(id);
            }
        }
        dirty.clear();
        self.dirty = dirty;
    }

    /// Writes what `id` has queued (and, on TLS, what its link still holds);
    /// drops the queue once empty and moves a closing connection on.
    fn flush(&mut self, id: ConnId) {
        let Some(conn) = self.conns.get_mut(id as usize) else {
            return;
        };
        if conn.has_flag(flags::HELD) {
            return; // a long-poll's answer goes out whole, once ready
        }
        if conn.outbound.is_none() && !conn.link().has_unsent() {
            return;
        }
        let queued = |conn: &Conn| conn.outbound.as_ref().map_or(0, |out| out.len());
        let before = queued(conn);
        let mut link = Link::new(&mut conn.socket, &mut conn.tls);
        let result = link.flush(conn.outbound.as_deref_mut(), &mut self.seal);
        self.queued_frames -= before - queued(conn);
        if conn.link().keys_worn_out() {
            self.worn_out.push(id);
        }
        let report = match result {
            Ok(report) => report,
            Err(e) => {
                self.on_link_error(id, e);
                return;
            }
        };
        self.drained |= report.bytes > 0;
        self.metrics.bytes_out.inc_by(report.bytes as u64);
        self.metrics.writes.inc_by(report.calls as u64);
        if report.flushed == Flushed::Blocked {
            return; // the writable event brings us back
        }
        conn.outbound = None;
        match conn.phase {
            Phase::Draining => {
                conn.link().close_notify();
                self.drop_conn(id);
            }
            // Our close frame (or HTTP error) is out: half-close so the peer
            // sees EOF, then wait for its close frame or EOF.
            Phase::Closing if !conn.has_flag(flags::WRITE_SHUT) => {
                conn.set_flag(flags::WRITE_SHUT);
                if let Err(e) = conn.link().shutdown_write() {
                    debug!(error = %e, "shutdown(write) failed");
                    self.drop_conn(id);
                }
            }
            _ => {}
        }
    }

    // ---- closing ------------------------------------------------------------

    /// Starts the close handshake: unsubscribes, queues the close frame and
    /// waits for the peer's close (RFC 6455 §7.1.2).
    fn close(&mut self, id: ConnId, reason: CloseReason) {
        let now = self.clock.tick();
        let conn = &mut self.conns[id as usize];
        if !conn.phase.is_open() {
            return;
        }
        if conn.has_flag(flags::HELD) {
            // A long-poll ends with its answer, whatever the reason.
            self.decide_close(id, reason);
            self.answer_now(id, false);
            return;
        }
        conn.enter(Phase::Closing, now);
        let goodbye = conn.transport.get().close(reason);
        self.decide_close(id, reason);
        self.sessions.unsubscribe_all(id);
        if let Some(bytes) = goodbye {
            self.send(id, bytes);
        }
    }

    /// A client over its outbound limit: everything not yet started is
    /// dropped so the close frame follows the kernel's backlog directly.
    fn cut_slow_consumer(&mut self, id: ConnId) {
        let Some(conn) = self.conns.get_mut(id as usize) else {
            return;
        };
        if !conn.phase.is_open() {
            return;
        }
        if let Some(out) = conn.outbound.as_mut() {
            let before = out.len();
            out.discard_unstarted();
            self.queued_frames -= before - out.len();
        }
        debug!(worker = self.index, conn = id, "closing slow consumer");
        self.close(id, CloseReason::SlowConsumer);
    }

    /// A link failed: a socket error, or TLS refusing or ending the
    /// connection (counted by cause; a plain-HTTP client is told to use TLS).
    fn on_link_error(&mut self, id: ConnId, error: LinkError) {
        let Some(failure) = error.failure() else {
            if let LinkError::Io(e) = error {
                self.on_io_error(id, &e);
            }
            return;
        };
        self.shared.metrics.error(ErrorKind::Tls(failure));
        debug!(worker = self.index, conn = id, %error, "TLS ended a connection");
        if let LinkError::Handshake(_) = error {
            if failure == TlsFailure::PlainHttp {
                let response = error_response(
                    400,
                    "tls_required",
                    "this port speaks TLS: use https:// or wss://",
                    &[("Connection", "close")],
                );
                self.conns[id as usize].link().refuse_in_plain(&response);
            }
            self.decide_close(id, CloseReason::HandshakeRejected);
        }
        self.drop_conn(id);
    }

    fn on_io_error(&mut self, id: ConnId, error: &io::Error) {
        if !matches!(
            error.kind(),
            io::ErrorKind::ConnectionReset
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::ConnectionAborted
        ) {
            self.shared.metrics.error(ErrorKind::Io);
            debug!(worker = self.index, conn = id, %error, "socket error");
        }
        self.drop_conn(id);
    }

    /// Removes a connection for good and counts why it ended.
    fn drop_conn(&mut self, id: ConnId) {
        if !self.conns.contains(id as usize) {
            return;
        }
        // No epoll_ctl(DEL): the descriptor is never duplicated, so closing it
        // (dropping the Conn) removes it from epoll, one syscall cheaper.
        let conn = self.conns.remove(id as usize);
        self.sessions.closed(id);
        self.queued_frames -= conn.outbound.as_ref().map_or(0, |out| out.len());
        let admitted = if self.sessions.abuse.over_ip_limit(id) {
            &self.shared.refusing
        } else {
            &self.shared.connections
        };
        admitted.fetch_sub(1, Ordering::Relaxed);
        self.metrics.connections.dec();
        if conn.has_flag(flags::COUNTED) {
            self.metrics.transports[conn.transport.index()]
                .connections
                .dec();
        }
        if conn.close_reason.is_none() {
            let reason = match conn.phase {
                // HTTP lets a client end a kept-alive connection between
                // requests: that is how a long-poll loop stops.
                Phase::Request if conn.has_flag(flags::KEEP_ALIVE) && conn.inbound.is_none() => {
                    CloseReason::Normal
                }
                // Port checks and clients that gave up before asking.
                Phase::Request => CloseReason::NoRequest,
                _ => CloseReason::Abnormal,
            };
            self.shared.metrics.closed(reason);
        }
    }

    /// Records why `id` is closing and counts it; the first reason sticks.
    fn decide_close(&mut self, id: ConnId, reason: CloseReason) {
        let conn = &mut self.conns[id as usize];
        if conn.close_reason.is_none() {
            conn.close_reason = Some(reason);
            self.shared.metrics.closed(reason);
        }
    }
}
