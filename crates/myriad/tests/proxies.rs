//! Synchronous proxies against the real binary (issue 29, item 3): before
//! a connect, a subscribe or a publish the node asks a real HTTP backend
//! (`myriad_testkit::proxy_backend`, written from docs/operations.md) and
//! obeys it: allow, refuse with a code, a connect's user and grants. A
//! timeout and a malformed answer go by `proxy_fail` in both modes, a slow
//! answer holds no other connection of the same worker, a closed
//! connection's late verdict reaches nobody, a connection's commands take
//! effect in the order sent (those behind a parked one held, within
//! `proxy_max_held`), the in-flight cap refuses clearly, a namespace may switch its proxy off, and a URL-opened stream
//! under a subscribe proxy is refused (403). Waits are for events (a gate the test opens, a counter),
//! never for a time.

mod common;

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::{recv, refused_start, send, Node, Ws};
use myriad_testkit::proxy_backend::{ProxyBackend, Reply};
use serde_json::{json, Value};

const SECRET: &str = "0123456789abcdef0123456789abcdef";

/// A node on one worker (so every connection shares the worker a slow
/// answer could block) with `extra` settings, signing with `SECRET`.
fn node(extra: &[&str]) -> Node {
    let mut args = vec!["--workers", "1", "--hook-secret", SECRET];
    args.extend_from_slice(extra);
    Node::start(&args)
}

/// Sends `command` with id `id` and returns the reply to it.
fn ask(ws: &mut Ws, id: u64, mut command: Value) -> Value {
    command["id"] = json!(id);
    send(ws, command);
    loop {
        let reply = recv(ws);
        if reply["id"] == id {
            return reply;
        }
    }
}

fn error_code(reply: &Value) -> &str {
    assert_eq!(reply["op"], "error", "{reply}");
    reply["code"].as_str().unwrap()
}

/// `proxy_calls_total{kind,outcome}` from `/metrics`, 0 when absent.
fn calls(node: &Node, kind: &str, outcome: &str) -> u64 {
    let (status, text) = node.http("GET", "/metrics", &[], "");
    assert_eq!(status, 200);
    let series = format!("myriad_proxy_calls_total{{kind=\"{kind}\",outcome=\"{outcome}\"}}");
    text.lines()
        .find_map(|line| line.strip_prefix(&series))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// A gate a backend's answers wait at until the test opens it.
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn wait(&self) {
        let (open, turned) = &*self.0;
        let mut open = open.lock().unwrap();
        while !*open {
            open = turned.wait(open).unwrap();
        }
    }

    fn open(&self) {
        let (open, turned) = &*self.0;
        *open.lock().unwrap() = true;
        turned.notify_all();
    }
}

#[test]
fn a_proxy_url_that_is_not_http_or_https_stops_the_start_naming_it() {
    for setting in [
        "proxy-connect-url",
        "proxy-subscribe-url",
        "proxy-publish-url",
    ] {
        for url in ["ftp://127.0.0.1/p", "127.0.0.1:9/p", "https://"] {
            let flag = format!("--{setting}");
            let (code, stderr) = refused_start(&[&flag, url], &[]);
            assert_eq!(code, 2, "{setting} {url}: {stderr}");
            let name = setting.replace('-', "_");
            assert!(stderr.contains(&name), "{setting} {url}: {stderr}");
        }
    }
    // A namespace switch with no URL behind it.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("myriad.toml");
    std::fs::write(
        &file,
        "[[namespace]]\nprefix = \"chat.\"\npublish_proxy = true\n",
    )
    .unwrap();
    let (code, stderr) = refused_start(&["--config", file.to_str().unwrap()], &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("proxy_publish_url"), "{stderr}");
}

#[test]
fn a_subscribe_is_allowed_or_refused_as_the_backend_says() {
    let backend = ProxyBackend::start(SECRET.as_bytes(), |call| {
        match call["subject"].as_str().unwrap_or_default() {
            s if s.starts_with("ok.") => Reply::allow(),
            s if s.starts_with("limit.") => Reply::refuse("rate_limited", "slow down"),
            _ => Reply::refuse("no_such_code", "not for you"),
        }
    });
    let node = node(&["--proxy-subscribe-url", backend.url()]);
    let mut ws = node.connect();

    let ok = ask(&mut ws, 1, json!({"op": "subscribe", "subject": "ok.1"}));
    assert_eq!(ok["op"], "subscribed", "{ok}");
    let call = backend.next_within(Duration::from_secs(10)).unwrap();
    assert!(call.verified, "signed with hook_secret: {:?}", call.body);
    assert_eq!(
        call.body,
        json!({"kind": "subscribe", "user": null, "subject": "ok.1"})
    );

    let refused = ask(&mut ws, 2, json!({"op": "subscribe", "subject": "no.1"}));
    assert_eq!(error_code(&refused), "proxy_refused", "an unknown code");
    assert!(refused["message"].as_str().unwrap().contains("not for you"));
    let limited = ask(&mut ws, 3, json!({"op": "subscribe", "subject": "limit.1"}));
    assert_eq!(error_code(&limited), "rate_limited");

    // The refused subject is not held: a publish to it reaches nobody here,
    // one to the allowed subject does.
    node.publish("no.1", &json!("lost"));
    node.publish("ok.1", &json!("kept"));
    let delivered = recv(&mut ws);
    assert_eq!(delivered["subject"], "ok.1", "{delivered}");
    assert_eq!(delivered["data"], "kept");

    assert_eq!(calls(&node, "subscribe", "allowed"), 1);
    assert_eq!(calls(&node, "subscribe", "refused"), 2);
}

#[test]
fn a_publish_is_allowed_or_refused_as_the_backend_says() {
    let backend = ProxyBackend::start(SECRET.as_bytes(), |call| {
        if call["data"]["ok"] == true {
            Reply::allow()
        } else {
            Reply::refuse("forbidden", "bad data")
        }
    });
    let node = node(&["--proxy-publish-url", backend.url()]);
    let mut reader = node.connect();
    common::subscribe(&mut reader, &["room"]);
    let mut writer = node.connect();

    let refused = ask(
        &mut writer,
        1,
        json!({"op": "publish", "subject": "room", "data": {"ok": false}}),
    );
    assert_eq!(error_code(&refused), "forbidden");
    let call = backend.next_within(Duration::from_secs(10)).unwrap();
    assert_eq!(
        call.body,
        json!({"kind": "publish", "user": null, "subject": "room", "data": {"ok": false}})
    );
    let allowed = ask(
        &mut writer,
        2,
        json!({"op": "publish", "subject": "room", "data": {"ok": true, "n": 2}}),
    );
    assert_eq!(allowed["op"], "ok", "{allowed}");
    // The reader gets the allowed publication and never the refused one.
    let delivered = recv(&mut reader);
    assert_eq!(
        delivered["data"],
        json!({"ok": true, "n": 2}),
        "{delivered}"
    );
    // The HTTP API is the backend's own path: never asked.
    node.publish("room", &json!("api"));
    assert_eq!(recv(&mut reader)["data"], "api");
    assert_eq!(calls(&node, "publish", "allowed"), 1);
    assert_eq!(calls(&node, "publish", "refused"), 1);
}

/// A backend that answers every call `delay` late, or malformed.
fn unhelpful(malformed: bool) -> ProxyBackend {
    ProxyBackend::start(SECRET.as_bytes(), move |_| {
        if malformed {
            Reply::malformed()
        } else {
            Reply::allow().after(Duration::from_secs(3))
        }
    })
}

#[test]
fn a_timeout_refuses_when_closed_and_allows_when_open() {
    for (fail, allowed) in [("closed", false), ("open", true)] {
        let backend = unhelpful(false);
        let node = node(&[
            "--proxy-subscribe-url",
            backend.url(),
            "--proxy-publish-url",
            backend.url(),
            "--proxy-timeout",
            "200ms",
            "--proxy-fail",
            fail,
        ]);
        let mut ws = node.connect();
        let sub = ask(&mut ws, 1, json!({"op": "subscribe", "subject": "t.1"}));
        let publ = ask(
            &mut ws,
            2,
            json!({"op": "publish", "subject": "t.1", "data": 1}),
        );
        if allowed {
            assert_eq!(sub["op"], "subscribed", "{fail}: {sub}");
            assert_eq!(publ["op"], "ok", "{fail}: {publ}");
            let subscribed = node.publish("t.1", &json!(2));
            assert_eq!(subscribed["delivered"], 1, "{fail}: {subscribed}");
        } else {
            assert_eq!(error_code(&sub), "proxy_unavailable", "{fail}");
            assert_eq!(error_code(&publ), "proxy_unavailable", "{fail}");
        }
        assert_eq!(calls(&node, "subscribe", "timeout"), 1, "{fail}");
        assert_eq!(calls(&node, "publish", "timeout"), 1, "{fail}");
    }
}

#[test]
fn a_malformed_answer_is_a_counted_failure_per_the_fail_mode() {
    for (fail, allowed) in [("closed", false), ("open", true)] {
        let backend = unhelpful(true);
        let node = node(&["--proxy-subscribe-url", backend.url(), "--proxy-fail", fail]);
        let mut ws = node.connect();
        for id in 1..=3 {
            let reply = ask(
                &mut ws,
                id,
                json!({"op": "subscribe", "subject": format!("m.{id}")}),
            );
            if allowed {
                assert_eq!(reply["op"], "subscribed", "{fail}: {reply}");
            } else {
                assert_eq!(error_code(&reply), "proxy_unavailable", "{fail}");
            }
        }
        assert_eq!(calls(&node, "subscribe", "error"), 3, "{fail}");
        // Still serving.
        assert_eq!(ask(&mut ws, 4, json!({"op": "ping"}))["op"], "pong");
    }
}

/// A node that checks tokens, its `connect`s asked of `backend`.
fn connect_proxied(backend: &ProxyBackend) -> Node {
    node(&[
        "--token-hmac-secret",
        "a-test-secret-of-at-least-32-bytes!",
        "--proxy-connect-url",
        backend.url(),
    ])
}

/// A node whose subscribe proxy allows everything, the calls about
/// `held` only once the returned gate is open.
fn gated(held: &'static str, extra: &[&str]) -> (Node, ProxyBackend, Gate) {
    let gate = Gate::default();
    let waits = gate.clone();
    let backend = ProxyBackend::start(SECRET.as_bytes(), move |call| {
        if call["subject"] == held {
            waits.wait();
        }
        Reply::allow()
    });
    let mut args = vec!["--proxy-subscribe-url", backend.url()];
    args.extend_from_slice(extra);
    let node = node(&args);
    (node, backend, gate)
}

#[test]
fn a_slow_answer_blocks_no_other_connection_of_its_worker() {
    let (node, _backend, gate) = gated("slow", &[]);
    let mut waiting = node.connect();
    send(
        &mut waiting,
        json!({"op": "subscribe", "subject": "slow", "id": 1}),
    );
    // While that call is held at the backend, another connection of the
    // same (only) worker subscribes, publishes and receives.
    let mut other = node.connect();
    let reply = ask(&mut other, 1, json!({"op": "subscribe", "subject": "fast"}));
    assert_eq!(reply["op"], "subscribed", "{reply}");
    send(
        &mut other,
        json!({"op": "publish", "subject": "fast", "data": "x", "id": 2}),
    );
    // The publication and the publish's answer, in either order.
    let (a, b) = (recv(&mut other), recv(&mut other));
    let (answer, delivered) = if a["id"] == 2 { (a, b) } else { (b, a) };
    assert_eq!(answer["op"], "ok", "{answer}");
    assert_eq!(delivered["data"], "x", "{delivered}");
    assert_eq!(
        calls(&node, "subscribe", "allowed"),
        1,
        "only fast answered"
    );
    let (_, text) = node.http("GET", "/metrics", &[], "");
    assert!(
        text.contains("myriad_proxy_in_flight 1"),
        "the slow call is out"
    );
    // Then the slow one is answered, and its connection subscribed.
    gate.open();
    let reply = recv(&mut waiting);
    assert_eq!(reply["op"], "subscribed", "{reply}");
    assert_eq!(reply["subject"], "slow");
}

#[test]
fn a_closed_connection_gets_no_late_verdict_and_its_slot_successor_none() {
    let (node, _backend, gate) = gated("late", &[]);
    let mut gone = node.connect();
    send(
        &mut gone,
        json!({"op": "subscribe", "subject": "late", "id": 1}),
    );
    backend_saw(&node, 1);
    gone.close(None).unwrap();
    let _ = gone.flush();
    drop(gone);
    common::wait_until("the connection to close", || {
        node.stats()["connections"] == 0
    });
    // Likely in the freed slot: a new connection of the same worker.
    let mut next = node.connect();
    gate.open();
    common::wait_until("the late verdict to be counted", || {
        calls(&node, "subscribe", "allowed") == 1
    });
    // Nothing of the late verdict reached it: its first message is its own.
    send(&mut next, json!({"op": "ping", "id": 5}));
    let first = recv(&mut next);
    assert_eq!(first["op"], "pong", "{first}");
    // And the late subject has no subscriber: a publish reaches nobody.
    let published = node.publish("late", &json!(1));
    assert_eq!(published["delivered"], 0, "{published}");
}

#[test]
fn a_connections_parked_commands_run_in_the_order_it_sent_them() {
    let (node, _backend, gate) = gated("first", &[]);
    let mut ws = node.connect();
    // One call per subject, both parked at once.
    send(
        &mut ws,
        json!({"op": "subscribe", "subjects": ["first", "second"], "id": 1}),
    );
    // The second verdict is in before the first ...
    common::wait_until("the second verdict", || {
        calls(&node, "subscribe", "allowed") == 1
    });
    // ... but waits behind it: a ping, which changes nothing, overtakes both.
    send(&mut ws, json!({"op": "ping", "id": 3}));
    let pong = recv(&mut ws);
    assert_eq!(pong["op"], "pong", "{pong}");
    gate.open();
    for subject in ["first", "second"] {
        let reply = recv(&mut ws);
        assert_eq!(reply["op"], "subscribed", "{reply}");
        assert_eq!(reply["subject"], subject, "{reply}");
    }
}

#[test]
fn a_subscribe_after_a_parked_connect_runs_as_the_admitted_user() {
    let gate = Gate::default();
    let waits = gate.clone();
    let backend = ProxyBackend::start(SECRET.as_bytes(), move |_| {
        waits.wait();
        Reply::json(json!({"allow": true, "user": "7", "subscribe": ["mine.*"]}))
    });
    let node = connect_proxied(&backend);
    let mut ws = node.connect();
    send(&mut ws, json!({"op": "connect", "token": "seven", "id": 1}));
    // Sent at once, before the verdict: only user 7 may read it.
    send(
        &mut ws,
        json!({"op": "subscribe", "subject": "mine.1", "id": 2}),
    );
    backend_saw(&node, 1);
    // Held, not refused as anonymous: nothing is answered before the
    // verdict but the ping.
    send(&mut ws, json!({"op": "ping", "id": 3}));
    let pong = recv(&mut ws);
    assert_eq!(pong["op"], "pong", "{pong}");
    gate.open();
    let connected = recv(&mut ws);
    assert_eq!(
        (connected["op"].as_str(), connected["id"].as_u64()),
        (Some("ok"), Some(1)),
        "{connected}"
    );
    // The user's own feed comes with the connect; then the subscribe.
    let subscribed = loop {
        let message = recv(&mut ws);
        if message["subject"] != "@7" {
            break message;
        }
    };
    assert_eq!(subscribed["op"], "subscribed", "{subscribed}");
    assert_eq!(subscribed["id"], 2, "{subscribed}");
    node.publish("mine.1", &json!("for 7"));
    assert_eq!(recv(&mut ws)["data"], "for 7");
}

#[test]
fn a_publish_after_a_parked_subscribe_reaches_that_subscription() {
    let (node, _backend, gate) = gated("first", &[]);
    let mut ws = node.connect();
    send(
        &mut ws,
        json!({"op": "subscribe", "subject": "first", "id": 1}),
    );
    // Held behind `first`; asked about (and parked) when its turn comes,
    // ahead of the publish held after it.
    send(
        &mut ws,
        json!({"op": "subscribe", "subject": "room", "id": 2}),
    );
    // Not asked about (no publish proxy), yet it waits its turn.
    send(
        &mut ws,
        json!({"op": "publish", "subject": "room", "data": "mine", "id": 3}),
    );
    backend_saw(&node, 1);
    send(&mut ws, json!({"op": "ping", "id": 4}));
    let pong = recv(&mut ws);
    assert_eq!(pong["op"], "pong", "the publish waits: {pong}");
    gate.open();
    for (id, subject) in [(1, "first"), (2, "room")] {
        let subscribed = recv(&mut ws);
        assert_eq!(subscribed["op"], "subscribed", "{subscribed}");
        assert_eq!(
            (subscribed["id"].as_u64(), subscribed["subject"].as_str()),
            (Some(id), Some(subject))
        );
    }
    // The publish, run after the subscribe, reaches it: its answer and the
    // publication, in either order.
    let (a, b) = (recv(&mut ws), recv(&mut ws));
    let (answer, delivered) = if a["id"] == 3 { (a, b) } else { (b, a) };
    assert_eq!(answer["op"], "ok", "{answer}");
    assert_eq!(delivered["data"], "mine", "{delivered}");
}

#[test]
fn past_proxy_max_held_a_command_is_refused_with_too_many_held() {
    let (node, _backend, gate) = gated("slow", &["--proxy-max-held", "2"]);
    let mut ws = node.connect();
    send(
        &mut ws,
        json!({"op": "subscribe", "subject": "slow", "id": 1}),
    );
    backend_saw(&node, 1);
    for id in 2..=4 {
        send(
            &mut ws,
            json!({"op": "publish", "subject": "slow", "data": id, "id": id}),
        );
    }
    // The third held one is refused at once, before anything else.
    let refused = recv(&mut ws);
    assert_eq!(refused["id"], 4, "{refused}");
    assert_eq!(error_code(&refused), "too_many_held");
    assert_eq!(node.metric("myriad_proxy_held_total"), 2);
    assert_eq!(
        node.metric("myriad_errors_total{kind=\"too_many_held\"}"),
        1
    );
    gate.open();
    let subscribed = recv(&mut ws);
    assert_eq!(subscribed["op"], "subscribed", "{subscribed}");
    // The two held publishes ran after it: each answered, each delivered
    // to the subscription it follows.
    let mut answered = Vec::new();
    let mut delivered = Vec::new();
    while answered.len() < 2 || delivered.len() < 2 {
        let message = recv(&mut ws);
        if message["op"] == "ok" {
            answered.push(message["id"].as_u64().unwrap());
        } else {
            delivered.push(message["data"].as_u64().unwrap());
        }
    }
    answered.sort_unstable();
    assert_eq!((answered, delivered), (vec![2, 3], vec![2, 3]));
}

/// Waits until the node has `n` proxy calls out.
fn backend_saw(node: &Node, n: u64) {
    common::wait_until("the call to be out", || {
        let (_, text) = node.http("GET", "/metrics", &[], "");
        text.contains(&format!("myriad_proxy_in_flight {n}"))
    });
}

#[test]
fn past_proxy_max_in_flight_a_command_is_refused_with_proxy_busy() {
    let gate = Gate::default();
    let held = gate.clone();
    let backend = ProxyBackend::start(SECRET.as_bytes(), move |_| {
        held.wait();
        Reply::allow()
    });
    let node = node(&[
        "--proxy-subscribe-url",
        backend.url(),
        "--proxy-max-in-flight",
        "1",
    ]);
    let mut ws = node.connect();
    send(&mut ws, json!({"op": "subscribe", "subject": "a", "id": 1}));
    backend_saw(&node, 1);
    // Another connection: this one's next command would wait behind `a`.
    let mut other = node.connect();
    let busy = ask(&mut other, 2, json!({"op": "subscribe", "subject": "b"}));
    assert_eq!(error_code(&busy), "proxy_busy");
    assert_eq!(calls(&node, "subscribe", "busy"), 1);
    gate.open();
    let first = recv(&mut ws);
    assert_eq!(first["op"], "subscribed", "{first}");
    assert_eq!(first["subject"], "a");
}

#[test]
fn a_connect_acts_as_the_admitted_user_within_the_token_grammar() {
    let backend = ProxyBackend::start(SECRET.as_bytes(), |call| {
        match call["token"].as_str().unwrap_or_default() {
            // Fields beyond the documented ones grant nothing.
            "good" => Reply::json(json!({
                "allow": true, "user": "42", "subscribe": ["chat.*"], "publish": [],
                "admin": true, "history": ["*"]
            })),
            "bad-grant" => Reply::json(json!({"allow": true, "user": "42", "subscribe": ["a*b"]})),
            "bad-user" => Reply::json(json!({"allow": true, "user": "root", "subscribe": ["*"]})),
            _ => Reply::refuse("forbidden", "who are you"),
        }
    });
    let node = connect_proxied(&backend);
    let mut ws = node.connect();
    let refused = ask(&mut ws, 1, json!({"op": "connect", "token": "stranger"}));
    assert_eq!(error_code(&refused), "forbidden");
    for token in ["bad-grant", "bad-user"] {
        let failed = ask(&mut ws, 2, json!({"op": "connect", "token": token}));
        assert_eq!(error_code(&failed), "proxy_unavailable", "{token}");
    }
    assert_eq!(calls(&node, "connect", "error"), 2);
    let connected = ask(&mut ws, 3, json!({"op": "connect", "token": "good"}));
    assert_eq!(connected["op"], "ok", "{connected}");
    let call = backend.next_within(Duration::from_secs(10)).unwrap();
    assert!(call.verified);
    assert_eq!(call.body["kind"], "connect");

    let granted = ask(&mut ws, 4, json!({"op": "subscribe", "subject": "chat.1"}));
    assert_eq!(granted["op"], "subscribed", "{granted}");
    let other = ask(&mut ws, 5, json!({"op": "subscribe", "subject": "admin.1"}));
    assert_eq!(error_code(&other), "forbidden");
    let publish = ask(
        &mut ws,
        6,
        json!({"op": "publish", "subject": "chat.1", "data": 1}),
    );
    assert_eq!(error_code(&publish), "forbidden", "no publish granted");
    // Acting as user 42: a second connect is refused.
    let again = ask(&mut ws, 7, json!({"op": "connect", "token": "good"}));
    assert_eq!(error_code(&again), "already_connected");
}

#[test]
fn a_namespace_switches_its_proxy_off_and_url_opened_streams_are_refused_under_one() {
    let backend = ProxyBackend::start(SECRET.as_bytes(), |_| Reply::refuse("", "never"));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("myriad.toml");
    std::fs::write(
        &file,
        "[[namespace]]\nprefix = \"free.\"\nsubscribe_proxy = false\n",
    )
    .unwrap();
    let node = node(&[
        "--config",
        file.to_str().unwrap(),
        "--proxy-subscribe-url",
        backend.url(),
    ]);
    let mut ws = node.connect();
    let free = ask(&mut ws, 1, json!({"op": "subscribe", "subject": "free.1"}));
    assert_eq!(free["op"], "subscribed", "not asked: {free}");
    let asked = ask(&mut ws, 2, json!({"op": "subscribe", "subject": "paid.1"}));
    assert_eq!(error_code(&asked), "proxy_refused");
    assert_eq!(
        calls(&node, "subscribe", "refused"),
        1,
        "one call, for paid.1"
    );
    // An SSE stream cannot wait for a verdict: refused where one is asked,
    // served where none is.
    let (status, body) = common::http(node.ws, "GET", "/sse?subject=paid.1", &[], "");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("backend's proxy"), "{body}");
    let mut stream = std::net::TcpStream::connect(node.ws).unwrap();
    std::io::Write::write_all(
        &mut stream,
        b"GET /sse?subject=free.1 HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut head = [0u8; 12];
    std::io::Read::read_exact(&mut stream, &mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
}

#[test]
fn calls_one_after_another_share_a_kept_alive_connection() {
    let backend = ProxyBackend::start(SECRET.as_bytes(), |_| Reply::allow());
    let node = node(&["--proxy-subscribe-url", backend.url()]);
    let mut ws = node.connect();
    for id in 1..=20 {
        let reply = ask(
            &mut ws,
            id,
            json!({"op": "subscribe", "subject": format!("k.{id}")}),
        );
        assert_eq!(reply["op"], "subscribed", "{reply}");
    }
    assert_eq!(calls(&node, "subscribe", "allowed"), 20);
    // One at a time: one connection serves them all (two, should the
    // backend's side close one between calls).
    assert!(
        backend.connections() <= 2,
        "{} connections",
        backend.connections()
    );
}

#[test]
fn https_backends_are_trusted_through_backend_ca_file_for_proxies_and_hooks() {
    let backend = ProxyBackend::start_tls(SECRET.as_bytes(), |call| {
        if call["kind"] == "connect" {
            Reply::json(json!({"allow": true, "user": "7", "subscribe": ["mine.*"]}))
        } else {
            // A hook batch: its 2xx is all that counts.
            Reply::allow()
        }
    });
    assert!(backend.url().starts_with("https://"));
    let ca = backend.ca_file().to_str().unwrap();
    // Both hooks and the connect proxy at the TLS backend.
    fn tls_args<'a>(url: &'a str, ca: &'a str) -> Vec<&'a str> {
        vec![
            "--token-hmac-secret",
            "a-test-secret-of-at-least-32-bytes!",
            "--proxy-connect-url",
            url,
            "--hook-url",
            url,
            "--hook-events",
            "online",
            "--backend-ca-file",
            ca,
        ]
    }
    // Trusting the backend's certificate: the connect is judged over TLS,
    // and the user's online event delivered over TLS.
    let trusting = node(&tls_args(backend.url(), ca));
    let mut ws = trusting.connect();
    let connected = ask(&mut ws, 1, json!({"op": "connect", "token": "seven"}));
    assert_eq!(connected["op"], "ok", "{connected}");
    let call = backend.next_within(Duration::from_secs(10)).unwrap();
    assert!(call.verified, "signed over TLS too");
    assert_eq!(call.body["kind"], "connect");
    let batch = backend.next_within(Duration::from_secs(10)).unwrap();
    assert!(batch.verified);
    assert!(
        batch.body.to_string().contains("online"),
        "{:?}",
        batch.body
    );
    drop(ws);
    drop(trusting);
    // Trusting another authority (whatever the system's roots are, this
    // one is checked): no verdict, so proxy_fail = closed refuses.
    let other = tempfile::tempdir().unwrap();
    let stranger = other.path().join("other.pem");
    let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    std::fs::write(&stranger, certified.cert.pem()).unwrap();
    let doubting = node(&tls_args(backend.url(), stranger.to_str().unwrap()));
    let mut ws = doubting.connect();
    let refused = ask(&mut ws, 1, json!({"op": "connect", "token": "seven"}));
    assert_eq!(error_code(&refused), "proxy_unavailable");
    assert_eq!(calls(&doubting, "connect", "error"), 1);
}
