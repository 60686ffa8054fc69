//! `myriad sub` survives a blip: with a proxy between it and the node that
//! cuts every connection on command, it reconnects, resumes with `since`,
//! and prints every publication exactly once, in order, across the cuts.
//! Given several nodes that are not one cluster, it says so when the next
//! cannot recover its position and goes on live there; with every node
//! gone it gives up after its tries. (Failing over within a cluster, with
//! nothing lost: tests/cluster_failover.rs.)

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Node, SubProcess};
use serde_json::{json, Value};

/// A TCP proxy to `upstream` whose live connections can all be cut at once.
struct Proxy {
    addr: SocketAddr,
    live: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let live: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let tracked = Arc::clone(&live);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                let mut list = tracked.lock().unwrap();
                list.push(client.try_clone().unwrap());
                list.push(server.try_clone().unwrap());
                drop(list);
                pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(server, client);
            }
        });
        Proxy { addr, live }
    }

    /// Cuts every proxied connection (both ends), as a network blip would.
    fn cut(&self) {
        for stream in self.live.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// Waits until a client has connected through the proxy again.
    fn wait_for_a_connection(&self) {
        for _ in 0..1_000 {
            if !self.live.lock().unwrap().is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("nobody reconnected within 10 s");
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
    });
}

#[test]
fn myriad_sub_resumes_after_cuts_and_loses_nothing() {
    const MESSAGES: u64 = 300;
    let node = Node::start(&["--workers", "1"]);
    let proxy = Proxy::start(node.ws);
    let mut sub = Command::new(env!("CARGO_BIN_EXE_myriad"))
        .args(["sub", "blip", "--count", &MESSAGES.to_string()])
        .args(["--url", &format!("ws://{}/ws", proxy.addr)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(sub.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    assert!(line.starts_with("subscribed to blip"), "{line}");
    // Its notes, line by line: each cut waits for the resume it causes, so
    // that a slow reconnect is not cut again before it has resumed.
    let (notes_tx, notes) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in stderr.lines() {
            if notes_tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    for n in 1..=MESSAGES {
        node.publish("blip", &json!(n));
        if n % 60 == 0 && n < MESSAGES {
            proxy.cut();
            proxy.wait_for_a_connection();
            loop {
                let note = notes
                    .recv_timeout(Duration::from_secs(10))
                    .unwrap_or_else(|_| panic!("no resume after cut {}: {seen:?}", n / 60));
                let resumed = note.contains("resumed blip");
                seen.push(note);
                if resumed {
                    break;
                }
            }
        }
    }
    let stdout = BufReader::new(sub.stdout.take().unwrap());
    let offsets: Vec<u64> = stdout
        .lines()
        .map(|l| {
            let msg: Value = serde_json::from_str(&l.unwrap()).unwrap();
            assert_eq!(msg["data"], msg["offset"], "{msg}");
            msg["offset"].as_u64().unwrap()
        })
        .collect();
    assert!(sub.wait().unwrap().success());
    assert_eq!(offsets, (1..=MESSAGES).collect::<Vec<u64>>());
    seen.extend(notes.iter());
    let resumed = seen
        .iter()
        .filter(|n| n.contains("resumed blip: nothing lost"))
        .count();
    assert_eq!(resumed, 4, "four cuts, each resumed: {seen:?}");
    assert!(
        !seen.iter().any(|n| n.contains("could NOT recover")),
        "{seen:?}"
    );
}

#[test]
fn myriad_sub_says_what_it_could_not_recover_goes_on_live_and_gives_up_after_its_tries() {
    // Two nodes of their own: one's positions mean nothing to the other.
    let mut a = Node::start(&["--workers", "1"]);
    let mut b = Node::start(&["--workers", "1"]);
    let (url_a, url_b) = (a.url("/ws"), b.url("/ws"));
    let sub = SubProcess::spawn(&["news", "--url", &url_a, "--url", &url_b, "--attempts", "3"]);
    assert_eq!(sub.next_note(), "subscribed to news at offset 0");
    for n in 1..=3 {
        a.publish("news", &json!(n));
        assert_eq!(sub.next_delivery()["offset"], n);
    }
    a.kill_9();
    let lost = sub.next_note();
    assert!(
        lost.starts_with(&format!("{url_a}: "))
            && lost.ends_with(&format!("; trying {url_b} in 0ns")),
        "{lost}"
    );
    let resumed = sub.next_note();
    assert_eq!(
        resumed,
        "resumed news: could NOT recover what was missed (history too short or a new epoch); going on live from offset 0"
    );
    // Live on node B from where it stands.
    b.publish("news", &json!("live"));
    let msg = sub.next_delivery();
    assert_eq!((&msg["offset"], &msg["data"]), (&json!(1), &json!("live")));
    // Every node gone: after B is lost, three tries (A, B, A), all refused.
    b.kill_9();
    let (status, notes) = sub.finish();
    assert!(!status.success(), "{notes}");
    let tries: Vec<&str> = notes.lines().filter(|l| l.contains("; trying ")).collect();
    // Each: where it was lost or refused, and where it goes next, when.
    let expected = [
        (format!("{url_b}: "), format!("trying {url_a} in 0ns")),
        (
            format!("{url_a}: connection failed"),
            format!("trying {url_b} in 100ms"),
        ),
        (
            format!("{url_b}: connection failed"),
            format!("trying {url_a} in 200ms"),
        ),
    ];
    assert_eq!(tries.len(), expected.len(), "{notes}");
    for (line, (from, then)) in tries.iter().zip(&expected) {
        assert!(line.starts_with(from) && line.ends_with(then), "{notes}");
    }
    assert!(
        notes
            .lines()
            .last()
            .unwrap()
            .starts_with("myriad: no node answered in 3 tries; the last: connection failed"),
        "{notes}"
    );
}
