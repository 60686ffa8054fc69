//! `myriad bench` end to end: every workload, briefly, against a real
//! `myriad serve` (and churn across two nodes over a real Redis, one of
//! them killed mid-run), checking that the figures agree with each other
//! and with the server's own counters (messages received = published ×
//! subscribers where nothing is lost), and that a workload's check fails
//! when the server is wrong. Counts only; never timings.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::tls::Pki;
use common::Node;
use myriad_testkit::RedisServer;
use serde_json::Value;

/// A file in the system's temp directory, unique to this test process.
fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("myriad-bench-{}-{name}", std::process::id()))
}

/// `myriad bench` with `global` options (plus --json and quiet progress)
/// and a workload.
fn bench_command(node: &Node, json: &Path, global: &[&str], workload: &[&str]) -> Command {
    cluster_bench_command(&[node], &[node], json, global, workload)
}

/// [`bench_command`] against several nodes: the `--url` of each of
/// `nodes`, and the `--admin-url` of each of `admins`.
fn cluster_bench_command(
    nodes: &[&Node],
    admins: &[&Node],
    json: &Path,
    global: &[&str],
    workload: &[&str],
) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_myriad"));
    cmd.arg("bench");
    for node in nodes {
        cmd.args(["--url", &node.url("/ws")]);
    }
    for node in admins {
        cmd.args(["--admin-url", &format!("http://{}", node.admin)]);
    }
    // Counts are what the tests check, never speed: a set-up may take long
    // on a loaded box (the default bound, 5 s, counts it as a failure).
    cmd.args(["--progress", "off", "--connect-timeout", "60s", "--json"])
        .arg(json)
        .args(global)
        .args(workload)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Runs a bench command to the end and returns its JSON report.
fn report_of(output: Output, json: &Path) -> Value {
    assert!(
        output.status.success(),
        "bench failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(json).expect("the --json report");
    std::fs::remove_file(json).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The JSON report of a bench command that must fail its checks.
fn failed_report(mut cmd: Command, json: &Path) -> Value {
    let output = cmd.output().expect("run myriad bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "must fail: {stderr}");
    assert!(stderr.contains("failed its checks"), "{stderr}");
    let r = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    std::fs::remove_file(json).unwrap();
    r
}

fn bench(node: &Node, name: &str, global: &[&str], workload: &[&str]) -> Value {
    let json = temp_path(&format!("{name}.json"));
    let output = bench_command(node, &json, global, workload)
        .output()
        .expect("run myriad bench");
    report_of(output, &json)
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

fn no_failures(r: &Value) {
    let failed: u64 = r["failures"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(failed, 0, "failures: {}", r["failures"]);
}

#[test]
fn run_delivers_every_message_and_the_figures_agree() {
    let node = Node::start(&[]);
    let html = temp_path("run.html");
    let r = bench(
        &node,
        "run",
        &["--html", html.to_str().unwrap()],
        &[
            "run",
            "--connections",
            "300",
            "--rate",
            "600",
            "--duration",
            "2s",
        ],
    );
    no_failures(&r);
    let t = &r["totals"];
    assert_eq!(u(&t["subscribed"]), 300);
    assert_eq!(u(&t["upgraded"]), 301, "300 subscribers and one publisher");
    assert_eq!(u(&t["published"]), 1200, "600/s for 2 s, open loop");
    // One subject per connection: each publish has exactly one subscriber.
    let d = &r["deliveries"];
    assert_eq!(u(&d["published"]), 1200);
    assert_eq!(u(&d["expected"]), 1200);
    assert_eq!(u(&d["received"]), 1200);
    assert_eq!(d["exact"], true);
    assert_eq!(u(&r["latency"]["count"]), 1200, "every delivery timed");
    assert_eq!(u(&t["server_errors"]), 0);
    // The server counted the same publishes and deliveries.
    let server = &r["server"];
    assert_eq!(u(&server["nodes"]), 1);
    let (before, after) = (&server["before"][0], &server["after"][0]);
    assert_eq!(u(&after["publishes"]) - u(&before["publishes"]), 1200);
    assert_eq!(u(&server["peak_connections"]), 301);
    assert!(server["rss_added_per_connection"].is_f64());
    assert!(!r["timeline"].as_array().unwrap().is_empty());
    let page = std::fs::read_to_string(&html).expect("the --html report");
    std::fs::remove_file(&html).unwrap();
    assert!(page.starts_with("<!doctype html>") && page.contains("<svg"));
    assert!(!page.contains("<script"), "self-contained, no scripts");
}

#[test]
fn broadcast_reaches_every_subscriber_with_every_message() {
    let node = Node::start(&["--workers", "2"]);
    let r = bench(
        &node,
        "broadcast",
        &[],
        &[
            "broadcast",
            "--subscribers",
            "400",
            "--rate",
            "40",
            "--count",
            "30",
        ],
    );
    no_failures(&r);
    let b = &r["broadcast"];
    assert_eq!(u(&b["messages"]), 30);
    assert_eq!(u(&b["subscribers"]), 400);
    assert_eq!(u(&b["complete"]), 30, "every message reached all 400");
    assert_eq!(u(&b["until_last"]["count"]), 30);
    assert_eq!(u(&r["deliveries"]["received"]), 30 * 400);
    assert_eq!(u(&r["deliveries"]["expected"]), 30 * 400);
    let (before, after) = (&r["server"]["before"][0], &r["server"]["after"][0]);
    assert_eq!(
        u(&after["messages_out"]) - u(&before["messages_out"]),
        30 * 400 + 400,
        "the deliveries, plus one ok per subscribe (publishes carry no id)"
    );
}

/// A broadcast of 30 messages of 512 B to 100 subscribers offering
/// permessage-deflate, against `node`; returns the report.
fn compressing_broadcast(node: &Node, name: &str) -> Value {
    let r = bench(
        node,
        name,
        &[],
        &[
            "broadcast",
            "--subscribe-transport",
            "ws-deflate",
            "--subscribers",
            "100",
            "--rate",
            "40",
            "--count",
            "30",
        ],
    );
    no_failures(&r);
    assert_eq!(u(&r["deliveries"]["received"]), 30 * 100);
    assert_eq!(r["deliveries"]["exact"], true);
    assert_eq!(u(&r["latency"]["count"]), 30 * 100, "every delivery read");
    r
}

#[test]
fn compressing_subscribers_read_fewer_bytes_and_inflate_each_message_once() {
    let node = Node::start(&["--workers", "2"]);
    let r = compressing_broadcast(&node, "deflate");
    let t = &r["totals"];
    assert_eq!(
        u(&t["deflate_agreed"]),
        100,
        "every subscriber's offer taken"
    );
    // Every recipient of a publication gets the same compressed bytes: a
    // bench worker inflates each publication (at least once) and reads
    // the other copies as the text it made (`util::inflate_cache`), while
    // `compressing_broadcast` checked every delivery's text.
    let inflated = u(&t["inflated"]);
    assert!(
        (30..30 * 100).contains(&inflated),
        "{inflated} inflated for 3,000 deliveries"
    );
    // The payloads' random padding still shrinks (6 bits of 8 per
    // character): what the sockets carried is less than was delivered.
    assert!(
        u(&t["wire_bytes_in"]) < u(&t["bytes_in"]),
        "compressed: {t}"
    );
    assert_eq!(
        node.metric("myriad_compression_frames_total"),
        30,
        "one compressed frame per publication, for 100 recipients on 2 workers"
    );

    // A node that does not compress declines the offer: the same bench
    // reads plain frames, framing and the 101 adding to the payloads.
    let plain = Node::start(&["--compression", "false"]);
    let r = compressing_broadcast(&plain, "deflate-declined");
    let t = &r["totals"];
    assert_eq!(u(&t["deflate_agreed"]), 0);
    assert!(u(&t["wire_bytes_in"]) > u(&t["bytes_in"]), "plain: {t}");
    assert_eq!(plain.metric("myriad_compression_frames_total"), 0);
}

/// `subscribers` (with `receive`, the options of how they receive) held
/// while a separate `publishers` run publishes 300 messages to their 100
/// subjects, two subscribers each; returns the subscribers' report.
fn subscribers_under_a_separate_publisher(node: &Node, receive: &[&str]) -> Value {
    let json = temp_path(&format!("subscribers{}.json", receive.concat()));
    let mut workload = vec![
        "subscribers",
        "--connections",
        "200",
        "--subjects",
        "/t/s{1..100}",
        // Ample: the publisher below runs for about a second, but the
        // tests share a small machine.
        "--duration",
        "10s",
    ];
    workload.extend_from_slice(receive);
    let subscribers: Child = bench_command(node, &json, &[], &workload).spawn().unwrap();
    // Connection i takes subject i mod 100: two subscribers per subject.
    node.wait_for_stats("200 subscriptions", |s| s["subscriptions"] == 200);
    let published = bench(
        node,
        "publishers",
        &[],
        &[
            "publishers",
            "--subjects",
            "/t/s{1..100}",
            "--order",
            "sequential",
            "--rate",
            "300",
            "--count",
            "300",
        ],
    );
    no_failures(&published);
    assert_eq!(u(&published["totals"]["published"]), 300);
    assert_eq!(u(&published["publish_lag"]["count"]), 300);
    let r = report_of(subscribers.wait_with_output().unwrap(), &json);
    no_failures(&r);
    assert_eq!(u(&r["totals"]["subscribed"]), 200);
    assert_eq!(u(&r["totals"]["messages_in"]), 600, "300 publishes × 2");
    assert_eq!(u(&r["latency"]["count"]), 600);
    r
}

/// Subscribers over one of the receive-only HTTP transports, in every
/// workload that subscribes: the same counts as over WebSocket, and churn
/// resumes from the positions seen (`Last-Event-ID` or `since`) losing and
/// repeating nothing. Streams carry a heartbeat a second, and polls are
/// held a second at most.
fn every_workload_subscribes_over(transport: &str) {
    let node = Node::start(&[
        "--workers",
        "2",
        "--poll-timeout",
        "1",
        "--stream-heartbeat-interval",
        "1",
    ]);
    let receive = ["--subscribe-transport", transport, "--poll-timeout", "1s"];
    let over = |workload: &[&'static str]| [workload, &receive].concat();
    let r = bench(
        &node,
        &format!("broadcast-{transport}"),
        &[],
        &over(&[
            "broadcast",
            "--subscribers",
            "200",
            "--rate",
            "40",
            "--count",
            "20",
        ]),
    );
    no_failures(&r);
    assert_eq!(u(&r["totals"]["subscribed"]), 200);
    assert_eq!(
        u(&r["totals"]["upgraded"]),
        201,
        "200 requests answered, one WebSocket publisher"
    );
    assert_eq!(u(&r["broadcast"]["complete"]), 20, "all 200 got each one");
    assert_eq!(u(&r["deliveries"]["expected"]), 20 * 200);
    assert_eq!(u(&r["deliveries"]["received"]), 20 * 200);
    let r = bench(
        &node,
        &format!("run-{transport}"),
        &[],
        &over(&[
            "run",
            "--connections",
            "200",
            "--rate",
            "400",
            "--duration",
            "1s",
        ]),
    );
    no_failures(&r);
    assert_eq!(u(&r["deliveries"]["published"]), 400);
    assert_eq!(u(&r["deliveries"]["expected"]), 400);
    assert_eq!(u(&r["deliveries"]["received"]), 400);
    assert_eq!(u(&r["latency"]["count"]), 400, "every delivery timed");
    let r = subscribers_under_a_separate_publisher(&node, &receive);
    let heartbeats = u(&r["totals"]["heartbeats"]);
    if transport == "poll" {
        assert_eq!(heartbeats, 0, "a poll is answered instead");
    } else {
        assert!(heartbeats > 0, "ten seconds of one a second");
    }
    churn_gets_every_message_once(&[&node], &receive);
    // The server sent them over this transport.
    let sent = u(&node.stats()["transports"][transport]["messages_out"]);
    assert!(sent >= 20 * 200 + 400 + 600 + 15_000, "{sent}");
}

#[test]
fn every_workload_subscribes_over_server_sent_events() {
    every_workload_subscribes_over("sse");
}

#[test]
fn every_workload_subscribes_over_http_streaming() {
    every_workload_subscribes_over("stream");
}

#[test]
fn every_workload_subscribes_over_long_poll() {
    every_workload_subscribes_over("poll");
}

#[test]
fn subscribers_time_what_a_separate_publisher_sends() {
    let node = Node::start(&[]);
    subscribers_under_a_separate_publisher(&node, &[]);
}

#[test]
fn http_publishing_counts_the_servers_answers() {
    let keys = ["--admin-key", "open-sesame", "--publish-key", "sesame"];
    let node = Node::start(&keys);
    let r = bench(
        &node,
        "http",
        &keys,
        &[
            "run",
            "--connections",
            "50",
            "--publish-transport",
            "http",
            "--publisher-conns",
            "2",
            "--rate",
            "200",
            "--duration",
            "1s",
        ],
    );
    no_failures(&r);
    let t = &r["totals"];
    assert_eq!(u(&t["published"]), 200);
    assert_eq!(u(&t["http_ok"]), 200);
    assert_eq!(u(&t["http_errors"]), 0);
    assert_eq!(
        u(&t["http_delivered"]),
        200,
        "the API says one subscriber each"
    );
    assert_eq!(u(&r["deliveries"]["received"]), 200);
    assert_eq!(u(&r["http_response"]["count"]), 200);
    // /stats answered the admin key: the server's figures are there.
    let (before, after) = (&r["server"]["before"][0], &r["server"]["after"][0]);
    assert_eq!(u(&after["publishes"]) - u(&before["publishes"]), 200);
    let wrong = bench(
        &node,
        "http-wrong-key",
        &["--admin-key", "open-sesame", "--publish-key", "nope"],
        &[
            "publishers",
            "--publish-transport",
            "http",
            "--rate",
            "50",
            "--count",
            "20",
        ],
    );
    assert_eq!(u(&wrong["totals"]["http_ok"]), 0);
    assert_eq!(u(&wrong["totals"]["http_errors"]), 20, "401 for every one");
}

/// connect-rate at `rate` arrivals/s: 1 s ramping up, 1 s sustained, 1 s
/// ramping down, each arrival held 1 s.
fn connect_rate(rate: &str) -> [&str; 11] {
    [
        "connect-rate",
        "--rate",
        rate,
        "--ramp-up",
        "1s",
        "--sustain",
        "1s",
        "--ramp-down",
        "1s",
        "--hold",
        "1s",
    ]
}

#[test]
fn connect_rate_opens_holds_and_closes_every_device() {
    let node = Node::start(&["--workers", "2"]);
    let r = bench(
        &node,
        "connect-rate",
        &[],
        &[&connect_rate("400")[..], &["--subscribe", "/d/{1..50}"]].concat(),
    );
    no_failures(&r);
    let t = &r["totals"];
    // 200 arrivals ramping up, 400 sustained, 200 ramping down.
    assert_eq!(u(&t["attempts"]), 800);
    assert_eq!(u(&t["upgraded"]), 800);
    assert_eq!(u(&t["subscribed"]), 800);
    assert_eq!(u(&t["closed"]), 800, "every device closed cleanly");
    let phases = r["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 3);
    let upgrades: u64 = phases.iter().map(|p| u(&p["upgrades"])).sum();
    assert_eq!(upgrades, 800);
    assert_eq!(u(&r["handshake"]["count"]), 800);
    let (before, after) = (&r["server"]["before"][0], &r["server"]["after"][0]);
    assert_eq!(
        u(&after["connections_accepted"]) - u(&before["connections_accepted"]),
        800
    );
    node.wait_for_stats("every device gone", |s| s["connections"] == 0);
}

/// The workloads the TLS figures come from, over wss://: every arrival of
/// connect-rate is a TLS handshake the node completes, and idle
/// subscribers set up and hold over TLS.
#[test]
fn connect_rate_and_subscribers_run_over_tls() {
    let pki = Pki::new();
    let node = pki.start(&["--workers", "2"]);
    let ca = pki.cert.display().to_string();
    let tls = ["--tls-ca", ca.as_str()];
    let r = bench(&node, "connect-rate-tls", &tls, &connect_rate("100"));
    no_failures(&r);
    let t = &r["totals"];
    assert_eq!(u(&t["attempts"]), 200);
    assert_eq!(u(&t["upgraded"]), 200);
    assert_eq!(u(&t["closed"]), 200, "every connection closed cleanly");
    let (before, after) = (&r["server"]["before"][0], &r["server"]["after"][0]);
    assert_eq!(
        u(&after["tls_handshakes"]) - u(&before["tls_handshakes"]),
        200,
        "one TLS handshake per arrival"
    );

    let r = bench(
        &node,
        "subscribers-tls",
        &tls,
        &["subscribers", "--connections", "300", "--duration", "1s"],
    );
    no_failures(&r);
    assert_eq!(u(&r["totals"]["subscribed"]), 300);
    node.wait_for_stats("every subscriber gone", |s| s["connections"] == 0);
    assert_eq!(node.stats()["tls_handshakes"], 500);

    // Without the certificate to trust, the bench says so before starting.
    let json = temp_path("no-ca.json");
    let output = bench_command(&node, &json, &[], &["subscribers", "--connections", "1"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--tls-ca"), "{stderr}");
}

/// A bench whose open-file cap allows 300 connections per process spreads
/// 700 over three worker processes, from several source addresses, and
/// still sets every one up.
#[test]
fn connections_spread_over_processes_within_the_open_file_cap() {
    use std::os::unix::process::CommandExt;
    let node = Node::start(&[]);
    let json = temp_path("spread.json");
    let mut cmd = bench_command(
        &node,
        &json,
        &["--local-addrs", "127.0.0.1-127.0.0.3"],
        &["subscribers", "--connections", "700", "--duration", "3s"],
    );
    // SAFETY: only setrlimit, which is async-signal-safe, runs in the child.
    unsafe {
        cmd.pre_exec(|| {
            let cap = libc::rlimit {
                rlim_cur: 400,
                rlim_max: 400,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &cap) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let r = report_of(cmd.output().unwrap(), &json);
    no_failures(&r);
    assert_eq!(u(&r["bench"]["fd_cap"]), 400);
    assert_eq!(u(&r["bench"]["conns_per_process"]), 300);
    assert_eq!(u(&r["bench"]["processes"]), 3);
    assert_eq!(u(&r["totals"]["subscribed"]), 700);
    assert_eq!(u(&r["server"]["peak_connections"]), 700);
}

/// Another server's dialect through a profile: the generic profile against
/// myriad's echo endpoint, where each connection's "join" comes back to it.
#[test]
fn a_generic_profile_drives_a_server_that_only_echoes() {
    let node = Node::start(&["--echo-path", "/echo"]);
    let json = temp_path("generic.json");
    let output = Command::new(env!("CARGO_BIN_EXE_myriad"))
        .args(["bench", "--progress", "off", "--profile", "generic"])
        .args(["--url", &node.url("/echo"), "--json"])
        .arg(&json)
        .args(["subscribers", "--connections", "40", "--duration", "1s"])
        .output()
        .unwrap();
    let r = report_of(output, &json);
    no_failures(&r);
    assert_eq!(r["profile"], "generic");
    assert_eq!(
        u(&r["totals"]["subscribed"]),
        40,
        "no ack: counted once sent"
    );
    assert_eq!(u(&r["totals"]["other_in"]), 40, "each join echoed back");
    assert_eq!(
        u(&r["totals"]["messages_in"]),
        0,
        "an echo carries no timestamp"
    );
}

/// Source ports picked by the bench itself (each worker process its own
/// slice of 1024-65535), from two source addresses: the seed-004 way past
/// the kernel's ephemeral range.
#[test]
fn explicit_source_ports_set_every_connection_up() {
    let node = Node::start(&[]);
    let r = bench(
        &node,
        "explicit-ports",
        &[
            "--source-ports",
            "explicit",
            "--local-addrs",
            "127.0.0.2-127.0.0.3",
            "--processes",
            "2",
        ],
        &["subscribers", "--connections", "400", "--duration", "1s"],
    );
    no_failures(&r);
    assert_eq!(u(&r["bench"]["processes"]), 2);
    assert_eq!(u(&r["totals"]["subscribed"]), 400);
}

/// Churn (with `receive`, the options of how subscribers receive): 200
/// subscribers over 20 subjects reconnect 100 times a second for 3 s while
/// 500 messages a second are published; each must get every message of
/// its subjects once, in order. Counts only: that the reconnects were made,
/// answered and recovered, never how fast. Returns the report.
/// The subscribers are spread over `nodes` (one node, or the nodes of one
/// cluster), each reconnect going to the next node.
fn churn_gets_every_message_once(nodes: &[&Node], receive: &[&str]) -> Value {
    let mut workload = vec![
        "churn",
        "--subscribers",
        "200",
        "--subjects",
        "20",
        "--reconnect-rate",
        "100",
        "--rate",
        "500",
        "--duration",
        "3s",
    ];
    workload.extend_from_slice(receive);
    let json = temp_path(&format!("churn{}-{}.json", receive.concat(), nodes.len()));
    let output = cluster_bench_command(nodes, nodes, &json, &[], &workload)
        .output()
        .expect("run myriad bench");
    let r = report_of(output, &json);
    no_failures(&r);
    let c = &r["churn"];
    assert_eq!(u(&c["subscriptions"]), 200, "one subject each");
    // 100/s for 3 s: 300 turns, each made unless its subscriber (back every
    // 2 s) was still busy with its previous one.
    let reconnects = u(&c["reconnects"]);
    assert_eq!(reconnects + u(&c["reconnects_skipped"]), 300);
    assert!(reconnects > 0, "reconnects happened");
    assert_eq!(u(&c["reconnected"]), reconnects, "every one answered");
    assert_eq!(u(&c["recovered"]), reconnects, "one subject per reconnect");
    assert_eq!(u(&c["unrecovered"]), 0);
    assert_eq!(c["recovered_percent"], 100.0);
    for zero in ["lost", "short_at_end", "duplicates", "gaps", "broken"] {
        assert_eq!(u(&c[zero]), 0, "{zero}: {c}");
    }
    assert_eq!(u(&c["replay"]["count"]), reconnects, "a replay size each");
    assert_eq!(u(&r["resubscribe"]["count"]), reconnects);
    // Every delivery arrived once: replays included, none twice.
    let d = &r["deliveries"];
    assert_eq!(u(&d["published"]), 1500, "500/s for 3 s, open loop");
    assert_eq!(u(&d["expected"]), 15_000, "ten subscribers per subject");
    assert_eq!(u(&d["received"]), 15_000);
    assert_eq!(d["exact"], true);
    assert_eq!(
        u(&r["latency"]["count"]) + u(&c["replayed"]),
        15_000,
        "live deliveries are timed, replays counted"
    );
    let t = &r["totals"];
    assert_eq!(
        u(&t["upgraded"]),
        201 + reconnects,
        "one new connection each"
    );
    assert_eq!(u(&t["closed"]), reconnects, "each old one closed cleanly");
    assert_eq!(u(&c["failovers"]), 0, "no node died");
    // Every node took its share of them.
    let server = &r["server"];
    assert_eq!(u(&server["nodes"]), nodes.len() as u64);
    let accepted: Vec<u64> = (0..nodes.len())
        .map(|n| {
            u(&server["after"][n]["connections_accepted"])
                - u(&server["before"][n]["connections_accepted"])
        })
        .collect();
    assert_eq!(
        accepted.iter().sum::<u64>(),
        201 + reconnects,
        "{accepted:?}"
    );
    assert!(accepted.iter().all(|&n| n >= 100), "{accepted:?}");
    r
}

#[test]
fn churning_subscribers_get_every_message_once_across_reconnects() {
    let node = Node::start(&["--workers", "2"]);
    let r = churn_gets_every_message_once(&[&node], &[]);
    let reconnects = u(&r["churn"]["reconnects"]);
    node.wait_for_stats("the old connections' close frames", |s| {
        s["closes"]["normal"] == reconnects
    });
}

/// Churn across two nodes of a cluster over Redis, given both URLs: the
/// subscribers spread over both, reconnect to the other node each time and
/// resume there from Redis history, losing and repeating nothing.
#[test]
fn churn_across_two_nodes_over_redis_gets_every_message_once() {
    let redis = RedisServer::start();
    let a = Node::in_cluster(&redis, "churn");
    let b = Node::in_cluster(&redis, "churn");
    churn_gets_every_message_once(&[&a, &b], &[]);
}

/// A node is killed with `kill -9` in the middle of a churn run over two
/// nodes: its subscribers fail over to the other node, resume there from
/// Redis history, and every subscriber still gets every message of its
/// subject once, in order. The publisher publishes through the surviving
/// node's API (publishers do not fail over).
#[test]
fn churning_subscribers_fail_over_when_a_node_is_killed_and_lose_nothing() {
    let redis = RedisServer::start();
    let mut a = Node::in_cluster(&redis, "kill");
    let b = Node::in_cluster(&redis, "kill");
    let json = temp_path("churn-kill.json");
    let bench = cluster_bench_command(
        &[&a, &b],
        &[&b],
        &json,
        &[],
        &[
            "churn",
            "--subscribers",
            "100",
            "--subjects",
            "10",
            "--reconnect-rate",
            "20",
            "--rate",
            "200",
            "--publish-transport",
            "http",
            "--duration",
            "4s",
        ],
    )
    .spawn()
    .unwrap();
    // A quarter of the way into publishing, node A goes. (The bench sets
    // its subscribers up first, which may take a while on a busy box.)
    let deadline = Instant::now() + Duration::from_secs(120);
    while u(&b.stats()["publishes"]) < 200 {
        assert!(Instant::now() < deadline, "the bench never published");
        std::thread::sleep(Duration::from_millis(20));
    }
    a.kill_9();
    let r = report_of(bench.wait_with_output().unwrap(), &json);
    let c = &r["churn"];
    let failovers = u(&c["failovers"]);
    assert!(failovers > 0, "node A held subscribers: {c}");
    assert_eq!(u(&c["failed_over"]), failovers, "every one back: {c}");
    for zero in [
        "lost",
        "short_at_end",
        "duplicates",
        "gaps",
        "broken",
        "unrecovered",
    ] {
        assert_eq!(u(&c[zero]), 0, "{zero}: {c}");
    }
    // One subject each: a resubscribe per reconnect and per failover.
    assert_eq!(u(&c["reconnected"]), u(&c["reconnects"]), "{c}");
    assert_eq!(u(&c["recovered"]), u(&c["reconnected"]) + failovers, "{c}");
    let d = &r["deliveries"];
    assert_eq!(u(&d["published"]), 800, "200/s for 4 s, open loop");
    assert_eq!(u(&d["expected"]), 8_000, "ten subscribers per subject");
    assert_eq!(u(&d["received"]), 8_000);
    assert_eq!(d["exact"], true);
    // The connections node A held ended under it.
    assert!(
        r["failures"]["server_closed"].as_u64().unwrap() + r["failures"]["reset"].as_u64().unwrap()
            >= failovers
    );
}

/// The check can fail: with one publication of history, subscribers away
/// for 300 ms while each subject gets one every 25 ms cannot be recovered.
/// The run reports what was lost, agreeing with the delivery count, and
/// exits non-zero.
#[test]
fn churn_reports_what_a_short_history_cannot_recover() {
    let node = Node::start(&["--workers", "2", "--history-size", "1"]);
    let json = temp_path("churn-short-history.json");
    let cmd = bench_command(
        &node,
        &json,
        &[],
        &[
            "churn",
            "--subscribers",
            "100",
            "--subjects",
            "10",
            "--reconnect-rate",
            "50",
            "--offline",
            "300ms",
            "--rate",
            "400",
            "--order",
            "sequential",
            "--duration",
            "2s",
            "--drain",
            "1s",
        ],
    );
    let r = failed_report(cmd, &json);
    let c = &r["churn"];
    assert!(u(&c["reconnects"]) > 0);
    assert!(u(&c["unrecovered"]) > 0, "{c}");
    assert!(u(&c["lost"]) > 0, "{c}");
    assert_eq!(u(&c["duplicates"]), 0);
    let d = &r["deliveries"];
    assert_eq!(
        u(&c["lost"]),
        u(&d["expected"]) - u(&d["received"]),
        "two accountings, one answer"
    );
}

/// A Barabási–Albert follow graph, the shape `myriad graph generate`
/// writes, small and deterministic: users `0..users`, each from the
/// `per_node`-th on following `per_node` distinct earlier users drawn in
/// proportion to their degree. Written to a temp file; returns its path
/// and the edges.
fn follow_graph(name: &str, users: u64, per_node: u64) -> (PathBuf, BTreeSet<(u64, u64)>) {
    let mut state = 0x5eed_u64;
    // SplitMix64.
    let mut below = |n: usize| {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) % n as u64) as usize
    };
    // Every edge's two ends: a draw from it is a draw by degree.
    let mut ends: Vec<u64> = (0..per_node).collect();
    let mut edges = BTreeSet::new();
    for user in per_node..users {
        let mut followees = BTreeSet::new();
        while followees.len() < per_node as usize {
            followees.insert(ends[below(ends.len())]);
        }
        for followee in followees {
            edges.insert((user, followee));
            ends.extend([user, followee]);
        }
    }
    let path = temp_path(name);
    let text: String = edges.iter().map(|(a, b)| format!("{a} {b}\n")).collect();
    std::fs::write(&path, text).unwrap();
    (path, edges)
}

/// Asserts that a social run found nothing wrong.
fn social_is_exact(r: &Value) {
    no_failures(r);
    let s = &r["social"];
    for zero in [
        "lost",
        "duplicated",
        "unexpected",
        "clashes",
        "refused",
        "unanswered",
        "not_made",
        "follow_requests_failed",
        "feeds_mismatched",
        "not_set_up",
    ] {
        assert_eq!(u(&s[zero]), 0, "{zero}: {s}");
    }
    assert_eq!(u(&s["acked"]), u(&s["sends"]));
    assert_eq!(u(&s["delivered"]), u(&s["expected"]));
    assert_eq!(
        u(&s["delivered"]) + u(&s["in_flight_delivered"]),
        u(&r["totals"]["messages_in"]),
        "every delivery owed or in flight"
    );
    assert_eq!(u(&r["latency"]["count"]), u(&r["totals"]["messages_in"]));
}

/// social: 300 users of a graph with 5 edges per node, two connections
/// each, send as themselves. Every send reaches each connection of every
/// follower and of the sender once, and nothing else reaches anyone; what
/// the bench says was owed is what the node says it handed out. The check
/// can fail: once the node holds edges the file does not have, the same
/// run reports unexpected deliveries and exits non-zero.
#[test]
fn social_delivers_every_send_to_every_follower_once() {
    let node = Node::start(&["--workers", "2"]);
    let (graph, edges) = follow_graph("social.txt", 300, 5);
    let graph = graph.to_str().unwrap();
    let workload = [
        "social",
        "--graph",
        graph,
        "--connections-per-user",
        "2",
        "--rate",
        "300",
        "--duration",
        "2s",
    ];
    let r = bench(
        &node,
        "social",
        &[],
        &[&workload[..], &["--load-graph"]].concat(),
    );
    social_is_exact(&r);
    let s = &r["social"];
    assert_eq!((u(&s["users"]), u(&s["graph_users"])), (300, 300));
    assert_eq!(u(&s["edges_among_users"]), edges.len() as u64);
    assert_eq!(u(&r["totals"]["subscribed"]), 600, "every connection");
    assert_eq!(u(&s["sends"]), 600, "300/s for 2 s, open loop");
    assert_eq!(u(&s["in_flight"]), 0, "no follow churn: every pair judged");
    assert_eq!(u(&s["reached"]), u(&s["expected"]), "the node's count");
    assert!(
        u(&s["expected"]) >= 600 * 2,
        "a send reaches its sender's two"
    );
    assert!(s["server_cpu_us_per_send"].is_f64(), "{s}");

    // Every user gains a follower the file does not know of.
    let extra: Vec<[u64; 2]> = (0..300u64)
        .map(|v| [(v + 150) % 300, v])
        .filter(|&[a, b]| !edges.contains(&(a, b)))
        .collect();
    let body = serde_json::json!({ "edges": extra }).to_string();
    let (status, reply) = node.http("POST", "/api/follow", &[], &body);
    assert_eq!(status, 200, "{reply}");
    let json = temp_path("social-other-graph.json");
    let r = failed_report(bench_command(&node, &json, &[], &workload), &json);
    let s = &r["social"];
    assert!(u(&s["unexpected"]) > 0, "{s}");
    assert_eq!(u(&s["lost"]) + u(&s["duplicated"]), 0, "{s}");
    assert_eq!(
        u(&s["delivered"]) + u(&s["unexpected"]),
        u(&r["totals"]["messages_in"])
    );
    std::fs::remove_file(graph).unwrap();
}

/// social with follows and unfollows going on: still exact, every follow
/// announced to each connection of its follower, sends whose edge changed
/// while they were in flight counted and not judged; and the run puts the
/// edges it changed back, so a plain run on the same node finds the file's
/// graph.
#[test]
fn social_stays_exact_while_users_follow_and_unfollow() {
    let node = Node::start(&["--workers", "2"]);
    let (graph, _) = follow_graph("social-churn.txt", 300, 5);
    let graph = graph.to_str().unwrap();
    let r = bench(
        &node,
        "social-churn",
        &[],
        &[
            "social",
            "--graph",
            graph,
            "--load-graph",
            "--connections-per-user",
            "2",
            "--rate",
            "300",
            "--follow-rate",
            "200",
            "--duration",
            "2s",
        ],
    );
    social_is_exact(&r);
    let s = &r["social"];
    assert_eq!((u(&s["follows"]), u(&s["unfollows"])), (200, 200));
    assert_eq!(u(&s["follow_notices_expected"]), 200 * 2);
    assert_eq!(u(&s["follow_notices"]), 200 * 2);
    assert!(u(&s["follow_requests"]) >= 2, "{s}");
    assert!(u(&s["in_flight_delivered"]) <= u(&s["in_flight"]));
    let r = bench(
        &node,
        "social-after-churn",
        &[],
        &[
            "social",
            "--graph",
            graph,
            "--rate",
            "200",
            "--duration",
            "1s",
        ],
    );
    social_is_exact(&r);
    assert_eq!(u(&r["social"]["sends"]), 200);
    std::fs::remove_file(graph).unwrap();
}
