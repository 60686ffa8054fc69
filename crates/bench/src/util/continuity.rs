//! Per-subject continuity: whether one subscriber got every publication of
//! one subject exactly once, in offset order, across its reconnects.
//!
//! A [`Continuity`] follows one (subscriber, subject) pair from its first
//! `subscribed` reply on. Each delivery must carry the offset right after
//! the last one received, in the same epoch; each resubscribe with `since`
//! (the last position received) is answered with a position the stream must
//! continue from. The churn workload keeps one per subscription and counts
//! what each step was; at the end the coordinator compares where each one
//! stopped ([`Reached`]) with what the publishers published.
//!
//! Pure: no I/O, no clock, no bench state, so it is tested with literal
//! position sequences and against a model of a server that drops,
//! duplicates and fails to recover.

use myriad_protocol::position::{Epoch, Position};
use serde::{Deserialize, Serialize};

/// What one delivery was, against the last position received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The next offset; `replayed` when it belongs to a recovery's replay
    /// (at or before the position the resubscribe was answered with).
    Next {
        /// Part of a replay rather than live delivery.
        replayed: bool,
    },
    /// At or before the last offset received: a second copy.
    Duplicate,
    /// Past the next offset: `missed` publications were skipped. A delivery
    /// out of order shows as a gap, then as a duplicate when the skipped
    /// one arrives.
    Gap {
        /// Offsets skipped.
        missed: u64,
    },
    /// Another epoch: the stream was replaced under the subscriber (a
    /// restarted node, a forgotten subject), and what it missed cannot be
    /// counted. The new stream is followed from here.
    NewEpoch,
}

/// What the answer to a resubscribe with `since` means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumed {
    /// The server recovers: `replay` publications come before live ones.
    Recovered {
        /// Publications between `since` and the answer's position.
        replay: u64,
    },
    /// The server could not recover: the `missed` publications between
    /// `since` and the answer's position will never come.
    Unrecovered {
        /// Publications between `since` and the answer's position.
        missed: u64,
    },
    /// The answer is in another epoch, whatever it says about recovery:
    /// what was missed cannot be counted. The new stream is followed.
    NewEpoch,
}

/// One subscriber's view of one subject's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Continuity {
    /// Where it joined: the position of its first `subscribed` reply.
    first: Position,
    /// The last position received (or resubscribed at): the `since` of the
    /// next resubscribe.
    last: Position,
    /// Deliveries up to this offset are the replay of a recovery.
    replay_until: u64,
}

impl Continuity {
    /// A subscription whose first `subscribed` reply said `at`: delivery
    /// continues after it.
    pub fn joined(at: Position) -> Continuity {
        Continuity {
            first: at,
            last: at,
            replay_until: at.offset,
        }
    }

    /// The last position received: where a resubscribe asks to resume.
    pub fn last(&self) -> Position {
        self.last
    }

    /// Takes the answer to a resubscribe made with `since` = [`last`](Self::last).
    pub fn resume(&mut self, answer: Position, recovered: bool) -> Resumed {
        if answer.epoch != self.last.epoch {
            self.follow(answer);
            return Resumed::NewEpoch;
        }
        // An answer behind what was received cannot rewind the subscriber:
        // whatever comes again is a duplicate.
        let ahead = answer.offset.saturating_sub(self.last.offset);
        if recovered {
            self.replay_until = answer.offset;
            Resumed::Recovered { replay: ahead }
        } else {
            if ahead > 0 {
                self.follow(answer);
            }
            Resumed::Unrecovered { missed: ahead }
        }
    }

    /// Takes one delivery at `at`.
    pub fn deliver(&mut self, at: Position) -> Delivery {
        if at.epoch != self.last.epoch {
            self.follow(at);
            return Delivery::NewEpoch;
        }
        let next = self.last.offset + 1;
        if at.offset < next {
            return Delivery::Duplicate;
        }
        let replayed = at.offset <= self.replay_until;
        self.last = at;
        match at.offset - next {
            0 => Delivery::Next { replayed },
            missed => Delivery::Gap { missed },
        }
    }

    /// Goes on from `at`, with nothing of a replay pending.
    fn follow(&mut self, at: Position) {
        self.last = at;
        self.replay_until = at.offset;
    }

    /// Where this subscription of subject number `subject` stands, for the
    /// end-of-run check.
    pub fn reached(&self, subject: u64) -> Reached {
        Reached {
            subject,
            first_epoch: self.first.epoch.0,
            first_offset: self.first.offset,
            last_epoch: self.last.epoch.0,
            last_offset: self.last.offset,
        }
    }
}

/// Where one subscription joined its subject's stream and where it stopped:
/// what a worker ships to the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reached {
    /// The subject's index in the run's pattern.
    pub subject: u64,
    /// Epoch it joined in.
    pub first_epoch: u64,
    /// Offset it joined at.
    pub first_offset: u64,
    /// Epoch of the last position received.
    pub last_epoch: u64,
    /// Offset of the last position received.
    pub last_offset: u64,
}

impl Reached {
    /// The publications it never received at the end, when `published` were
    /// published to its subject after it joined (all subscribers join before
    /// publishing starts). None when its stream changed epoch on the way:
    /// offsets of two epochs do not compare.
    pub fn shortfall(&self, published: u64) -> Option<u64> {
        (self.first_epoch == self.last_epoch)
            .then(|| (self.first_offset + published).saturating_sub(self.last_offset))
    }

    /// The last position received.
    pub fn last(&self) -> Position {
        Position::new(Epoch(self.last_epoch), self.last_offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const E: Epoch = Epoch(0xab);

    fn at(offset: u64) -> Position {
        Position::new(E, offset)
    }

    #[test]
    fn in_order_deliveries_are_next() {
        let mut c = Continuity::joined(at(7));
        assert_eq!(c.deliver(at(8)), Delivery::Next { replayed: false });
        assert_eq!(c.deliver(at(9)), Delivery::Next { replayed: false });
        assert_eq!(c.last(), at(9));
        assert_eq!(c.reached(3).shortfall(2), Some(0));
        assert_eq!(c.reached(3).shortfall(5), Some(3), "10, 11, 12 never came");
    }

    #[test]
    fn duplicates_gaps_and_reordering() {
        let mut c = Continuity::joined(at(0));
        assert_eq!(c.deliver(at(1)), Delivery::Next { replayed: false });
        assert_eq!(c.deliver(at(1)), Delivery::Duplicate);
        assert_eq!(c.deliver(at(0)), Delivery::Duplicate, "before the join");
        assert_eq!(c.deliver(at(4)), Delivery::Gap { missed: 2 });
        // 6 before 5: a gap of one, then 5 is behind the last.
        assert_eq!(c.deliver(at(6)), Delivery::Gap { missed: 1 });
        assert_eq!(c.deliver(at(5)), Delivery::Duplicate);
        assert_eq!(c.deliver(at(7)), Delivery::Next { replayed: false });
    }

    #[test]
    fn a_recovery_replays_then_goes_live() {
        let mut c = Continuity::joined(at(10));
        assert_eq!(c.deliver(at(11)), Delivery::Next { replayed: false });
        // Reconnected; 12 and 13 were published meanwhile.
        assert_eq!(c.resume(at(13), true), Resumed::Recovered { replay: 2 });
        assert_eq!(c.deliver(at(12)), Delivery::Next { replayed: true });
        assert_eq!(c.deliver(at(13)), Delivery::Next { replayed: true });
        assert_eq!(c.deliver(at(14)), Delivery::Next { replayed: false });
        // A replay that leaves one out is a gap.
        assert_eq!(c.resume(at(17), true), Resumed::Recovered { replay: 3 });
        assert_eq!(c.deliver(at(16)), Delivery::Gap { missed: 1 });
        assert_eq!(c.deliver(at(17)), Delivery::Next { replayed: true });
        // Nothing published while away: an empty replay.
        assert_eq!(c.resume(at(17), true), Resumed::Recovered { replay: 0 });
        assert_eq!(c.deliver(at(18)), Delivery::Next { replayed: false });
    }

    #[test]
    fn a_failed_recovery_counts_what_it_skips_and_moves_on() {
        let mut c = Continuity::joined(at(0));
        assert_eq!(c.resume(at(5), false), Resumed::Unrecovered { missed: 5 });
        assert_eq!(c.last(), at(5));
        assert_eq!(c.deliver(at(6)), Delivery::Next { replayed: false });
        assert_eq!(c.reached(0).shortfall(6), Some(0), "1-5 are counted above");
        // An answer behind what was received does not rewind the check.
        assert_eq!(c.resume(at(2), true), Resumed::Recovered { replay: 0 });
        assert_eq!(c.deliver(at(3)), Delivery::Duplicate);
        assert_eq!(c.resume(at(4), false), Resumed::Unrecovered { missed: 0 });
        assert_eq!(c.deliver(at(7)), Delivery::Next { replayed: false });
    }

    #[test]
    fn another_epoch_cannot_be_counted() {
        let other = Epoch(0xcd);
        let mut c = Continuity::joined(at(3));
        assert_eq!(c.resume(Position::new(other, 1), false), Resumed::NewEpoch);
        assert_eq!(
            c.deliver(Position::new(other, 2)),
            Delivery::Next { replayed: false },
            "the new stream is followed"
        );
        assert_eq!(c.deliver(at(4)), Delivery::NewEpoch);
        assert_eq!(
            c.reached(0).shortfall(1),
            Some(0),
            "back in the first epoch"
        );
        assert_eq!(c.deliver(Position::new(other, 3)), Delivery::NewEpoch);
        let r = c.reached(9);
        assert_eq!((r.subject, r.shortfall(100)), (9, None));
        assert_eq!(r.last(), Position::new(other, 3));
    }

    /// What a model server does for one publication while it is in flight
    /// to a connected subscriber.
    #[derive(Debug, Clone, Copy)]
    enum Fate {
        Delivered,
        Dropped,
        Doubled,
    }

    /// One step of the model: a publish (with its fate when the subscriber
    /// is connected), or a reconnect after which the server recovers or not.
    #[derive(Debug, Clone, Copy)]
    enum Step {
        Publish(Fate),
        Disconnect,
        Reconnect { recovers: bool },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            8 => Just(Step::Publish(Fate::Delivered)),
            1 => Just(Step::Publish(Fate::Dropped)),
            1 => Just(Step::Publish(Fate::Doubled)),
            1 => Just(Step::Disconnect),
            2 => any::<bool>().prop_map(|recovers| Step::Reconnect { recovers }),
        ]
    }

    /// What the subscriber saw, by kind.
    #[derive(Default)]
    struct Tally {
        received: u64,
        missed: u64,
        duplicates: u64,
    }

    impl Tally {
        fn add(&mut self, d: Delivery) {
            match d {
                Delivery::Next { .. } => self.received += 1,
                Delivery::Gap { missed } => {
                    self.received += 1;
                    self.missed += missed;
                }
                Delivery::Duplicate => self.duplicates += 1,
                Delivery::NewEpoch => unreachable!("one epoch in this model"),
            }
        }
    }

    proptest! {
        /// Against a server that drops, doubles and fails to recover at
        /// random, every offset is accounted for exactly once: received,
        /// or reported missed (in a gap, a failed recovery, or short at the
        /// end); and every extra copy is reported as a duplicate.
        #[test]
        fn every_offset_is_received_or_reported_missed(
            start in 0u64..1_000,
            steps in proptest::collection::vec(step(), 0..200),
        ) {
            let mut c = Continuity::joined(at(start));
            let mut head = start;
            let mut connected = true;
            let mut seen = Tally::default();
            let mut doubled = 0;
            for s in steps {
                match s {
                    Step::Publish(fate) => {
                        head += 1;
                        match (connected, fate) {
                            (false, _) | (true, Fate::Dropped) => {}
                            (true, Fate::Delivered) => seen.add(c.deliver(at(head))),
                            (true, Fate::Doubled) => {
                                doubled += 1;
                                seen.add(c.deliver(at(head)));
                                seen.add(c.deliver(at(head)));
                            }
                        }
                    }
                    Step::Disconnect => connected = false,
                    // Also while connected: the socket is closed and opened again.
                    Step::Reconnect { recovers } => {
                        connected = true;
                        let since = c.last().offset;
                        match c.resume(at(head), recovers) {
                            Resumed::Recovered { replay } => {
                                prop_assert!(recovers);
                                prop_assert_eq!(replay, head - since);
                                for o in since + 1..=head {
                                    let d = c.deliver(at(o));
                                    prop_assert_eq!(d, Delivery::Next { replayed: true });
                                    seen.add(d);
                                }
                            }
                            Resumed::Unrecovered { missed } => {
                                prop_assert!(!recovers);
                                prop_assert_eq!(missed, head - since);
                                seen.missed += missed;
                            }
                            Resumed::NewEpoch => prop_assert!(false, "one epoch"),
                        }
                    }
                }
            }
            let short = c.reached(0).shortfall(head - start).unwrap();
            prop_assert_eq!(seen.received + seen.missed + short, head - start, "each offset once");
            prop_assert_eq!(seen.duplicates, doubled);
        }
    }
}
