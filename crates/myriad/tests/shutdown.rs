//! Graceful shutdown: on SIGTERM every client gets close 1001, every API
//! request in flight gets its answer, and the process exits cleanly within
//! the shutdown timeout.

mod common;

use common::{http, recv, recv_close, send, subscribe, wait_until, KeepAlive, Node};
use myriad_testkit::RedisServer;
use serde_json::json;
use std::io::Read;
use std::net::{SocketAddr, TcpStream};

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

/// A publish the engine has taken when the node is told to stop may
/// already be in Redis: it gets its answer, not a cut connection, even
/// once every client is gone; an idle API connection does not hold the
/// shutdown up.
#[test]
fn an_api_publish_in_flight_at_shutdown_gets_its_answer() {
    let redis = RedisServer::start();
    let mut node = patient_node(&redis);
    let mut ws = node.connect();
    subscribe(&mut ws, &["elsewhere"]);
    let mut idle = KeepAlive::open(node.admin);
    assert_eq!(idle.get("/healthz", &[]).0, 200);

    redis.pause();
    let admin = node.admin;
    let publish = std::thread::spawn(move || {
        http(
            admin,
            "POST",
            "/api/publish",
            &[],
            r#"{"subject":"late","data":1}"#,
        )
    });
    wait_for_the_engine_to_take_a_publish(&node);
    node.terminate();
    assert_eq!(recv_close(&mut ws), 1001);
    drop(ws);
    // The workers are done once the admin listener closes; the publish is
    // still unanswered, its Redis stalled.
    wait_until("the admin listener closes", || !listening(admin));
    assert!(!publish.is_finished(), "answered before Redis could run it");
    // The idle connection was closed without waiting for its idle timeout.
    let mut rest = Vec::new();
    assert_eq!(idle.stream().read_to_end(&mut rest).unwrap(), 0);

    redis.resume();
    let (status, reply) = publish.join().unwrap();
    assert_eq!(status, 200, "{reply}");
    let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(reply["offset"], 1, "{reply}");
    node.wait_for_exit();
}

/// A WebSocket publish the engine has taken when the node is told to stop
/// is answered before the client is told 1001.
#[test]
fn a_publish_in_flight_at_shutdown_is_answered_before_going_away() {
    let redis = RedisServer::start();
    let mut node = patient_node(&redis);
    let mut ws = node.connect();

    redis.pause();
    let publish = json!({"op": "publish", "id": 7, "subject": "late", "data": 1});
    send(&mut ws, publish);
    wait_for_the_engine_to_take_a_publish(&node);
    node.terminate();
    // The worker has begun draining once its listener is closed.
    wait_until("the client listener closes", || !listening(node.ws));

    redis.resume();
    let ack = recv(&mut ws);
    assert_eq!(
        (&ack["op"], &ack["id"], &ack["offset"]),
        (&json!("ok"), &json!(7), &json!(1)),
        "{ack}"
    );
    assert_eq!(recv_close(&mut ws), 1001);
    drop(ws);
    node.wait_for_exit();
}

/// One worker over `redis`, waiting for as long as a test stalls it.
fn patient_node(redis: &RedisServer) -> Node {
    let extra = ["--workers", "1", "--redis-timeout", "60s"];
    Node::in_cluster_of(&[redis], "drain", &extra)
}

/// Waits for the node's engine to have taken one publish: held there by
/// the stalled Redis.
fn wait_for_the_engine_to_take_a_publish(node: &Node) {
    node.wait_for_stats("the publish to reach the engine", |s| s["publishes"] == 1);
}

/// Whether something accepts connections at `addr`.
fn listening(addr: SocketAddr) -> bool {
    TcpStream::connect(addr).is_ok()
}
