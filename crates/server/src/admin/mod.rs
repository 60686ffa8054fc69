//! The admin/API listener: the HTTP publish and history API for backends,
//! the follow graph's API ([`graph`]), presence reads ([`presence`]), with
//! every body and query read by
//! [`body`],
//! `/stats`, `/metrics`, `/healthz`, and the routes to the live status page
//! (`/status`, `/status/events`, served by [`status`]). Which key opens
//! which endpoint is [`access`]'s; how many connections it holds and how long
//! each may take is [`conn`]'s.
//!
//! It runs on its own thread with a single-threaded tokio runtime and hyper,
//! apart from the workers: admin traffic is low-volume and must never sit in
//! the client event loops. Publishing goes through the same [`Engine`] the
//! workers use, so an API publish and a WebSocket publish are ordered alike.
//!
//! [`Engine`]: crate::engine::Engine
//! [`status`]: crate::status

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Body;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONNECTION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::server::graceful::GracefulShutdown;
use myriad_protocol::close::CloseReason;
use myriad_protocol::message::encode_history;
use serde_json::json;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tracing::warn;

mod access;
pub mod body;
mod conn;
mod graph;
mod presence;

use crate::engine::{Published, Reply};
use crate::feeds::{Direction, Relation};
use crate::hub::Wakeups;
use crate::metrics::ErrorKind;
use crate::process;
use crate::shared::Shared;
use crate::status;
use crate::transport::TransportKind;
use body::{BodyError, Publish, PublishItem};

/// How long a publish request waits for congested workers before giving up with 503.
const CONGESTION_WAIT: Duration = Duration::from_secs(5);

type HttpReply = Response<Full<Bytes>>;

/// Every admin reply's body: whole, or the status page's event stream.
type AdminBody = Either<Full<Bytes>, status::EventStream>;

/// What a request is told if the engine dropped it unanswered, which its
/// contract forbids: a bug, reported rather than hung on.
const NO_ANSWER: &str = "the engine did not answer";

/// Serves the admin API until `shutdown` turns true, then drains it: the
/// listener closes, idle connections close at once, and every request in
/// flight gets its answer, within `shutdown_timeout` (a request the engine
/// has taken may already have taken effect: cutting it unanswered would
/// leave its client to guess, and perhaps publish twice).
pub async fn serve(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let started = Instant::now();
    let status_streams = Arc::new(status::Streams::new(shared.config.max_status_streams));
    let admission = conn::Admission::new(&shared.config, &shared.metrics);
    let timeouts = conn::Timeouts::new(&shared.config);
    let connections = GracefulShutdown::new();
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    shared.metrics.error(ErrorKind::Accept);
                    warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        let Some(slot) = admission.admit(&stream, &shared.metrics) else {
            continue;
        };
        let handler = {
            let shared = Arc::clone(&shared);
            let status_streams = Arc::clone(&status_streams);
            move |req| {
                let shared = Arc::clone(&shared);
                let status_streams = Arc::clone(&status_streams);
                async move { route(req, &shared, started, &status_streams).await }
            }
        };
        let metrics = Arc::clone(&shared.metrics);
        // The configuration in force now: a SIGHUP reload reaches the next
        // connection.
        let tls = shared
            .tls
            .as_ref()
            .filter(|_| shared.config.admin_tls)
            .map(|certs| TlsAcceptor::from(certs.current()));
        let watcher = connections.watcher();
        tokio::spawn(conn::serve(
            stream, tls, slot, timeouts, metrics, handler, watcher,
        ));
    }
    drop(listener);
    let limit = Duration::from_secs(shared.config.shutdown_timeout.into());
    if tokio::time::timeout(limit, connections.shutdown())
        .await
        .is_err()
    {
        warn!(
            open = admission.open(),
            shutdown_timeout = shared.config.shutdown_timeout,
            "admin connections still busy at the shutdown timeout are cut"
        );
    }
    Ok(())
}

/// Checks the caller's key, then answers.
async fn route(
    req: Request<Incoming>,
    shared: &Arc<Shared>,
    started: Instant,
    status_streams: &status::Streams,
) -> Response<AdminBody> {
    let Some(needs) = access::of(req.uri().path()) else {
        return text_reply(StatusCode::NOT_FOUND, "not found\n").map(Either::Left);
    };
    if let Err(refusal) = access::check(&shared.config, needs, req.method(), req.headers()) {
        return refused(shared, refusal).map(Either::Left);
    }
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/status/events") => match status::events(shared, started, status_streams) {
            Ok(events) => events.map(Either::Right),
            Err(e) => {
                shared.metrics.error(ErrorKind::TooManyStatusStreams);
                error_reply(StatusCode::SERVICE_UNAVAILABLE, e.code(), &e.to_string())
                    .map(Either::Left)
            }
        },
        _ => whole_reply(req, shared, started).await.map(Either::Left),
    }
}

/// The answer to a request the access check refused, counted.
fn refused(shared: &Shared, refusal: access::Refusal) -> HttpReply {
    let (status, kind) = match refusal {
        access::Refusal::Unauthorized => (StatusCode::UNAUTHORIZED, ErrorKind::ApiUnauthorized),
        access::Refusal::Forbidden => (StatusCode::FORBIDDEN, ErrorKind::ApiForbidden),
    };
    shared.metrics.error(kind);
    let mut reply = error_reply(status, refusal.code(), &refusal.to_string());
    if refusal == access::Refusal::Unauthorized {
        // A browser asks for the key (as a password) on the status page,
        // then sends it with the page's event stream too.
        reply.headers_mut().insert(
            WWW_AUTHENTICATE,
            HeaderValue::from_static(r#"Basic realm="myriad admin", charset="UTF-8""#),
        );
    }
    reply
}

/// The reply to any request but a status stream.
async fn whole_reply(req: Request<Incoming>, shared: &Shared, started: Instant) -> HttpReply {
    match (req.method(), req.uri().path()) {
        (&Method::POST, "/api/publish") => publish(req, shared).await,
        (&Method::POST, "/api/publish_as") => graph::publish_as(req, shared).await,
        (&Method::POST, "/api/follow") => graph::change(req, shared, Direction::Follow).await,
        (&Method::POST, "/api/unfollow") => graph::change(req, shared, Direction::Unfollow).await,
        (&Method::POST, "/api/users") => graph::add_users(req, shared).await,
        (&Method::GET, "/api/followers") => graph::read(req, shared, Relation::Followers).await,
        (&Method::GET, "/api/following") => graph::read(req, shared, Relation::Following).await,
        (&Method::GET, "/api/history") => history(req, shared).await,
        (&Method::GET, "/api/presence") => presence::read(req, shared).await,
        (&Method::GET, "/api/presence_stats") => presence::stats(req, shared).await,
        (&Method::GET, "/stats") => json_reply(StatusCode::OK, &stats(shared, started)),
        (&Method::GET, "/status") => status::page(),
        (&Method::GET, "/metrics") => {
            shared.metrics.mirror_engine(&shared.engine.stats());
            shared.metrics.mirror_deflate(&crate::deflate::COUNTS);
            shared.metrics.mirror_feeds(&shared.feeds.stats());
            if let Some(hooks) = &shared.hooks {
                let stage = shared.lifecycle.as_ref().map(|s| s.counts());
                shared.metrics.mirror_hooks(&hooks.snapshot(), stage);
            }
            if let Some(proxy) = &shared.proxy {
                shared.metrics.mirror_proxy(proxy.in_flight());
            }
            let mut reply = Response::new(Full::new(Bytes::from(shared.metrics.render())));
            reply.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            reply
        }
        (&Method::GET, "/healthz") => {
            if shared.shutting_down.load(Ordering::Relaxed) {
                text_reply(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
            } else {
                text_reply(StatusCode::OK, "ok\n")
            }
        }
        // `route` let only endpoints through.
        _ => text_reply(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n"),
    }
}

/// A request's whole body, within `max_http_body` and `admin_body_timeout`.
/// A body declared too large is refused before any of it is read.
async fn read_body(req: Request<Incoming>, shared: &Shared) -> Result<Bytes, HttpReply> {
    let limit = shared.config.max_http_body;
    let too_large = || {
        shared.metrics.error(ErrorKind::ApiBodyTooLarge);
        closing(error_reply(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            &format!("body over {limit} bytes"),
        ))
    };
    // Content-Length is the lower bound of hyper's size hint.
    if req.body().size_hint().lower() > limit as u64 {
        return Err(too_large());
    }
    let deadline = Duration::from_secs(shared.config.admin_body_timeout.into());
    let collect = Limited::new(req.into_body(), limit).collect();
    match tokio::time::timeout(deadline, collect).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Ok(Err(e)) => {
            shared.metrics.error(ErrorKind::ApiBadRequest);
            Err(error_reply(
                StatusCode::BAD_REQUEST,
                "bad_body",
                &e.to_string(),
            ))
        }
        Err(_) => {
            shared.metrics.error(ErrorKind::AdminBodyTimeout);
            Err(closing(error_reply(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                &format!(
                    "the body did not arrive within {} s",
                    shared.config.admin_body_timeout
                ),
            )))
        }
    }
}

/// `reply`, closing its connection: what is left of the request's body
/// is not read.
fn closing(mut reply: HttpReply) -> HttpReply {
    reply
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    reply
}

/// The refusal of a body or query that [`body`] could not read.
fn refuse_body(shared: &Shared, error: &BodyError) -> HttpReply {
    if let BodyError::InvalidUser(message) = error {
        return graph::invalid_user(shared, message);
    }
    shared.metrics.error(ErrorKind::ApiBadRequest);
    error_reply(StatusCode::BAD_REQUEST, error.code(), &error.to_string())
}

async fn publish(req: Request<Incoming>, shared: &Shared) -> HttpReply {
    let payload = match read_body(req, shared).await {
        Ok(payload) => payload,
        Err(reply) => return reply,
    };
    let max_subject_len = shared.config.max_subject_len;
    let Publish { items, batch } = match body::parse_publish(&payload, max_subject_len) {
        Ok(publish) => publish,
        Err(e) => return refuse_body(shared, &e),
    };
    let mut wakeups = Wakeups::default();
    let outcome = publish_items(&items, shared, &mut wakeups).await;
    shared.hub.wake(wakeups);
    let results = match outcome {
        Ok(results) => results,
        Err(reply) => return reply,
    };
    let result_json = |p: &Published| published_json(p, "delivered");
    let body = if batch {
        let delivered: u64 = results.iter().map(|p| u64::from(p.subscribers)).sum();
        json!({
            "delivered": delivered,
            "results": results.iter().map(result_json).collect::<Vec<_>>(),
        })
    } else {
        result_json(&results[0])
    };
    json_reply(StatusCode::OK, &body)
}

/// `GET /api/history?subject=S[&limit=N][&epoch=E&offset=O]`: the same
/// document as the `history` command's reply.
async fn history(req: Request<Incoming>, shared: &Shared) -> HttpReply {
    let query = req.uri().query().unwrap_or("");
    let query = match body::parse_history_query(query, shared.config.max_subject_len) {
        Ok(query) => query,
        Err(e) => return refuse_body(shared, &e),
    };
    let (tx, answer) = tokio::sync::oneshot::channel();
    let mut wakeups = Wakeups::default();
    shared.engine.history(query, Reply::Task(tx), &mut wakeups);
    shared.hub.wake(wakeups);
    match answer.await {
        Ok(Ok(page)) => {
            let page_of = page.page(shared.config.max_http_body);
            let body = encode_history(
                None,
                &page.subject,
                page.position,
                page.recovered,
                page_of.iter().map(|p| p.envelope()),
            );
            json_bytes_reply(StatusCode::OK, Bytes::from(body))
        }
        Ok(Err(e)) => error_reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            &e.to_string(),
        ),
        Err(_) => error_reply(StatusCode::SERVICE_UNAVAILABLE, "unavailable", NO_ANSWER),
    }
}

/// Publishes `items` in order, waiting (bounded) while workers are congested;
/// the workers to wake are collected in `wakeups`.
async fn publish_items(
    items: &[PublishItem<'_>],
    shared: &Shared,
    wakeups: &mut Wakeups,
) -> Result<Vec<Published>, HttpReply> {
    let deadline = Instant::now() + CONGESTION_WAIT;
    let mut results: Vec<Published> = Vec::with_capacity(items.len());
    for item in items {
        while shared.engine.congested() {
            // What this request already queued must be on its way before
            // waiting for the queues to drain.
            shared.hub.wake(std::mem::take(wakeups));
            if Instant::now() >= deadline {
                shared.metrics.error(ErrorKind::ApiCongested);
                let tally = Tally::of(items.len(), results.len(), false);
                return Err(tally.reply(
                    "congested",
                    "the node did not catch up (its workers' mailboxes, or its queues towards \
                     Redis)",
                ));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let (tx, mut answer) = tokio::sync::oneshot::channel();
        shared
            .engine
            .publish(&item.subject, item.data.get(), Reply::Task(tx), wakeups);
        let answer = match answer.try_recv() {
            Ok(answer) => Some(answer),
            // Not answered yet (a round trip away): what this request queued
            // must be on its way before waiting.
            Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {
                shared.hub.wake(std::mem::take(wakeups));
                answer.await.ok()
            }
            Err(tokio::sync::oneshot::error::TryRecvError::Closed) => None,
        };
        let (failure, unknown) = match answer {
            Some(Ok(published)) => {
                results.push(published);
                continue;
            }
            Some(Err(e)) => (e.to_string(), e.outcome_unknown()),
            // Dropped unanswered: nothing says what became of it.
            None => (NO_ANSWER.to_owned(), true),
        };
        let tally = Tally::of(items.len(), results.len(), unknown);
        return Err(tally.reply("publish_failed", &failure));
    }
    Ok(results)
}

/// What became of a request's items when one of them failed: those before
/// it were published, the failed one's outcome may be unknown (it reached
/// Redis, which did not answer), and those after it were not tried. A
/// backend retrying must know which is which: a retried publish whose
/// outcome was unknown may arrive twice.
struct Tally {
    published: usize,
    unknown: usize,
    not_published: usize,
}

impl Tally {
    /// `items` in all, `published` of them first; the next failed,
    /// `failed_unknown` if its outcome is not known.
    fn of(items: usize, published: usize, failed_unknown: bool) -> Tally {
        let unknown = usize::from(failed_unknown);
        Tally {
            published,
            unknown,
            not_published: items - published - unknown,
        }
    }

    /// The 503: `code`, `failure` and the tally, in the message for people
    /// and as numbers beside it for programs.
    fn reply(&self, code: &str, failure: &str) -> HttpReply {
        let Tally {
            published,
            unknown,
            not_published,
        } = *self;
        let total = published + unknown + not_published;
        let mut message = format!("{failure}; of {total}: {published} published");
        if unknown > 0 {
            message.push_str(&format!(
                ", {unknown} of unknown outcome (it may be published)"
            ));
        }
        message.push_str(&format!(", {not_published} not published"));
        json_reply(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"error": {
                "code": code,
                "message": message,
                "published": published,
                "unknown": unknown,
                "not_published": not_published,
            }}),
        )
    }
}

/// A publish's answer: its position (null when it got none) and, under
/// `count`, the connections on this node it was handed to.
fn published_json(p: &Published, count: &str) -> serde_json::Value {
    let (epoch, offset) = match p.position {
        Some(at) => (json!(at.epoch.to_string()), json!(at.offset)),
        None => (json!(null), json!(null)),
    };
    json!({"epoch": epoch, "offset": offset, count: p.subscribers})
}

fn stats(shared: &Shared, started: Instant) -> serde_json::Value {
    let engine = shared.engine.stats();
    shared.metrics.mirror_engine(&engine);
    let history = engine.history;
    let graph = shared.feeds.stats();
    let s = shared.metrics.snapshot();
    let usage = process::usage();
    json!({
        "uptime_seconds": started.elapsed().as_secs_f64(),
        "workers": shared.config.worker_count(),
        "connections": s.connections,
        "max_connections": shared.max_connections,
        "connections_accepted": s.accepted,
        "subscriptions": s.subscriptions,
        "subjects": engine.subjects,
        "messages_in": s.messages_in,
        "messages_out": s.messages_out,
        "bytes_in": s.bytes_in,
        "bytes_out": s.bytes_out,
        "socket_writes": s.socket_writes,
        "tls_handshakes": s.tls_handshakes,
        "partial_input_bytes": s.partial_input_bytes,
        "tls_reloads": s.tls_reloads,
        "token_key_reloads": s.token_key_reloads,
        "publishes": s.publishes,
        "publishes_unrouted": s.publishes_unrouted,
        "round_trips": engine.round_trips,
        "failovers": engine.failovers,
        "redis_unavailable_ms": engine.unavailable_ms,
        "history": {
            "subjects": history.subjects,
            "positions": history.positions,
            "messages": history.messages,
            "bytes": history.bytes,
            "max_bytes": shared.config.history_max_bytes,
            "evictions": history.evictions,
            "evicted_positions": history.evicted_positions,
        },
        "presence": {
            "members": engine.presence.members,
            "joined": engine.presence.joined,
            "left": engine.presence.left,
            "refused": engine.presence.refused,
            "expired": engine.presence.expired,
        },
        "memory": shared.memory(&usage, &engine, &s),
        "slow_consumer_disconnects": s.closed(CloseReason::SlowConsumer),
        "admin": {
            "connections": s.admin_connections,
            "max_connections": shared.config.admin_max_connections,
            "idle_closes": s.admin_idle_closes,
            "unauthenticated_closes": s.admin_unauthenticated_closes,
        },
        "graph": {
            "users": graph.users_known,
            "users_present": graph.users_present,
        },
        "transports": TransportKind::ALL
            .iter()
            .map(|kind| {
                let t = s.transports[kind.index()];
                (kind.name(), json!({"connections": t.connections, "messages_out": t.messages_out}))
            })
            .collect::<BTreeMap<_, _>>(),
        "closes": s.closes.iter().copied().collect::<BTreeMap<_, _>>(),
        "errors": s.errors.iter().copied().collect::<BTreeMap<_, _>>(),
        "process": {"rss_bytes": usage.rss_bytes, "cpu_seconds": usage.cpu_seconds},
        "rss_per_connection": usage.rss_per_connection(s.connections),
    })
}

fn json_reply(status: StatusCode, body: &serde_json::Value) -> HttpReply {
    json_bytes_reply(status, Bytes::from(body.to_string()))
}

/// A reply whose body is JSON already encoded.
fn json_bytes_reply(status: StatusCode, body: Bytes) -> HttpReply {
    let mut reply = Response::new(Full::new(body));
    *reply.status_mut() = status;
    reply
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    reply
}

fn text_reply(status: StatusCode, body: &'static str) -> HttpReply {
    let mut reply = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *reply.status_mut() = status;
    reply.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    reply
}

fn error_reply(status: StatusCode, code: &str, message: &str) -> HttpReply {
    json_reply(
        status,
        &json!({"error": {"code": code, "message": message}}),
    )
}
