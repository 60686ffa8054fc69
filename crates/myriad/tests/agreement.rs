//! The subscription bookkeeping agrees with itself: a connection's session,
//! its worker's registry and attaching list, and the hub (through the
//! engine) are driven by random subscribes, unsubscribes, subscribe-then-
//! unsubscribe in one write (the attach answer arrives stale), clean closes
//! and dropped sockets, and must then agree with a plain model on the
//! node's counts, on every publish's `delivered`, and on what each
//! connection receives.

mod common;

use std::collections::BTreeSet;

use common::{recv, Node, Ws};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tungstenite::Message;

const SUBJECTS: [&str; 6] = ["s0", "s1", "s2", "s3", "s4", "s5"];

fn write(ws: &mut Ws, value: Value) {
    ws.write(Message::text(value.to_string())).unwrap();
}

/// Flushes what was written and waits for `answers` replies (`subscribed`
/// or `ok`) and for a ping's pong; returns every other message. Answers that
/// need the engine come after the pong of a ping sent behind them.
fn settle(ws: &mut Ws, answers: usize) -> Vec<Value> {
    write(ws, json!({"op": "ping", "id": 999}));
    ws.flush().unwrap();
    let (mut ponged, mut answered) = (false, 0);
    let mut others = Vec::new();
    while !ponged || answered < answers {
        let msg = recv(ws);
        match msg["op"].as_str() {
            Some("pong") => ponged = true,
            Some("subscribed" | "ok") => answered += 1,
            _ => others.push(msg),
        }
    }
    assert_eq!(answered, answers, "no answer beyond those expected");
    others
}

fn pick(rng: &mut StdRng) -> Vec<&'static str> {
    SUBJECTS
        .iter()
        .copied()
        .filter(|_| rng.gen_bool(0.35))
        .collect()
}

#[test]
fn sessions_registries_and_hub_agree_under_random_churn() {
    let node = Node::start(&["--workers", "2", "--history-size", "0"]);
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let mut conns: Vec<(Ws, BTreeSet<&str>)> =
        (0..24).map(|_| (node.connect(), BTreeSet::new())).collect();
    for _ in 0..400 {
        let i = rng.gen_range(0..conns.len());
        let (ws, held) = &mut conns[i];
        let mut answers = 0;
        match rng.gen_range(0..10) {
            0..=3 => {
                let subjects = pick(&mut rng);
                if !subjects.is_empty() {
                    write(
                        ws,
                        json!({"op": "subscribe", "subjects": subjects, "id": 1}),
                    );
                    let fresh = subjects.iter().filter(|s| !held.contains(*s)).count();
                    // One `subscribed` per new subject, or one `ok` if none was.
                    answers = fresh.max(1);
                    held.extend(subjects);
                }
            }
            4..=5 => {
                let subjects = pick(&mut rng);
                if !subjects.is_empty() {
                    write(
                        ws,
                        json!({"op": "unsubscribe", "subjects": subjects, "id": 2}),
                    );
                    answers = 1;
                    for s in subjects {
                        held.remove(s);
                    }
                }
            }
            6..=7 => {
                // Both in one write: the worker reads the unsubscribe before
                // it takes the engine's answer to the subscribe.
                let subjects = pick(&mut rng);
                let fresh: Vec<&str> = subjects.into_iter().filter(|s| !held.contains(s)).collect();
                if !fresh.is_empty() {
                    write(ws, json!({"op": "subscribe", "subjects": fresh, "id": 3}));
                    write(ws, json!({"op": "unsubscribe", "subjects": fresh, "id": 4}));
                    // The unsubscribe's ok; the cancelled subscribe goes unanswered.
                    answers = 1;
                }
            }
            8 => {
                // Clean close, and a new connection in its place.
                ws.close(None).unwrap();
                let _ = ws.flush();
                conns[i] = (node.connect(), BTreeSet::new());
            }
            _ => {
                // Dropped without a close frame.
                conns[i] = (node.connect(), BTreeSet::new());
            }
        }
        let (ws, _) = &mut conns[i];
        let unexpected = settle(ws, answers);
        assert!(unexpected.is_empty(), "{unexpected:?}");
    }
    let pairs: usize = conns.iter().map(|(_, held)| held.len()).sum();
    let live: BTreeSet<&str> = conns.iter().flat_map(|(_, h)| h.iter().copied()).collect();
    node.wait_for_stats("closed connections to be cleaned up", |s| {
        s["connections"] == conns.len() && s["subscriptions"] == pairs
    });
    assert_eq!(node.stats()["subjects"], live.len(), "hub subjects");
    for (n, subject) in SUBJECTS.iter().enumerate() {
        let want = conns.iter().filter(|(_, h)| h.contains(subject)).count();
        let reply = node.publish(subject, &json!(n));
        assert_eq!(reply["delivered"], want, "{subject}");
    }
    for (ws, held) in &mut conns {
        // Exactly one publication per held subject, and nothing after them.
        // (A ping cannot fence deliveries: its pong may be written first.)
        let got: BTreeSet<String> = (0..held.len())
            .map(|_| {
                let msg = recv(ws);
                assert_eq!(msg["op"], "msg", "{msg}");
                msg["subject"].as_str().unwrap().to_owned()
            })
            .collect();
        let want: BTreeSet<String> = held.iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(got, want);
        let extra = settle(ws, 0);
        assert!(extra.is_empty(), "{extra:?}");
    }
}
