//! The delivery task against a real receiver on a loopback port: a
//! plain-socket HTTP/1.1 server written from docs/operations.md
//! ("Receiving hooks") that checks each signature and answers statuses
//! from a script.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::mpsc as std_mpsc;
use std::thread;

use ring::hmac;
use serde_json::Value;

use super::*;

const SECRET: &[u8; 32] = b"0123456789abcdef0123456789abcdef";

/// One request the receiver took: its status answered, whether its
/// signature verified, and its body.
struct Taken {
    status: u16,
    verified: bool,
    body: Value,
}

/// Starts a receiver answering `statuses` in turn (then 200); returns its
/// URL and where it reports each request.
fn receiver(statuses: Vec<u16>) -> (String, std_mpsc::Receiver<Taken>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hooks", listener.local_addr().unwrap());
    let (report, taken) = std_mpsc::channel();
    thread::spawn(move || {
        let mut statuses = statuses.into_iter();
        for stream in listener.incoming() {
            let mut stream = BufReader::new(stream.unwrap());
            let (mut length, mut timestamp, mut signature) = (0, String::new(), String::new());
            loop {
                let mut line = String::new();
                stream.read_line(&mut line).unwrap();
                let line = line.trim_end();
                if line.is_empty() {
                    break;
                }
                let (name, value) = line.split_once(':').unwrap_or((line, ""));
                match name.to_ascii_lowercase().as_str() {
                    "content-length" => length = value.trim().parse().unwrap(),
                    "myriad-timestamp" => timestamp = value.trim().to_owned(),
                    "myriad-signature" => signature = value.trim().to_owned(),
                    _ => {}
                }
            }
            let mut body = vec![0; length];
            stream.read_exact(&mut body).unwrap();
            // The documented steps: HMAC-SHA256 over timestamp "." body,
            // lowercase hex behind "v1=", compared in constant time.
            let mut signed = timestamp.into_bytes();
            signed.push(b'.');
            signed.extend_from_slice(&body);
            let tag = signature
                .strip_prefix("v1=")
                .and_then(|hex| {
                    (0..hex.len())
                        .step_by(2)
                        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
                        .collect::<Option<Vec<u8>>>()
                })
                .unwrap_or_default();
            let key = hmac::Key::new(hmac::HMAC_SHA256, SECRET);
            let verified = hmac::verify(&key, &signed, &tag).is_ok();
            let status = statuses.next().unwrap_or(200);
            let answer =
                format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            let _ = stream.get_mut().write_all(answer.as_bytes());
            let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
            if report
                .send(Taken {
                    status,
                    verified,
                    body,
                })
                .is_err()
            {
                return;
            }
        }
    });
    (url, taken)
}

fn settings(url: &str) -> HookSettings {
    let mut s = HookSettings::new(url, *SECRET);
    s.batch_window = Duration::from_millis(10);
    s.backoff = Duration::from_millis(20);
    s.retry_bound = 3;
    s
}

fn online(user: &str) -> Signal {
    Signal::Connected(user.to_owned())
}

fn next(taken: &std_mpsc::Receiver<Taken>) -> Taken {
    taken
        .recv_timeout(Duration::from_secs(30))
        .expect("a request")
}

/// Waits until `done` holds for the task's counts.
fn wait_for(hooks: &Hooks, done: impl Fn(&Snapshot) -> bool) -> Snapshot {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let snapshot = hooks.snapshot();
        if done(&snapshot) {
            return snapshot;
        }
        assert!(Instant::now() < deadline, "{snapshot:?}");
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_signed_batch_reaches_the_receiver_as_documented() {
    let (url, taken) = receiver(vec![]);
    let hooks = Hooks::start(settings(&url), "n1").unwrap();
    hooks.signal(online("ann"));
    let before = unix_millis();
    let request = next(&taken);
    assert!(request.verified);
    let time = request.body["events"][0]["time"].as_u64().unwrap();
    assert!(time >= before && time <= unix_millis(), "{time}");
    assert_eq!(
        request.body,
        serde_json::json!({"events": [
            {"id": "n1-1", "type": "online", "time": time, "user": "ann", "node": "n1"}
        ]})
    );
    let snapshot = wait_for(&hooks, |s| s.counts.sent == 1);
    assert_eq!(snapshot.queued, 0);
}

#[test]
fn a_500_then_200_is_retried_and_delivered_once() {
    let (url, taken) = receiver(vec![500]);
    let hooks = Hooks::start(settings(&url), "n1").unwrap();
    hooks.signal(online("ann"));
    let (first, second) = (next(&taken), next(&taken));
    assert_eq!((first.status, second.status), (500, 200));
    assert_eq!(first.body, second.body, "a retry repeats the same ids");
    let snapshot = wait_for(&hooks, |s| s.counts.sent == 1);
    assert_eq!(snapshot.counts.retried, 1);
    // Nothing more goes: a later event is the next request.
    hooks.signal(online("bob"));
    assert_eq!(next(&taken).body["events"][0]["id"], "n1-2");
}

#[test]
fn a_400_is_not_retried_but_counted() {
    let (url, taken) = receiver(vec![400]);
    let hooks = Hooks::start(settings(&url), "n1").unwrap();
    hooks.signal(online("ann"));
    assert_eq!(next(&taken).status, 400);
    let snapshot = wait_for(&hooks, |s| s.counts.dropped_refused == 1);
    assert_eq!((snapshot.counts.retried, snapshot.counts.sent), (0, 0));
    hooks.signal(online("bob"));
    assert_eq!(next(&taken).body["events"][0]["id"], "n1-2");
}

#[test]
fn no_receiver_is_retried_within_the_bound_then_dropped() {
    // A port nothing listens on: bound, then closed.
    let url = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/hooks", listener.local_addr().unwrap())
    };
    let hooks = Hooks::start(settings(&url), "n1").unwrap();
    hooks.signal(online("ann"));
    let snapshot = wait_for(&hooks, |s| s.counts.dropped_retries == 1);
    assert_eq!((snapshot.counts.retried, snapshot.queued), (3, 0));
}

#[test]
fn https_is_refused_until_it_is_delivered() {
    let error = Hooks::start(settings("https://127.0.0.1:9/hooks"), "n1")
        .err()
        .unwrap();
    assert!(error.to_string().contains("only http://"), "{error}");
}

#[test]
fn a_quick_return_sends_neither_offline_nor_a_second_online() {
    let (url, taken) = receiver(vec![]);
    let mut s = settings(&url);
    s.delay = Duration::from_millis(200);
    let hooks = Hooks::start(s, "n1").unwrap();
    hooks.signal(online("ann"));
    assert_eq!(next(&taken).body["events"][0]["type"], "online");
    hooks.signal(Signal::Disconnected("ann".into()));
    hooks.signal(online("ann"));
    wait_for(&hooks, |s| s.counts.cancelled == 2 && s.queued == 0);
    // A user who does not return goes offline once the delay is over.
    let left = Instant::now();
    hooks.signal(online("eve"));
    hooks.signal(Signal::Disconnected("eve".into()));
    let mut seen = Vec::new();
    while seen.len() < 2 {
        for event in next(&taken).body["events"].as_array().unwrap() {
            seen.push((event["user"].clone(), event["type"].clone()));
        }
    }
    assert!(left.elapsed() >= Duration::from_millis(200));
    assert_eq!(
        seen,
        [
            ("eve".into(), "online".into()),
            ("eve".into(), "offline".into())
        ]
    );
    assert!(
        taken.recv_timeout(Duration::from_millis(300)).is_err(),
        "ann's offline went out"
    );
}
