//! Graceful shutdown: on SIGTERM every client gets close 1001 and the
//! process exits cleanly within the shutdown timeout.

mod common;

use common::{recv_close, subscribe, Node};

#[test]
fn sigterm_sends_going_away_to_everyone_and_exits() {
    let mut node = Node::start(&["--workers", "2", "--shutdown-timeout", "5"]);
    let mut clients: Vec<_> = (0..10).map(|_| node.connect()).collect();
    for ws in &mut clients {
        subscribe(ws, &["bye"]);
    }
    node.terminate();
    for ws in &mut clients {
        assert_eq!(recv_close(ws), 1001);
    }
    // Clients still hold their sockets, so the node is still up: the
    // engine refuses what it would no longer deliver.
    let body = r#"{"subject":"bye","data":1}"#;
    let (status, reply) = node.http("POST", "/api/publish", &[], body);
    assert_eq!(status, 503, "{reply}");
    assert!(reply.contains("publish_failed"), "{reply}");
    let (status, reply) = node.http("GET", "/api/history?subject=bye", &[], "");
    assert_eq!(status, 503, "{reply}");
    assert_eq!(node.http("GET", "/healthz", &[], "").0, 503);
    // Clients answer the close (tungstenite does on read); the node then exits.
    drop(clients);
    node.wait_for_exit();
}
