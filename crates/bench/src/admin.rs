//! The server's own figures: a background poller of myriad's `GET /stats`.
//!
//! A tiny blocking HTTP/1.1 client on its own thread, once a second, so a
//! slow admin endpoint never stalls the coordinator. The report reads the
//! first and latest answers and the timeline reads each one.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::addr::Target;

/// Bound on one /stats request.
const TIMEOUT: Duration = Duration::from_secs(2);

/// GETs `path` from `target` and parses the body as JSON.
pub fn get_json(target: &Target, path: &str) -> Option<Value> {
    let mut s = TcpStream::connect_timeout(&target.addr, TIMEOUT).ok()?;
    s.set_read_timeout(Some(TIMEOUT)).ok()?;
    s.set_write_timeout(Some(TIMEOUT)).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        target.host
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let at = memchr::memmem::find(&raw, b"\r\n\r\n")? + 4;
    if !raw.starts_with(b"HTTP/1.1 200") && !raw.starts_with(b"HTTP/1.0 200") {
        return None;
    }
    serde_json::from_slice(&raw[at..]).ok()
}

/// Polls /stats every second until dropped.
pub struct StatsPoller {
    latest: Arc<Mutex<Option<Value>>>,
    stop: Arc<AtomicBool>,
    /// The first answer, taken before the load starts.
    pub first: Option<Value>,
}

impl StatsPoller {
    /// Starts polling `target`.
    pub fn start(target: Target) -> StatsPoller {
        let first = get_json(&target, "/stats");
        let latest = Arc::new(Mutex::new(first.clone()));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s) = (Arc::clone(&latest), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_secs(1));
                if let Some(v) = get_json(&target, "/stats") {
                    // A poisoned lock only means a reader panicked; the
                    // value is still a whole JSON document.
                    *l.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
                }
            }
        });
        StatsPoller {
            latest,
            stop,
            first,
        }
    }

    /// The latest answer.
    pub fn latest(&self) -> Option<Value> {
        self.latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for StatsPoller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The figures of one /stats answer the bench charts and reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct ServerFigures {
    /// Open connections.
    pub connections: u64,
    /// Messages written to clients.
    pub messages_out: u64,
    /// Resident memory, bytes.
    pub rss_bytes: u64,
    /// CPU time used, seconds.
    pub cpu_seconds: f64,
    /// The server's own RSS-per-connection figure, when it gives one.
    pub rss_per_connection: Option<f64>,
}

impl ServerFigures {
    /// Picks the figures out of a /stats document (missing ones are 0).
    pub fn of(v: &Value) -> ServerFigures {
        let u = |v: &Value| v.as_u64().unwrap_or(0);
        ServerFigures {
            connections: u(&v["connections"]),
            messages_out: u(&v["messages_out"]),
            rss_bytes: u(&v["process"]["rss_bytes"]),
            cpu_seconds: v["process"]["cpu_seconds"].as_f64().unwrap_or(0.0),
            rss_per_connection: v["rss_per_connection"].as_f64(),
        }
    }
}
