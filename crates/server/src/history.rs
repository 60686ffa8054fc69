//! One subject's history: the publications kept so that a client that lost
//! its connection can get what it missed, and the rules for recovering.
//!
//! Pure bookkeeping with the time passed in, so it is tested against a plain
//! model (`tests::matches_a_model`). The engine that owns the histories
//! decides when to call what: it trims to the subject's policy on every
//! append, expires by age when it touches a subject and on a periodic sweep,
//! and evicts the node's oldest messages when the shared memory budget is
//! spent. Every removal reports the bytes it freed so the owner can keep
//! that budget exact, a kept publication's compressed frame included
//! (charged when both kept and made, see `publication`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use myriad_protocol::position::Position;

use crate::publication::Publication;

/// How much history a subject keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryPolicy {
    /// Publications kept at most; 0 turns history off.
    pub size: usize,
    /// How long a publication is kept; zero keeps it until pushed out by
    /// size or by the node's memory budget.
    pub ttl: Duration,
}

impl HistoryPolicy {
    pub fn is_on(&self) -> bool {
        self.size > 0
    }

    fn ttl_ms(&self) -> u64 {
        self.ttl.as_millis() as u64
    }
}

/// What a recovery from `since` found.
#[derive(Debug, Clone)]
pub enum Recovery {
    /// Everything after `since` is here (possibly nothing).
    Complete(Vec<Arc<Publication>>),
    /// The epoch differs, or history no longer reaches back to `since`.
    Incomplete,
}

/// Two recoveries are equal when they found the same positions.
impl PartialEq for Recovery {
    fn eq(&self, other: &Recovery) -> bool {
        let positions = |list: &[Arc<Publication>]| -> Vec<Position> {
            list.iter().map(|p| p.position).collect()
        };
        match (self, other) {
            (Recovery::Complete(a), Recovery::Complete(b)) => positions(a) == positions(b),
            (Recovery::Incomplete, Recovery::Incomplete) => true,
            _ => false,
        }
    }
}

/// One kept publication with what trimming needs to know of it, kept
/// beside the pointer: a node holding hundreds of megabytes of history
/// would otherwise take a cache miss on every publish, reading the age and
/// size of a cold publication before dropping it.
#[derive(Debug)]
struct Slot {
    /// Node-wide store order (the memory budget evicts by it).
    order: u64,
    published_ms: u64,
    /// [`kept_bytes`] of it, fixed; its compressed frame's bytes, made at
    /// any time, are asked of the publication as it leaves.
    bytes: usize,
    publication: Arc<Publication>,
}

/// What keeping `publication` in history costs: the publication and its
/// slot, without its compressed frame (charged apart, as it is made).
pub fn kept_bytes(publication: &Publication) -> usize {
    publication.held_bytes() + std::mem::size_of::<Slot>()
}

/// A subject's kept publications, oldest first.
#[derive(Debug, Default)]
pub struct SubjectHistory {
    items: VecDeque<Slot>,
    /// The slots' [`kept_bytes`].
    bytes: usize,
}

impl SubjectHistory {
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The bytes of its queue's buffer, every slot used or not (a queue
    /// keeps its capacity once grown): what the history's own structure
    /// costs beside its publications and itself.
    pub fn queue_bytes(&self) -> usize {
        self.items.capacity() * std::mem::size_of::<Slot>()
    }

    /// Node-wide store order of the oldest kept publication.
    pub fn oldest_order(&self) -> Option<u64> {
        self.items.front().map(|slot| slot.order)
    }

    /// Keeps `publication` (stored `order`-th on the node), then trims to
    /// `policy.size`. Returns the bytes it added (with its compressed
    /// frame, if already made) and those trimmed.
    pub fn append(
        &mut self,
        order: u64,
        publication: Arc<Publication>,
        policy: &HistoryPolicy,
    ) -> (usize, Freed) {
        debug_assert!(policy.is_on());
        let bytes = kept_bytes(&publication);
        let added = bytes + publication.keep();
        self.bytes += bytes;
        self.items.push_back(Slot {
            order,
            published_ms: publication.published_ms,
            bytes,
            publication,
        });
        let mut freed = Freed::default();
        while self.items.len() > policy.size {
            freed += self.pop_oldest();
        }
        (added, freed)
    }

    /// Drops publications older than the policy's age limit at `now_ms`.
    pub fn expire(&mut self, now_ms: u64, policy: &HistoryPolicy) -> Freed {
        let mut freed = Freed::default();
        let ttl = policy.ttl_ms();
        if ttl == 0 {
            return freed;
        }
        while let Some(oldest) = self.items.front() {
            if now_ms.saturating_sub(oldest.published_ms) < ttl {
                break;
            }
            freed += self.pop_oldest();
        }
        freed
    }

    /// Drops the oldest publication (memory budget eviction).
    pub fn pop_oldest(&mut self) -> Freed {
        match self.items.pop_front() {
            Some(slot) => {
                self.bytes -= slot.bytes;
                Freed {
                    messages: 1,
                    bytes: slot.bytes + slot.publication.leave(),
                }
            }
            None => Freed::default(),
        }
    }

    /// The publications after `since` (at most `limit`), given the
    /// subject's `current` position: complete only when the epoch matches and
    /// every offset from `since.offset + 1` to `current.offset` is still kept.
    pub fn recover(&self, since: Position, current: Position, limit: usize) -> Recovery {
        if since.epoch != current.epoch || since.offset > current.offset {
            return Recovery::Incomplete;
        }
        if since.offset == current.offset {
            return Recovery::Complete(Vec::new());
        }
        match self.items.front() {
            Some(oldest) if oldest.publication.position.offset <= since.offset + 1 => {
                Recovery::Complete(self.after(since.offset, limit))
            }
            _ => Recovery::Incomplete,
        }
    }

    /// Up to `limit` publications with offsets above `offset`, oldest first.
    pub fn after(&self, offset: u64, limit: usize) -> Vec<Arc<Publication>> {
        let start = self
            .items
            .partition_point(|slot| slot.publication.position.offset <= offset);
        self.items
            .range(start..)
            .take(limit)
            .map(|slot| Arc::clone(&slot.publication))
            .collect()
    }

    /// The last `limit` publications, oldest first.
    pub fn last(&self, limit: usize) -> Vec<Arc<Publication>> {
        let start = self.items.len().saturating_sub(limit);
        self.items
            .range(start..)
            .map(|slot| Arc::clone(&slot.publication))
            .collect()
    }
}

/// What a removal from history freed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Freed {
    pub messages: usize,
    pub bytes: usize,
}

impl std::ops::AddAssign for Freed {
    fn add_assign(&mut self, other: Freed) {
        self.messages += other.messages;
        self.bytes += other.bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use myriad_protocol::position::Epoch;
    use proptest::prelude::*;

    const EPOCH: Epoch = Epoch(9);

    fn publication(offset: u64, at_ms: u64) -> Arc<Publication> {
        Arc::new(Publication::new(
            Arc::from("s"),
            Position::new(EPOCH, offset),
            &offset.to_string(),
            at_ms,
        ))
    }

    fn offsets(list: &[Arc<Publication>]) -> Vec<u64> {
        list.iter().map(|p| p.position.offset).collect()
    }

    #[test]
    fn recovery_needs_the_same_epoch_and_an_unbroken_tail() {
        let policy = HistoryPolicy {
            size: 3,
            ttl: Duration::ZERO,
        };
        let mut h = SubjectHistory::default();
        for offset in 1..=5 {
            h.append(offset, publication(offset, 0), &policy);
        }
        let current = Position::new(EPOCH, 5);
        let at = |offset| Position::new(EPOCH, offset);
        assert_eq!(offsets(&h.last(10)), [3, 4, 5]);
        match h.recover(at(2), current, usize::MAX) {
            Recovery::Complete(list) => assert_eq!(offsets(&list), [3, 4, 5]),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            h.recover(at(5), current, usize::MAX),
            Recovery::Complete(vec![])
        );
        assert_eq!(
            h.recover(at(1), current, usize::MAX),
            Recovery::Incomplete,
            "4 of 5 kept"
        );
        assert_eq!(
            h.recover(at(6), current, usize::MAX),
            Recovery::Incomplete,
            "ahead"
        );
        let other = Position::new(Epoch(8), 4);
        assert_eq!(
            h.recover(other, current, usize::MAX),
            Recovery::Incomplete,
            "epoch"
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Publish { after_ms: u64 },
        Expire { after_ms: u64 },
        Evict,
        Recover { back: u64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u64..40).prop_map(|after_ms| Op::Publish { after_ms }),
            1 => (0u64..100).prop_map(|after_ms| Op::Expire { after_ms }),
            1 => Just(Op::Evict),
            2 => (0u64..12).prop_map(|back| Op::Recover { back }),
        ]
    }

    proptest! {
        /// Any sequence of publishes, expiries, evictions and recoveries
        /// agrees with a model that keeps every publication and filters.
        #[test]
        fn matches_a_model(
            size in 1usize..8,
            ttl_ms in prop_oneof![Just(0u64), 1u64..120],
            ops in proptest::collection::vec(op(), 0..200),
        ) {
            let policy = HistoryPolicy { size, ttl: Duration::from_millis(ttl_ms) };
            let mut h = SubjectHistory::default();
            // The model: every offset published with its time, and the
            // lowest offset still allowed by evictions and expiries.
            let mut published: Vec<u64> = Vec::new(); // times, index = offset - 1
            let mut floor = 1u64; // lowest offset not yet removed
            let mut now = 0u64;
            let mut bytes = 0usize;
            for op in ops {
                match op {
                    Op::Publish { after_ms } => {
                        now += after_ms;
                        let offset = published.len() as u64 + 1;
                        published.push(now);
                        let p = publication(offset, now);
                        let (added, freed) = h.append(offset, p, &policy);
                        bytes += added;
                        bytes -= freed.bytes;
                        floor = floor.max((offset + 1).saturating_sub(size as u64));
                    }
                    Op::Expire { after_ms } => {
                        now += after_ms;
                        bytes -= h.expire(now, &policy).bytes;
                        if ttl_ms > 0 {
                            while floor <= published.len() as u64
                                && now - published[floor as usize - 1] >= ttl_ms
                            {
                                floor += 1;
                            }
                        }
                    }
                    Op::Evict => {
                        let freed = h.pop_oldest();
                        bytes -= freed.bytes;
                        if floor <= published.len() as u64 {
                            prop_assert_eq!(freed.messages, 1);
                            floor += 1;
                        } else {
                            prop_assert_eq!(freed.messages, 0);
                        }
                    }
                    Op::Recover { back } => {
                        let last = published.len() as u64;
                        let since = last.saturating_sub(back);
                        let got = h.recover(Position::new(EPOCH, since), Position::new(EPOCH, last), usize::MAX);
                        if since == last || floor <= since + 1 {
                            let want: Vec<u64> = (since + 1..=last).collect();
                            match got {
                                Recovery::Complete(list) => prop_assert_eq!(offsets(&list), want),
                                other => prop_assert!(false, "{:?}", other),
                            }
                        } else {
                            prop_assert_eq!(got, Recovery::Incomplete);
                        }
                    }
                }
                let kept: Vec<u64> = (floor..=published.len() as u64).collect();
                prop_assert_eq!(offsets(&h.last(usize::MAX)), kept.clone());
                prop_assert_eq!(h.items.len(), kept.len());
                prop_assert_eq!(h.bytes, bytes);
                prop_assert_eq!(h.oldest_order(), kept.first().copied());
            }
        }
    }
}
