//! The subscription core without sockets: the real memory engine, hub and
//! keeper around a [`Sessions`], a [`Wire`] made of plain vectors, and the
//! mailbox pumped by hand, so that attach answers can be held back past an
//! unsubscribe or a close (and the slot's reuse) and arrive stale.
//!
//! The property test is `tests/agreement.rs`'s model, run here in
//! milliseconds per case: after random subscribes, unsubscribes, closes
//! and publishes, each connection has received exactly the publications of
//! the subjects the model says it held, once each and in order, and the
//! core's counts agree with the model.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;

use bytes::Bytes;
use crossbeam_channel::Receiver;
use myriad_graph::{DataDir, SqliteStore, StoreOptions};
use proptest::prelude::*;
use serde_json::Value;

use super::{Sessions, Wire};
use crate::auth::Auth;
use crate::config::Config;
use crate::engine::MemoryEngine;
use crate::feeds::Keeper;
use crate::hooks::{Hooks, Signal};
use crate::hub::{Event, Hub};
use crate::metrics::Metrics;
use crate::peers::{PeerCounts, TokenFailures};
use crate::registry::ConnId;
use crate::shared::Shared;
use crate::transport::TransportKind;

/// One connection as the test's wire sees it.
struct Line {
    kind: TransportKind,
    open: bool,
    /// Every message queued for it, decoded from its WebSocket frame.
    got: Vec<Value>,
}

/// A [`Wire`] over plain vectors: WebSocket connections whose frames are
/// decoded as they are queued.
#[derive(Default)]
struct Lines(HashMap<ConnId, Line>);

impl Lines {
    fn line(&self, id: ConnId) -> &Line {
        &self.0[&id]
    }

    fn push(&mut self, id: ConnId, bytes: &Bytes) {
        let line = self.0.get_mut(&id).expect("a connection the test opened");
        assert!(line.open, "bytes queued for a closed connection {id}");
        line.got.push(text_frame(bytes));
    }
}

/// The JSON in an unmasked WebSocket text frame (RFC 6455 §5.2).
fn text_frame(frame: &[u8]) -> Value {
    assert_eq!(frame[0], 0x81, "a final text frame");
    let (len, at) = match frame[1] {
        126 => (usize::from(u16::from_be_bytes([frame[2], frame[3]])), 4),
        127 => (
            usize::try_from(u64::from_be_bytes(frame[2..10].try_into().unwrap())).unwrap(),
            10,
        ),
        n => (usize::from(n), 2),
    };
    assert_eq!(frame.len(), at + len, "one whole frame");
    serde_json::from_slice(&frame[at..]).unwrap()
}

impl Wire for Lines {
    fn transport(&self, id: ConnId) -> TransportKind {
        self.line(id).kind
    }

    fn open_transport(&self, id: ConnId) -> Option<TransportKind> {
        self.0.get(&id).filter(|l| l.open).map(|l| l.kind)
    }

    fn pending_bytes(&self, _id: ConnId) -> usize {
        0
    }

    fn reply(&mut self, id: ConnId, bytes: Bytes) {
        self.push(id, &bytes);
    }

    fn message(&mut self, id: ConnId, bytes: Bytes) {
        self.push(id, &bytes);
    }

    fn send(&mut self, id: ConnId, bytes: Bytes) {
        self.push(id, &bytes);
    }

    fn deliver(&mut self, id: ConnId, kind: TransportKind, bytes: Bytes, more: Option<Bytes>) {
        assert_eq!(kind, self.line(id).kind);
        assert!(
            more.is_none(),
            "a WebSocket sends nothing after a publication"
        );
        self.push(id, &bytes);
    }

    fn settled(&mut self, _id: ConnId, _replayed: bool) {}
}

/// A core of worker 0 on a node of one worker, with the real memory
/// engine and keeper, and the mailbox it would read.
struct Harness {
    sessions: Sessions,
    lines: Lines,
    mailbox: Receiver<Event>,
    shared: Arc<Shared>,
    // Kept for the waker the hub holds, and the keeper's data directory.
    _poll: mio::Poll,
    _dir: tempfile::TempDir,
}

impl Harness {
    fn new(config: Config) -> Harness {
        Harness::with_hooks(config, None)
    }

    /// A harness whose lifecycle signals land in the returned receiver.
    fn tapped(config: Config) -> (Harness, tokio::sync::mpsc::Receiver<Signal>) {
        let (hooks, signals) = Hooks::tap(100_000);
        (Harness::with_hooks(config, Some(hooks)), signals)
    }

    fn with_hooks(config: Config, hooks: Option<Hooks>) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let poll = mio::Poll::new().unwrap();
        let waker = mio::Waker::new(poll.registry(), mio::Token(0)).unwrap();
        let (hub, mut mailboxes) = Hub::new(vec![waker], config.mailbox_high_water);
        let data = DataDir::lock(dir.path()).unwrap();
        let options = StoreOptions {
            max_following: config.max_following,
            cache_bytes: 1 << 20,
        };
        let store = SqliteStore::open(&data.graph_file(), options).unwrap();
        let feeds = Keeper::start(
            Some(data),
            Box::new(store),
            None,
            Arc::clone(&hub),
            config.max_following,
        )
        .unwrap();
        let engine = MemoryEngine::new(
            Arc::clone(&hub),
            config.namespaces(),
            config.history_max_bytes,
        );
        let shared = Arc::new(Shared {
            auth: Auth::from_config(&config).unwrap(),
            presence: config.presence_policies(),
            peers: PeerCounts::default(),
            token_failures: TokenFailures::new(config.token_failures_per_ip),
            feeds,
            engine: Arc::new(engine),
            hub,
            metrics: Arc::new(Metrics::new(1)),
            connections: AtomicUsize::new(0),
            refusing: AtomicUsize::new(0),
            max_connections: 1_000,
            shutting_down: AtomicBool::new(false),
            tls: None,
            config,
            baseline_rss_bytes: 0,
            proxy: None,
            hooks,
            lifecycle: None,
        });
        Harness {
            sessions: Sessions::new(0, Arc::clone(&shared)),
            lines: Lines::default(),
            mailbox: mailboxes.remove(0),
            shared,
            _poll: poll,
            _dir: dir,
        }
    }

    fn open(&mut self, id: ConnId) {
        self.sessions.opened(id);
        let line = Line {
            kind: TransportKind::WebSocket,
            open: true,
            got: Vec::new(),
        };
        self.lines.0.insert(id, line);
    }

    fn close(&mut self, id: ConnId) {
        self.lines.0.get_mut(&id).unwrap().open = false;
        self.sessions.closed(id);
        self.shared.hub.wake(self.sessions.take_wakeups());
    }

    fn command(&mut self, id: ConnId, command: &Value) {
        let text = command.to_string();
        self.sessions.on_command(id, &text, &mut self.lines);
        self.shared.hub.wake(self.sessions.take_wakeups());
    }

    /// Hands the core every event waiting in its mailbox, as the worker's
    /// turn would.
    fn pump(&mut self) {
        while let Ok(event) = self.mailbox.try_recv() {
            let (s, out) = (&mut self.sessions, &mut self.lines);
            match event {
                Event::Publication(p) => s.deliver(&p, out),
                Event::Attached(a) => s.on_attached(*a, out),
                Event::Answer(a) => s.on_answer(*a, out),
                Event::Feeds(f) => s.on_feed_change(*f, out),
                Event::Broken(b) => s.on_stream_broken(&b, out),
                Event::Presence(c) => s.on_presence_change(&c, out),
                Event::Proxied(p) => s.on_proxied(*p, out),
            }
        }
        self.sessions.hand_out_cursors(&mut self.lines);
        self.shared.hub.wake(self.sessions.take_wakeups());
    }

    /// Messages `id` got with this `op`.
    fn got(&self, id: ConnId, op: &str) -> Vec<&Value> {
        let line = self.lines.line(id);
        line.got.iter().filter(|m| m["op"] == op).collect()
    }
}

#[test]
fn a_session_costs_its_slot_40_bytes() {
    // One per slab slot, open or not: see conn.rs for the rest of what a
    // connection costs, and docs/benchmarks.md before growing it.
    let size = std::mem::size_of::<crate::session::Session>();
    assert!(size <= 40, "Session is {size} bytes");
}

fn quiet_node() -> Config {
    Config {
        history_size: 0,
        ..Config::default()
    }
}

#[test]
fn a_subscription_goes_live_at_its_answer_and_ends_with_the_connection() {
    let mut h = Harness::new(quiet_node());
    h.open(0);
    h.open(1);
    let subscribe = serde_json::json!({"op": "subscribe", "subjects": ["a"], "id": 1});
    h.command(1, &subscribe);
    // Not yet live: the attach answer is still in the mailbox.
    assert_eq!(h.sessions.registry.subscription_count(), 0);
    assert!(h.sessions.attaching_any(1));
    h.pump();
    assert_eq!(h.got(1, "subscribed").len(), 1);
    assert_eq!(h.sessions.registry.subscription_count(), 1);
    assert!(!h.sessions.attaching_any(1));

    let publish = serde_json::json!({"op": "publish", "subject": "a", "data": 7, "id": 2});
    h.command(0, &publish);
    h.pump();
    let published = h.got(0, "ok");
    assert_eq!(published.len(), 1, "{:?}", h.lines.line(0).got);
    assert_eq!(published[0]["reached"], 1);
    let delivered = h.got(1, "msg");
    assert_eq!(delivered.len(), 1, "{:?}", h.lines.line(1).got);
    assert_eq!(h.sessions.answers_owed(), 0);

    h.close(1);
    assert_eq!(h.sessions.registry.subscription_count(), 0);
    assert_eq!(h.shared.metrics.worker(0).subscriptions.get(), 0);
    h.command(0, &publish);
    h.pump();
    assert_eq!(h.got(0, "ok")[1]["reached"], 0);
}

#[test]
fn an_answer_for_a_closed_connection_never_reaches_the_next_one_in_its_slot() {
    let mut h = Harness::new(quiet_node());
    h.open(0);
    h.command(
        0,
        &serde_json::json!({"op": "subscribe", "subjects": ["a"], "id": 1}),
    );
    // Closed and reopened before the attach answer comes back.
    h.close(0);
    h.open(0);
    h.pump();
    assert!(h.lines.line(0).got.is_empty(), "{:?}", h.lines.line(0).got);
    assert_eq!(h.sessions.registry.subscription_count(), 0);
    assert_eq!(h.shared.metrics.worker(0).subscriptions.get(), 0);
}

/// One step of the property test.
#[derive(Debug, Clone)]
enum Step {
    Subscribe(ConnId, Vec<usize>),
    Unsubscribe(ConnId, Vec<usize>),
    /// Subscribe and unsubscribe before the answer arrives.
    Churn(ConnId, usize),
    /// Close and open a new connection in the same slot.
    Reopen(ConnId),
    /// Hand the core what its mailbox holds.
    Pump,
    Publish(usize),
}

const CONNS: ConnId = 5;
const SUBJECTS: [&str; 4] = ["s0", "s1", "s2", "s3"];

fn subjects() -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(0..SUBJECTS.len(), 1..3)
}

fn step() -> impl Strategy<Value = Step> {
    // Connection 0 publishes; 1.. subscribe.
    let conn = 1..CONNS;
    prop_oneof![
        3 => (conn.clone(), subjects()).prop_map(|(c, s)| Step::Subscribe(c, s)),
        2 => (conn.clone(), subjects()).prop_map(|(c, s)| Step::Unsubscribe(c, s)),
        1 => (conn.clone(), 0..SUBJECTS.len()).prop_map(|(c, s)| Step::Churn(c, s)),
        1 => conn.prop_map(Step::Reopen),
        2 => Just(Step::Pump),
        2 => (0..SUBJECTS.len()).prop_map(Step::Publish),
    ]
}

fn names(picked: &[usize]) -> Vec<&'static str> {
    picked.iter().map(|&i| SUBJECTS[i]).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn the_core_agrees_with_a_model_under_random_churn(
        steps in proptest::collection::vec(step(), 1..60)
    ) {
        let mut h = Harness::new(quiet_node());
        for id in 0..CONNS {
            h.open(id);
        }
        // What each connection holds, and each one's expected publications
        // (subject, data), in order.
        let mut held: BTreeMap<ConnId, BTreeSet<&str>> = BTreeMap::new();
        let mut expected: BTreeMap<ConnId, Vec<(String, u64)>> = BTreeMap::new();
        let mut received: BTreeMap<ConnId, Vec<(String, u64)>> = BTreeMap::new();
        let mut sequence = 0u64;
        let collect = |h: &mut Harness, id: ConnId, into: &mut BTreeMap<ConnId, Vec<(String, u64)>>| {
            let line = h.lines.0.get_mut(&id).unwrap();
            for m in line.got.drain(..) {
                if let (Some(subject), Some(data)) = (m["subject"].as_str(), m["data"].as_u64()) {
                    if m["op"] == "msg" {
                        into.entry(id).or_default().push((subject.to_owned(), data));
                    }
                }
            }
        };
        for step in steps {
            match step {
                Step::Subscribe(id, picked) => {
                    let subjects = names(&picked);
                    h.command(id, &serde_json::json!({"op": "subscribe", "subjects": subjects, "id": 1}));
                    held.entry(id).or_default().extend(subjects);
                }
                Step::Unsubscribe(id, picked) => {
                    let subjects = names(&picked);
                    h.command(id, &serde_json::json!({"op": "unsubscribe", "subjects": subjects, "id": 2}));
                    let mine = held.entry(id).or_default();
                    for s in subjects {
                        mine.remove(s);
                    }
                }
                Step::Churn(id, s) => {
                    let subject = SUBJECTS[s];
                    if !held.entry(id).or_default().contains(subject) {
                        h.command(id, &serde_json::json!({"op": "subscribe", "subjects": [subject]}));
                        h.command(id, &serde_json::json!({"op": "unsubscribe", "subjects": [subject]}));
                    }
                }
                Step::Reopen(id) => {
                    collect(&mut h, id, &mut received);
                    h.close(id);
                    h.open(id);
                    held.remove(&id);
                }
                Step::Pump => h.pump(),
                Step::Publish(s) => {
                    // Every attach answered first, as a client's settle does.
                    h.pump();
                    sequence += 1;
                    let subject = SUBJECTS[s];
                    h.command(0, &serde_json::json!({"op": "publish", "subject": subject, "data": sequence, "id": 3}));
                    h.pump();
                    let holders: Vec<ConnId> = held
                        .iter()
                        .filter(|(_, subjects)| subjects.contains(subject))
                        .map(|(&id, _)| id)
                        .collect();
                    let published = h.got(0, "ok");
                    let last = published.last().expect("an answer to every publish");
                    prop_assert_eq!(last["reached"].as_u64(), Some(holders.len() as u64));
                    for id in holders {
                        expected.entry(id).or_default().push((subject.to_owned(), sequence));
                    }
                }
            }
        }
        h.pump();
        for id in 1..CONNS {
            collect(&mut h, id, &mut received);
        }
        prop_assert_eq!(&received, &expected);
        let total: usize = held.values().map(BTreeSet::len).sum();
        prop_assert_eq!(h.sessions.registry.subscription_count(), total);
        prop_assert_eq!(h.shared.metrics.worker(0).subscriptions.get(), total as i64);
        for id in 1..CONNS {
            let session = h.sessions.session(id);
            let mut own: Vec<&str> = session.subscriptions.iter().map(|s| &**s).collect();
            own.sort_unstable();
            let model: Vec<&str> = held.get(&id).map_or(Vec::new(), |s| s.iter().copied().collect());
            prop_assert_eq!(own, model);
            prop_assert!(!h.sessions.attaching_any(id));
        }
        prop_assert_eq!(h.sessions.answers_owed(), 0);
    }
}

mod hooks;
