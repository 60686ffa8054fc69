//! The lifecycle stage over memory tallies sharing one world: two nodes'
//! events, a store that fails for a while, and a node taken for dead.

use std::sync::atomic::AtomicBool;

use super::*;
use crate::hooks::tally::{MemoryTally, Renewed, TallyError};

/// A tally whose store can be cut off: every call fails while `cut`.
struct Flaky {
    inner: MemoryTally,
    cut: Arc<AtomicBool>,
}

impl Flaky {
    fn check(&self) -> Result<(), TallyError> {
        if self.cut.load(Ordering::Relaxed) {
            return Err(TallyError("cut off".into()));
        }
        Ok(())
    }
}

impl Tally for Flaky {
    fn up(&mut self, key: &Key, call: u64) -> Result<Up, TallyError> {
        self.check()?;
        self.inner.up(key, call)
    }

    fn down(&mut self, key: &Key, call: u64) -> Result<Option<String>, TallyError> {
        self.check()?;
        self.inner.down(key, call)
    }

    fn confirm(&mut self, key: &Key, generation: &str) -> Result<bool, TallyError> {
        self.check()?;
        self.inner.confirm(key, generation)
    }

    fn renew(&mut self) -> Result<Renewed, TallyError> {
        self.check()?;
        self.inner.renew()
    }
}

const LEASE: Duration = Duration::from_secs(15);

/// One node of a test world.
struct TestNode {
    stage: Stage,
    events: tokio::sync::mpsc::Receiver<Signal>,
    cut: Arc<AtomicBool>,
}

/// Nodes `names` on one memory world whose clock is `now` (ms), each
/// renewing every 20 ms and holding let-gos `delay`.
fn world(names: &[&str], delay: Duration, now: &Arc<AtomicU64>) -> Vec<TestNode> {
    let clock = Arc::clone(now);
    let world = MemoryTally::new("", LEASE, Arc::new(move || clock.load(Ordering::Relaxed)));
    let settings = StageSettings {
        delay,
        renew_every: Duration::from_millis(20),
        capacity: 100,
    };
    names
        .iter()
        .map(|name| {
            let (hooks, events) = Hooks::tap(100);
            let cut = Arc::new(AtomicBool::new(false));
            let tally = Flaky {
                inner: world.join(name),
                cut: Arc::clone(&cut),
            };
            let stage = Stage::start(Box::new(tally), hooks, settings).unwrap();
            TestNode { stage, events, cut }
        })
        .collect()
}

fn next(node: &mut TestNode) -> Signal {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(signal) = node.events.try_recv() {
            return signal;
        }
        assert!(Instant::now() < deadline, "no event");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until `done` holds for `node`'s counts.
fn wait_for(node: &TestNode, done: impl Fn(&StageCounts) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done(node.stage.counts()) {
        assert!(Instant::now() < deadline, "{:?}", node.stage.counts());
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn silent(nodes: &mut [TestNode]) -> bool {
    nodes.iter_mut().all(|n| n.events.try_recv().is_err())
}

fn ann() -> String {
    "ann".to_owned()
}

fn cluster(kind: EventKind, key: &Key) -> Signal {
    Signal::Cluster(kind, key.clone())
}

#[test]
fn a_user_on_two_nodes_is_online_once_and_offline_once_after_the_last() {
    let now = Arc::new(AtomicU64::new(0));
    let mut nodes = world(&["a", "b"], Duration::from_millis(50), &now);
    let user = Key::User(ann());
    nodes[0].stage.signal(Signal::Connected(ann()));
    assert_eq!(next(&mut nodes[0]), cluster(EventKind::Online, &user));
    nodes[1].stage.signal(Signal::Connected(ann()));
    nodes[1].stage.signal(Signal::Connected(ann()));
    nodes[0].stage.signal(Signal::Disconnected(ann()));
    nodes[1].stage.signal(Signal::Disconnected(ann()));
    std::thread::sleep(Duration::from_millis(200));
    assert!(silent(&mut nodes));
    nodes[1].stage.signal(Signal::Disconnected(ann()));
    assert_eq!(next(&mut nodes[1]), cluster(EventKind::Offline, &user));
    assert!(silent(&mut nodes));
}

#[test]
fn a_return_on_another_node_within_the_delay_sends_nothing() {
    let now = Arc::new(AtomicU64::new(0));
    let mut nodes = world(&["a", "b"], Duration::from_millis(300), &now);
    let room = Key::Subject("room".into());
    nodes[0].stage.signal(Signal::Attached("room".into()));
    assert_eq!(next(&mut nodes[0]), cluster(EventKind::Occupied, &room));
    nodes[0].stage.signal(Signal::Detached("room".into()));
    // The return must come after the let-go, not before it.
    wait_for(&nodes[0], |c| c.pending.load(Ordering::Relaxed) == 1);
    nodes[1].stage.signal(Signal::Attached("room".into()));
    std::thread::sleep(Duration::from_millis(600));
    assert!(silent(&mut nodes));
    assert_eq!(nodes[1].stage.counts().cancelled.load(Ordering::Relaxed), 2);
    nodes[1].stage.signal(Signal::Detached("room".into()));
    assert_eq!(next(&mut nodes[1]), cluster(EventKind::Vacated, &room));
}

#[test]
fn calls_that_fail_are_made_again_in_order_once_the_store_is_back() {
    let now = Arc::new(AtomicU64::new(0));
    let mut nodes = world(&["a"], Duration::from_millis(20), &now);
    let user = Key::User(ann());
    nodes[0].cut.store(true, Ordering::Relaxed);
    nodes[0].stage.signal(Signal::Connected(ann()));
    nodes[0].stage.signal(Signal::Disconnected(ann()));
    wait_for(&nodes[0], |c| c.retrying.load(Ordering::Relaxed) == 2);
    assert!(silent(&mut nodes));
    nodes[0].cut.store(false, Ordering::Relaxed);
    assert_eq!(next(&mut nodes[0]), cluster(EventKind::Online, &user));
    assert_eq!(next(&mut nodes[0]), cluster(EventKind::Offline, &user));
    assert!(nodes[0].stage.counts().failures.load(Ordering::Relaxed) >= 1);
}

#[test]
fn a_node_taken_for_dead_holds_its_keys_again_when_it_is_back() {
    let now = Arc::new(AtomicU64::new(0));
    let mut nodes = world(&["a", "b"], Duration::from_millis(20), &now);
    let user = Key::User(ann());
    nodes[0].stage.signal(Signal::Connected(ann()));
    assert_eq!(next(&mut nodes[0]), cluster(EventKind::Online, &user));
    // a is cut off past its lease: b takes ann and sends her offline.
    nodes[0].cut.store(true, Ordering::Relaxed);
    wait_for(&nodes[0], |c| c.failures.load(Ordering::Relaxed) > 0);
    now.fetch_add(2 * LEASE.as_millis() as u64, Ordering::Relaxed);
    assert_eq!(next(&mut nodes[1]), cluster(EventKind::Offline, &user));
    assert_eq!(nodes[1].stage.counts().swept.load(Ordering::Relaxed), 1);
    // Back: ann is still connected to a, so a sends her online again.
    nodes[0].cut.store(false, Ordering::Relaxed);
    assert_eq!(next(&mut nodes[0]), cluster(EventKind::Online, &user));
    assert!(silent(&mut nodes));
    // And her last connection closing is her offline, once.
    nodes[0].stage.signal(Signal::Disconnected(ann()));
    assert_eq!(next(&mut nodes[0]), cluster(EventKind::Offline, &user));
}
