//! Subscribe/publish round trips against the real binary: over WebSocket,
//! across workers, after unsubscribing, and through the HTTP publish API.

mod common;

use common::{recv, send, subscribe, Node};
use serde_json::json;

#[test]
fn websocket_round_trip_with_positions() {
    let node = Node::start(&["--workers", "1"]);
    let mut sub = node.connect();
    let at = subscribe(&mut sub, &["news"]).remove(0);
    assert_eq!(at["offset"], 0, "nothing published yet");
    let epoch = at["epoch"].clone();
    assert_eq!(epoch.as_str().unwrap().len(), 16);
    let mut publisher = node.connect();
    for i in 0..3 {
        send(
            &mut publisher,
            json!({"op": "publish", "subject": "news", "data": {"n": i}, "id": 10 + i}),
        );
        assert_eq!(
            recv(&mut publisher),
            json!({"op": "ok", "id": 10 + i, "epoch": epoch, "offset": i + 1, "reached": 1})
        );
    }
    for i in 0..3 {
        let msg = recv(&mut sub);
        assert_eq!(
            msg,
            json!({"op": "msg", "subject": "news", "epoch": epoch, "offset": i + 1, "data": {"n": i}})
        );
    }
    // A plain subscribe's reply carries the current position.
    let mut late = node.connect();
    assert_eq!(
        subscribe(&mut late, &["news"]),
        [json!({"epoch": epoch, "offset": 3})]
    );
    // `null` is data like any other JSON value.
    send(
        &mut publisher,
        json!({"op": "publish", "subject": "news", "data": null, "id": 20}),
    );
    assert_eq!(recv(&mut publisher)["offset"], 4);
    assert_eq!(recv(&mut sub)["data"], json!(null));
    send(&mut sub, json!({"op": "ping", "id": 5}));
    assert_eq!(recv(&mut sub), json!({"op": "pong", "id": 5}));
}

#[test]
fn every_subscriber_on_every_worker_gets_every_message_in_order() {
    let node = Node::start(&["--workers", "2"]);
    let mut subs: Vec<_> = (0..60).map(|_| node.connect()).collect();
    for ws in &mut subs {
        subscribe(ws, &["fan"]);
    }
    let stats = node.stats();
    assert_eq!(stats["subscriptions"], 60);
    assert_eq!(stats["subjects"], 1);
    for i in 0..20 {
        let reply = node.publish("fan", &json!(i));
        assert_eq!(reply["offset"], i + 1);
        assert_eq!(reply["delivered"], 60);
    }
    for ws in &mut subs {
        for i in 0..20 {
            let msg = recv(ws);
            assert_eq!(msg["offset"], i + 1);
            assert_eq!(msg["data"], i);
        }
    }
    let stats = node.stats();
    assert!(stats["messages_out"].as_u64().unwrap() >= 60 * 20);
}

#[test]
fn unsubscribe_stops_delivery_and_frees_the_subject() {
    let node = Node::start(&["--workers", "1"]);
    let mut a = node.connect();
    let mut b = node.connect();
    subscribe(&mut a, &["x", "y"]);
    subscribe(&mut b, &["y"]);
    send(
        &mut a,
        json!({"op": "unsubscribe", "subjects": ["x", "y"], "id": 2}),
    );
    assert_eq!(recv(&mut a), json!({"op": "ok", "id": 2}));
    assert_eq!(node.stats()["subjects"], 1);
    let unheard = node.publish("x", &json!(1));
    assert_eq!(unheard["delivered"], 0);
    assert_eq!(unheard["offset"], 1, "kept in history all the same");
    assert_eq!(node.publish("y", &json!(2))["delivered"], 1);
    assert_eq!(recv(&mut b)["data"], 2);
    // `a` gets nothing: its next message is the pong.
    send(&mut a, json!({"op": "ping", "id": 3}));
    assert_eq!(recv(&mut a), json!({"op": "pong", "id": 3}));
}

#[test]
fn batch_publish_and_admin_endpoints() {
    let node = Node::start(&["--workers", "2"]);
    let mut sub = node.connect();
    subscribe(&mut sub, &["a", "b"]);
    let body = json!({"messages": [
        {"subject": "a", "data": 1},
        {"subject": "b", "data": [2]},
        {"subject": "nobody", "data": 3},
    ]})
    .to_string();
    let (status, reply) = node.http("POST", "/api/publish", &[], &body);
    assert_eq!(status, 200);
    let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(reply["delivered"], 2);
    assert_eq!(reply["results"][2]["delivered"], 0);
    assert_eq!(reply["results"][2]["offset"], 1);
    assert_eq!(recv(&mut sub)["data"], 1);
    assert_eq!(recv(&mut sub)["data"], json!([2]));

    for (body, code) in [
        ("not json", "invalid_json"),
        (r#"{"subject":"a"}"#, "missing_field"),
        (r#"{"subject":"a b","data":1}"#, "invalid_subject"),
    ] {
        let (status, reply) = node.http("POST", "/api/publish", &[], body);
        assert_eq!(status, 400, "{body}");
        let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
        assert_eq!(reply["error"]["code"], code);
    }
    // A body over max_http_body is refused from its declared length, before
    // any of it is read; sending it too would race the refusal's close.
    let big = "POST /api/publish HTTP/1.1\r\nHost: x\r\nContent-Length: 2097152\r\n\r\n";
    assert_eq!(common::raw_status(node.admin, big), 413);

    assert_eq!(
        node.http("GET", "/healthz", &[], ""),
        (200, "ok\n".to_owned())
    );
    assert_eq!(node.http("GET", "/api/publish", &[], "").0, 405);
    assert_eq!(node.http("GET", "/nope", &[], "").0, 404);
    let (status, metrics) = node.http("GET", "/metrics", &[], "");
    assert_eq!(status, 200);
    for family in [
        "myriad_connections{worker=\"1\"}",
        "myriad_publishes_total 3",
        "myriad_publishes_unrouted_total 1",
        "myriad_errors_total{kind=\"api_bad_request\"} 3",
        "myriad_errors_total{kind=\"api_body_too_large\"} 1",
    ] {
        assert!(metrics.contains(family), "{family} missing:\n{metrics}");
    }
    let stats = node.stats();
    assert_eq!(stats["connections"], 1);
    assert!(stats["process"]["rss_bytes"].as_u64().unwrap() > 0);
    assert!(stats["rss_per_connection"].as_f64().unwrap() > 0.0);
}
