//! The live status page (`/status` on the admin listener) against the real
//! binary: in a real headless Chromium, driven over the DevTools protocol,
//! its figures follow clients as they connect and messages as they flow;
//! over plain HTTP, its event stream is capped, gives its place back when
//! its client leaves, and ends when the node shuts down.
//!
//! The browser is the harness's (`common/browser.rs`).

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::browser::{Browser, DEADLINE};
use common::{subscribe, Node};
use serde_json::{json, Value};

/// The ids of the figures the test reads off the page.
const FIGURES: [&str; 17] = [
    "connections",
    "connections-websocket",
    "connections-websocket_deflate",
    "connections-websocket_inflate_only",
    "connections-sse",
    "connections-stream",
    "connections-poll",
    "connections-cmd",
    "subscriptions",
    "subjects",
    "deliveries-per-second",
    "rss",
    "history-bytes",
    "history-max-bytes",
    "memory-per-connection",
    "slow-consumer-closes",
    "chart-connections-max",
];

/// The text of every element in [`FIGURES`] (absent: not on the page yet).
const FIGURES_SCRIPT: &str = "JSON.stringify(Object.fromEntries(FIGURES.map(id => [id, document.getElementById(id)?.textContent])))";

fn figures_expression() -> String {
    FIGURES_SCRIPT.replace("FIGURES", &json!(FIGURES).to_string())
}

fn figures_of(value: &Value) -> Figures {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("figures are a JSON string: {value}"));
    Figures(serde_json::from_str(text).unwrap())
}

/// Reads the page until `ready` holds for its figures; `between` runs
/// before every read.
fn wait_for_figures(
    browser: &mut Browser,
    what: &str,
    between: impl FnMut(),
    mut ready: impl FnMut(&Figures) -> bool,
) -> Figures {
    let value = browser.wait_until(what, &figures_expression(), between, |v| {
        ready(&figures_of(v))
    });
    figures_of(&value)
}

/// The page's figures by element id, as shown.
struct Figures(HashMap<String, Option<String>>);

impl Figures {
    /// The figure as a number; `None` while the page shows none ("–").
    fn number(&self, id: &str) -> Option<f64> {
        let text = self.0.get(id).cloned().flatten()?;
        text.replace(',', "").parse().ok()
    }

    fn text(&self, id: &str) -> &str {
        self.0.get(id).and_then(Option::as_deref).unwrap_or("")
    }
}

#[test]
fn the_page_follows_connections_and_deliveries_live() {
    let node = Node::start(&["--workers", "2"]);
    let mut browser = Browser::open(&format!("http://{}/status", node.admin));

    let idle = wait_for_figures(
        &mut browser,
        "a first snapshot",
        || {},
        |f| f.number("connections").is_some(),
    );
    // Nothing connected yet: every count shows zero (memory and rates are
    // not counts; a rate may not be shown yet).
    let counts = FIGURES.iter().filter(|id| {
        !["rss", "history", "memory"]
            .iter()
            .any(|m| id.starts_with(m))
            && !id.ends_with("-per-second")
    });
    for id in counts {
        assert_eq!(idle.number(id), Some(0.0), "{id}: {:?}", idle.0);
    }
    assert!(idle.text("rss").ends_with("MiB"), "{:?}", idle.0);
    assert_eq!(
        idle.text("memory-per-connection"),
        "–",
        "no connections yet"
    );
    assert_eq!(
        idle.text("history-max-bytes"),
        "256.0 MiB",
        "the default budget"
    );

    let mut websockets: Vec<_> = (0..3).map(|_| node.connect()).collect();
    for ws in &mut websockets {
        subscribe(ws, &["x"]);
    }
    let _sse: Vec<_> = (0..2)
        .map(|_| node.open_raw("/sse?subject=x", None))
        .collect();

    // Publish while reading the page: deliveries/s must show above zero at
    // some read, and the counts must reach what was opened.
    let mut published = 0;
    let mut delivering = false;
    let live = wait_for_figures(
        &mut browser,
        "3 WebSocket and 2 SSE subscribers, and deliveries",
        || {
            published += 1;
            node.publish("x", &json!(published));
        },
        |f| {
            delivering |= f.number("deliveries-per-second").is_some_and(|n| n > 0.0);
            delivering
                && f.number("connections") == Some(5.0)
                && f.number("connections-websocket") == Some(3.0)
                && f.number("connections-sse") == Some(2.0)
                && f.number("subscriptions") == Some(5.0)
        },
    );
    assert_eq!(live.number("connections-stream"), Some(0.0));
    assert_eq!(live.number("connections-poll"), Some(0.0));
    assert_eq!(live.number("connections-cmd"), Some(0.0));
    assert_eq!(live.number("subjects"), Some(1.0));
    assert_eq!(live.number("slow-consumer-closes"), Some(0.0));
    assert_eq!(live.number("chart-connections-max"), Some(5.0));
    assert_ne!(live.text("memory-per-connection"), "–");
}

/// Opens `GET /status/events` on the admin listener: the stream, positioned
/// after its head, or the refusal's status and body.
fn open_events(admin: SocketAddr) -> Result<BufReader<TcpStream>, (u16, String)> {
    let mut stream = TcpStream::connect(admin).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    write!(stream, "GET /status/events HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    while !head.ends_with("\r\n\r\n") {
        assert!(reader.read_line(&mut head).unwrap() > 0, "{head:?}");
    }
    let status = head[9..12].parse().unwrap();
    if status != 200 {
        let mut body = String::new();
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        reader.take(length).read_to_string(&mut body).unwrap();
        return Err((status, body));
    }
    assert!(
        head.contains("content-type: text/event-stream\r\n"),
        "{head}"
    );
    Ok(reader)
}

/// Reads lines until one contains `needle`; returns that line.
fn line_with(reader: &mut BufReader<TcpStream>, needle: &str) -> String {
    loop {
        let mut line = String::new();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "ended before {needle:?}"
        );
        if line.contains(needle) {
            return line;
        }
    }
}

#[test]
fn status_streams_are_capped_and_end_with_their_client_or_the_node() {
    // Long close and shutdown timeouts: the node drains for as long as the
    // WebSocket client below leaves its close frame unanswered.
    let mut node = Node::start(&[
        "--workers",
        "1",
        "--max-status-streams",
        "1",
        "--close-timeout",
        "60",
        "--shutdown-timeout",
        "60",
    ]);
    let (status, page) = node.http("GET", "/status", &[], "");
    assert_eq!(status, 200);
    assert!(page.contains("new EventSource(\"status/events\")"));
    assert!(
        !page.contains(" src=") && !page.contains(" href="),
        "the page loads nothing else"
    );

    let mut first = open_events(node.admin).expect("the first stream is admitted");
    let event = line_with(&mut first, "data: ");
    let snapshot: Value =
        serde_json::from_str(event.trim_end().strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(snapshot["transports"]["websocket"], 0, "{snapshot}");
    assert!(
        snapshot["memory"]["rss_bytes"].as_u64().unwrap() > 0,
        "{snapshot}"
    );
    let event = line_with(&mut first, "data: ");
    assert!(event.contains("\"deliveries_per_second\":"), "{event}");

    let (status, body) = open_events(node.admin).expect_err("over max_status_streams");
    assert_eq!(status, 503);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "too_many_status_streams", "{body}");
    assert_eq!(node.stats()["errors"]["too_many_status_streams"], 1);

    // The client leaves: the node notices at a following snapshot and its
    // place is free again.
    drop(first);
    let deadline = Instant::now() + DEADLINE;
    let mut second = loop {
        match open_events(node.admin) {
            Ok(stream) => break stream,
            Err((503, _)) => assert!(Instant::now() < deadline, "the place never came back"),
            Err(other) => panic!("{other:?}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    };

    // Shutdown: while the node drains (it waits for this client's close
    // answer), the stream says so and ends.
    let draining = node.connect();
    node.terminate();
    line_with(&mut second, "event: shutdown");
    // The rest of its chunk, then the last chunk: the reply is over (the
    // connection itself may be kept alive).
    let rest: Vec<String> = (0..5)
        .map(|_| {
            let mut line = String::new();
            second.read_line(&mut line).unwrap();
            line
        })
        .collect();
    assert_eq!(rest, ["data: {}\n", "\n", "\r\n", "0\r\n", "\r\n"]);
    drop(draining);
    node.wait_for_exit();
}
