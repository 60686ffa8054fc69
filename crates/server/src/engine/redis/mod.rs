//! The Redis engine: positions, history and routing kept in Redis 7, so
//! that any number of nodes serve the same subjects.
//!
//! Each subject lives on one Redis (a consistent hash over the configured
//! instances, [`ring`]). There a Lua script gives every publish its offset,
//! stores it in history within the namespace's limits and publishes it on
//! the subject's channel, in one atomic step ([`scripts`], lib.lua); one
//! call of it serves a run of a batch's publishes ([`ops::script_calls`]). A
//! node listens only to the channels of subjects it has subscribers of
//! (interest-based routing): its first attach of a subject subscribes, its
//! last detach unsubscribes. Every publication, the node's own included,
//! reaches its workers through the channel, so all nodes see a subject's
//! publications in the one order Redis gave them, and the [`router`] hands
//! them out by offset.
//!
//! Or, in the Sentinel shape, one instance: the master Redis Sentinel
//! names ([`target`]), followed across failovers, with every stream renewed
//! in a new epoch when met under a new master (lib.lua, "failover").
//!
//! Standalone instances with client-side hashing, not Redis Cluster (not
//! yet: [`keys`] lays keys out for one, [`slots`] reads its slot map): a
//! message goes only to the instance owning its subject, on a sharded
//! channel (`SPUBLISH`/`SSUBSCRIBE`), which a Redis Cluster would keep on
//! the slot's master too.
//!
//! The contract of [`crate::engine`] holds as for the memory engine, and
//! the same conformance suite checks it (tests below), with these readings:
//! - "the node" of clauses 4 and 5 is the cluster: a subject is forgotten
//!   when no node listens, and `history_max_bytes` bounds each Redis
//!   instance's history;
//! - a restarted node keeps every epoch (that is the point of a cluster);
//!   a Redis that lost its data starts new ones;
//! - `Published::subscribers` counts this node's subscribers only;
//! - the history figures of [`Engine::stats`] are the instances' totals as
//!   of the node's last round trip to each;
//! - presence (clause 8) is the cluster's: members are held in Redis under
//!   each node's lease (`presence_lease`, renewed every third of it), so a
//!   dead node's members are gone within one lease, and a live node puts
//!   back its members a Redis lost within a renewal of reconnecting.
//!
//! Submodules: [`instance`] (one instance: its queue, batching and
//! connection), [`backlog`] (feed attaches waiting for room in a full
//! queue), [`router`] (local interest and the attach switch), [`members`]
//! (this node's presence members and its lease renewals), [`codec`]
//! (what the scripts write), [`ring`], [`scripts`], [`target`] (where an
//! instance is: a URL, or the master the Sentinels name); below the instance
//! task, so that it never calls back up into this file: [`context`] (what
//! the engine and its tasks share, and how a script call is sent and
//! answered) and [`ops`] (the requests and the scripts' replies).

mod backlog;
mod codec;
mod context;
mod instance;
mod keys;
pub mod lifecycle;
mod members;
mod ops;
mod ring;
mod router;
mod scripts;
#[cfg(test)]
mod sentinel_tests;
mod settings;
#[cfg(test)]
mod slot_tests;
// The Cluster shape's routing, tested but not wired yet (issue 31 item 2).
#[allow(dead_code)]
mod slots;
mod target;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use thiserror::Error;

use self::context::{Context, TotalsCell};
use self::instance::{Instance, InstanceQueue};
use self::ops::{Op, PublishOp, ReadOp};
pub use self::scripts::{publish_call, PUBLISH_SCRIPT};
pub use self::settings::{RedisSettings, SentinelSettings};
use self::target::{ConnectError, Target};
use super::{
    Attach, ConnRequest, Engine, EngineError, EngineFailures, EngineStats, HistoryPage,
    HistoryQuery, HistoryStats, PresencePage, PresenceQuery, PresenceStats, Published, Reply,
};
use crate::hub::{Hub, Wakeups};
use crate::namespace::Namespaces;
use crate::redis_tls::RedisTls;
use myriad_graph::redis_store::sentinel::Sentinels;

/// Why the Redis engine could not start.
#[derive(Debug, Error)]
pub enum RedisEngineError {
    #[error("no Redis URL given (--redis-url)")]
    NoUrl,
    #[error("redis_url and redis_sentinel are two shapes of Redis: give one or the other")]
    MixedShapes,
    #[error(transparent)]
    Sentinel(#[from] myriad_graph::redis_store::sentinel::SentinelError),
    #[error(transparent)]
    NotMaster(ConnectError),
    #[error("invalid Redis URL {url:?}: {source}")]
    BadUrl {
        url: String,
        source: redis::RedisError,
    },
    #[error("cannot reach Redis at {url}: {source}")]
    Unreachable {
        url: String,
        source: redis::RedisError,
    },
    #[error("cannot start the Redis engine's thread: {0}")]
    Thread(std::io::Error),
}

/// The engine of a node in a cluster joined over Redis.
pub struct RedisEngine {
    ctx: Arc<Context>,
    queues: Vec<InstanceQueue>,
    closed: AtomicBool,
    /// Stops the engine's thread when the engine goes.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RedisEngine {
    /// Connects to every instance (each must answer within the timeout),
    /// loads the scripts, and starts the engine's thread.
    pub fn connect(
        hub: Arc<Hub>,
        namespaces: Namespaces,
        max_bytes: usize,
        settings: RedisSettings,
    ) -> Result<RedisEngine, RedisEngineError> {
        let certificates = settings.tls.as_ref().map(RedisTls::certificates);
        let targets = match &settings.sentinel {
            Some(_) if !settings.urls.is_empty() => return Err(RedisEngineError::MixedShapes),
            Some(sentinel) => {
                let sentinels = Sentinels::new(
                    &sentinel.sentinels,
                    &sentinel.master,
                    certificates.clone(),
                    settings.timeout,
                )?;
                vec![Target::Sentinel {
                    sentinels,
                    tls: certificates,
                }]
            }
            None if settings.urls.is_empty() => return Err(RedisEngineError::NoUrl),
            None => settings
                .urls
                .iter()
                .map(|url| {
                    let client = target::client(url, certificates.clone()).map_err(|source| {
                        RedisEngineError::BadUrl {
                            url: url.to_owned(),
                            source,
                        }
                    })?;
                    let shown = url.to_owned();
                    Ok(Target::Fixed { client, shown })
                })
                .collect::<Result<Vec<_>, RedisEngineError>>()?,
        };
        let instances = targets.len();
        let ctx = Arc::new(Context::new(
            hub, namespaces, max_bytes, settings, instances,
        ));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(RedisEngineError::Thread)?;
        let mut tasks = Vec::with_capacity(instances);
        let mut queues = Vec::with_capacity(instances);
        for (index, target) in targets.into_iter().enumerate() {
            let (mut instance, queue) = Instance::new(index, target, Arc::clone(&ctx));
            runtime.block_on(instance.connect()).map_err(|e| match e {
                ConnectError::Redis { at, source } => {
                    RedisEngineError::Unreachable { url: at, source }
                }
                ConnectError::Sentinel(e) => RedisEngineError::Sentinel(e),
                e @ ConnectError::NotMaster { .. } => RedisEngineError::NotMaster(e),
            })?;
            tasks.push(instance);
            queues.push(queue);
        }
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("myriad-redis".into())
            .spawn(move || {
                let local = tokio::task::LocalSet::new();
                for instance in tasks {
                    local.spawn_local(instance.run());
                }
                // Either stop was sent or the engine was dropped: both end it.
                let _ = runtime.block_on(local.run_until(stopped));
            })
            .map_err(RedisEngineError::Thread)?;
        Ok(RedisEngine {
            ctx,
            queues,
            closed: AtomicBool::new(false),
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    fn queue(&self, subject: &str) -> &InstanceQueue {
        &self.queues[ring::instance_of(subject, self.queues.len())]
    }
}

impl Drop for RedisEngine {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Engine for RedisEngine {
    fn publish(&self, subject: &str, data: &str, reply: Reply<Published>, wakeups: &mut Wakeups) {
        let ctx = &*self.ctx;
        if self.closed.load(Ordering::Acquire) {
            reply.send(ctx.router.hub(), Err(EngineError::ShuttingDown), wakeups);
            return;
        }
        ctx.publishes.fetch_add(1, Ordering::Relaxed);
        let op = Op::Publish(PublishOp {
            subject: Arc::from(subject),
            data: Box::from(data),
            reply,
        });
        self.queue(subject).send(op, ctx, wakeups);
    }

    fn attach(&self, attach: Attach, wakeups: &mut Wakeups) {
        let ctx = &*self.ctx;
        let life = ctx.router.join(&attach.subject, attach.to.worker);
        if self.closed.load(Ordering::Acquire) {
            // Joined all the same: the worker detaches every attach.
            ctx.router
                .answered(attach, life, Err(EngineError::ShuttingDown), wakeups);
            return;
        }
        if let Some(join) = &attach.join {
            let id = super::member_id(&ctx.members.node, &attach.to);
            ctx.members.hold(&attach.subject, id, join);
        }
        let queue = self.queue(&attach.subject);
        queue.send(Op::Read(ReadOp::Attach { attach, life }), ctx, wakeups);
    }

    fn detach(&self, subject: &str, worker: usize, last_local: bool) {
        let ctx = &*self.ctx;
        if ctx.router.leave(subject, worker, last_local) {
            self.queue(subject).leave(subject);
        }
    }

    fn history(&self, query: HistoryQuery, reply: Reply<HistoryPage>, wakeups: &mut Wakeups) {
        let ctx = &*self.ctx;
        if self.closed.load(Ordering::Acquire) {
            reply.send(ctx.router.hub(), Err(EngineError::ShuttingDown), wakeups);
            return;
        }
        let queue = self.queue(&query.subject);
        queue.send(Op::Read(ReadOp::History { query, reply }), ctx, wakeups);
    }

    fn leave(&self, subject: &str, to: ConnRequest, wakeups: &mut Wakeups) {
        let ctx = &*self.ctx;
        let member = super::member_id(&ctx.members.node, &to);
        // Sent even when the join's answer has not come: Redis runs the
        // subject's requests in order, so the leave follows the join.
        ctx.members.release(subject, &member);
        let op = ReadOp::Leave {
            subject: Arc::from(subject),
            member,
        };
        self.queue(subject).send(Op::Read(op), ctx, wakeups);
    }

    fn presence(&self, query: PresenceQuery, reply: Reply<PresencePage>, wakeups: &mut Wakeups) {
        let ctx = &*self.ctx;
        if self.closed.load(Ordering::Acquire) {
            reply.send(ctx.router.hub(), Err(EngineError::ShuttingDown), wakeups);
            return;
        }
        let queue = self.queue(&query.subject);
        queue.send(Op::Read(ReadOp::Presence { query, reply }), ctx, wakeups);
    }

    fn presence_stats(
        &self,
        subject: Arc<str>,
        reply: Reply<PresenceStats>,
        wakeups: &mut Wakeups,
    ) {
        let ctx = &*self.ctx;
        if self.closed.load(Ordering::Acquire) {
            reply.send(ctx.router.hub(), Err(EngineError::ShuttingDown), wakeups);
            return;
        }
        let queue = self.queue(&subject);
        let op = ReadOp::PresenceStats { subject, reply };
        queue.send(Op::Read(op), ctx, wakeups);
    }

    fn congested(&self) -> bool {
        self.ctx.router.hub().congested() || self.queues.iter().any(InstanceQueue::congested)
    }

    fn stats(&self) -> EngineStats {
        let ctx = &*self.ctx;
        let sum = |f: fn(&TotalsCell) -> &AtomicU64| -> u64 {
            ctx.totals
                .iter()
                .map(|t| f(t).load(Ordering::Relaxed))
                .sum()
        };
        EngineStats {
            subjects: ctx.router.count() as u64,
            subject_bytes: ctx.router.held_bytes() as u64,
            publishes: ctx.publishes.load(Ordering::Relaxed),
            publishes_unrouted: ctx.publishes_unrouted.load(Ordering::Relaxed),
            round_trips: ctx.round_trips.load(Ordering::Relaxed),
            failovers: ctx.failovers.load(Ordering::Relaxed),
            unavailable_ms: ctx.unavailable_ms.load(Ordering::Relaxed),
            waiting_attaches: self.queues.iter().map(|q| q.waiting() as u64).sum(),
            presence: ctx.members.counts(),
            history: HistoryStats {
                subjects: sum(|t| &t.subjects),
                messages: sum(|t| &t.messages),
                bytes: sum(|t| &t.bytes),
                evictions: sum(|t| &t.evictions),
                // Positions and their evictions are Redis's: the node keeps
                // none of its own.
                positions: 0,
                evicted_positions: 0,
            },
            failures: EngineFailures {
                unavailable: ctx.failures.unavailable.load(Ordering::Relaxed),
                timeout: ctx.failures.timeout.load(Ordering::Relaxed),
                busy: ctx.failures.busy.load(Ordering::Relaxed),
                error: ctx.failures.error.load(Ordering::Relaxed),
            },
        }
    }

    fn shut_down(&self) {
        self.closed.store(true, Ordering::Release);
        // Feed attaches still waiting for room are for connections about to
        // close: answered now, they take no more of Redis's time.
        let mut wakeups = Wakeups::default();
        for queue in &self.queues {
            queue.refuse_waiting(&self.ctx, EngineError::ShuttingDown, &mut wakeups);
        }
        self.ctx.router.hub().wake(wakeups);
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::time::Duration;

    use myriad_testkit::RedisServer;

    use super::*;
    use crate::engine::conformance::{self, Harness};

    /// Engines over `server`, each under a prefix no other engine of the
    /// maker has: a Redis of its own as far as the engine can tell (a
    /// restarted node over it would keep its epochs; a new prefix is a
    /// Redis that lost everything, as the suite's "restarted" engine
    /// expects). The maker owns the server, so it stops with the test.
    pub(super) fn over(server: RedisServer) -> impl Fn(usize, Namespaces, usize) -> Harness {
        let made = Cell::new(0);
        move |workers, namespaces, max_bytes| {
            made.set(made.get() + 1);
            let settings = RedisSettings {
                prefix: format!("conformance{}", made.get()),
                ..settings(server.url())
            };
            harness(settings, workers, namespaces, max_bytes)
        }
    }

    /// The settings of an engine over `url`, under the tests' prefix.
    pub(super) fn settings(url: String) -> RedisSettings {
        RedisSettings {
            tls: None,
            urls: vec![url],
            sentinel: None,
            prefix: "conformance".to_owned(),
            timeout: Duration::from_secs(10),
            queue: 100_000,
            queue_bytes: 64 << 20,
            queue_high_water: 0,
            linger: Duration::ZERO,
            feed_backlog: 1_000,
            presence_lease: Duration::from_secs(15),
        }
    }

    pub(super) fn harness(
        settings: RedisSettings,
        workers: usize,
        namespaces: Namespaces,
        max_bytes: usize,
    ) -> Harness {
        Harness::new(workers, |hub| {
            Box::new(RedisEngine::connect(hub, namespaces, max_bytes, settings).expect("connects"))
        })
    }

    /// Every subject keeps its last ten publications, however old.
    pub(super) fn ten_kept() -> Namespaces {
        let policy = crate::history::HistoryPolicy {
            size: 10,
            ttl: Duration::ZERO,
        };
        Namespaces::new(policy, &[], crate::namespace::history_policy)
    }

    #[test]
    fn a_linger_lets_publishes_that_come_apart_share_a_round_trip() {
        let server = RedisServer::start();
        let settings = RedisSettings {
            linger: Duration::from_secs(2),
            ..settings(server.url())
        };
        let h = harness(settings, 1, ten_kept(), 1 << 20);
        let send = |subject: &str| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let mut wakeups = Wakeups::default();
            h.engine
                .publish(subject, "x", Reply::Task(tx), &mut wakeups);
            h.hub.wake(wakeups);
            rx
        };
        let before = h.engine.stats().round_trips;
        let first = send("a");
        // Without a linger the first publish is long answered by now, in
        // a round trip of its own.
        std::thread::sleep(Duration::from_millis(20));
        let second = send("b");
        for answer in [first, second] {
            answer
                .blocking_recv()
                .expect("answered")
                .expect("published");
        }
        assert_eq!(h.engine.stats().round_trips - before, 1);
        assert_eq!(h.engine.stats().publishes, 2);
    }

    #[test]
    fn offsets_of_fifteen_digits_keep_every_digit() {
        // Lua writes numbers joined with `..` as %.14g: 10^14 as "1e+14",
        // which no node could read back. The scripts write integers as
        // digits.
        let server = RedisServer::start();
        let h = harness(settings(server.url()), 1, ten_kept(), 1 << 20);
        h.publish("big", "1");
        let mut redis = redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let keys: Vec<String> = redis::cmd("KEYS").arg("*:s:big").query(&mut redis).unwrap();
        let [meta] = &keys[..] else {
            panic!("one stream for the subject: {keys:?}")
        };
        let last = 99_999_999_999_999u64;
        let _: () = redis::cmd("HSET")
            .arg(meta)
            .arg("o")
            .arg(last)
            .query(&mut redis)
            .unwrap();
        for (data, offset) in [("2", last + 1), ("3", last + 2)] {
            let position = h.publish("big", data).position.expect("kept");
            assert_eq!(position.offset, offset);
        }
        let page = h.history("big", None, 10);
        let offsets: Vec<u64> = page
            .publications
            .iter()
            .map(|p| p.position.offset)
            .collect();
        assert_eq!(offsets, [1, last + 1, last + 2]);
    }

    #[test]
    fn feed_attaches_wait_for_room_in_a_full_queue_where_others_are_refused() {
        let server = RedisServer::start();
        // A queue with no room at all: every request finds it full.
        let full = |feed_backlog| RedisSettings {
            queue_bytes: 0,
            feed_backlog,
            ..settings(server.url())
        };
        // More feeds than batches take at once, so the backlog must be
        // taken from again without a new one arriving.
        let feeds = 3 * instance::MAX_BATCH;
        let h = harness(full(feeds), 1, ten_kept(), 1 << 20);
        for conn in 0..3 {
            h.attach(&format!("asked{conn}"), conn, false);
        }
        for conn in 3..3 + feeds as u32 {
            h.attach(&format!("feed{conn}"), conn, true);
        }
        let mut made = std::collections::BTreeMap::new();
        for _ in 0..3 + feeds {
            let attached = h.attached();
            made.insert(attached.subject.to_string(), attached.outcome.is_ok());
        }
        // asked0..asked2 refused at once; every feed held, then made.
        let asked: Vec<bool> = (0..3).map(|c| made[&format!("asked{c}")]).collect();
        assert_eq!(asked, [false, false, false]);
        assert!(made
            .iter()
            .all(|(subject, &ok)| ok == subject.starts_with("feed")));
        let stats = h.engine.stats();
        assert_eq!((stats.failures.busy, stats.waiting_attaches), (3, 0));

        // Past the backlog's bound a feed attach is refused like the others.
        let h = harness(full(0), 1, ten_kept(), 1 << 20);
        h.attach("feed", 0, true);
        let attached = h.attached();
        assert!(matches!(attached.outcome, Err(EngineError::RedisBusy)));
    }

    #[test]
    fn feed_attaches_still_waiting_at_shutdown_are_refused_at_once() {
        let server = RedisServer::start();
        let settings = RedisSettings {
            queue_bytes: 0,
            timeout: Duration::from_secs(60),
            feed_backlog: 2 * instance::MAX_BATCH,
            ..settings(server.url())
        };
        let h = harness(settings, 1, ten_kept(), 1 << 20);
        server.pause();
        // The task takes one batch at most, and is stuck with it.
        let feeds = 2 * instance::MAX_BATCH;
        for conn in 0..feeds as u32 {
            h.attach(&format!("feed{conn}"), conn, true);
        }
        h.engine.shut_down();
        assert_eq!(h.engine.stats().waiting_attaches, 0);
        for _ in 0..feeds - instance::MAX_BATCH {
            let attached = h.attached();
            assert!(matches!(attached.outcome, Err(EngineError::ShuttingDown)));
        }
        server.resume();
    }

    // The engine contract, clause by clause, each over a Redis of its own.
    /// Joins connection `conn` of worker 0 of `h` to `subject` as `user`,
    /// and waits for the answer.
    fn join(h: &Harness, subject: &str, conn: u32, user: &str) {
        let join = crate::engine::Join {
            user: Some(Arc::from(user)),
            info: None,
            max_members: 100,
            events: false,
        };
        h.attach_joining(subject, conn, join);
        assert!(h.attached().outcome.is_ok());
    }

    /// Two engines (nodes) over `server`, with presence leases of `lease`.
    fn two_nodes(server: &RedisServer, lease: Duration) -> (Harness, Harness) {
        let node = || {
            let settings = RedisSettings {
                presence_lease: lease,
                ..settings(server.url())
            };
            harness(settings, 1, ten_kept(), 1 << 20)
        };
        (node(), node())
    }

    /// Connection `conn` of worker 0 leaves `subject`'s members.
    fn leave(h: &Harness, subject: &str, conn: u32) {
        let to = ConnRequest {
            worker: 0,
            conn,
            life: 0,
            request: None,
        };
        let mut wakeups = Wakeups::default();
        h.engine.leave(subject, to, &mut wakeups);
        h.hub.wake(wakeups);
    }

    /// A leave Redis could not take (it was down) is sent again with the
    /// next renewal once it is back: the node's lease, renewed for its other
    /// member, would otherwise keep the departed one listed.
    #[test]
    fn a_leave_lost_while_redis_is_down_is_made_on_its_return() {
        let mut server = RedisServer::start_persistent();
        let settings = RedisSettings {
            presence_lease: Duration::from_secs(3),
            timeout: Duration::from_millis(500),
            ..settings(server.url())
        };
        let h = harness(settings, 1, ten_kept(), 1 << 20);
        join(&h, "room", 1, "ann");
        join(&h, "room", 2, "bob");
        server.kill();
        leave(&h, "room", 1);
        // Refused while Redis is down (counted as unavailable).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while h.engine.stats().failures.unavailable == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the leave never failed"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server.restart();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let mut wakeups = Wakeups::default();
            h.engine
                .presence_stats(Arc::from("room"), Reply::Task(tx), &mut wakeups);
            h.hub.wake(wakeups);
            if let Ok(Ok(stats)) = rx.blocking_recv() {
                if (stats.connections, stats.users) == (1, 1) {
                    break;
                }
                assert_eq!(stats.connections, 2, "only ann's leave is owed");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the lost leave was never made"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(h.members("room", 10)[0].user.as_deref(), Some("bob"));
    }

    /// A node that dies without a word (its engine dropped: no leave, no
    /// more renewals) loses its members within one lease, on the other
    /// node's reads and by its renewals, with the user counts kept exact.
    #[test]
    fn a_dead_nodes_members_lapse_within_a_lease() {
        let server = RedisServer::start();
        let lease = Duration::from_millis(900);
        let (alive, doomed) = two_nodes(&server, lease);
        join(&alive, "room", 1, "ann");
        join(&doomed, "room", 1, "bob");
        join(&doomed, "room", 2, "ann");
        assert_eq!(alive.presence_stats("room"), (3, 2));
        // Past several renewals, everyone is still there.
        std::thread::sleep(lease * 2);
        assert_eq!(alive.presence_stats("room"), (3, 2), "renewed");
        drop(doomed);
        let died = std::time::Instant::now();
        // Read by the survivor until the dead node's members are gone.
        while alive.presence_stats("room") != (1, 1) {
            assert!(
                died.elapsed() < lease + Duration::from_secs(2),
                "a dead node's members outlived their lease"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let members = alive.members("room", 10);
        assert_eq!(members.len(), 1);
        assert_eq!(members[0].user.as_deref(), Some("ann"));
        // The survivor's renewals read Redis's count of expired members.
        let mut expired = 0;
        while expired != 2 {
            assert!(died.elapsed() < lease * 3, "expiries never counted");
            std::thread::sleep(Duration::from_millis(50));
            expired = alive.engine.stats().presence.expired;
        }
    }

    /// The stats of `subject` once they read `want`, polled until
    /// `within` has passed (an error while Redis is away is read again).
    fn stats_reach(h: &Harness, subject: &str, want: (u64, u64), within: Duration) {
        let deadline = std::time::Instant::now() + within;
        loop {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let mut wakeups = Wakeups::default();
            h.engine
                .presence_stats(Arc::from(subject), Reply::Task(tx), &mut wakeups);
            h.hub.wake(wakeups);
            let read = rx.blocking_recv().ok().and_then(Result::ok);
            if read.as_ref().map(|s| (s.connections, s.users)) == Some(want) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{subject} never read {want:?} (last {:?})",
                read.map(|s| (s.connections, s.users))
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A Redis that lost its presence keys (restarted with nothing on
    /// disk, or emptied as a failover that lost the newest writes would)
    /// gets every live member back from the nodes that hold them within a
    /// renewal of its return, user counts exact, and never one that left
    /// before the loss.
    #[test]
    fn members_lost_by_redis_are_put_back_by_their_nodes() {
        let mut server = RedisServer::start();
        let lease = Duration::from_millis(1500);
        let (one, two) = two_nodes(&server, lease);
        join(&one, "room", 1, "ann");
        join(&one, "room", 2, "bob");
        join(&one, "hall", 3, "ann");
        join(&two, "room", 1, "ann");
        join(&two, "room", 2, "cid");
        // bob leaves before the loss: nobody may bring him back.
        leave(&one, "room", 2);
        stats_reach(&one, "room", (3, 2), Duration::from_secs(5));
        let users = |h: &Harness| {
            let mut users: Vec<_> = h
                .members("room", 10)
                .into_iter()
                .filter_map(|m| m.user.map(|u| u.to_string()))
                .collect();
            users.sort();
            users
        };
        // Within a renewal (a third of a lease) of Redis answering again,
        // plus the reconnect's back-off.
        let within = lease / 3 + Duration::from_secs(3);
        server.restart();
        stats_reach(&one, "room", (3, 2), within);
        stats_reach(&two, "hall", (1, 1), within);
        assert_eq!(users(&two), ["ann", "ann", "cid"], "bob stayed gone");
        server.command(&["FLUSHALL"]).expect("flushed");
        stats_reach(&two, "room", (3, 2), within);
        stats_reach(&one, "hall", (1, 1), within);
        assert_eq!(users(&one), ["ann", "ann", "cid"], "bob stayed gone");
    }

    conformance::conformance_suite!(keeps_the_contract, over(RedisServer::start()));
}
