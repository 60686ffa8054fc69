//! Benchpub (seed 001): R messages/s of S bytes to subjects drawn from a
//! pattern, over WebSocket or the HTTP API, paced open-loop.
//!
//! This worker side ([`PublishDriver`]) fires every publish event of its
//! share of the schedule as soon as it is due, stamping it with its DUE
//! time: if the server (or this process) falls behind, the delay shows as
//! latency at the subscribers and as send lag here, never as a quietly
//! lower rate. A server that stops reading (back-pressure) fills a
//! connection's socket and then its bounded queue here; events wait, unsent
//! and unrendered, and leave late with their due timestamps. An event
//! counts as published once its last byte is written to the socket; one
//! still queued when the worker ends is reported as dropped, so delivery
//! accounting stays exact. HTTP publishes are pipelined on keep-alive
//! connections and their responses timed from the due time too. The
//! coordinator side is `coordinator/workloads/publishers.rs`.

use std::collections::VecDeque;

use crate::schema::{PublishTask, PublishTransport, Published, Spec};
use crate::util::clock::Extent;
use crate::util::counters::Counters;
use crate::util::error::BenchError;
use crate::util::histogram::{self, Micros};
use crate::util::pattern::publish_subject;
use crate::util::payload::PayloadBuilder;
use crate::util::profile::{Template, Values};
use crate::worker::client_conn::{Ending, Handler, Opening, Wire};
use crate::worker::driver::{Driver, DriverResult, MAX_BATCH};
use crate::worker::reactor::Reactor;

/// Bytes queued on one publishing connection beyond what its socket took,
/// past which no more events are rendered for it: a server applying
/// back-pressure holds the events back (late, not lost) instead of growing
/// this process without bound.
const MAX_BACKLOG_BYTES: usize = 1 << 20;

/// A publishing connection.
struct PubConn {
    key: usize,
    index: u32,
    open: bool,
    /// Bytes queued on it so far; less its current backlog, bytes written.
    queued_bytes: u64,
    /// Events queued but not yet wholly written: (`queued_bytes` at the
    /// end of the event, event number), oldest first.
    unsent: VecDeque<(u64, u64)>,
    /// HTTP: due times (wall clock) of requests awaiting a response, in order.
    awaiting: VecDeque<u64>,
}

/// The worker side of publishers.
pub struct PublishDriver {
    task: PublishTask,
    events: u64,
    template: Template,
    /// HTTP: request path, Host header and extra header line.
    http: Option<(String, String, String)>,
    payload: PayloadBuilder,
    conns: Vec<PubConn>,
    opened: bool,
    started_ns: Option<u64>,
    /// Next position in the share.
    k: u64,
    /// Round-robin cursor over connections.
    rr: usize,
    /// When the last event fired (starts the drain deadline).
    last_fired_ns: Option<u64>,
    lag: Micros,
    ack: Micros,
    dropped: Vec<u64>,
    conns_lost: u64,
    /// When the first and last publish was written.
    sent: Option<Extent>,
    stopped: bool,
    // Reused buffers.
    subject: String,
    data: String,
    text: String,
}

impl PublishDriver {
    /// A driver for `task` under `spec`'s profile.
    pub fn new(task: PublishTask, spec: &Spec) -> Result<PublishDriver, BenchError> {
        let (template, http) = match task.transport {
            PublishTransport::Ws => (Template::compile("publish", &spec.profile.publish)?, None),
            PublishTransport::Http => {
                let h = spec.profile.http()?;
                let host = spec
                    .targets
                    .first()
                    .map(|t| t.host.clone())
                    .unwrap_or_default();
                let extra = task.api_key_header.clone().unwrap_or_default();
                (
                    Template::compile("http_publish.body", &h.body)?,
                    Some((h.path.clone(), host, extra)),
                )
            }
        };
        let mut events = task.schedule.total_events();
        if let Some(max) = task.max_events {
            events = events.min(max);
        }
        Ok(PublishDriver {
            payload: PayloadBuilder::new(task.size, spec.seed ^ spec.worker),
            events,
            template,
            http,
            conns: Vec::new(),
            opened: false,
            started_ns: None,
            k: 0,
            rr: 0,
            last_fired_ns: None,
            lag: histogram::new(),
            ack: histogram::new(),
            dropped: Vec::new(),
            conns_lost: 0,
            sent: None,
            stopped: false,
            subject: String::new(),
            data: String::new(),
            text: String::new(),
            task,
        })
    }

    /// The next open connection with room in its queue, round robin.
    fn next_conn(&mut self, reactor: &Reactor) -> Option<usize> {
        for _ in 0..self.conns.len() {
            self.rr = (self.rr + 1) % self.conns.len();
            let c = &self.conns[self.rr];
            if c.open && reactor.backlog(c.key) < MAX_BACKLOG_BYTES {
                return Some(self.rr);
            }
        }
        None
    }

    /// Queues event `n`, due at monotonic `due_ns`, on connection `slot`.
    fn publish(&mut self, reactor: &mut Reactor, slot: usize, n: u64, due_ns: u64, now: u64) {
        let due_real = reactor.origin().real_at(due_ns);
        let subject = publish_subject(self.task.order, self.task.seed, n, self.task.subjects.len());
        self.subject.clear();
        self.task.subjects.write_subject(subject, &mut self.subject);
        self.data.clear();
        self.payload.write(due_real, n, &mut self.data);
        self.text.clear();
        self.template.render(
            &Values {
                subjects: std::slice::from_ref(&self.subject),
                data: &self.data,
                id: n + 1,
            },
            &mut self.text,
        );
        let conn = &mut self.conns[slot];
        let before = reactor.backlog(conn.key);
        match &self.http {
            None => reactor.queue_text(conn.key, self.text.as_bytes()),
            Some((path, host, extra)) => {
                let head = format!(
                    "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n",
                    self.text.len()
                );
                reactor.queue_raw(conn.key, head.as_bytes());
                reactor.queue_raw(conn.key, self.text.as_bytes());
                conn.awaiting.push_back(due_real);
            }
        }
        conn.queued_bytes += (reactor.backlog(conn.key) - before) as u64;
        conn.unsent.push_back((conn.queued_bytes, n));
        histogram::record(&mut self.lag, now.saturating_sub(due_ns) / 1000);
    }

    /// Writes what every connection has queued (once per tick, so a burst
    /// of due events leaves in as few writes as possible), then counts the
    /// events whose last byte the sockets took.
    fn flush_all(&mut self, reactor: &mut Reactor) {
        for i in 0..self.conns.len() {
            let key = self.conns[i].key;
            reactor.flush(key, self);
        }
        let now_real = reactor.origin().real_at(reactor.cx.now_ns);
        for c in self.conns.iter_mut().filter(|c| c.open) {
            let written = c.queued_bytes - reactor.backlog(c.key) as u64;
            while c.unsent.front().is_some_and(|&(end, _)| end <= written) {
                c.unsent.pop_front();
                reactor.cx.counters.published += 1;
                Extent::extend(&mut self.sent, now_real);
            }
        }
    }

    /// Reports every event still unwritten on `conn` as dropped.
    fn drop_unsent(conn: &mut PubConn, dropped: &mut Vec<u64>) {
        dropped.extend(conn.unsent.drain(..).map(|(_, n)| n));
    }

    fn all_fired(&self) -> bool {
        self.k >= self.share_len()
    }

    /// Events of this worker's share.
    fn share_len(&self) -> u64 {
        self.task.share.len_of(self.events)
    }
}

impl Handler for PublishDriver {
    fn on_open(&mut self, _key: usize, index: u32, _now_ns: u64, _out: &mut Opening) {
        if let Some(c) = self.conns.iter_mut().find(|c| c.index == index) {
            c.open = true;
        }
    }

    fn on_message(&mut self, _: u32, _: &[u8], _: u64, _: &mut Counters) -> bool {
        false
    }

    fn on_raw(&mut self, index: u32, data: &[u8], now_real: u64, counters: &mut Counters) -> usize {
        let Some(conn) = self.conns.iter_mut().find(|c| c.index == index) else {
            return data.len();
        };
        let mut pos = 0;
        while let Some((len, status, delivered)) = http_response(&data[pos..]) {
            pos += len;
            if (200..300).contains(&status) {
                counters.http_ok += 1;
            } else {
                counters.http_errors += 1;
            }
            counters.http_delivered += delivered;
            if let Some(due) = conn.awaiting.pop_front() {
                histogram::record(&mut self.ack, now_real.saturating_sub(due) / 1000);
            }
        }
        pos
    }

    fn on_closed(&mut self, _: usize, index: u32, _: Ending, was_open: bool, _: &mut Counters) {
        if let Some(c) = self.conns.iter_mut().find(|c| c.index == index) {
            c.open = false;
            c.awaiting.clear();
            Self::drop_unsent(c, &mut self.dropped);
        }
        if was_open && !self.stopped {
            self.conns_lost += 1;
        }
    }
}

impl Driver for PublishDriver {
    fn tick(&mut self, reactor: &mut Reactor) -> Option<u64> {
        let now = reactor.refresh_now();
        if !self.opened {
            self.opened = true;
            let wire = match self.task.transport {
                PublishTransport::Ws => Wire::WebSocket,
                PublishTransport::Http => Wire::Raw,
            };
            for i in 0..self.task.conns {
                let index = (self.task.first_index + u64::from(i)) as u32;
                if let Ok(key) = reactor.open(index, wire) {
                    self.conns.push(PubConn {
                        key,
                        index,
                        open: false,
                        queued_bytes: 0,
                        unsent: VecDeque::new(),
                        awaiting: VecDeque::new(),
                    });
                }
            }
        }
        let start = self.started_ns?;
        if self.stopped {
            return None;
        }
        let share_len = self.share_len();
        let mut next = None;
        for _ in 0..MAX_BATCH {
            if self.k >= share_len {
                break;
            }
            let n = self.task.share.event(self.k);
            let due = start + self.task.schedule.due(n).map_or(0, |d| d.as_nanos() as u64);
            if due > now {
                next = Some(due);
                break;
            }
            if self.conns.iter().all(|c| !c.open) {
                // Every connection is gone: the rest can never be sent.
                self.dropped.push(n);
                self.k += 1;
                continue;
            }
            let Some(slot) = self.next_conn(reactor) else {
                // Every queue is full: the server is not reading. Look again
                // after the sockets had a turn; the event stays due.
                next = Some(now + 1_000_000);
                break;
            };
            self.publish(reactor, slot, n, due, now);
            self.k += 1;
        }
        if self.k < share_len && next.is_none() {
            next = Some(now); // the batch ended with more due
        }
        if self.all_fired() {
            self.last_fired_ns.get_or_insert(now);
        }
        self.flush_all(reactor);
        next
    }

    fn start(&mut self, reactor: &mut Reactor) {
        self.started_ns = Some(reactor.refresh_now());
    }

    fn stop(&mut self, _reactor: &mut Reactor) {
        self.stopped = true;
    }

    fn is_ready(&self, reactor: &Reactor) -> bool {
        self.opened && reactor.in_setup() == 0
    }

    fn is_done(&self, reactor: &Reactor) -> bool {
        if self.stopped {
            return true;
        }
        if !self.all_fired() {
            return false;
        }
        let drained = self
            .conns
            .iter()
            .all(|c| c.unsent.is_empty() && c.awaiting.is_empty());
        let waited = self
            .last_fired_ns
            .is_some_and(|t| reactor.cx.now_ns >= t + (self.task.drain_secs * 1e9) as u64);
        drained || waited
    }

    fn take_interval(&mut self) -> Option<Micros> {
        None
    }

    fn precise(&self) -> bool {
        true
    }

    fn finish(mut self) -> DriverResult {
        for c in &mut self.conns {
            Self::drop_unsent(c, &mut self.dropped);
        }
        let published = Published {
            fired: self.k,
            dropped: self.dropped,
            share: self.task.share,
            conns_lost: self.conns_lost,
        };
        let http = self.task.transport == PublishTransport::Http;
        DriverResult {
            lag: Some(self.lag),
            ack: http.then_some(self.ack),
            published: Some(published),
            sent: self.sent,
            ..DriverResult::default()
        }
    }
}

/// One complete HTTP response at the front of `buf`: (bytes, status, the
/// `"delivered":N` figure of its body if any). None until it is whole.
fn http_response(buf: &[u8]) -> Option<(usize, u16, u64)> {
    let head = match crate::util::http::parse_head(buf) {
        Ok(Some(head)) => head,
        Ok(None) => return None,
        // A malformed response consumes the rest: the connection is
        // beyond repair and its pending publishes stay unanswered.
        Err(_) => return Some((buf.len(), 0, 0)),
    };
    let body_len = head.content_length.unwrap_or(0);
    let (status, head) = (head.status, head.len);
    if buf.len() < head + body_len {
        return None;
    }
    let body = &buf[head..head + body_len];
    let delivered = memchr::memmem::find(body, b"\"delivered\":")
        .and_then(|at| {
            let digits = &body[at + 12..];
            let len = digits.iter().take_while(|c| c.is_ascii_digit()).count();
            std::str::from_utf8(&digits[..len]).ok()?.parse().ok()
        })
        .unwrap_or(0);
    Some((head + body_len, status, delivered))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pipelined_responses() {
        let one = b"HTTP/1.1 200 OK\r\ncontent-length: 15\r\n\r\n{\"delivered\":3}";
        let mut two = one.to_vec();
        two.extend_from_slice(b"HTTP/1.1 429 Too Many\r\ncontent-length: 0\r\n\r\nHTTP/1.1 2");
        assert_eq!(http_response(&two), Some((one.len(), 200, 3)));
        let rest = &two[one.len()..];
        let (len, status, _) = http_response(rest).unwrap();
        assert_eq!(status, 429);
        assert_eq!(http_response(&rest[len..]), None, "partial head waits");
    }
}
