//! What the subscription core reports to the lifecycle hooks: a subject's
//! first subscriber on the worker (`Attached`) and its last gone
//! (`Detached`), counted by the same test either way, so that every
//! attach, whether it goes live, is refused (a presence subject at its
//! cap) or is dropped while its answer is on the way, leaves the two
//! balanced, and they agree with the engine's own route.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::{names, step, Harness, Step, CONNS, SUBJECTS};
use crate::config::Config;
use crate::hooks::Signal;
use crate::namespace::Namespace;

/// Every subject a presence subject of at most two members, so that some
/// attaches are refused and go through the failed-subscription path.
fn capped_node() -> Config {
    let mut config = super::quiet_node();
    config.namespace.push(Namespace {
        prefix: "s".to_owned(),
        presence: Some(true),
        presence_max_members: Some(2),
        ..Namespace::default()
    });
    config
}

/// Applies the signals reported so far to `attached` (subject → attached
/// on the worker), failing on an `Attached` of an attached subject or a
/// `Detached` of a detached one; returns how many there were.
fn take_signals(
    signals: &mut tokio::sync::mpsc::Receiver<Signal>,
    attached: &mut BTreeMap<String, bool>,
) -> Result<usize, TestCaseError> {
    let mut taken = 0;
    while let Ok(signal) = signals.try_recv() {
        taken += 1;
        match signal {
            Signal::Attached(s) => {
                let was = attached.insert(s.clone(), true).unwrap_or(false);
                prop_assert!(!was, "{s} attached twice");
            }
            Signal::Detached(s) => {
                let was = attached.insert(s.clone(), false).unwrap_or(false);
                prop_assert!(was, "{s} detached without an attach");
            }
            other => prop_assert!(false, "unexpected {other:?}"),
        }
    }
    Ok(taken)
}

/// After a step: each subject is attached by the signals exactly while a
/// connection here holds it, live or attaching, and the engine routes as
/// many subjects as the signals say are attached.
fn agrees(h: &Harness, attached: &BTreeMap<String, bool>) -> Result<(), TestCaseError> {
    for subject in SUBJECTS {
        let signalled = attached.get(subject).copied().unwrap_or(false);
        prop_assert_eq!(signalled, h.sessions.held_here(subject), "{}", subject);
    }
    let routed = attached.values().filter(|&&a| a).count() as u64;
    prop_assert_eq!(h.shared.engine.stats().subjects, routed);
    Ok(())
}

#[test]
fn a_refused_attach_and_a_stale_answer_each_leave_the_signals_balanced() {
    let (mut h, mut signals) = Harness::tapped(capped_node());
    let mut attached = BTreeMap::new();
    for id in 0..4 {
        h.open(id);
    }
    let subscribe = |id: u32| serde_json::json!({"op": "subscribe", "subjects": ["s0"], "id": id});
    for id in 0..3 {
        h.command(id, &subscribe(id));
    }
    h.pump();
    // The third is over the cap: refused, and still one `Attached`.
    assert_eq!(h.got(2, "error").len(), 1, "{:?}", h.lines.line(2).got);
    assert_eq!(take_signals(&mut signals, &mut attached).unwrap(), 1);
    // Subscribed and gone before the answer: its stale answer changes nothing.
    h.command(
        3,
        &serde_json::json!({"op": "subscribe", "subjects": ["s1"]}),
    );
    h.close(3);
    h.pump();
    assert_eq!(take_signals(&mut signals, &mut attached).unwrap(), 2);
    h.close(0);
    assert_eq!(take_signals(&mut signals, &mut attached).unwrap(), 0);
    h.close(1);
    assert_eq!(take_signals(&mut signals, &mut attached).unwrap(), 1);
    assert_eq!(attached.values().filter(|&&a| a).count(), 0);
    agrees(&h, &attached).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Under random subscribes, unsubscribes, churn before the answer,
    /// closes and refusals at the cap, the signals alternate per subject,
    /// agree with what the worker holds and with the engine's route after
    /// every step, and end balanced once every connection is gone.
    #[test]
    fn attached_and_detached_stay_balanced_under_random_churn(
        steps in proptest::collection::vec(step(), 1..60)
    ) {
        let (mut h, mut signals) = Harness::tapped(capped_node());
        let mut attached = BTreeMap::new();
        for id in 0..CONNS {
            h.open(id);
        }
        for step in steps {
            match step {
                Step::Subscribe(id, picked) => {
                    let subjects = names(&picked);
                    h.command(id, &serde_json::json!({"op": "subscribe", "subjects": subjects, "id": 1}));
                }
                Step::Unsubscribe(id, picked) => {
                    let subjects = names(&picked);
                    h.command(id, &serde_json::json!({"op": "unsubscribe", "subjects": subjects, "id": 2}));
                }
                Step::Churn(id, s) => {
                    let subject = SUBJECTS[s];
                    h.command(id, &serde_json::json!({"op": "subscribe", "subjects": [subject]}));
                    h.command(id, &serde_json::json!({"op": "unsubscribe", "subjects": [subject]}));
                }
                Step::Reopen(id) => {
                    h.close(id);
                    h.open(id);
                }
                Step::Pump | Step::Publish(_) => h.pump(),
            }
            take_signals(&mut signals, &mut attached)?;
            agrees(&h, &attached)?;
        }
        for id in 0..CONNS {
            h.close(id);
        }
        h.pump();
        take_signals(&mut signals, &mut attached)?;
        agrees(&h, &attached)?;
        prop_assert!(attached.values().all(|&a| !a), "{:?}", attached);
    }
}
