//! The memory engine's own tests: the engine contract through the
//! conformance suite, and the byte budget audited against every stream
//! after each change.

use super::*;
use crate::engine::conformance::{self, Harness};
use crate::history::HistoryPolicy;
use crate::namespace::history_policy;

fn memory(workers: usize, namespaces: Namespaces, max_bytes: usize) -> Harness {
    Harness::new(workers, |hub| {
        Box::new(MemoryEngine::new(hub, namespaces, max_bytes))
    })
}

#[test]
fn a_stream_stays_small() {
    // Paid per subject: see docs/architecture.md, memory per connection.
    assert!(std::mem::size_of::<Stream>() <= 48);
}

/// A harness over a memory engine, and the engine's insides to audit.
fn audited(max_bytes: usize, policy: HistoryPolicy) -> (Harness, Arc<Inner>) {
    let mut inner = None;
    let h = Harness::new(1, |hub| {
        let namespaces = Namespaces::new(policy, &[], history_policy);
        let engine = MemoryEngine::new(hub, namespaces, max_bytes);
        inner = Some(Arc::clone(&engine.inner));
        Box::new(engine)
    });
    (h, inner.expect("made"))
}

/// Recounts from the streams themselves everything the engine's totals
/// and indexes say, and checks they agree. Returns the streams held.
fn audit(inner: &Inner) -> usize {
    let (mut charged, mut messages, mut idle, mut routed, mut streams) = (0, 0, 0, 0, 0);
    for index in 0..SHARDS {
        let shard = inner.lock(index);
        let (mut shard_idle, mut shard_history) = (0, 0);
        for (name, stream) in &shard.streams {
            streams += 1;
            charged += stream.charge(name);
            if let Some(history) = stream.history.as_deref() {
                assert!(!history.is_empty(), "{name}: an empty history kept");
                let kept = history.last(usize::MAX);
                charged += kept
                    .iter()
                    .map(|p| crate::history::kept_bytes(p) + p.charged_deflated_bytes())
                    .sum::<usize>();
                messages += kept.len();
                let order = history.oldest_order().expect("not empty");
                assert_eq!(shard.oldest.get(&order), Some(name));
                shard_history += 1;
            }
            if stream.idle() {
                assert!(shard
                    .idle
                    .contains(&(stream.last_active_s, Arc::clone(name))));
                shard_idle += 1;
                idle += 1;
            }
            if stream.route.subscribers() > 0 {
                routed += stream_bytes(name);
            }
        }
        assert_eq!(
            (shard.idle.len(), shard.oldest.len()),
            (shard_idle, shard_history)
        );
        assert_eq!(
            inner.shard_idle[index].load(Ordering::Relaxed),
            shard.first_idle()
        );
        assert_eq!(
            inner.shard_oldest[index].load(Ordering::Relaxed),
            shard.first_oldest()
        );
    }
    let load = |a: &AtomicUsize| a.load(Ordering::Relaxed);
    assert_eq!(load(&inner.held_bytes), charged, "charged to the budget");
    assert_eq!(load(&inner.held_messages), messages);
    assert_eq!(load(&inner.idle_positions), idle);
    assert_eq!(load(&inner.routed_bytes), routed);
    streams
}

const KEEP_TEN: HistoryPolicy = HistoryPolicy {
    size: 10,
    ttl: Duration::ZERO,
};

#[test]
fn the_byte_count_is_exactly_what_history_holds() {
    let policy = HistoryPolicy {
        size: 3,
        ttl: Duration::ZERO,
    };
    let (h, inner) = audited(5_000, policy);
    for n in 0..40 {
        h.publish(&format!("s{}", n % 4), &"7".repeat(n * 10));
    }
    audit(&inner);
    let stats = h.engine.stats().history;
    assert!(stats.bytes <= 5_000 && stats.evictions > 0, "{stats:?}");
}

/// Every publication history keeps on the node.
fn kept(inner: &Inner) -> Vec<Arc<Publication>> {
    let mut all = Vec::new();
    for index in 0..SHARDS {
        let shard = inner.lock(index);
        for stream in shard.streams.values() {
            if let Some(history) = stream.history.as_deref() {
                all.extend(history.last(usize::MAX));
            }
        }
    }
    all
}

/// What history holds, counted from the streams and publications
/// themselves: each stream's charge, and each kept publication with its
/// compressed frame if one was made.
fn really_held(inner: &Inner) -> usize {
    let mut held = 0;
    for index in 0..SHARDS {
        let shard = inner.lock(index);
        for (name, stream) in &shard.streams {
            held += stream.charge(name);
        }
    }
    held + kept(inner)
        .iter()
        .map(|p| crate::history::kept_bytes(p) + p.deflated_len())
        .sum::<usize>()
}

#[test]
fn compressed_frames_of_kept_publications_count_against_the_budget() {
    // A compressing subscriber gets every publication's compressed frame,
    // which the publication keeps beside its plain one. Before, history
    // did not count it, so it could hold up to twice its budget.
    let budget = 40_000;
    let policy = HistoryPolicy {
        size: 50,
        ttl: Duration::ZERO,
    };
    let (h, inner) = audited(budget, policy);
    // Text of words in no repeating order, which shrinks as real messages
    // do (to about 0.6), not to almost nothing.
    let words = [
        "river", "stone", "amber", "quiet", "north", "lantern", "seven", "harbor",
    ];
    let mut seed = 7u32;
    let text: Vec<&str> = (0..150)
        .map(|_| {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            words[(seed >> 16) as usize % words.len()]
        })
        .collect();
    let text = format!("\"{}\"", text.join(" "));
    let mut compressed = 0;
    for n in 0..200 {
        h.publish(&format!("s{}", n % 5), &text);
        let held = really_held(&inner);
        assert!(held <= budget, "after {n}: {held} held, budget {budget}");
        audit(&inner);
        // The deliveries of what is kept to a compressing subscriber (a
        // worker making each frame once, as `transport::ws` does).
        for p in kept(&inner) {
            p.deflated_frame(0, |envelope| crate::deflate::text_frame(envelope, 2));
            compressed += 1;
        }
    }
    assert!(compressed > 0);
    audit(&inner);
    let stats = h.engine.stats().history;
    assert!(stats.evictions > 0, "{stats:?}");
    // The frames were made, and charged: each kept publication costs its
    // plain bytes and its frame's within the budget.
    let oldest = &kept(&inner)[0];
    let (plain, frame) = (crate::history::kept_bytes(oldest), oldest.deflated_len());
    assert!(frame > 0 && frame < plain, "{frame} of {plain}");
    assert!(
        stats.messages as usize * (plain + frame) <= budget,
        "{stats:?}"
    );
}

#[test]
fn a_publisher_to_new_subjects_cannot_grow_the_node_past_the_budget() {
    // Issue 26's first attack, in small: one message to each of many
    // subjects that nobody subscribes to. Before, every subject's stream
    // outlived its evicted history, outside the budget.
    let budget = 200_000;
    let (h, inner) = audited(budget, KEEP_TEN);
    let first = h.publish("s0", "1").position.expect("kept");
    for n in 1..20_000 {
        h.publish(&format!("s{n}"), "1");
    }
    let streams = audit(&inner);
    let stats = h.engine.stats().history;
    assert!(stats.bytes as usize <= budget, "{stats:?}");
    assert!(
        streams * stream_bytes("s0") <= budget,
        "{streams} streams kept"
    );
    assert!(
        stats.evictions > 0 && stats.evicted_positions > 0,
        "{stats:?}"
    );
    // The first subject was forgotten: coming back to it cannot
    // pretend to recover.
    assert_eq!(h.history("s0", Some(first), 10).recovered, Some(false));
    // The newest still recovers.
    let last = h.publish("s19999", "2").position.expect("kept");
    let before = Position::new(last.epoch, last.offset - 1);
    let page = h.history("s19999", Some(before), 10);
    assert_eq!((page.recovered, page.publications.len()), (Some(true), 1));
}

#[test]
fn positions_left_by_subscribers_are_charged_and_evicted() {
    let budget = 50_000;
    let (h, inner) = audited(budget, KEEP_TEN);
    for n in 0..5_000 {
        let subject = format!("left{n}");
        h.attach(&subject, 1, false);
        h.attached();
        assert_eq!(audit(&inner) as u64, h.engine.stats().history.positions + 1);
        h.engine.detach(&subject, 0, true);
    }
    audit(&inner);
    let stats = h.engine.stats().history;
    assert!(stats.bytes as usize <= budget, "{stats:?}");
    assert!(
        stats.positions > 0 && stats.evicted_positions > 0,
        "{stats:?}"
    );
    assert_eq!(stats.evictions, 0, "no publication was ever kept");
}

#[test]
fn every_change_keeps_the_totals_exact() {
    // A fixed pseudo-random mix of everything that changes a stream,
    // over few subjects and a budget small enough to evict often.
    let (h, inner) = audited(3_000, KEEP_TEN);
    let mut attached: Vec<u32> = vec![0; 12];
    let mut seed = 0x2545_f491_u64;
    for step in 0..4_000 {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let pick = (seed >> 33) as usize;
        let n = pick % attached.len();
        let subject = format!("m{n}");
        match (pick / 16) % 5 {
            0 | 1 => {
                h.publish(&subject, &"x".repeat(pick % 200));
            }
            2 => {
                h.attach(&subject, 1, false);
                h.attached();
                attached[n] += 1;
            }
            3 if attached[n] > 0 => {
                attached[n] -= 1;
                h.engine.detach(&subject, 0, attached[n] == 0);
            }
            _ => {
                h.history(&subject, None, 3);
            }
        }
        if step % 500 == 0 {
            inner.expire_all();
        }
        audit(&inner);
        assert!(inner.held_bytes.load(Ordering::Relaxed) <= 3_000);
    }
}

// The engine contract, clause by clause.
conformance::conformance_suite!(keeps_the_contract, memory);

/// With `events`, a join and a leave reach every worker's mailbox, and a
/// page read is answered in line with them: after the join it holds.
#[test]
fn presence_changes_reach_every_worker_in_line_with_pages() {
    use crate::engine::{Answer, Join, PresenceQuery};
    let (hub, mailboxes, _polls) = crate::hub::test_hub(2, 64);
    let off = HistoryPolicy {
        size: 0,
        ttl: Duration::ZERO,
    };
    let namespaces = Namespaces::new(off, &[], history_policy);
    let engine = MemoryEngine::new(Arc::clone(&hub), namespaces, 1 << 20);
    let to = |conn, request| ConnRequest {
        worker: 0,
        conn,
        life: 1,
        request,
    };
    let join = |conn, events| Attach {
        subject: Arc::from("room"),
        since: None,
        max_replay_bytes: usize::MAX,
        to: to(conn, None),
        token: 1,
        can_wait: false,
        join: Some(Join {
            user: None,
            info: None,
            max_members: 10,
            events,
        }),
    };
    let mut wakeups = Wakeups::default();
    engine.attach(join(1, true), &mut wakeups);
    let query = PresenceQuery {
        subject: Arc::from("room"),
        after: None,
        limit: 10,
    };
    engine.presence(query, Reply::Conn(to(1, Some(7))), &mut wakeups);
    engine.leave("room", to(1, None), &mut wakeups);
    hub.wake(std::mem::take(&mut wakeups));
    let kinds = |worker: usize| -> Vec<String> {
        mailboxes[worker]
            .try_iter()
            .map(|event| match event {
                Event::Presence(c) => format!(
                    "{} {}",
                    if c.joined { "join" } else { "leave" },
                    c.member.conn.rsplit('.').nth(1).unwrap()
                ),
                Event::Attached(_) => "attached".to_owned(),
                Event::Answer(a) => match a.answer {
                    Answer::Presence(Ok(page)) => format!("page of {}", page.members.len()),
                    other => panic!("{other:?}"),
                },
                other => panic!("{other:?}"),
            })
            .collect()
    };
    assert_eq!(kinds(0), ["join 1", "attached", "page of 1", "leave 1"]);
    assert_eq!(kinds(1), ["join 1", "leave 1"], "every worker hears");
    // A join without events tells nobody.
    engine.attach(join(2, false), &mut wakeups);
    hub.wake(wakeups);
    assert_eq!(kinds(1), Vec::<String>::new());
}
