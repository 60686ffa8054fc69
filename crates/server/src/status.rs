//! The live status page of the admin listener: `GET /status`, one HTML page
//! with its style and script inline (`status.html`, built into the binary, so
//! it needs no other file and nothing from the network), and
//! `GET /status/events`, the Server-Sent Events stream that feeds it a
//! snapshot of the node once a second.
//!
//! A snapshot is read from the same sources as `/stats` (the metrics, the
//! engine's stats, the process's usage); rates are computed here, each
//! stream from its own previous sample, so the page gets per-second figures
//! without keeping counters of its own. This module owns the page, the
//! stream and the cap on streams (`max_status_streams`); it must not change
//! anything it reads. Routing, and turning a refusal into an HTTP error,
//! belong to `admin.rs`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame};
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use hyper::Response;
use myriad_protocol::close::CloseReason;
use serde::Serialize;
use thiserror::Error;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::MissedTickBehavior;

use crate::process;
use crate::shared::Shared;
use crate::transport::TransportKind;

/// The page, CSS and script included.
const PAGE: &str = include_str!("status.html");

/// What the page may load: only its own inline style and script, and its
/// event stream from this node. A page that must work offline has no other
/// source, and this makes a stray external reference fail loudly in the
/// browser instead of going unnoticed.
const PAGE_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; \
     script-src 'unsafe-inline'; connect-src 'self'";

/// How often a stream sends a snapshot.
const PERIOD: Duration = Duration::from_secs(1);

/// What a stream sends as the node starts shutting down, before it ends:
/// the page stops its `EventSource` on it instead of reconnecting.
const SHUTDOWN_EVENT: &[u8] = b"event: shutdown\ndata: {}\n\n";

/// Why a status stream was not opened.
#[derive(Debug, Error)]
pub enum StatusError {
    #[error("{0} status streams are open, all that max_status_streams allows")]
    TooManyStreams(usize),
}

impl StatusError {
    /// The code in the HTTP API's error body.
    pub fn code(&self) -> &'static str {
        match self {
            StatusError::TooManyStreams(_) => "too_many_status_streams",
        }
    }
}

/// The cap on concurrent `/status/events` streams: one permit per stream,
/// held by its feeding task, so a stream counts until its task has ended.
pub struct Streams {
    permits: Arc<Semaphore>,
    max: usize,
}

impl Streams {
    pub fn new(max: usize) -> Streams {
        Streams {
            permits: Arc::new(Semaphore::new(max)),
            max,
        }
    }
}

/// `GET /status`: the page.
pub fn page() -> Response<Full<Bytes>> {
    let mut reply = Response::new(Full::new(Bytes::from_static(PAGE.as_bytes())));
    let headers = reply.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(PAGE_POLICY),
    );
    reply
}

/// `GET /status/events`: a stream of snapshots, one at once and then one a
/// second, until the client leaves or the node starts shutting down.
/// Must be called within the admin listener's runtime: the stream is fed by
/// a task of its own.
pub fn events(
    shared: &Arc<Shared>,
    started: Instant,
    streams: &Streams,
) -> Result<Response<EventStream>, StatusError> {
    let permit = Arc::clone(&streams.permits)
        .try_acquire_owned()
        .map_err(|_| StatusError::TooManyStreams(streams.max))?;
    // One frame of slack: a client that stops reading misses snapshots
    // instead of having them pile up.
    let (frames, body) = mpsc::channel(1);
    tokio::spawn(feed(Arc::clone(shared), started, frames, permit));
    let mut reply = Response::new(EventStream(body));
    let headers = reply.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(reply)
}

/// The body of a `/status/events` reply: the frames its task sends. It ends
/// when the task ends; hyper dropping it (the client left) ends the task.
pub struct EventStream(mpsc::Receiver<Bytes>);

impl Body for EventStream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|frame| frame.map(|bytes| Ok(Frame::data(bytes))))
    }
}

/// Sends a snapshot every [`PERIOD`] until the client leaves or the node
/// starts shutting down; holds `_permit` for as long.
async fn feed(
    shared: Arc<Shared>,
    started: Instant,
    frames: mpsc::Sender<Bytes>,
    _permit: OwnedSemaphorePermit,
) {
    let mut ticks = tokio::time::interval(PERIOD);
    // A busy admin thread stretches one interval instead of bunching ticks
    // whose rates would cover next to no time.
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut previous: Option<Sample> = None;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            // The client left: hyper dropped the body.
            () = frames.closed() => return,
        }
        // The flag `/healthz` reads, set as the workers start draining:
        // the admin listener drains only once they are done, and waits for
        // this stream to end.
        if shared.shutting_down.load(Ordering::Acquire) {
            // A client that is behind misses the event and sees the end only.
            let _ = frames.try_send(Bytes::from_static(SHUTDOWN_EVENT));
            return;
        }
        let sample = Sample::take(&shared);
        let status = Status::new(started, &sample, previous.as_ref());
        match frames.try_send(frame(&status)) {
            Ok(()) => previous = Some(sample),
            // The client has not taken the last one yet: this one is
            // dropped, and the next, measured from the last one sent,
            // covers this interval too.
            Err(TrySendError::Full(_)) => {}
            Err(TrySendError::Closed(_)) => return,
        }
    }
}

/// One SSE event carrying `status` as JSON on one `data:` line (compact
/// JSON has no line breaks).
fn frame(status: &Status) -> Bytes {
    let mut frame = b"data: ".to_vec();
    serde_json::to_writer(&mut frame, status).expect("a status serializes");
    frame.extend_from_slice(b"\n\n");
    Bytes::from(frame)
}

/// The counters rates are made from, and when they were read.
struct Sample {
    at: Instant,
    metrics: crate::metrics::Snapshot,
    engine: crate::engine::EngineStats,
    usage: process::Usage,
    memory: process::Memory,
}

impl Sample {
    fn take(shared: &Shared) -> Sample {
        let metrics = shared.metrics.snapshot();
        let engine = shared.engine.stats();
        let usage = process::usage();
        Sample {
            at: Instant::now(),
            memory: shared.memory(&usage, &engine, &metrics),
            metrics,
            engine,
            usage,
        }
    }

    /// Rates over the time since `earlier`; `None` if no time has passed.
    fn rates_since(&self, earlier: &Sample) -> Option<Rates> {
        let seconds = self.at.checked_duration_since(earlier.at)?.as_secs_f64();
        if seconds <= 0.0 {
            return None;
        }
        let per_second = |now: u64, then: u64| now.saturating_sub(then) as f64 / seconds;
        let (now, then) = (&self.metrics, &earlier.metrics);
        let cpu = (self.usage.cpu_seconds - earlier.usage.cpu_seconds).max(0.0);
        Some(Rates {
            messages_in_per_second: per_second(now.messages_in, then.messages_in),
            publishes_per_second: per_second(self.engine.publishes, earlier.engine.publishes),
            deliveries_per_second: per_second(now.messages_out, then.messages_out),
            cpu_percent: 100.0 * cpu / seconds,
        })
    }
}

/// Per-second figures over one interval.
#[derive(Debug, PartialEq, Serialize)]
struct Rates {
    /// WebSocket data messages received from clients.
    messages_in_per_second: f64,
    /// Publishes from every source, the HTTP API included.
    publishes_per_second: f64,
    /// Data messages queued to clients (`messages_out`): deliveries, and
    /// the replies among them.
    deliveries_per_second: f64,
    /// CPU time of the whole process, in percent of one core.
    cpu_percent: f64,
}

/// One event's JSON: what the page shows.
#[derive(Serialize)]
struct Status {
    uptime_seconds: f64,
    connections: u64,
    /// Open connections by transport name (`websocket`, `sse`, …).
    transports: BTreeMap<&'static str, u64>,
    subscriptions: u64,
    subjects: u64,
    /// Absent from a stream's first snapshot, which has nothing to compare with.
    #[serde(flatten)]
    rates: Option<Rates>,
    /// Where resident memory goes, by structure.
    memory: process::Memory,
    slow_consumer_closes: u64,
}

impl Status {
    fn new(started: Instant, sample: &Sample, previous: Option<&Sample>) -> Status {
        let s = &sample.metrics;
        Status {
            uptime_seconds: started.elapsed().as_secs_f64(),
            connections: s.connections,
            transports: TransportKind::ALL
                .iter()
                .map(|kind| (kind.name(), s.transports[kind.index()].connections))
                .collect(),
            subscriptions: s.subscriptions,
            subjects: sample.engine.subjects,
            rates: previous.and_then(|earlier| sample.rates_since(earlier)),
            memory: sample.memory,
            slow_consumer_closes: s.closed(CloseReason::SlowConsumer),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: Instant, messages_out: u64, publishes: u64, cpu_seconds: f64) -> Sample {
        let mut metrics = crate::metrics::Snapshot {
            messages_in: 7,
            messages_out,
            connections: 4,
            ..Default::default()
        };
        metrics.transports[TransportKind::Sse.index()].connections = 3;
        Sample {
            at,
            metrics,
            engine: crate::engine::EngineStats {
                publishes,
                subjects: 2,
                ..Default::default()
            },
            usage: process::Usage {
                rss_bytes: 4_000,
                cpu_seconds,
            },
            // 1,000 of it at start, 600 in history: 600 per connection.
            memory: process::Memory::new(
                4_000,
                1_000,
                process::Held {
                    history_bytes: 600,
                    history_max_bytes: 10_000,
                    ..Default::default()
                },
                4,
            ),
        }
    }

    #[test]
    fn rates_are_per_second_over_the_interval() {
        let start = Instant::now();
        let earlier = sample(start, 100, 10, 1.0);
        let later = sample(start + Duration::from_secs(2), 300, 50, 1.5);
        assert_eq!(
            later.rates_since(&earlier),
            Some(Rates {
                messages_in_per_second: 0.0,
                publishes_per_second: 20.0,
                deliveries_per_second: 100.0,
                cpu_percent: 25.0,
            })
        );
        assert_eq!(earlier.rates_since(&later), None, "time ran backwards");
        assert_eq!(earlier.rates_since(&earlier), None, "no time passed");
    }

    #[test]
    fn an_event_is_one_data_line_and_the_first_has_no_rates() {
        let start = Instant::now();
        let earlier = sample(start, 0, 0, 0.0);
        let later = sample(start + Duration::from_secs(1), 5, 5, 0.0);
        let first = frame(&Status::new(start, &earlier, None));
        let text = std::str::from_utf8(&first).unwrap();
        let json = text
            .strip_prefix("data: ")
            .unwrap()
            .strip_suffix("\n\n")
            .unwrap();
        assert!(!json.contains('\n'), "{text:?}");
        let value: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(value["connections"], 4);
        assert_eq!(value["transports"]["sse"], 3);
        assert_eq!(value["transports"]["websocket"], 0);
        assert_eq!(value["memory"]["per_connection"], 600.0);
        assert_eq!(value["memory"]["history_bytes"], 600);
        assert!(value.get("deliveries_per_second").is_none(), "{value}");
        let next = frame(&Status::new(start, &later, Some(&earlier)));
        let value: serde_json::Value =
            serde_json::from_str(std::str::from_utf8(&next[6..]).unwrap().trim_end()).unwrap();
        assert_eq!(value["deliveries_per_second"], 5.0);
    }
}
