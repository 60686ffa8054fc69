//! The queue's rules, with time passed in by hand.

use std::time::{Duration, Instant};

use super::*;
use crate::hooks::event::EventKind;

const SECRET: &[u8; 32] = b"0123456789abcdef0123456789abcdef";

fn settings() -> HookSettings {
    let mut s = HookSettings::new("http://127.0.0.1:9/hooks", *SECRET);
    s.delay = Duration::from_secs(5);
    s.batch_window = Duration::from_millis(100);
    s.batch_size = 3;
    s.retry_bound = 2;
    s
}

fn user(kind: EventKind, name: &str, id: u64) -> Event {
    Event {
        id: format!("n1-{id}"),
        kind,
        time: id,
        subject: None,
        user: Some(name.to_owned()),
        node: "n1".to_owned(),
    }
}

fn subject(kind: EventKind, name: &str, id: u64) -> Event {
    Event {
        subject: Some(name.to_owned()),
        user: None,
        ..user(kind, "", id)
    }
}

fn ids(batch: &Batch) -> Vec<&str> {
    batch.events.iter().map(|e| e.id.as_str()).collect()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn offline_cancelled_by_a_return_within_the_delay() {
    let t0 = Instant::now();
    let mut q = Queue::new(settings());
    q.push(user(EventKind::Offline, "ann", 1), t0);
    q.push(user(EventKind::Online, "ann", 2), t0 + ms(4_000));
    assert!(q.take(t0 + ms(60_000)).is_none());
    assert_eq!(q.next_due(), None);
    assert_eq!(q.counts().cancelled, 2);
    assert_eq!(q.queued(), 0);
}

#[test]
fn vacated_goes_out_after_the_delay_and_not_before() {
    let t0 = Instant::now();
    let mut q = Queue::new(settings());
    q.push(subject(EventKind::Vacated, "room", 1), t0);
    assert!(q.take(t0 + ms(4_999)).is_none());
    assert_eq!(q.next_due(), Some(t0 + ms(5_000)));
    // Ready at the delay's end, then waits the batch window alone.
    assert!(q.take(t0 + ms(5_000)).is_none());
    let batch = q
        .take(t0 + ms(5_100))
        .expect("vacated after delay + window");
    assert_eq!(ids(&batch), ["n1-1"]);
    // A return after it went out is an event of its own.
    q.finish(batch, Outcome::Delivered, t0 + ms(5_200));
    q.push(subject(EventKind::Occupied, "room", 2), t0 + ms(5_300));
    assert_eq!(ids(&q.take(t0 + ms(5_400)).unwrap()), ["n1-2"]);
}

#[test]
fn a_full_batch_goes_at_once_a_short_one_after_the_window() {
    let t0 = Instant::now();
    let mut q = Queue::new(settings());
    for id in 1..=4 {
        q.push(user(EventKind::Online, &format!("u{id}"), id), t0);
    }
    assert_eq!(ids(&q.take(t0).unwrap()), ["n1-1", "n1-2", "n1-3"]);
    assert!(q.take(t0 + ms(99)).is_none());
    assert_eq!(q.next_due(), Some(t0 + ms(100)));
    assert_eq!(ids(&q.take(t0 + ms(100)).unwrap()), ["n1-4"]);
}

#[test]
fn a_key_waits_for_its_retried_batch_others_do_not() {
    let t0 = Instant::now();
    let mut q = Queue::new(settings());
    q.push(subject(EventKind::Occupied, "a", 1), t0);
    let first = q.take(t0 + ms(100)).unwrap();
    q.push(subject(EventKind::Join, "a", 2), t0 + ms(150));
    q.push(subject(EventKind::Occupied, "b", 3), t0 + ms(150));
    q.finish(first, Outcome::Retryable, t0 + ms(200));
    assert_eq!(q.counts().retried, 1);
    // "b" goes; "a"'s newer event waits behind the retry.
    assert_eq!(ids(&q.take(t0 + ms(250)).unwrap()), ["n1-3"]);
    assert!(q.take(t0 + ms(699)).is_none());
    let retry = q.take(t0 + ms(700)).expect("retry after 500 ms back-off");
    assert_eq!((ids(&retry), retry.retries), (vec!["n1-1"], 1));
    q.finish(retry, Outcome::Delivered, t0 + ms(710));
    assert_eq!(ids(&q.take(t0 + ms(800)).unwrap()), ["n1-2"]);
}

#[test]
fn retries_are_bounded_then_dropped_and_counted() {
    let t0 = Instant::now();
    let mut q = Queue::new(settings());
    q.push(user(EventKind::Online, "ann", 1), t0);
    let mut now = t0 + ms(100);
    let mut batch = q.take(now).unwrap();
    for backoff in [500, 1_000] {
        q.finish(batch, Outcome::Retryable, now);
        now += ms(backoff);
        batch = q.take(now).expect("retried within the bound");
    }
    q.finish(batch, Outcome::Retryable, now);
    let counts = q.counts();
    assert_eq!(
        (counts.retried, counts.dropped_retries, counts.sent),
        (2, 1, 0)
    );
    assert_eq!(q.queued(), 0);
    // The key is free again.
    q.push(user(EventKind::Online, "ann", 2), now);
    assert_eq!(ids(&q.take(now + ms(100)).unwrap()), ["n1-2"]);
}

#[test]
fn refused_is_not_retried_but_counted() {
    let t0 = Instant::now();
    let mut q = Queue::new(settings());
    q.push(user(EventKind::Online, "ann", 1), t0);
    let batch = q.take(t0 + ms(100)).unwrap();
    q.finish(batch, Outcome::Refused, t0 + ms(110));
    assert!(q.take(t0 + ms(60_000)).is_none());
    let counts = q.counts();
    assert_eq!((counts.dropped_refused, counts.retried), (1, 0));
}

#[test]
fn over_the_bound_dropped_and_counted() {
    let t0 = Instant::now();
    let mut s = settings();
    s.queue_bound = 2;
    let mut q = Queue::new(s);
    q.push(user(EventKind::Online, "a", 1), t0);
    q.push(user(EventKind::Offline, "b", 2), t0);
    q.push(user(EventKind::Online, "c", 3), t0);
    assert_eq!((q.queued(), q.counts().dropped_full), (2, 1));
}

#[test]
fn unsent_kinds_still_cancel() {
    let t0 = Instant::now();
    let mut s = settings();
    s.events = vec![EventKind::Online];
    let mut q = Queue::new(s);
    q.push(user(EventKind::Online, "ann", 1), t0);
    q.push(user(EventKind::Offline, "ann", 2), t0 + ms(1));
    q.push(user(EventKind::Online, "ann", 3), t0 + ms(2));
    q.push(user(EventKind::Offline, "bob", 4), t0 + ms(3));
    let batch = q.take(t0 + ms(10_000)).unwrap();
    assert_eq!(ids(&batch), ["n1-1"]);
    assert_eq!(q.counts().cancelled, 2);
}

#[test]
fn statuses_classified() {
    for (status, outcome) in [
        (Some(200), Outcome::Delivered),
        (Some(204), Outcome::Delivered),
        (Some(500), Outcome::Retryable),
        (Some(503), Outcome::Retryable),
        (Some(408), Outcome::Retryable),
        (Some(429), Outcome::Retryable),
        (None, Outcome::Retryable),
        (Some(400), Outcome::Refused),
        (Some(404), Outcome::Refused),
        (Some(301), Outcome::Refused),
    ] {
        assert_eq!(Outcome::of_status(status), outcome, "{status:?}");
    }
}

#[test]
fn body_is_the_documented_json() {
    let t0 = Instant::now();
    let mut q = Queue::new(settings());
    q.push(user(EventKind::Online, "ann", 7), t0);
    let body = q.take(t0 + ms(100)).unwrap().body();
    assert_eq!(
        String::from_utf8(body).unwrap(),
        r#"{"events":[{"id":"n1-7","type":"online","time":7,"user":"ann","node":"n1"}]}"#
    );
}
