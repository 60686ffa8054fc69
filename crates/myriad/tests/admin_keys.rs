//! The admin listener's keys against the real binary: the publish key opens
//! the message API only, the admin key everything, `/healthz` needs none;
//! refusals are 401 or 403 with the API's error body and are counted; and a
//! node whose admin listener would be reachable beyond loopback without a
//! key does not start.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use base64::Engine as _;
use common::{get_head, recv, refused_start, subscribe, Node};
use serde_json::{json, Value};

const ADMIN: &str = "adm-key";
const PUBLISH: &str = "pub-key";

/// `(status, error code)` of a refused request, with its error body checked.
fn refusal(status: u16, body: &str) -> (u16, String) {
    let body: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{body:?}: {e}"));
    let code = body["error"]["code"].as_str().unwrap().to_owned();
    assert!(body["error"]["message"].is_string(), "{body}");
    (status, code)
}

/// The status line and headers of a `GET path` with `headers`, read from a
/// fresh connection (the body may never end: `/status/events`).
fn head(node: &Node, path: &str, headers: &[(&str, &str)]) -> String {
    let mut stream = TcpStream::connect(node.admin).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(get_head(path, headers).as_bytes())
        .unwrap();
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" {
            return head;
        }
        head.push_str(&line);
    }
}

#[test]
fn each_key_opens_its_endpoints_and_every_refusal_is_counted() {
    let node = Node::start(&[
        "--workers",
        "1",
        "--admin-key",
        ADMIN,
        "--publish-key",
        PUBLISH,
    ]);
    let mut sub = node.connect();
    subscribe(&mut sub, &["k"]);
    let publish = json!({"subject": "k", "data": "hello"}).to_string();
    let (unauthorized, forbidden) = (
        (401, "unauthorized".to_owned()),
        (403, "forbidden".to_owned()),
    );

    // The message API: either key, in any of its forms.
    for headers in [
        vec![("X-Api-Key", PUBLISH)],
        vec![("Authorization", &*format!("Bearer {PUBLISH}"))],
        vec![("X-Api-Key", ADMIN)],
    ] {
        let (status, reply) = node.http("POST", "/api/publish", &headers, &publish);
        assert_eq!(status, 200, "{headers:?}: {reply}");
        assert_eq!(recv(&mut sub)["data"], "hello");
    }
    let (status, reply) = node.http(
        "GET",
        "/api/history?subject=k",
        &[("X-Api-Key", PUBLISH)],
        "",
    );
    assert_eq!(status, 200, "{reply}");
    let mut refused = 0;
    for headers in [vec![], vec![("X-Api-Key", "wrong")]] {
        let (status, reply) = node.http("POST", "/api/publish", &headers, &publish);
        assert_eq!(refusal(status, &reply), unauthorized, "{headers:?}");
        refused += 1;
    }

    // Admin endpoints: the admin key only; the publish key is forbidden.
    let edges = json!({"edges": [[1, 2]]}).to_string();
    for (method, path, body) in [
        ("GET", "/stats", ""),
        ("GET", "/metrics", ""),
        ("GET", "/status", ""),
        ("GET", "/api/followers?user=2", ""),
        ("POST", "/api/follow", &*edges),
    ] {
        let (status, reply) = node.http(method, path, &[("X-Api-Key", PUBLISH)], body);
        assert_eq!(refusal(status, &reply), forbidden, "{path}");
        let (status, reply) = node.http(method, path, &[], body);
        assert_eq!(refusal(status, &reply), unauthorized, "{path}");
        refused += 1;
    }
    let (status, reply) = node.http("POST", "/api/follow", &[("X-Api-Key", ADMIN)], &edges);
    assert_eq!((status, &*reply), (200, r#"{"added":1}"#));
    let (status, _) = node.http("GET", "/metrics", &[("X-Api-Key", ADMIN)], "");
    assert_eq!(status, 200);

    // What a browser sends for the status page and its event stream once
    // asked: the admin key as a Basic password.
    let challenge = head(&node, "/status", &[]);
    assert!(challenge.starts_with("HTTP/1.1 401"), "{challenge}");
    assert!(
        challenge
            .to_ascii_lowercase()
            .contains("www-authenticate: basic realm="),
        "{challenge}"
    );
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("admin:{ADMIN}"));
    let basic = format!("Basic {basic}");
    let events = head(&node, "/status/events", &[("Authorization", &basic)]);
    assert!(events.starts_with("HTTP/1.1 200"), "{events}");
    assert!(events.contains("text/event-stream"), "{events}");
    refused += 1;

    // No key at all for the health probe.
    assert_eq!(node.http("GET", "/healthz", &[], "").0, 200);

    let stats = node.stats();
    assert_eq!(stats["errors"]["api_unauthorized"], refused, "{stats:#}");
    assert_eq!(stats["errors"]["api_forbidden"], 5, "{stats:#}");
}

#[test]
fn the_admin_key_alone_guards_the_message_api_too() {
    let node = Node::start(&["--workers", "1", "--admin-key", ADMIN]);
    let body = json!({"subject": "k", "data": 1}).to_string();
    let (status, reply) = node.http("POST", "/api/publish", &[("X-Api-Key", PUBLISH)], &body);
    assert_eq!(refusal(status, &reply), (401, "unauthorized".to_owned()));
    let (status, reply) = node.http("POST", "/api/publish", &[("X-Api-Key", ADMIN)], &body);
    assert_eq!(status, 200, "{reply}");
    assert_eq!(node.stats()["errors"]["api_unauthorized"], 1);
}

#[test]
fn an_admin_listener_beyond_loopback_needs_the_admin_key() {
    // 192.0.2.1 (TEST-NET-1) is not this host's: were the check missing,
    // binding it would fail too, but without naming the key.
    let (code, stderr) = refused_start(&["--admin-listen", "192.0.2.1:0"], &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("beyond this host: set admin_key"),
        "{stderr}"
    );
    let with_publish_key_only = ["--admin-listen", "192.0.2.1:0", "--publish-key", PUBLISH];
    let (code, stderr) = refused_start(&with_publish_key_only, &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("publish_key needs admin_key"), "{stderr}");
}

#[test]
fn the_retired_single_key_is_refused_not_ignored() {
    let loopback = ["--admin-listen", "127.0.0.1:0"];
    let (code, stderr) = refused_start(&loopback, &[("MYRIAD_API_KEY", "old")]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("MYRIAD_ADMIN_KEY"), "{stderr}");
    let (code, stderr) = refused_start(&["--admin-listen", "127.0.0.1:0", "--api-key", "old"], &[]);
    assert_eq!(code, 2, "{stderr}");
}
