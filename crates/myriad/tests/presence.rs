//! Presence per subject against the real binary: members join with their
//! subscribe and leave with their unsubscribe or close; `presence` and
//! `presence_stats` over WebSocket, `POST /cmd` and the admin API agree;
//! the cap refuses the subscribe over it with `presence_full`, counted;
//! over Redis, two nodes see one member list, and the members of a node
//! killed with `kill -9` vanish within its `presence_lease`.

mod common;

use std::time::{Duration, Instant};

use common::{http, recv, send, subscribe, wait_until, Node, Ws};
use myriad_testkit::RedisServer;
use serde_json::{json, Value};

/// A config file whose `room.` subjects keep presence, at most `cap`
/// members each.
fn presence_config(cap: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[[namespace]]\nprefix = \"room.\"\npresence = true\npresence_max_members = {cap}\n"
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
    let dir = presence_config(100);
    let config = config_path(&dir);
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
