//! The delivery task against a real receiver on a loopback port
//! (`myriad_testkit::hook_receiver`, written from docs/operations.md).

use std::net::TcpListener;
use std::thread;

use myriad_testkit::hook_receiver::HookReceiver;

use super::*;

const SECRET: &[u8; 32] = b"0123456789abcdef0123456789abcdef";

fn receiver(statuses: Vec<u16>) -> HookReceiver {
    HookReceiver::start(SECRET, statuses)
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
    let taken = receiver(vec![]);
    let hooks = Hooks::start(settings(taken.url()), "n1", Box::new(|_| {})).unwrap();
    hooks.signal(online("ann"));
    let before = unix_millis();
    let request = taken.next();
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
    let delivered = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&delivered);
    let taken = receiver(vec![500]);
    let hooks = Hooks::start(
        settings(taken.url()),
        "n1",
        Box::new(move |_| {
            seen.fetch_add(1, Ordering::Relaxed);
        }),
    )
    .unwrap();
    hooks.signal(online("ann"));
    let (first, second) = (taken.next(), taken.next());
    assert_eq!((first.status, second.status), (500, 200));
    assert_eq!(first.body, second.body, "a retry repeats the same ids");
    let snapshot = wait_for(&hooks, |s| s.counts.sent == 1);
    assert_eq!(snapshot.counts.retried, 1);
    assert_eq!(
        delivered.load(Ordering::Relaxed),
        1,
        "one latency per delivery"
    );
    // Nothing more goes: a later event is the next request.
    hooks.signal(online("bob"));
    assert_eq!(taken.next().body["events"][0]["id"], "n1-2");
}

#[test]
fn a_400_is_not_retried_but_counted() {
    let taken = receiver(vec![400]);
    let hooks = Hooks::start(settings(taken.url()), "n1", Box::new(|_| {})).unwrap();
    hooks.signal(online("ann"));
    assert_eq!(taken.next().status, 400);
    let snapshot = wait_for(&hooks, |s| s.counts.dropped_refused == 1);
    assert_eq!((snapshot.counts.retried, snapshot.counts.sent), (0, 0));
    hooks.signal(online("bob"));
    assert_eq!(taken.next().body["events"][0]["id"], "n1-2");
}

#[test]
fn no_receiver_is_retried_within_the_bound_then_dropped() {
    // A port nothing listens on: bound, then closed.
    let url = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/hooks", listener.local_addr().unwrap())
    };
    let hooks = Hooks::start(settings(&url), "n1", Box::new(|_| {})).unwrap();
    hooks.signal(online("ann"));
    let snapshot = wait_for(&hooks, |s| s.counts.dropped_retries == 1);
    assert_eq!((snapshot.counts.retried, snapshot.queued), (3, 0));
}

#[test]
fn an_https_url_with_an_unreadable_ca_file_is_refused_at_start() {
    let mut s = settings("https://127.0.0.1:9/hooks");
    s.ca = Some("/nonexistent/ca.pem".into());
    let error = Hooks::start(s, "n1", Box::new(|_| {})).err().unwrap();
    assert!(error.to_string().contains("backend_ca_file"), "{error}");
}

#[test]
fn a_quick_return_sends_neither_offline_nor_a_second_online() {
    let taken = receiver(vec![]);
    let mut s = settings(taken.url());
    s.delay = Duration::from_millis(200);
    let hooks = Hooks::start(s, "n1", Box::new(|_| {})).unwrap();
    hooks.signal(online("ann"));
    assert_eq!(taken.next().body["events"][0]["type"], "online");
    hooks.signal(Signal::Disconnected("ann".into()));
    hooks.signal(online("ann"));
    wait_for(&hooks, |s| s.counts.cancelled == 2 && s.queued == 0);
    // A user who does not return goes offline once the delay is over.
    let left = Instant::now();
    hooks.signal(online("eve"));
    hooks.signal(Signal::Disconnected("eve".into()));
    let mut seen = Vec::new();
    while seen.len() < 2 {
        for event in taken.next().body["events"].as_array().unwrap() {
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
        taken.next_within(Duration::from_millis(300)).is_none(),
        "ann's offline went out"
    );
}
