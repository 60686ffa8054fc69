//! Presence per subject against the real binary: members join with their
//! subscribe and leave with their unsubscribe or close; `presence` and
//! `presence_stats` over WebSocket, `POST /cmd` and the admin API agree;
//! the cap refuses the subscribe over it with `presence_full`, counted;
//! over Redis, two nodes see one member list, and the members of a node
//! killed with `kill -9` vanish within its `presence_lease`; with
//! `join_leave`, subscribers get joins and leaves in order, and the
//! documented "snapshot then diffs" recipe leaves no gap across churn and a
//! reconnect.

mod common;

use std::time::{Duration, Instant};

use common::{http, recv, send, subscribe, wait_until, Node, Ws};
use myriad_testkit::RedisServer;
use serde_json::{json, Value};

/// A config file whose `room.` subjects keep presence, at most `cap`
/// members each, and whose `live.` subjects keep it with join/leave events.
fn presence_config(cap: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[[namespace]]\nprefix = \"room.\"\npresence = true\npresence_max_members = {cap}\n\
         [[namespace]]\nprefix = \"live.\"\npresence = true\njoin_leave = true\n"
    );
    std::fs::write(dir.path().join("myriad.toml"), config).unwrap();
    dir
}

fn config_path(dir: &tempfile::TempDir) -> String {
    dir.path().join("myriad.toml").display().to_string()
}

/// `?user=` names users the follow graph knows: makes 1 to 4 known.
fn know_users(node: &Node) {
    let (status, _) = common::graph::post(node, "/api/users", json!({"users": [1, 2, 3, 4]}));
    assert_eq!(status, 200);
}

/// A node whose `room.` subjects keep presence, at most `cap` members each.
fn presence_node(cap: usize) -> (Node, tempfile::TempDir) {
    let dir = presence_config(cap);
    let node = Node::start(&["--workers", "2", "--config", &config_path(&dir)]);
    know_users(&node);
    (node, dir)
}

/// A connection acting as `id` (`?user=`), its own feed announced.
fn user(node: &Node, id: u64) -> Ws {
    common::graph::connect_as(node, id, &[id])
}

/// Asks `command` on `ws` and returns its reply.
fn ask(ws: &mut Ws, command: Value) -> Value {
    send(ws, command);
    recv(ws)
}

fn stats_over_ws(ws: &mut Ws, subject: &str) -> (u64, u64) {
    let reply = ask(
        ws,
        json!({"op": "presence_stats", "subject": subject, "id": 9}),
    );
    assert_eq!(reply["op"], "presence_stats", "{reply}");
    assert_eq!(reply["id"], 9);
    counts(&reply)
}

fn counts(reply: &Value) -> (u64, u64) {
    assert!(reply["connections"].is_u64(), "{reply}");
    (
        reply["connections"].as_u64().unwrap(),
        reply["users"].as_u64().unwrap(),
    )
}

/// Every member of `subject`, read over `ws` one page of `limit` at a time.
fn members_over_ws(ws: &mut Ws, subject: &str, limit: u64) -> Vec<Value> {
    let mut all = Vec::new();
    let mut cursor = Value::Null;
    loop {
        let mut command = json!({"op": "presence", "subject": subject, "limit": limit, "id": 8});
        if !cursor.is_null() {
            command["cursor"] = cursor.clone();
        }
        let reply = ask(ws, command);
        assert_eq!(reply["op"], "presence", "{reply}");
        let page = reply["members"].as_array().unwrap();
        assert!(page.len() as u64 <= limit, "{reply}");
        all.extend(page.iter().cloned());
        cursor = reply["next"].clone();
        if cursor.is_null() {
            return all;
        }
    }
}

fn admin_get(node: &Node, path: &str) -> (u16, Value) {
    let (status, body) = node.http("GET", path, &node.key_headers(), "");
    (status, serde_json::from_str(&body).unwrap())
}

#[test]
fn members_join_with_their_subscribe_and_leave_with_it() {
    let (node, _dir) = presence_node(100);
    let mut ann_1 = user(&node, 1);
    let mut ann_2 = user(&node, 1);
    let mut bob = user(&node, 2);
    let mut anonymous = node.connect();
    for ws in [&mut ann_1, &mut ann_2, &mut bob, &mut anonymous] {
        subscribe(ws, &["room.1"]);
    }
    // A subject outside the namespace has no presence to ask about.
    subscribe(&mut bob, &["plain"]);
    let reply = ask(
        &mut bob,
        json!({"op": "presence_stats", "subject": "plain", "id": 3}),
    );
    assert_eq!(
        (reply["op"].as_str(), reply["code"].as_str()),
        (Some("error"), Some("forbidden"))
    );

    assert_eq!(stats_over_ws(&mut anonymous, "room.1"), (4, 2));
    let members = members_over_ws(&mut anonymous, "room.1", 1);
    assert_eq!(members.len(), 4, "{members:?}");
    let mut ids: Vec<&str> = members
        .iter()
        .map(|m| m["conn"].as_str().unwrap())
        .collect();
    let listed = ids.clone();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids, listed, "pages in id order, each member once");
    let users: Vec<&Value> = members.iter().map(|m| &m["user"]).collect();
    assert_eq!(users.iter().filter(|u| **u == "1").count(), 2);
    assert_eq!(users.iter().filter(|u| **u == "2").count(), 1);
    assert_eq!(users.iter().filter(|u| u.is_null()).count(), 1);

    // The posted command and the admin API say the same.
    let (status, body) = http(
        node.ws,
        "POST",
        "/cmd",
        &[("Content-Type", "application/json")],
        &json!({"op": "presence_stats", "subject": "room.1", "id": 4}).to_string(),
    );
    assert_eq!(status, 200, "{body}");
    let posted: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(counts(&posted), (4, 2), "{posted}");
    let (status, admin) = admin_get(&node, "/api/presence_stats?subject=room.1");
    assert_eq!(status, 200, "{admin}");
    assert_eq!(counts(&admin), (4, 2));
    let (status, page) = admin_get(&node, "/api/presence?subject=room.1");
    assert_eq!(status, 200);
    assert_eq!(page["members"].as_array().unwrap().len(), 4);
    assert_eq!(page["next"], Value::Null);
    let (status, refused) = admin_get(&node, "/api/presence_stats?subject=plain");
    assert_eq!(status, 400, "{refused}");

    // An unsubscribe leaves; ann stays a user through her other connection.
    let reply = ask(
        &mut ann_1,
        json!({"op": "unsubscribe", "subjects": ["room.1"], "id": 5}),
    );
    assert_eq!(reply["op"], "ok");
    assert_eq!(stats_over_ws(&mut anonymous, "room.1"), (3, 2));
    // A close leaves too.
    drop(ann_2);
    drop(bob);
    wait_until("the closed connections to leave", || {
        let (_, stats) = admin_get(&node, "/api/presence_stats?subject=room.1");
        counts(&stats) == (1, 0)
    });
    assert_eq!(node.metric("myriad_presence_joined_total"), 4);
    assert_eq!(node.metric("myriad_presence_left_total"), 3);
    assert_eq!(node.metric("myriad_presence_members"), 1);
}

#[test]
fn the_cap_refuses_the_subscribe_over_it() {
    let (node, _dir) = presence_node(3);
    let mut inside: Vec<Ws> = (1..=3).map(|id| user(&node, id)).collect();
    for ws in &mut inside {
        subscribe(ws, &["room.full"]);
    }
    let mut late = user(&node, 4);
    let reply = ask(
        &mut late,
        json!({"op": "subscribe", "subjects": ["room.full"], "id": 6}),
    );
    assert_eq!(reply["op"], "error", "{reply}");
    assert_eq!(reply["code"], "presence_full");
    assert_eq!(reply["subject"], "room.full");
    assert_eq!(reply["id"], 6);
    assert_eq!(
        stats_over_ws(&mut late, "room.full"),
        (3, 3),
        "late never joined"
    );
    assert_eq!(node.metric("myriad_presence_refused_total"), 1);
    // Refused, it is not subscribed: publications do not reach it.
    let published = node.publish("room.full", &json!("hello"));
    assert_eq!(published["delivered"], 3, "{published}");
    for ws in &mut inside {
        assert_eq!(recv(ws)["data"], "hello");
    }
    // A place freed is taken.
    let reply = ask(
        &mut inside[0],
        json!({"op": "unsubscribe", "subjects": ["room.full"], "id": 7}),
    );
    assert_eq!(reply["op"], "ok");
    subscribe(&mut late, &["room.full"]);
    assert_eq!(stats_over_ws(&mut late, "room.full"), (3, 3));
}

#[test]
fn a_killed_nodes_members_vanish_within_the_lease() {
    const LEASE: Duration = Duration::from_secs(3);
    let redis = RedisServer::start();
    // Without join_leave, which the Redis engine does not send yet.
    let redis_config = tempfile::tempdir().unwrap();
    let path = redis_config.path().join("myriad.toml");
    let namespace = "[[namespace]]\nprefix = \"room.\"\npresence = true\n";
    std::fs::write(&path, namespace).unwrap();
    let config = path.display().to_string();
    let flags = [
        "--workers",
        "2",
        "--presence-lease",
        "3s",
        "--config",
        &config,
    ];
    let mut doomed = Node::in_cluster_of(&[&redis], "presence", &flags);
    let survivor = Node::in_cluster_of(&[&redis], "presence", &flags);
    know_users(&doomed);
    know_users(&survivor);
    let mut on_doomed = [user(&doomed, 1), user(&doomed, 2)];
    for ws in &mut on_doomed {
        subscribe(ws, &["room.k"]);
    }
    let mut on_survivor = user(&survivor, 1);
    subscribe(&mut on_survivor, &["room.k"]);
    // One member list for the cluster, read on either node.
    assert_eq!(stats_over_ws(&mut on_survivor, "room.k"), (3, 2));
    let (_, page) = admin_get(&doomed, "/api/presence?subject=room.k");
    assert_eq!(page["members"].as_array().unwrap().len(), 3, "{page}");
    // Past two renewals everyone is still listed.
    std::thread::sleep(LEASE * 2 / 3 * 2);
    assert_eq!(stats_over_ws(&mut on_survivor, "room.k"), (3, 2));
    doomed.kill_9();
    let killed = Instant::now();
    while stats_over_ws(&mut on_survivor, "room.k") != (1, 1) {
        assert!(
            killed.elapsed() < LEASE + Duration::from_secs(2),
            "a killed node's members outlived presence_lease"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let members = members_over_ws(&mut on_survivor, "room.k", 10);
    assert_eq!(members.len(), 1);
    assert_eq!(members[0]["user"], "1");
    // Counted once, cluster-wide, as of the survivor's next renewal.
    wait_until("the expiries to be counted", || {
        survivor.metric("myriad_presence_expired_total") == 2
    });
    drop(on_doomed);
}

#[test]
fn joins_and_leaves_reach_subscribers_in_order() {
    let (node, _dir) = presence_node(100);
    let mut watcher = node.connect();
    subscribe(&mut watcher, &["live.1", "room.quiet"]);
    let mut ann = user(&node, 1);
    subscribe(&mut ann, &["live.1"]);
    let mut bob = user(&node, 2);
    subscribe(&mut bob, &["live.1"]);
    // A namespace without join_leave sends none.
    subscribe(&mut bob, &["room.quiet"]);
    // Asked by a connection that is no subscriber, so gets no events.
    let mut lister = node.connect();
    let ids: Vec<String> = members_over_ws(&mut lister, "live.1", 10)
        .iter()
        .map(|m| m["conn"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 3);
    // Ann, a subscriber, may hear of bob's join before her answer.
    send(
        &mut ann,
        json!({"op": "unsubscribe", "subjects": ["live.1"], "id": 2}),
    );
    let answer = loop {
        let message = recv(&mut ann);
        if message["op"] != "join" {
            break message;
        }
    };
    assert_eq!(answer["op"], "ok");
    drop(bob);
    let events: Vec<Value> = (0..4).map(|_| recv(&mut watcher)).collect();
    let seen: Vec<(&str, &str, &Value)> = events
        .iter()
        .map(|e| {
            assert_eq!(e["subject"], "live.1", "{e}");
            (
                e["op"].as_str().unwrap(),
                e["member"]["conn"].as_str().unwrap(),
                &e["member"]["user"],
            )
        })
        .collect();
    let (ann_id, bob_id) = (seen[0].1, seen[1].1);
    assert_eq!(
        seen,
        [
            ("join", ann_id, &json!("1")),
            ("join", bob_id, &json!("2")),
            ("leave", ann_id, &json!("1")),
            ("leave", bob_id, &json!("2")),
        ]
    );
    assert!(ids.iter().any(|id| id == ann_id) && ids.iter().any(|id| id == bob_id));
    // Nothing else came: the next message is the answer to this ping.
    assert_eq!(
        ask(&mut watcher, json!({"op": "ping", "id": 3}))["op"],
        "pong"
    );
}

/// What an observer following docs/protocol.md's recipe holds: member id →
/// user, from pages and the joins and leaves around them.
#[derive(Default)]
struct Observed {
    members: std::collections::BTreeMap<String, Value>,
}

impl Observed {
    /// Applies one message; returns the `next` cursor when it was a page
    /// (`Some(Null)` for the last one).
    fn apply(&mut self, message: &Value, asked_after: &Option<String>) -> Option<Value> {
        match message["op"].as_str() {
            Some("join") => {
                let member = &message["member"];
                let id = member["conn"].as_str().unwrap().to_owned();
                self.members.insert(id, member["user"].clone());
                None
            }
            Some("leave") => {
                self.members
                    .remove(message["member"]["conn"].as_str().unwrap());
                None
            }
            Some("presence") => {
                // A page replaces what is held for the ids it covers: after
                // its cursor, up to its last member (to the end on the last
                // page).
                let page = message["members"].as_array().unwrap();
                let next = message["next"].clone();
                let last = next.as_str().map(str::to_owned);
                self.members.retain(|id, _| {
                    let after = asked_after.as_ref().is_none_or(|a| id > a);
                    let within = last.as_ref().is_none_or(|l| id <= l);
                    !(after && within)
                });
                for m in page {
                    self.members
                        .insert(m["conn"].as_str().unwrap().to_owned(), m["user"].clone());
                }
                Some(next)
            }
            _ => panic!("unexpected {message}"),
        }
    }

    /// Subscribes `ws` and reads every page (three members each) while
    /// joins and leaves keep coming.
    fn follow(ws: &mut Ws, subject: &str) -> Observed {
        let mut seen = Observed::default();
        send(
            ws,
            json!({"op": "subscribe", "subjects": [subject], "id": 1}),
        );
        assert_eq!(recv(ws)["op"], "subscribed");
        let mut after: Option<String> = None;
        loop {
            let mut command = json!({"op": "presence", "subject": subject, "limit": 3, "id": 2});
            if let Some(a) = &after {
                command["cursor"] = json!(a);
            }
            send(ws, command);
            let next = loop {
                if let Some(next) = seen.apply(&recv(ws), &after) {
                    break next;
                }
            };
            match next.as_str() {
                Some(cursor) => after = Some(cursor.to_owned()),
                None => return seen,
            }
        }
    }
}

#[test]
fn snapshot_then_diffs_leaves_no_gap_across_churn_and_a_reconnect() {
    const CHURN: usize = 60;
    let (node, _dir) = presence_node(1000);
    let done = std::sync::atomic::AtomicBool::new(false);
    let kept = std::thread::scope(|scope| {
        let churn = scope.spawn(|| {
            let mut kept = Vec::new();
            for i in 0..CHURN {
                let mut ws = node.connect();
                subscribe(&mut ws, &["live.c"]);
                match i % 3 {
                    0 => kept.push(ws),
                    1 => {
                        let reply = ask(
                            &mut ws,
                            json!({"op": "unsubscribe", "subjects": ["live.c"], "id": 5}),
                        );
                        assert_eq!(reply["op"], "ok");
                    }
                    _ => drop(ws),
                }
                std::thread::sleep(Duration::from_millis(3));
            }
            done.store(true, std::sync::atomic::Ordering::Release);
            kept
        });
        // Follow, drop the connection part way, come back and follow again,
        // all while the churn goes on.
        let mut first = node.connect();
        let mut seen = Observed::follow(&mut first, "live.c");
        for _ in 0..10 {
            seen.apply(&recv(&mut first), &None);
        }
        drop(first);
        let mut observer = node.connect();
        seen = Observed::follow(&mut observer, "live.c");
        let kept = churn.join().unwrap();
        assert!(done.load(std::sync::atomic::Ordering::Acquire));
        // Once every change has been made, the counts answer after them.
        let expected = (kept.len() + 1) as u64;
        wait_until("the churn's leaves", || {
            let (_, stats) = admin_get(&node, "/api/presence_stats?subject=live.c");
            stats["connections"] == expected
        });
        send(
            &mut observer,
            json!({"op": "presence_stats", "subject": "live.c", "id": 9}),
        );
        loop {
            let message = recv(&mut observer);
            if message["op"] == "presence_stats" {
                assert_eq!(message["connections"], expected);
                break;
            }
            seen.apply(&message, &None);
        }
        let (_, listing) = admin_get(&node, "/api/presence?subject=live.c");
        let truth: Vec<&str> = listing["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["conn"].as_str().unwrap())
            .collect();
        let held: Vec<&str> = seen.members.keys().map(String::as_str).collect();
        assert_eq!(held, truth, "the observer's members are the node's");
        kept
    });
    assert_eq!(kept.len(), CHURN / 3);
}

#[test]
fn a_tokens_info_claim_is_shown_with_its_memberships() {
    use jsonwebtoken::{encode, EncodingKey, Header};
    const SECRET: &str = "a-test-secret-of-at-least-32-bytes!";
    let dir = presence_config(10);
    let node = Node::start(&[
        "--workers",
        "1",
        "--token-hmac-secret",
        SECRET,
        "--presence-info-max-bytes",
        "40",
        "--config",
        &config_path(&dir),
    ]);
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 60;
    let token = |info: Value| {
        let claims = json!({"sub": "7", "exp": exp, "subscribe": ["room.*"], "info": info});
        let key = EncodingKey::from_secret(SECRET.as_bytes());
        encode(&Header::default(), &claims, &key).unwrap()
    };
    let mut ws = node.connect_path(&format!("/ws?token={}", token(json!({"name": "Ann"}))));
    assert_eq!(recv(&mut ws)["subject"], "@7", "the user's own feed first");
    subscribe(&mut ws, &["room.i"]);
    let members = members_over_ws(&mut ws, "room.i", 10);
    assert_eq!(members.len(), 1);
    assert_eq!(members[0]["user"], "7");
    assert_eq!(members[0]["info"], json!({"name": "Ann"}));
    // Past presence_info_max_bytes the token is refused, counted.
    let long = token(json!({"name": "x".repeat(40)}));
    let reply = ask(&mut ws, json!({"op": "refresh", "token": long, "id": 4}));
    assert_eq!(reply["code"], "invalid_token", "{reply}");
    assert!(reply["message"]
        .as_str()
        .unwrap()
        .contains("presence_info_max_bytes"));
    assert_eq!(node.metric("myriad_errors_total{kind=\"token_info\"}"), 1);
}
