//! The abuse limits against the real binary: connections per source
//! address, and the publish and subscription-change token buckets.
//! Counts only: the refill happens on the sweep's second, so each test
//! sends far more than any number of refills could let through.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{recv, Node, Ws};
use serde_json::{json, Value};
use socket2::{Domain, Socket, Type};
use tungstenite::Message;

/// A WebSocket to `/ws` from source address `from`; `Err(status)` when refused.
fn connect_from(node: &Node, from: &str) -> Result<Ws, u16> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    let source: SocketAddr = format!("{from}:0").parse().unwrap();
    socket.bind(&source.into()).unwrap();
    socket.connect(&node.ws.into()).unwrap();
    let stream: TcpStream = socket.into();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    match tungstenite::client(
        node.url("/ws"),
        tungstenite::stream::MaybeTlsStream::Plain(stream),
    ) {
        Ok((ws, _)) => Ok(ws),
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(response))) => {
            Err(response.status().as_u16())
        }
        Err(e) => panic!("connect: {e}"),
    }
}

#[test]
fn one_address_holds_at_most_its_share_of_connections() {
    let node = Node::start(&["--workers", "2", "--max-connections-per-ip", "3"]);
    let mut held: Vec<Ws> = (0..3)
        .map(|_| connect_from(&node, "127.0.0.1").unwrap())
        .collect();
    assert_eq!(connect_from(&node, "127.0.0.1").err(), Some(429));
    // Another address is counted on its own.
    let other = connect_from(&node, "127.0.0.2").expect("a second address");
    // A closed connection frees its place (once the node has seen it go).
    held.pop().unwrap().close(None).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let again = loop {
        match connect_from(&node, "127.0.0.1") {
            Ok(ws) => break ws,
            Err(429) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(status) => panic!("still refused: {status}"),
        }
    };
    drop((again, other));
    let stats = node.stats();
    assert!(
        stats["errors"]["over_ip_limit"].as_u64().unwrap() >= 1,
        "{stats:#}"
    );
}

/// Sends `commands` in one write, with ids 1.., and returns the first
/// `answers` replies; without a count, every reply before the pong of a
/// ping sent last (which overtakes answers that wait for the engine).
fn burst(ws: &mut Ws, commands: &[Value], answers: Option<usize>) -> Vec<Value> {
    let ping = json!({"op": "ping", "id": 0});
    let ping = answers.is_none().then_some(&ping);
    for (i, command) in commands.iter().chain(ping).enumerate() {
        let mut command = command.clone();
        if command["op"] != "ping" {
            command["id"] = json!(i + 1);
        }
        ws.write(Message::text(command.to_string())).unwrap();
    }
    ws.flush().unwrap();
    let mut replies = Vec::new();
    loop {
        let reply = recv(ws);
        if reply["op"] == "pong" {
            return replies;
        }
        replies.push(reply);
        if Some(replies.len()) == answers {
            return replies;
        }
    }
}

/// How many replies are `op` (and, for errors, `code`), to commands whose
/// id is odd (`Some(true)`), even, or any.
fn count(replies: &[Value], op: &str, code: Option<&str>, odd: Option<bool>) -> usize {
    replies
        .iter()
        .filter(|r| r["op"] == op && code.is_none_or(|c| r["code"] == c))
        .filter(|r| odd.is_none_or(|odd| (r["id"].as_u64().unwrap() % 2 == 1) == odd))
        .count()
}

#[test]
fn publishes_past_the_rate_are_refused_and_counted() {
    let node = Node::start(&["--workers", "1", "--client-publish-rate", "5"]);
    let mut ws = node.connect();
    let publishes: Vec<Value> = (0..200)
        .map(|i| json!({"op": "publish", "subject": "s", "data": i}))
        .collect();
    let replies = burst(&mut ws, &publishes, Some(200));
    let limited = count(&replies, "error", Some("rate_limited"), None);
    let ok = count(&replies, "ok", None, None);
    assert_eq!(ok + limited, 200);
    assert!(ok >= 5, "the burst passes: {ok}");
    assert!(limited >= 100, "refills are once a second: {ok} passed");
    let stats = node.stats();
    assert_eq!(stats["errors"]["rate_limited"], limited as u64, "{stats:#}");
    assert_eq!(stats["publishes"], ok as u64);
}

#[test]
fn subscribe_churn_drains_the_subscription_bucket() {
    let node = Node::start(&["--workers", "1", "--client-subscribe-rate", "4"]);
    let mut ws = node.connect();
    let subjects = ["a", "b", "c", "d"];
    let mut commands = Vec::new();
    for _ in 0..50 {
        commands.push(json!({"op": "subscribe", "subjects": subjects}));
        commands.push(json!({"op": "unsubscribe", "subjects": subjects}));
    }
    let replies = burst(&mut ws, &commands, None);
    // Odd ids subscribe, even ids unsubscribe. A subscribe cancelled by the
    // unsubscribe right behind it is answered by nothing, so the counts
    // are of refusals and of unsubscribes.
    assert_eq!(
        count(&replies, "ok", None, Some(false)),
        50,
        "unsubscribing is never refused"
    );
    let limited = count(&replies, "error", Some("rate_limited"), Some(true));
    assert!(
        limited >= 25,
        "each cycle costs 8 of 4 tokens a second: {limited}"
    );
    assert_eq!(count(&replies, "error", None, None), limited);
    let stats = node.stats();
    assert_eq!(stats["errors"]["rate_limited"], limited as u64);
    assert_eq!(stats["subscriptions"], 0);
}
