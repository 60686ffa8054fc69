//! The worker's event loop: one mio poll, every connection in a slab.
//!
//! One thread per worker process drives all of its connections: no task,
//! no buffer and no timer per connection. The reactor owns the sockets
//! (creating them with the right source address and port), dispatches
//! readiness to [`ClientConn`], enforces the connect/handshake and close
//! deadlines from one heap, and keeps the counters and setup latency
//! histograms. What to open, send and close, and when, belongs to the
//! workload driver that calls [`Reactor::open`], [`Reactor::queue_text`] and
//! [`Reactor::close`] between turns.
//!
//! Named the reactor (it reacts to readiness), not an engine: in myriad
//! "engine" is the node's publish/subscribe back end, memory or Redis.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};
use slab::Slab;
use socket2::{Domain, Protocol, SockRef, Socket, Type};

use crate::util::addr::{route, PortCursor, PortMode, Route, Sources, Target};
use crate::util::clock::Origin;
use crate::util::counters::Failure;
use crate::worker::client_conn::{ClientConn, Cx, Ending, Handler, Readiness, Wire};
use crate::worker::tls;

/// The token of the waker that the control thread uses.
const WAKER: Token = Token(usize::MAX);

/// Largest message the bench accepts from a server.
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// Initial size of the per-worker read buffer; grows only for huge frames.
const SCRATCH: usize = 256 * 1024;

/// How long a close handshake may take before the socket is reset.
const CLOSE_TIMEOUT_NS: u64 = 2_000_000_000;

/// Binding a source port would be retried on this many ports before the
/// connection counts as out of ports.
const PORT_TRIES: usize = 16;

/// How a worker's sockets are made.
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// Where connections go.
    pub targets: Vec<Target>,
    /// Where they come from (may be empty: the kernel picks).
    pub sources: Sources,
    /// Who picks source ports.
    pub port_mode: PortMode,
    /// This worker's number and the number of workers, for port slices.
    pub worker: u64,
    /// Workers sharing the port space.
    pub workers: u64,
    /// Most connections this worker may hold (its open-file budget).
    pub max_conns: usize,
    /// Bound on connect + handshake (+ subscribe ack).
    pub setup_timeout_ns: u64,
    /// Disable Nagle: for publishers, whose small writes must leave at
    /// once. Other connections send one request at a time anyway, and the
    /// setsockopt would cost a syscall per connection.
    pub nodelay: bool,
    /// The TLS client configuration, when a target is `wss://`.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// A timer on one connection, checked against the connection's index so a
/// reused slab slot is never hit by an old timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Deadline {
    at_ns: u64,
    key: usize,
    index: u32,
    closing: bool,
}

/// One worker's connections and their event loop.
pub struct Reactor {
    poll: Poll,
    events: Events,
    conns: Slab<ClientConn>,
    scratch: Vec<u8>,
    /// Counters, setup histograms and per-worker protocol state.
    pub cx: Cx,
    net: NetConfig,
    sources: Vec<IpAddr>,
    ports: Option<PortCursor>,
    deadlines: BinaryHeap<Reverse<Deadline>>,
    in_setup: usize,
    origin: Origin,
    waker: Arc<Waker>,
    woken: bool,
}

impl Reactor {
    /// A reactor with no connections. `ack` and `error` are the profile's
    /// markers for subscribe acknowledgements and error replies.
    pub fn new(
        net: NetConfig,
        ack: Option<&str>,
        error: Option<&str>,
        seed: u64,
    ) -> io::Result<Reactor> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let sources = net.sources.0.iter().map(|&ip| IpAddr::V4(ip)).collect();
        let ports = (net.port_mode == PortMode::Explicit)
            .then(|| PortCursor::new(net.worker, net.workers, net.sources.0.len()));
        let targets = net
            .targets
            .iter()
            .map(|t| (t.host.clone(), t.path.clone()))
            .collect();
        Ok(Reactor {
            poll,
            events: Events::with_capacity(1024),
            conns: Slab::new(),
            scratch: vec![0; SCRATCH],
            cx: Cx::new(targets, MAX_MESSAGE, ack, error, seed),
            net,
            sources,
            ports,
            deadlines: BinaryHeap::new(),
            in_setup: 0,
            origin: Origin::now(),
            waker,
            woken: false,
        })
    }

    /// The time origin of this worker.
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// Monotonic ns since the origin, refreshed into the context.
    pub fn refresh_now(&mut self) -> u64 {
        self.cx.now_ns = self.origin.elapsed_ns();
        self.cx.now_ns
    }

    /// Wakes a blocked [`turn`](Self::turn) from another thread.
    pub fn waker(&self) -> Arc<Waker> {
        Arc::clone(&self.waker)
    }

    /// Whether the waker fired since the last call.
    pub fn take_woken(&mut self) -> bool {
        std::mem::take(&mut self.woken)
    }

    /// Connections held (any state).
    pub fn open_conns(&self) -> usize {
        self.conns.len()
    }

    /// Connections still connecting, handshaking or waiting for their ack.
    pub fn in_setup(&self) -> usize {
        self.in_setup
    }

    /// Starts connection `index`, speaking `wire`, on its first target.
    /// Returns its key, or counts and returns the failure.
    pub fn open(&mut self, index: u32, wire: Wire) -> Result<usize, Failure> {
        self.open_moved(index, 0, wire)
    }

    /// [`open`](Self::open), on the target `hop` after its first (see
    /// [`route`]).
    pub fn open_moved(&mut self, index: u32, hop: u32, wire: Wire) -> Result<usize, Failure> {
        self.cx.counters.attempts += 1;
        if self.conns.len() >= self.net.max_conns {
            self.cx.counters.fail(Failure::NoFiles);
            return Err(Failure::NoFiles);
        }
        let r = route(
            u64::from(index),
            hop,
            self.net.targets.len(),
            self.sources.len(),
        );
        let stream = match self.socket(r) {
            Ok(s) => s,
            Err(e) => {
                let f = Failure::of_io(&e);
                self.cx.counters.fail(f);
                return Err(f);
            }
        };
        let target = &self.net.targets[r.target];
        let tls = match (&self.net.tls, target.tls) {
            (Some(config), true) => match tls::connect(config, &target.host) {
                Ok(tls) => Some(Box::new(tls)),
                Err(_) => {
                    self.cx.counters.fail(Failure::Handshake);
                    return Err(Failure::Handshake);
                }
            },
            _ => None,
        };
        let entry = self.conns.vacant_entry();
        let key = entry.key();
        // `Setup::new` holds a run to `MAX_TARGETS`.
        let mut conn = ClientConn::new(stream, index, r.target as u16, wire, self.cx.now_ns, tls);
        if let Err(e) = self.poll.registry().register(
            &mut conn.stream,
            Token(key),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            let f = Failure::of_io(&e);
            self.cx.counters.fail(f);
            return Err(f);
        }
        entry.insert(conn);
        self.in_setup += 1;
        self.deadlines.push(Reverse(Deadline {
            at_ns: self.cx.now_ns + self.net.setup_timeout_ns,
            key,
            index,
            closing: false,
        }));
        Ok(key)
    }

    /// A non-blocking socket bound as the route and port mode say, with
    /// connect() in progress.
    fn socket(&mut self, r: Route) -> io::Result<TcpStream> {
        let dest = self.net.targets[r.target].addr;
        let sock = Socket::new(
            Domain::for_address(dest),
            Type::STREAM.nonblocking(),
            Some(Protocol::TCP),
        )?;
        if self.net.nodelay {
            sock.set_nodelay(true)?;
        }
        let ip = r.source.map(|s| self.sources[s]);
        match (&mut self.ports, ip) {
            (None, None) => {}
            (None, Some(ip)) => {
                // Without this the kernel picks the port at bind() time,
                // unique per source IP across ALL destinations; with it, at
                // connect() time, unique only per 4-tuple.
                set_bind_no_port(&sock)?;
                sock.bind(&SocketAddr::new(ip, 0).into())?;
            }
            (Some(ports), ip) => {
                sock.set_reuse_address(true)?;
                let ip = ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
                let source = r.source.unwrap_or(0);
                let mut tries = 0;
                loop {
                    let port = ports.next_port(source);
                    match sock.bind(&SocketAddr::new(ip, port).into()) {
                        Ok(()) => break,
                        Err(e)
                            if e.raw_os_error() == Some(libc::EADDRINUSE) && tries < PORT_TRIES =>
                        {
                            tries += 1
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        match sock.connect(&dest.into()) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(e),
        }
        Ok(TcpStream::from_std(sock.into()))
    }

    /// Queues a masked text message on `key` (a WebSocket connection).
    pub fn queue_text(&mut self, key: usize, text: &[u8]) {
        if let Some(conn) = self.conns.get_mut(key) {
            conn.send_text(&mut self.cx, text);
        }
    }

    /// Queues raw bytes on `key` (a plain TCP connection).
    pub fn queue_raw(&mut self, key: usize, bytes: &[u8]) {
        if let Some(conn) = self.conns.get_mut(key) {
            conn.outbuf.extend_from_slice(bytes);
        }
    }

    /// Bytes queued on `key` that the socket has not taken yet.
    pub fn backlog(&self, key: usize) -> usize {
        self.conns.get(key).map_or(0, |c| c.outbuf.len())
    }

    /// Writes what `key` has queued.
    pub fn flush<H: Handler>(&mut self, key: usize, h: &mut H) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if let Err(ending) = conn.flush(&mut self.cx) {
            self.finish(key, ending, h);
        }
    }

    /// Ends connection `index` at `key`: a WebSocket close handshake
    /// (bounded by a deadline); other connections, and any with `reset`,
    /// close at once (an HTTP transport has nothing to say before its FIN).
    pub fn close<H: Handler>(&mut self, key: usize, index: u32, reset: bool, h: &mut H) {
        let Some(conn) = self.conns.get_mut(key).filter(|c| c.index == index) else {
            return;
        };
        if reset || conn.wire != Wire::WebSocket || conn.state.in_setup() {
            if reset {
                // SO_LINGER 0: close() sends RST and leaves no TIME_WAIT.
                let _ = SockRef::from(&conn.stream).set_linger(Some(Duration::ZERO));
            }
            self.finish(key, Ending::Clean, h);
            return;
        }
        match conn.start_close(&mut self.cx) {
            Ok(()) => self.deadlines.push(Reverse(Deadline {
                at_ns: self.cx.now_ns + CLOSE_TIMEOUT_NS,
                key,
                index,
                closing: true,
            })),
            Err(ending) => self.finish(key, ending, h),
        }
    }

    /// Waits up to `timeout` for readiness, handles it, then fires expired
    /// deadlines.
    pub fn turn<H: Handler>(&mut self, h: &mut H, timeout: Duration) -> io::Result<()> {
        if let Err(e) = self.poll.poll(&mut self.events, Some(timeout)) {
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        self.refresh_now();
        let mut ended: Vec<(usize, Ending)> = Vec::new();
        for ev in self.events.iter() {
            let token = ev.token();
            if token == WAKER {
                self.woken = true;
                continue;
            }
            let key = token.0;
            let Some(conn) = self.conns.get_mut(key) else {
                continue;
            };
            // Per event, not per turn: a busy turn would otherwise skew the
            // setup latencies of the connections handled late in it.
            self.cx.now_ns = self.origin.elapsed_ns();
            let was_setup = conn.state.in_setup();
            let r = Readiness {
                readable: ev.is_readable(),
                writable: ev.is_writable(),
                error: ev.is_error(),
                read_closed: ev.is_read_closed(),
            };
            let step = conn.ready(key, r, &mut self.cx, &mut self.scratch, h);
            if was_setup && !conn.state.in_setup() {
                self.in_setup -= 1;
            }
            if let Err(ending) = step {
                ended.push((key, ending));
            }
        }
        for (key, ending) in ended {
            self.finish(key, ending, h);
        }
        self.expire(h);
        Ok(())
    }

    /// Fails connections whose setup or close deadline passed.
    fn expire<H: Handler>(&mut self, h: &mut H) {
        while let Some(&Reverse(d)) = self.deadlines.peek() {
            if d.at_ns > self.cx.now_ns {
                break;
            }
            self.deadlines.pop();
            let Some(conn) = self.conns.get(d.key).filter(|c| c.index == d.index) else {
                continue;
            };
            let overdue = if d.closing {
                conn.state == crate::worker::client_conn::State::Closing
            } else {
                conn.state.in_setup()
            };
            if overdue {
                let _ = SockRef::from(&conn.stream).set_linger(Some(Duration::ZERO));
                self.finish(d.key, Ending::Failed(Failure::Timeout), h);
            }
        }
    }

    /// Removes `key`, counts how it ended and tells the workload.
    fn finish<H: Handler>(&mut self, key: usize, ending: Ending, h: &mut H) {
        let Some(conn) = self.conns.try_remove(key) else {
            return;
        };
        let was_open = !conn.state.in_setup();
        if !was_open {
            self.in_setup -= 1;
        }
        match ending {
            Ending::Clean => self.cx.counters.closed += 1,
            Ending::Failed(f) => self.cx.counters.fail(f),
        }
        h.on_closed(key, conn.index, ending, was_open, &mut self.cx.counters);
        // Dropping the stream closes the fd, which also removes it from epoll.
    }
}

/// Sets IP_BIND_ADDRESS_NO_PORT (Linux ≥ 4.2).
fn set_bind_no_port(sock: &Socket) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads `one` for the given length only.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
