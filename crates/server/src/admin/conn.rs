//! The admin listener's connections: how many it holds and how long each
//! may take, so that a client that never finishes a request, or never
//! leaves, cannot keep a connection, or a descriptor, for ever.
//!
//! Owns the cap (`admin_max_connections`: a connection past it is answered
//! 503 and closed at once) and each connection's stage, with its deadline:
//!
//! - *head*, from accept, or from the first byte of a request that follows
//!   another, until hyper has the request's head: `admin_header_timeout`,
//!   then the connection is closed (`errors{kind="admin_header_timeout"}`);
//! - *busy*, while the request is served: no deadline here; the handler
//!   that reads a body keeps `admin_body_timeout` itself and answers 408;
//! - *idle*, from a whole reply until the next request's first byte:
//!   `admin_idle_timeout`, then closed (`myriad_admin_idle_closes_total`).
//!   A peer that does not read its reply is cut by the same deadline;
//! - *streaming*, while a `/status/events` reply lives: no deadline (the
//!   streams are capped by `max_status_streams`); idle once it ends.
//!
//! One watchdog per connection sleeps until its stage's deadline and drops
//! the connection, closing it, if it is still in that stage. With
//! `admin_tls` the TLS handshake runs first, inside the *head* stage's
//! deadline; a failed one is counted (`errors{kind="tls_handshake_failed"}`).
//!
//! At shutdown every connection is told to end gracefully (hyper's own
//! graceful shutdown): an idle one closes at once, a busy one once its
//! reply is written.
//!
//! It must not route or answer requests: that is `mod.rs`.

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
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tracing::debug;

use crate::config::Config;
use crate::metrics::{ErrorKind, Metrics};
use crate::tls::TlsFailure;

/// The cap on open admin connections.
pub(super) struct Admission {
    slots: Arc<Semaphore>,
    max: usize,
    open: Gauge,
}

/// One admitted connection's place under the cap, given back when dropped.
pub(super) struct Slot {
    _permit: OwnedSemaphorePermit,
    open: Gauge,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.dec();
    }
}

impl Admission {
    pub(super) fn new(config: &Config, metrics: &Metrics) -> Admission {
        Admission {
            slots: Arc::new(Semaphore::new(config.admin_max_connections)),
            max: config.admin_max_connections,
            open: metrics.admin_connections(),
        }
    }

    /// Connections open now.
    pub(super) fn open(&self) -> usize {
        self.max - self.slots.available_permits()
    }

    /// A place for `stream`, or `None` at the cap, once the peer has been
    /// told so (503) and the refusal counted; the caller then drops it.
    pub(super) fn admit(&self, stream: &TcpStream, metrics: &Metrics) -> Option<Slot> {
        match Arc::clone(&self.slots).try_acquire_owned() {
            Ok(permit) => {
                self.open.inc();
                Some(Slot {
                    _permit: permit,
                    open: self.open.clone(),
                })
            }
            Err(_) => {
                metrics.error(ErrorKind::AdminOverCapacity);
                refuse(stream, self.max);
                None
            }
        }
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

/// The deadlines of the stages that have one.
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Head,
    Busy,
    Idle,
    Streaming,
}

struct State {
    stage: Stage,
    since: Instant,
}

/// One connection's stage, told by its socket (a request's first byte),
/// its service (a request starts, its reply is made) and its streaming
/// reply (it ends), and read by its watchdog.
struct Watch {
    /// Locked only for a read or a write of the two fields, never across an
    /// `.await`; the admin runtime has one thread, so it is never contended.
    state: Mutex<State>,
    /// Wakes the watchdog to take a new stage's deadline.
    changed: Notify,
}

impl Watch {
    fn new() -> Watch {
        Watch {
            state: Mutex::new(State {
                stage: Stage::Head,
                since: Instant::now(),
            }),
            changed: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn enter(&self, stage: Stage) {
        *self.state() = State {
            stage,
            since: Instant::now(),
        };
        self.changed.notify_one();
    }

    /// Bytes came in: if the connection was idle, a request has begun.
    fn bytes_arrived(&self) {
        if self.state().stage == Stage::Idle {
            self.enter(Stage::Head);
        }
    }

    /// The stage and when it overstays, if it has a deadline.
    fn deadline(&self, timeouts: Timeouts) -> Option<(Stage, Instant)> {
        let state = self.state();
        let limit = match state.stage {
            Stage::Head => timeouts.header,
            Stage::Idle => timeouts.idle,
            Stage::Busy | Stage::Streaming => return None,
        };
        Some((state.stage, state.since + limit))
    }

    /// The reply is made: a whole one leaves the connection idle; a stream
    /// keeps it streaming until the stream's body is dropped.
    fn replied<S>(self: &Arc<Self>, reply: Response<Either<Full<Bytes>, S>>) -> Served<S> {
        reply.map(|body| match body {
            Either::Left(whole) => {
                self.enter(Stage::Idle);
                Either::Left(whole)
            }
            Either::Right(stream) => {
                self.enter(Stage::Streaming);
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
        self.watch.enter(Stage::Idle);
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
/// given, until it ends or overstays a stage; `slot` is given back when it
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
    let watch = Arc::new(Watch::new());
    let watched = Watched {
        stream,
        watch: Arc::clone(&watch),
    };
    let service = {
        let watch = Arc::clone(&watch);
        service_fn(move |req| {
            // Called as soon as hyper has the head.
            watch.enter(Stage::Busy);
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
            () = changed => {}
            () = overstayed => {
                // Still in that stage? The deadline is read afresh: a stage
                // entered since has its own.
                match watch.deadline(timeouts) {
                    Some((Stage::Head, at)) if at <= Instant::now() => {
                        metrics.error(ErrorKind::AdminHeaderTimeout);
                        break;
                    }
                    Some((Stage::Idle, at)) if at <= Instant::now() => {
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
