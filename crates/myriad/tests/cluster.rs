//! Nodes joined over a real Redis (`--engine redis`): publications reach
//! subscribers on every node exactly once and in order, a client recovers
//! on another node from Redis history, Redis going away fails publishes
//! fast and comes back by itself, and bad Redis settings stop the start
//! with a clear error.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::tls::Pki;
use common::{recv, send, serve_command, subscribe, Node, Ws};
use myriad_testkit::RedisServer;
use serde_json::{json, Value};

/// The next `n` messages' (offset, data) pairs.
fn take(ws: &mut Ws, n: usize) -> Vec<(u64, u64)> {
    (0..n)
        .map(|_| {
            let msg = recv(ws);
            assert_eq!(msg["op"], "msg", "{msg}");
            (
                msg["offset"].as_u64().unwrap(),
                msg["data"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn publications_from_either_node_reach_subscribers_on_both_once_and_in_order() {
    let redis = RedisServer::start();
    let a = Node::in_cluster(&redis, "two");
    let b = Node::in_cluster(&redis, "two");
    let mut on_a = a.connect();
    let mut on_b = b.connect();
    let at_a = subscribe(&mut on_a, &["room"]).remove(0);
    let at_b = subscribe(&mut on_b, &["room"]).remove(0);
    assert_eq!(at_a, at_b, "one stream, whichever node is asked");
    // Alternate the publishing node: Redis orders them, every node agrees.
    for n in 1..=200u64 {
        let via = if n % 2 == 0 { &a } else { &b };
        let reply = via.publish("room", &json!(n));
        assert_eq!(reply["offset"], n, "{reply}");
    }
    // Each publish waited for its answer, so none shared a round trip.
    for node in [&a, &b] {
        let trips = node.metric("myriad_engine_round_trips_total");
        assert!(trips >= 100, "100 awaited publishes in {trips} round trips");
    }
    let want: Vec<(u64, u64)> = (1..=200).map(|n| (n, n)).collect();
    assert_eq!(take(&mut on_a, 200), want);
    assert_eq!(take(&mut on_b, 200), want);
    // And nothing more: the next message is the next publish.
    a.publish("room", &json!(201));
    assert_eq!(take(&mut on_b, 1), [(201, 201)]);
    assert_eq!(take(&mut on_a, 1), [(201, 201)]);
}

#[test]
fn a_client_recovers_on_another_node_from_redis_history() {
    let redis = RedisServer::start();
    let a = Node::in_cluster(&redis, "failover");
    let b = Node::in_cluster(&redis, "failover");
    let mut ws = a.connect();
    let at = subscribe(&mut ws, &["feed"]).remove(0);
    for n in 1..=5 {
        b.publish("feed", &json!(n));
    }
    let seen = take(&mut ws, 5);
    let last = seen.last().unwrap().0;
    drop(ws);
    for n in 6..=9 {
        b.publish("feed", &json!(n));
    }
    // Back on the other node, from where it left off.
    let mut ws = b.connect();
    send(
        &mut ws,
        json!({"op": "subscribe", "subject": "feed", "id": 2,
               "since": {"epoch": at["epoch"], "offset": last}}),
    );
    let reply = recv(&mut ws);
    assert_eq!(reply["op"], "subscribed", "{reply}");
    assert_eq!(reply["recovered"], true, "{reply}");
    assert_eq!(reply["epoch"], at["epoch"]);
    assert_eq!(take(&mut ws, 4), [(6, 6), (7, 7), (8, 8), (9, 9)]);
    a.publish("feed", &json!(10));
    assert_eq!(take(&mut ws, 1), [(10, 10)]);
    // History reads come from Redis too, on any node.
    let (status, body) = a.http(
        "GET",
        "/api/history?subject=feed&limit=3",
        &a.key_headers(),
        "",
    );
    assert_eq!(status, 200, "{body}");
    let history: Value = serde_json::from_str(&body).unwrap();
    let offsets: Vec<u64> = history["publications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, [8, 9, 10]);
}

#[test]
fn while_redis_is_down_publishes_fail_fast_and_the_node_comes_back_by_itself() {
    let mut redis = RedisServer::start_persistent();
    let a = Node::in_cluster(&redis, "restart");
    let b = Node::in_cluster(&redis, "restart");
    let mut ws = a.connect();
    let at = subscribe(&mut ws, &["r"]).remove(0);
    b.publish("r", &json!(1));
    assert_eq!(take(&mut ws, 1), [(1, 1)]);
    redis.kill();
    let started = Instant::now();
    let body = json!({"subject": "r", "data": 2}).to_string();
    let (status, reply) = b.http("POST", "/api/publish", &b.key_headers(), &body);
    assert_eq!(status, 503, "{reply}");
    assert!(reply.contains("redis_"), "{reply}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "a publish while Redis is down fails instead of hanging"
    );
    // Every failure is named and counted.
    assert!(b.metric("myriad_engine_failures_total{kind=\"redis_unavailable\"}") >= 1);
    // The client stays connected meanwhile.
    send(&mut ws, json!({"op": "ping", "id": 9}));
    assert_eq!(recv(&mut ws)["id"], 9);
    redis.restart();
    // Both nodes reconnect and resubscribe by themselves.
    let deadline = Instant::now() + Duration::from_secs(30);
    let published = loop {
        let (status, reply) = b.http("POST", "/api/publish", &b.key_headers(), &body);
        if status == 200 {
            break serde_json::from_str::<Value>(&reply).unwrap();
        }
        assert!(Instant::now() < deadline, "never reconnected: {reply}");
        std::thread::sleep(Duration::from_millis(100));
    };
    // The append-only file kept the stream: same epoch, next offset.
    assert_eq!(published["epoch"], at["epoch"], "{published}");
    assert_eq!(published["offset"], 2);
    // A subscriber that connects now hears it from either node.
    let mut late = a.connect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        send(
            &mut late,
            json!({"op": "subscribe", "subject": "r", "id": 3,
                   "since": {"epoch": at["epoch"], "offset": 1}}),
        );
        let reply = recv(&mut late);
        if reply["op"] == "subscribed" {
            assert_eq!(reply["recovered"], true, "{reply}");
            assert_eq!(take(&mut late, 1), [(2, 2)]);
            break;
        }
        assert_eq!(reply["op"], "error", "{reply}");
        assert!(Instant::now() < deadline, "never resubscribed: {reply}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_live_subscriber_gets_what_was_published_while_its_node_was_cut_off_from_redis() {
    let redis = RedisServer::start();
    let a = Node::in_cluster(&redis, "cut");
    let b = Node::in_cluster(&redis, "cut");
    let mut ws = a.connect();
    subscribe(&mut ws, &["gap"]);
    for n in 1..=5 {
        b.publish("gap", &json!(n));
    }
    assert_eq!(take(&mut ws, 5).last(), Some(&(5, 5)));
    // Cut node a's connection (the only one subscribed to anything) and
    // publish through b while a reconnects.
    let killed = redis
        .command(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .unwrap();
    assert_eq!(killed, ":1", "exactly node a's connection");
    for n in 6..=60 {
        b.publish("gap", &json!(n));
    }
    let want: Vec<(u64, u64)> = (6..=60).map(|n| (n, n)).collect();
    assert_eq!(
        take(&mut ws, 55),
        want,
        "caught up from history, in order, once"
    );
    b.publish("gap", &json!(61));
    assert_eq!(take(&mut ws, 1), [(61, 61)]);
}

#[test]
fn a_redis_that_restarts_empty_tells_live_subscribers_their_stream_broke() {
    let mut redis = RedisServer::start();
    let a = Node::in_cluster(&redis, "empty");
    let mut ws = a.connect();
    let before = subscribe(&mut ws, &["e"]).remove(0);
    a.publish("e", &json!(1));
    assert_eq!(take(&mut ws, 1), [(1, 1)]);
    redis.restart();
    // Without an append-only file everything is gone: a new epoch.
    let notice = recv(&mut ws);
    assert_eq!(notice["op"], "subscribed", "{notice}");
    assert_eq!(notice["subject"], "e");
    assert_eq!(notice["recovered"], false, "{notice}");
    assert_ne!(notice["epoch"], before["epoch"]);
    assert_eq!(notice["offset"], 0);
    let published = a.publish("e", &json!(2));
    assert_eq!(published["epoch"], notice["epoch"]);
    let msg = recv(&mut ws);
    assert_eq!(
        (&msg["epoch"], &msg["offset"], &msg["data"]),
        (&notice["epoch"], &json!(1), &json!(2))
    );
}

/// A node of one worker over `redis` whose Redis timeout (60 s) outlasts a
/// test's pause of Redis, so the pause fills its queue (bounded by
/// `queue_flags`) instead of ending its connection.
fn outlasting_stalls(redis: &RedisServer, prefix: &str, queue_flags: &[&str]) -> Node {
    let flags = [
        &["--workers", "1", "--redis-timeout", "60s"][..],
        queue_flags,
    ]
    .concat();
    Node::in_cluster_of(&[redis], prefix, &flags)
}

#[test]
fn an_unsubscribe_is_not_lost_when_the_queue_towards_redis_is_full() {
    let redis = RedisServer::start();
    // A queue of one; the connection outlasts the stall below, so nothing
    // is rebuilt on reconnect.
    let a = outlasting_stalls(&redis, "myriad", &["--redis-queue", "1"]);
    let mut subscriber = a.connect();
    subscribe(&mut subscriber, &["left"]);
    let mut publisher = a.connect();
    redis.pause();
    // One publish in flight, one queued, the rest refused: the queue is full.
    for id in 1..=20 {
        send(
            &mut publisher,
            json!({"op": "publish", "subject": "other", "data": id, "id": id}),
        );
    }
    let mut busy = 0;
    while busy == 0 {
        let reply = recv(&mut publisher);
        if reply["message"]
            .as_str()
            .unwrap_or("")
            .starts_with("redis_busy")
        {
            busy += 1;
        }
    }
    // The last subscriber leaves while nothing more fits in the queue.
    send(
        &mut subscriber,
        json!({"op": "unsubscribe", "subjects": ["left"], "id": 99}),
    );
    let reply = recv(&mut subscriber);
    assert_eq!(reply["id"], 99, "{reply}");
    redis.resume();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let reply = redis
            .command(&[
                "EVAL",
                "return redis.call('PUBSUB', 'SHARDNUMSUB', KEYS[1])[2]",
                "1",
                // One instance: the subject's partition is 0.
                "myriad:{0}:c:left",
            ])
            .unwrap();
        if reply == ":0" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the node still listens to a subject it has no subscriber of: {reply}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn past_the_queue_high_water_a_publisher_waits_for_redis_instead_of_being_refused() {
    let redis = RedisServer::start();
    // Room for eight requests, pausing past two; the connection outlasts
    // the stall below.
    let a = outlasting_stalls(
        &redis,
        "paced",
        &["--redis-queue", "8", "--redis-queue-high-water", "2"],
    );
    let mut subscriber = a.connect();
    subscribe(&mut subscriber, &["paced"]);
    let mut publisher = a.connect();
    redis.pause();
    const PUBLISHES: u64 = 100;
    for id in 1..=PUBLISHES {
        send(
            &mut publisher,
            json!({"op": "publish", "subject": "paced", "data": id, "id": id}),
        );
    }
    // Time for the node to take what it would: without the high water it
    // refuses all but the first few at once.
    std::thread::sleep(Duration::from_millis(500));
    let busy = "myriad_engine_failures_total{kind=\"redis_busy\"}";
    assert_eq!(a.metric(busy), 0, "nothing refused while Redis sleeps");
    // Once, or again if the instance task took a batch off the queue between.
    let paused = a.metric("myriad_reads_paused_total{worker=\"0\"}");
    assert!(paused >= 1, "the publisher's reading paused: {paused}");
    // The API waits too, then gives up with a named answer, counted.
    let body = json!({"subject": "paced", "data": "api"}).to_string();
    let (status, reply) = a.http("POST", "/api/publish", &[], &body);
    assert_eq!(status, 503, "{reply}");
    assert!(reply.contains("\"congested\""), "{reply}");
    assert_eq!(a.metric("myriad_errors_total{kind=\"api_congested\"}"), 1);
    assert_eq!(a.stats()["errors"]["api_congested"], 1, "and in /stats");
    redis.resume();
    for id in 1..=PUBLISHES {
        let reply = recv(&mut publisher);
        assert_eq!(
            (&reply["op"], &reply["id"]),
            (&json!("ok"), &json!(id)),
            "{reply}"
        );
    }
    for offset in 1..=PUBLISHES {
        let msg = recv(&mut subscriber);
        assert_eq!(
            (&msg["offset"], &msg["data"]),
            (&json!(offset), &json!(offset)),
            "{msg}"
        );
    }
    assert_eq!(a.metric(busy), 0);
}

/// An API publish that timed out reached Redis, which may still carry it
/// out: the 503 says its outcome is unknown, apart from what was published
/// before it and what was not tried after it; and it is in fact published
/// once Redis wakes.
/// Publishes `data` on `subject` through `node`'s API, again and again
/// until the node takes it (its Redis answers again), within 30 s.
fn publish_once_back(node: &Node, subject: &str, data: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = json!({"subject": subject, "data": data}).to_string();
    loop {
        let (status, reply) = node.http("POST", "/api/publish", &node.key_headers(), &body);
        if status == 200 {
            return;
        }
        assert!(Instant::now() < deadline, "never came back: {reply}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_api_publish_that_timed_out_is_reported_of_unknown_outcome() {
    let redis = RedisServer::start();
    let a = Node::in_cluster_of(
        &[&redis],
        "unknown",
        &["--workers", "1", "--redis-timeout", "1s"],
    );
    let mut ws = a.connect();
    subscribe(&mut ws, &["u"]);
    assert_eq!(a.publish("u", &json!(0))["offset"], 1);
    assert_eq!(take(&mut ws, 1), [(1, 0)]);
    redis.pause();
    let batch = json!({"messages": [
        {"subject": "u", "data": 1},
        {"subject": "u", "data": 2},
    ]})
    .to_string();
    let (status, reply) = a.http("POST", "/api/publish", &a.key_headers(), &batch);
    redis.resume();
    assert_eq!(status, 503, "{reply}");
    let error: Value = serde_json::from_str(&reply).unwrap();
    let error = &error["error"];
    assert_eq!(error["code"], "publish_failed", "{error}");
    assert_eq!(
        [
            &error["published"],
            &error["unknown"],
            &error["not_published"]
        ],
        [0, 1, 1],
        "{error}"
    );
    let message = error["message"].as_str().unwrap();
    assert!(message.starts_with("redis_timeout:"), "{message}");
    assert!(
        message.contains("1 of unknown outcome") && message.contains("1 not published"),
        "{message}"
    );
    // Back once Redis answers again: the first item was published when
    // Redis woke, the second never was.
    publish_once_back(&a, "u", 3);
    assert_eq!(take(&mut ws, 2), [(2, 1), (3, 3)]);
}

#[test]
fn a_stalled_redis_gets_timeouts_and_a_bounded_queue_never_a_hang() {
    let redis = RedisServer::start();
    let a = Node::in_cluster_of(
        &[&redis],
        "stalled",
        &[
            "--workers",
            "1",
            "--redis-timeout",
            "1s",
            "--redis-queue",
            "8",
        ],
    );
    let mut ws = a.connect();
    subscribe(&mut ws, &["s"]);
    redis.pause();
    const PUBLISHES: u64 = 100;
    for id in 1..=PUBLISHES {
        send(
            &mut ws,
            json!({"op": "publish", "subject": "s", "data": id, "id": id}),
        );
    }
    // Every publish is answered, each with a named failure.
    let mut kinds = std::collections::BTreeMap::new();
    let mut timed_out = Vec::new();
    for _ in 0..PUBLISHES {
        let reply = recv(&mut ws);
        assert_eq!(reply["op"], "error", "{reply}");
        assert_eq!(reply["code"], "publish_failed", "{reply}");
        let message = reply["message"].as_str().unwrap();
        let kind = message.split(':').next().unwrap().to_owned();
        if kind == "redis_timeout" {
            timed_out.push(reply["id"].as_u64().unwrap());
        }
        *kinds.entry(kind).or_insert(0u64) += 1;
    }
    assert!(
        kinds.contains_key("redis_busy"),
        "the queue refused the overflow: {kinds:?}"
    );
    // What was sent waited one timeout; the connection was then dropped and
    // the rest refused until it is back (the once-a-second sweep may be
    // what met the timeout first).
    assert!(
        kinds.contains_key("redis_timeout") || kinds.contains_key("redis_unavailable"),
        "{kinds:?}"
    );
    assert!(
        kinds
            .keys()
            .all(|k| ["redis_busy", "redis_timeout", "redis_unavailable"].contains(&k.as_str())),
        "{kinds:?}"
    );
    let busy = a.metric("myriad_engine_failures_total{kind=\"redis_busy\"}");
    assert_eq!(busy, kinds["redis_busy"]);
    redis.resume();
    // Back by itself once Redis answers again; the subscription too.
    publish_once_back(&a, "s", 0);
    // A publish that timed out had reached Redis, which ran it when it
    // woke: its outcome was unknown, as `redis_timeout` says. Those come
    // first, then the new one.
    loop {
        let msg = recv(&mut ws);
        assert_eq!(msg["op"], "msg", "{msg}");
        if msg["data"] == 0 {
            break;
        }
        assert!(timed_out.contains(&msg["data"].as_u64().unwrap()), "{msg}");
    }
}

#[test]
fn the_queue_towards_redis_is_bounded_in_bytes_as_well_as_in_requests() {
    let redis = RedisServer::start();
    // Room for 1,000 requests but for only four of these publications'
    // bytes; the connection outlasts the stall below.
    let a = outlasting_stalls(
        &redis,
        "bytes",
        &[
            "--redis-queue",
            "1000",
            "--max-message-size",
            "2048",
            "--max-http-body",
            "2048",
            "--redis-queue-bytes",
            "4096",
        ],
    );
    let mut publisher = a.connect();
    let data = "x".repeat(1000);
    redis.pause();
    const PUBLISHES: u64 = 20;
    for id in 1..=PUBLISHES {
        send(
            &mut publisher,
            json!({"op": "publish", "subject": "big", "data": data, "id": id}),
        );
    }
    // While Redis sleeps, the batch with it and what waits behind it hold
    // at most four publications' bytes between them, so at most four are
    // taken and at least sixteen refused, though the queue had room for
    // 1,000 requests.
    let busy_metric = "myriad_engine_failures_total{kind=\"redis_busy\"}";
    let deadline = Instant::now() + Duration::from_secs(30);
    while a.metric(busy_metric) < PUBLISHES - 4 {
        assert!(Instant::now() < deadline, "no refusals");
        std::thread::sleep(Duration::from_millis(20));
    }
    redis.resume();
    let (mut busy, mut published) = (0, 0);
    for _ in 0..PUBLISHES {
        let reply = recv(&mut publisher);
        if reply["op"] == "ok" {
            published += 1;
        } else {
            let message = reply["message"].as_str().unwrap_or("");
            assert!(message.starts_with("redis_busy"), "{reply}");
            busy += 1;
        }
    }
    assert!(
        busy >= PUBLISHES - 4 && published >= 1,
        "{busy} refused, {published} published"
    );
    assert_eq!(a.metric(busy_metric), busy);
    // What the waiting publications held was given back: as many again,
    // one at a time, all fit.
    for id in 100..100 + PUBLISHES {
        send(
            &mut publisher,
            json!({"op": "publish", "subject": "big", "data": data, "id": id}),
        );
        let reply = recv(&mut publisher);
        assert_eq!(reply["op"], "ok", "{reply}");
    }
}

#[test]
fn subjects_spread_over_several_redis_instances_and_every_node_agrees_where() {
    let instances = [RedisServer::start(), RedisServer::start()];
    let start = || {
        Node::in_cluster_of(
            &[&instances[0], &instances[1]],
            "myriad",
            &["--workers", "2"],
        )
    };
    let (a, b) = (start(), start());
    let subjects: Vec<String> = (0..40).map(|i| format!("s{i}")).collect();
    let names: Vec<&str> = subjects.iter().map(String::as_str).collect();
    let mut ws = a.connect();
    subscribe(&mut ws, &names);
    for (n, subject) in subjects.iter().enumerate() {
        let reply = b.publish(subject, &json!(n));
        assert_eq!(reply["offset"], 1, "{reply}");
    }
    let mut got: Vec<(String, u64)> = (0..subjects.len())
        .map(|_| {
            let msg = recv(&mut ws);
            assert_eq!(msg["offset"], 1, "{msg}");
            (
                msg["subject"].as_str().unwrap().to_owned(),
                msg["data"].as_u64().unwrap(),
            )
        })
        .collect();
    got.sort_by_key(|(_, n)| *n);
    let want: Vec<(String, u64)> = subjects.iter().cloned().zip(0..).collect();
    assert_eq!(got, want);
    // Each instance holds some of the subjects, and only its own.
    let held: Vec<u64> = instances
        .iter()
        .map(|r| {
            let keys = r
                .command(&["EVAL", "return #redis.call('KEYS', 'myriad:{*}:s:*')", "0"])
                .unwrap();
            keys.trim_start_matches(':').parse().unwrap()
        })
        .collect();
    assert_eq!(held.iter().sum::<u64>(), 40, "{held:?}");
    assert!(held.iter().all(|&n| n > 0), "both instances used: {held:?}");
}

/// Runs `myriad serve` with `args`, expecting it to exit non-zero on its
/// own; returns its stderr.
fn refused_start(args: &[&str]) -> String {
    let data_dir = tempfile::tempdir().unwrap();
    let mut child = serve_command()
        .args(args)
        .arg("--data-dir")
        .arg(data_dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start myriad");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(!status.success(), "started although it should not");
            let mut stderr = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
            return stderr;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("myriad hung instead of refusing to start");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn bad_redis_settings_stop_the_start_with_a_clear_error() {
    let nobody = format!("redis://127.0.0.1:{}", myriad_testkit::free_port());
    let stderr = refused_start(&[
        "--engine",
        "redis",
        "--redis-url",
        &nobody,
        "--redis-timeout",
        "2s",
    ]);
    assert!(stderr.contains("cannot reach Redis at"), "{stderr}");
    let stderr = refused_start(&["--engine", "redis", "--redis-url", "http://nowhere"]);
    assert!(stderr.contains("redis_url \"http://nowhere\""), "{stderr}");
    let stderr = refused_start(&["--engine", "redis"]);
    assert!(stderr.contains("needs at least one redis_url"), "{stderr}");
}

/// Self-signed certificates for a Redis speaking TLS and for the nodes it
/// asks to show one.
struct RedisPki {
    redis: Pki,
    node: Pki,
}

impl RedisPki {
    fn new() -> RedisPki {
        RedisPki {
            redis: Pki::for_name("127.0.0.1"),
            node: Pki::for_name("myriad-node"),
        }
    }

    /// A Redis whose TLS port takes only clients showing the node's
    /// certificate.
    fn redis(&self) -> RedisServer {
        RedisServer::start_tls(&self.redis.cert, &self.redis.key, &self.node.cert)
    }
}

/// A path as a flag's value.
fn arg(path: &std::path::Path) -> String {
    path.display().to_string()
}

#[test]
fn nodes_reach_a_redis_that_speaks_tls_and_asks_for_their_certificate() {
    let pki = RedisPki::new();
    let redis = pki.redis();
    let (url, ca, cert, key) = (
        redis.tls_url(),
        arg(&pki.redis.cert),
        arg(&pki.node.cert),
        arg(&pki.node.key),
    );
    let args = [
        "--engine",
        "redis",
        "--graph-store",
        "redis",
        "--redis-url",
        &url,
        "--redis-prefix",
        "tls",
        "--workers",
        "1",
    ];
    let tls_files = [
        "--redis-tls-ca",
        &ca,
        "--redis-tls-cert",
        &cert,
        "--redis-tls-key",
        &key,
    ];
    let args = [&args[..], &tls_files[..]].concat();
    let (a, b) = (Node::start(&args), Node::start(&args));
    // The engine: a publication through B reaches A's subscriber.
    let mut on_a = a.connect();
    subscribe(&mut on_a, &["secure"]);
    assert_eq!(b.publish("secure", &json!("sealed"))["offset"], 1);
    let msg = recv(&mut on_a);
    assert_eq!(
        (&msg["offset"], &msg["data"]),
        (&json!(1), &json!("sealed"))
    );
    // The graph store: users added through A, and B hears of them.
    let (status, reply) = common::graph::post(&a, "/api/users", json!({"users": [1, 2]}));
    assert_eq!(status, 200, "{reply}");
    b.wait_for_stats("B to hear of the users", |s| s["graph"]["users"] == 2);
    // `myriad graph` reads the same graph over TLS with the same files,
    // and cannot without the node's certificate.
    let graph_stats = |tls: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_myriad"))
            .args([
                "graph",
                "stats",
                "--redis-url",
                &url,
                "--redis-prefix",
                "tls",
            ])
            .args(tls)
            .output()
            .unwrap()
    };
    let out = graph_stats(&tls_files);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("users: 2"), "{stdout}");
    assert!(!graph_stats(&["--redis-tls-ca", &ca]).status.success());
    // Every link of the nodes came in on the TLS port: on the plain one
    // there is only this test's own question.
    let clients = redis.command(&["CLIENT", "LIST"]).unwrap();
    let on_port = |url: &str| {
        let port = url.rsplit(':').next().unwrap();
        let laddr = format!("laddr=127.0.0.1:{port} ");
        clients.lines().filter(|l| l.contains(&laddr)).count()
    };
    assert_eq!(on_port(&redis.url()), 1, "{clients}");
    // Per node: the engine's link, the graph store's and its listener's.
    assert!(on_port(&url) >= 6, "{clients}");
}

#[test]
fn a_redis_over_tls_that_cannot_be_trusted_or_trust_the_node_stops_the_start() {
    let pki = RedisPki::new();
    let redis = pki.redis();
    let url = redis.tls_url();
    let engine = [
        "--engine",
        "redis",
        "--redis-url",
        &url,
        "--redis-timeout",
        "5s",
    ];
    // Redis's certificate checked against the system's roots: unknown.
    let stderr = refused_start(&engine);
    assert!(stderr.contains("cannot reach Redis at"), "{stderr}");
    assert!(stderr.contains("UnknownIssuer"), "{stderr}");
    // Trusted, but the node shows no certificate of its own.
    let ca = arg(&pki.redis.cert);
    let stderr = refused_start(&[&engine[..], &["--redis-tls-ca", &ca]].concat());
    assert!(stderr.contains("cannot reach Redis at"), "{stderr}");
    // The node's settings: certificate and key go together, a file that
    // holds no certificate is named, and TLS files need a rediss:// URL.
    let cert = arg(&pki.node.cert);
    let stderr = refused_start(&[&engine[..], &["--redis-tls-cert", &cert]].concat());
    assert!(
        stderr.contains("redis_tls_cert and redis_tls_key go together"),
        "{stderr}"
    );
    let key = arg(&pki.node.key);
    let stderr = refused_start(&[&engine[..], &["--redis-tls-ca", &key]].concat());
    assert!(
        stderr.contains("redis_tls_ca: TLS certificate file"),
        "{stderr}"
    );
    assert!(stderr.contains("holds no certificate"), "{stderr}");
    let plain = redis.url();
    let stderr = refused_start(&[
        "--engine",
        "redis",
        "--redis-url",
        &plain,
        "--redis-tls-ca",
        &ca,
    ]);
    assert!(stderr.contains("the node connects to none"), "{stderr}");
}
