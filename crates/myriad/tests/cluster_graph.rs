//! The follow graph shared by a cluster (`--graph-store redis`): nodes over
//! one real Redis, a follower connected to one node while its follows
//! change through another, sends through either node reaching every
//! follower's connection exactly once, and a node that missed changes
//! (its subscription cut, Redis restarted) reading them again.

mod common;

use std::time::{Duration, Instant};

use common::graph::{
    connect_as, follow, next_delivery, nothing_pending, post, publish_as, unfollow,
};
use common::{recv, Node, Ws};
use myriad_testkit::RedisServer;
use serde_json::json;

/// A node of the cluster over `redis` under `prefix`, graph included.
fn node(redis: &RedisServer, prefix: &str) -> Node {
    let flags = [
        "--workers",
        "2",
        "--redis-timeout",
        "2s",
        "--graph-store",
        "redis",
    ];
    Node::in_cluster_of(&[redis], prefix, &flags)
}

/// Makes `users` known through `via`, and waits until `also` knows them.
fn add_users(via: &Node, also: &Node, users: &[u64]) {
    let (status, reply) = post(via, "/api/users", json!({ "users": users }));
    assert_eq!(status, 200, "{reply}");
    let count = users.len() as u64;
    also.wait_for_stats("the users to be known", |s| {
        s["graph"]["users"].as_u64() == Some(count)
    });
}

/// Waits for the server to announce that `ws` now holds `feed`.
fn subscribed(ws: &mut Ws, feed: u64) {
    let reply = recv(ws);
    assert_eq!(reply["op"], "subscribed", "{reply}");
    assert_eq!(reply["subject"], format!("@{feed}"), "{reply}");
}

/// [`subscribed`], after any number of refusals of that feed's attach
/// while the node's engine could not reach Redis (the node tries again).
fn subscribed_in_the_end(ws: &mut Ws, feed: u64) {
    loop {
        let reply = recv(ws);
        if reply["op"] == "error" && reply["code"] == "unavailable" && reply["id"].is_null() {
            continue;
        }
        assert_eq!(reply["op"], "subscribed", "{reply}");
        assert_eq!(reply["subject"], format!("@{feed}"), "{reply}");
        return;
    }
}

#[test]
fn follows_through_one_node_reach_connections_on_the_other_and_sends_arrive_once() {
    let redis = RedisServer::start();
    let (a, b) = (node(&redis, "cg"), node(&redis, "cg"));
    add_users(&a, &b, &[1, 2, 3, 4]);
    // User 1 on both nodes, user 3 on A; user 2 sends.
    let mut one_on_b = connect_as(&b, 1, &[1]);
    let mut one_on_a = connect_as(&a, 1, &[1]);
    let mut three_on_a = connect_as(&a, 3, &[3]);

    assert_eq!(follow(&a, &[(1, 2), (3, 2)]), 2);
    // A answered once its own connections follow; B's follows by itself.
    subscribed(&mut one_on_a, 2);
    subscribed(&mut three_on_a, 2);
    subscribed(&mut one_on_b, 2);

    for (round, via) in [&a, &b].into_iter().enumerate() {
        publish_as(via, 2, json!(round));
        for ws in [&mut one_on_a, &mut one_on_b, &mut three_on_a] {
            assert_eq!(next_delivery(ws), ("@2".to_owned(), json!(round)));
        }
    }
    for ws in [&mut one_on_a, &mut one_on_b, &mut three_on_a] {
        nothing_pending(ws);
    }

    // Unfollow through B. A applies changes in the store's order, so once
    // A has answered a later follow of its own, it has applied this one.
    assert_eq!(unfollow(&b, &[(1, 2)]), 1);
    assert_eq!(follow(&a, &[(3, 4)]), 1);
    subscribed(&mut three_on_a, 4);
    publish_as(&b, 2, json!("after"));
    assert_eq!(
        next_delivery(&mut three_on_a),
        ("@2".to_owned(), json!("after"))
    );
    for ws in [&mut one_on_a, &mut one_on_b, &mut three_on_a] {
        nothing_pending(ws);
    }

    // A user connecting later reads the graph as the store has it.
    let mut three_on_b = connect_as(&b, 3, &[3, 2, 4]);
    publish_as(&a, 4, json!("four"));
    for ws in [&mut three_on_a, &mut three_on_b] {
        assert_eq!(next_delivery(ws), ("@4".to_owned(), json!("four")));
        nothing_pending(ws);
    }
}

/// Kills the nodes' subscriptions to the graph's changes, and only those.
fn cut_graph_subscriptions(redis: &RedisServer) -> usize {
    let clients = redis.command(&["CLIENT", "LIST"]).unwrap();
    let ids: Vec<String> = clients
        .lines()
        .filter(|l| l.contains(" name=myriad-graph-changes "))
        .map(|l| {
            l.split(' ')
                .next()
                .unwrap()
                .trim_start_matches("id=")
                .to_owned()
        })
        .collect();
    for id in &ids {
        redis.command(&["CLIENT", "KILL", "ID", id]).unwrap();
    }
    ids.len()
}

/// Sends as `user` through `via` until `ws` gets one (bounded): once the
/// feed is attached on the node of `ws`, a send reaches it.
fn reached_after_reattach(via: &Node, user: u64, ws: &mut Ws) {
    common::set_timeout(ws, Duration::from_millis(300));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, _) = post(
            via,
            "/api/publish_as",
            json!({"user": user, "data": "probe"}),
        );
        if status == 200 {
            if let Ok(tungstenite::Message::Text(text)) = ws.read() {
                let message: serde_json::Value = serde_json::from_str(&text).unwrap();
                assert_eq!(message["subject"], format!("@{user}"), "{message}");
                break;
            }
        }
        assert!(Instant::now() < deadline, "no send reached the follower");
    }
    common::set_timeout(ws, Duration::from_secs(10));
}

#[test]
fn a_follow_made_while_a_nodes_subscription_was_cut_is_read_again() {
    let redis = RedisServer::start();
    let (a, b) = (node(&redis, "cg"), node(&redis, "cg"));
    add_users(&a, &b, &[1, 2]);
    let mut one_on_b = connect_as(&b, 1, &[1]);
    assert_eq!(cut_graph_subscriptions(&redis), 2);
    // Made while neither node hears: A answers once it has read it again.
    assert_eq!(follow(&a, &[(1, 2)]), 1);
    subscribed(&mut one_on_b, 2);
    publish_as(&a, 2, json!("after the cut"));
    assert_eq!(
        next_delivery(&mut one_on_b),
        ("@2".to_owned(), json!("after the cut"))
    );
    nothing_pending(&mut one_on_b);
    assert!(b.metric("myriad_graph_listen_failures_total") >= 1);
    assert!(b.metric("myriad_graph_resyncs_total") >= 1);
}

#[test]
fn a_follow_made_before_a_node_resubscribed_after_a_redis_restart_is_applied() {
    let mut redis = RedisServer::start_persistent();
    let (a, b) = (node(&redis, "cg"), node(&redis, "cg"));
    add_users(&a, &b, &[1, 2]);
    let mut one_on_b = connect_as(&b, 1, &[1]);
    redis.kill();
    // Long enough for the nodes' attempts to subscribe to back off.
    std::thread::sleep(Duration::from_secs(1));
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, reply) = post(&a, "/api/follow", json!({"edges": [[1, 2]]}));
        if status == 200 {
            break;
        }
        // Refused while the store cannot be reached; once stored, the
        // answer must come (A reads it again when it resubscribes), not
        // "not_settled" with the follow left to a retry to announce.
        assert_eq!(
            (status, reply["error"]["code"].as_str()),
            (503, Some("store_failed")),
            "{reply}"
        );
        assert!(Instant::now() < deadline, "no follow accepted: {reply}");
        std::thread::sleep(Duration::from_millis(50));
    }
    subscribed_in_the_end(&mut one_on_b, 2);
    reached_after_reattach(&a, 2, &mut one_on_b);
}

#[test]
fn a_graph_loaded_into_redis_is_the_one_every_node_serves() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("edges.txt");
    std::fs::write(&file, "# follower followee\n1 2\n3 2\n2 4\n").unwrap();
    let graph = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_myriad"))
            .arg("graph")
            .args(args)
            .args(["--redis-url", &redis.url(), "--redis-prefix", "cg"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {stderr}");
        String::from_utf8(out.stdout).unwrap()
    };
    let loaded = graph(&["load", file.to_str().unwrap()]);
    assert!(loaded.contains("edges added: 3"), "{loaded}");
    let stats = graph(&["stats"]);
    assert!(
        stats.contains("users: 4") && stats.contains("edges: 3"),
        "{stats}"
    );
    let (a, b) = (node(&redis, "cg"), node(&redis, "cg"));
    let mut one = connect_as(&a, 1, &[1, 2]);
    let mut three = connect_as(&b, 3, &[3, 2]);
    publish_as(&b, 2, json!("loaded"));
    for ws in [&mut one, &mut three] {
        assert_eq!(next_delivery(ws), ("@2".to_owned(), json!("loaded")));
        nothing_pending(ws);
    }
}

#[test]
fn every_feed_the_engine_refused_in_a_burst_of_connects_is_made_in_the_end() {
    let redis = RedisServer::start();
    // No feed attach may wait for room: while Redis is stalled, a burst of
    // connects has its own feeds' attaches refused with `redis_busy`.
    let node = burst_node(&redis, "0");
    redis.pause();
    let mut conns = connect_users(&node);
    let busy = "myriad_engine_failures_total{kind=\"redis_busy\"}";
    node.wait_for_metric(busy, 4);
    redis.resume();
    expect_feeds(&mut conns, Refusals::Expected);
    expect_sends(&node, &mut conns);
}

#[test]
fn a_burst_of_connects_past_a_full_queue_waits_for_room_without_an_error() {
    let redis = RedisServer::start();
    let node = burst_node(&redis, "1000");
    redis.pause();
    let mut conns = connect_users(&node);
    // One attach in the round trip and one in the queue; the rest wait.
    node.wait_for_metric("myriad_engine_waiting_attaches", 4);
    redis.resume();
    expect_feeds(&mut conns, Refusals::None);
    let busy = "myriad_engine_failures_total{kind=\"redis_busy\"}";
    assert_eq!(node.metric(busy), 0);
    assert_eq!(node.metric("myriad_engine_waiting_attaches"), 0);
    expect_sends(&node, &mut conns);
}

/// A node over `redis` where one request may wait for Redis, and
/// `feed_backlog` feed attaches may wait for room; users 1 to 8, of whom
/// 1 follows 2, and 3 follows 2 and 4.
fn burst_node(redis: &RedisServer, feed_backlog: &str) -> Node {
    let flags = [
        "--workers",
        "1",
        "--redis-timeout",
        "5s",
        "--graph-store",
        "redis",
        "--redis-queue",
        "1",
        "--redis-feed-backlog",
        feed_backlog,
    ];
    let node = Node::in_cluster_of(&[redis], "cb", &flags);
    assert_eq!(follow(&node, &[(1, 2), (3, 2), (3, 4)]), 3);
    let (status, reply) = post(&node, "/api/users", json!({ "users": [5, 6, 7, 8] }));
    assert_eq!(status, 200, "{reply}");
    node
}

fn connect_users(node: &Node) -> Vec<(u64, Ws)> {
    (1..=8)
        .map(|user| (user, node.connect_path(&format!("/ws?user={user}"))))
        .collect()
}

/// Whether a feed's attach may be refused (`unavailable`) before it is made.
#[derive(Clone, Copy, PartialEq)]
enum Refusals {
    Expected,
    None,
}

/// Each user's own feed, then its followees', in `burst_node`'s graph.
fn feeds_of(user: u64) -> Vec<u64> {
    match user {
        1 => vec![1, 2],
        3 => vec![3, 2, 4],
        _ => vec![user],
    }
}

/// Every connection is told each of its feeds is made, once.
fn expect_feeds(conns: &mut [(u64, Ws)], refusals: Refusals) {
    for (user, ws) in conns {
        let mut owed = feeds_of(*user);
        while !owed.is_empty() {
            let reply = recv(ws);
            if refusals == Refusals::Expected
                && reply["op"] == "error"
                && reply["code"] == "unavailable"
            {
                continue; // refused: the node makes it again
            }
            assert_eq!(reply["op"], "subscribed", "user {user}: {reply}");
            let feed: u64 = reply["subject"].as_str().unwrap()[1..].parse().unwrap();
            let at = owed.iter().position(|&f| f == feed);
            assert!(at.is_some(), "user {user}: {feed} twice or unowed");
            owed.swap_remove(at.unwrap());
        }
    }
}

/// Each connection gets its user's sends and its followees', in order.
fn expect_sends(node: &Node, conns: &mut [(u64, Ws)]) {
    for user in 1..=8 {
        publish_as(node, user, json!(user));
    }
    for (user, ws) in conns {
        let mut from = feeds_of(*user);
        from.sort_unstable();
        for sender in from {
            assert_eq!(next_delivery(ws), (format!("@{sender}"), json!(sender)));
        }
        nothing_pending(ws);
    }
}
