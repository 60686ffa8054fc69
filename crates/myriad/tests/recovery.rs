//! Positions, history and recovery against the real binary: a subscriber
//! that drops its connection while publishing goes on resumes with no gap
//! and no duplicate; a restart or expired history is reported as
//! `recovered: false`; the history command and API; per-namespace settings.

mod common;

use std::io::Write;
use std::time::Duration;

use common::{recv, send, subscribe, Node, Ws};
use serde_json::{json, Value};

/// Subscribes to one subject with `since`; returns the `subscribed` reply.
fn resubscribe(ws: &mut Ws, subject: &str, since: &Value) -> Value {
    send(
        ws,
        json!({"op": "subscribe", "subject": subject, "since": since, "id": 7}),
    );
    let reply = recv(ws);
    assert_eq!(reply["op"], "subscribed", "{reply}");
    reply
}

/// The offsets of a history reply's publications.
fn offsets(reply: &Value) -> Vec<u64> {
    reply["publications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["offset"].as_u64().unwrap())
        .collect()
}

fn position(epoch: &Value, offset: u64) -> Value {
    json!({"epoch": epoch, "offset": offset})
}

#[test]
fn a_dropped_subscriber_resumes_without_gap_or_duplicate_while_publishing_goes_on() {
    const MESSAGES: u64 = 4_000;
    let node = Node::start(&["--workers", "2", "--history-size", "10000"]);
    let mut publisher = node.connect();
    let first = subscribe(&mut node.connect(), &["live"]).remove(0);
    let epoch = first["epoch"].clone();
    let publishing = std::thread::spawn(move || {
        for n in 1..=MESSAGES {
            send(
                &mut publisher,
                json!({"op": "publish", "subject": "live", "data": n}),
            );
            if n % 500 == 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        publisher
    });
    let mut received: Vec<u64> = Vec::new();
    let mut last = 0;
    let mut lives = 0;
    let mut recoveries = 0;
    while last < MESSAGES {
        lives += 1;
        let mut ws = node.connect();
        if lives == 1 {
            assert_eq!(subscribe(&mut ws, &["live"])[0]["epoch"], epoch);
        } else {
            let reply = resubscribe(&mut ws, "live", &position(&epoch, last));
            assert_eq!(reply["recovered"], true, "{reply}");
            assert_eq!(reply["epoch"], epoch);
            recoveries += 1;
        }
        // Take a few hundred, then drop the TCP connection without a close.
        for _ in 0..300 {
            let msg = recv(&mut ws);
            assert_eq!(msg["op"], "msg", "{msg}");
            assert_eq!(msg["epoch"], epoch);
            let offset = msg["offset"].as_u64().unwrap();
            assert_eq!(msg["data"], offset, "data and offset agree");
            received.push(offset);
            last = offset;
            if last == MESSAGES {
                break;
            }
        }
        drop(ws);
    }
    drop(publishing.join().unwrap());
    assert!(recoveries >= 5, "the subscriber blipped {recoveries} times");
    let first_offset = received[0];
    let want: Vec<u64> = (first_offset..=MESSAGES).collect();
    assert_eq!(received, want, "no gap, no duplicate, in order");
}

#[test]
fn a_restarted_node_reports_a_new_epoch_and_recovers_nothing() {
    let node = Node::start(&["--workers", "1"]);
    let mut ws = node.connect();
    let at = subscribe(&mut ws, &["r"]).remove(0);
    node.publish("r", &json!(1));
    assert_eq!(recv(&mut ws)["offset"], 1);
    drop(ws);
    drop(node);
    let node = Node::start(&["--workers", "1"]);
    node.publish("r", &json!(2));
    let mut ws = node.connect();
    let reply = resubscribe(&mut ws, "r", &position(&at["epoch"], 1));
    assert_eq!(reply["recovered"], false);
    assert_ne!(reply["epoch"], at["epoch"], "a new life, a new epoch");
    assert_eq!(reply["offset"], 1);
    // Nothing replayed: the next message is the live one.
    node.publish("r", &json!(3));
    let msg = recv(&mut ws);
    assert_eq!((&msg["offset"], &msg["data"]), (&json!(2), &json!(3)));
}

#[test]
fn expired_history_is_not_recovered() {
    let node = Node::start(&["--workers", "1", "--history-ttl", "1s"]);
    let mut ws = node.connect();
    let at = subscribe(&mut ws, &["e"]).remove(0);
    drop(ws);
    node.publish("e", &json!(1));
    node.publish("e", &json!(2));
    let mut ws = node.connect();
    let reply = resubscribe(&mut ws, "e", &at);
    assert_eq!(reply["recovered"], true, "within the TTL: {reply}");
    assert_eq!(recv(&mut ws)["data"], 1);
    assert_eq!(recv(&mut ws)["data"], 2);
    drop(ws);
    std::thread::sleep(Duration::from_millis(2_500));
    let mut ws = node.connect();
    let reply = resubscribe(&mut ws, "e", &at);
    assert_eq!(reply["recovered"], false, "past the TTL: {reply}");
    let stats = node.stats();
    assert_eq!(stats["history"]["messages"], 0, "{stats:#}");
}

#[test]
fn history_over_websocket_and_http() {
    let node = Node::start(&["--workers", "2"]);
    for n in 1..=5 {
        node.publish("h", &json!({"n": n}));
    }
    let mut ws = node.connect();
    send(
        &mut ws,
        json!({"op": "history", "subject": "h", "limit": 3, "id": 4}),
    );
    let reply = recv(&mut ws);
    assert_eq!(reply["op"], "history");
    assert_eq!(reply["id"], 4);
    assert_eq!(reply["offset"], 5);
    assert_eq!(offsets(&reply), [3, 4, 5]);
    assert_eq!(reply["publications"][0]["data"], json!({"n": 3}));
    let epoch = reply["epoch"].as_str().unwrap().to_owned();
    send(
        &mut ws,
        json!({"op": "history", "subject": "h", "since": {"epoch": epoch, "offset": 1}, "id": 5}),
    );
    let reply = recv(&mut ws);
    assert_eq!(reply["recovered"], true);
    assert_eq!(reply["publications"].as_array().unwrap().len(), 4);
    send(
        &mut ws,
        json!({"op": "history", "subject": "h", "since": {"epoch": "not-hex", "offset": 1}, "id": 6}),
    );
    assert_eq!(recv(&mut ws)["code"], "invalid_position");

    let (status, body) = node.http(
        "GET",
        &format!("/api/history?subject=h&epoch={epoch}&offset=3"),
        &[],
        "",
    );
    assert_eq!(status, 200, "{body}");
    let page: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(page["recovered"], true);
    assert_eq!(offsets(&page), [4, 5]);
    let (status, body) = node.http("GET", "/api/history?subject=h&limit=0", &[], "");
    assert_eq!(status, 200);
    let page: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (&page["offset"], &page["publications"]),
        (&json!(5), &json!([]))
    );
    // Percent-encoded, as URL libraries send it; '&' and '/' are subject bytes.
    node.publish("a/b&c=d", &json!(1));
    let (status, body) = node.http("GET", "/api/history?subject=a%2Fb%26c%3Dd", &[], "");
    assert_eq!(status, 200, "{body}");
    assert_eq!(offsets(&serde_json::from_str(&body).unwrap()), [1]);
    assert_eq!(node.http("GET", "/api/history?limit=1", &[], "").0, 400);
    assert_eq!(
        node.http("GET", "/api/history?subject=h&epoch=x&offset=1", &[], "")
            .0,
        400
    );
    assert_eq!(
        node.http("GET", "/api/history?subject=h&offset=1", &[], "")
            .0,
        400
    );
    let stats = node.stats();
    assert_eq!(stats["history"]["subjects"], 2);
    assert_eq!(stats["history"]["messages"], 6);
}

#[test]
fn namespaces_from_the_config_file_set_history_per_prefix() {
    let path = std::env::temp_dir().join(format!("myriad-ns-{}.toml", std::process::id()));
    let mut file = std::fs::File::create(&path).unwrap();
    writeln!(
        file,
        r#"history_size = 50
[[namespace]]
prefix = "chat."
history_size = 2
[[namespace]]
prefix = "ticks."
history_size = 0
"#
    )
    .unwrap();
    let node = Node::start(&["--workers", "1", "--config", path.to_str().unwrap()]);
    for n in 1..=5 {
        node.publish("chat.room", &json!(n));
        node.publish("news", &json!(n));
        let dropped = node.publish("ticks.eur", &json!(n));
        assert_eq!(dropped["offset"], Value::Null, "no history, no subscriber");
    }
    let kept = |subject: &str| -> usize {
        let (_, body) = node.http("GET", &format!("/api/history?subject={subject}"), &[], "");
        let page: Value = serde_json::from_str(&body).unwrap();
        page["publications"].as_array().unwrap().len()
    };
    assert_eq!(kept("chat.room"), 2);
    assert_eq!(kept("news"), 5);
    assert_eq!(kept("ticks.eur"), 0);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn subjects_nobody_subscribes_to_stay_inside_the_history_budget() {
    // Issue 26's first attack, in small: a publisher that writes one
    // message to each of many new subjects. Every subject's own state is
    // charged to history_max_bytes, so the node forgets the oldest (first
    // their idle positions, then their publications) instead of growing.
    let budget: u64 = 256 * 1024;
    let node = Node::start(&["--history-max-bytes", "262144", "--history-ttl", "0s"]);
    let first = node.publish("flood/0", &json!(1));
    let subjects = 20_000;
    let batch = 1_000;
    for start in (1..subjects).step_by(batch) {
        let messages: Vec<Value> = (start..(start + batch).min(subjects))
            .map(|n| json!({"subject": format!("flood/{n}"), "data": 1}))
            .collect();
        let (status, body) = node.http(
            "POST",
            "/api/publish",
            &[],
            &json!({"messages": messages}).to_string(),
        );
        assert_eq!(status, 200, "{body}");
    }
    let stats = node.stats();
    let history = &stats["history"];
    assert_eq!(history["max_bytes"], budget, "{stats:#}");
    assert!(history["bytes"].as_u64().unwrap() <= budget, "{stats:#}");
    assert!(history["evictions"].as_u64().unwrap() > 0, "{stats:#}");
    // Each kept subject costs more than 100 bytes beside its message.
    let kept = history["subjects"].as_u64().unwrap() + history["positions"].as_u64().unwrap();
    assert!(kept < budget / 100, "{kept} subjects kept: {stats:#}");
    let memory = &stats["memory"];
    assert_eq!(memory["history_bytes"], history["bytes"], "{stats:#}");
    assert!(memory["rss_bytes"].as_u64().unwrap() > 0, "{stats:#}");
    assert!(
        node.metric("myriad_history_positions_evicted_total")
            + node.metric("myriad_history_evictions_total")
            > 0,
        "the metric counts them too"
    );
    // The first subject was forgotten: coming back cannot claim recovery.
    let (status, body) = node.http(
        "GET",
        &format!(
            "/api/history?subject=flood/0&epoch={}&offset=1",
            first["epoch"].as_str().unwrap()
        ),
        &[],
        "",
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["recovered"],
        false
    );
}
