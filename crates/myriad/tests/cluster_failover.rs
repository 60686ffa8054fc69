//! A node of the cluster is killed with `kill -9` under a `myriad sub`
//! given both nodes' URLs: the subscriber reconnects to the other node,
//! resumes from Redis history with `since`, and its output holds every
//! publication exactly once, in order, as if nothing had happened.

mod common;

use common::{Node, SubProcess};
use myriad_testkit::RedisServer;
use serde_json::json;

/// Publications before the kill, while the subscriber cannot hear (only
/// history can give them to it), and in all.
const BEFORE: u64 = 60;
const UNHEARD: u64 = 90;
const ALL: u64 = 120;

#[test]
fn myriad_sub_fails_over_to_another_node_and_prints_every_message_once_in_order() {
    let redis = RedisServer::start();
    let mut a = Node::in_cluster(&redis, "kill");
    let b = Node::in_cluster(&redis, "kill");
    let (url_a, url_b) = (a.url("/ws"), b.url("/ws"));
    // Node A first, so that is where it connects; the comma form of the
    // list.
    let sub = SubProcess::spawn(&[
        "feed",
        "--count",
        &ALL.to_string(),
        "--url",
        &format!("{url_a},{url_b}"),
    ]);
    assert_eq!(sub.next_note(), "subscribed to feed at offset 0");
    assert_eq!(a.stats()["connections"], 1, "it is on node A");
    assert_eq!(b.stats()["connections"], 0);
    let offset = |msg: serde_json::Value| {
        assert_eq!(msg["data"], msg["offset"], "{msg}");
        msg["offset"].as_u64().unwrap()
    };
    for n in 1..=BEFORE {
        b.publish("feed", &json!(n));
    }
    // Half of them printed; the rest may still be on their way.
    let mut seen: Vec<u64> = (0..BEFORE / 2)
        .map(|_| offset(sub.next_delivery()))
        .collect();
    // Node A dies while the subscriber is stopped, and the next
    // publications go on through node B: it can get those only by
    // recovering them from Redis history, wherever it reconnects.
    sub.pause();
    a.kill_9();
    for n in BEFORE + 1..=UNHEARD {
        b.publish("feed", &json!(n));
    }
    sub.resume();
    // And on, while it finds its way to node B.
    for n in UNHEARD + 1..=ALL {
        b.publish("feed", &json!(n));
    }
    seen.extend((seen.len() as u64..ALL).map(|_| offset(sub.next_delivery())));
    // History holds 100 a subject and the subscriber was at least at 30:
    // everything it missed is within reach, so nothing may be missing.
    assert_eq!(seen, (1..=ALL).collect::<Vec<u64>>());
    let (status, notes) = sub.finish();
    assert!(status.success(), "{notes}");
    assert!(
        notes.contains(&format!("; trying {url_b} in 0ns")),
        "straight to node B: {notes}"
    );
    assert_eq!(
        notes.matches("resumed feed: nothing lost").count(),
        1,
        "{notes}"
    );
    assert!(!notes.contains("could NOT"), "{notes}");
    // Replayed and live deliveries each follow the one before.
    assert!(!notes.contains("warning"), "{notes}");
}
