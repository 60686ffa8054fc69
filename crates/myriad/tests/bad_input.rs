//! Every kind of bad input gets its documented answer (HTTP status, error
//! code or close code), is counted, and leaves the node serving others.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{raw_status, recv, recv_close, send, subscribe, Node};
use serde_json::json;
use tungstenite::Message;

const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

#[test]
fn handshake_errors_have_their_status() {
    let node = Node::start(&["--workers", "1"]);
    let upgrade = |path: &str, extra: &str| {
        format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n{extra}\r\n"
        )
    };
    let cases = [
        (upgrade("/nope", &format!("Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n")), 404),
        (upgrade("/ws", "Sec-WebSocket-Version: 13\r\n"), 400),
        (upgrade("/ws", "Sec-WebSocket-Key: short\r\nSec-WebSocket-Version: 13\r\n"), 400),
        (upgrade("/ws", &format!("Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 8\r\n")), 426),
        ("GET /ws HTTP/1.1\r\nHost: x\r\n\r\n".to_owned(), 426),
        (format!("POST /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n"), 405),
        ("garbage\r\n\r\n".to_owned(), 400),
        (format!("GET /ws HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(9000)), 431),
    ];
    for (request, status) in &cases {
        assert_eq!(raw_status(node.ws, request), *status, "{request:.60}");
    }
    let stats = node.wait_for_stats("rejections counted", |s| {
        s["closes"]["handshake_rejected"] == cases.len()
    });
    assert_eq!(stats["errors"]["handshake_404_not_found"], 1);
    assert_eq!(stats["errors"]["handshake_400_bad_request"], 3);
    assert_eq!(stats["errors"]["handshake_426_upgrade_required"], 2);
    assert_eq!(stats["errors"]["handshake_405_method_not_allowed"], 1);
    assert_eq!(stats["errors"]["handshake_431_too_large"], 1);
    // And the node still serves.
    let mut ws = node.connect();
    subscribe(&mut ws, &["ok"]);
}

#[test]
fn the_request_head_limit_is_a_setting() {
    let upgrade = |padding: usize| {
        format!(
            "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\nX-Pad: {}\r\n\r\n",
            "a".repeat(padding)
        )
    };
    let small = Node::start(&["--workers", "1", "--max-request-head", "2048"]);
    assert_eq!(raw_status(small.ws, &upgrade(1000)), 101);
    assert_eq!(raw_status(small.ws, &upgrade(3000)), 431);
    let large = Node::start(&["--workers", "1", "--max-request-head", "32768"]);
    assert_eq!(raw_status(large.ws, &upgrade(20_000)), 101);
}

#[test]
fn bad_commands_get_error_codes_and_the_connection_stays() {
    let node = Node::start(&[
        "--workers",
        "1",
        "--max-subscriptions",
        "2",
        "--max-subject-len",
        "8",
    ]);
    let mut ws = node.connect();
    let cases = [
        ("{not json", "invalid_json", None),
        (r#"{"op":"fly","id":1}"#, "unknown_op", Some(1)),
        (r#"{"op":"subscribe","id":2}"#, "missing_field", Some(2)),
        (
            r#"{"op":"subscribe","subjects":["has space"],"id":3}"#,
            "invalid_subject",
            Some(3),
        ),
        (
            r#"{"op":"subscribe","subjects":["waytoolong"],"id":4}"#,
            "invalid_subject",
            Some(4),
        ),
        (
            r#"{"op":"subscribe","subjects":["a","b","c"],"id":5}"#,
            "too_many_subscriptions",
            Some(5),
        ),
        (
            r#"{"op":"publish","subject":"a","id":6}"#,
            "missing_field",
            Some(6),
        ),
    ];
    for (text, code, id) in cases {
        ws.send(Message::text(text)).unwrap();
        let reply = recv(&mut ws);
        assert_eq!(reply["op"], "error", "{text}");
        assert_eq!(reply["code"], code, "{text}");
        assert_eq!(reply.get("id").and_then(|v| v.as_u64()), id, "{text}");
    }
    // Still usable, and the refused subscribe applied nothing.
    subscribe(&mut ws, &["a", "b"]);
    let stats = node.stats();
    assert_eq!(stats["subscriptions"], 2);
    assert_eq!(stats["errors"]["invalid_subject"], 2);
    assert_eq!(stats["errors"]["too_many_subscriptions"], 1);
    assert_eq!(stats["errors"]["missing_field"], 2);
}

#[test]
fn frame_level_violations_close_with_their_code() {
    let node = Node::start(&["--workers", "1", "--max-message-size", "1024"]);
    let mut bystander = node.connect();
    subscribe(&mut bystander, &["calm"]);

    for (message, code) in [
        (Message::binary(vec![1, 2, 3]), 1003),
        (Message::text("x".repeat(2000)), 1009),
    ] {
        let mut ws = node.connect();
        ws.send(message).unwrap();
        assert_eq!(recv_close(&mut ws), code);
    }

    // Raw frames for what tungstenite will not send: invalid UTF-8 and an
    // unmasked client frame.
    for (frame, code) in [
        (vec![0x81u8, 0x82, 0, 0, 0, 0, 0xc3, 0x28], 1007u16),
        (vec![0x81u8, 0x02, b'h', b'i'], 1002),
        (vec![0x83u8, 0x80, 0, 0, 0, 0], 1002),
    ] {
        assert_eq!(raw_close_code(&node, &frame), code, "{frame:02x?}");
    }
    node.wait_for_stats("each close counted by reason", |s| {
        let closes = &s["closes"];
        closes["protocol_error"] == 2
            && closes["unsupported_data"] == 1
            && closes["message_too_big"] == 1
            && closes["invalid_utf8"] == 1
    });

    assert_eq!(node.publish("calm", &json!("still here"))["delivered"], 1);
    assert_eq!(recv(&mut bystander)["data"], "still here");
}

/// Upgrades a raw socket, sends `frame`, and returns the close code the
/// server answers with.
fn raw_close_code(node: &Node, frame: &[u8]) -> u16 {
    let mut s = TcpStream::connect(node.ws).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    .unwrap();
    s.write_all(frame).unwrap();
    let mut bytes = Vec::new();
    let _ = s.read_to_end(&mut bytes);
    let head_end = bytes.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let close = &bytes[head_end..];
    assert_eq!(close[0], 0x88, "a close frame, got {close:02x?}");
    u16::from_be_bytes([close[2], close[3]])
}

#[test]
fn publishing_connections_cannot_break_subscribers() {
    let node = Node::start(&["--workers", "2"]);
    let mut sub = node.connect();
    subscribe(&mut sub, &["s"]);
    let mut noisy = node.connect();
    for _ in 0..50 {
        noisy.send(Message::text("][")).unwrap();
    }
    send(
        &mut noisy,
        json!({"op": "publish", "subject": "s", "data": 1}),
    );
    assert_eq!(recv(&mut sub)["data"], 1);
    for _ in 0..50 {
        assert_eq!(recv(&mut noisy)["code"], "invalid_json");
    }
}

#[test]
fn connections_that_leave_before_a_request_count_as_no_request() {
    let node = Node::start(&["--workers", "1"]);
    // A port check: connect, say nothing, leave.
    drop(TcpStream::connect(node.ws).unwrap());
    // A client that gives up mid-request.
    let mut partial = TcpStream::connect(node.ws).unwrap();
    partial
        .write_all(b"GET /ws HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    drop(partial);
    // A long-poll loop that stops between polls: HTTP's own way to end a
    // kept-alive connection, so a normal close.
    let at = node.publish("polled", &json!(1));
    let mut poll = TcpStream::connect(node.ws).unwrap();
    poll.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        poll,
        "GET /poll?subject=polled&since={}:0 HTTP/1.1\r\nHost: x\r\n\r\n",
        at["epoch"].as_str().unwrap()
    )
    .unwrap();
    let mut answer = Vec::new();
    while !answer.ends_with(b"]") {
        let mut buf = [0u8; 4096];
        let n = poll.read(&mut buf).unwrap();
        assert!(n > 0, "the answer ended early: {answer:?}");
        answer.extend_from_slice(&buf[..n]);
    }
    drop(poll);

    let stats = node.wait_for_stats("the three counted", |s| {
        s["connections"] == 0 && s["closes"]["no_request"] == 2
    });
    assert_eq!(stats["closes"]["normal"], 1);
    assert_eq!(stats["closes"]["abnormal"], 0);
}
