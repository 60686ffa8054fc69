//! The engine conformance suite: the module contract of `engine`, as tests.
//!
//! Every engine runs the suite unchanged: its test module calls
//! [`conformance_suite!`] with a [`Make`] that builds it over a hub with
//! the given workers, namespaces and history budget, and the macro expands
//! to one `#[test]` per clause. What an engine needs (a Redis server, a
//! prefix per engine) lives in that maker, not in global state. The
//! clauses play the workers' part with the harness's [`Sim`]
//! ([`harness`]), which applies mailbox events exactly as a worker does.
//!
//! Answers and deliveries may come later than the call that caused them
//! (clause 7: an engine over the network answers when its round trip is
//! done), so the suite waits for what it expects, never for a time.

mod harness;

use std::sync::Arc;
use std::time::Duration;

use myriad_protocol::position::Position;
use tokio::sync::oneshot;

pub use self::harness::Harness;
use self::harness::Sim;
use super::{EngineError, HistoryQuery, Join, Published, Reply};
use crate::history::HistoryPolicy;
use crate::hub::Wakeups;
use crate::namespace::{Namespace, Namespaces};

/// Builds the engine under test for a harness of `workers` workers, with
/// `namespaces` and a history budget of the last argument's bytes. A
/// clause may build more than one (a "restarted" node, a probe).
pub type Make<'a> = &'a dyn Fn(usize, Namespaces, usize) -> Harness;

/// Expands to the whole suite, one `#[test]` per clause, in a module
/// `$name`, for the engines `$make` builds (an expression giving a
/// `Fn(usize, Namespaces, usize) -> Harness`, evaluated once per test).
macro_rules! conformance_suite {
    ($name:ident, $make:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::engine::conformance as c;

            #[test]
            fn positions_and_order() {
                c::positions_and_order(&$make);
            }
            #[test]
            fn attach_is_an_exact_switch_under_concurrent_publishing() {
                c::attach_is_an_exact_switch_under_concurrent_publishing(&$make);
            }
            #[test]
            fn recovery_reports_what_it_could_not_do() {
                c::recovery_reports_what_it_could_not_do(&$make);
            }
            #[test]
            fn interest_and_forgetting() {
                c::interest_and_forgetting(&$make);
            }
            #[test]
            fn history_limits() {
                c::history_limits(&$make);
            }
            #[test]
            fn the_memory_budget_evicts_the_oldest_first() {
                c::the_memory_budget_evicts_the_oldest_first(&$make);
            }
            #[test]
            fn full_histories_still_evict_the_oldest_first() {
                c::full_histories_still_evict_the_oldest_first(&$make);
            }
            #[test]
            fn the_sweep_expires_what_nobody_reads() {
                c::the_sweep_expires_what_nobody_reads(&$make);
            }
            #[test]
            fn shutdown_refuses_everything() {
                c::shutdown_refuses_everything(&$make);
            }
            #[test]
            fn presence_join_and_leave() {
                c::presence_join_and_leave(&$make);
            }
            #[test]
            fn presence_cap_refuses_the_join_over_it() {
                c::presence_cap_refuses_the_join_over_it(&$make);
            }
            #[test]
            fn presence_stats_stay_exact_under_churn() {
                c::presence_stats_stay_exact_under_churn(&$make);
            }
        }
    };
}
pub(crate) use conformance_suite;

fn policy(size: usize, ttl_ms: u64) -> HistoryPolicy {
    HistoryPolicy {
        size,
        ttl: Duration::from_millis(ttl_ms),
    }
}

/// Subjects under `off.` keep no history, under `short.` three
/// publications, under `brief.` 300 ms worth, under `fleeting.` three and
/// 300 ms worth; the rest 100,000.
fn namespaces() -> Namespaces {
    let ns = |prefix: &str, size, ttl_ms: Option<u64>| Namespace {
        prefix: prefix.to_owned(),
        history_size: Some(size),
        history_ttl: ttl_ms.map(|ms| crate::span::Span(Duration::from_millis(ms))),
        ..Namespace::default()
    };
    Namespaces::new(
        policy(100_000, 0),
        &[
            ns("off.", 0, None),
            ns("short.", 3, None),
            ns("brief.", 100, Some(300)),
            ns("fleeting.", 3, Some(300)),
        ],
        crate::namespace::history_policy,
    )
}

pub fn positions_and_order(make: Make<'_>) {
    let h = make(2, namespaces(), usize::MAX);
    let mut sim = Sim::new();
    sim.attach(&h, 0, 1, "a", None);
    sim.attach(&h, 1, 2, "a", None);
    let mut epoch = None;
    for expected in 1..=100 {
        let p = h.publish("a", "{\"k\":1}");
        let position = p.position.expect("subscribed subjects get positions");
        assert_eq!(
            position.offset, expected,
            "clause 1: one more than the last"
        );
        assert_eq!(*epoch.get_or_insert(position.epoch), position.epoch);
        assert_eq!(p.subscribers, 2);
    }
    h.await_queued(100);
    assert!(
        h.engine.congested(),
        "100 undrained deliveries per worker pass the harness's high water"
    );
    sim.drain(&h);
    let want: Vec<u64> = (1..=100).collect();
    assert_eq!(sim.seen(1, "a").offsets, want, "clause 2, worker 0");
    assert_eq!(sim.seen(2, "a").offsets, want, "clause 2, worker 1");
    assert_eq!(sim.seen(1, "a").attached_at.unwrap().0.offset, 0);
    assert!(!h.engine.congested(), "nothing waits once drained");
}

pub fn attach_is_an_exact_switch_under_concurrent_publishing(make: Make<'_>) {
    let h = make(2, namespaces(), usize::MAX);
    // The publisher starts with the first attach and runs until the
    // attaching stops (or 50,000 publishes, within history), so the two
    // overlap by construction.
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let (go, started) = std::sync::mpsc::channel::<()>();
    let stop = Arc::new(AtomicBool::new(false));
    let published = Arc::new(AtomicU64::new(0));
    let publisher = {
        let engine = Arc::clone(&h.engine);
        let hub = Arc::clone(&h.hub);
        let (stop, published) = (Arc::clone(&stop), Arc::clone(&published));
        std::thread::spawn(move || {
            started.recv().unwrap();
            while published.load(Ordering::Relaxed) < 50_000 && !stop.load(Ordering::Relaxed) {
                let mut wakeups = Wakeups::default();
                let (tx, rx) = oneshot::channel();
                engine.publish("race", "0", Reply::Task(tx), &mut wakeups);
                hub.wake(wakeups);
                // Counted once done: an engine may answer later (clause 7).
                rx.blocking_recv().expect("answered").expect("published");
                published.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let mut sim = Sim::new();
    let mut while_publishing = 0;
    // Connection c, over and over: attach recovering from where its last
    // life ended, take a little, detach; each life must continue exactly.
    let mut last: Option<Position> = None;
    let mut lives = 0;
    let mut received: Vec<u64> = Vec::new();
    // At least 200 lives, and on until the publisher is well under way.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut round = 0u32;
    while round < 200 || published.load(Ordering::Relaxed) < 2_000 {
        assert!(
            std::time::Instant::now() < deadline,
            "the publisher never got going"
        );
        let conn = 10 + round % 3;
        let worker = (round % 2) as usize;
        sim.attach(&h, worker, conn, "race", last);
        if round == 0 {
            go.send(()).unwrap();
        } else if !publisher.is_finished() {
            while_publishing += 1;
        }
        sim.drain(&h);
        let Some((at, recovered)) = sim.seen(conn, "race").attached_at else {
            panic!("the attach answer arrives with the drain");
        };
        // While the publisher runs, the life goes on until a live
        // publication follows its answer: one that stopped at its replay
        // would leave a gap between replay and live for the next life's
        // recovery to fill, unseen.
        let live = |sim: &Sim| {
            let seen = sim.seen(conn, "race");
            seen.offsets.last().is_some_and(|&o| o > at.offset)
        };
        while !publisher.is_finished() && !live(&sim) {
            assert!(std::time::Instant::now() < deadline, "no live delivery");
            sim.take(&h);
            std::thread::sleep(Duration::from_micros(100));
        }
        sim.take(&h);
        let seen = sim.seen(conn, "race");
        if last.is_some() {
            assert_eq!(
                recovered,
                Some(true),
                "history holds every publication here: since {last:?} at {at:?}"
            );
        }
        received.extend(&seen.offsets);
        sim.detach(&h, worker, conn, "race");
        if let Some(&offset) = seen.offsets.last() {
            last = Some(Position::new(at.epoch, offset));
        } else {
            last = Some(at);
        }
        lives += 1;
        round += 1;
    }
    stop.store(true, Ordering::Relaxed);
    publisher.join().unwrap();
    let published = published.load(Ordering::Relaxed);
    assert!(lives > 1);
    assert!(
        while_publishing > 0,
        "some attach met the publisher at work"
    );
    // One last life after the publisher is done catches up to the end.
    sim.attach(&h, 0, 99, "race", last);
    sim.drain(&h);
    let seen = sim.seen(99, "race");
    assert_eq!(seen.attached_at.unwrap().1, Some(true));
    received.extend(&seen.offsets);
    assert_eq!(received.last(), Some(&published));
    let first = received.first().copied().unwrap_or(1);
    let want: Vec<u64> = (first..first + received.len() as u64).collect();
    assert_eq!(
        received, want,
        "clause 3: no gap, no duplicate across lives"
    );
}

pub fn recovery_reports_what_it_could_not_do(make: Make<'_>) {
    let h = make(1, namespaces(), usize::MAX);
    let mut sim = Sim::new();
    for _ in 0..10 {
        h.publish("short.x", "1");
    }
    let current = h.history("short.x", None, 100).position;
    assert_eq!(current.offset, 10);
    let at = |offset| Position::new(current.epoch, offset);
    // Three kept: 8, 9, 10. From 7 is complete, from 6 is not.
    sim.attach(&h, 0, 1, "short.x", Some(at(7)));
    sim.attach(&h, 0, 2, "short.x", Some(at(6)));
    sim.attach(&h, 0, 3, "short.x", Some(at(10)));
    let other_epoch = Position::new(myriad_protocol::position::Epoch(current.epoch.0 ^ 1), 9);
    sim.attach(&h, 0, 4, "short.x", Some(other_epoch));
    // Complete in history, but the replay would not fit the connection.
    sim.attach_limited(&h, 0, 5, "short.x", Some(at(7)), 1);
    sim.drain(&h);
    assert_eq!(
        sim.seen(5, "short.x").attached_at,
        Some((current, Some(false))),
        "a replay over max_replay_bytes is refused"
    );
    assert!(
        sim.seen(5, "short.x").offsets.is_empty(),
        "nothing replayed"
    );
    assert_eq!(
        sim.seen(1, "short.x").attached_at,
        Some((current, Some(true)))
    );
    assert_eq!(sim.seen(1, "short.x").offsets, [8, 9, 10]);
    assert_eq!(
        sim.seen(2, "short.x").attached_at,
        Some((current, Some(false)))
    );
    assert!(
        sim.seen(2, "short.x").offsets.is_empty(),
        "nothing replayed"
    );
    assert_eq!(
        sim.seen(3, "short.x").attached_at,
        Some((current, Some(true)))
    );
    assert_eq!(
        sim.seen(4, "short.x").attached_at,
        Some((current, Some(false))),
        "epoch"
    );
    let page = h.history("short.x", Some(at(8)), 100);
    assert_eq!(page.recovered, Some(true));
    let offsets: Vec<u64> = page
        .publications
        .iter()
        .map(|p| p.position.offset)
        .collect();
    assert_eq!(offsets, [9, 10]);
    assert_eq!(
        h.history("short.x", Some(at(8)), 1).publications.len(),
        1,
        "limit"
    );
    assert_eq!(
        h.history("short.x", Some(at(2)), 100).recovered,
        Some(false)
    );
    // A restarted node is a new engine: the epoch changes.
    let restarted = make(1, namespaces(), usize::MAX);
    restarted.publish("short.x", "1");
    let after = restarted.history("short.x", None, 10).position;
    assert_ne!(after.epoch, current.epoch, "a new life, a new epoch");
    assert_eq!(
        restarted.history("short.x", Some(at(10)), 10).recovered,
        Some(false)
    );
}

pub fn interest_and_forgetting(make: Make<'_>) {
    let h = make(2, namespaces(), usize::MAX);
    let mut sim = Sim::new();
    // No history, nobody listening: dropped, no position.
    assert_eq!(
        h.publish("off.a", "1"),
        Published {
            position: None,
            subscribers: 0
        }
    );
    sim.attach(&h, 0, 1, "off.a", None);
    sim.attach(&h, 1, 2, "off.a", None);
    sim.drain(&h);
    let first_life = sim.seen(1, "off.a").attached_at.unwrap().0;
    assert_eq!(h.publish("off.a", "1").subscribers, 2);
    sim.drain(&h);
    sim.detach(&h, 1, 2, "off.a");
    assert_eq!(h.publish("off.a", "1").subscribers, 1, "worker 1 left");
    sim.drain(&h);
    assert_eq!(sim.seen(2, "off.a").offsets, [1]);
    assert_eq!(sim.seen(1, "off.a").offsets, [1, 2]);
    sim.detach(&h, 0, 1, "off.a");
    assert_eq!(
        h.publish("off.a", "1").position,
        None,
        "clause 4: forgotten"
    );
    sim.attach(&h, 0, 1, "off.a", None);
    sim.drain(&h);
    let second_life = sim.seen(1, "off.a").attached_at.unwrap().0;
    assert_eq!(second_life.offset, 0);
    assert_ne!(
        second_life.epoch, first_life.epoch,
        "a new life, a new epoch"
    );
    // With history, the position outlives its subscribers (clause 5).
    sim.attach(&h, 0, 3, "kept", None);
    sim.drain(&h);
    h.publish("kept", "1");
    h.publish("kept", "2");
    sim.detach(&h, 0, 3, "kept");
    assert_eq!(h.publish("kept", "3").subscribers, 0);
    sim.attach(
        &h,
        0,
        3,
        "kept",
        Some(sim.seen(3, "kept").attached_at.unwrap().0),
    );
    sim.drain(&h);
    assert_eq!(sim.seen(3, "kept").attached_at.unwrap().1, Some(true));
    assert_eq!(sim.seen(3, "kept").offsets, [1, 2, 3]);
    // A stale attach answer (detached before it was taken) is not applied,
    // and its detach balances it.
    sim.attach(&h, 1, 4, "kept", None);
    sim.detach(&h, 1, 4, "kept");
    sim.drain(&h);
    assert!(sim.seen(4, "kept").attached_at.is_none());
    assert_eq!(h.publish("kept", "4").subscribers, 1, "only connection 3");
}

pub fn history_limits(make: Make<'_>) {
    let h = make(1, namespaces(), usize::MAX);
    for _ in 0..10 {
        h.publish("short.a", "1");
    }
    let kept: Vec<u64> = h
        .history("short.a", None, 100)
        .publications
        .iter()
        .map(|p| p.position.offset)
        .collect();
    assert_eq!(kept, [8, 9, 10], "size");
    let last_two: Vec<u64> = h
        .history("short.a", None, 2)
        .publications
        .iter()
        .map(|p| p.position.offset)
        .collect();
    assert_eq!(last_two, [9, 10]);
    h.publish("brief.a", "1");
    let before = h.history("brief.a", None, 10);
    assert_eq!(before.publications.len(), 1);
    std::thread::sleep(Duration::from_millis(700));
    let after = h.history("brief.a", None, 10);
    assert!(after.publications.is_empty(), "ttl");
    let since = Position::new(before.position.epoch, 0);
    assert_eq!(h.history("brief.a", Some(since), 10).recovered, Some(false));
    let stats = h.engine.stats().history;
    assert_eq!((stats.subjects, stats.messages), (1, 3), "short.a only");
}

/// What the budget charges for a subject holding history (`fixed`, its
/// own state: none for an engine that counts only publications) and for
/// each publication of `data` on it (`each`), measured in an engine of its
/// own on a subject as long as the test's.
struct Costs {
    fixed: usize,
    each: usize,
}

fn costs(make: Make<'_>, subject: &str, data: &str) -> Costs {
    let probe = make(1, namespaces(), usize::MAX);
    probe.publish(subject, data);
    let one = probe.engine.stats().history.bytes as usize;
    probe.publish(subject, data);
    let each = probe.engine.stats().history.bytes as usize - one;
    Costs {
        fixed: one - each,
        each,
    }
}

/// The offsets `subject`'s history holds.
fn kept_offsets(h: &Harness, subject: &str) -> Vec<u64> {
    h.history(subject, None, 100)
        .publications
        .iter()
        .map(|p| p.position.offset)
        .collect()
}

pub fn the_memory_budget_evicts_the_oldest_first(make: Make<'_>) {
    // Room for four subjects and about ten of these publications.
    let data = format!("\"{}\"", "x".repeat(500));
    let cost = costs(make, "b0", &data);
    let budget = cost.fixed * 4 + cost.each * 10;
    let h = make(1, namespaces(), budget);
    for _round in 0..6 {
        for subject in ["b1", "b2", "b3", "b4"] {
            h.publish(subject, &data);
        }
    }
    let stats = h.engine.stats().history;
    assert!(stats.bytes as usize <= budget, "{stats:?}");
    assert_eq!(stats.messages, 10);
    assert_eq!(stats.evictions, 14);
    // 24 published round-robin; the newest 10 remain: rounds 4 and 5 of
    // every subject, and round 3 of b3 and b4.
    let kept = |s: &str| kept_offsets(&h, s);
    assert_eq!(kept("b1"), [5, 6]);
    assert_eq!(kept("b2"), [5, 6]);
    assert_eq!(kept("b3"), [4, 5, 6]);
    assert_eq!(kept("b4"), [4, 5, 6]);
}

/// Full histories drop their own oldest entries as they go: the budget must
/// still find the oldest entry across subjects, not the oldest a subject
/// ever held.
pub fn full_histories_still_evict_the_oldest_first(make: Make<'_>) {
    let data = format!("\"{}\"", "x".repeat(500));
    let cost = costs(make, "short.z", &data);
    // Room for three subjects and six publications and a half: an engine
    // may count an offset's digits. The half also holds what a subject
    // left without history may still charge (its position), which goes
    // before any publication.
    let h = make(1, namespaces(), cost.fixed * 3 + cost.each * 13 / 2);
    let publish = |subject: &str, times: usize| {
        for _ in 0..times {
            h.publish(subject, &data);
        }
    };
    let kept = |s: &str| kept_offsets(&h, s);
    // a's first three go to its own limit after b's three: the oldest
    // entry is then b's first, though a took the first place in history.
    publish("short.a", 3);
    publish("short.b", 3);
    publish("short.a", 3);
    assert_eq!(kept("short.a"), [4, 5, 6]);
    assert_eq!(kept("short.b"), [1, 2, 3]);
    publish("short.c", 2);
    assert_eq!(kept("short.b"), [3], "b's first two were the oldest");
    assert_eq!(kept("short.a"), [4, 5, 6]);
    publish("short.d", 2);
    assert!(kept("short.b").is_empty());
    assert_eq!(kept("short.a"), [5, 6]);
    assert_eq!(kept("short.c"), [1, 2]);
    assert_eq!(kept("short.d"), [1, 2]);
    let stats = h.engine.stats().history;
    assert_eq!((stats.subjects, stats.messages, stats.evictions), (3, 6, 4));
}

/// Publications past their age limit go without anyone reading their
/// subject, also those of a full history that has dropped its own oldest.
pub fn the_sweep_expires_what_nobody_reads(make: Make<'_>) {
    let h = make(1, namespaces(), usize::MAX);
    for _ in 0..5 {
        h.publish("fleeting.a", "1");
    }
    h.publish("fleeting.b", "1");
    h.publish("kept", "1");
    // The sweeps run once a second; a generous bound for a busy machine.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        // Stats are as of an engine's last pass over history: nothing here
        // touches the subjects, so only the sweep can bring them down.
        std::thread::sleep(Duration::from_millis(100));
        let stats = h.engine.stats().history;
        if (stats.subjects, stats.messages) == (1, 1) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "expired publications stay: {stats:?}"
        );
    }
    assert_eq!(h.history("kept", None, 10).publications.len(), 1);
}

pub fn shutdown_refuses_everything(make: Make<'_>) {
    let h = make(1, namespaces(), usize::MAX);
    h.publish("before", "1");
    h.engine.shut_down();
    let (tx, rx) = oneshot::channel();
    let mut wakeups = Wakeups::default();
    h.engine
        .publish("before", "2", Reply::Task(tx), &mut wakeups);
    assert_eq!(rx.blocking_recv().unwrap(), Err(EngineError::ShuttingDown));
    let (tx, rx) = oneshot::channel();
    let query = HistoryQuery {
        subject: Arc::from("before"),
        since: None,
        limit: 10,
    };
    h.engine.history(query, Reply::Task(tx), &mut wakeups);
    assert!(matches!(
        rx.blocking_recv().unwrap(),
        Err(EngineError::ShuttingDown)
    ));
    h.attach("before", 1, false);
    let attached = h.attached();
    assert!(matches!(attached.outcome, Err(EngineError::ShuttingDown)));
    h.engine.detach("before", 0, true);
}

fn join(user: Option<&str>, max_members: usize) -> Join {
    Join {
        user: user.map(Arc::from),
        info: user.map(|u| Arc::from(format!("{{\"name\":\"{u}\"}}"))),
        max_members,
        events: false,
    }
}

/// Clause 8: a connection joins with its attach and leaves with `leave`;
/// pages list every member once, in id order; counts are exact.
pub fn presence_join_and_leave(make: Make<'_>) {
    let h = make(2, namespaces(), usize::MAX);
    let mut sim = Sim::new();
    sim.attach_joining(&h, 0, 1, "room", join(Some("u1"), 10));
    sim.attach_joining(&h, 0, 2, "room", join(Some("u1"), 10));
    sim.attach_joining(&h, 1, 3, "room", join(Some("u2"), 10));
    sim.attach_joining(&h, 1, 4, "room", join(None, 10));
    sim.attach(&h, 1, 5, "room", None);
    sim.drain(&h);
    assert_eq!(h.presence_stats("room"), (4, 2), "anonymous is no user");
    assert_eq!(h.presence_stats("elsewhere"), (0, 0));
    let members = h.members("room", 3);
    assert_eq!(members.len(), 4, "connection 5 did not join");
    let mut ids: Vec<&str> = members.iter().map(|m| &*m.conn).collect();
    let listed = ids.clone();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids, listed, "in id order, each once");
    let users: Vec<Option<&str>> = members.iter().map(|m| m.user.as_deref()).collect();
    assert_eq!(users.iter().filter(|u| **u == Some("u1")).count(), 2);
    let info = members.iter().find(|m| m.user.as_deref() == Some("u2"));
    assert_eq!(info.unwrap().info.as_deref(), Some(r#"{"name":"u2"}"#));
    sim.part(&h, 0, 1, "room");
    assert_eq!(h.presence_stats("room"), (3, 2), "u1 has another member");
    sim.part(&h, 0, 2, "room");
    assert_eq!(h.presence_stats("room"), (2, 1), "u1 left with its last");
    h.engine
        .leave("room", harness::request(0, 2), &mut Wakeups::default());
    assert_eq!(
        h.presence_stats("room"),
        (2, 1),
        "a second leave is no change"
    );
    // A detach without a leave keeps the member (the worker sends both).
    sim.detach(&h, 1, 5, "room");
    assert_eq!(h.members("room", 10).len(), 2);
    sim.part(&h, 1, 3, "room");
    sim.part(&h, 1, 4, "room");
    assert_eq!(h.presence_stats("room"), (0, 0));
    assert!(h.presence("room", None, 10).members.is_empty());
}

/// Clause 8: the join over `max_members` fails its attach with
/// `PresenceFull` and joins nothing; a place freed by a leave is taken.
pub fn presence_cap_refuses_the_join_over_it(make: Make<'_>) {
    let h = make(1, namespaces(), usize::MAX);
    let mut sim = Sim::new();
    for conn in 1..=3 {
        sim.attach_joining(&h, 0, conn, "capped", join(Some("u"), 3));
    }
    sim.attach_joining(&h, 0, 4, "capped", join(Some("v"), 3));
    sim.drain(&h);
    assert_eq!(
        sim.seen(4, "capped").refused,
        Some(EngineError::PresenceFull { max: 3 })
    );
    assert!(sim.seen(3, "capped").refused.is_none());
    assert_eq!(h.presence_stats("capped"), (3, 1), "v never joined");
    sim.detach(&h, 0, 4, "capped");
    sim.part(&h, 0, 1, "capped");
    sim.attach_joining(&h, 0, 4, "capped", join(Some("v"), 3));
    sim.drain(&h);
    assert!(sim.seen(4, "capped").refused.is_none());
    assert_eq!(h.presence_stats("capped"), (3, 2));
}

/// Clause 8: under joins and leaves of many connections of several
/// workers, interleaved, counts and pages stay exactly as a model says.
pub fn presence_stats_stay_exact_under_churn(make: Make<'_>) {
    use std::collections::{HashMap, HashSet};
    const WORKERS: usize = 3;
    const CONNS: u32 = 40;
    let h = make(WORKERS, namespaces(), usize::MAX);
    let mut sim = Sim::new();
    // The model: member (worker, conn) → its user.
    let mut model: HashMap<(usize, u32), u32> = HashMap::new();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for step in 1..=600 {
        // A fixed-seed LCG: the same churn on every engine and every run.
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let worker = (seed >> 33) as usize % WORKERS;
        let conn = (seed >> 40) as u32 % CONNS;
        if model.remove(&(worker, conn)).is_some() {
            sim.part(&h, worker, conn, "churn");
        } else {
            let user = (seed >> 50) as u32 % 9;
            let name = format!("u{user}");
            sim.attach_joining(&h, worker, conn, "churn", join(Some(&name), 10_000));
            model.insert((worker, conn), user);
        }
        if step % 50 == 0 {
            sim.drain(&h);
            let users: HashSet<&u32> = model.values().collect();
            assert_eq!(
                h.presence_stats("churn"),
                (model.len() as u64, users.len() as u64),
                "after {step} changes"
            );
            assert_eq!(h.members("churn", 7).len(), model.len());
        }
    }
}
