//! The follow graph's admin API and connections acting as users, as the
//! graph tests drive them.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use super::{recv, send, Node, Ws};

/// POSTs `body` to the admin API; (status, JSON reply).
pub fn post(node: &Node, path: &str, body: Value) -> (u16, Value) {
    let (status, reply) = node.http("POST", path, &[], &body.to_string());
    let reply = serde_json::from_str(&reply).unwrap_or(Value::Null);
    (status, reply)
}

pub fn follow(node: &Node, edges: &[(u64, u64)]) -> u64 {
    let (status, reply) = post(node, "/api/follow", json!({ "edges": edges }));
    assert_eq!(status, 200, "{reply}");
    reply["added"].as_u64().unwrap()
}

pub fn unfollow(node: &Node, edges: &[(u64, u64)]) -> u64 {
    let (status, reply) = post(node, "/api/unfollow", json!({ "edges": edges }));
    assert_eq!(status, 200, "{reply}");
    reply["removed"].as_u64().unwrap()
}

/// Sends as `user` through the admin API; how many connections it reached.
pub fn publish_as(node: &Node, user: u64, data: Value) -> u64 {
    let (status, reply) = post(node, "/api/publish_as", json!({"user": user, "data": data}));
    assert_eq!(status, 200, "{reply}");
    reply["reached"].as_u64().unwrap()
}

/// Connects as `user` and waits until every feed in `feeds` is announced.
pub fn connect_as(node: &Node, user: u64, feeds: &[u64]) -> Ws {
    let mut ws = node.connect_path(&format!("/ws?user={user}"));
    let expected: BTreeSet<String> = feeds.iter().map(|f| format!("@{f}")).collect();
    let mut seen = BTreeSet::new();
    while seen != expected {
        let reply = recv(&mut ws);
        assert_eq!(reply["op"], "subscribed", "{reply}");
        assert!(reply["id"].is_null(), "{reply}");
        let subject = reply["subject"].as_str().unwrap().to_owned();
        assert!(expected.contains(&subject), "unexpected feed {subject}");
        assert!(seen.insert(subject), "feed announced twice: {reply}");
    }
    ws
}

/// The next message on `ws`, which must be a delivery; its (subject, data).
pub fn next_delivery(ws: &mut Ws) -> (String, Value) {
    let message = recv(ws);
    assert_eq!(message["op"], "msg", "{message}");
    (
        message["subject"].as_str().unwrap().to_owned(),
        message["data"].clone(),
    )
}

/// Proves nothing else is queued for `ws`: a ping's pong comes next.
pub fn nothing_pending(ws: &mut Ws) {
    send(ws, json!({"op": "ping", "id": 99}));
    let reply = recv(ws);
    assert_eq!(
        reply,
        json!({"op": "pong", "id": 99}),
        "a message was pending"
    );
}
