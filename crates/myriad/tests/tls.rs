//! TLS on the client listener against the real binary: wss through
//! tungstenite and https (Server-Sent Events, HTTP streaming, long-poll)
//! through reqwest, both on rustls, with certificates made at test time;
//! refusals (plain HTTP, TLS 1.2, no common ALPN protocol, a handshake that
//! never ends, a KeyUpdate) counted; clean closes both ways; bad certificate files at start; the
//! certificate reloaded on SIGHUP under open connections; the admin
//! listener over https.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::tls::{self, Pki};
use common::{next_event, recv, send, subscribe};
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tungstenite::Message;

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn wss_subscribes_publishes_and_receives() {
    let pki = Pki::new();
    let node = pki.start(&["--workers", "2"]);
    let config = tls::client_config(&[&pki.der]);
    let mut subscriber = tls::wss(&node, "/ws", &config);
    let mut publisher = tls::wss(&node, "/ws", &config);
    assert_eq!(
        tls::tls_of(&mut subscriber).conn.alpn_protocol(),
        Some(&b"http/1.1"[..])
    );
    subscribe(&mut subscriber, &["news"]);

    // From the HTTP API and from another wss client.
    node.publish("news", &json!("from the api"));
    send(
        &mut publisher,
        json!({"op": "publish", "subject": "news", "data": "from a client", "id": 7}),
    );
    assert_eq!(recv(&mut publisher)["op"], "ok");
    for expected in ["from the api", "from a client"] {
        let message = recv(&mut subscriber);
        assert_eq!(message["op"], "msg", "{message}");
        assert_eq!(message["data"], expected);
    }
    let stats = node.stats();
    assert_eq!(stats["tls_handshakes"], 2, "{stats:#}");
    assert_eq!(stats["connections"], 2);
}

#[test]
fn a_firehose_over_wss_arrives_whole_and_in_order() {
    // 6.4 MB in 8 KiB messages: many records per write, and writes the
    // socket takes only in part.
    let pki = Pki::new();
    let node = pki.start(&[]);
    let mut ws = tls::wss(&node, "/ws", &tls::client_config(&[&pki.der]));
    subscribe(&mut ws, &["firehose"]);
    let offsets = node.firehose("firehose", move || {
        let message = recv(&mut ws);
        assert_eq!(message["op"], "msg", "{message}");
        message["offset"].as_u64().unwrap()
    });
    assert_eq!(offsets, (1..=800).collect::<Vec<_>>());
}

/// A GET over https, answered 200 within 30 s.
async fn get(client: &reqwest::Client, node: &common::Node, path: &str) -> reqwest::Response {
    let request = client.get(tls::https_url(node, path)).send();
    let response = tokio::time::timeout(Duration::from_secs(30), request)
        .await
        .expect("an answer in time")
        .unwrap();
    assert_eq!(response.status(), 200);
    response
}

#[tokio::test]
async fn sse_streams_and_polls_work_over_https() {
    let pki = Pki::new();
    let node = pki.start(&["--poll-timeout", "1"]);
    let client = tls::https_client(&node, &pki.der);

    let response = get(&client, &node, "/sse?subject=s").await;
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut events = response.bytes_stream().eventsource();
    assert_eq!(next_event(&mut events).await.event, "subscribed");
    node.publish("s", &json!("over sse"));
    let event = next_event(&mut events).await;
    assert_eq!(event.event, "message");
    let data: Value = serde_json::from_str(&event.data).unwrap();
    assert_eq!(data["data"], "over sse");

    let response = get(&client, &node, "/stream?subject=t").await;
    let mut body = response.bytes_stream();
    let mut lines = Vec::new();
    let mut buffer = Vec::new();
    let mut published = false;
    while lines.len() < 2 {
        let chunk = tokio::time::timeout(WAIT, body.next())
            .await
            .expect("a chunk in time")
            .unwrap()
            .unwrap();
        buffer.extend_from_slice(&chunk);
        while let Some(end) = buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            if line.len() > 1 {
                lines.push(serde_json::from_slice::<Value>(&line).unwrap());
            }
        }
        if !lines.is_empty() && !published {
            node.publish("t", &json!("over a stream"));
            published = true;
        }
    }
    assert_eq!(lines[0]["op"], "subscribed");
    assert_eq!(lines[1]["data"], "over a stream");

    // Held for the poll timeout, then answered with the cursor.
    let response = get(&client, &node, "/poll?subject=u").await;
    let answer: Vec<Value> = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(answer.last().unwrap()["op"], "poll", "{answer:?}");
    assert!(node.stats()["tls_handshakes"].as_u64().unwrap() >= 3);
}

#[test]
fn plain_http_on_the_tls_port_is_told_to_use_tls_and_counted() {
    let pki = Pki::new();
    let node = pki.start(&[]);
    let mut stream = TcpStream::connect(node.ws).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    stream
        .write_all(b"GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 400 "), "{response}");
    assert!(response.contains("tls_required"), "{response}");

    // A plain WebSocket client gets the same.
    let refused = tungstenite::connect(format!("ws://{}/ws", node.ws));
    assert!(refused.is_err());
    let stats = node.wait_for_stats("both refusals", |s| s["connections"] == 0);
    assert_eq!(stats["errors"]["tls_plain_http"], 2, "{stats:#}");
    assert_eq!(stats["closes"]["handshake_rejected"], 2, "{stats:#}");
}

#[test]
fn failed_and_unfinished_handshakes_are_dropped_and_counted() {
    let pki = Pki::new();
    let node = pki.start(&["--handshake-timeout", "1"]);

    // TLS 1.2 only: refused (the node speaks TLS 1.3 only).
    let tls12 = tls::client_config_for(&[&pki.der], &[&rustls::version::TLS12]);
    assert!(tls::try_wss(&node, "/ws", &tls12).is_err());
    // A client that does not trust the certificate gives up itself.
    let stranger = Pki::new();
    assert!(tls::try_wss(&node, "/ws", &tls::client_config(&[&stranger.der])).is_err());
    let stats = node.wait_for_stats("the refused handshakes end", |s| s["connections"] == 0);
    // The second is the client's own alert, ending the handshake.
    assert_eq!(stats["errors"]["tls_handshake_failed"], 2, "{stats:#}");

    // Half a ClientHello, then nothing: cut at the handshake timeout.
    let mut stalled = TcpStream::connect(node.ws).unwrap();
    stalled.set_read_timeout(Some(WAIT)).unwrap();
    stalled.write_all(&[22, 3, 1, 0, 200, 1, 0]).unwrap();
    let started = Instant::now();
    let mut rest = Vec::new();
    // EOF (or a reset): the node dropped it.
    let _ = stalled.read_to_end(&mut rest);
    assert!(started.elapsed() < WAIT, "dropped in time");
    assert!(
        rest.is_empty(),
        "no answer to an unfinished handshake: {rest:?}"
    );
    let stats = node.wait_for_stats("the stalled handshake is counted", |s| {
        s["errors"]["tls_handshake_timeout"] == 1
    });
    assert_eq!(stats["closes"]["handshake_timeout"], 1, "{stats:#}");

    // Half a ClientHello, then gone: a failed handshake too.
    let mut leaving = TcpStream::connect(node.ws).unwrap();
    leaving.write_all(&[22, 3, 1, 0, 200, 1, 0]).unwrap();
    drop(leaving);
    // The refusal is counted a moment before the connection is: wait for both.
    let stats = node.wait_for_stats("the abandoned handshake is counted and gone", |s| {
        s["errors"]["tls_handshake_failed"] == 3 && s["connections"] == 0
    });
    assert_eq!(stats["tls_handshakes"], 0, "{stats:#}");
}

/// A client offering no protocol the node speaks over ALPN is told so with
/// the `no_application_protocol` alert (RFC 8446 §4.2; RFC 7301 §3.2),
/// which rustls finds only after its ServerHello, and counted.
#[test]
fn a_client_offering_only_other_alpn_protocols_gets_the_alert() {
    let pki = Pki::new();
    let node = pki.start(&[]);
    let mut only_h2 = (*tls::client_config(&[&pki.der])).clone();
    only_h2.alpn_protocols = vec![b"h2".to_vec()];
    let name = "localhost".try_into().unwrap();
    let mut client = rustls::ClientConnection::new(std::sync::Arc::new(only_h2), name).unwrap();
    let mut socket = TcpStream::connect(node.ws).unwrap();
    socket.set_read_timeout(Some(WAIT)).unwrap();
    let refused = loop {
        match client.complete_io(&mut socket) {
            Ok((0, 0)) => panic!("the node closed without an alert"),
            Ok(_) => assert!(client.is_handshaking(), "the handshake went through"),
            Err(e) => break e,
        }
    };
    let seen = format!("{refused:?}");
    let refused = refused
        .into_inner()
        .and_then(|e| e.downcast::<rustls::Error>().ok())
        .map(|e| *e);
    assert_eq!(
        refused,
        Some(rustls::Error::AlertReceived(
            rustls::AlertDescription::NoApplicationProtocol
        )),
        "{seen}"
    );
    let stats = node.wait_for_stats("the refusal is counted", |s| s["connections"] == 0);
    assert_eq!(stats["errors"]["tls_handshake_failed"], 1, "{stats:#}");
}

#[test]
fn a_key_update_closes_the_connection_and_is_counted() {
    let pki = Pki::new();
    let node = pki.start(&[]);
    let config = tls::client_config(&[&pki.der]);
    let mut ws = tls::wss(&node, "/ws", &config);
    subscribe(&mut ws, &["k"]);
    let stream = tls::tls_of(&mut ws);
    stream.conn.refresh_traffic_keys().unwrap();
    stream.flush().unwrap();
    // The node answers with close_notify: a clean end of the stream.
    let mut rest = Vec::new();
    let read = stream.read_to_end(&mut rest);
    assert!(read.is_ok(), "{read:?}");
    let stats = node.wait_for_stats("the connection ends", |s| s["connections"] == 0);
    assert_eq!(stats["errors"]["tls_key_update"], 1, "{stats:#}");
    assert_eq!(stats["subscriptions"], 0);
}

#[test]
fn closes_are_clean_both_ways() {
    let pki = Pki::new();
    let mut node = pki.start(&[]);
    let config = tls::client_config(&[&pki.der]);

    // The client's close_notify ends its connection.
    let mut leaving = tls::wss(&node, "/ws", &config);
    subscribe(&mut leaving, &["c"]);
    let stream = tls::tls_of(&mut leaving);
    stream.conn.send_close_notify();
    stream.flush().unwrap();
    node.wait_for_stats("the client's close_notify ends it", |s| {
        s["connections"] == 0 && s["subscriptions"] == 0
    });

    // The node's close (shutdown: 1001) is followed by close_notify, so the
    // client's TLS sees a clean end rather than a truncated stream.
    let mut staying = tls::wss(&node, "/ws", &config);
    subscribe(&mut staying, &["c"]);
    node.terminate();
    assert_eq!(common::recv_close(&mut staying), 1001);
    let mut rest = Vec::new();
    let read = tls::tls_of(&mut staying).read_to_end(&mut rest);
    assert!(read.is_ok(), "close_notify before EOF: {read:?}");
    node.wait_for_exit();
}

#[test]
fn bad_certificate_files_stop_the_node_at_start() {
    let pki = Pki::new();
    std::fs::write(pki.path("garbage.pem"), "not a certificate").unwrap();
    let other = Pki::new();
    let flags = |cert: &std::path::Path, key: Option<&std::path::Path>| {
        let mut flags = vec!["--tls-cert".to_owned(), cert.display().to_string()];
        if let Some(key) = key {
            flags.extend(["--tls-key".to_owned(), key.display().to_string()]);
        }
        flags
    };
    let cases = [
        (
            "a missing file",
            flags(&pki.path("missing.pem"), Some(&pki.key)),
            "missing.pem",
        ),
        (
            "a file with no certificate",
            flags(&pki.path("garbage.pem"), Some(&pki.key)),
            "holds no certificate",
        ),
        (
            "a key that is not the certificate's",
            flags(&pki.cert, Some(&other.key)),
            "key.pem",
        ),
        (
            "a certificate without its key",
            flags(&pki.cert, None),
            "tls_key",
        ),
    ];
    for (what, flags, named) in cases {
        let output = common::serve_command()
            .args(&flags)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!output.status.success(), "{what}: started");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(named), "{what}: {stderr}");
        assert!(output.stdout.is_empty(), "{what}: no ready line");
    }
}

/// A received text message, skipping control frames.
fn text(ws: &mut common::Ws) -> String {
    loop {
        match ws.read().unwrap() {
            Message::Text(text) => return text.to_string(),
            _ => continue,
        }
    }
}

#[test]
fn the_echo_endpoint_answers_large_messages_over_wss() {
    let pki = Pki::new();
    let node = pki.start(&["--echo-path", "/echo"]);
    let mut ws = tls::wss(&node, "/echo", &tls::client_config(&[&pki.der]));
    for size in [1, 16_383, 16_384, 16_385, 60_000] {
        let message = "e".repeat(size);
        ws.send(Message::text(message.clone())).unwrap();
        assert_eq!(text(&mut ws), message, "{size} bytes");
    }
}

#[test]
fn sighup_reloads_the_certificate_without_dropping_connections() {
    let mut pki = Pki::new();
    let node = pki.start(&["--workers", "2"]);
    let old = pki.der.clone();
    let mut before = tls::wss(&node, "/ws", &tls::client_config(&[&old]));
    assert_eq!(tls::peer_certificate(&mut before), old);
    subscribe(&mut before, &["r"]);

    let new = pki.renew();
    node.hang_up();
    node.wait_for_stats("the reload", |s| s["tls_reloads"] == 1);
    // The connection opened before goes on with its keys, both ways.
    node.publish("r", &json!("after the reload"));
    assert_eq!(recv(&mut before)["data"], "after the reload");
    send(
        &mut before,
        json!({"op": "publish", "subject": "r", "data": "from before", "id": 1}),
    );
    // Its answer and its own publication, in either order.
    let mut ops = [recv(&mut before), recv(&mut before)].map(|m| m["op"].to_string());
    ops.sort();
    assert_eq!(ops, ["\"msg\"", "\"ok\""]);
    // A new one gets the new certificate; a client trusting only the old
    // one is refused.
    let both = tls::client_config(&[&old, &new]);
    let mut after = tls::wss(&node, "/ws", &both);
    assert_eq!(tls::peer_certificate(&mut after), new);
    subscribe(&mut after, &["r"]);
    assert!(tls::try_wss(&node, "/ws", &tls::client_config(&[&old])).is_err());

    // Files that do not work are refused; the last good certificate stays.
    std::fs::write(&pki.key, "not a key").unwrap();
    node.hang_up();
    let stats = node.wait_for_stats("the failed reload", |s| {
        s["errors"]["tls_reload_failed"] == 1
    });
    assert_eq!(stats["tls_reloads"], 1, "{stats:#}");
    let mut later = tls::wss(&node, "/ws", &both);
    assert_eq!(tls::peer_certificate(&mut later), new);
    subscribe(&mut later, &["r"]);
    node.publish("r", &json!("still here"));
    for ws in [&mut before, &mut after, &mut later] {
        loop {
            let message = recv(ws);
            if message["data"] == "still here" {
                break;
            }
        }
    }
    assert_eq!(node.stats()["connections"], 3);
}

/// `GET /stats` over https on the admin listener, as JSON.
async fn admin_stats(
    node: &common::Node,
    trusted: &[&rustls::pki_types::CertificateDer<'static>],
) -> Value {
    let url = format!("https://localhost:{}/stats", node.admin.port());
    let response = tls::https_client_for(node.admin, trusted)
        .get(url)
        .send()
        .await
        .expect("stats over https");
    assert_eq!(response.status(), 200);
    serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
}

#[tokio::test]
async fn the_admin_listener_speaks_https_and_reloads_with_the_client_port() {
    let mut pki = Pki::new();
    let node = pki.start(&["--admin-tls"]);
    let old = pki.der.clone();
    let stats = admin_stats(&node, &[&old]).await;
    assert_eq!(stats["connections"], 0);
    let body = json!({"subject": "a", "data": 1}).to_string();
    let published = tls::https_client_for(node.admin, &[&old])
        .post(format!(
            "https://localhost:{}/api/publish",
            node.admin.port()
        ))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(published.status(), 200);

    // Plain HTTP gets no answer: the admin port speaks TLS only.
    let mut plain = TcpStream::connect(node.admin).unwrap();
    plain.set_read_timeout(Some(WAIT)).unwrap();
    plain
        .write_all(b"GET /stats HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(!answer.starts_with(b"HTTP/"), "{answer:?}");

    let new = pki.renew();
    node.hang_up();
    let deadline = Instant::now() + WAIT;
    loop {
        let stats = admin_stats(&node, &[&old, &new]).await;
        if stats["tls_reloads"] == 1 {
            assert_eq!(
                stats["errors"]["tls_handshake_failed"], 1,
                "the plain request"
            );
            break;
        }
        assert!(Instant::now() < deadline, "no reload: {stats:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // New connections get the new certificate, on both listeners.
    admin_stats(&node, &[&new]).await;
    let url = format!("https://localhost:{}/stats", node.admin.port());
    let refused = tls::https_client_for(node.admin, &[&old])
        .get(url)
        .send()
        .await;
    assert!(refused.is_err(), "the old certificate is gone");
    let mut ws = tls::wss(&node, "/ws", &tls::client_config(&[&new]));
    assert_eq!(tls::peer_certificate(&mut ws), new);
}
