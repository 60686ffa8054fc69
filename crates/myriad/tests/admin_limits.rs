//! The admin listener's limits against the real binary, each a finding of
//! issue 10 reproduced: a head that never ends, a body that never ends, an
//! idle keep-alive, a body declared too large, and admin connections
//! enough to take every descriptor the node has; and the other way round,
//! client refusals that would take the admin listener's descriptors.
//! Timeouts are checked as lower bounds (never early) and generous upper
//! ones.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{raw_status, KeepAlive, Node};
use serde_json::Value;

/// Longer than any timeout these tests set, by far.
const GENEROUS: Duration = Duration::from_secs(20);

/// What a peer that keeps trickling learns: the bytes the node sent, once
/// it closed the connection. `trickle` is written every 200 ms until then;
/// fails if the node keeps the connection past [`GENEROUS`].
fn trickle_until_closed(stream: &mut TcpStream, trickle: &[u8]) -> (Vec<u8>, Duration) {
    let start = Instant::now();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        assert!(
            start.elapsed() < GENEROUS,
            "still open after {GENEROUS:?}; read {:?}",
            String::from_utf8_lossy(&answer)
        );
        match stream.read(&mut buf) {
            Ok(0) => return (answer, start.elapsed()),
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                // A write after the node closed may fail: the read says so next.
                let _ = stream.write_all(trickle);
            }
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return (answer, start.elapsed()),
            Err(e) => panic!("{e}"),
        }
    }
}

fn errors(stats: &Value, kind: &str) -> u64 {
    stats["errors"][kind].as_u64().unwrap_or(0)
}

#[test]
fn a_head_that_never_ends_is_closed_after_the_header_timeout() {
    let node = Node::start(&["--workers", "1", "--admin-header-timeout", "1"]);
    // One header line every 200 ms, for ever.
    let mut slow = TcpStream::connect(node.admin).unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n")
        .unwrap();
    let (answer, took) = trickle_until_closed(&mut slow, b"X-Slow: 1\r\n");
    assert!(answer.is_empty(), "{:?}", String::from_utf8_lossy(&answer));
    assert!(took >= Duration::from_millis(900), "closed early: {took:?}");
    // A connection that sends nothing at all waits no longer.
    let mut silent = TcpStream::connect(node.admin).unwrap();
    let (_, took) = trickle_until_closed(&mut silent, b"");
    assert!(took >= Duration::from_millis(900), "closed early: {took:?}");
    let stats = node.stats();
    assert_eq!(errors(&stats, "admin_header_timeout"), 2, "{stats:#}");
}

#[test]
fn a_body_that_never_ends_gets_408() {
    let node = Node::start(&["--workers", "1", "--admin-body-timeout", "1"]);
    // A chunked body whose chunks keep coming, and one that stops.
    let chunked = b"POST /api/publish HTTP/1.1\r\nHost: test\r\n\
        Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n";
    let stalled = b"POST /api/publish HTTP/1.1\r\nHost: test\r\nContent-Length: 100\r\n\r\n{";
    for (request, trickle) in [(&chunked[..], &b"1\r\n \r\n"[..]), (&stalled[..], &b""[..])] {
        let mut stream = TcpStream::connect(node.admin).unwrap();
        stream.write_all(request).unwrap();
        let (answer, took) = trickle_until_closed(&mut stream, trickle);
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
        assert!(answer.contains(r#""code":"body_timeout""#), "{answer}");
        assert!(
            took >= Duration::from_millis(900),
            "answered early: {took:?}"
        );
    }
    let stats = node.stats();
    assert_eq!(errors(&stats, "admin_body_timeout"), 2, "{stats:#}");
    // The node still publishes.
    assert_eq!(node.publish("k", &Value::from(1))["delivered"], 0);
}

#[test]
fn an_idle_keep_alive_is_closed_but_a_live_status_stream_is_not() {
    let node = Node::start(&["--workers", "1", "--admin-idle-timeout", "1"]);
    let mut idle = KeepAlive::open(node.admin);
    assert_eq!(idle.get("/healthz", &[]).0, 200);
    let mut stream = idle.stream().try_clone().unwrap();
    let (answer, took) = trickle_until_closed(&mut stream, b"");
    assert!(answer.is_empty(), "{:?}", String::from_utf8_lossy(&answer));
    assert!(took >= Duration::from_millis(900), "closed early: {took:?}");

    // A status stream is not idle while it streams: it outlives the idle
    // timeout by far, an event a second.
    let mut events = TcpStream::connect(node.admin).unwrap();
    events
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    events
        .write_all(b"GET /status/events HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    let start = Instant::now();
    let mut read = Vec::new();
    let mut buf = [0u8; 4096];
    while read.windows(6).filter(|w| w == b"data: ").count() < 4 {
        let n = events.read(&mut buf).expect("the stream goes on");
        assert!(n > 0, "the stream was closed after {:?}", start.elapsed());
        read.extend_from_slice(&buf[..n]);
    }
    assert!(start.elapsed() >= Duration::from_secs(2));
    assert_eq!(node.stats()["admin"]["idle_closes"], 1);
}

#[test]
fn a_body_declared_over_the_limit_gets_413_at_once() {
    // The body timeout is far away: only a refusal that does not wait for
    // the body comes in time.
    let node = Node::start(&["--workers", "1", "--admin-body-timeout", "600"]);
    let mut stream = TcpStream::connect(node.admin).unwrap();
    stream
        .write_all(
            b"POST /api/publish HTTP/1.1\r\nHost: test\r\nContent-Length: 10000000000\r\n\r\n",
        )
        .unwrap();
    let (answer, took) = trickle_until_closed(&mut stream, b"");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    assert!(answer.contains(r#""code":"body_too_large""#), "{answer}");
    assert!(took < GENEROUS);
    assert_eq!(errors(&node.stats(), "api_body_too_large"), 1);
}

/// A client listener's upgrade request, for [`raw_status`].
fn upgrade(node: &Node) -> String {
    format!(
        "GET /ws HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        node.ws
    )
}

#[test]
fn admin_connections_cannot_starve_the_client_listener_of_descriptors() {
    const OPEN_FILES: u64 = 400;
    const ADMIN_CAP: usize = 16;
    let cap = ADMIN_CAP.to_string();
    // Timeouts far away: the admin connections stay as long as the test.
    let node = Node::start_with_open_files(
        &[
            "--workers",
            "1",
            "--admin-max-connections",
            &cap,
            "--admin-header-timeout",
            "600",
            "--admin-idle-timeout",
            "600",
        ],
        OPEN_FILES,
    );
    // The one admin connection the test keeps for itself.
    let mut stats_conn = KeepAlive::open(node.admin);
    let stats = |conn: &mut KeepAlive| -> Value {
        let (status, body) = conn.get("/stats", &[]);
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    let max = stats(&mut stats_conn)["max_connections"].as_u64().unwrap() as usize;
    assert!(
        max + ADMIN_CAP < OPEN_FILES as usize && max >= 100,
        "client cap {max}"
    );

    // As many admin connections as the node has descriptors: the first
    // ones fill the cap and stay; every one past it is answered 503 at once.
    // Each held one has made a request (on a node without keys any request
    // counts as showing one), so none is closed to make room for the next.
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..OPEN_FILES {
        if held.len() + 1 < ADMIN_CAP {
            let mut conn = KeepAlive::open(node.admin);
            assert_eq!(conn.get("/healthz", &[]).0, 200);
            held.push(conn);
            continue;
        }
        let mut conn = TcpStream::connect(node.admin).unwrap();
        conn.set_read_timeout(Some(GENEROUS)).unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 503 "), "{answer:?}");
        assert!(answer.contains(r#""code":"over_capacity""#), "{answer}");
        refused += 1;
    }
    // Held connections are open: each can still be served.
    for conn in &mut held {
        assert_eq!(conn.get("/healthz", &[]).0, 200);
    }

    // Every client the node admits still gets in, and the next ones get 503.
    let clients: Vec<_> = (0..max).map(|_| node.connect()).collect();
    for _ in 0..3 {
        assert_eq!(raw_status(node.ws, &upgrade(&node)), 503);
    }
    // The refused ones are counted out as the node closes them.
    let deadline = Instant::now() + GENEROUS;
    let stats = loop {
        let stats = stats(&mut stats_conn);
        if stats["connections"] == max as u64 || Instant::now() > deadline {
            break stats;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(stats["connections"], max as u64, "{stats:#}");
    assert_eq!(stats["admin"]["connections"], ADMIN_CAP as u64, "{stats:#}");
    assert_eq!(errors(&stats, "admin_over_capacity"), refused, "{stats:#}");
    assert_eq!(errors(&stats, "over_capacity"), 3, "{stats:#}");
    assert_eq!(errors(&stats, "accept"), 0, "{stats:#}");
    drop(clients);

    // Once admin connections leave, new ones are served again.
    drop(held);
    let deadline = Instant::now() + GENEROUS;
    while !healthy(&node) {
        assert!(Instant::now() < deadline, "the admin listener stayed full");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `/healthz` answers 200 on a fresh admin connection; a refusal
/// may reach a request as a reset.
fn healthy(node: &Node) -> bool {
    let mut conn = TcpStream::connect(node.admin).unwrap();
    conn.set_read_timeout(Some(GENEROUS)).unwrap();
    let request = b"GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n";
    let mut answer = Vec::new();
    let _ = conn
        .write_all(request)
        .and_then(|()| conn.read_to_end(&mut answer));
    answer.starts_with(b"HTTP/1.1 200")
}

#[test]
fn client_refusals_past_their_room_are_closed_at_once() {
    // Room for 64 refusals in flight (fds::CLIENT_REFUSALS) past the cap.
    const ROOM: usize = 64;
    let node = Node::start(&["--workers", "1", "--max-connections", "2"]);
    let admitted: Vec<_> = (0..2).map(|_| node.connect()).collect();
    // Silent connections past the cap: the first ones wait for their
    // request to be refused; past the room, the node closes them at once.
    let mut silent: Vec<_> = (0..ROOM + 6)
        .map(|_| TcpStream::connect(node.ws).unwrap())
        .collect();
    node.wait_for_stats("the six past the room dropped", |s| {
        errors(s, "over_capacity_dropped") == 6
    });
    let (mut refused, mut closed) = (0, 0);
    for conn in &mut silent {
        conn.set_read_timeout(Some(GENEROUS)).unwrap();
        let _ = conn.write_all(upgrade(&node).as_bytes());
        let mut answer = Vec::new();
        let _ = conn.read_to_end(&mut answer);
        if answer.starts_with(b"HTTP/1.1 503 ") {
            refused += 1;
        } else {
            assert!(answer.is_empty(), "{:?}", String::from_utf8_lossy(&answer));
            closed += 1;
        }
    }
    assert_eq!((refused, closed), (ROOM, 6));
    // The refused ones are counted out as the node closes them.
    let stats = node.wait_for_stats("the refused counted out", |s| s["connections"] == 2);
    assert_eq!(errors(&stats, "over_capacity"), ROOM as u64, "{stats:#}");
    drop(admitted);
}

/// Whether the node has closed `stream`: a read sees its end (or a reset)
/// rather than waiting.
fn closed_by_node(stream: &mut TcpStream) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let deadline = Instant::now() + GENEROUS;
    let mut buf = [0u8; 64];
    while Instant::now() < deadline {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return false
            }
            Err(e) => panic!("{e}"),
        }
    }
    false
}

#[test]
fn idle_connections_without_a_key_cannot_keep_a_key_holder_out() {
    let node = Node::start(&[
        "--workers",
        "1",
        "--admin-key",
        "an-admin-key-of-at-least-32-bytes!!",
        "--admin-max-connections",
        "4",
        "--admin-unauthenticated-connections",
        "2",
        // Long enough that no idle connection leaves on its own.
        "--admin-header-timeout",
        "60",
    ]);
    let key = node.key_headers();
    // Two connections that have shown the key hold their slots.
    let mut holders: Vec<KeepAlive> = (0..2).map(|_| KeepAlive::open(node.admin)).collect();
    for holder in &mut holders {
        assert_eq!(holder.get("/stats", &key).0, 200);
    }
    // Idle connections from anyone fill the rest, and go on arriving.
    let mut idle: Vec<TcpStream> = (0..10)
        .map(|_| TcpStream::connect(node.admin).unwrap())
        .collect();
    // A key's holder still gets in (before this change: 503), and so does
    // whoever asks without one, each in place of the oldest idle connection.
    let (status, body) = node.http("GET", "/stats", &key, "");
    assert_eq!(status, 200, "{body}");
    assert_eq!(node.http("GET", "/stats", &[], "").0, 401);
    for holder in &mut holders {
        assert_eq!(
            holder.get("/stats", &key).0,
            200,
            "never closed to make room"
        );
    }
    // Two slots for connections without a key: the eight older idle ones
    // made room for the two newer, and the request with the key for the
    // tenth (the one without found a place free).
    idle.truncate(9);
    assert!(
        idle.iter_mut().all(closed_by_node),
        "the older ones are closed"
    );
    let stats = node.stats();
    let closes = stats["admin"]["unauthenticated_closes"].as_u64().unwrap();
    assert!(closes >= 9, "{stats:#}");
    let (_, metrics) = holders[0].get("/metrics", &key);
    let counted = metrics
        .lines()
        .find_map(|l| l.strip_prefix("myriad_admin_unauthenticated_closes_total "))
        .expect("the metric");
    assert!(counted.parse::<u64>().unwrap() >= closes, "{counted}");

    // A cap full of connections that have shown the key refuses, as before.
    let mut more: Vec<KeepAlive> = (0..2).map(|_| KeepAlive::open(node.admin)).collect();
    for holder in &mut more {
        assert_eq!(holder.get("/stats", &key).0, 200);
    }
    assert_eq!(node.http("GET", "/stats", &key, "").0, 503);
    let (_, body) = holders[0].get("/stats", &key);
    let stats: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(errors(&stats, "admin_over_capacity"), 1, "{stats:#}");
}
