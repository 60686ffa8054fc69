//! Input that never becomes whole (issue 26): a client that announces a
//! large frame and trickles its bytes, or sends a fragmented message one
//! tiny fragment at a time, holds the node's memory. Only whole frames
//! answer a heartbeat, a message begun must end within
//! `partial_message_timeout` (4004), and what connections hold
//! incomplete is reported as `partial_input_bytes` and kept within
//! `max_partial_input_bytes` per worker (4005). A client that sends a
//! large message at an ordinary pace is left alone.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{recv, set_timeout, subscribe, Node, Ws};
use serde_json::{json, Value};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::Message;

/// How long a test waits for a close it expects; far past every timeout
/// these tests configure.
const BOUND: Duration = Duration::from_secs(30);

/// The head of a masked client frame with `payload_len` bytes to follow.
/// The mask is zero, so the payload goes on the wire as it is.
fn frame_head(opcode: u8, fin: bool, payload_len: usize) -> Vec<u8> {
    let mut head = vec![opcode | if fin { 0x80 } else { 0 }];
    match payload_len {
        0..=125 => head.push(0x80 | payload_len as u8),
        126..=0xFFFF => {
            head.push(0x80 | 126);
            head.extend_from_slice(&(payload_len as u16).to_be_bytes());
        }
        _ => {
            head.push(0x80 | 127);
            head.extend_from_slice(&(payload_len as u64).to_be_bytes());
        }
    }
    head.extend_from_slice(&[0; 4]);
    head
}

/// A publish command to `subject` padded to exactly `len` bytes.
fn publish_of_len(subject: &str, len: usize) -> Vec<u8> {
    let empty = json!({"op": "publish", "subject": subject, "data": ""}).to_string();
    let data = "x".repeat(len - empty.len());
    let command = json!({"op": "publish", "subject": subject, "data": data}).to_string();
    assert_eq!(command.len(), len);
    command.into_bytes()
}

/// The socket under `ws`, for bytes tungstenite would never send.
fn raw(ws: &mut Ws) -> &mut TcpStream {
    match ws.get_mut() {
        MaybeTlsStream::Plain(socket) => socket,
        _ => unreachable!("plain sockets only"),
    }
}

/// Every `pace`, writes `next()` raw, and reads what the node sends
/// (tungstenite answers its pings, inside the frame being trickled: they
/// are payload there, not pongs), until the node's close frame; returns
/// its code.
fn trickle_until_closed(ws: &mut Ws, pace: Duration, next: impl Fn() -> Vec<u8>) -> u16 {
    set_timeout(ws, pace);
    let started = Instant::now();
    loop {
        assert!(started.elapsed() < BOUND, "still open after {BOUND:?}");
        // The node may have closed already; its close frame is still read.
        let _ = raw(ws).write_all(&next());
        match ws.read() {
            Ok(Message::Close(Some(frame))) => return u16::from(frame.code),
            Ok(Message::Close(None)) => return 1005,
            Ok(_) => {}
            Err(tungstenite::Error::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("ended without a close frame: {e}"),
        }
    }
}

/// A subscribed client that begins a 60,000-byte frame with a tenth of it.
fn begin_large_frame(node: &Node, subject: &str) -> Ws {
    let mut ws = node.connect();
    subscribe(&mut ws, &[subject]);
    let command = publish_of_len(subject, 60_000);
    let socket = raw(&mut ws);
    socket
        .write_all(&frame_head(0x1, true, command.len()))
        .unwrap();
    socket.write_all(&command[..6_000]).unwrap();
    ws
}

#[test]
fn a_trickled_frame_does_not_answer_the_heartbeat() {
    // The partial-message deadline is off: only the heartbeat can end it.
    let node = Node::start(&[
        "--workers",
        "1",
        "--heartbeat-interval",
        "1",
        "--heartbeat-timeout",
        "1",
        "--partial-message-timeout",
        "0",
    ]);
    let mut ws = begin_large_frame(&node, "trickle");
    // A byte every 200 ms: far more often than the heartbeat's timeout.
    let code = trickle_until_closed(&mut ws, Duration::from_millis(200), || b"x".to_vec());
    assert_eq!(code, 4002);
    let stats = node.wait_for_stats("the heartbeat close counted", |s| {
        s["closes"]["heartbeat_timeout"] == 1
    });
    assert_eq!(stats["closes"]["partial_message_timeout"], 0);
}

#[test]
fn a_message_not_finished_in_time_is_closed_with_4004() {
    // No heartbeats: the deadline of the message alone ends these.
    let node = Node::start(&[
        "--workers",
        "1",
        "--heartbeat-interval",
        "0",
        "--partial-message-timeout",
        "1",
    ]);
    let mut bystander = node.connect();
    subscribe(&mut bystander, &["calm"]);

    // A frame, trickled a byte at a time.
    let mut frame = begin_large_frame(&node, "trickle");
    let code = trickle_until_closed(&mut frame, Duration::from_millis(200), || b"x".to_vec());
    assert_eq!(code, 4004);

    // A fragmented message: every fragment a whole frame, each a byte.
    let mut fragments = node.connect();
    subscribe(&mut fragments, &["trickle"]);
    let command = publish_of_len("trickle", 2_000);
    let mut first = frame_head(0x1, false, 1_000);
    first.extend_from_slice(&command[..1_000]);
    raw(&mut fragments).write_all(&first).unwrap();
    let code = trickle_until_closed(&mut fragments, Duration::from_millis(200), || {
        let mut more = frame_head(0x0, false, 1);
        more.push(b'x');
        more
    });
    assert_eq!(code, 4004);

    let stats = node.wait_for_stats("both closes counted, the bystander kept", |s| {
        s["closes"]["partial_message_timeout"] == 2 && s["connections"] == 1
    });
    assert_eq!(stats["closes"]["heartbeat_timeout"], 0);
    let (_, metrics) = node.http("GET", "/metrics", &[], "");
    let series = "myriad_connections_closed_total{reason=\"partial_message_timeout\"} 2";
    assert!(metrics.lines().any(|line| line == series), "{metrics}");
    assert_eq!(node.publish("calm", &json!("still here"))["delivered"], 1);
    assert_eq!(recv(&mut bystander)["data"], "still here");
}

#[test]
fn a_large_message_at_an_ordinary_pace_is_left_alone() {
    let node = Node::start(&[
        "--workers",
        "1",
        "--heartbeat-interval",
        "1",
        "--heartbeat-timeout",
        "1",
        "--partial-message-timeout",
        "2",
    ]);
    let mut reader = node.connect();
    subscribe(&mut reader, &["big"]);
    let mut writer = node.connect();
    subscribe(&mut writer, &["other"]);

    // One 60,000-byte message in one write, another in three pieces a
    // little apart (a client on a slower link), both far within the
    // message's deadline.
    writer
        .send(Message::text(
            String::from_utf8(publish_of_len("big", 60_000)).unwrap(),
        ))
        .unwrap();
    let mut frame = frame_head(0x1, true, 60_000);
    frame.extend_from_slice(&publish_of_len("big", 60_000));
    for piece in frame.chunks(frame.len() / 3 + 1) {
        raw(&mut writer).write_all(piece).unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    set_timeout(&reader, Duration::from_secs(10));
    let sent: Value = serde_json::from_slice(&publish_of_len("big", 60_000)).unwrap();
    for _ in 0..2 {
        assert_eq!(recv(&mut reader)["data"], sent["data"]);
    }

    // Both stay through several heartbeats, answering them.
    set_timeout(&reader, Duration::from_millis(100));
    set_timeout(&writer, Duration::from_millis(100));
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        for ws in [&mut reader, &mut writer] {
            match ws.read() {
                Ok(_) => {}
                Err(tungstenite::Error::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => panic!("an honest client lost its connection: {e}"),
            }
        }
    }
    let stats = node.wait_for_stats("nothing held", |s| s["partial_input_bytes"] == 0);
    assert_eq!(stats["connections"], 2);
    assert_eq!(stats["closes"]["partial_message_timeout"], 0);
    assert_eq!(stats["closes"]["heartbeat_timeout"], 0);
}

#[test]
fn bytes_held_for_an_incomplete_frame_are_reported() {
    let node = Node::start(&["--workers", "1"]);
    let mut ws = node.connect();
    subscribe(&mut ws, &["held"]);
    let command = publish_of_len("held", 40_000);
    raw(&mut ws)
        .write_all(&frame_head(0x1, true, command.len()))
        .unwrap();
    raw(&mut ws).write_all(&command[..30_000]).unwrap();

    // What is held is at least what was sent, and within one frame of the
    // largest message: the buffer does not grow past what a frame needs.
    let largest_frame = 65_536 + 14;
    let held = |s: &Value| s["partial_input_bytes"].as_u64().unwrap();
    let stats = node.wait_for_stats("the partial frame counted", |s| held(s) >= 30_000);
    assert!(held(&stats) <= largest_frame, "{stats:#}");
    let exposed = node.metric_sum("myriad_partial_input_bytes");
    assert!((30_000..=largest_frame).contains(&exposed), "{exposed}");

    // Once the frame is whole, it is a publish like any other and nothing
    // is held any more.
    raw(&mut ws).write_all(&command[30_000..]).unwrap();
    set_timeout(&ws, Duration::from_secs(10));
    let delivery = recv(&mut ws);
    assert_eq!(delivery["subject"], "held");
    node.wait_for_stats("nothing held", |s| held(s) == 0);
    assert_eq!(node.metric_sum("myriad_partial_input_bytes"), 0);
}

#[test]
fn past_the_budget_the_longest_held_input_is_closed_with_4005() {
    // Neither deadline can end them: only the worker's budget does.
    let node = Node::start(&[
        "--workers",
        "1",
        "--heartbeat-interval",
        "0",
        "--partial-message-timeout",
        "0",
        "--max-partial-input-bytes",
        "100000",
    ]);
    // Each holds 60,000 bytes of a 65,000-byte frame: one alone is within
    // the budget, the two together are not.
    let begin = |subject: &str| {
        let mut ws = node.connect();
        subscribe(&mut ws, &[subject]);
        let command = publish_of_len(subject, 65_000);
        raw(&mut ws)
            .write_all(&frame_head(0x1, true, command.len()))
            .unwrap();
        raw(&mut ws).write_all(&command[..60_000]).unwrap();
        (ws, command)
    };
    let held = |s: &Value| s["partial_input_bytes"].as_u64().unwrap();
    let (mut older, _) = begin("older");
    node.wait_for_stats("the first one's input held", |s| held(s) >= 60_000);
    // Its input is stamped in an earlier second than the next one's.
    std::thread::sleep(Duration::from_millis(1_100));
    let (mut newer, command) = begin("newer");

    set_timeout(&older, Duration::from_secs(10));
    assert_eq!(common::recv_close(&mut older), 4005);
    let stats = node.wait_for_stats("the oldest cut", |s| {
        s["closes"]["partial_input_budget"] == 1 && s["connections"] == 1
    });
    assert!(held(&stats) <= 100_000, "{stats:#}");

    // The newer one keeps its place: its message completes and is delivered.
    raw(&mut newer).write_all(&command[60_000..]).unwrap();
    set_timeout(&newer, Duration::from_secs(10));
    assert_eq!(recv(&mut newer)["subject"], "newer");
    assert_eq!(node.stats()["closes"]["partial_input_budget"], 1);
}
