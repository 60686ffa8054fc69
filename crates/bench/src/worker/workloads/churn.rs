//! `myriad bench churn`: subscribers on subjects with history disconnect
//! and reconnect at a steady rate, resubscribing with `since` set to the
//! last position they received, while publishers keep publishing; every
//! subscriber must get every message of its subjects exactly once, in
//! offset order, across its reconnects.
//!
//! This is the worker side ([`ChurnDriver`]), a subscriber worker plus
//! churn: a [`SubscribeDriver`] sets connections up (and up again after failures)
//! and times live deliveries, while this file keeps, per subscriber, its
//! current connection and one [`Continuity`] per subject, and fires the
//! reconnect schedule. The schedule is open-loop, each worker firing its
//! share of the global rate round-robin over its own subscribers, so every
//! subscriber in the run reconnects once per N / R seconds. A reconnect
//! closes the socket (close handshake or reset), stays away `--offline`,
//! opens a new connection, on the next node when the run has several
//! `--url`s, and resubscribes each subject from the last position it
//! received. A subscriber whose connection is lost without the bench
//! closing it (its node was killed) fails over the same way at once: it
//! is set up again on the next node, resubscribing from where it was, and
//! counted as a failover until every subject is answered. In both cases
//! it resubscribes each subject: a `subscribe` with `since` per subject over
//! WebSocket, the positions as one cursor in an HTTP transport's request
//! (`Last-Event-ID` for Server-Sent Events, `since` for streams and polls).
//! The answers and deliveries are read with the protocol crate's parser and
//! checked. Over WebSocket, SSE and streams each subject is answered with a
//! `subscribed` that says whether it recovered and where its replay ends. A
//! long-poll tells only a failed recovery: its answer is the cursor closing
//! the first poll of the connection, before which every delivery is the
//! replay. The coordinator side is `coordinator/workloads/churn.rs`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use myriad_protocol::cursor::parse_cursor;
use myriad_protocol::message::{
    encode_subscribe, encode_subscribe_since, parse_server_message, ServerMessage,
};
use myriad_protocol::position::Position;

use crate::schema::{ChurnTask, CloseMode, Spec, SubscribeTransport};
use crate::util::continuity::{Continuity, Delivery, Resumed};
use crate::util::counters::Counters;
use crate::util::error::BenchError;
use crate::util::histogram::{self, Micros};
use crate::util::pacing::Schedule;
use crate::util::pattern::Pattern;
use crate::worker::client_conn::{Ending, Handler, Opening};
use crate::worker::driver::{Driver, DriverResult, MAX_BATCH};
use crate::worker::reactor::Reactor;
use crate::worker::subscriber::{earliest, OnSubscribers, SubscribeDriver};

/// The id every subscribe carries: without one the server sends no
/// `subscribed`, whose position the check needs. Answers are matched to
/// subjects by name, so one id serves all.
const REQUEST_ID: u64 = 1;

/// One subject of a subscriber.
#[derive(Debug)]
struct Stream {
    /// Its index in the run's pattern.
    subject: u64,
    /// Present from its first `subscribed` answer (or poll cursor) on.
    continuity: Option<Continuity>,
    /// Long-poll: while the first poll of a reconnect is unanswered, the
    /// deliveries of its replay so far; None otherwise, and once a failed
    /// recovery was told.
    replay: Option<u64>,
}

/// One churning subscriber.
#[derive(Debug, Default)]
struct Subscriber {
    /// Its current connection from the upgrade on; None while it is away,
    /// connecting, or given up.
    key: Option<usize>,
    /// `subscribed` answers its current connection is still owed.
    awaiting: u32,
    /// Wall clock at the connect() of its reconnect in progress; 0 when
    /// none is.
    reconnect_real: u64,
    /// Its connection was lost mid-run, and it is on its way back on
    /// another node: counted as failed over once every subject is answered.
    failing_over: bool,
    /// Its subjects, in assignment order.
    streams: Vec<Stream>,
}

/// What one server message was to a subscriber.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Heard {
    /// The first `subscribed` of one of its subjects: it joined the stream.
    Joined,
    /// The answer to a resubscribe with `since`, and whether it said
    /// `recovered: true`.
    Resumed { resumed: Resumed, recovered: bool },
    /// A delivery of one of its subjects.
    Delivery(Delivery),
    /// A delivery of a subject it holds no position in.
    Stray,
    /// A long-poll answer's closing cursor: a position per subject.
    Polled(Vec<Option<Position>>),
    /// Anything else: ok, pong, an error reply, a `subscribed` it did not
    /// ask for, or text that does not parse.
    Other,
}

impl Subscriber {
    /// Writes how a new connection subscribes into `out`. Over WebSocket:
    /// one `subscribe` for the subjects it has not joined yet, one
    /// resubscribe with `since` per subject it has; over an HTTP transport,
    /// the position of each subject it has joined. Returns the answers the
    /// connection is owed: a `subscribed` per subject, or a long-poll's
    /// first answer.
    fn open(&mut self, pattern: &Pattern, transport: SubscribeTransport, out: &mut Opening) -> u32 {
        match transport {
            SubscribeTransport::Ws => self.write_subscribes(pattern, out),
            SubscribeTransport::Sse | SubscribeTransport::Stream => self.write_resume(out),
            SubscribeTransport::Poll => {
                self.write_resume(out);
                for s in &mut self.streams {
                    s.replay = s.continuity.map(|_| 0);
                }
                return 1;
            }
        }
        self.streams.len() as u32
    }

    /// The subscribe commands of a WebSocket connection.
    fn write_subscribes(&self, pattern: &Pattern, out: &mut Opening) {
        let fresh: Vec<String> = self
            .streams
            .iter()
            .filter(|s| s.continuity.is_none())
            .map(|s| pattern.subject(s.subject))
            .collect();
        if !fresh.is_empty() {
            let names: Vec<&str> = fresh.iter().map(String::as_str).collect();
            out.message()
                .push_str(&encode_subscribe(&names, Some(REQUEST_ID)));
        }
        for s in &self.streams {
            if let Some(c) = &s.continuity {
                out.message().push_str(&encode_subscribe_since(
                    &pattern.subject(s.subject),
                    c.last(),
                    Some(REQUEST_ID),
                ));
            }
        }
    }

    /// Where an HTTP transport's request resumes each subject.
    fn write_resume(&self, out: &mut Opening) {
        out.resume_from(self.streams.iter().map(|s| Some(s.continuity?.last())));
    }

    /// Reads one message from the server and checks it against the
    /// subject's continuity.
    fn hear(&mut self, pattern: &Pattern, data: &[u8]) -> Heard {
        let parsed = std::str::from_utf8(data)
            .ok()
            .and_then(|text| parse_server_message(text).ok());
        match parsed {
            Some(ServerMessage::Delivery {
                subject, position, ..
            }) => {
                let Some(Stream {
                    continuity: Some(c),
                    replay,
                    ..
                }) = self.stream(pattern, &subject)
                else {
                    return Heard::Stray;
                };
                let mut delivery = c.deliver(position);
                if let (Delivery::Next { replayed }, Some(count)) = (&mut delivery, replay) {
                    *replayed = true;
                    *count += 1;
                }
                Heard::Delivery(delivery)
            }
            Some(ServerMessage::Subscribed {
                subject,
                position,
                recovered,
                ..
            }) => {
                let Some(stream) = self.stream(pattern, &subject) else {
                    return Heard::Other;
                };
                match &mut stream.continuity {
                    None => {
                        stream.continuity = Some(Continuity::joined(position));
                        Heard::Joined
                    }
                    Some(c) => {
                        let recovered = recovered == Some(true);
                        if !recovered {
                            stream.replay = None;
                        }
                        Heard::Resumed {
                            resumed: c.resume(position, recovered),
                            recovered,
                        }
                    }
                }
            }
            Some(ServerMessage::Poll { since }) => match parse_cursor(&since, self.streams.len()) {
                Ok(cursor) => Heard::Polled(cursor),
                Err(_) => Heard::Other,
            },
            _ => Heard::Other,
        }
    }

    /// Takes a long-poll answer's closing `cursor`: subjects not joined yet
    /// join where it says, and the replay of each subject whose recovery
    /// was not reported failed is over; `recovered` is told its size.
    /// Returns whether every subject has joined.
    fn polled(&mut self, cursor: &[Option<Position>], mut recovered: impl FnMut(u64)) -> bool {
        for (stream, &at) in self.streams.iter_mut().zip(cursor) {
            if stream.continuity.is_none() {
                stream.continuity = at.map(Continuity::joined);
            }
            if let Some(replay) = stream.replay.take() {
                recovered(replay);
            }
        }
        self.streams.iter().all(|s| s.continuity.is_some())
    }

    /// Its stream of subject `name`.
    fn stream(&mut self, pattern: &Pattern, name: &str) -> Option<&mut Stream> {
        let subject = pattern.index_of(name)?;
        self.streams.iter_mut().find(|s| s.subject == subject)
    }
}

/// The worker side of churn.
pub struct ChurnDriver {
    /// Sets connections up and up again, and times live deliveries.
    inner: SubscribeDriver,
    /// The run's subjects.
    pattern: Pattern,
    /// Global index of its first subscriber.
    first: u64,
    /// How its subscribers receive.
    transport: SubscribeTransport,
    /// Its subscribers. While one's current connection is owed answers,
    /// the worker is not ready (`SubscribeDriver::owe`): every subscription
    /// has joined its stream before publishing starts, which the end check
    /// relies on.
    subs: Vec<Subscriber>,
    reconnects: Schedule,
    /// Events in `reconnects`.
    events: u64,
    /// Next reconnect event.
    k: u64,
    offline_ns: u64,
    /// Close with a reset instead of a close handshake.
    reset: bool,
    /// (back at, subscriber) of those away between close and reconnect.
    away: BinaryHeap<Reverse<(u64, u32)>>,
    /// Publications replayed per recovered resubscribe.
    replay: Micros,
    /// From a reconnect's connect() to each `subscribed` answer, µs.
    resubscribe: Micros,
}

impl ChurnDriver {
    /// A driver for `task` under `spec`'s profile.
    pub fn new(task: ChurnTask, spec: &Spec) -> Result<ChurnDriver, BenchError> {
        let assignment =
            task.subscribe.assignment.clone().ok_or_else(|| {
                BenchError::Config("churn needs subscribers with subjects".into())
            })?;
        let mut ids = Vec::new();
        let subs = (0..task.subscribe.count)
            .map(|i| {
                assignment.subjects_for(task.subscribe.first + i, &mut ids);
                Subscriber {
                    streams: ids
                        .iter()
                        .map(|&subject| Stream {
                            subject,
                            continuity: None,
                            replay: None,
                        })
                        .collect(),
                    ..Subscriber::default()
                }
            })
            .collect();
        Ok(ChurnDriver {
            inner: SubscribeDriver::new(task.subscribe.clone(), spec)?,
            pattern: assignment.pattern,
            first: task.subscribe.first,
            transport: task.subscribe.transport,
            subs,
            events: task.reconnects.total_events(),
            reconnects: task.reconnects,
            k: 0,
            offline_ns: (task.offline * 1e9) as u64,
            reset: task.close == CloseMode::Reset,
            away: BinaryHeap::new(),
            replay: histogram::new(),
            resubscribe: histogram::new(),
        })
    }

    /// Global connection index of subscriber `i`.
    fn index(&self, i: usize) -> u32 {
        (self.first + i as u64) as u32
    }

    /// Subscriber `i`'s current connection is owed `answers`.
    fn owe(&mut self, i: usize, answers: u32) {
        let before = std::mem::replace(&mut self.subs[i].awaiting, answers);
        self.inner.owe(before, answers);
    }

    /// One of subscriber `i`'s answers came; with the last, its connection
    /// is set up, and a reconnect in progress is done.
    fn answered(&mut self, i: usize, counters: &mut Counters) {
        let awaiting = self.subs[i].awaiting;
        if awaiting == 0 {
            return;
        }
        self.owe(i, awaiting - 1);
        if awaiting > 1 {
            return;
        }
        let sub = &mut self.subs[i];
        if sub.reconnect_real > 0 {
            sub.reconnect_real = 0;
            counters.reconnected += 1;
        }
        if std::mem::take(&mut sub.failing_over) {
            counters.failed_over += 1;
        }
        let index = self.index(i);
        self.inner.set_up(index);
    }

    /// Makes the reconnects that are due, a batch at most: each closes its
    /// subscriber's connection and sends it away until it is due back. A
    /// subscriber still away or owed answers skips its turn. Returns when
    /// the next is due.
    fn reconnect_due(&mut self, reactor: &mut Reactor, start: u64, now: u64) -> Option<u64> {
        let count = self.subs.len() as u64;
        for _ in 0..MAX_BATCH {
            if self.k >= self.events || count == 0 {
                return None;
            }
            let due = start
                + self
                    .reconnects
                    .due(self.k)
                    .map_or(0, |d| d.as_nanos() as u64);
            if due > now {
                return Some(due);
            }
            let i = (self.k % count) as usize;
            self.k += 1;
            let sub = &mut self.subs[i];
            let Some(key) = sub.key.filter(|_| sub.awaiting == 0) else {
                reactor.cx.counters.reconnects_skipped += 1;
                continue;
            };
            // No longer its connection: whatever that one still brings
            // (the conn ignores it while closing) and its end are not ours.
            sub.key = None;
            reactor.cx.counters.reconnects += 1;
            let index = self.index(i);
            self.inner.move_on(index);
            reactor.close(key, index, self.reset, self);
            self.away.push(Reverse((now + self.offline_ns, i as u32)));
        }
        Some(now) // more are due: back after a look at the sockets
    }

    /// Opens a new connection for each subscriber whose time away is over,
    /// a batch at most. Returns when the next is due back.
    fn bring_back(&mut self, reactor: &mut Reactor, now: u64) -> Option<u64> {
        for _ in 0..MAX_BATCH {
            let &Reverse((at, i)) = self.away.peek()?;
            if at > now {
                return Some(at);
            }
            self.away.pop();
            let i = i as usize;
            self.subs[i].reconnect_real = reactor.origin().real_at(now);
            let index = self.index(i);
            // A failed open is counted by the reactor and retried like a
            // failed set-up.
            if self.inner.open(reactor, index).is_err() {
                self.inner.retry_later(index);
            }
        }
        Some(now)
    }
}

impl Handler for ChurnDriver {
    fn on_open(&mut self, key: usize, index: u32, _now_ns: u64, out: &mut Opening) {
        let Some(i) = self.inner.local(index) else {
            return;
        };
        self.subs[i].key = Some(key);
        let answers = self.subs[i].open(&self.pattern, self.transport, out);
        self.owe(i, answers);
    }

    fn on_message(
        &mut self,
        index: u32,
        data: &[u8],
        now_real: u64,
        counters: &mut Counters,
    ) -> bool {
        let Some(i) = self.inner.local(index) else {
            return false;
        };
        // A long-poll's connection is answered by its first poll's cursor.
        let by_subscribed = self.transport != SubscribeTransport::Poll;
        match self.subs[i].hear(&self.pattern, data) {
            Heard::Joined => {
                if by_subscribed {
                    self.answered(i, counters);
                }
                false
            }
            Heard::Resumed { resumed, recovered } => {
                if recovered {
                    counters.recovered += 1;
                } else {
                    counters.unrecovered += 1;
                }
                match resumed {
                    Resumed::Recovered { replay } => histogram::record(&mut self.replay, replay),
                    Resumed::Unrecovered { missed } => counters.missed += missed,
                    Resumed::NewEpoch => counters.broken += 1,
                }
                let began = self.subs[i].reconnect_real;
                if began > 0 {
                    histogram::record(&mut self.resubscribe, now_real.saturating_sub(began) / 1000);
                }
                if by_subscribed {
                    self.answered(i, counters);
                }
                false
            }
            Heard::Polled(cursor) => {
                let sub = &mut self.subs[i];
                let began = sub.reconnect_real;
                let (replay, resubscribe) = (&mut self.replay, &mut self.resubscribe);
                let joined = sub.polled(&cursor, |size| {
                    counters.recovered += 1;
                    histogram::record(replay, size);
                    histogram::record(resubscribe, now_real.saturating_sub(began) / 1000);
                });
                if joined {
                    self.answered(i, counters);
                }
                false
            }
            Heard::Delivery(delivery) => {
                match delivery {
                    // Timed as in `subscribers`; a replay's timestamp says
                    // how long the subscriber was away, not how fast the
                    // server delivers, so it is counted instead.
                    Delivery::Next { replayed: false } => {
                        self.inner.on_message(index, data, now_real, counters);
                    }
                    Delivery::Next { replayed: true } => counters.replayed += 1,
                    Delivery::Duplicate => counters.duplicates += 1,
                    Delivery::Gap { missed } => {
                        counters.gaps += 1;
                        counters.missed += missed;
                    }
                    Delivery::NewEpoch => counters.broken += 1,
                }
                true
            }
            Heard::Stray => {
                counters.broken += 1;
                true
            }
            Heard::Other => false,
        }
    }

    fn on_raw(&mut self, _: u32, _: &[u8], _: u64, _: &mut Counters) -> usize {
        0
    }

    fn on_closed(
        &mut self,
        key: usize,
        index: u32,
        ending: Ending,
        was_open: bool,
        counters: &mut Counters,
    ) {
        let Some(i) = self.inner.local(index) else {
            return;
        };
        // Only settled connections are closed on purpose, and they stop
        // being the subscriber's when they are: an end in set-up, or of the
        // connection it holds, is its current connection failing.
        if was_open && self.subs[i].key != Some(key) {
            return;
        }
        let sub = &mut self.subs[i];
        // Lost once it was settled, while the run goes on: its node is
        // likely gone. One that fails on its way back (set-up, or answers
        // still owed) is the same failover, or a reconnect's, going on.
        if was_open && sub.awaiting == 0 && !sub.failing_over && self.inner.started().is_some() {
            sub.failing_over = true;
            counters.failovers += 1;
        }
        sub.key = None;
        self.owe(i, 0);
        // Set up again at once, on the next node.
        self.inner.on_closed(key, index, ending, false, counters);
    }
}

impl OnSubscribers for ChurnDriver {
    fn base(&self) -> &SubscribeDriver {
        &self.inner
    }

    fn base_mut(&mut self) -> &mut SubscribeDriver {
        &mut self.inner
    }

    fn due(&mut self, reactor: &mut Reactor, start: u64, now: u64) -> Option<u64> {
        let reconnect = self.reconnect_due(reactor, start, now);
        let back = self.bring_back(reactor, now);
        earliest(reconnect, back)
    }

    fn report(self) -> DriverResult {
        let reached = self
            .subs
            .iter()
            .flat_map(|s| &s.streams)
            .filter_map(|s| Some(s.continuity?.reached(s.subject)))
            .collect();
        DriverResult {
            replay: Some(self.replay),
            resubscribe: Some(self.resubscribe),
            reached: Some(reached),
            ..self.inner.finish()
        }
    }
}

#[cfg(test)]
mod tests {
    use myriad_protocol::message::{
        encode_error, encode_ok, encode_poll_end, encode_pong, encode_subscribed,
        write_publication, ErrorCode,
    };
    use myriad_protocol::position::Epoch;

    use super::*;
    use crate::schema::{SubscribeTask, Task};
    use crate::util::counters::Failure;
    use crate::util::pattern::{AssignMode, Assignment};

    /// A worker of two subscribers (global 10 and 11), two subjects each
    /// out of /p/s{1..3}, over WebSocket.
    fn driver() -> ChurnDriver {
        driver_over(SubscribeTransport::Ws)
    }

    /// The same, receiving over `transport`.
    fn driver_over(transport: SubscribeTransport) -> ChurnDriver {
        ChurnDriver::new(
            task(transport),
            &Spec::for_tests(Task::Churn(task(transport))),
        )
        .unwrap()
    }

    /// The same over WebSocket, in a run of two nodes, with a reactor for
    /// the calls that take one (the tests open nothing through it).
    fn driver_of_two_nodes() -> (ChurnDriver, Reactor) {
        let task = task(SubscribeTransport::Ws);
        let mut spec = Spec::for_tests(Task::Churn(task.clone()));
        let node =
            |port| crate::util::addr::Target::parse(&format!("ws://127.0.0.1:{port}/ws"), "ws");
        spec.targets = vec![node(1).unwrap(), node(2).unwrap()];
        let net = crate::worker::reactor::NetConfig {
            targets: spec.targets.clone(),
            sources: spec.sources.clone(),
            port_mode: spec.port_mode,
            worker: 0,
            workers: 1,
            max_conns: 10,
            setup_timeout_ns: 1_000_000_000,
            nodelay: false,
            tls: None,
        };
        let reactor = Reactor::new(net, None, None, 1).unwrap();
        (ChurnDriver::new(task, &spec).unwrap(), reactor)
    }

    /// [`driver_of_two_nodes`] once subscriber 10 is settled on connection
    /// 7, at /p/s3 5 and /p/s1 0, and the run has started.
    fn settled_on_two_nodes() -> (ChurnDriver, Reactor, Counters) {
        let (mut d, mut reactor) = driver_of_two_nodes();
        let mut c = Counters::default();
        opening(&mut d, 7);
        hear(&mut d, &mut c, &subscribed("/p/s3", 5, None));
        hear(&mut d, &mut c, &subscribed("/p/s1", 0, None));
        d.start(&mut reactor);
        (d, reactor, c)
    }

    /// The task of those workers.
    fn task(transport: SubscribeTransport) -> ChurnTask {
        let subscribe = SubscribeTask {
            first: 10,
            count: 2,
            assignment: Some(Assignment {
                pattern: "/p/s{1..3}".parse().unwrap(),
                per_conn: 2,
                mode: AssignMode::OneToOne,
                seed: 1,
            }),
            in_flight: 10,
            connect_rate: 0.0,
            broadcast_messages: None,
            transport,
        };
        // Its share of 10 reconnects/s for 1 s over a group of 4 (the
        // coordinator's `ChurnPlan::task`).
        ChurnTask {
            subscribe,
            reconnects: Schedule::constant(5.0, 1.0),
            offline: 0.0,
            close: CloseMode::Reset,
        }
    }

    /// Feeds one server text to subscriber 10; returns whether it counted
    /// as a delivery.
    fn hear(d: &mut ChurnDriver, counters: &mut Counters, text: &str) -> bool {
        d.on_message(10, text.as_bytes(), 2_000_000, counters)
    }

    fn opening(d: &mut ChurnDriver, key: usize) -> Vec<String> {
        let mut out = Opening::default();
        d.on_open(key, 10, 0, &mut out);
        out.messages().map(str::to_owned).collect()
    }

    /// What subscriber 10's HTTP transport request resumes from (offsets).
    fn http_opening(d: &mut ChurnDriver, key: usize) -> Vec<Option<u64>> {
        let mut out = Opening::default();
        d.on_open(key, 10, 0, &mut out);
        assert_eq!(out.messages().count(), 0, "the request subscribes");
        out.resumes()
            .iter()
            .map(|p| Some(p.as_ref()?.offset))
            .collect()
    }

    /// The epoch of every subject here, as the node spells it (checked in
    /// `the_tests_speak_the_protocol_crates_encoding`).
    const EPOCH: &str = "00000000000000ab";

    /// Offset `offset` of a subject in [`EPOCH`].
    fn at(offset: u64) -> Position {
        Position::new(Epoch(0xab), offset)
    }

    // What the node sends is written by the protocol crate's encoders, as
    // the node writes it, so a change of the protocol fails these tests.

    fn poll_end(cursor: &str) -> String {
        String::from_utf8(encode_poll_end(cursor.as_bytes())).unwrap()
    }

    fn subscribed(subject: &str, offset: u64, recovered: Option<bool>) -> String {
        encode_subscribed(Some(1), subject, at(offset), recovered)
    }

    /// The resubscribe of `subject` from `offset` a subscriber sends.
    fn since(subject: &str, offset: u64) -> String {
        format!(
            r#"{{"op":"subscribe","subject":"{subject}","since":{{"epoch":"{EPOCH}","offset":{offset}}},"id":1}}"#
        )
    }

    fn msg(subject: &str, offset: u64) -> String {
        let data = format!(r#"{{"ts":1000,"n":{offset},"pad":"x"}}"#);
        let mut out = Vec::new();
        write_publication(&mut out, subject, at(offset), &data);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_tests_speak_the_protocol_crates_encoding() {
        assert_eq!(Epoch(0xab).to_string(), EPOCH);
    }

    #[test]
    fn a_subscriber_joins_then_resumes_each_subject_with_since() {
        let mut d = driver();
        let mut c = Counters::default();
        // Subscriber 10 holds subjects 20 and 21 mod 3: /p/s3 and /p/s1.
        assert_eq!(
            opening(&mut d, 7),
            [r#"{"op":"subscribe","subjects":["/p/s3","/p/s1"],"id":1}"#]
        );
        assert_eq!(d.inner.unsettled(), 1);
        assert!(!hear(&mut d, &mut c, &subscribed("/p/s3", 5, None)));
        assert_eq!(d.inner.unsettled(), 1, "one answer still owed");
        assert!(!hear(&mut d, &mut c, &subscribed("/p/s1", 0, None)));
        assert_eq!(d.inner.unsettled(), 0, "ready to start");
        assert!(hear(&mut d, &mut c, &msg("/p/s3", 6)));
        assert!(hear(&mut d, &mut c, &msg("/p/s1", 1)));
        // The connection is closed on purpose and a new one opens.
        d.subs[0].key = None;
        d.subs[0].reconnect_real = 1_000_000;
        assert_eq!(opening(&mut d, 8), [since("/p/s3", 6), since("/p/s1", 1),]);
        assert!(!hear(&mut d, &mut c, &subscribed("/p/s3", 8, Some(true))));
        assert!(hear(&mut d, &mut c, &msg("/p/s3", 7)), "replayed");
        assert!(hear(&mut d, &mut c, &msg("/p/s3", 8)), "replayed");
        assert!(hear(&mut d, &mut c, &msg("/p/s3", 9)), "live");
        assert_eq!(c.reconnected, 0, "one subject still unanswered");
        assert!(!hear(&mut d, &mut c, &subscribed("/p/s1", 1, Some(true))));
        assert_eq!(
            (c.recovered, c.unrecovered, c.replayed, c.reconnected),
            (2, 0, 2, 1)
        );
        assert_eq!((c.duplicates, c.gaps, c.missed, c.broken), (0, 0, 0, 0));
        assert_eq!(d.replay.len(), 2);
        assert_eq!((d.replay.min(), d.replay.max()), (0, 2));
        assert_eq!(d.resubscribe.len(), 2);
        assert_eq!(d.resubscribe.max(), 1_000, "1 ms from connect to answer");
        let reached = d.finish().reached.unwrap();
        let ends: Vec<(u64, u64, u64)> = reached
            .iter()
            .map(|r| (r.subject, r.first_offset, r.last_offset))
            .collect();
        assert_eq!(ends, [(2, 5, 9), (0, 0, 1)], "subscriber 11 never joined");
    }

    #[test]
    fn over_server_sent_events_one_cursor_resumes_every_subject() {
        let mut d = driver_over(SubscribeTransport::Sse);
        let mut c = Counters::default();
        // Subscriber 10 holds /p/s3 and /p/s1, in that order.
        assert_eq!(http_opening(&mut d, 7), [None, None], "live from now");
        hear(&mut d, &mut c, &subscribed("/p/s3", 5, None));
        assert_eq!(d.inner.unsettled(), 1, "one answer still owed");
        hear(&mut d, &mut c, &subscribed("/p/s1", 0, None));
        assert_eq!(d.inner.unsettled(), 0);
        assert!(hear(&mut d, &mut c, &msg("/p/s3", 6)));
        d.subs[0].key = None;
        d.subs[0].reconnect_real = 1_000_000;
        assert_eq!(http_opening(&mut d, 8), [Some(6), Some(0)]);
        assert!(!hear(&mut d, &mut c, &subscribed("/p/s3", 7, Some(true))));
        assert!(hear(&mut d, &mut c, &msg("/p/s3", 7)), "replayed");
        assert!(!hear(&mut d, &mut c, &subscribed("/p/s1", 0, Some(true))));
        assert_eq!((c.recovered, c.replayed, c.reconnected), (2, 1, 1));
        assert_eq!((c.duplicates, c.gaps, c.missed, c.broken), (0, 0, 0, 0));
    }

    #[test]
    fn a_long_poll_is_answered_by_the_cursor_closing_its_first_poll() {
        let mut d = driver_over(SubscribeTransport::Poll);
        let mut c = Counters::default();
        assert_eq!(http_opening(&mut d, 7), [None, None]);
        assert_eq!(d.inner.unsettled(), 1);
        hear(&mut d, &mut c, &poll_end(&format!("{EPOCH}:5,")));
        assert_eq!(d.inner.unsettled(), 1, "/p/s1 has no position yet");
        hear(&mut d, &mut c, &poll_end(&format!("{EPOCH}:5,{EPOCH}:0")));
        assert_eq!(d.inner.unsettled(), 0, "every subject joined");
        assert!(hear(&mut d, &mut c, &msg("/p/s3", 6)));
        assert_eq!(c.replayed, 0, "live, so timed");
        d.subs[0].key = None;
        d.subs[0].reconnect_real = 1_000_000;
        assert_eq!(http_opening(&mut d, 8), [Some(6), Some(0)]);
        assert!(hear(&mut d, &mut c, &msg("/p/s3", 7)));
        assert!(hear(&mut d, &mut c, &msg("/p/s3", 8)));
        let gone = subscribed("/p/s1", 4, Some(false));
        assert!(!hear(&mut d, &mut c, &gone), "its history is gone");
        assert_eq!(c.reconnected, 0, "answered by the cursor only");
        hear(&mut d, &mut c, &poll_end(&format!("{EPOCH}:8,{EPOCH}:4")));
        assert_eq!(
            (
                c.recovered,
                c.unrecovered,
                c.replayed,
                c.missed,
                c.reconnected
            ),
            (1, 1, 2, 4, 1)
        );
        assert_eq!((d.replay.len(), d.replay.max()), (1, 2));
        assert_eq!(d.resubscribe.len(), 2, "one per subject");
        // The next polls are live again.
        assert!(hear(&mut d, &mut c, &msg("/p/s3", 9)));
        hear(&mut d, &mut c, &poll_end(&format!("{EPOCH}:9,{EPOCH}:4")));
        assert_eq!((c.replayed, c.recovered, c.reconnected), (2, 1, 1));
        assert_eq!((c.duplicates, c.gaps, c.broken), (0, 0, 0));
    }

    #[test]
    fn losses_duplicates_and_strays_are_counted() {
        let mut d = driver();
        let mut c = Counters::default();
        opening(&mut d, 7);
        hear(&mut d, &mut c, &subscribed("/p/s3", 0, None));
        hear(&mut d, &mut c, &subscribed("/p/s1", 0, None));
        assert!(hear(&mut d, &mut c, &msg("/p/s3", 1)));
        assert!(hear(&mut d, &mut c, &msg("/p/s3", 1)));
        assert!(hear(&mut d, &mut c, &msg("/p/s3", 4)));
        assert!(hear(&mut d, &mut c, &msg("/p/s2", 1)), "not its subject");
        assert_eq!((c.duplicates, c.gaps, c.missed, c.broken), (1, 1, 2, 1));
        d.subs[0].key = None;
        opening(&mut d, 8);
        hear(&mut d, &mut c, &subscribed("/p/s3", 10, Some(false)));
        hear(
            &mut d,
            &mut c,
            &subscribed("/p/s1", 3, Some(false)).replace(EPOCH, "00000000000000cd"),
        );
        assert_eq!((c.unrecovered, c.missed, c.broken), (2, 2 + 6, 2));
        assert_eq!(c.reconnected, 0, "not a timed reconnect");
        let unasked = subscribed("/p/s2", 1, None);
        for other in [
            encode_ok(1).as_str(),
            encode_pong(Some(2)).as_str(),
            encode_error(Some(1), ErrorCode::InvalidPosition, "x").as_str(),
            "not json",
            unasked.as_str(),
        ] {
            assert!(!hear(&mut d, &mut c, other), "{other}");
        }
        assert_eq!(c.recovered + c.unrecovered, 2, "nothing else counted");
    }

    #[test]
    fn a_connection_failing_in_set_up_owes_nothing_more() {
        let mut d = driver();
        opening(&mut d, 7);
        assert_eq!(d.inner.unsettled(), 1);
        let mut c = Counters::default();
        d.on_closed(7, 10, Ending::Failed(Failure::Timeout), false, &mut c);
        assert_eq!((d.inner.unsettled(), d.subs[0].key), (0, None));
        // An old connection's end, after it was replaced, changes nothing.
        opening(&mut d, 9);
        d.on_closed(7, 10, Ending::Clean, true, &mut c);
        assert_eq!((d.inner.unsettled(), d.subs[0].key), (1, Some(9)));
    }

    #[test]
    fn a_subscriber_whose_node_is_gone_fails_over_to_the_next_and_resumes() {
        let (mut d, _, mut c) = settled_on_two_nodes();
        assert!(hear(&mut d, &mut c, &msg("/p/s3", 6)));
        assert_eq!(d.inner.hop(10), 0, "on its first node");
        // Its node dies: the connection ends without the bench closing it.
        d.on_closed(7, 10, Ending::Failed(Failure::ServerClosed), true, &mut c);
        assert_eq!((c.failovers, d.inner.hop(10)), (1, 1), "on to the next");
        assert_eq!(d.inner.unsettled(), 0);
        // A refused connect on its way back is the same failover going on.
        d.on_closed(8, 10, Ending::Failed(Failure::Refused), false, &mut c);
        assert_eq!((c.failovers, d.inner.hop(10)), (1, 2));
        // Back on a node, from where it was.
        assert_eq!(opening(&mut d, 9), [since("/p/s3", 6), since("/p/s1", 0),]);
        hear(&mut d, &mut c, &subscribed("/p/s3", 8, Some(true)));
        assert_eq!(c.failed_over, 0, "one subject still unanswered");
        assert!(hear(&mut d, &mut c, &msg("/p/s3", 7)), "replayed");
        hear(&mut d, &mut c, &subscribed("/p/s1", 0, Some(true)));
        assert!(hear(&mut d, &mut c, &msg("/p/s3", 8)), "replayed");
        assert_eq!((c.failovers, c.failed_over, c.recovered), (1, 1, 2));
        assert_eq!((c.reconnects, c.reconnected), (0, 0), "none planned");
        assert_eq!((c.duplicates, c.gaps, c.missed, c.broken), (0, 0, 0, 0));
    }

    #[test]
    fn a_planned_reconnect_goes_to_another_node() {
        let (mut d, mut reactor, mut c) = settled_on_two_nodes();
        // Its turn (and subscriber 11's, which never set up) fall due.
        d.reconnect_due(&mut reactor, 0, 1_000_000_000);
        assert_eq!(reactor.cx.counters.reconnects, 1);
        assert_eq!(d.inner.hop(10), 1, "it comes back on the other node");
        // The connection it closed ends; that is not a failover.
        d.on_closed(7, 10, Ending::Clean, true, &mut c);
        assert_eq!(c.failovers, 0);
    }
}
