//! The single-node engine: positions and history in this process's memory.
//!
//! Streams (a subject's position, history and [`Route`] to the workers
//! holding its subscribers) sit in [`SHARDS`] locked shards: one map entry
//! per subject, one lock per publish. A publish locks its subject's shard,
//! takes the next offset, stores the publication in history and delivers it
//! along the route before unlocking; an attach locks the same shard to read
//! position and history and to join the route. Doing both under the
//! stream's lock is what makes attach the exact switch from history to live
//! (contract clause 3): no publication can get an offset between the two.
//!
//! History shares one byte budget across the node. Every stored publication
//! gets a node-wide store order; each shard keeps an ordered index of its
//! subjects by their oldest publication, and publishes its minimum in an
//! atomic, so evicting "the oldest publication on the node" reads 64
//! atomics and locks one shard. Eviction runs after the publishing shard is
//! unlocked, so no thread ever holds two stream shards. Age limits are
//! applied whenever a subject is touched and by a once-a-second sweep on
//! its own thread, so idle subjects free their memory too.

use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use foldhash::fast::RandomState;
use hashbrown::HashMap;
use myriad_protocol::position::{Epoch, Position};

use super::{
    Attach, Attached, Attachment, Engine, EngineError, EngineStats, HistoryPage, HistoryQuery,
    HistoryStats, Published, Reply,
};
use crate::history::{Freed, HistoryPolicy, Recovery, SubjectHistory};
use crate::hub::{Event, Hub, Route, Wakeups};
use crate::namespace::{NamespaceId, Namespaces};
use crate::publication::Publication;

/// Stream shards: a power of two well above the core count.
const SHARDS: usize = crate::hub::SHARDS;

/// How often idle subjects are checked for expired history.
const EXPIRY_SWEEP: Duration = Duration::from_secs(1);

/// How long a subject with history but no age limit keeps its position once
/// it has neither subscribers nor publications held.
const IDLE_POSITION_RETENTION: Duration = Duration::from_secs(3600);

/// One subject's stream on this node: 48 bytes, paid per subject (with
/// one subscriber per subject, per connection), so the policy is a
/// namespace id and the time is in seconds.
#[derive(Debug)]
struct Stream {
    epoch: Epoch,
    /// Offset of the last publication; 0 before the first.
    offset: u64,
    /// Present while the subject holds history.
    history: Option<Box<SubjectHistory>>,
    /// The workers holding its subscribers.
    route: Route,
    /// Last publish, last subscriber leaving, or history running empty:
    /// seconds on the engine's clock.
    last_active_s: u32,
    namespace: NamespaceId,
}

impl Stream {
    fn position(&self) -> Position {
        Position::new(self.epoch, self.offset)
    }

    /// What a recovery from `since` finds now, at most `limit` publications.
    fn recover(&self, since: Position, limit: usize) -> Recovery {
        let position = self.position();
        match self.history.as_deref() {
            Some(history) => history.recover(since, position, limit),
            None if since == position => Recovery::Complete(Vec::new()),
            None => Recovery::Incomplete,
        }
    }

    fn oldest_order(&self) -> Option<u64> {
        self.history.as_ref().and_then(|h| h.oldest_order())
    }

    /// Neither subscribers nor history, for long enough that a client
    /// returning with this position would have nothing to recover anyway:
    /// without history at once, with history after its age limit (or
    /// [`IDLE_POSITION_RETENTION`]). Until then a subscriber that saw nothing
    /// and comes back still recovers, in the same epoch.
    fn forgettable(&self, policy: HistoryPolicy, now_ms: u64) -> bool {
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

#[derive(Default)]
struct Shard {
    streams: HashMap<Arc<str>, Stream, RandomState>,
    /// Subjects holding history, by the store order of their oldest
    /// publication (unique per publication): the first entry is this
    /// shard's oldest publication.
    oldest: BTreeMap<u64, Arc<str>>,
}

struct Inner {
    hub: Arc<Hub>,
    namespaces: Namespaces,
    shards: Box<[Mutex<Shard>]>,
    /// Per shard, the store order of its oldest publication (`u64::MAX`
    /// when it holds none), readable without its lock.
    shard_oldest: Box<[AtomicU64]>,
    hasher: RandomState,
    max_bytes: usize,
    held_bytes: AtomicUsize,
    held_messages: AtomicUsize,
    evictions: AtomicU64,
    publishes: AtomicU64,
    publishes_unrouted: AtomicU64,
    /// Subjects with subscribers on this node.
    routed_subjects: AtomicUsize,
    /// Next store order.
    order: AtomicU64,
    /// Epochs of this process start here: random, so a restarted node never
    /// reuses an epoch, and a subject created again gets a new one.
    epoch_base: u64,
    epochs_made: AtomicU64,
    clock: Instant,
}

/// The engine of a node that is the whole world.
pub struct MemoryEngine {
    inner: Arc<Inner>,
    /// Set by `shut_down`: requests are refused from then on.
    closed: AtomicBool,
    /// Tells the expiry sweep to stop when the engine goes.
    stop: Arc<AtomicBool>,
}

impl MemoryEngine {
    /// An engine over `hub`, keeping history per `namespaces` within
    /// `max_bytes` in total.
    pub fn new(hub: Arc<Hub>, namespaces: Namespaces, max_bytes: usize) -> MemoryEngine {
        let inner = Arc::new(Inner {
            hub,
            namespaces,
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            shard_oldest: (0..SHARDS).map(|_| AtomicU64::new(u64::MAX)).collect(),
            hasher: RandomState::default(),
            max_bytes,
            held_bytes: AtomicUsize::new(0),
            held_messages: AtomicUsize::new(0),
            evictions: AtomicU64::new(0),
            publishes: AtomicU64::new(0),
            publishes_unrouted: AtomicU64::new(0),
            routed_subjects: AtomicUsize::new(0),
            order: AtomicU64::new(0),
            epoch_base: super::random_epoch().0,
            epochs_made: AtomicU64::new(0),
            clock: Instant::now(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        spawn_expiry_sweep(Arc::downgrade(&inner), Arc::clone(&stop));
        MemoryEngine {
            inner,
            closed: AtomicBool::new(false),
            stop,
        }
    }
}

impl Drop for MemoryEngine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A millisecond time in whole seconds, as streams store it (136 years
/// fit), rounded up so that retention ends late rather than early.
fn seconds(ms: u64) -> u32 {
    u32::try_from(ms.div_ceil(1_000)).unwrap_or(u32::MAX)
}

fn spawn_expiry_sweep(inner: Weak<Inner>, stop: Arc<AtomicBool>) {
    let spawned = std::thread::Builder::new()
        .name("myriad-history".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(EXPIRY_SWEEP);
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                inner.expire_all();
            }
        });
    if let Err(e) = spawned {
        // History still expires whenever its subject is touched.
        tracing::warn!(error = %e, "cannot start the history expiry sweep");
    }
}

impl Inner {
    fn now_ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64
    }

    fn shard_index(&self, subject: &str) -> usize {
        self.hasher.hash_one(subject) as usize % SHARDS
    }

    fn lock(&self, index: usize) -> MutexGuard<'_, Shard> {
        // A poisoned shard means a thread panicked mid-update; every update
        // leaves the maps consistent between statements, so go on.
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn new_epoch(&self) -> Epoch {
        Epoch(
            self.epoch_base
                .wrapping_add(self.epochs_made.fetch_add(1, Ordering::Relaxed)),
        )
    }

    fn new_stream(&self, namespace: NamespaceId, now_ms: u64) -> Stream {
        Stream {
            epoch: self.new_epoch(),
            offset: 0,
            history: None,
            route: Route::default(),
            last_active_s: seconds(now_ms),
            namespace,
        }
    }

    fn forgettable(&self, stream: &Stream, now_ms: u64) -> bool {
        stream.forgettable(self.namespaces.policy(stream.namespace), now_ms)
    }

    /// Applies a change to one subject's history: runs `change`, then keeps
    /// the shard's oldest-first index and the node's totals in step.
    fn with_history<R>(
        &self,
        index: usize,
        shard: &mut Shard,
        subject: &Arc<str>,
        now_ms: u64,
        change: impl FnOnce(&mut Stream) -> (R, Freed, usize),
    ) -> R {
        let stream = shard
            .streams
            .get_mut(subject)
            .expect("the caller holds the stream");
        let before = stream.oldest_order();
        let (result, freed, added) = change(stream);
        let after = stream.oldest_order();
        if before.is_some() && after.is_none() {
            // Retention of an idle position counts from when it last held
            // anything (see `Stream::forgettable`).
            stream.last_active_s = seconds(now_ms);
        }
        if before != after {
            if let Some(order) = before {
                shard.oldest.remove(&order);
            }
            if let Some(order) = after {
                shard.oldest.insert(order, Arc::clone(subject));
            }
            let first = shard
                .oldest
                .first_key_value()
                .map_or(u64::MAX, |(order, _)| *order);
            self.shard_oldest[index].store(first, Ordering::Relaxed);
        }
        if added > 0 {
            self.held_bytes.fetch_add(added, Ordering::Relaxed);
            self.held_messages.fetch_add(1, Ordering::Relaxed);
        }
        if freed.messages > 0 {
            self.held_bytes.fetch_sub(freed.bytes, Ordering::Relaxed);
            self.held_messages
                .fetch_sub(freed.messages, Ordering::Relaxed);
        }
        result
    }

    /// Drops expired publications of `subject` (held by the caller).
    fn expire(&self, index: usize, shard: &mut Shard, subject: &Arc<str>, now_ms: u64) {
        let namespaces = &self.namespaces;
        self.with_history(index, shard, subject, now_ms, |stream| {
            let policy = namespaces.policy(stream.namespace);
            let freed = match stream.history.as_mut() {
                Some(history) => history.expire(now_ms, &policy),
                None => Freed::default(),
            };
            ((), freed, 0)
        });
    }

    /// Forgets `subject` if nothing about it is worth keeping.
    fn forget_if_idle(&self, shard: &mut Shard, subject: &str, now_ms: u64) {
        if shard
            .streams
            .get(subject)
            .is_some_and(|s| self.forgettable(s, now_ms))
        {
            shard.streams.remove(subject);
        }
    }

    /// Evicts the node's oldest publications until history fits its budget.
    fn enforce_budget(&self) {
        while self.held_bytes.load(Ordering::Relaxed) > self.max_bytes {
            let Some((index, _)) = self
                .shard_oldest
                .iter()
                .map(|a| a.load(Ordering::Relaxed))
                .enumerate()
                .filter(|&(_, order)| order != u64::MAX)
                .min_by_key(|&(_, order)| order)
            else {
                return;
            };
            let mut guard = self.lock(index);
            let shard = &mut *guard;
            // Another thread may have evicted meanwhile: look again.
            if self.held_bytes.load(Ordering::Relaxed) <= self.max_bytes {
                return;
            }
            let Some(subject) = shard.oldest.first_key_value().map(|(_, s)| Arc::clone(s)) else {
                continue;
            };
            let now = self.now_ms();
            self.with_history(index, shard, &subject, now, |stream| {
                let freed = stream
                    .history
                    .as_mut()
                    .map_or(Freed::default(), |h| h.pop_oldest());
                ((), freed, 0)
            });
            self.evictions.fetch_add(1, Ordering::Relaxed);
            self.forget_if_idle(shard, &subject, now);
        }
    }

    /// The once-a-second pass: expire every subject's old publications and
    /// forget subjects left with nothing. One shard at a time, so a publish
    /// waits for at most one shard's scan.
    fn expire_all(&self) {
        let now = self.now_ms();
        for index in 0..SHARDS {
            let mut guard = self.lock(index);
            let shard = &mut *guard;
            let with_history: Vec<Arc<str>> = shard.oldest.values().cloned().collect();
            for subject in with_history {
                self.expire(index, shard, &subject, now);
            }
            shard
                .streams
                .retain(|_, stream| !self.forgettable(stream, now));
        }
    }
}

impl Engine for MemoryEngine {
    fn publish(&self, subject: &str, data: &str, reply: Reply<Published>, wakeups: &mut Wakeups) {
        let inner = &*self.inner;
        if self.closed.load(Ordering::Acquire) {
            reply.send(&inner.hub, Err(EngineError::ShuttingDown), wakeups);
            return;
        }
        inner.publishes.fetch_add(1, Ordering::Relaxed);
        let now = inner.now_ms();
        let index = inner.shard_index(subject);
        let mut guard = inner.lock(index);
        let shard = &mut *guard;
        let name = match shard.streams.get_key_value(subject) {
            Some((name, _)) => Arc::clone(name),
            None => {
                let namespace = inner.namespaces.id_of(subject);
                if !inner.namespaces.policy(namespace).is_on() {
                    // Nobody listens and nothing is kept: dropped.
                    drop(guard);
                    inner.publishes_unrouted.fetch_add(1, Ordering::Relaxed);
                    let dropped = Published {
                        position: None,
                        subscribers: 0,
                    };
                    reply.send(&inner.hub, Ok(dropped), wakeups);
                    return;
                }
                let name: Arc<str> = Arc::from(subject);
                shard
                    .streams
                    .insert(Arc::clone(&name), inner.new_stream(namespace, now));
                name
            }
        };
        let (publication, subscribers) = inner.with_history(index, shard, &name, now, |stream| {
            stream.offset += 1;
            stream.last_active_s = seconds(now);
            let publication = Arc::new(Publication::new(
                Arc::clone(&name),
                stream.position(),
                data,
                now,
            ));
            let policy = inner.namespaces.policy(stream.namespace);
            let mut freed = Freed::default();
            let mut added = 0;
            if policy.is_on() {
                // A node-wide counter, so only subjects that keep history pay for it.
                let order = inner.order.fetch_add(1, Ordering::Relaxed);
                let history = stream.history.get_or_insert_with(Box::default);
                freed += history.expire(now, &policy);
                added = crate::history::kept_bytes(&publication);
                freed += history.append(order, Arc::clone(&publication), &policy);
            }
            let subscribers = stream.route.deliver(&inner.hub, &publication, wakeups);
            ((publication, subscribers), freed, added)
        });
        drop(guard);
        if subscribers == 0 {
            inner.publishes_unrouted.fetch_add(1, Ordering::Relaxed);
        }
        let published = Published {
            position: Some(publication.position),
            subscribers,
        };
        reply.send(&inner.hub, Ok(published), wakeups);
        inner.enforce_budget();
    }

    fn attach(&self, attach: Attach, wakeups: &mut Wakeups) {
        let inner = &*self.inner;
        let refused = self.closed.load(Ordering::Acquire);
        let now = inner.now_ms();
        let index = inner.shard_index(&attach.subject);
        let mut guard = inner.lock(index);
        let shard = &mut *guard;
        let name = match shard.streams.get_key_value(&*attach.subject) {
            Some((name, _)) => Arc::clone(name),
            None => {
                let namespace = inner.namespaces.id_of(&attach.subject);
                shard.streams.insert(
                    Arc::clone(&attach.subject),
                    inner.new_stream(namespace, now),
                );
                Arc::clone(&attach.subject)
            }
        };
        inner.expire(index, shard, &name, now);
        let stream = shard.streams.get_mut(&name).expect("just ensured");
        if refused {
            // Joined all the same: the worker detaches every attach.
            let refusal = Attached {
                subject: Arc::clone(&name),
                to: attach.to,
                token: attach.token,
                outcome: Err(EngineError::ShuttingDown),
            };
            let event = Event::Attached(Box::new(refusal));
            if stream
                .route
                .join(&inner.hub, attach.to.worker, event, wakeups)
            {
                inner.routed_subjects.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        let position = stream.position();
        let (recovered, replay) = match attach.since {
            None => (None, Vec::new()),
            Some(since) => match stream.recover(since, usize::MAX) {
                Recovery::Complete(replay)
                    if replay.iter().map(|p| p.held_bytes()).sum::<usize>()
                        <= attach.max_replay_bytes =>
                {
                    (Some(true), replay)
                }
                _ => (Some(false), Vec::new()),
            },
        };
        let attached = Attached {
            subject: Arc::clone(&name),
            to: attach.to,
            token: attach.token,
            outcome: Ok(Attachment {
                position,
                recovered,
                replay,
            }),
        };
        let event = Event::Attached(Box::new(attached));
        if stream
            .route
            .join(&inner.hub, attach.to.worker, event, wakeups)
        {
            inner.routed_subjects.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn detach(&self, subject: &str, worker: usize, last_local: bool) {
        let inner = &*self.inner;
        let now = inner.now_ms();
        let mut guard = inner.lock(inner.shard_index(subject));
        let shard = &mut *guard;
        let Some(stream) = shard.streams.get_mut(subject) else {
            debug_assert!(false, "detach from {subject}, which no attach created");
            return;
        };
        if stream.route.leave(worker, last_local) {
            inner.routed_subjects.fetch_sub(1, Ordering::Relaxed);
            stream.last_active_s = seconds(now);
            inner.forget_if_idle(shard, subject, now);
        }
    }

    fn history(&self, query: HistoryQuery, reply: Reply<HistoryPage>, wakeups: &mut Wakeups) {
        let inner = &*self.inner;
        if self.closed.load(Ordering::Acquire) {
            reply.send(&inner.hub, Err(EngineError::ShuttingDown), wakeups);
            return;
        }
        let now = inner.now_ms();
        let index = inner.shard_index(&query.subject);
        let mut guard = inner.lock(index);
        let shard = &mut *guard;
        let Some(name) = shard
            .streams
            .get_key_value(&*query.subject)
            .map(|(name, _)| Arc::clone(name))
        else {
            drop(guard);
            // Never seen (or forgotten): a position no later stream will
            // share, so a recovery from it can only be reported incomplete.
            let page = HistoryPage {
                subject: query.subject,
                position: Position::new(inner.new_epoch(), 0),
                recovered: query.since.map(|_| false),
                publications: Vec::new(),
            };
            reply.send(&inner.hub, Ok(page), wakeups);
            return;
        };
        inner.expire(index, shard, &name, now);
        let stream = &shard.streams[&name];
        let position = stream.position();
        let (recovered, publications) = match query.since {
            None => (
                None,
                stream
                    .history
                    .as_deref()
                    .map_or_else(Vec::new, |h| h.last(query.limit)),
            ),
            Some(since) => match stream.recover(since, query.limit) {
                Recovery::Complete(list) => (Some(true), list),
                Recovery::Incomplete => (Some(false), Vec::new()),
            },
        };
        let page = HistoryPage {
            subject: Arc::clone(&name),
            position,
            recovered,
            publications,
        };
        inner.forget_if_idle(shard, &name, now);
        drop(guard);
        reply.send(&inner.hub, Ok(page), wakeups);
    }

    fn congested(&self) -> bool {
        self.inner.hub.congested()
    }

    fn shut_down(&self) {
        self.closed.store(true, Ordering::Release);
    }

    fn stats(&self) -> EngineStats {
        let inner = &*self.inner;
        let subjects = (0..SHARDS).map(|i| inner.lock(i).oldest.len() as u64).sum();
        EngineStats {
            subjects: inner.routed_subjects.load(Ordering::Relaxed) as u64,
            publishes: inner.publishes.load(Ordering::Relaxed),
            publishes_unrouted: inner.publishes_unrouted.load(Ordering::Relaxed),
            round_trips: 0,
            waiting_attaches: 0,
            history: HistoryStats {
                subjects,
                messages: inner.held_messages.load(Ordering::Relaxed) as u64,
                bytes: inner.held_bytes.load(Ordering::Relaxed) as u64,
                evictions: inner.evictions.load(Ordering::Relaxed),
            },
            failures: super::EngineFailures::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::conformance::{self, Harness};
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

    #[test]
    fn the_byte_count_is_exactly_what_history_holds() {
        let policy = HistoryPolicy {
            size: 3,
            ttl: Duration::ZERO,
        };
        let h = memory(1, Namespaces::new(policy, &[], history_policy), 5_000);
        for n in 0..40 {
            h.publish(&format!("s{}", n % 4), &"7".repeat(n * 10));
        }
        let stats = h.engine.stats().history;
        let mut held = 0;
        let mut messages = 0;
        for s in ["s0", "s1", "s2", "s3"] {
            for p in h.history(s, None, 100).publications {
                held += crate::history::kept_bytes(&p);
                messages += 1;
            }
        }
        assert_eq!((stats.bytes as usize, stats.messages), (held, messages));
        assert!(held <= 5_000 && stats.evictions > 0, "{stats:?}");
    }

    #[test]
    fn memory_engine_keeps_the_contract() {
        conformance::run(memory);
    }
}
