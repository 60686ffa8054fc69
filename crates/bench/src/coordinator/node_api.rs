//! The coordinator's client of the node's admin API: a background poller
//! of myriad's `GET /stats`, and the `POST`s a workload makes itself (the
//! social workload's follows and unfollows).
//!
//! A tiny blocking HTTP/1.1 client; the poller runs on its own thread,
//! once a second, so a slow `/stats` answer never stalls the coordinator. A
//! run may load several nodes; their figures are summed, as one system
//! under test. The report reads the first and latest answers and the
//! timeline reads each one; what they say is read by
//! [`ServerFigures`](crate::util::stats::ServerFigures).
//!
//! Named for what it talks to, the node's HTTP API on its admin listener
//! (`--admin-url`); "admin" alone is the privilege the admin key grants.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::util::addr::Target;

/// Bound on one /stats request.
const TIMEOUT: Duration = Duration::from_secs(2);

/// Bound on one POST: a batch of follows is written to the node's store
/// before it is answered.
const POST_TIMEOUT: Duration = Duration::from_secs(30);

/// POSTs the JSON `body` to `path` on `target`, with `headers` (whole
/// lines, each ending in CRLF; may be empty). Returns the status and the
/// body as JSON (`Null` when it is not JSON).
pub fn post_json(
    target: &Target,
    path: &str,
    headers: &str,
    body: &str,
) -> std::io::Result<(u16, Value)> {
    let mut s = TcpStream::connect_timeout(&target.addr, POST_TIMEOUT)?;
    s.set_read_timeout(Some(POST_TIMEOUT))?;
    s.set_write_timeout(Some(POST_TIMEOUT))?;
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        target.host,
        body.len()
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP response");
    let status = raw
        .get(9..12)
        .and_then(|code| std::str::from_utf8(code).ok()?.parse().ok())
        .ok_or_else(bad)?;
    let at = memchr::memmem::find(&raw, b"\r\n\r\n").ok_or_else(bad)? + 4;
    Ok((
        status,
        serde_json::from_slice(&raw[at..]).unwrap_or(Value::Null),
    ))
}

/// GETs `path` from `target`, with `headers` (as for [`post_json`]), and
/// parses the body as JSON.
pub fn get_json(target: &Target, path: &str, headers: &str) -> Option<Value> {
    let mut s = TcpStream::connect_timeout(&target.addr, TIMEOUT).ok()?;
    s.set_read_timeout(Some(TIMEOUT)).ok()?;
    s.set_write_timeout(Some(TIMEOUT)).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {}\r\n{headers}Connection: close\r\n\r\n",
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

/// Polls /stats of every node once a second until dropped.
pub struct StatsPoller {
    targets: Vec<Target>,
    /// Header lines of each request (the admin key).
    headers: String,
    latest: Arc<Mutex<Option<Vec<Value>>>>,
    stop: Arc<AtomicBool>,
    /// The first answers, one per node, taken before the load starts.
    pub first: Option<Vec<Value>>,
}

/// One /stats answer from each of `targets`, or None unless all answered:
/// a sum over some of the nodes would pass for the whole.
fn poll_all(targets: &[Target], headers: &str) -> Option<Vec<Value>> {
    targets
        .iter()
        .map(|t| get_json(t, "/stats", headers))
        .collect()
}

impl StatsPoller {
    /// Starts polling `targets` (the nodes of one run), sending `headers`.
    pub fn start(targets: Vec<Target>, headers: String) -> StatsPoller {
        let first = poll_all(&targets, &headers);
        let latest = Arc::new(Mutex::new(first.clone()));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s) = (Arc::clone(&latest), Arc::clone(&stop));
        let (polled, polled_headers) = (targets.clone(), headers.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_secs(1));
                if let Some(v) = poll_all(&polled, &polled_headers) {
                    // A poisoned lock only means a reader panicked; the
                    // value is still whole JSON documents.
                    *l.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
                }
            }
        });
        StatsPoller {
            targets,
            headers,
            latest,
            stop,
            first,
        }
    }

    /// Fresh answers taken now (the latest periodic ones if a node does not
    /// answer): the report's end state, exact for every counter.
    pub fn final_answers(&self) -> Option<Vec<Value>> {
        poll_all(&self.targets, &self.headers).or_else(|| self.latest())
    }

    /// The latest answers, one per node.
    pub fn latest(&self) -> Option<Vec<Value>> {
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
