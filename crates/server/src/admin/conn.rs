//! The admin listener's connections: how many it holds and how long each
//! may take, so that a client that never finishes a request, or never
//! leaves, cannot keep a connection, or a descriptor, for ever.
//!
//! Owns the cap (`admin_max_connections`) and the share of it open to
//! connections that have not yet sent a request carrying a key
//! (`admin_unauthenticated_connections`): when either is full, the oldest
//! such connection waiting for a request is closed to make room for the
//! new one (`myriad_admin_unauthenticated_closes_total`), so that whoever
//! reaches the port cannot hold every slot; only when none can be closed
//! is the new one answered 503 and closed at once. A slot passes to the
//! newcomer as soon as its holder is told to close, so for the moment its
//! task takes to run the listener holds one descriptor more per such
//! handover. Also each connection's phase, with its deadline:
//!
//! - *head*, from accept, or from the first byte of a request that follows
//!   another, until hyper has the request's head: `admin_header_timeout`,
//!   then the connection is closed (`errors{kind="admin_header_timeout"}`);
//! - *busy*, while the request is served: no deadline here; the handler
//!   that reads a body keeps `admin_body_timeout` itself and answers 408;
//! - *idle*, from a whole reply until the next request's first byte:
//!   `admin_idle_timeout` (`admin_header_timeout` until a request on it
//!   has carried a key), then closed (`myriad_admin_idle_closes_total`).
//!   A peer that does not read its reply is cut by the same deadline;
//! - *streaming*, while a `/status/events` reply lives: no deadline (the
//!   streams are capped by `max_status_streams`); idle once it ends.
//!
//! One watchdog per connection sleeps until its phase's deadline and drops
//! the connection, closing it, if it is still in that phase. With
//! `admin_tls` the TLS handshake runs first, inside the *head* phase's
//! deadline; a failed one is counted (`errors{kind="tls_handshake_failed"}`).
//!
//! At shutdown every connection is told to end gracefully (hyper's own
//! graceful shutdown): an idle one closes at once, a busy one once its
//! reply is written.
//!
//! It must not route or answer requests: that is `mod.rs`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::io::{self, Read, Write};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::Watcher;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tracing::debug;

use super::access::Keys;
use crate::config::Config;
use crate::metrics::{ErrorKind, Metrics};
use crate::tls::TlsFailure;

/// The cap on open admin connections, and the share of it that
/// connections which have presented no key may hold.
pub(super) struct Admission {
    table: Arc<Mutex<Table>>,
    max: usize,
    /// `admin_unauthenticated_connections`, at most `max`.
    share: usize,
    keys: Arc<Keys>,
    open: Gauge,
}

/// Who holds the slots. Locked only for a few map operations, never across
/// an `.await`; the admin runtime has one thread, so it is never contended.
#[derive(Default)]
struct Table {
    /// Connections holding a slot.
    open: usize,
    /// The ones that have not yet sent a request carrying a key, by the
    /// order they were accepted in (ids only grow): the oldest first.
    unauthenticated: BTreeMap<u64, Arc<Watch>>,
    next: u64,
}

impl Table {
    fn lock(table: &Mutex<Table>) -> std::sync::MutexGuard<'_, Table> {
        table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One admitted connection's place under the cap, given back when dropped
/// (or already, if it was closed to make room).
pub(super) struct Slot {
    id: u64,
    watch: Arc<Watch>,
    table: Arc<Mutex<Table>>,
    keys: Arc<Keys>,
    open: Gauge,
}

impl Slot {
    /// A request arrived: if it carries a key, the connection leaves the
    /// unauthenticated share for good.
    fn request(&self, method: &hyper::Method, headers: &hyper::HeaderMap) {
        if !self.watch.state().authenticated && self.keys.carried_by(method, headers) {
            self.watch.state().authenticated = true;
            Table::lock(&self.table).unauthenticated.remove(&self.id);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut table = Table::lock(&self.table);
        table.unauthenticated.remove(&self.id);
        if !self.watch.state().evicted {
            table.open -= 1;
            self.open.dec();
        }
    }
}

impl Admission {
    pub(super) fn new(config: &Config, metrics: &Metrics) -> Admission {
        Admission {
            table: Arc::default(),
            max: config.admin_max_connections,
            share: config
                .admin_unauthenticated_connections
                .min(config.admin_max_connections),
            keys: Arc::new(Keys::new(config)),
            open: metrics.admin_connections(),
        }
    }

    /// Connections open now.
    pub(super) fn open(&self) -> usize {
        Table::lock(&self.table).open
    }

    /// A place for `stream`, or `None` at the cap, once the peer has been
    /// told so (503) and the refusal counted; the caller then drops it.
    ///
    /// A new connection has presented no key yet. When the cap or the
    /// unauthenticated share is full, the oldest connection that has
    /// presented none and is not in the middle of a request is closed to
    /// make room: its slot passes to the newcomer at once, and its task,
    /// woken, drops the socket. A connection that shows a key within the
    /// time `share` more connections take to arrive is never closed this
    /// way, so someone holding idle connections open cannot keep a key's
    /// holder out; only a cap full of connections that have shown a key,
    /// or are busy, refuses.
    pub(super) fn admit(&self, stream: &TcpStream, metrics: &Metrics) -> Option<Slot> {
        let mut table = Table::lock(&self.table);
        if table.open >= self.max || table.unauthenticated.len() >= self.share {
            let oldest = table
                .unauthenticated
                .iter()
                .find(|(_, watch)| watch.evictable())
                .map(|(id, _)| *id);
            let Some(oldest) = oldest else {
                drop(table);
                metrics.error(ErrorKind::AdminOverCapacity);
                refuse(stream, self.max);
                return None;
            };
            let watch = table.unauthenticated.remove(&oldest).expect("just found");
            watch.evict();
            table.open -= 1;
            self.open.dec();
            metrics.admin_unauthenticated_closed();
        }
        let id = table.next;
        table.next += 1;
        table.open += 1;
        let watch = Arc::new(Watch::new());
        table.unauthenticated.insert(id, Arc::clone(&watch));
        self.open.inc();
        Some(Slot {
            id,
            watch,
            table: Arc::clone(&self.table),
            keys: Arc::clone(&self.keys),
            open: self.open.clone(),
        })
    }
}

/// Answers a connection past the cap without waiting for its request, so
/// a refused connection holds its descriptor for no time at all.
fn refuse(stream: &TcpStream, max: usize) {
    let body = format!(
        r#"{{"error":{{"code":"over_capacity","message":"{max} admin connections are open, all that admin_max_connections allows"}}}}"#
    );
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    // Straight on the socket (non-blocking since accept): tokio's own
    // readiness for a socket this new is not known yet.
    let socket = socket2::SockRef::from(stream);
    // What has arrived of the request is read first: closing with unread
    // input resets the connection, and the peer could lose the answer. A
    // few reads at most, so a peer that keeps sending cannot hold us here.
    let mut sink = [0u8; 2048];
    for _ in 0..4 {
        if !matches!((&*socket).read(&mut sink), Ok(n) if n > 0) {
            break;
        }
    }
    // Best effort: a peer whose buffer is full just sees the close.
    let _ = (&*socket).write(answer.as_bytes());
}

/// The deadlines of the phases that have one.
#[derive(Clone, Copy)]
pub(super) struct Timeouts {
    header: Duration,
    idle: Duration,
}

impl Timeouts {
    pub(super) fn new(config: &Config) -> Timeouts {
        Timeouts {
            header: Duration::from_secs(config.admin_header_timeout.into()),
            idle: Duration::from_secs(config.admin_idle_timeout.into()),
        }
    }
}

/// Where an admin connection is in its life, as `conn::Phase` is for a
/// client connection (the module header says what each one allows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Head,
    Busy,
    Idle,
    Streaming,
}

struct State {
    phase: Phase,
    since: Instant,
    /// A request on it carried a key: idle, it keeps `admin_idle_timeout`,
    /// and it is never closed to make room.
    authenticated: bool,
    /// Closed to make room for a newer connection: its slot is no longer
    /// its own.
    evicted: bool,
}

/// One connection's phase, told by its socket (a request's first byte),
/// its service (a request starts, its reply is made) and its streaming
/// reply (it ends), and read by its watchdog.
struct Watch {
    /// Locked only for a read or a write of the two fields, never across an
    /// `.await`; the admin runtime has one thread, so it is never contended.
    state: Mutex<State>,
    /// Wakes the watchdog to take a new phase's deadline.
    changed: Notify,
}

impl Watch {
    fn new() -> Watch {
        Watch {
            state: Mutex::new(State {
                phase: Phase::Head,
                since: Instant::now(),
                authenticated: false,
                evicted: false,
            }),
            changed: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn enter(&self, phase: Phase) {
        let mut state = self.state();
        state.phase = phase;
        state.since = Instant::now();
        drop(state);
        self.changed.notify_one();
    }

    /// Whether closing it now cuts no request short: it is waiting for
    /// one, or for the rest of one's head.
    fn evictable(&self) -> bool {
        matches!(self.state().phase, Phase::Head | Phase::Idle)
    }

    /// Tells its watchdog to close it.
    fn evict(&self) {
        self.state().evicted = true;
        self.changed.notify_one();
    }

    /// Bytes came in: if the connection was idle, a request has begun.
    fn bytes_arrived(&self) {
        if self.state().phase == Phase::Idle {
            self.enter(Phase::Head);
        }
    }

    /// The phase and when it overstays, if it has a deadline. A connection
    /// that has shown no key has nothing to keep alive for: idle, it gets
    /// the head's short deadline.
    fn deadline(&self, timeouts: Timeouts) -> Option<(Phase, Instant)> {
        let state = self.state();
        let limit = match state.phase {
            Phase::Head => timeouts.header,
            Phase::Idle if !state.authenticated => timeouts.header,
            Phase::Idle => timeouts.idle,
            Phase::Busy | Phase::Streaming => return None,
        };
        Some((state.phase, state.since + limit))
    }

    /// The reply is made: a whole one leaves the connection idle; a stream
    /// keeps it streaming until the stream's body is dropped.
    fn replied<S>(self: &Arc<Self>, reply: Response<Either<Full<Bytes>, S>>) -> Served<S> {
        reply.map(|body| match body {
            Either::Left(whole) => {
                self.enter(Phase::Idle);
                Either::Left(whole)
            }
            Either::Right(stream) => {
                self.enter(Phase::Streaming);
                Either::Right(Streamed {
                    body: stream,
                    watch: Arc::clone(self),
                })
            }
        })
    }
}

/// A reply as hyper sends it.
type Served<S> = Response<Either<Full<Bytes>, Streamed<S>>>;

/// A streaming reply's body, which leaves its connection idle when it is
/// dropped (ended, or its client gone).
pub(super) struct Streamed<S> {
    body: S,
    watch: Arc<Watch>,
}

impl<S> Drop for Streamed<S> {
    fn drop(&mut self) {
        self.watch.enter(Phase::Idle);
    }
}

impl<S: Body + Unpin> Body for Streamed<S> {
    type Data = S::Data;
    type Error = S::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<S::Data>, S::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The socket, telling its watch when bytes arrive.
struct Watched {
    stream: TcpStream,
    watch: Arc<Watch>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.watch.bytes_arrived();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// How an admin connection ended on its own.
#[derive(Debug, thiserror::Error)]
enum Ended {
    #[error("TLS handshake: {0}")]
    Tls(io::Error),
    #[error(transparent)]
    Http(#[from] hyper::Error),
}

/// Serves one admitted connection with `handler`, over TLS when `tls` is
/// given, until it ends or overstays a phase; `slot` is given back when it
/// is gone. When `shutdown` fires, hyper finishes the request in flight,
/// if any, and closes the connection.
pub(super) async fn serve<H, F, S>(
    stream: TcpStream,
    tls: Option<TlsAcceptor>,
    slot: Slot,
    timeouts: Timeouts,
    metrics: Arc<Metrics>,
    handler: H,
    shutdown: Watcher,
) where
    H: Fn(Request<Incoming>) -> F + Send + 'static,
    F: Future<Output = Response<Either<Full<Bytes>, S>>> + Send + 'static,
    S: Body<Data = Bytes, Error = Infallible> + Unpin + Send + 'static,
{
    let slot = Arc::new(slot);
    let watch = Arc::clone(&slot.watch);
    let watched = Watched {
        stream,
        watch: Arc::clone(&watch),
    };
    let service = {
        let watch = Arc::clone(&watch);
        let slot = Arc::clone(&slot);
        service_fn(move |req: Request<Incoming>| {
            // Called as soon as hyper has the head.
            slot.request(req.method(), req.headers());
            watch.enter(Phase::Busy);
            let reply = handler(req);
            let watch = Arc::clone(&watch);
            async move { Ok::<_, Infallible>(watch.replied(reply.await)) }
        })
    };
    let http = hyper::server::conn::http1::Builder::new();
    let mut connection = Box::pin(async move {
        match tls {
            None => {
                let connection = http.serve_connection(TokioIo::new(watched), service);
                Ok(shutdown.watch(connection).await?)
            }
            Some(acceptor) => {
                let stream = acceptor.accept(watched).await.map_err(Ended::Tls)?;
                let connection = http.serve_connection(TokioIo::new(stream), service);
                Ok(shutdown.watch(connection).await?)
            }
        }
    });
    loop {
        // Taken before the deadline is read, so a change in between is not missed.
        let changed = watch.changed.notified();
        let deadline = watch.deadline(timeouts);
        let overstayed = async {
            match deadline {
                Some((_, at)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            ended = connection.as_mut() => {
                match ended {
                    Ok(()) => {}
                    Err(e @ Ended::Tls(_)) => {
                        metrics.error(ErrorKind::Tls(TlsFailure::HandshakeFailed));
                        debug!(error = %e, "admin TLS handshake failed");
                    }
                    Err(e) => debug!(error = %e, "admin connection ended with an error"),
                }
                break;
            }
            () = changed => {
                if watch.state().evicted {
                    break;
                }
            }
            () = overstayed => {
                // Still in that phase? The deadline is read afresh: a phase
                // entered since has its own.
                match watch.deadline(timeouts) {
                    Some((Phase::Head, at)) if at <= Instant::now() => {
                        metrics.error(ErrorKind::AdminHeaderTimeout);
                        break;
                    }
                    Some((Phase::Idle, at)) if at <= Instant::now() => {
                        metrics.admin_idle_closed();
                        break;
                    }
                    _ => {}
                }
            }
        }
    }
    // Dropping the connection closes the socket; then the slot is free.
    drop(connection);
    drop(slot);
}
