//! The router's switch from history to live, without Redis: the tests play
//! Redis's two voices (the channel through `deliver`, the attach answers
//! through `answered`) in the orders the network may produce, and read
//! what each worker's mailbox received, as the worker would.
//!
//! What they hold the router to is contract clause 3 as the module header
//! states it: after its attach answer, a subscriber's stream (the answer's
//! replay, then the publications behind it in its worker's mailbox)
//! continues from its position, or from its `since` when it recovers, up
//! to the newest publication, with none missing and none twice.
//!
//! The property test keeps to what one instance's connection guarantees:
//! the channel carries a subject's publications in offset order from the
//! first after the node subscribed; every attach reads its position after
//! that subscription and after everything the channel delivered before the
//! attach joined; and answers come in the order their scripts ran, so
//! their positions never go back.

use std::sync::Arc;

use crossbeam_channel::Receiver;
use myriad_protocol::position::{Epoch, Position};
use proptest::prelude::*;

use super::{Router, RECENT_LIMIT};
use crate::engine::{Attach, Attachment, ConnRequest, EngineError};
use crate::hub::{Event, Wakeups};
use crate::publication::Publication;

const SUBJECT: &str = "s";
const EPOCH: Epoch = Epoch(7);

fn at(offset: u64) -> Position {
    Position::new(EPOCH, offset)
}

fn publication(offset: u64) -> Arc<Publication> {
    Arc::new(Publication::new(Arc::from(SUBJECT), at(offset), "1", 0))
}

/// What a worker found in its mailbox, reduced to what the switch decides.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Attached {
        token: u64,
        position: u64,
        recovered: Option<bool>,
        replay: Vec<u64>,
    },
    Refused {
        token: u64,
        error: EngineError,
    },
    Publication(u64),
    Broken(u64),
}

/// One attach on its way: what the router must get back with its answer.
struct Pending {
    attach: Attach,
    life: u64,
}

/// A router over a hub of `workers`, with their mailboxes read back as
/// [`Seen`] lists.
struct Bench {
    router: Router,
    mailboxes: Vec<Receiver<Event>>,
    seen: Vec<Vec<Seen>>,
    tokens: u64,
    _polls: Vec<mio::Poll>,
}

impl Bench {
    fn new(workers: usize) -> Bench {
        let (hub, mailboxes, polls) = crate::hub::test_hub(workers, usize::MAX);
        Bench {
            router: Router::new(hub),
            mailboxes,
            seen: vec![Vec::new(); workers],
            tokens: 0,
            _polls: polls,
        }
    }

    /// A subscriber on `worker` joins, recovering from `since` if given.
    fn join(&mut self, worker: usize, since: Option<u64>) -> Pending {
        self.tokens += 1;
        let subject: Arc<str> = Arc::from(SUBJECT);
        let life = self.router.join(&subject, worker);
        let attach = Attach {
            subject,
            since: since.map(at),
            max_replay_bytes: usize::MAX,
            to: ConnRequest {
                worker,
                conn: self.tokens as u32,
                life: 0,
                request: None,
            },
            token: self.tokens,
            can_wait: false,
            join: None,
        };
        Pending { attach, life }
    }

    /// The channel carries the publication at `offset`.
    fn deliver(&self, offset: u64) {
        let mut wakeups = Wakeups::default();
        self.router.deliver(
            SUBJECT,
            |name| Some(Publication::new(Arc::clone(name), at(offset), "1", 0)),
            &mut wakeups,
        );
        self.router.hub().wake(wakeups);
    }

    /// A subscriber on `worker` whose answer, read at `position`, comes
    /// back at once: the subject's stream is live from there.
    fn live(&mut self, worker: usize, position: u64) {
        let pending = self.join(worker, None);
        self.answer(pending, position);
    }

    /// The node lost the subject's Redis connection.
    fn reset(&self) {
        let mut wakeups = Wakeups::default();
        self.router
            .reset(|_| true, &EngineError::RedisUnavailable, &mut wakeups);
        self.router.hub().wake(wakeups);
    }

    /// Redis answers `pending`, read at `position`: with its `since`, the
    /// history after it up to `position` (Redis keeps all of it here).
    fn answer(&self, pending: Pending, position: u64) {
        let attachment = match pending.attach.since {
            Some(since) => Attachment {
                position: at(position),
                recovered: Some(true),
                replay: (since.offset + 1..=position).map(publication).collect(),
            },
            None => Attachment {
                position: at(position),
                recovered: None,
                replay: Vec::new(),
            },
        };
        self.finish(pending, Ok(attachment));
    }

    fn finish(&self, pending: Pending, outcome: Result<Attachment, EngineError>) {
        let mut wakeups = Wakeups::default();
        self.router
            .answered(pending.attach, pending.life, outcome, &mut wakeups);
        self.router.hub().wake(wakeups);
    }

    /// Everything worker `worker` has received so far.
    fn seen(&mut self, worker: usize) -> &[Seen] {
        let seen = &mut self.seen[worker];
        for event in self.mailboxes[worker].try_iter() {
            seen.push(match event {
                Event::Publication(p) => Seen::Publication(p.position.offset),
                Event::Attached(a) => match a.outcome {
                    Ok(attachment) => Seen::Attached {
                        token: a.token,
                        position: attachment.position.offset,
                        recovered: attachment.recovered,
                        replay: attachment
                            .replay
                            .iter()
                            .map(|p| p.position.offset)
                            .collect(),
                    },
                    Err(error) => Seen::Refused {
                        token: a.token,
                        error,
                    },
                },
                Event::Broken(b) => Seen::Broken(b.position.offset),
                other => panic!("not a switch event: {other:?}"),
            });
        }
        seen
    }

    /// The answer to attach `token` on `worker`, and the offsets its
    /// subscriber receives after it: its replay, then the publications its
    /// worker takes behind the answer.
    fn stream(&mut self, worker: usize, token: u64) -> (u64, Option<bool>, Vec<u64>) {
        let seen = self.seen(worker);
        let at = seen
            .iter()
            .position(|s| matches!(s, Seen::Attached { token: t, .. } if *t == token))
            .unwrap_or_else(|| panic!("attach {token} unanswered on worker {worker}: {seen:?}"));
        let Seen::Attached {
            position,
            recovered,
            replay,
            ..
        } = &seen[at]
        else {
            unreachable!()
        };
        let mut offsets = replay.clone();
        offsets.extend(seen[at + 1..].iter().filter_map(|s| match s {
            Seen::Publication(offset) => Some(*offset),
            _ => None,
        }));
        (*position, *recovered, offsets)
    }

    /// Whether the router still keeps switching state for the subject.
    fn switching(&self) -> bool {
        self.router
            .lock(SUBJECT)
            .get(SUBJECT)
            .is_some_and(|s| s.switching.is_some())
    }
}

fn range(from: u64, to: u64) -> Vec<u64> {
    (from..=to).collect()
}

#[test]
fn publications_before_the_first_answer_wait_for_it() {
    let mut b = Bench::new(1);
    let first = b.join(0, None);
    // Published after the subscription, before and after the read at 3.
    for offset in 2..=5 {
        b.deliver(offset);
    }
    assert!(b.seen(0).is_empty(), "nobody to hand them to yet");
    b.answer(first, 3);
    b.deliver(6);
    assert_eq!(
        b.seen(0),
        [
            Seen::Attached {
                token: 1,
                position: 3,
                recovered: None,
                replay: vec![]
            },
            Seen::Publication(4),
            Seen::Publication(5),
            Seen::Publication(6),
        ]
    );
    assert!(!b.switching(), "nothing in flight, nothing kept");
}

#[test]
fn a_first_answer_ahead_of_the_channel_skips_what_it_already_covers() {
    let mut b = Bench::new(1);
    let first = b.join(0, Some(0));
    b.deliver(1);
    b.answer(first, 4);
    for offset in 2..=6 {
        b.deliver(offset);
    }
    assert_eq!(b.stream(0, 1), (4, Some(true), range(1, 6)));
}

#[test]
fn an_answer_ahead_of_live_delivery_waits_for_its_position() {
    let mut b = Bench::new(2);
    b.live(0, 0);
    b.deliver(1);
    let second = b.join(1, None);
    b.deliver(2);
    // Read at 4 while the channel has only brought 2: placing it now would
    // hand the worker 3 and 4 after an answer that already covers them.
    b.answer(second, 4);
    assert!(
        b.seen(1)
            .iter()
            .all(|s| !matches!(s, Seen::Attached { .. })),
        "placed before its position was handed out"
    );
    b.deliver(3);
    b.deliver(4);
    b.deliver(5);
    assert_eq!(
        b.seen(1)
            .iter()
            .skip_while(|s| !matches!(s, Seen::Attached { .. }))
            .cloned()
            .collect::<Vec<_>>(),
        [
            Seen::Attached {
                token: 2,
                position: 4,
                recovered: None,
                replay: vec![]
            },
            Seen::Publication(5),
        ],
        "placed right behind the publication at its position"
    );
    assert_eq!(b.stream(0, 1), (0, None, range(1, 5)));
    assert!(!b.switching());
}

#[test]
fn an_answer_at_the_live_position_is_placed_at_once() {
    let mut b = Bench::new(1);
    b.live(0, 2);
    b.deliver(3);
    let second = b.join(0, Some(1));
    b.answer(second, 3);
    assert_eq!(b.stream(0, 2), (3, Some(true), vec![2, 3]));
    b.deliver(4);
    assert_eq!(b.stream(0, 2), (3, Some(true), vec![2, 3, 4]));
}

#[test]
fn an_answer_behind_live_delivery_brings_what_was_handed_out_since() {
    let mut b = Bench::new(2);
    b.live(0, 0);
    b.deliver(1);
    let plain = b.join(1, None);
    let recovering = b.join(1, Some(0));
    // Both read at 2; the channel has brought 5 by the time they answer.
    for offset in 2..=5 {
        b.deliver(offset);
    }
    b.answer(plain, 2);
    b.answer(recovering, 2);
    b.deliver(6);
    assert_eq!(b.stream(1, 2), (2, None, range(3, 6)));
    assert_eq!(b.stream(1, 3), (2, Some(true), range(1, 6)));
    assert_eq!(b.stream(0, 1), (0, None, range(1, 6)));
}

#[test]
fn a_duplicate_or_older_publication_is_dropped() {
    let mut b = Bench::new(1);
    b.live(0, 3);
    b.deliver(2);
    b.deliver(3);
    b.deliver(4);
    b.deliver(4);
    b.deliver(5);
    assert_eq!(b.stream(0, 1), (3, None, vec![4, 5]));
}

#[test]
fn a_recovery_past_what_recent_kept_is_refused() {
    let mut b = Bench::new(1);
    b.live(0, 0);
    let late = b.join(0, Some(0));
    let newest = RECENT_LIMIT as u64 + 10;
    for offset in 1..=newest {
        b.deliver(offset);
    }
    b.answer(late, 1);
    // `recent` lost the oldest publications after 1: it cannot say the
    // recovery is complete, and starts the subscriber at the newest.
    assert_eq!(b.stream(0, 2), (newest, Some(false), vec![]));
}

#[test]
fn a_replay_larger_than_the_connection_takes_is_refused() {
    let mut b = Bench::new(1);
    let mut pending = b.join(0, Some(0));
    pending.attach.max_replay_bytes = publication(1).held_bytes() * 2;
    b.answer(pending, 3);
    assert_eq!(b.stream(0, 1), (3, Some(false), vec![]));
}

#[test]
fn a_failed_attach_is_passed_on_and_settles_the_switch() {
    let mut b = Bench::new(1);
    let pending = b.join(0, None);
    b.deliver(1);
    b.finish(pending, Err(EngineError::RedisTimeout));
    assert_eq!(
        b.seen(0),
        [Seen::Refused {
            token: 1,
            error: EngineError::RedisTimeout
        }]
    );
    assert!(!b.switching(), "the failed attach is no longer in flight");
}

#[test]
fn an_answer_from_an_earlier_life_goes_to_its_worker_unplaced() {
    let mut b = Bench::new(1);
    let stale = b.join(0, None);
    assert!(b.router.leave(SUBJECT, 0, true), "its only subscriber");
    let current = b.join(0, None);
    b.deliver(5);
    b.answer(stale, 9);
    // The worker drops it (it detached); the current life's switch has not
    // moved: its answer still starts the stream.
    assert!(matches!(b.seen(0), [Seen::Attached { token: 1, .. }]));
    b.answer(current, 4);
    assert_eq!(b.stream(0, 2), (4, None, vec![5]));
}

#[test]
fn a_lost_connection_refuses_waiting_answers_and_resumes_live_subscribers() {
    let mut b = Bench::new(2);
    b.live(0, 0);
    b.deliver(1);
    b.deliver(2);
    let waiting = b.join(1, None);
    b.answer(waiting, 4);
    b.reset();
    assert_eq!(
        b.seen(1),
        [Seen::Refused {
            token: 2,
            error: EngineError::RedisUnavailable
        }]
    );
    assert_eq!(b.router.resumes(|_| true), [(Arc::from(SUBJECT), at(2))]);
    // Subscribed again: the channel brings 6 and 7 before the catch-up
    // read (at 5) answers, and an attach answered meanwhile at 6 waits
    // behind the catch-up.
    let during = b.join(1, None);
    b.deliver(6);
    b.answer(during, 6);
    b.deliver(7);
    assert!(
        b.seen(0).iter().all(|s| *s != Seen::Publication(6)),
        "nothing handed out before the catch-up"
    );
    let caught_up = Attachment {
        position: at(5),
        recovered: Some(true),
        replay: (3..=5).map(publication).collect(),
    };
    let mut wakeups = Wakeups::default();
    b.router.resumed(SUBJECT, caught_up, &mut wakeups);
    b.router.hub().wake(wakeups);
    b.deliver(8);
    assert_eq!(b.stream(0, 1), (0, None, range(1, 8)));
    assert_eq!(b.stream(1, 3), (6, None, vec![7, 8]));
    assert!(b.router.resumes(|_| true).is_empty());
    assert!(!b.switching());
}

#[test]
fn a_catch_up_that_cannot_recover_breaks_the_stream_where_it_goes_on() {
    let mut b = Bench::new(1);
    b.live(0, 0);
    b.deliver(1);
    b.reset();
    b.deliver(10);
    let mut wakeups = Wakeups::default();
    let lost = Attachment {
        position: at(9),
        recovered: Some(false),
        replay: Vec::new(),
    };
    b.router.resumed(SUBJECT, lost, &mut wakeups);
    b.router.hub().wake(wakeups);
    assert_eq!(
        &b.seen(0)[1..],
        [Seen::Publication(1), Seen::Broken(9), Seen::Publication(10)]
    );
}

/// One attach of a generated schedule.
#[derive(Debug, Clone)]
struct Plan {
    /// Channel deliveries before it joins.
    joins_after: usize,
    /// Further deliveries before its answer comes.
    answers_after: usize,
    /// Picks its position among those its join allows.
    position: u64,
    /// Picks its `since`, when it recovers, among those up to its position.
    since: Option<u64>,
    worker: usize,
}

fn plans() -> impl Strategy<Value = Vec<Plan>> {
    let plan = (
        0..24usize,
        0..24usize,
        any::<u64>(),
        any::<Option<u64>>(),
        0..3usize,
    )
        .prop_map(
            |(joins_after, answers_after, position, since, worker)| Plan {
                joins_after,
                answers_after,
                position,
                since,
                worker,
            },
        );
    proptest::collection::vec(plan, 1..6)
}

proptest! {
    /// Every order of channel messages and attach answers that one Redis
    /// connection can produce gives each subscriber its exact stream.
    #[test]
    fn every_subscriber_gets_its_exact_stream(
        first in 1..4u64,
        count in 0..24usize,
        plans in plans(),
    ) {
        // The channel carries `first..=newest`; `first - 1` is where the
        // subject stood when the node subscribed.
        let newest = first - 1 + count as u64;
        let mut attaches: Vec<(Plan, u64, u64, usize)> = plans
            .into_iter()
            .map(|plan| {
                let joins_after = plan.joins_after.min(count);
                let floor = first - 1 + joins_after as u64;
                let position = floor + plan.position % (newest - floor + 1);
                let answers_after = (joins_after + plan.answers_after).min(count);
                (Plan { joins_after, ..plan }, position, 0, answers_after)
            })
            .collect();
        // Answers come in the order their scripts ran: by position.
        attaches.sort_by_key(|(_, position, _, answers_after)| (*position, *answers_after));
        let mut slot = 0;
        for (_, _, _, answers_after) in &mut attaches {
            slot = slot.max(*answers_after);
            *answers_after = slot;
        }
        let mut b = Bench::new(3);
        let mut pending: Vec<Option<Pending>> = attaches.iter().map(|_| None).collect();
        for step in 0..=count {
            for (i, (plan, position, token, _)) in attaches.iter_mut().enumerate() {
                if plan.joins_after == step {
                    let since = plan.since.map(|s| s % (*position + 1));
                    let p = b.join(plan.worker, since);
                    *token = p.attach.token;
                    pending[i] = Some(p);
                }
            }
            for (i, (_, position, _, answers_after)) in attaches.iter().enumerate() {
                if *answers_after == step {
                    b.answer(pending[i].take().expect("joined before answered"), *position);
                }
            }
            if step < count {
                b.deliver(first + step as u64);
            }
        }
        for (plan, position, token, _) in &attaches {
            let since = plan.since.map(|s| s % (position + 1));
            let (at, recovered, offsets) = b.stream(plan.worker, *token);
            prop_assert_eq!(at, *position, "attach {} placed at its own position", token);
            prop_assert_eq!(recovered, since.map(|_| true), "attach {}", token);
            let from = since.unwrap_or(*position) + 1;
            prop_assert_eq!(offsets, range(from, newest), "attach {} from {}", token, from);
        }
        prop_assert!(!b.switching(), "switching state outlives the attaches");
    }
}
