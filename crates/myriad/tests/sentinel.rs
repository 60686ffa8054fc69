//! Nodes over Redis Sentinel (`--redis-sentinel`, `--redis-sentinel-master`)
//! against real processes: a master, a replica and three Sentinels
//! ([`SentinelSetup`]). The master is killed while a publisher goes on:
//! publishes fail fast with 503 until the nodes find the new master by
//! themselves, clients stay connected, a live subscriber is told its
//! stream broke (`recovered: false`, a new epoch) and then gets every
//! later publication once and in order, and the follow graph, kept behind
//! the same Sentinels, takes writes again.

mod common;

use std::time::{Duration, Instant};

use common::graph::follow;
use common::{recv, send, subscribe, Node};
use myriad_testkit::SentinelSetup;
use serde_json::{json, Value};

/// A node of the cluster behind `setup`'s Sentinels, the graph there too.
fn behind(setup: &SentinelSetup) -> Node {
    let sentinels = setup.sentinel_urls().join(",");
    Node::start(&[
        "--engine",
        "redis",
        "--redis-sentinel",
        &sentinels,
        "--redis-sentinel-master",
        setup.name(),
        "--graph-store",
        "redis",
        "--workers",
        "2",
        "--redis-timeout",
        "2s",
    ])
}

/// An API publish: its status and reply.
fn publish(node: &Node, data: u64) -> (u16, Value) {
    let body = json!({"subject": "f", "data": data}).to_string();
    let (status, reply) = node.http("POST", "/api/publish", &node.key_headers(), &body);
    (status, serde_json::from_str(&reply).unwrap_or(Value::Null))
}

#[test]
fn nodes_follow_a_sentinel_failover_by_themselves_and_clients_stay_connected() {
    let mut setup = SentinelSetup::start("nodes");
    let a = behind(&setup);
    let b = behind(&setup);
    let mut ws = a.connect();
    let before = subscribe(&mut ws, &["f"]).remove(0);
    assert_eq!(follow(&b, &[(1, 2)]), 1);
    for data in 1..=3 {
        assert_eq!(publish(&b, data).0, 200);
    }
    for offset in 1..=3 {
        let msg = recv(&mut ws);
        assert_eq!(
            (&msg["offset"], &msg["data"]),
            (&json!(offset), &json!(offset))
        );
    }

    let old = setup.master.port();
    let killed = Instant::now();
    setup.master.kill();
    // A publisher goes on every 20 ms: what it was acknowledged, in order.
    let mut acked = Vec::new();
    let mut refused = 0;
    let mut data = 3;
    let mut back_after = None;
    while acked.len() < 5 {
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "publishes never came back"
        );
        data += 1;
        match publish(&b, data) {
            (200, reply) => {
                back_after.get_or_insert(killed.elapsed());
                acked.push((
                    reply["epoch"].clone(),
                    reply["offset"].as_u64().unwrap(),
                    data,
                ));
            }
            (503, reply) => {
                assert!(reply.to_string().contains("redis_"), "{reply}");
                refused += 1;
            }
            (status, reply) => panic!("{status} {reply}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(setup.wait_for_failover_from(old), setup.replica.port());
    eprintln!(
        "publishes succeeded again {:?} after the kill; {refused} refused with 503 meanwhile",
        back_after.unwrap()
    );
    assert!(refused > 0, "no publish saw the master gone");

    // The subscriber stayed connected: told its stream broke, then every
    // acknowledged publication of the new epoch once, in order.
    let notice = recv(&mut ws);
    assert_eq!(notice["op"], "subscribed", "{notice}");
    assert_eq!(notice["recovered"], false, "{notice}");
    assert_ne!(notice["epoch"], before["epoch"], "{notice}");
    // The notice's position may already count publications of the new
    // epoch (another node's publishes started it): those after it follow.
    let epoch = notice["epoch"].clone();
    let from = notice["offset"].as_u64().unwrap();
    let wanted: Vec<(u64, u64)> = acked
        .iter()
        .filter(|(e, offset, _)| *e == epoch && *offset > from)
        .map(|(_, offset, data)| (*offset, *data))
        .collect();
    let mut seen = Vec::new();
    let mut last = from;
    while seen.len() < wanted.len() {
        let msg = recv(&mut ws);
        assert_eq!(msg["op"], "msg", "{msg}");
        assert_eq!(msg["epoch"], epoch, "{msg}");
        let offset = msg["offset"].as_u64().unwrap();
        assert!(
            offset > last,
            "offset {offset} after {last}: out of order or again"
        );
        last = offset;
        seen.push((offset, msg["data"].as_u64().unwrap()));
    }
    assert_eq!(seen, wanted);
    send(&mut ws, json!({"op": "ping", "id": 9}));
    assert_eq!(recv(&mut ws)["id"], 9);

    // Both nodes counted the failover; the graph takes writes again.
    for node in [&a, &b] {
        node.wait_for_metric("myriad_engine_failovers_total", 1);
        let (status, stats) = node.http("GET", "/stats", &node.key_headers(), "");
        assert_eq!(status, 200);
        let stats: Value = serde_json::from_str(&stats).unwrap();
        assert_eq!(stats["failovers"], 1, "{stats}");
        assert!(
            stats["redis_unavailable_ms"].as_u64().unwrap() > 0,
            "{stats}"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _) = common::graph::post(&a, "/api/follow", json!({"edges": [[3, 2]]}));
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the graph never came back: {status}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
