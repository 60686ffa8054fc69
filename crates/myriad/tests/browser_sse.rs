//! A browser's own `EventSource` against the real binary: when its stream
//! is cut, it reconnects by itself with `Last-Event-ID` and loses nothing
//! that was published meanwhile, on every subject of the stream.
//!
//! The page and the stream go through a small proxy in this test, which
//! serves the page (so the stream is same-origin) and can cut every
//! connection it carries and hold new ones back, so that publications land
//! while the browser is away.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::browser::Browser;
use common::Node;
use serde_json::{json, Value};

/// The page: one EventSource on two subjects, recording every message,
/// every open and every `subscribed` event.
const PAGE: &str = r#"<!doctype html><title>sse</title><script>
window.got = []; window.opens = 0; window.announced = [];
const source = new EventSource("/sse?subject=left&subject=right");
source.onopen = () => { window.opens += 1; };
source.onmessage = (e) => {
  const m = JSON.parse(e.data);
  window.got.push(m.subject + ":" + m.offset);
};
source.addEventListener("subscribed", (e) => {
  window.announced.push(JSON.parse(e.data));
});
</script>"#;

/// What the page has seen.
const SEEN: &str =
    "JSON.stringify({got: window.got, opens: window.opens, announced: window.announced})";

#[derive(Default)]
struct ProxyState {
    /// Both ends of every connection carried, to cut them.
    carried: Vec<TcpStream>,
    /// New connections wait while this is set.
    holding: bool,
    /// The head of every request forwarded, in order.
    requests: Vec<String>,
}

/// Serves the page and forwards everything else to the node.
struct Proxy {
    addr: SocketAddr,
    state: Arc<Mutex<ProxyState>>,
}

impl Proxy {
    fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(ProxyState::default()));
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let state = Arc::clone(&shared);
                std::thread::spawn(move || carry(client, upstream, &state));
            }
        });
        Proxy { addr, state }
    }

    /// Cuts every connection carried so far; holds new ones until `release`.
    fn cut_and_hold(&self) {
        let mut state = self.state.lock().unwrap();
        state.holding = true;
        for socket in state.carried.drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }

    fn release(&self) {
        self.state.lock().unwrap().holding = false;
    }

    fn requests(&self) -> Vec<String> {
        self.state.lock().unwrap().requests.clone()
    }
}

/// One client connection: the page, or the head forwarded and then both
/// directions copied until either side ends.
fn carry(client: TcpStream, upstream: SocketAddr, state: &Mutex<ProxyState>) {
    let mut reader = BufReader::new(client.try_clone().unwrap());
    let mut head = String::new();
    while !head.ends_with("\r\n\r\n") {
        if reader.read_line(&mut head).unwrap_or(0) == 0 {
            return;
        }
    }
    let mut client = client;
    if head.starts_with("GET /page ") {
        let _ = write!(
            client,
            "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{PAGE}",
            PAGE.len()
        );
        return;
    }
    while state.lock().unwrap().holding {
        std::thread::sleep(Duration::from_millis(20));
    }
    let Ok(mut server) = TcpStream::connect(upstream) else {
        return;
    };
    server.write_all(head.as_bytes()).unwrap();
    {
        let mut state = state.lock().unwrap();
        state.requests.push(head);
        state.carried.push(client.try_clone().unwrap());
        state.carried.push(server.try_clone().unwrap());
    }
    let mut server_reader = server.try_clone().unwrap();
    let mut client_writer = client.try_clone().unwrap();
    let down = std::thread::spawn(move || {
        let _ = std::io::copy(&mut server_reader, &mut client_writer);
        let _ = client_writer.shutdown(Shutdown::Both);
    });
    let _ = std::io::copy(&mut reader, &mut server);
    let _ = server.shutdown(Shutdown::Both);
    let _ = down.join();
}

/// Waits until the page has seen `count` messages; returns what it saw.
fn wait_for_messages(browser: &mut Browser, count: usize) -> Value {
    let seen = browser.wait_until(
        &format!("{count} messages"),
        SEEN,
        || {},
        |v| {
            let seen: Value = serde_json::from_str(v.as_str().unwrap()).unwrap();
            // Before the page has loaded, its fields are not there yet.
            seen["got"].as_array().is_some_and(|got| got.len() >= count)
        },
    );
    serde_json::from_str(seen.as_str().unwrap()).unwrap()
}

#[test]
fn eventsource_reconnects_with_last_event_id_and_loses_nothing() {
    let node = Node::start(&["--workers", "2", "--sse-retry-ms", "200"]);
    let proxy = Proxy::start(node.ws);
    let mut browser = Browser::open(&format!("http://{}/page", proxy.addr));
    browser.wait_until(
        "both subjects announced",
        SEEN,
        || {},
        |v| {
            let seen: Value = serde_json::from_str(v.as_str().unwrap()).unwrap();
            seen["announced"].as_array().is_some_and(|a| a.len() == 2)
        },
    );
    let publish = |from: u64, to: u64| {
        for i in from..=to {
            node.publish("left", &json!(i));
            node.publish("right", &json!(i));
        }
    };
    publish(1, 5);
    wait_for_messages(&mut browser, 10);

    // Cut the stream and publish while the browser cannot get back.
    proxy.cut_and_hold();
    publish(6, 10);
    proxy.release();
    let seen = wait_for_messages(&mut browser, 20);

    let got: Vec<&str> = seen["got"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    for subject in ["left", "right"] {
        let offsets: Vec<u64> = got
            .iter()
            .filter_map(|m| m.strip_prefix(&format!("{subject}:")))
            .map(|o| o.parse().unwrap())
            .collect();
        assert_eq!(offsets, (1..=10).collect::<Vec<_>>(), "{subject}: {got:?}");
    }
    assert_eq!(seen["opens"], 2, "one reconnection: {seen}");
    let requests = proxy.requests();
    let resumed = requests
        .iter()
        .filter(|r| r.starts_with("GET /sse"))
        .nth(1)
        .expect("the browser came back");
    assert!(
        resumed.to_ascii_lowercase().contains("last-event-id: "),
        "{resumed}"
    );
    // The second time, both subjects were recovered.
    let announced = seen["announced"].as_array().unwrap();
    assert_eq!(announced.len(), 4, "{announced:?}");
    assert!(
        announced[2..].iter().all(|a| a["recovered"] == true),
        "{announced:?}"
    );
}
