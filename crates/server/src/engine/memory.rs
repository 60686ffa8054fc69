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
//! History shares one byte budget across the node, `history_max_bytes`, and
//! it holds everything kept for recovery that no subscriber pays for: the
//! publications, each history's own queue, and the stream of every subject
//! kept without subscribers (its map slot and name). A stream with
//! subscribers is paid for by their subscriptions, which `max_connections`
//! and `max_subscriptions` bound; any other stream exists only because of
//! the budget, so a client publishing to a new subject every time cannot
//! grow the node past it. Every stored publication gets a node-wide store
//! order; each shard keeps an ordered index of its subjects by their oldest
//! publication and another of its idle positions (kept subjects with
//! neither subscribers nor history) by when they went idle, and publishes
//! the minimum of each in an atomic, so evicting "the oldest thing on the
//! node" reads 64 atomics and locks one shard. Idle positions go first (a
//! position without history can only say "recovered, nothing missed"),
//! then the oldest publications. Eviction runs after the publishing shard
//! is unlocked, so no thread ever holds two stream shards. Age limits are
//! applied whenever a subject is touched and by a once-a-second sweep on
//! its own thread, so idle subjects free their memory too. A kept
//! publication's compressed frame is charged to the budget when a worker
//! makes it (`Publication::charged_to`); the next publish or sweep evicts
//! for it.
//!
//! Presence (contract clause 8) is a [`Roster`] beside the streams, under
//! locks of its own; a join is made before the attach takes its stream's
//! lock, so no thread holds both. Members are named by this engine's node
//! id (random per start) and the connection's worker, slot and life.
//!
//! Submodules: [`stream`] (one subject's stream and the shard of them one
//! lock covers), [`roster`] (presence subjects' members), `tests`.

pub mod roster;
mod stream;

use self::roster::Roster;

use self::stream::{stream_bytes, Shard, Stream};

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use foldhash::fast::RandomState;
use myriad_protocol::position::{Epoch, Position};

use super::{
    Attach, Attached, Attachment, ConnRequest, Engine, EngineError, EngineStats, HistoryPage,
    HistoryQuery, HistoryStats, PresencePage, PresenceQuery, PresenceStats, Published, Reply,
};
use crate::history::{Freed, Recovery};
use crate::hub::{Event, Hub, Route, Wakeups};
use crate::namespace::{NamespaceId, Namespaces};
use crate::publication::Publication;
// The engine keeps its stream shards itself, not in a `Sharded`: a
// shard's index also names its oldest and idle marks. It locks them under
// the node's one poison policy all the same.
use crate::sharded::{self, SHARDS};

/// How often idle subjects are checked for expired history.
const EXPIRY_SWEEP: Duration = Duration::from_secs(1);

struct Inner {
    hub: Arc<Hub>,
    namespaces: Namespaces,
    shards: Box<[Mutex<Shard>]>,
    /// Per shard, the store order of its oldest publication (`u64::MAX`
    /// when it holds none), readable without its lock.
    shard_oldest: Box<[AtomicU64]>,
    /// Per shard, when its oldest idle position went idle (`u64::MAX`
    /// when it holds none), readable without its lock.
    shard_idle: Box<[AtomicU64]>,
    hasher: RandomState,
    max_bytes: usize,
    /// Everything charged to the history budget (see the module header);
    /// shared with the publications history keeps, whose compressed frames
    /// are charged here as workers make them (`Publication::charged_to`).
    held_bytes: Arc<AtomicUsize>,
    held_messages: AtomicUsize,
    /// Streams kept with neither subscribers nor history.
    idle_positions: AtomicUsize,
    /// The map bytes of the streams with subscribers: what their
    /// subscriptions pay for, outside the budget.
    routed_bytes: AtomicUsize,
    evictions: AtomicU64,
    /// Idle positions forgotten to stay within the budget.
    evicted_positions: AtomicU64,
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
    roster: Roster,
    /// Starts every member id: the node's, so that ids stay unique when
    /// members of several nodes are listed together.
    node: String,
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
            shard_idle: (0..SHARDS).map(|_| AtomicU64::new(u64::MAX)).collect(),
            hasher: RandomState::default(),
            max_bytes,
            held_bytes: Arc::default(),
            held_messages: AtomicUsize::new(0),
            idle_positions: AtomicUsize::new(0),
            routed_bytes: AtomicUsize::new(0),
            evictions: AtomicU64::new(0),
            evicted_positions: AtomicU64::new(0),
            publishes: AtomicU64::new(0),
            publishes_unrouted: AtomicU64::new(0),
            routed_subjects: AtomicUsize::new(0),
            order: AtomicU64::new(0),
            epoch_base: super::random_epoch().0,
            epochs_made: AtomicU64::new(0),
            clock: Instant::now(),
            roster: Roster::default(),
            node: super::random_node_id(),
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
        // Every update leaves the maps consistent between statements, as
        // the poison policy asks.
        sharded::lock(&self.shards[index])
    }

    fn new_epoch(&self) -> Epoch {
        Epoch(
            self.epoch_base
                .wrapping_add(self.epochs_made.fetch_add(1, Ordering::Relaxed)),
        )
    }

    /// Makes `subject`'s stream (not yet in its shard) and returns its name
    /// as the map holds it. A new stream is an idle position until the
    /// caller's change gives it history or a subscriber.
    fn create(
        &self,
        index: usize,
        shard: &mut Shard,
        subject: Arc<str>,
        namespace: NamespaceId,
        now_ms: u64,
    ) -> Arc<str> {
        let stream = Stream {
            epoch: self.new_epoch(),
            offset: 0,
            history: None,
            route: Route::default(),
            last_active_s: seconds(now_ms),
            namespace,
        };
        let after = Footprint::of(&stream, &subject);
        shard.streams.insert(Arc::clone(&subject), stream);
        self.settle(index, shard, &subject, Footprint::default(), after);
        subject
    }

    /// The member id of the connection `to` names.
    fn member_id(&self, to: &ConnRequest) -> Arc<str> {
        super::member_id(&self.node, to)
    }

    fn forgettable(&self, stream: &Stream, now_ms: u64) -> bool {
        stream.forgettable(self.namespaces.policy(stream.namespace), now_ms)
    }

    /// Applies a change to one subject's stream: runs `change` (which
    /// reports the bytes of publications it freed and added), then keeps
    /// the shard's indexes and the node's totals in step with what the
    /// stream holds now.
    fn change<R>(
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
        let before = Footprint::of(stream, subject);
        let (result, freed, added) = change(stream);
        if stream.history.as_ref().is_some_and(|h| h.is_empty()) {
            // An empty history keeps no box: a position costs only itself.
            stream.history = None;
            // Retention of an idle position counts from when it last held
            // anything (see `Stream::forgettable`).
            stream.last_active_s = seconds(now_ms);
        }
        let after = Footprint::of(stream, subject);
        if added > 0 {
            self.held_bytes.fetch_add(added, Ordering::Relaxed);
            self.held_messages.fetch_add(1, Ordering::Relaxed);
        }
        if freed.messages > 0 {
            self.held_bytes.fetch_sub(freed.bytes, Ordering::Relaxed);
            self.held_messages
                .fetch_sub(freed.messages, Ordering::Relaxed);
        }
        self.settle(index, shard, subject, before, after);
        result
    }

    /// Forgets `subject`'s stream (held by the caller).
    fn forget(&self, index: usize, shard: &mut Shard, subject: &Arc<str>) {
        if let Some(stream) = shard.streams.remove(subject) {
            let before = Footprint::of(&stream, subject);
            self.settle(index, shard, subject, before, Footprint::default());
        }
    }

    /// Moves `subject` in its shard's indexes and the node's totals from
    /// what its stream held (`before`) to what it holds (`after`).
    fn settle(
        &self,
        index: usize,
        shard: &mut Shard,
        subject: &Arc<str>,
        before: Footprint,
        after: Footprint,
    ) {
        if before.oldest != after.oldest {
            if let Some(order) = before.oldest {
                shard.oldest.remove(&order);
            }
            if let Some(order) = after.oldest {
                shard.oldest.insert(order, Arc::clone(subject));
            }
            self.shard_oldest[index].store(shard.first_oldest(), Ordering::Relaxed);
        }
        if before.idle != after.idle {
            if let Some(since) = before.idle {
                shard.idle.remove(&(since, Arc::clone(subject)));
                self.idle_positions.fetch_sub(1, Ordering::Relaxed);
            }
            if let Some(since) = after.idle {
                shard.idle.insert((since, Arc::clone(subject)));
                self.idle_positions.fetch_add(1, Ordering::Relaxed);
            }
            self.shard_idle[index].store(shard.first_idle(), Ordering::Relaxed);
        }
        apply_delta(&self.held_bytes, before.charge, after.charge);
        apply_delta(&self.routed_bytes, before.routed, after.routed);
    }

    /// Drops expired publications of `subject` (held by the caller).
    fn expire(&self, index: usize, shard: &mut Shard, subject: &Arc<str>, now_ms: u64) {
        let namespaces = &self.namespaces;
        self.change(index, shard, subject, now_ms, |stream| {
            let policy = namespaces.policy(stream.namespace);
            let freed = match stream.history.as_mut() {
                Some(history) => history.expire(now_ms, &policy),
                None => Freed::default(),
            };
            ((), freed, 0)
        });
    }

    /// Forgets `subject` if nothing about it is worth keeping.
    fn forget_if_idle(&self, index: usize, shard: &mut Shard, subject: &Arc<str>, now_ms: u64) {
        if shard
            .streams
            .get(subject)
            .is_some_and(|s| self.forgettable(s, now_ms))
        {
            self.forget(index, shard, subject);
        }
    }

    /// The shard holding the node's oldest entry of one kind (per `firsts`),
    /// if any shard holds one.
    fn oldest_shard(firsts: &[AtomicU64]) -> Option<usize> {
        firsts
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .enumerate()
            .filter(|&(_, first)| first != u64::MAX)
            .min_by_key(|&(_, first)| first)
            .map(|(index, _)| index)
    }

    fn over_budget(&self) -> bool {
        self.held_bytes.load(Ordering::Relaxed) > self.max_bytes
    }

    /// Evicts until everything charged fits the budget: the node's oldest
    /// idle positions first, then its oldest publications.
    fn enforce_budget(&self) {
        while self.over_budget() {
            if let Some(index) = Self::oldest_shard(&self.shard_idle) {
                let mut guard = self.lock(index);
                let shard = &mut *guard;
                // Another thread may have evicted meanwhile: look again.
                if !self.over_budget() {
                    return;
                }
                if let Some((_, subject)) = shard.idle.first().cloned() {
                    self.forget(index, shard, &subject);
                    self.evicted_positions.fetch_add(1, Ordering::Relaxed);
                }
                continue;
            }
            let Some(index) = Self::oldest_shard(&self.shard_oldest) else {
                // Nothing evictable is left: what remains is held by streams
                // that subscribers pay for (their history's structure), and
                // it goes as their histories empty.
                return;
            };
            let mut guard = self.lock(index);
            let shard = &mut *guard;
            if !self.over_budget() {
                return;
            }
            let Some(subject) = shard.oldest.first_key_value().map(|(_, s)| Arc::clone(s)) else {
                continue;
            };
            let now = self.now_ms();
            self.change(index, shard, &subject, now, |stream| {
                let freed = stream
                    .history
                    .as_mut()
                    .map_or(Freed::default(), |h| h.pop_oldest());
                ((), freed, 0)
            });
            self.evictions.fetch_add(1, Ordering::Relaxed);
            self.forget_if_idle(index, shard, &subject, now);
        }
    }

    /// The once-a-second pass: expire every subject's old publications and
    /// forget idle positions whose retention is over. One shard at a time,
    /// so a publish waits for at most one shard's scan.
    fn expire_all(&self) {
        let now = self.now_ms();
        for index in 0..SHARDS {
            let mut guard = self.lock(index);
            let shard = &mut *guard;
            let with_history: Vec<Arc<str>> = shard.oldest.values().cloned().collect();
            for subject in with_history {
                self.expire(index, shard, &subject, now);
            }
            // Only idle positions can be forgettable.
            let idle: Vec<Arc<str>> = shard.idle.iter().map(|(_, s)| Arc::clone(s)).collect();
            for subject in idle {
                self.forget_if_idle(index, shard, &subject, now);
            }
            // A map keeps its table once grown: give back what a burst of
            // subjects left behind.
            if shard.streams.capacity() > 4 * shard.streams.len().max(16) {
                shard.streams.shrink_to_fit();
            }
        }
        // Compressed frames of kept publications are charged by the workers
        // that make them, which do not evict: frames made since the last
        // publish (a recovery's replay, say) are brought within the budget
        // here at the latest.
        self.enforce_budget();
    }
}

/// What one stream holds of the shard's indexes and the node's totals.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Footprint {
    /// Its key in `oldest`, while it holds history.
    oldest: Option<u64>,
    /// When it went idle, its key in `idle`, while it is an idle position.
    idle: Option<u32>,
    /// What it charges to the history budget beside its publications.
    charge: usize,
    /// Its map bytes while it has subscribers.
    routed: usize,
}

impl Footprint {
    fn of(stream: &Stream, name: &str) -> Footprint {
        Footprint {
            oldest: stream.oldest_order(),
            idle: stream.idle().then_some(stream.last_active_s),
            charge: stream.charge(name),
            routed: if stream.route.subscribers() > 0 {
                stream_bytes(name)
            } else {
                0
            },
        }
    }
}

/// Moves `total` from counting `before` to counting `after`.
fn apply_delta(total: &AtomicUsize, before: usize, after: usize) {
    if after > before {
        total.fetch_add(after - before, Ordering::Relaxed);
    } else if before > after {
        total.fetch_sub(before - after, Ordering::Relaxed);
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
                inner.create(index, shard, Arc::from(subject), namespace, now)
            }
        };
        let (publication, subscribers) = inner.change(index, shard, &name, now, |stream| {
            stream.offset += 1;
            stream.last_active_s = seconds(now);
            let policy = inner.namespaces.policy(stream.namespace);
            let mut publication = Publication::new(Arc::clone(&name), stream.position(), data, now);
            if policy.is_on() {
                publication = publication.charged_to(Arc::clone(&inner.held_bytes));
            }
            let publication = Arc::new(publication);
            let mut freed = Freed::default();
            let mut added = 0;
            if policy.is_on() {
                // A node-wide counter, so only subjects that keep history pay for it.
                let order = inner.order.fetch_add(1, Ordering::Relaxed);
                let history = stream.history.get_or_insert_with(Box::default);
                freed += history.expire(now, &policy);
                let (kept, trimmed) = history.append(order, Arc::clone(&publication), &policy);
                added = kept;
                freed += trimmed;
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
        let refused = if self.closed.load(Ordering::Acquire) {
            Some(EngineError::ShuttingDown)
        } else if let Some(join) = &attach.join {
            // Before the stream's lock: the roster's locks are never taken
            // under it.
            let conn = inner.member_id(&attach.to);
            let hub = &inner.hub;
            let told = |change| hub.send_to_all(&Arc::new(change), wakeups);
            inner.roster.join(&attach.subject, conn, join, told).err()
        } else {
            None
        };
        let now = inner.now_ms();
        let index = inner.shard_index(&attach.subject);
        let mut guard = inner.lock(index);
        let shard = &mut *guard;
        let name = match shard.streams.get_key_value(&*attach.subject) {
            Some((name, _)) => Arc::clone(name),
            None => {
                let namespace = inner.namespaces.id_of(&attach.subject);
                inner.create(index, shard, Arc::clone(&attach.subject), namespace, now)
            }
        };
        inner.expire(index, shard, &name, now);
        let stream = &shard.streams[&name];
        let outcome = if let Some(refused) = refused {
            // Joined to the route all the same: the worker detaches every
            // attach.
            Err(refused)
        } else {
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
            Ok(Attachment {
                position: stream.position(),
                recovered,
                replay,
            })
        };
        let event = Event::Attached(Box::new(Attached {
            subject: Arc::clone(&name),
            to: attach.to,
            token: attach.token,
            outcome,
        }));
        let first = inner.change(index, shard, &name, now, |stream| {
            let first = stream
                .route
                .join(&inner.hub, attach.to.worker, event, wakeups);
            (first, Freed::default(), 0)
        });
        if first {
            inner.routed_subjects.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn detach(&self, subject: &str, worker: usize, last_local: bool) {
        let inner = &*self.inner;
        let now = inner.now_ms();
        let index = inner.shard_index(subject);
        let mut guard = inner.lock(index);
        let shard = &mut *guard;
        let Some(name) = shard
            .streams
            .get_key_value(subject)
            .map(|(n, _)| Arc::clone(n))
        else {
            debug_assert!(false, "detach from {subject}, which no attach created");
            return;
        };
        let last = inner.change(index, shard, &name, now, |stream| {
            let last = stream.route.leave(worker, last_local);
            if last {
                stream.last_active_s = seconds(now);
            }
            (last, Freed::default(), 0)
        });
        if last {
            inner.routed_subjects.fetch_sub(1, Ordering::Relaxed);
            inner.forget_if_idle(index, shard, &name, now);
            drop(guard);
            // A stream kept after its last subscriber is the budget's now.
            inner.enforce_budget();
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
        inner.forget_if_idle(index, shard, &name, now);
        drop(guard);
        reply.send(&inner.hub, Ok(page), wakeups);
    }

    fn leave(&self, subject: &str, to: ConnRequest, wakeups: &mut Wakeups) {
        let inner = &*self.inner;
        let told = |change| inner.hub.send_to_all(&Arc::new(change), wakeups);
        inner.roster.leave(subject, &inner.member_id(&to), told);
    }

    fn presence(&self, query: PresenceQuery, reply: Reply<PresencePage>, wakeups: &mut Wakeups) {
        let inner = &*self.inner;
        if self.closed.load(Ordering::Acquire) {
            reply.send(&inner.hub, Err(EngineError::ShuttingDown), wakeups);
            return;
        }
        // Answered under the subject's lock: in line with its changes.
        let answer = |page| reply.send(&inner.hub, Ok(page), wakeups);
        inner
            .roster
            .page(query.subject, query.after.as_deref(), query.limit, answer);
    }

    fn presence_stats(
        &self,
        subject: Arc<str>,
        reply: Reply<PresenceStats>,
        wakeups: &mut Wakeups,
    ) {
        let inner = &*self.inner;
        let result = if self.closed.load(Ordering::Acquire) {
            Err(EngineError::ShuttingDown)
        } else {
            Ok(inner.roster.stats(subject))
        };
        reply.send(&inner.hub, result, wakeups);
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
            subject_bytes: inner.routed_bytes.load(Ordering::Relaxed) as u64,
            publishes: inner.publishes.load(Ordering::Relaxed),
            publishes_unrouted: inner.publishes_unrouted.load(Ordering::Relaxed),
            round_trips: 0,
            failovers: 0,
            unavailable_ms: 0,
            waiting_attaches: 0,
            history: HistoryStats {
                subjects,
                positions: inner.idle_positions.load(Ordering::Relaxed) as u64,
                messages: inner.held_messages.load(Ordering::Relaxed) as u64,
                bytes: inner.held_bytes.load(Ordering::Relaxed) as u64,
                evictions: inner.evictions.load(Ordering::Relaxed),
                evicted_positions: inner.evicted_positions.load(Ordering::Relaxed),
            },
            presence: inner.roster.counts(),
            failures: super::EngineFailures::default(),
        }
    }
}

#[cfg(test)]
mod tests;
