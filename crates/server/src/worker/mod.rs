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
//! Submodules: `read` (bytes → requests, frames, messages), `request` (the
//! opening request of every transport, and long-poll answers), `commands`
//! (protocol v1 commands, engine answers and subscription bookkeeping),
//! `auth` (a connection's token: connect, refresh, permission checks),
//! `abuse` (connections per address, publish and subscribe rates),
//! `feeds` (connections acting as users), `attaching` (subscriptions
//! waiting for their attach answer) and `abort` (ending connections at
//! their deadlines without leaving their data to the kernel).

mod abort;
mod abuse;
mod attaching;
mod auth;
mod commands;
mod feeds;
mod read;
mod request;

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
use crate::hub::{Event, Wakeups};
use crate::link::{Link, LinkError, Tls, SEAL_BYTES};
use crate::metrics::{ErrorKind, WorkerMetrics};
use crate::outbound::Flushed;
use crate::registry::{ConnId, Registry};
use crate::shared::Shared;
use crate::tls::{self, Acceptor, Handshake, TlsFailure};
use crate::transport::http::error_response;
use crate::transport::{self, Heartbeat, TransportKind};

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

/// Seconds since the worker started, as stored in connection timestamps.
/// Starts at 1 so that 0 can mean "never".
///
/// A reading is the whole second it falls in, so the clock may show up to
/// one second more between two readings than really passed: a timeout is
/// due only once *more* than its length shows ([`passed`]). That holds only
/// if a stamp is never older than the moment it stands for, so every stamp
/// that starts a timeout is a fresh [`Clock::tick`], taken at or after its
/// event (the read that brought a message, the move into a phase, the write
/// of a ping), never the reading from the start of the loop turn, which a
/// long turn leaves behind. A stale reading is safe only for deciding.
struct Clock {
    start: Instant,
    now: u32,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            start: Instant::now(),
            now: 1,
        }
    }

    fn tick(&mut self) -> u32 {
        self.now = 1 + self.start.elapsed().as_secs() as u32;
        self.now
    }
}

/// Whether a timeout of `seconds` has passed since `stamp`, on the clock
/// reading `now`: never early, and due within one second after (the sweep
/// looks at every whole second).
fn passed(now: u32, stamp: u32, seconds: u32) -> bool {
    now.saturating_sub(stamp) > seconds
}

/// Seconds of silence after which connection `id` is pinged (or, on a
/// one-way stream, sent its next heartbeat): between half of `interval`
/// and all of it, fixed per connection. Connections set up
/// in the same second would otherwise be pinged in the same sweep, and
/// after each answer again together, for as long as they live: a node that
/// took 100,000 connections in a few seconds wrote 100,000 pings in one
/// second every interval, and delivery waited behind them (scale.py's
/// medium runs, docs/benchmarks.md). Spread this way the pings of a burst
/// of connections fall over half an interval instead.
fn ping_after(interval: u32, id: ConnId) -> u32 {
    let spread = interval / 2;
    // Fibonacci hashing: neighbouring slab ids land far apart.
    let mixed = (u64::from(id).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32;
    interval - mixed % (spread + 1)
}

/// What the once-a-second sweep found due on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    /// The request did not complete in time (HTTP 408, counted).
    RequestTimeout,
    /// A kept-alive connection sent no next request in time.
    EndKeptAlive,
    /// A closing connection did not finish in time.
    Drop,
    /// A long-poll reached `poll_timeout`: answer with what it has.
    Answer,
    Close(CloseReason),
}

/// What reading from a connection should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    /// Keep going.
    Continue,
    /// Stop reading for now (publish back-pressure); resume later.
    Pause,
    /// The connection is closing or gone; stop touching it.
    Stop,
}

pub struct Worker {
    index: usize,
    poll: Poll,
    listener: Option<TcpListener>,
    conns: Slab<Conn>,
    /// Per slab slot, how many connections it has held: tags requests so an
    /// engine answer cannot reach a later connection in the same slot.
    lives: Vec<u32>,
    registry: Registry,
    /// Subscriptions waiting for the engine's attach answer.
    attaching: attaching::Attaching,
    /// Per-address and per-connection rate limits.
    abuse: abuse::AbuseLimits,
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
    /// Sessions whose cursor moved this turn with no event carrying it:
    /// each is sent it once, at the turn's end (see `hand_out_cursors`).
    cursors_owed: Vec<ConnId>,
    /// Workers this turn's publishes handed deliveries to, woken once the
    /// turn's reading is done.
    wakeups: Wakeups,
    /// Frames queued on this worker's connections, across all of them.
    queued_frames: usize,
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
    /// Requests with an id handed to the engine (publishes, history
    /// reads) whose answers have not come back. Shutdown waits for all of
    /// them (a count, not a list per connection: it is on the hot path)
    /// before it says goodbye, for up to half of `shutdown_timeout`: a
    /// publish the engine has taken may already be in Redis, and its client
    /// must not be left to guess.
    answers_owed: usize,
    /// Graceful shutdown, once begun.
    draining: Option<Draining>,
}

/// How far this worker's graceful shutdown has gone.
#[derive(Clone, Copy)]
struct Draining {
    /// When it began, on this worker's clock.
    since: u32,
    /// Every open connection has been sent its 1001.
    told: bool,
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
            lives: Vec::new(),
            registry: Registry::new(),
            attaching: attaching::Attaching::default(),
            abuse: abuse::AbuseLimits::new(&shared.config),
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
            cursors_owed: Vec::new(),
            wakeups: Wakeups::default(),
            queued_frames: 0,
            drained: false,
            last_drained: Instant::now(),
            intake_paused: false,
            accept_more: false,
            accept_paused_until: None,
            last_sweep: 1,
            answers_owed: 0,
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
            self.shared.hub.wake(std::mem::take(&mut self.wakeups));
            self.take_events();
            self.hand_out_cursors();
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
        if self.abuse.admit(id as ConnId, ip, &self.shared.peers) {
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
        if self.lives.len() <= id {
            self.lives.resize(id + 1, 0);
        }
        self.lives[id] = self.lives[id].wrapping_add(1);
        self.metrics.accepted.inc();
        self.metrics.connections.inc();
    }

    // ---- output -----------------------------------------------------------

    /// Queues a data message (reply or echo) for `id`: counted in
    /// `messages_out`, like deliveries.
    fn send_message(&mut self, id: ConnId, frame: Bytes) {
        self.metrics.messages_out.inc();
        let kind = self.conns[id as usize].transport;
        self.metrics.transports[kind.index()].messages_out.inc();
        self.send(id, frame);
    }

    /// Queues `bytes` (a frame or an HTTP response) for `id` and schedules a
    /// flush this turn. Control frames and handshake responses go straight
    /// here: they are not messages.
    fn send(&mut self, id: ConnId, frame: Bytes) {
        let conn = &mut self.conns[id as usize];
        let pending = conn.queue(frame);
        self.queued_frames += 1;
        if conn.set_flag(flags::DIRTY) {
            self.dirty.push(id);
        }
        if pending > self.shared.config.max_outbound_bytes && conn.phase.is_open() {
            self.slow.push(id);
        }
    }

    /// Queues one protocol reply, in the connection's transport.
    fn send_reply(&mut self, id: ConnId, json: &[u8]) {
        let conn = &mut self.conns[id as usize];
        let bytes = conn.transport.get().reply(json, &conn.session);
        // A posted command is answered by its one reply.
        if conn.transport == TransportKind::Command && conn.has_flag(flags::HELD) {
            conn.set_flag(flags::NEWS);
            self.answering.push(id);
        }
        self.send_message(id, bytes);
    }

    /// Takes up to a batch of events off the mailbox: publications are
    /// queued for every local subscriber of their subject, answers go to
    /// the connections that asked.
    fn take_events(&mut self) {
        let mut taken = 0;
        let mut queued_by_kind = [0u64; TransportKind::COUNT];
        let limit = self.shared.config.max_outbound_bytes;
        // Publications wait in the mailbox (pausing publishers past
        // mailbox_high_water) while queues this deep are still draining.
        if self.pause_intake() {
            return;
        }
        while taken < MAILBOX_BATCH && queued_by_kind.iter().sum::<u64>() < QUEUE_BUDGET {
            let Ok(event) = self.mailbox.try_recv() else {
                break;
            };
            taken += 1;
            let publication = match event {
                Event::Publication(publication) => publication,
                Event::Attached(attached) => {
                    // A replay may have filled a queue: write before more.
                    self.on_attached(*attached);
                    self.relieve_over_limit();
                    continue;
                }
                Event::Answer(answer) => {
                    self.on_answer(*answer);
                    continue;
                }
                Event::Feeds(change) => {
                    self.on_feed_change(*change);
                    continue;
                }
                Event::Broken(broken) => {
                    self.on_stream_broken(&broken);
                    continue;
                }
            };
            // Each transport's form of it, made once for every recipient here.
            let mut forms: [Option<Bytes>; TransportKind::COUNT] = Default::default();
            for &id in self.registry.subscribers(&publication.subject) {
                let conn = &mut self.conns[id as usize];
                if !conn.phase.is_open() {
                    continue;
                }
                let kind = conn.transport;
                let form = forms[kind.index()].get_or_insert_with(|| {
                    kind.get().publication(&publication, &self.shared.config)
                });
                let (bytes, more, owed) =
                    transport::addressed(kind, form, &publication, &mut conn.session);
                if owed {
                    self.cursors_owed.push(id);
                }
                let mut pending = conn.queue(bytes);
                if let Some(more) = more {
                    pending = conn.queue(more);
                    self.queued_frames += 1;
                }
                queued_by_kind[kind.index()] += 1;
                self.queued_frames += 1;
                if conn.set_flag(flags::DIRTY) {
                    self.dirty.push(id);
                }
                if conn.has_flag(flags::HELD) && conn.set_flag(flags::NEWS) {
                    self.answering.push(id);
                }
                if pending > limit {
                    self.slow.push(id);
                }
            }
            // Before queueing more, give over-limit connections a chance to
            // write: only a queue still over the limit then is a slow consumer.
            self.relieve_over_limit();
        }
        if taken > 0 {
            self.shared.hub.mailbox(self.index).taken(taken);
            self.metrics
                .messages_out
                .inc_by(queued_by_kind.iter().sum::<u64>());
            for (kind, queued) in queued_by_kind.into_iter().enumerate() {
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
        self.unsubscribe_all(id);
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
        self.unsubscribe_all(id);
        // No epoll_ctl(DEL): the descriptor is never duplicated, so closing it
        // (dropping the Conn) removes it from epoll, one syscall cheaper.
        let conn = self.conns.remove(id as usize);
        self.abuse.release(id, &self.shared.peers);
        if let Some(identity) = &conn.session.identity {
            let gone = self.request_of(id, None);
            self.shared.feeds.presence.remove(identity.user, &gone);
        }
        self.queued_frames -= conn.outbound.as_ref().map_or(0, |out| out.len());
        let admitted = if self.abuse.over_ip_limit(id) {
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

    // ---- time -----------------------------------------------------------------

    /// The once-a-second pass over every connection: request, heartbeat,
    /// idle, partial-message, long-poll and close timeouts, and the gauge
    /// of input held incomplete.
    fn sweep(&mut self, now: u32) {
        debug_assert_eq!(
            self.queued_frames,
            self.conns
                .iter()
                .map(|(_, c)| c.outbound.as_ref().map_or(0, |out| out.len()))
                .sum::<usize>(),
            "queued frames drifted from the queues"
        );
        let config = &self.shared.config;
        let (request_timeout, idle) = (config.handshake_timeout, config.idle_timeout);
        let (interval, answer) = (config.heartbeat_interval, config.heartbeat_timeout);
        let (one_way, poll_timeout) = (config.stream_heartbeat_interval, config.poll_timeout);
        let (close_timeout, partial_timeout) =
            (config.close_timeout, config.partial_message_timeout);
        // Tokens expire on the wall clock, the same one their `exp` is on.
        let unix_now = crate::auth::token::unix_now();
        let mut due = Vec::new();
        let mut to_ping = Vec::new();
        // Summed here rather than kept up to date on every read: the read
        // path stays as it was, and the gauge is at most a second old.
        let (mut partial_bytes, mut outbound_bytes) = (0, 0);
        self.abuse.refill();
        for (id, conn) in self.conns.iter_mut() {
            partial_bytes += conn.partial_bytes();
            outbound_bytes += conn.pending_bytes();
            let request_due = passed(now, conn.since, request_timeout);
            let verdict = match conn.phase {
                // Between long-polls, a quiet kept-alive connection just ends.
                Phase::Request
                    if request_due
                        && conn.inbound.is_none()
                        && conn.has_flag(flags::KEEP_ALIVE) =>
                {
                    Some(Due::EndKeptAlive)
                }
                Phase::Request if request_due => Some(Due::RequestTimeout),
                Phase::Closing | Phase::Draining if passed(now, conn.since, close_timeout) => {
                    Some(Due::Drop)
                }
                Phase::PubSub | Phase::Echo => {
                    let can = conn.transport.get().capabilities();
                    let unanswered = can.heartbeat == Heartbeat::Answered
                        && interval > 0
                        && conn.ping_sent != 0
                        && passed(now, conn.ping_sent, answer);
                    // A connection that cannot send commands will never
                    // subscribe to anything: without subscriptions it is
                    // idle at once.
                    let idle_due = idle > 0
                        && conn.session.subscriptions.is_empty()
                        && !conn.has_flag(flags::HELD)
                        && (!can.bidirectional || passed(now, conn.last_message, idle));
                    let expired = conn
                        .session
                        .access()
                        .is_some_and(|access| access.expires <= unix_now);
                    // A message begun and not finished: its bytes come too
                    // slowly to be honest traffic, and what they hold is
                    // ours. Unless the node is what holds its reading back.
                    let stalled = partial_timeout > 0
                        && !conn.has_flag(flags::READ_DEFERRED)
                        && conn
                            .inbound
                            .as_ref()
                            .is_some_and(|i| passed(now, i.since, partial_timeout));
                    if expired {
                        Some(Due::Close(CloseReason::TokenExpired))
                    } else if unanswered {
                        Some(Due::Close(CloseReason::HeartbeatTimeout))
                    } else if stalled {
                        Some(Due::Close(CloseReason::PartialMessageTimeout))
                    } else if can.answers_once && passed(now, conn.since, poll_timeout) {
                        Some(Due::Answer)
                    } else if idle_due {
                        Some(Due::Close(CloseReason::IdleTimeout))
                    } else {
                        let ping = match can.heartbeat {
                            Heartbeat::Answered => {
                                interval > 0
                                    && conn.ping_sent == 0
                                    && passed(
                                        now,
                                        conn.last_heard,
                                        ping_after(interval, id as ConnId),
                                    )
                            }
                            Heartbeat::OneWay => {
                                one_way > 0
                                    && passed(
                                        now,
                                        conn.ping_sent,
                                        ping_after(one_way, id as ConnId),
                                    )
                            }
                            Heartbeat::None => false,
                        };
                        if ping {
                            to_ping.push(id as ConnId);
                        }
                        None
                    }
                }
                _ => None,
            };
            if let Some(verdict) = verdict {
                due.push((id as ConnId, verdict));
            }
        }
        for id in std::mem::take(&mut self.worn_out) {
            if self
                .conns
                .get(id as usize)
                .is_some_and(|c| c.phase.is_open())
            {
                self.shared
                    .metrics
                    .error(ErrorKind::Tls(TlsFailure::KeysUsedUp));
                due.push((id, Due::Close(CloseReason::GoingAway)));
            }
        }
        for &id in &to_ping {
            // Written at once rather than with the turn's flush, so that a
            // round of heartbeats to every connection never holds a queue
            // for each of them at the same time (an RSS step that stays).
            let heartbeat = self.conns[id as usize].transport.get().heartbeat();
            self.send(id, heartbeat);
            self.flush(id);
        }
        // Stamped once they are all written (see `Clock`).
        let sent = self.clock.tick();
        for id in to_ping {
            if let Some(conn) = self.conns.get_mut(id as usize) {
                conn.ping_sent = sent;
            }
        }
        for (id, verdict) in due {
            match verdict {
                Due::RequestTimeout => {
                    let kind = if self.conns[id as usize].link().is_handshaking() {
                        ErrorKind::Tls(TlsFailure::HandshakeTimeout)
                    } else {
                        ErrorKind::Handshake(408)
                    };
                    self.shared.metrics.error(kind);
                    self.decide_close(id, CloseReason::HandshakeTimeout);
                    self.drop_at_deadline(id);
                }
                Due::EndKeptAlive => {
                    self.decide_close(id, CloseReason::Normal);
                    self.drop_at_deadline(id);
                }
                Due::Drop => self.drop_at_deadline(id),
                Due::Answer => self.answer_now(id, true),
                Due::Close(
                    reason @ (CloseReason::HeartbeatTimeout | CloseReason::PartialMessageTimeout),
                ) => {
                    // The peer is not answering, or cannot before the frame
                    // it is trickling ends: send the close frame if the
                    // socket takes it, but do not wait for a reply.
                    self.close(id, reason);
                    self.flush(id);
                    self.drop_at_deadline(id);
                }
                Due::Close(reason) => self.close(id, reason),
            }
        }
        let held = self.enforce_partial_budget(partial_bytes);
        let gauge = |bytes: usize| i64::try_from(bytes).unwrap_or(i64::MAX);
        self.metrics.partial_input_bytes.set(gauge(held));
        // As of the sweep: queues drain between sweeps, and a queue is
        // bounded by max_outbound_bytes whatever this says.
        self.metrics.outbound_bytes.set(gauge(outbound_bytes));
    }

    /// Past `max_partial_input_bytes`, closes the open connections that have
    /// held their incomplete input longest (the largest first among equals)
    /// until the rest fit; returns what is held then. The oldest go first:
    /// an honest client's large message is whole within moments, a hostile
    /// one's is held as long as it can be. A second pass over the slab,
    /// made only when the sweep found the worker over its budget (`held`).
    fn enforce_partial_budget(&mut self, held: usize) -> usize {
        let budget = self.shared.config.max_partial_input_bytes;
        if held <= budget {
            return held;
        }
        // Counted again: the sweep's closes may have freed some.
        let mut total = 0;
        let mut holders = Vec::new();
        for (id, conn) in &self.conns {
            let bytes = conn.partial_bytes();
            total += bytes;
            if let Some(inbound) = conn.inbound.as_ref().filter(|_| conn.phase.is_open()) {
                holders.push((inbound.since, std::cmp::Reverse(bytes), id as ConnId));
            }
        }
        holders.sort_unstable();
        for (_, std::cmp::Reverse(bytes), id) in holders {
            if total <= budget {
                break;
            }
            debug!(
                worker = self.index,
                conn = id,
                bytes,
                "partial input over budget"
            );
            // As at a heartbeat timeout: the peer may be mid-frame and
            // unable to answer, and the point is to free its memory now.
            self.close(id, CloseReason::PartialInputBudget);
            self.flush(id);
            self.drop_at_deadline(id);
            total -= bytes;
        }
        total
    }

    /// Graceful shutdown: stop accepting; send every client 1001 once the
    /// engine has answered every request with an id this worker handed it
    /// (the engine refuses new ones by now, at once), or once half of the
    /// shutdown timeout has passed waiting for them; exit once all clients
    /// are gone or the shutdown timeout passes. Returns true when the
    /// worker may exit.
    fn drain_for_shutdown(&mut self, now: u32) -> bool {
        let (draining, begun) = match self.draining {
            Some(draining) => (draining, false),
            None => {
                let now = self.clock.tick();
                if let Some(mut listener) = self.listener.take() {
                    // Dropping the listener closes it; deregistering first keeps
                    // epoll tidy, and failure to do so changes nothing.
                    let _ = self.poll.registry().deregister(&mut listener);
                }
                let draining = Draining {
                    since: now,
                    told: false,
                };
                (draining, true)
            }
        };
        let timeout = self.shared.config.shutdown_timeout;
        let timed_out = passed(now, draining.since, timeout);
        let waited_out = passed(now, draining.since, timeout / 2);
        let told = draining.told || self.answers_owed == 0 || waited_out;
        if told && !draining.told {
            self.say_goodbye(true);
        } else if begun {
            // Handshakes end now; open connections wait for their answers.
            self.say_goodbye(false);
        }
        self.draining = Some(Draining { told, ..draining });
        if self.conns.is_empty() {
            return true;
        }
        if timed_out {
            let ids: Vec<ConnId> = self.conns.iter().map(|(id, _)| id as ConnId).collect();
            for id in ids {
                self.drop_at_deadline(id);
            }
            return true;
        }
        false
    }

    /// Drops the connections in their request (a handshake, or a kept-alive
    /// connection's next request: nothing new is served any more) and, with
    /// `open_too`, sends 1001 to the open ones.
    fn say_goodbye(&mut self, open_too: bool) {
        let ids: Vec<ConnId> = self.conns.iter().map(|(id, _)| id as ConnId).collect();
        for id in ids {
            match self.conns[id as usize].phase {
                Phase::Request => {
                    self.decide_close(id, CloseReason::GoingAway);
                    self.drop_conn(id);
                }
                Phase::PubSub | Phase::Echo if open_too => self.close(id, CloseReason::GoingAway),
                _ => {}
            }
        }
        self.flush_dirty();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pings_of_neighbouring_connections_spread_over_half_an_interval() {
        let interval = 25;
        let waits: Vec<u32> = (0..1_000).map(|id| ping_after(interval, id)).collect();
        assert!(waits.iter().all(|w| (13..=25).contains(w)), "{waits:?}");
        // Every second of the spread is used, none by much more than its share.
        let mut per_second = [0usize; 26];
        for &w in &waits {
            per_second[w as usize] += 1;
        }
        for (second, &n) in per_second.iter().enumerate().skip(13) {
            assert!((40..=110).contains(&n), "second {second}: {n}");
        }
        assert_eq!(ping_after(1, 7), 1, "too short to spread");
        assert_eq!(ping_after(0, 7), 0);
    }
}
