//! The tally contract's one test suite (tally.rs, clauses 1 to 5), run
//! unchanged against the memory tally here and the Redis tally in
//! `engine::redis::lifecycle`: each test gets a [`Rig`] that makes node
//! handles on one shared world and lets time pass.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{MemoryTally, Tally, Up};
use crate::hooks::event::Key;

/// A world to run the suite in.
pub(crate) trait Rig {
    /// A handle of node `node` on the rig's world.
    fn node(&self, node: &str) -> Box<dyn Tally>;
    /// The lease every handle keeps.
    fn lease(&self) -> Duration;
    /// Lets `span` pass on the world's clock.
    fn pass(&self, span: Duration);
}

/// A node's handle that numbers its `up` and `down` calls, as the stage
/// does.
struct Caller {
    tally: Box<dyn Tally>,
    calls: u64,
}

/// Node `node`'s handle on `rig`'s world.
fn caller(rig: &dyn Rig, node: &str) -> Caller {
    Caller {
        tally: rig.node(node),
        calls: 0,
    }
}

impl Caller {
    fn up(&mut self, key: &Key) -> Result<Up, super::TallyError> {
        self.calls += 1;
        self.tally.up(key, self.calls)
    }

    fn down(&mut self, key: &Key) -> Result<Option<String>, super::TallyError> {
        self.calls += 1;
        self.tally.down(key, self.calls)
    }

    /// The last call made again, as after a lost reply.
    fn again_up(&mut self, key: &Key) -> Result<Up, super::TallyError> {
        self.tally.up(key, self.calls)
    }

    fn again_down(&mut self, key: &Key) -> Result<Option<String>, super::TallyError> {
        self.tally.down(key, self.calls)
    }

    fn confirm(&mut self, key: &Key, generation: &str) -> Result<bool, super::TallyError> {
        self.tally.confirm(key, generation)
    }

    fn renew(&mut self) -> Result<super::Renewed, super::TallyError> {
        self.tally.renew()
    }
}

fn user(name: &str) -> Key {
    Key::User(name.to_owned())
}

/// Clauses 1 to 3: one up and one let-go for the cluster, however many
/// nodes hold the key between.
pub(crate) fn first_up_and_last_down_once(rig: &dyn Rig) {
    let (mut a, mut b) = (caller(rig, "a"), caller(rig, "b"));
    let ann = user("ann");
    assert_eq!(a.up(&ann).unwrap(), Up::First);
    assert_eq!(b.up(&ann).unwrap(), Up::Held);
    assert_eq!(a.down(&ann).unwrap(), None, "b still holds ann");
    let generation = b.down(&ann).unwrap().expect("the last node let go");
    assert!(b.confirm(&ann, &generation).unwrap());
    assert_eq!(a.up(&ann).unwrap(), Up::First, "a new life");
}

/// Clauses 1 and 3: a return on another node cancels the pending let-go;
/// a later let-go has a new generation, and only it confirms.
pub(crate) fn a_return_anywhere_cancels_the_pending_let_go(rig: &dyn Rig) {
    let (mut a, mut b) = (caller(rig, "a"), caller(rig, "b"));
    let room = Key::Subject("room".to_owned());
    assert_eq!(a.up(&room).unwrap(), Up::First);
    let first = a.down(&room).unwrap().expect("pending");
    assert_eq!(b.up(&room).unwrap(), Up::Returned);
    assert!(!a.confirm(&room, &first).unwrap(), "cancelled");
    let second = b.down(&room).unwrap().expect("pending again");
    assert_ne!(first, second);
    assert!(!b.confirm(&room, &first).unwrap(), "the old generation");
    assert!(b.confirm(&room, &second).unwrap());
    // A user and a subject of one name are two keys.
    assert_eq!(a.up(&user("room")).unwrap(), Up::First);
    assert_eq!(a.up(&room).unwrap(), Up::First);
}

/// Clauses 1 and 2: a node holds a key or not: a node that never held a
/// key letting go of it starts nothing, and an up made again (a retried
/// call, a lost lease) is no change.
pub(crate) fn a_node_holds_a_key_or_not(rig: &dyn Rig) {
    let (mut a, mut b) = (caller(rig, "a"), caller(rig, "b"));
    let bob = user("bob");
    assert_eq!(a.down(&bob).unwrap(), None);
    assert_eq!(a.up(&bob).unwrap(), Up::First);
    assert_eq!(a.up(&bob).unwrap(), Up::Held, "made again");
    assert_eq!(b.down(&bob).unwrap(), None, "b never held bob");
    assert!(a.down(&bob).unwrap().is_some(), "one down lets go");
}

/// Clause 4: a call made again after its reply was lost answers as it
/// did; a confirm made again too, until the key lives again.
pub(crate) fn a_call_made_again_answers_as_it_did(rig: &dyn Rig) {
    let (mut a, mut b) = (caller(rig, "a"), caller(rig, "b"));
    let gus = user("gus");
    assert_eq!(a.up(&gus).unwrap(), Up::First);
    assert_eq!(a.again_up(&gus).unwrap(), Up::First);
    assert_eq!(b.up(&gus).unwrap(), Up::Held);
    assert_eq!(b.again_up(&gus).unwrap(), Up::Held);
    assert_eq!(a.down(&gus).unwrap(), None);
    assert_eq!(a.again_down(&gus).unwrap(), None);
    let generation = b.down(&gus).unwrap().expect("let go");
    assert_eq!(b.again_down(&gus).unwrap().as_ref(), Some(&generation));
    assert!(b.confirm(&gus, &generation).unwrap());
    assert!(b.confirm(&gus, &generation).unwrap(), "made again");
    // A new life: not a return, and the old let-go confirms no more.
    assert_eq!(a.up(&gus).unwrap(), Up::First);
    assert!(!b.confirm(&gus, &generation).unwrap());
    // A return while pending: made again, it is still a return.
    assert!(a.down(&gus).unwrap().is_some());
    assert_eq!(b.up(&gus).unwrap(), Up::Returned);
    assert_eq!(b.again_up(&gus).unwrap(), Up::Returned);
}

/// Clause 5: a node that stops renewing has its keys let go by a live
/// node's renewal after its lease, each once, and a key another node
/// still holds is not let go.
pub(crate) fn a_dead_nodes_keys_are_let_go_once_after_its_lease(rig: &dyn Rig) {
    let (mut dead, mut b, mut c) = (caller(rig, "dead"), caller(rig, "b"), caller(rig, "c"));
    for t in [&mut dead, &mut b, &mut c] {
        assert!(t.renew().unwrap().emptied.is_empty());
    }
    let (cy, dan, hall) = (user("cy"), user("dan"), Key::Subject("hall".to_owned()));
    assert_eq!(dead.up(&cy).unwrap(), Up::First);
    assert_eq!(dead.up(&hall).unwrap(), Up::First);
    assert_eq!(dead.up(&dan).unwrap(), Up::First);
    assert_eq!(b.up(&dan).unwrap(), Up::Held);
    // Within the lease nothing is let go.
    rig.pass(rig.lease() / 3);
    assert!(b.renew().unwrap().emptied.is_empty());
    assert!(c.renew().unwrap().emptied.is_empty());
    rig.pass(rig.lease() + rig.lease() / 2);
    let mut taken = b.renew().unwrap().emptied;
    taken.extend(c.renew().unwrap().emptied);
    let keys: BTreeSet<String> = taken.iter().map(|(k, _)| super::key_name(k)).collect();
    let expected: BTreeSet<String> = ["u:cy", "s:hall"].map(str::to_owned).into();
    assert_eq!(keys, expected, "each once, dan kept by b");
    assert_eq!(taken.len(), 2);
    for (key, generation) in &taken {
        assert!(b.confirm(key, generation).unwrap());
    }
    assert!(b.renew().unwrap().emptied.is_empty(), "nothing twice");
    assert!(!b.renew().unwrap().lost);
    assert_eq!(c.up(&cy).unwrap(), Up::First);
    assert_eq!(c.up(&dan).unwrap(), Up::Held);
    // Back after all: it learns it was taken for dead, and holds again.
    let back = dead.renew().unwrap();
    assert!(back.lost && back.emptied.is_empty(), "{back:?}");
    assert!(!dead.renew().unwrap().lost);
    assert_eq!(dead.up(&hall).unwrap(), Up::First);
}

/// Clause 5: a node that dies owing a confirm has its pending let-go
/// taken over, once, and a return cancels the taken-over one as well.
pub(crate) fn a_dead_nodes_pending_let_go_is_taken_over(rig: &dyn Rig) {
    let (mut dead, mut b) = (caller(rig, "dead"), caller(rig, "b"));
    assert!(dead.renew().unwrap().emptied.is_empty());
    assert!(b.renew().unwrap().emptied.is_empty());
    let (eve, fay) = (user("eve"), user("fay"));
    for key in [&eve, &fay] {
        assert_eq!(dead.up(key).unwrap(), Up::First);
        assert!(dead.down(key).unwrap().is_some());
    }
    rig.pass(rig.lease() * 2);
    let taken = b.renew().unwrap().emptied;
    let mut keys: Vec<String> = taken.iter().map(|(k, _)| super::key_name(k)).collect();
    keys.sort();
    assert_eq!(keys, ["u:eve", "u:fay"]);
    assert!(b.renew().unwrap().emptied.is_empty(), "once");
    let generation = |name: &str| {
        let found = taken.iter().find(|(k, _)| super::key_name(k) == name);
        found.map(|(_, g)| g.clone()).expect("taken over")
    };
    assert_eq!(b.up(&fay).unwrap(), Up::Returned);
    assert!(!b.confirm(&fay, &generation("u:fay")).unwrap());
    assert!(b.confirm(&eve, &generation("u:eve")).unwrap());
}

/// A world on a clock the test moves.
struct Memory {
    first: MemoryTally,
    now: Arc<AtomicU64>,
}

impl Memory {
    fn new() -> Memory {
        let now = Arc::new(AtomicU64::new(1_000_000));
        let clock = Arc::clone(&now);
        let first = MemoryTally::new(
            "",
            Duration::from_secs(15),
            Arc::new(move || clock.load(Ordering::Relaxed)),
        );
        Memory { first, now }
    }
}

impl Rig for Memory {
    fn node(&self, node: &str) -> Box<dyn Tally> {
        Box::new(self.first.join(node))
    }

    fn lease(&self) -> Duration {
        Duration::from_secs(15)
    }

    fn pass(&self, span: Duration) {
        self.now
            .fetch_add(span.as_millis() as u64, Ordering::Relaxed);
    }
}

/// The suite's tests, one per clause test, each on a new world that
/// `$rig` makes.
macro_rules! tally_suite {
    ($rig:expr) => {
        #[test]
        fn first_up_and_last_down_once() {
            $crate::hooks::tally::suite::first_up_and_last_down_once(&$rig);
        }

        #[test]
        fn a_return_anywhere_cancels_the_pending_let_go() {
            $crate::hooks::tally::suite::a_return_anywhere_cancels_the_pending_let_go(&$rig);
        }

        #[test]
        fn a_call_made_again_answers_as_it_did() {
            $crate::hooks::tally::suite::a_call_made_again_answers_as_it_did(&$rig);
        }

        #[test]
        fn a_node_holds_a_key_or_not() {
            $crate::hooks::tally::suite::a_node_holds_a_key_or_not(&$rig);
        }

        #[test]
        fn a_dead_nodes_keys_are_let_go_once_after_its_lease() {
            $crate::hooks::tally::suite::a_dead_nodes_keys_are_let_go_once_after_its_lease(&$rig);
        }

        #[test]
        fn a_dead_nodes_pending_let_go_is_taken_over() {
            $crate::hooks::tally::suite::a_dead_nodes_pending_let_go_is_taken_over(&$rig);
        }
    };
}
pub(crate) use tally_suite;

mod memory {
    use super::Memory;

    super::tally_suite!(Memory::new());
}
