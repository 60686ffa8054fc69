//! The follow graph against the real binary: send as user, follow and
//! unfollow while connected, several connections per user, persistence
//! across restarts and `kill -9`, and the refusals of bad input.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::graph::{
    connect_as, follow, next_delivery, nothing_pending, post, publish_as, unfollow,
};
use common::{recv, send, Node, Ws};
use serde_json::{json, Value};

#[test]
fn a_send_reaches_followers_and_the_senders_connections_once_each() {
    let node = Node::start(&[]);
    assert_eq!(follow(&node, &[(2, 1), (3, 1), (4, 5), (2, 5)]), 4);
    let mut one_a = connect_as(&node, 1, &[1]);
    let mut one_b = connect_as(&node, 1, &[1]);
    let mut two = connect_as(&node, 2, &[2, 1, 5]);
    let mut three = connect_as(&node, 3, &[3, 1]);
    let mut four = connect_as(&node, 4, &[4, 5]);

    assert_eq!(publish_as(&node, 1, json!("from 1")), 4);
    for ws in [&mut one_a, &mut one_b, &mut two, &mut three] {
        assert_eq!(next_delivery(ws), ("@1".to_owned(), json!("from 1")));
        nothing_pending(ws);
    }
    nothing_pending(&mut four);

    // The client command: user 2 sends; only its own connection follows it.
    send(&mut two, json!({"op": "send", "id": 7, "data": {"n": 2}}));
    let mut got = [recv(&mut two), recv(&mut two)];
    got.sort_by_key(|m| m["op"].as_str().unwrap().to_owned());
    assert_eq!(got[0]["op"], "msg", "{got:?}");
    assert_eq!(got[0]["subject"], "@2");
    assert_eq!(got[1]["op"], "ok");
    assert_eq!(got[1]["id"], 7);
    assert_eq!(got[1]["reached"], 1);
    for ws in [&mut one_a, &mut three, &mut four] {
        nothing_pending(ws);
    }
    let stats = node.stats();
    assert_eq!(stats["graph"]["users_present"], 4, "{stats}");
    assert_eq!(stats["graph"]["users"], 5, "{stats}");
}

#[test]
fn follows_and_unfollows_apply_to_connected_users_before_their_answer() {
    let node = Node::start(&[]);
    let (status, _) = post(&node, "/api/users", json!({"users": [10, 11, 12]}));
    assert_eq!(status, 200);
    let mut ten = connect_as(&node, 10, &[10]);
    let mut ten_again = connect_as(&node, 10, &[10]);
    for round in 0..20 {
        assert_eq!(follow(&node, &[(10, 11)]), 1);
        // No waiting: the answer means the feed is attached.
        assert_eq!(publish_as(&node, 11, json!(round)), 2);
        for ws in [&mut ten, &mut ten_again] {
            let announced = recv(ws);
            assert_eq!(announced["op"], "subscribed", "{announced}");
            assert_eq!(announced["subject"], "@11");
            assert_eq!(next_delivery(ws), ("@11".to_owned(), json!(round)));
        }
        assert_eq!(unfollow(&node, &[(10, 11)]), 1);
        assert_eq!(publish_as(&node, 11, json!("unseen")), 0);
        for ws in [&mut ten, &mut ten_again] {
            nothing_pending(ws);
        }
    }
    // Idempotent: following twice, unfollowing what is not followed.
    assert_eq!(follow(&node, &[(10, 12)]), 1);
    assert_eq!(follow(&node, &[(10, 12)]), 0);
    assert_eq!(unfollow(&node, &[(10, 11)]), 0);
    let metrics = node.http("GET", "/metrics", &[], "").1;
    assert!(metrics.contains("myriad_follows_total 21"), "{metrics}");
    assert!(metrics.contains("myriad_unfollows_total 20"), "{metrics}");
}

#[test]
fn followers_and_followings_read_in_pages() {
    let node = Node::start(&[]);
    let edges: Vec<(u64, u64)> = (100..125).map(|f| (f, 1)).collect();
    follow(&node, &edges);
    let mut all = Vec::new();
    let mut after = String::new();
    let mut pages = 0;
    loop {
        let (status, body) = node.http(
            "GET",
            &format!("/api/followers?user=1&limit=10{after}"),
            &[],
            "",
        );
        assert_eq!(status, 200, "{body}");
        let page: Value = serde_json::from_str(&body).unwrap();
        pages += 1;
        all.extend(
            page["followers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap()),
        );
        match page["next"].as_u64() {
            Some(next) => after = format!("&after={next}"),
            None => break,
        }
    }
    assert_eq!(all, (100..125).collect::<Vec<u64>>());
    assert_eq!(pages, 3);
    let (_, body) = node.http("GET", "/api/following?user=100", &[], "");
    let page: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(page["following"], json!([1]));
    assert_eq!(page["next"], Value::Null);
}

#[test]
fn the_graph_survives_a_restart_and_kill_9_loses_no_acknowledged_follow() {
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().display().to_string();
    let args = ["--data-dir", dir_arg.as_str()];
    // A graceful restart keeps the graph, and connecting users get their
    // feeds from it.
    let node = Node::start(&args);
    follow(&node, &[(1, 2), (1, 3)]);
    node.terminate();
    drop(node);
    let node = Node::start(&args);
    let mut one = connect_as(&node, 1, &[1, 2, 3]);
    assert_eq!(publish_as(&node, 3, json!("after restart")), 1);
    assert_eq!(next_delivery(&mut one).0, "@3");
    drop(one);

    // Follows stream in, one acknowledged request at a time, until the
    // node is killed with SIGKILL in the middle of them.
    let admin = node.admin;
    let pid = node.child.id();
    let streamer = std::thread::spawn(move || {
        let mut acknowledged = Vec::new();
        for followee in 1_000u64.. {
            let body = json!({"edges": [[7, followee]]}).to_string();
            let outcome =
                std::panic::catch_unwind(|| common::http(admin, "POST", "/api/follow", &[], &body));
            match outcome {
                Ok((200, _)) => acknowledged.push(followee),
                _ => return acknowledged,
            }
        }
        unreachable!()
    });
    std::thread::sleep(Duration::from_millis(300));
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let acknowledged = streamer.join().unwrap();
    drop(node);
    assert!(
        acknowledged.len() > 5,
        "follows were flowing: {}",
        acknowledged.len()
    );

    let node = Node::start(&args);
    let (status, body) = node.http("GET", "/api/following?user=7&limit=10000", &[], "");
    assert_eq!(status, 200, "{body}");
    let page: Value = serde_json::from_str(&body).unwrap();
    let stored: BTreeSet<u64> = page["following"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    for followee in &acknowledged {
        assert!(
            stored.contains(followee),
            "acknowledged follow 7→{followee} lost"
        );
    }
    // At most the one in flight when the node died is there unacknowledged.
    assert!(stored.len() <= acknowledged.len() + 1);
}

#[test]
fn feeds_the_server_adds_do_not_count_against_max_subscriptions_and_others_do() {
    let node = Node::start(&["--max-subscriptions", "2"]);
    follow(&node, &[(1, 2), (1, 3), (1, 4)]);
    let subscribe = |ws: &mut Ws, subject: &str| -> Value {
        send(
            ws,
            json!({"op": "subscribe", "subjects": [subject], "id": 5}),
        );
        recv(ws)
    };
    // A user with four graph feeds may still hold two subjects of its own,
    // feeds it names itself included, and no more.
    let mut one = connect_as(&node, 1, &[1, 2, 3, 4]);
    assert_eq!(subscribe(&mut one, "news")["op"], "subscribed");
    assert_eq!(subscribe(&mut one, "@9")["op"], "subscribed");
    assert_eq!(subscribe(&mut one, "@8")["code"], "too_many_subscriptions");
    // An anonymous connection's feeds are all its own: they count.
    let mut anonymous = node.connect();
    assert_eq!(subscribe(&mut anonymous, "@1")["op"], "subscribed");
    assert_eq!(subscribe(&mut anonymous, "@2")["op"], "subscribed");
    assert_eq!(
        subscribe(&mut anonymous, "@3")["code"],
        "too_many_subscriptions"
    );
    // A graph feed the client drops frees no room for more of its own.
    send(
        &mut one,
        json!({"op": "unsubscribe", "subjects": ["@2"], "id": 6}),
    );
    assert_eq!(recv(&mut one)["op"], "ok");
    assert_eq!(subscribe(&mut one, "@8")["code"], "too_many_subscriptions");
}

#[test]
fn a_second_node_cannot_take_a_data_directory_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().display().to_string();
    let _first = Node::start(&["--data-dir", &dir_arg]);
    let second = common::serve_command()
        .args(["--data-dir", &dir_arg])
        .output()
        .unwrap();
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("in use"), "{stderr}");
}

#[test]
fn bad_input_is_refused_whole_with_a_stable_code_and_counted() {
    let node = Node::start(&["--max-following", "2"]);
    follow(&node, &[(1, 2)]);
    let refused = |path: &str, body: Value, status: u16, code: &str| {
        let (got, reply) = post(&node, path, body.clone());
        assert_eq!(got, status, "{path} {body}: {reply}");
        assert_eq!(reply["error"]["code"], code, "{path} {body}: {reply}");
        reply["error"]["message"].as_str().unwrap().to_owned()
    };
    // An unknown user in a send.
    refused(
        "/api/publish_as",
        json!({"user": 404, "data": 1}),
        404,
        "unknown_user",
    );
    // Ids out of range, and a batch with one bad entry: nothing applied.
    let message = refused(
        "/api/follow",
        json!({"edges": [[20, 21], [22, 9007199254740992u64]]}),
        400,
        "invalid_user",
    );
    assert!(message.contains("edges[1]"), "{message}");
    refused(
        "/api/follow",
        json!({"edges": [[20, -1]]}),
        400,
        "invalid_user",
    );
    refused(
        "/api/follow",
        json!({"edges": [[20, 21], [23, 23]]}),
        400,
        "self_follow",
    );
    refused(
        "/api/follow",
        json!({"edges": [[1, 3], [1, 4]]}),
        422,
        "following_limit",
    );
    refused(
        "/api/users",
        json!({"users": [30, 1.5]}),
        400,
        "invalid_user",
    );
    refused("/api/follow", json!({"edges": "no"}), 400, "invalid_json");
    refused(
        "/api/publish",
        json!({"subject": "@1", "data": 1}),
        400,
        "reserved_subject",
    );
    for user in [20, 21, 22, 23, 30] {
        let (status, _) = node.http("GET", &format!("/api/following?user={user}"), &[], "");
        assert_eq!(
            status, 404,
            "user {user} must not exist after refused batches"
        );
    }
    let (_, body) = node.http("GET", "/api/following?user=1", &[], "");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["following"],
        json!([2])
    );

    // On the client listener: unknown and malformed users, send without a
    // user, publishing to a feed.
    for (query, status) in [("user=404", 404), ("user=abc", 400)] {
        match tungstenite::connect(node.url(&format!("/ws?{query}"))) {
            Err(tungstenite::Error::Http(response)) => assert_eq!(response.status(), status),
            other => panic!("{query}: expected a refusal, got {:?}", other.map(|_| ())),
        }
    }
    let mut anonymous = node.connect();
    send(&mut anonymous, json!({"op": "send", "id": 1, "data": 1}));
    assert_eq!(recv(&mut anonymous)["code"], "no_user");
    send(
        &mut anonymous,
        json!({"op": "publish", "id": 2, "subject": "@2", "data": 1}),
    );
    assert_eq!(recv(&mut anonymous)["code"], "reserved_subject");

    let errors = &node.stats()["errors"];
    for (label, count) in [
        ("graph_unknown_user", 6),
        ("graph_invalid_user", 3),
        ("graph_self_follow", 1),
        ("graph_following_limit", 1),
        ("api_bad_request", 2),
        ("request_unknown_user", 1),
        ("request_invalid_user", 1),
        ("no_user", 1),
        ("reserved_subject", 1),
    ] {
        assert_eq!(errors[label], count, "{label}: {errors}");
    }
}
