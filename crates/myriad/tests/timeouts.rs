//! Timeouts are never early (issue 10): the worker's sweep looks once a
//! second and its timestamps are whole seconds, yet no connection is cut,
//! answered or dropped before its configured time, wherever in the second
//! it started. Each test starts clients spread across more than a second,
//! so some start just before the sweep's second turns (where a truncated
//! timestamp would make the timeout almost a second short), and measures
//! from before the client's first step, which the node can only see later.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use common::{node_side, recv_close, Node};
use tungstenite::Message;

/// Clients per test, one every [`SPREAD`].
const CLIENTS: u32 = 12;
const SPREAD: Duration = Duration::from_millis(110);
/// Every timeout under test, in seconds.
const TIMEOUT: u64 = 1;
/// How late a timeout may fire: the sweep's second, and a loaded machine.
const LATE: Duration = Duration::from_secs(8);

/// Runs `client` on [`CLIENTS`] threads started [`SPREAD`] apart; each
/// returns how long its timeout took. Checks each is at least [`TIMEOUT`].
fn spread_clients(client: impl Fn() -> Duration + Send + Sync + 'static) {
    let client = std::sync::Arc::new(client);
    let threads: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let client = std::sync::Arc::clone(&client);
            thread::spawn(move || {
                thread::sleep(SPREAD * i);
                client()
            })
        })
        .collect();
    // Every client is joined before a failed one is passed on: a client
    // left running would keep its clone of the node alive past the test,
    // and the test binary's exit would then orphan the node's process.
    let joined: Vec<_> = threads.into_iter().map(|t| t.join()).collect();
    let took: Vec<Duration> = joined
        .into_iter()
        .map(|r| r.unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
        .collect();
    let timeout = Duration::from_secs(TIMEOUT);
    let early: Vec<_> = took.iter().filter(|&&t| t < timeout).collect();
    assert!(early.is_empty(), "fired early: {early:?} of {took:?}");
    assert!(took.iter().all(|&t| t < timeout + LATE), "{took:?}");
}

/// A node of one worker with `flag` set to [`TIMEOUT`].
fn timed_node(flag: &str) -> Node {
    Node::start(&["--workers", "1", flag, &TIMEOUT.to_string()])
}

/// Connects to `addr` and sends `bytes`: the first step of a client that
/// then waits (for at most 20 s).
fn raw_client(addr: std::net::SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(bytes).unwrap();
    s
}

#[test]
fn a_request_timeout_is_never_early() {
    let node = timed_node("--handshake-timeout");
    let ws = node.ws;
    spread_clients(move || {
        let started = Instant::now();
        let mut s = raw_client(ws, b"GET /ws HTTP/1.1\r\nHost: x\r\n");
        let mut buf = [0u8; 16];
        assert_eq!(
            s.read(&mut buf).unwrap_or(0),
            0,
            "dropped without an answer"
        );
        started.elapsed()
    });
    let stats = node.wait_for_stats("every request timed out", |s| {
        s["closes"]["handshake_timeout"] == CLIENTS
    });
    assert_eq!(stats["errors"]["handshake_408_timeout"], CLIENTS);
}

#[test]
fn a_long_poll_is_never_answered_before_the_poll_timeout() {
    let node = timed_node("--poll-timeout");
    let ws = node.ws;
    spread_clients(move || {
        let started = Instant::now();
        let s = raw_client(ws, b"GET /poll?subject=quiet HTTP/1.1\r\nHost: x\r\n\r\n");
        let mut status = String::new();
        BufReader::new(s).read_line(&mut status).unwrap();
        assert!(status.starts_with("HTTP/1.1 200 "), "{status}");
        started.elapsed()
    });
}

#[test]
fn an_idle_connection_is_never_closed_before_the_idle_timeout() {
    let node = timed_node("--idle-timeout");
    let url = node.url("/ws");
    spread_clients(move || {
        let started = Instant::now();
        let (mut ws, _) = tungstenite::connect(&url).unwrap();
        common::set_timeout(&ws, Duration::from_secs(20));
        assert_eq!(recv_close(&mut ws), 4003);
        started.elapsed()
    });
}

#[test]
fn a_message_left_unfinished_is_never_closed_before_the_partial_message_timeout() {
    let node = timed_node("--partial-message-timeout");
    let url = node.url("/ws");
    spread_clients(move || {
        let (mut ws, _) = tungstenite::connect(&url).unwrap();
        common::set_timeout(&ws, Duration::from_secs(20));
        let tungstenite::stream::MaybeTlsStream::Plain(socket) = ws.get_mut() else {
            unreachable!("plain sockets only")
        };
        // A masked text frame announcing 100 bytes (zero mask), and 10 of them.
        let mut partial = vec![0x81, 0x80 | 100, 0, 0, 0, 0];
        partial.extend_from_slice(&[b'x'; 10]);
        let started = Instant::now();
        socket.write_all(&partial).unwrap();
        assert_eq!(recv_close(&mut ws), 4004);
        started.elapsed()
    });
    node.wait_for_stats("every message cut", |s| {
        s["closes"]["partial_message_timeout"] == CLIENTS
    });
}

#[test]
fn a_closing_connection_is_never_dropped_before_the_close_timeout() {
    let node = timed_node("--close-timeout");
    let node = std::sync::Arc::new(node);
    let at = std::sync::Arc::clone(&node);
    spread_clients(move || {
        let (mut ws, _) = tungstenite::connect(at.url("/ws")).unwrap();
        // Refused with 1003; the close is never answered, so the node
        // holds the socket until its close timeout, then lets go of it
        // (the kernel then holds it alone: no inode).
        let started = Instant::now();
        ws.send(Message::binary(vec![0])).unwrap();
        let tungstenite::stream::MaybeTlsStream::Plain(socket) = ws.get_ref() else {
            unreachable!("plain sockets only")
        };
        loop {
            if node_side(&at, socket).is_none_or(|s| s.inode == 0) {
                return started.elapsed();
            }
            assert!(started.elapsed() < Duration::from_secs(20));
            // Each look reads the box's whole /proc/net/tcp (0.3 s of
            // kernel time with 150,000 sockets open elsewhere on the box):
            // twelve clients looking every 10 ms starved each other past
            // the 20 s bound.
            thread::sleep(Duration::from_millis(100));
        }
    });
}

#[test]
fn the_shutdown_timeout_is_never_early() {
    // Three nodes, signalled at different points of their second.
    let nodes: Vec<_> = (0..3)
        .map(|i| {
            thread::spawn(move || {
                let mut node = timed_node("--shutdown-timeout");
                // A client that never answers the close keeps the node
                // until its shutdown timeout.
                let _deaf = node.connect();
                thread::sleep(SPREAD * 3 * i);
                let started = Instant::now();
                node.terminate();
                node.wait_for_exit();
                started.elapsed()
            })
        })
        .collect();
    let took: Vec<Duration> = nodes.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(
        took.iter().all(|&t| t >= Duration::from_secs(TIMEOUT)),
        "{took:?}"
    );
}
