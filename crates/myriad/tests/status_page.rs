//! The live status page (`/status` on the admin listener) against the real
//! binary: in a real headless Chromium, driven over the DevTools protocol,
//! its figures follow clients as they connect and messages as they flow;
//! over plain HTTP, its event stream is capped, gives its place back when
//! its client leaves, and ends when the node shuts down.
//!
//! Chromium comes from `scripts/install-test-deps.sh`; without it the page
//! test fails, it does not skip.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{subscribe, Node, Ws};
use serde_json::{json, Value};
use tungstenite::Message;

/// How long anything here may take on a busy two-core box: generous, since
/// every wait ends as soon as what it waits for is seen.
const DEADLINE: Duration = Duration::from_secs(30);

/// The ids of the figures the test reads off the page.
const FIGURES: [&str; 12] = [
    "connections",
    "connections-websocket",
    "connections-sse",
    "connections-stream",
    "connections-poll",
    "subscriptions",
    "subjects",
    "deliveries-per-second",
    "rss",
    "rss-per-connection",
    "slow-consumer-closes",
    "chart-connections-max",
];

/// A headless Chromium with one page open, driven over the DevTools
/// protocol. Closed when dropped.
struct Browser {
    process: Launched,
    devtools: Ws,
    /// The DevTools session attached to our page.
    session: String,
    next_id: u64,
}

/// A scratch folder, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Chromium's process and its folder (profile and log). Dropping it, however
/// the test ends, kills Chromium with every process it started, then
/// removes the folder.
struct Launched {
    child: Child,
    dir: Scratch,
}

impl Drop for Launched {
    fn drop(&mut self) {
        let group = i32::try_from(self.child.id()).unwrap();
        // SAFETY: kill only sends a signal, here to the group Chromium led.
        unsafe { libc::kill(-group, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Browser {
    /// Starts Chromium and opens `url` in a new page.
    fn open(url: &str) -> Browser {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = Scratch(
            std::env::temp_dir().join(format!("myriad-status-page-{}-{nanos}", std::process::id())),
        );
        let profile = dir.0.join("profile");
        std::fs::create_dir_all(&profile).unwrap();
        let log = std::fs::File::create(dir.0.join("chromium.log")).unwrap();
        let spawned = Command::new("chromium")
            .args([
                "--headless=new",
                // Root in a container: Chromium's sandbox cannot start.
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-sync",
                "--disable-background-networking",
                // The page is never in front of anyone: keep its timers and
                // rendering at full speed anyway.
                "--disable-background-timer-throttling",
                "--disable-renderer-backgrounding",
                "--disable-backgrounding-occluded-windows",
                // Port 0: Chromium picks one and writes it to
                // DevToolsActivePort in the profile, so nothing can collide.
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            // Its own process group, so that dropping the browser can end
            // the renderers and helpers it starts as well.
            .process_group(0)
            .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(e) if e.kind() == ErrorKind::NotFound => panic!(
                "chromium is not on PATH: the status page test needs a real browser; \
                 run scripts/install-test-deps.sh (it installs Debian's chromium)"
            ),
            Err(e) => panic!("cannot start chromium: {e}"),
        };
        let process = Launched { child, dir };
        let mut browser = Browser {
            devtools: connect_devtools(&profile, &process.dir.0),
            process,
            session: String::new(),
            next_id: 0,
        };
        let target = browser.call("Target.createTarget", json!({"url": url}));
        let attached = browser.call(
            "Target.attachToTarget",
            json!({"targetId": target["targetId"], "flatten": true}),
        );
        browser.session = attached["sessionId"].as_str().unwrap().to_owned();
        browser
    }

    /// Sends a DevTools command (to our page's session once attached) and
    /// returns its result, skipping the events that arrive meanwhile.
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut command = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            command["sessionId"] = json!(self.session);
        }
        self.devtools
            .send(Message::text(command.to_string()))
            .unwrap();
        loop {
            let reply = match self.devtools.read().expect("a DevTools reply") {
                Message::Text(text) => serde_json::from_str::<Value>(text.as_str()).unwrap(),
                _ => continue,
            };
            if reply["id"] != id {
                continue;
            }
            assert!(reply.get("error").is_none(), "{method}: {reply}");
            return reply["result"].clone();
        }
    }

    /// The text of every element in [`FIGURES`] (absent: not on the page yet).
    fn figures(&mut self) -> Figures {
        let expression = format!(
            "JSON.stringify(Object.fromEntries({}.map(id => [id, document.getElementById(id)?.textContent])))",
            json!(FIGURES)
        );
        let result = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true}),
        );
        let text = result["result"]["value"]
            .as_str()
            .unwrap_or_else(|| panic!("evaluation failed: {result}"));
        Figures(serde_json::from_str(text).unwrap())
    }

    /// Reads the page until `ready` holds for its figures; fails, showing
    /// them, after [`DEADLINE`]. `between` runs before every read.
    fn wait_until(
        &mut self,
        what: &str,
        mut between: impl FnMut(),
        mut ready: impl FnMut(&Figures) -> bool,
    ) -> Figures {
        let deadline = Instant::now() + DEADLINE;
        loop {
            between();
            let figures = self.figures();
            if ready(&figures) {
                return figures;
            }
            assert!(
                Instant::now() < deadline,
                "the page never showed {what}: {:?}",
                figures.0
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Asked to close, Chromium ends and reaps its own helpers; dropping
        // `process` next kills whatever is left.
        let close = json!({"id": 0, "method": "Browser.close"}).to_string();
        if self.devtools.send(Message::text(close)).is_ok() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && matches!(self.process.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Waits for Chromium to write its DevTools port and connects to it.
fn connect_devtools(profile: &std::path::Path, dir: &std::path::Path) -> Ws {
    let deadline = Instant::now() + DEADLINE;
    let port_file = profile.join("DevToolsActivePort");
    loop {
        // Two lines, the port and the browser's WebSocket path, written
        // once DevTools listens; a partly written file is read again.
        if let Ok(text) = std::fs::read_to_string(&port_file) {
            if let Some((port, path)) = text.split_once('\n') {
                let url = format!("ws://127.0.0.1:{port}{}", path.trim());
                let (devtools, _) = tungstenite::connect(url).expect("connect to DevTools");
                common::set_timeout(&devtools, DEADLINE);
                return devtools;
            }
        }
        let log = || std::fs::read_to_string(dir.join("chromium.log")).unwrap_or_default();
        assert!(
            Instant::now() < deadline,
            "chromium never opened DevTools; its log:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
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

    let idle = browser.wait_until(
        "a first snapshot",
        || {},
        |f| f.number("connections").is_some(),
    );
    // Nothing connected yet: every count shows zero (memory and rates are
    // not counts; a rate may not be shown yet).
    let counts = FIGURES
        .iter()
        .filter(|id| !id.starts_with("rss") && !id.ends_with("-per-second"));
    for id in counts {
        assert_eq!(idle.number(id), Some(0.0), "{id}: {:?}", idle.0);
    }
    assert!(idle.text("rss").ends_with("MiB"), "{:?}", idle.0);
    assert_eq!(idle.text("rss-per-connection"), "–", "no connections yet");

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
    let live = browser.wait_until(
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
    assert_eq!(live.number("subjects"), Some(1.0));
    assert_eq!(live.number("slow-consumer-closes"), Some(0.0));
    assert_eq!(live.number("chart-connections-max"), Some(5.0));
    assert_ne!(live.text("rss-per-connection"), "–");
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
    assert!(snapshot["rss_bytes"].as_u64().unwrap() > 0, "{snapshot}");
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
