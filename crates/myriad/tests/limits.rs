//! Limits and timeouts: slow consumers are cut while others keep receiving;
//! silent peers, stalled handshakes and idle connections are closed by the
//! worker's sweep with their documented codes.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{recv, recv_close, set_timeout, subscribe, Node};
use serde_json::json;
use tungstenite::Message;

#[test]
fn a_slow_consumer_is_cut_and_the_fast_one_gets_everything() {
    a_stalled_reader_is_cut_while_a_fast_one_keeps_up("262144");
}

#[test]
fn a_stalled_reader_cannot_hold_a_worker_past_its_queue_high_water() {
    // The stalled reader alone holds more frames than the worker's high
    // water: once the fast reader has drained, the worker reads on and the
    // stalled one is cut as before.
    a_stalled_reader_is_cut_while_a_fast_one_keeps_up("16");
}

fn a_stalled_reader_is_cut_while_a_fast_one_keeps_up(worker_queue_high_water: &str) {
    // A long close timeout: the stalled client reads its close frame only at the end.
    let node = Node::start(&[
        "--workers",
        "2",
        "--max-outbound-bytes",
        "262144",
        "--close-timeout",
        "120",
        "--worker-queue-high-water",
        worker_queue_high_water,
    ]);
    let mut slow = node.stalled_subscriber("firehose");
    let mut fast = node.connect();
    subscribe(&mut fast, &["firehose"]);

    // 6.4 MB: far past what the stalled client's buffers and its 256 KiB
    // queue hold, while the fast reader is never more than one request behind.
    let seqs = node.firehose("firehose", move || {
        recv(&mut fast)["offset"].as_u64().unwrap()
    });
    assert_eq!(
        seqs,
        (1..=800).collect::<Vec<u64>>(),
        "fast subscriber lost nothing"
    );

    let stats = node.wait_for_stats("slow consumer cut", |s| s["slow_consumer_disconnects"] == 1);
    assert_eq!(stats["closes"]["slow_consumer"], 1);
    // The stalled client, once it reads, finds deliveries and then close 4001.
    assert_eq!(recv_close(&mut slow), 4001);
}

#[test]
fn a_peer_that_never_answers_pings_is_closed() {
    let node = Node::start(&[
        "--workers",
        "1",
        "--heartbeat-interval",
        "1",
        "--heartbeat-timeout",
        "1",
    ]);
    let mut silent = node.connect();
    subscribe(&mut silent, &["hb"]);
    // A well-behaved client (tungstenite answers pings while reading) stays.
    let mut alive = node.connect();
    subscribe(&mut alive, &["hb"]);
    set_timeout(&alive, Duration::from_millis(200));
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        match alive.read() {
            Ok(_) => {}
            Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("live client lost its connection: {e}"),
        }
    }
    let stats = node.wait_for_stats("heartbeat timeout", |s| {
        s["closes"]["heartbeat_timeout"] == 1
    });
    assert_eq!(stats["connections"], 1, "only the answering client remains");
    // The silent one's buffer holds pings and then the close frame.
    assert_eq!(recv_close(&mut silent), 4002);
    alive
        .send(Message::text(r#"{"op":"ping","id":1}"#))
        .unwrap();
    set_timeout(&alive, Duration::from_secs(10));
    assert_eq!(recv(&mut alive), json!({"op": "pong", "id": 1}));
}

#[test]
fn a_stalled_handshake_is_dropped() {
    let node = Node::start(&["--workers", "1", "--handshake-timeout", "1"]);
    let mut s = TcpStream::connect(node.ws).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 16];
    // Slowloris: a partial request, then silence.
    std::io::Write::write_all(&mut s, b"GET /ws HTTP/1.1\r\nHost: x\r\n").unwrap();
    let n = s.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "closed without a response");
    assert!(started.elapsed() < Duration::from_secs(9));
    let stats = node.wait_for_stats("handshake timeout", |s| {
        s["closes"]["handshake_timeout"] == 1
    });
    assert_eq!(stats["errors"]["handshake_408_timeout"], 1);
}

#[test]
fn an_idle_connection_without_subscriptions_is_closed() {
    let node = Node::start(&["--workers", "1", "--idle-timeout", "1"]);
    let mut idle = node.connect();
    let mut subscribed = node.connect();
    subscribe(&mut subscribed, &["keep"]);
    assert_eq!(recv_close(&mut idle), 4003);
    drop(idle);
    node.wait_for_stats("idle close", |s| {
        s["closes"]["idle_timeout"] == 1 && s["connections"] == 1
    });
    assert_eq!(node.publish("keep", &json!(1))["delivered"], 1);
    assert_eq!(recv(&mut subscribed)["data"], 1);
}

/// A publisher that outruns the workers is paused, not dropped: with the
/// mailbox high-water mark at 1 the node is congested after nearly every
/// publish, so a burst of publishes sits in the publisher's socket and the
/// worker's buffer across many pauses. Every one must still come out, in
/// order, once the workers catch up, although the publisher sends nothing
/// after its burst (no new readiness edge to wake its connection).
#[test]
fn publishers_outrunning_the_workers_are_paused_and_nothing_is_lost() {
    let node = Node::start(&[
        "--workers",
        "1",
        "--mailbox-high-water",
        "1",
        "--max-outbound-bytes",
        "16777216",
    ]);
    let mut subscriber = node.connect();
    subscribe(&mut subscriber, &["flood"]);
    const MESSAGES: u64 = 20_000;
    let reader = std::thread::spawn(move || {
        (0..MESSAGES)
            .map(|_| recv(&mut subscriber)["offset"].as_u64().unwrap())
            .collect::<Vec<u64>>()
    });
    let mut publisher = node.connect();
    for i in 0..MESSAGES {
        let publish = json!({"op": "publish", "subject": "flood", "data": i});
        publisher.write(Message::text(publish.to_string())).unwrap();
    }
    publisher.flush().unwrap();
    let seqs = reader.join().unwrap();
    assert_eq!(seqs, (1..=MESSAGES).collect::<Vec<u64>>());
    let paused = node.metric("myriad_reads_paused_total{worker=\"0\"}");
    assert!(paused >= 1, "the publisher's reading paused: {paused}");
}

/// Readers that keep up, slowly, with a publisher that offers far more.
fn slow_steady_readers_against_a_fast_publisher(
    worker_queue_high_water: &str,
) -> (Vec<Vec<u64>>, u64) {
    const MESSAGES: u64 = 600;
    let node = Node::start(&[
        "--workers",
        "1",
        "--max-outbound-bytes",
        "262144",
        "--mailbox-high-water",
        "8",
        "--worker-queue-high-water",
        worker_queue_high_water,
        // Readers starved of CPU on a busy machine for longer than the
        // default 100 ms would otherwise be cut as stalled.
        "--worker-intake-stall",
        "10s",
    ]);
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let mut ws = node.connect();
            subscribe(&mut ws, &["steady"]);
            std::thread::spawn(move || {
                let mut offsets = Vec::new();
                while (offsets.len() as u64) < MESSAGES {
                    match ws.read() {
                        Ok(Message::Text(text)) => {
                            let msg: serde_json::Value =
                                serde_json::from_str(text.as_str()).unwrap();
                            offsets.push(msg["offset"].as_u64().unwrap());
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        Ok(_) => {}
                        Err(_) => break, // cut: what it got is the answer
                    }
                }
                offsets
            })
        })
        .collect();
    // 1.2 MB per reader: far past its socket buffers and its 256 KiB queue.
    let chunk = "y".repeat(2 * 1024);
    for batch in 0..(MESSAGES / 20) {
        node.publish_batch("steady", batch, 20, &chunk);
    }
    let got: Vec<Vec<u64>> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let cut = node.stats()["slow_consumer_disconnects"].as_u64().unwrap();
    (got, cut)
}

#[test]
fn readers_that_keep_up_slowly_pause_the_publisher_instead_of_being_cut() {
    let (got, cut) = slow_steady_readers_against_a_fast_publisher("64");
    assert_eq!(cut, 0, "nobody cut");
    for offsets in got {
        assert_eq!(offsets, (1..=600).collect::<Vec<u64>>());
    }
}

#[test]
fn bytes_queued_for_a_stalled_reader_are_reported_and_drain_to_zero() {
    // Memory by structure: what waits for sockets shows in /stats and
    // /metrics (as of each worker's once-a-second sweep), within the
    // connection's max_outbound_bytes, and goes once the reader reads.
    let node = Node::start(&["--workers", "1", "--max-outbound-bytes", "1048576"]);
    let mut slow = node.stalled_subscriber("queued");
    let data = json!("q".repeat(4_000));
    for _ in 0..100 {
        node.publish("queued", &data);
    }
    let stats = node.wait_for_stats("bytes queued reported", |s| {
        s["memory"]["outbound_bytes"].as_u64().unwrap() > 100_000
    });
    let queued = stats["memory"]["outbound_bytes"].as_u64().unwrap();
    assert!(queued <= 1_048_576, "{stats:#}");
    assert!(node.metric_sum("myriad_outbound_bytes") > 0);
    for n in 1..=100 {
        assert_eq!(recv(&mut slow)["offset"], n);
    }
    node.wait_for_stats("the queue drained", |s| s["memory"]["outbound_bytes"] == 0);
}
