//! One client connection's state machine, [`ClientConn`]: TCP connect →
//! request (a WebSocket upgrade, or the `GET` of a receive-only HTTP
//! transport) → (subscribe) → open → close, driven by readiness events from
//! the reactor.
//!
//! One machine for every [`Wire`]: what differs is how the bytes read are
//! cut into messages, by the protocol crate's [`MessageReader`] for
//! WebSocket, or by the reader of the HTTP transport (`crate::util::http`) — a
//! Server-Sent Events block, a chunked NDJSON line, a long-poll answer.
//! Every message then takes the same path to the workload, which cannot
//! tell the transports apart.
//!
//! A connection is deliberately small: the socket, an 8-byte
//! [`MessageReader`], a state byte, a wire byte, its global index, the
//! number of the target it went to, one timestamp and two byte vectors
//! that stay unallocated while idle (a frame or event cut at a read
//! boundary, or output the socket did not take). Reads go through the
//! worker's one scratch buffer, so an idle connection costs well under the 1 KiB of RSS the bench allows itself.
//! A connection that negotiated permessage-deflate holds nothing more: its
//! compressed deliveries go through the worker's one inflater (`Cx`), which
//! inflates each distinct message once.
//! The handshake nonce is derived from the index, and an HTTP transport's
//! request from the index and the worker's [`Assignment`], instead of
//! stored. Workload behaviour (what to send once open, what a delivery
//! means) is behind [`Handler`].
//!
//! Named for the client end: the server's `Conn` is the node's end of a
//! connection, and how one of these ended is an [`Ending`], not a close
//! reason of the protocol.

use std::io::{self, Read as _, Write as _};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use memchr::memmem::Finder;
use mio::net::TcpStream;
use myriad_protocol::handshake::{
    client_request_offering, parse_switching_protocols_offered, PERMESSAGE_DEFLATE_OFFER,
};
use myriad_protocol::position::Position;
use myriad_protocol::ws::{
    apply_mask, write_frame_header, Message, MessageReader, OpCode, Read, ReadLimits,
};
use rustls::ClientConnection;

use crate::schema::SubscribeTransport;
use crate::util::counters::{Counters, Failure};
use crate::util::histogram::{self, Micros};
use crate::util::http::chunked::{self, Chunk};
use crate::util::http::poll::{self, PollError};
use crate::util::http::sse::{self, Block};
use crate::util::http::{self, Receive, Resume, MAX_HEAD};
use crate::util::inflate_cache::InflateCache;
use crate::util::pattern::{mix, Assignment};

/// What a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// RFC 6455 after an upgrade: commands and messages in text frames.
    WebSocket,
    /// WebSocket whose upgrade offers permessage-deflate (RFC 7692), read
    /// with the worker's inflater once the server agreed; a connection
    /// whose server declined goes on as plain [`Wire::WebSocket`].
    WebSocketDeflate,
    /// Plain TCP whose bytes the workload reads itself (HTTP publishing).
    Raw,
    /// A receive-only HTTP transport: its request is the subscription.
    Http(Receive),
}

impl From<SubscribeTransport> for Wire {
    /// What a subscriber receiving over `t` speaks.
    fn from(t: SubscribeTransport) -> Wire {
        match t {
            SubscribeTransport::Ws => Wire::WebSocket,
            SubscribeTransport::WsDeflate => Wire::WebSocketDeflate,
            SubscribeTransport::Sse => Wire::Http(Receive::Sse),
            SubscribeTransport::Stream => Wire::Http(Receive::Stream),
            SubscribeTransport::Poll => Wire::Http(Receive::Poll),
        }
    }
}

impl Wire {
    /// Whether it speaks WebSocket, compressed or not.
    pub fn is_websocket(self) -> bool {
        matches!(self, Wire::WebSocket | Wire::WebSocketDeflate)
    }
}

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// connect() issued, not yet established.
    Connecting,
    /// Request sent, waiting for the 101 (or an HTTP transport's 200, which
    /// a long-poll sends with its first answer).
    Handshaking,
    /// Subscribe sent (or an HTTP transport's head received), waiting for
    /// the profile's ack.
    Subscribing,
    /// Usable.
    Open,
    /// We sent a close frame and wait for the server to close TCP.
    Closing,
}

impl State {
    /// Connecting, handshaking or subscribing: counts against --in-flight.
    pub fn in_setup(self) -> bool {
        matches!(
            self,
            State::Connecting | State::Handshaking | State::Subscribing
        )
    }
}

/// How a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// A close we asked for completed.
    Clean,
    /// It failed, for this reason.
    Failed(Failure),
}

/// What the workload does with a connection. The reactor calls these from
/// its event loop; they must not block.
pub trait Handler {
    /// The connection is ready for what the workload opens it with, at
    /// monotonic `now_ns`: upgraded (WebSocket), or TCP-connected (raw, and
    /// HTTP transports, whose request is the opening). Write into `out` the
    /// messages to send, or where an HTTP transport's request resumes its
    /// subjects.
    fn on_open(&mut self, key: usize, index: u32, now_ns: u64, out: &mut Opening);
    /// A message arrived (a WebSocket data frame, or one message of an HTTP
    /// transport): a delivery, or a reply such as the subscribe
    /// acknowledgement; `now_real` is the wall clock at the read. Returns
    /// true if it was a delivery the workload recognised (its timestamp was
    /// found). Nothing arrives here from a connection the workload is
    /// closing.
    fn on_message(
        &mut self,
        index: u32,
        data: &[u8],
        now_real: u64,
        counters: &mut Counters,
    ) -> bool;
    /// Bytes arrived on a raw (non-WebSocket) connection; returns how many
    /// it consumed (the rest is kept for the next call).
    fn on_raw(&mut self, index: u32, data: &[u8], now_real: u64, counters: &mut Counters) -> usize;
    /// The connection is gone; `was_open` if it had reached Open. Its end
    /// is counted already; `counters` take what the workload makes of it.
    fn on_closed(
        &mut self,
        key: usize,
        index: u32,
        ending: Ending,
        was_open: bool,
        counters: &mut Counters,
    );
    /// The user connection `index` acts as, if any: its WebSocket request
    /// then asks for `?user=ID`, and the node subscribes it to the feeds
    /// that user follows and its own.
    fn user(&self, _index: u32) -> Option<u64> {
        None
    }
}

/// What a workload sends as its connection opens: over WebSocket usually
/// one subscribe, but a resubscribe with `since` takes one command per
/// subject; over an HTTP transport, where its request resumes. One buffer,
/// reused for every connection of the worker.
#[derive(Debug, Default)]
pub struct Opening {
    buf: String,
    /// Where each message starts in `buf`.
    starts: Vec<usize>,
    /// HTTP transports: one position per subject of the request, in the
    /// order [`Assignment::subjects_for`] gives; empty: live from now.
    resume: Vec<Option<Position>>,
}

impl Opening {
    /// Begins the next message: append its text to the buffer returned
    /// (and nothing else: what is there already belongs to earlier ones).
    pub fn message(&mut self) -> &mut String {
        self.starts.push(self.buf.len());
        &mut self.buf
    }

    /// The messages, in order.
    pub fn messages(&self) -> impl Iterator<Item = &str> {
        let ends = self.starts.iter().skip(1).copied().chain([self.buf.len()]);
        self.starts
            .iter()
            .zip(ends)
            .map(|(&start, end)| &self.buf[start..end])
    }

    /// An HTTP transport's request resumes its subjects from `positions`.
    pub fn resume_from(&mut self, positions: impl IntoIterator<Item = Option<Position>>) {
        self.resume.extend(positions);
    }

    /// Where an HTTP transport's request resumes its subjects.
    pub fn resumes(&self) -> &[Option<Position>] {
        &self.resume
    }

    fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    fn clear(&mut self) {
        self.buf.clear();
        self.starts.clear();
        self.resume.clear();
    }
}

/// State shared by every connection of a worker, lent to each call.
pub struct Cx {
    /// Frame limits for reading (client role).
    pub limits: ReadLimits,
    /// The worker's counters.
    pub counters: Counters,
    /// Connect latency (connect() → established).
    pub connect_hist: Micros,
    /// Handshake latency (request sent → 101 validated).
    pub handshake_hist: Micros,
    /// Finds the subscribe acknowledgement, if the profile has one.
    pub ack: Option<Finder<'static>>,
    /// Finds error replies, if the profile names them.
    pub error: Option<Finder<'static>>,
    /// Monotonic now, ns since the worker's time origin, set before each dispatch.
    pub now_ns: u64,
    /// Mask generator state (client frames must be masked, RFC 6455 §5.3;
    /// the mask needs to be unpredictable to intermediaries, not secret).
    mask_state: u64,
    /// Reused for what handlers send as a connection opens.
    opening: Opening,
    /// Host header and path of each target, in route order.
    pub targets: Vec<(String, String)>,
    /// Who subscribes to what: the subjects an HTTP transport's request
    /// names. None for workers whose connections subscribe to nothing.
    pub subjects: Option<Assignment>,
    /// Scratch for one request's subjects.
    subject_ids: Vec<u64>,
    subject_names: Vec<String>,
    /// Inflates the compressed deliveries of every permessage-deflate
    /// connection of the worker (the server compresses each message on its
    /// own, so one serves them all), each distinct message once: the copies
    /// a node sends its recipients reuse its text (`util::inflate_cache`).
    inflater: InflateCache,
}

impl Cx {
    /// A context for a worker.
    pub fn new(
        targets: Vec<(String, String)>,
        max_message: usize,
        ack: Option<&str>,
        error: Option<&str>,
        seed: u64,
    ) -> Cx {
        let finder = |s: &str| Finder::new(s.as_bytes()).into_owned();
        Cx {
            limits: ReadLimits {
                role: myriad_protocol::ws::Role::Client,
                max_message,
            },
            counters: Counters::default(),
            connect_hist: histogram::new(),
            handshake_hist: histogram::new(),
            ack: ack.map(finder),
            error: error.map(finder),
            now_ns: 0,
            mask_state: mix(seed),
            opening: Opening::default(),
            targets,
            subjects: None,
            subject_ids: Vec::new(),
            subject_names: Vec::new(),
            inflater: InflateCache::new(),
        }
    }

    /// Appends the request that opens `kind` for connection `index` on
    /// target `target`.
    fn write_request(
        &mut self,
        kind: Receive,
        index: u32,
        target: u16,
        resume: Resume<'_>,
        out: &mut Vec<u8>,
    ) {
        self.subject_names.clear();
        if let Some(a) = &self.subjects {
            a.subjects_for(u64::from(index), &mut self.subject_ids);
            let names = self.subject_ids.iter().map(|&s| a.pattern.subject(s));
            self.subject_names.extend(names);
        }
        let (host, path) = &self.targets[target as usize];
        http::write_request(kind, host, path, &self.subject_names, resume, out);
    }

    /// A fresh masking key.
    pub fn mask(&mut self) -> [u8; 4] {
        self.mask_state = mix(self.mask_state);
        (self.mask_state as u32).to_ne_bytes()
    }
}

/// Hands the plaintext in `outbuf` to rustls and writes what it has for
/// the socket: the handshake first, then records.
fn flush_tls(
    tls: &mut ClientConnection,
    stream: &mut TcpStream,
    outbuf: &mut Vec<u8>,
    cx: &mut Cx,
) -> Step {
    let failed = |e: io::Error| Ending::Failed(Failure::of_io(&e));
    if !outbuf.is_empty() {
        let taken = tls.writer().write(outbuf).map_err(failed)?;
        outbuf.drain(..taken);
        if outbuf.is_empty() {
            *outbuf = Vec::new();
        }
    }
    while tls.wants_write() {
        match tls.write_tls(stream) {
            Ok(n) => cx.counters.bytes_out += n as u64,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(failed(e)),
        }
    }
    Ok(())
}

/// One read of plaintext: from the socket, or through rustls, which reads
/// and decrypts records until it has plaintext, the socket would block, or
/// the stream ends (0, with or without close_notify).
fn read_some(
    stream: &mut TcpStream,
    tls: Option<&mut ClientConnection>,
    buf: &mut [u8],
) -> io::Result<usize> {
    let Some(tls) = tls else {
        return stream.read(buf);
    };
    loop {
        match tls.reader().read(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        tls.read_tls(stream)?;
        tls.process_new_packets()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    }
}

/// Appends one masked, final frame to `out` without an intermediate copy.
pub fn push_frame(out: &mut Vec<u8>, opcode: OpCode, payload: &[u8], mask: [u8; 4]) {
    write_frame_header(out, true, opcode, payload.len(), Some(mask));
    let start = out.len();
    out.extend_from_slice(payload);
    apply_mask(&mut out[start..], mask);
}

/// The Sec-WebSocket-Key of connection `index`: 16 bytes derived from the
/// index, so it need not be stored to check the server's accept value.
pub fn ws_key(index: u32) -> String {
    let a = mix(u64::from(index));
    let b = mix(a);
    let mut nonce = [0u8; 16];
    nonce[..8].copy_from_slice(&a.to_le_bytes());
    nonce[8..].copy_from_slice(&b.to_le_bytes());
    STANDARD.encode(nonce)
}

/// What a readiness event says about a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readiness {
    /// Data (or EOF) to read.
    pub readable: bool,
    /// Room to write; for a connecting socket, the connect finished.
    pub writable: bool,
    /// The socket has an error pending.
    pub error: bool,
    /// The peer shut down its side (or the connection is gone).
    pub read_closed: bool,
}

/// What the reactor should do after a connection handled an event.
pub type Step = Result<(), Ending>;

/// One client connection.
pub struct ClientConn {
    /// The socket.
    pub stream: TcpStream,
    /// Reassembles fragmented messages; 8 bytes while none is in progress.
    reader: MessageReader,
    /// Life-cycle position.
    pub state: State,
    /// What it speaks.
    pub wire: Wire,
    /// The connection's global index: its subjects, route and key follow from it.
    pub index: u32,
    /// Which target it went to: its route's, moved on as the workload asked
    /// (a run has at most [`crate::util::addr::MAX_TARGETS`]).
    target: u16,
    /// Monotonic ns when the current setup step began (latency base).
    since_ns: u64,
    /// Bytes of an incomplete frame (or event, line, response) left from
    /// the last read.
    inbuf: Vec<u8>,
    /// Bytes the socket has not accepted yet (on TLS: plaintext rustls
    /// has not taken yet).
    pub outbuf: Vec<u8>,
    /// rustls' client on a `wss://` target: every byte goes through it.
    tls: Option<Box<ClientConnection>>,
}

impl ClientConn {
    /// A connection whose connect() is in progress.
    pub fn new(
        stream: TcpStream,
        index: u32,
        target: u16,
        wire: Wire,
        now_ns: u64,
        tls: Option<Box<ClientConnection>>,
    ) -> ClientConn {
        ClientConn {
            stream,
            reader: MessageReader::new(),
            state: State::Connecting,
            wire,
            index,
            target,
            since_ns: now_ns,
            inbuf: Vec::new(),
            outbuf: Vec::new(),
            tls,
        }
    }

    /// Handles a readiness event.
    pub fn ready<H: Handler>(
        &mut self,
        key: usize,
        r: Readiness,
        cx: &mut Cx,
        scratch: &mut Vec<u8>,
        h: &mut H,
    ) -> Step {
        if self.state == State::Connecting {
            // Writable without an error: connected, even if the server has
            // already answered and closed (the read below sees that).
            if r.error || (r.read_closed && !r.writable) {
                let e = self.stream.take_error().ok().flatten();
                return Err(Ending::Failed(
                    e.map_or(Failure::Reset, |e| Failure::of_io(&e)),
                ));
            }
            if !r.writable {
                return Ok(());
            }
            self.connected(key, cx, h)?;
        }
        if r.readable || r.read_closed || r.error {
            self.read(key, r.read_closed, cx, scratch, h)?;
        }
        self.flush(cx)
    }

    /// Writes as much of `outbuf` as the socket takes.
    pub fn flush(&mut self, cx: &mut Cx) -> Step {
        if let Some(tls) = self.tls.as_deref_mut() {
            return flush_tls(tls, &mut self.stream, &mut self.outbuf, cx);
        }
        let mut written = 0;
        while written < self.outbuf.len() {
            match self.stream.write(&self.outbuf[written..]) {
                Ok(0) => return Err(Ending::Failed(Failure::Reset)),
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Ending::Failed(Failure::of_io(&e))),
            }
        }
        cx.counters.bytes_out += written as u64;
        if written == self.outbuf.len() {
            // Give the memory back: an idle connection holds no buffer.
            if self.outbuf.capacity() > 4096 {
                self.outbuf = Vec::new();
            } else {
                self.outbuf.clear();
            }
        } else {
            self.outbuf.drain(..written);
        }
        Ok(())
    }

    /// Queues a close frame and moves to Closing.
    pub fn start_close(&mut self, cx: &mut Cx) -> Step {
        let mask = cx.mask();
        push_frame(
            &mut self.outbuf,
            OpCode::Close,
            &1000u16.to_be_bytes(),
            mask,
        );
        self.state = State::Closing;
        self.flush(cx)
    }

    /// Queues a masked text message.
    pub fn send_text(&mut self, cx: &mut Cx, text: &[u8]) {
        let mask = cx.mask();
        push_frame(&mut self.outbuf, OpCode::Text, text, mask);
    }

    /// The first writable edge of a connecting socket without an error:
    /// connect() succeeded. (Asking the kernel with SO_ERROR and
    /// getpeername would cost two syscalls per connection for nothing.)
    fn connected<H: Handler>(&mut self, key: usize, cx: &mut Cx, h: &mut H) -> Step {
        cx.counters.connected += 1;
        histogram::record(&mut cx.connect_hist, (cx.now_ns - self.since_ns) / 1000);
        self.since_ns = cx.now_ns;
        match self.wire {
            Wire::Raw => {
                self.opened(key, cx, h);
                return Ok(());
            }
            Wire::WebSocket | Wire::WebSocketDeflate => {
                let (host, path) = &cx.targets[self.target as usize];
                let key = ws_key(self.index);
                let offer =
                    (self.wire == Wire::WebSocketDeflate).then_some(PERMESSAGE_DEFLATE_OFFER);
                let request = match h.user(self.index) {
                    Some(user) => {
                        client_request_offering(host, &http::with_user(path, user), &key, offer)
                    }
                    None => client_request_offering(host, path, &key, offer),
                };
                self.outbuf.extend_from_slice(&request);
            }
            Wire::Http(kind) => {
                let mut opening = std::mem::take(&mut cx.opening);
                opening.clear();
                h.on_open(key, self.index, cx.now_ns, &mut opening);
                let resume = Resume::Positions(opening.resumes());
                cx.write_request(kind, self.index, self.target, resume, &mut self.outbuf);
                cx.opening = opening;
            }
        }
        self.state = State::Handshaking;
        self.flush(cx)
    }

    /// The answer to the request arrived (a 101, or an HTTP transport's
    /// 200): the handshake is done.
    fn head_arrived(&mut self, cx: &mut Cx) {
        cx.counters.upgraded += 1;
        histogram::record(&mut cx.handshake_hist, (cx.now_ns - self.since_ns) / 1000);
    }

    /// The connection became usable: let the workload send its first texts.
    fn opened<H: Handler>(&mut self, key: usize, cx: &mut Cx, h: &mut H) {
        let mut opening = std::mem::take(&mut cx.opening);
        opening.clear();
        h.on_open(key, self.index, cx.now_ns, &mut opening);
        self.state = State::Open;
        if !opening.is_empty() {
            for text in opening.messages() {
                if self.wire == Wire::Raw {
                    self.outbuf.extend_from_slice(text.as_bytes());
                } else {
                    self.send_text(cx, text.as_bytes());
                }
            }
            if cx.ack.is_some() {
                self.state = State::Subscribing;
            } else {
                cx.counters.subscribed += 1;
            }
        }
        cx.opening = opening;
    }

    /// Reads until the socket is drained, handling everything complete.
    /// A read that returns less than asked for means drained (edge-triggered
    /// epoll reports data arriving later as a new event), which saves the
    /// EAGAIN read per event, unless the peer has closed: then read on to
    /// the end of the stream.
    fn read<H: Handler>(
        &mut self,
        key: usize,
        read_closed: bool,
        cx: &mut Cx,
        scratch: &mut Vec<u8>,
        h: &mut H,
    ) -> Step {
        let mut have = self.inbuf.len();
        if have > 0 {
            if scratch.len() < have {
                scratch.resize(have, 0);
            }
            scratch[..have].copy_from_slice(&self.inbuf);
            self.inbuf = Vec::new();
        }
        let mut eof = false;
        loop {
            if have == scratch.len() {
                // A frame larger than the scratch buffer: grow it (the
                // reader has already bounded the frame by max_message).
                let grown = (scratch.len() * 2)
                    .min(cx.limits.max_message + 16)
                    .max(have + 1);
                scratch.resize(grown, 0);
            }
            let want = scratch.len() - have;
            let n = match read_some(
                &mut self.stream,
                self.tls.as_deref_mut(),
                &mut scratch[have..],
            ) {
                Ok(0) => {
                    eof = true;
                    0
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // rustls refused what the server sent.
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    return Err(Ending::Failed(Failure::Handshake))
                }
                Err(e) => return Err(Ending::Failed(Failure::of_io(&e))),
            };
            have += n;
            cx.counters.wire_bytes_in += n as u64;
            let now_real = crate::util::clock::realtime_ns();
            let used = self.consume(key, cx, &mut scratch[..have], now_real, h)?;
            scratch.copy_within(used..have, 0);
            have -= used;
            // Plaintext shorter than asked says nothing about the socket
            // under TLS: read on until it would block.
            let drained = n < want && self.tls.is_none();
            if eof || (drained && !read_closed) {
                break;
            }
        }
        if have > 0 {
            self.inbuf = scratch[..have].to_vec();
        }
        if eof {
            return Err(match self.state {
                State::Closing => Ending::Clean,
                _ => Ending::Failed(Failure::ServerClosed),
            });
        }
        Ok(())
    }

    /// Handles every complete unit at the front of `buf`; returns the
    /// bytes used.
    fn consume<H: Handler>(
        &mut self,
        key: usize,
        cx: &mut Cx,
        buf: &mut [u8],
        now_real: u64,
        h: &mut H,
    ) -> Result<usize, Ending> {
        match self.wire {
            Wire::Raw => return Ok(h.on_raw(self.index, buf, now_real, &mut cx.counters)),
            Wire::Http(kind) => return self.consume_http(kind, cx, buf, now_real, h),
            Wire::WebSocket | Wire::WebSocketDeflate => {}
        }
        let mut pos = 0;
        if self.state == State::Handshaking {
            let key_text = ws_key(self.index);
            let offered = self.wire == Wire::WebSocketDeflate;
            match parse_switching_protocols_offered(buf, &key_text, offered) {
                Ok(None) if buf.len() > MAX_HEAD => return Err(Ending::Failed(Failure::Handshake)),
                Ok(None) => return Ok(0),
                Ok(Some((head, agreed))) => {
                    if agreed {
                        cx.counters.deflate_agreed += 1;
                    } else {
                        self.wire = Wire::WebSocket;
                    }
                    self.head_arrived(cx);
                    pos = head;
                    self.opened(key, cx, h);
                }
                Err(_) => return Err(Ending::Failed(Failure::Handshake)),
            }
        }
        // The worker's one inflater, lent for these frames: a delivery may
        // be borrowed from it while `cx` is used (see `consume_frames`).
        let mut inflater = std::mem::take(&mut cx.inflater);
        let before = inflater.inflated();
        let used = self.consume_frames(cx, buf, pos, now_real, &mut inflater, h);
        cx.counters.inflated += inflater.inflated() - before;
        cx.inflater = inflater;
        used
    }

    /// [`consume`](Self::consume) for WebSocket frames from `pos` on,
    /// compressed ones inflated by `inflater` when the server agreed to it.
    fn consume_frames<H: Handler>(
        &mut self,
        cx: &mut Cx,
        buf: &mut [u8],
        mut pos: usize,
        now_real: u64,
        inflater: &mut InflateCache,
        h: &mut H,
    ) -> Result<usize, Ending> {
        let inflates = self.wire == Wire::WebSocketDeflate;
        loop {
            let ClientConn {
                reader,
                state,
                outbuf,
                index,
                ..
            } = self;
            let read = reader
                .read_deflate(
                    &mut buf[pos..],
                    &cx.limits,
                    inflates.then_some(&mut *inflater),
                )
                .map_err(|_| Ending::Failed(Failure::Protocol))?;
            let (consumed, message) = match read {
                Read::Incomplete { .. } => return Ok(pos),
                Read::Frame { consumed, message } => (consumed, message),
            };
            pos += consumed;
            match message {
                None | Some(Message::Pong(_)) => {}
                Some(Message::Text(t)) => on_data(cx, state, *index, t.as_bytes(), now_real, h),
                Some(Message::Binary(b)) => on_data(cx, state, *index, b, now_real, h),
                Some(Message::Ping(p)) => {
                    cx.counters.heartbeats += 1;
                    let mask = cx.mask();
                    push_frame(outbuf, OpCode::Pong, p, mask);
                }
                Some(Message::Close(_)) if *state == State::Closing => {
                    // The server's answer to our close; its FIN follows.
                }
                Some(Message::Close(payload)) => {
                    // The server is closing on us: answer as RFC 6455 §5.5.1
                    // asks, then give up the connection.
                    let code = payload.map_or(1000, |(code, _)| code);
                    let mask = cx.mask();
                    push_frame(outbuf, OpCode::Close, &code.to_be_bytes(), mask);
                    let _ = self.flush(cx);
                    return Err(Ending::Failed(Failure::ServerClosed));
                }
            }
        }
    }

    /// [`consume`](Self::consume) for an HTTP transport: the response head
    /// (a long-poll's comes with each answer), then messages as the
    /// transport's reader cuts them. A long-poll answer is followed at once
    /// by the next poll, from the answer's cursor, on the same connection.
    fn consume_http<H: Handler>(
        &mut self,
        kind: Receive,
        cx: &mut Cx,
        buf: &[u8],
        now_real: u64,
        h: &mut H,
    ) -> Result<usize, Ending> {
        let max = cx.limits.max_message;
        let mut pos = 0;
        if self.state == State::Handshaking && kind != Receive::Poll {
            let Some(head) =
                http::parse_head(buf).map_err(|_| Ending::Failed(Failure::Handshake))?
            else {
                return Ok(0);
            };
            head.expect(kind)
                .map_err(|_| Ending::Failed(Failure::Handshake))?;
            self.head_arrived(cx);
            self.state = State::Subscribing;
            pos = head.len;
        }
        let (index, target) = (self.index, self.target);
        loop {
            let rest = &buf[pos..];
            pos += match kind {
                Receive::Sse => {
                    let Some((used, block)) = sse::next_block(rest, max)
                        .map_err(|_| Ending::Failed(Failure::Protocol))?
                    else {
                        return Ok(pos);
                    };
                    match block {
                        Block::Event(e) => {
                            on_data(cx, &mut self.state, index, &e.data, now_real, h)
                        }
                        Block::Comment => cx.counters.heartbeats += 1,
                        Block::Other => {}
                    }
                    used
                }
                Receive::Stream => {
                    let Some((used, chunk)) = chunked::next_lines(rest, max)
                        .map_err(|_| Ending::Failed(Failure::Protocol))?
                    else {
                        return Ok(pos);
                    };
                    // The server ended the body (after its close line).
                    let Chunk::Lines(lines) = chunk else {
                        return Err(Ending::Failed(Failure::ServerClosed));
                    };
                    let lines = lines.strip_suffix(b"\n").unwrap_or(&lines);
                    for line in lines.split(|&b| b == b'\n') {
                        if line.is_empty() {
                            cx.counters.heartbeats += 1;
                        } else {
                            on_data(cx, &mut self.state, index, line, now_real, h);
                        }
                    }
                    used
                }
                Receive::Poll => {
                    let answer = poll::next_answer(rest, max).map_err(|e| match e {
                        PollError::Head(_) => Ending::Failed(Failure::Handshake),
                        _ => Ending::Failed(Failure::Protocol),
                    })?;
                    let Some((used, answer)) = answer else {
                        return Ok(pos);
                    };
                    if self.state == State::Handshaking {
                        // The first answer is the subscription's
                        // acknowledgement: from its cursor on, polls miss
                        // nothing still in history.
                        self.head_arrived(cx);
                        self.state = State::Open;
                        cx.counters.subscribed += 1;
                    }
                    for element in &answer.elements {
                        on_data(
                            cx,
                            &mut self.state,
                            index,
                            element.get().as_bytes(),
                            now_real,
                            h,
                        );
                    }
                    let next = Resume::Cursor(&answer.since);
                    cx.write_request(Receive::Poll, index, target, next, &mut self.outbuf);
                    used
                }
            };
        }
    }
}

/// A message: a delivery for the workload, the subscribe ack, or an error
/// reply. The ack moves the connection to Open and still goes to the
/// workload, which may read positions from it.
fn on_data<H: Handler>(
    cx: &mut Cx,
    state: &mut State,
    index: u32,
    data: &[u8],
    now_real: u64,
    h: &mut H,
) {
    if *state == State::Closing {
        // The workload has moved on from this connection (a churning
        // subscriber already listens on its next one): what is still in
        // flight here is not its to count.
        cx.counters.other_in += 1;
        return;
    }
    if *state == State::Subscribing && cx.ack.as_ref().is_some_and(|f| f.find(data).is_some()) {
        *state = State::Open;
        cx.counters.subscribed += 1;
    }
    if h.on_message(index, data, now_real, &mut cx.counters) {
        cx.counters.messages_in += 1;
        cx.counters.bytes_in += data.len() as u64;
        return;
    }
    cx.counters.other_in += 1;
    if cx.error.as_ref().is_some_and(|f| f.find(data).is_some()) {
        cx.counters.server_errors += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_stays_compact() {
        // The idle-cost budget (≲1 KiB of RSS per connection, with slab and
        // timers) rests on this staying small: 88 bytes in release (8 of
        // them the TLS pointer, null on ws://; the target's 2 fit in what
        // was padding), plus the 8-byte selector id mio adds to a socket in
        // debug builds. Exact, so a field that grows it fails here and this
        // comment and docs/benchmarks.md are brought up to date with it.
        let mio_selector_id = if cfg!(debug_assertions) { 8 } else { 0 };
        assert_eq!(std::mem::size_of::<ClientConn>(), 88 + mio_selector_id);
        assert_eq!(std::mem::size_of::<MessageReader>(), 8);
    }

    #[test]
    fn keys_are_valid_and_repeatable() {
        let k = ws_key(42);
        assert_eq!(k, ws_key(42));
        assert_ne!(k, ws_key(43));
        assert_eq!(
            STANDARD.decode(&k).unwrap().len(),
            16,
            "RFC 6455 §4.1: 16 random bytes"
        );
    }

    #[test]
    fn an_opening_keeps_its_messages_apart() {
        let mut o = Opening::default();
        assert!(o.is_empty());
        o.message().push_str("{\"a\":1}");
        o.message();
        o.message().push_str("bc");
        assert_eq!(o.messages().collect::<Vec<_>>(), ["{\"a\":1}", "", "bc"]);
        o.clear();
        assert!(o.is_empty() && o.messages().next().is_none());
    }

    #[test]
    fn frames_are_masked() {
        let mut out = Vec::new();
        push_frame(&mut out, OpCode::Text, b"hi", [1, 2, 3, 4]);
        assert_eq!(out, vec![0x81, 0x82, 1, 2, 3, 4, b'h' ^ 1, b'i' ^ 2]);
    }
}
