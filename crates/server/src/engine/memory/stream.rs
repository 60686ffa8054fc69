//! One subject's [`Stream`] in the memory engine (its position, history,
//! route and what keeping it charges to the history budget) and the
//! [`Shard`] of streams one lock covers, with the indexes by which the
//! budget finds the shard's oldest publication and oldest idle position.
//!
//! Plain data under the shard's lock: the engine (`memory.rs`) locks,
//! changes and accounts; nothing here locks, sends or counts node totals.

use std::collections::{BTreeMap, BTreeSet};
use std::mem::size_of;
use std::sync::Arc;
use std::time::Duration;

use foldhash::fast::RandomState;
use hashbrown::HashMap;
use myriad_protocol::position::{Epoch, Position};

use crate::heap::{self, allocation};
use crate::history::{HistoryPolicy, Recovery, SubjectHistory};
use crate::hub::Route;
use crate::namespace::NamespaceId;

/// How long a subject with history but no age limit keeps its position once
/// it has neither subscribers nor publications held.
pub(super) const IDLE_POSITION_RETENTION: Duration = Duration::from_secs(3600);

/// One subject's stream on this node: 48 bytes, paid per subject (with
/// one subscriber per subject, per connection), so the policy is a
/// namespace id and the time is in seconds.
#[derive(Debug)]
pub(super) struct Stream {
    pub(super) epoch: Epoch,
    /// Offset of the last publication; 0 before the first.
    pub(super) offset: u64,
    /// Present while the subject holds history.
    pub(super) history: Option<Box<SubjectHistory>>,
    /// The workers holding its subscribers.
    pub(super) route: Route,
    /// Last publish, last subscriber leaving, or history running empty:
    /// seconds on the engine's clock.
    pub(super) last_active_s: u32,
    pub(super) namespace: NamespaceId,
}

impl Stream {
    /// Kept with neither subscribers nor history: only its position is left.
    pub(super) fn idle(&self) -> bool {
        self.route.subscribers() == 0 && self.history.is_none()
    }

    /// What keeping this stream, named `name`, charges to the history
    /// budget beside its publications (see the module header).
    pub(super) fn charge(&self, name: &str) -> usize {
        let unpaid = if self.route.subscribers() == 0 {
            stream_bytes(name)
        } else {
            0
        };
        let idle = if self.idle() { IDLE_ENTRY_BYTES } else { 0 };
        let history = self.history.as_deref().map_or(0, |h| {
            allocation(size_of::<SubjectHistory>())
                + allocation(h.queue_bytes())
                + OLDEST_ENTRY_BYTES
        });
        unpaid + idle + history
    }

    pub(super) fn position(&self) -> Position {
        Position::new(self.epoch, self.offset)
    }

    /// What a recovery from `since` finds now, at most `limit` publications.
    pub(super) fn recover(&self, since: Position, limit: usize) -> Recovery {
        let position = self.position();
        match self.history.as_deref() {
            Some(history) => history.recover(since, position, limit),
            None if since == position => Recovery::Complete(Vec::new()),
            None => Recovery::Incomplete,
        }
    }

    pub(super) fn oldest_order(&self) -> Option<u64> {
        self.history.as_ref().and_then(|h| h.oldest_order())
    }

    /// Neither subscribers nor history, for long enough that a client
    /// returning with this position would have nothing to recover anyway:
    /// without history at once, with history after its age limit (or
    /// [`IDLE_POSITION_RETENTION`]). Until then a subscriber that saw nothing
    /// and comes back still recovers, in the same epoch.
    pub(super) fn forgettable(&self, policy: HistoryPolicy, now_ms: u64) -> bool {
        let interested = self.route.subscribers() > 0;
        if interested || self.history.as_ref().is_some_and(|h| !h.is_empty()) {
            return false;
        }
        let retention = match policy {
            p if !p.is_on() => Duration::ZERO,
            p if p.ttl.is_zero() => IDLE_POSITION_RETENTION,
            p => p.ttl,
        };
        let idle_ms = now_ms.saturating_sub(u64::from(self.last_active_s) * 1_000);
        idle_ms >= retention.as_millis() as u64
    }
}

/// What a stream named `name` costs in its shard's map.
pub(super) fn stream_bytes(name: &str) -> usize {
    heap::named_entry_bytes::<Stream>(name)
}

/// An idle position's entry in its shard's `idle` index.
pub(super) const IDLE_ENTRY_BYTES: usize = heap::btree_entry_bytes::<(u32, Arc<str>)>();

/// A subject's entry in its shard's `oldest` index, while it holds history.
pub(super) const OLDEST_ENTRY_BYTES: usize = heap::btree_entry_bytes::<(u64, Arc<str>)>();

#[derive(Default)]
pub(super) struct Shard {
    pub(super) streams: HashMap<Arc<str>, Stream, RandomState>,
    /// Subjects holding history, by the store order of their oldest
    /// publication (unique per publication): the first entry is this
    /// shard's oldest publication.
    pub(super) oldest: BTreeMap<u64, Arc<str>>,
    /// Idle positions ([`Stream::idle`]) by when they went idle (their
    /// `last_active_s`, which does not change while they stay idle), then
    /// name: the first entry is this shard's oldest.
    pub(super) idle: BTreeSet<(u32, Arc<str>)>,
}

impl Shard {
    pub(super) fn first_oldest(&self) -> u64 {
        self.oldest
            .first_key_value()
            .map_or(u64::MAX, |(order, _)| *order)
    }

    pub(super) fn first_idle(&self) -> u64 {
        self.idle
            .first()
            .map_or(u64::MAX, |(since, _)| u64::from(*since))
    }
}
