//! The Redis engine: positions, history and routing kept in Redis 7, so
//! that any number of nodes serve the same subjects.
//!
//! Each subject lives on one Redis (a consistent hash over the configured
//! instances, [`ring`]). There a Lua script gives every publish its offset,
//! stores it in history within the namespace's limits and publishes it on
//! the subject's channel, in one atomic step ([`scripts`], lib.lua); one
//! call of it serves a run of a batch's publishes ([`script_calls`]). A
//! node listens only to the channels of subjects it has subscribers of
//! (interest-based routing): its first attach of a subject subscribes, its
//! last detach unsubscribes. Every publication, the node's own included,
//! reaches its workers through the channel, so all nodes see a subject's
//! publications in the one order Redis gave them, and the [`router`] hands
//! them out by offset.
//!
//! Standalone instances with client-side hashing, not Redis Cluster: a
//! message goes only to the instance owning its subject, which is the
//! broadcast sharded pub/sub (`SPUBLISH`) exists to avoid in a cluster, and
//! scripts may touch any key of their instance (the budget evicts across
//! subjects). Plain `PUBLISH`/`SUBSCRIBE` on each instance do the rest.
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
//!   of the node's last round trip to each.
//!
//! Submodules: [`shard`] (one instance: its queue, batching and
//! connection), [`backlog`] (feed attaches waiting for room in a full
//! queue), [`router`] (local interest and the attach switch), [`codec`]
//! (what the scripts write), [`ring`], [`scripts`].

mod backlog;
mod codec;
mod ring;
mod router;
mod scripts;
mod shard;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use thiserror::Error;

use self::router::Router;
use self::scripts::Scripts;
pub use self::scripts::{publish_call, PUBLISH_SCRIPT};
use self::shard::{Op, PublishOp, Read, ReadOp, ScriptCall, ScriptReply, Shard, ShardQueue};
use super::{
    Attach, Engine, EngineError, EngineFailures, EngineStats, HistoryPage, HistoryQuery,
    HistoryStats, Published, Reply,
};
use crate::hub::{Hub, Wakeups};
use crate::namespace::Namespaces;
use crate::redis_tls::RedisTls;

/// Publishes one publish.lua call carries at most, and about how many
/// bytes of data: Redis runs nothing else while a script runs, so a call
/// is kept to a few milliseconds of its time.
const PUBLISH_RUN: usize = 256;
const PUBLISH_RUN_BYTES: usize = 1 << 20;

/// Where the Redis engine's instances are and how to use them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSettings {
    /// What `rediss://` instances are checked with and shown.
    pub tls: Option<RedisTls>,
    /// One URL per instance (`redis://host:port[/db]`); subjects are spread
    /// over them in this order, so only ever append to the list.
    pub urls: Vec<String>,
    /// Prefix of every key and channel, so clusters can share a Redis.
    pub prefix: String,
    /// Connect and reply timeout.
    pub timeout: Duration,
    /// Requests waiting for one instance; past it requests are refused.
    pub queue: usize,
    /// Bytes of subjects and data waiting for one instance; past it
    /// requests are refused.
    pub queue_bytes: usize,
    /// Requests waiting for one instance past which publishing pauses, as
    /// it does when a worker's mailbox is full ([`Engine::congested`]),
    /// instead of running into `queue`'s refusals; 0 = never.
    pub queue_high_water: usize,
    /// How long a request may wait for others to share its round trip.
    pub linger: Duration,
    /// Attaches that can wait ([`Attach::can_wait`]) held per instance for
    /// room past a full `queue`; past it they are refused too.
    pub feed_backlog: usize,
}

/// Why the Redis engine could not start.
#[derive(Debug, Error)]
pub enum RedisEngineError {
    #[error("no Redis URL given (--redis-url)")]
    NoUrl,
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

/// An instance's history totals, from its scripts' replies.
#[derive(Debug, Default, Clone, Copy)]
pub struct Totals {
    bytes: i64,
    messages: i64,
    evictions: i64,
    subjects: i64,
}

#[derive(Debug, Default)]
struct TotalsCell {
    bytes: AtomicU64,
    messages: AtomicU64,
    evictions: AtomicU64,
    subjects: AtomicU64,
}

impl TotalsCell {
    fn set(&self, t: Totals) {
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        self.bytes.store(n(t.bytes), Ordering::Relaxed);
        self.messages.store(n(t.messages), Ordering::Relaxed);
        self.evictions.store(n(t.evictions), Ordering::Relaxed);
        self.subjects.store(n(t.subjects), Ordering::Relaxed);
    }

    /// From a `{bytes, messages, evictions, subjects}` reply.
    fn store(&self, values: Vec<Value>) {
        let reply = ScriptReply::new(Value::Array(values));
        if let Ok(totals) = reply.and_then(|mut r| r.totals()) {
            self.set(totals);
        }
    }
}

/// Failures towards Redis, by kind, for `/metrics`.
#[derive(Debug, Default)]
struct Failures {
    unavailable: AtomicU64,
    timeout: AtomicU64,
    busy: AtomicU64,
    error: AtomicU64,
}

/// What the engine's callers, shard tasks and inboxes share.
pub struct Context {
    router: Router,
    namespaces: Namespaces,
    settings: RedisSettings,
    max_bytes: usize,
    scripts: Scripts,
    shards: usize,
    totals: Box<[TotalsCell]>,
    failures: Failures,
    publishes: AtomicU64,
    publishes_unrouted: AtomicU64,
    /// Script pipelines sent, over every instance.
    round_trips: AtomicU64,
    /// `<prefix>:c:`: what channel names start with.
    channel_prefix: String,
}

impl Context {
    fn channel(&self, subject: &str) -> String {
        format!("{}{subject}", self.channel_prefix)
    }

    fn count_failure(&self, error: &EngineError) {
        let counter = match error {
            EngineError::RedisUnavailable | EngineError::RedisLost => &self.failures.unavailable,
            EngineError::RedisTimeout => &self.failures.timeout,
            EngineError::RedisBusy => &self.failures.busy,
            EngineError::Redis(_) => &self.failures.error,
            EngineError::ShuttingDown => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A message on one of this node's channels.
    fn on_message(&self, channel: &[u8], payload: &[u8]) {
        let Some(subject) = channel
            .strip_prefix(self.channel_prefix.as_bytes())
            .and_then(|s| std::str::from_utf8(s).ok())
        else {
            return;
        };
        let mut wakeups = Wakeups::default();
        let decode = |name: &Arc<str>| match codec::channel_message(name, payload) {
            Ok(publication) => Some(publication),
            Err(e) => {
                self.failures.error.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "dropped a malformed channel message");
                None
            }
        };
        self.router.deliver(subject, decode, &mut wakeups);
        self.router.hub().wake(wakeups);
    }

    /// Adds `call` to a batch's pipeline; `epoch` is the one a stream
    /// created by it starts.
    fn add_script(&self, pipe: &mut redis::Pipeline, call: &ScriptCall, epoch: &str) {
        match call {
            ScriptCall::Publish(run) => {
                let publications = run.iter().map(|PublishOp { subject, data, .. }| {
                    let policy = self.namespaces.policy_for(subject);
                    let ttl_ms = policy.ttl.as_millis() as u64;
                    (&**subject, &**data, policy.size, ttl_ms)
                });
                pipe.add_command(publish_call(
                    &self.scripts.publish,
                    &self.settings.prefix,
                    self.max_bytes,
                    epoch,
                    publications,
                ));
            }
            ScriptCall::Read(ReadOp::Attach { attach, .. }) => {
                let read = ReadScript {
                    mode: ReadMode::Attach,
                    since: attach.since,
                    limit: usize::MAX,
                    max_bytes: attach.max_replay_bytes,
                };
                self.add_read(pipe, &attach.subject, read, epoch);
            }
            ScriptCall::Read(ReadOp::History { query, .. }) => {
                let read = ReadScript {
                    mode: ReadMode::Read,
                    since: query.since,
                    limit: query.limit,
                    max_bytes: usize::MAX,
                };
                self.add_read(pipe, &query.subject, read, epoch);
            }
        }
    }

    /// Adds a run of read.lua for `subject` to a pipeline.
    fn add_read(&self, pipe: &mut redis::Pipeline, subject: &str, read: ReadScript, epoch: &str) {
        let policy = self.namespaces.policy_for(subject);
        let (since_epoch, since_offset) = read
            .since
            .map_or((String::new(), 0), |p| (p.epoch.to_string(), p.offset));
        let mode = match read.mode {
            ReadMode::Attach => "attach",
            ReadMode::Read => "read",
        };
        pipe.add_command(scripts::evalsha(&self.scripts.read))
            .arg(&self.settings.prefix)
            .arg(subject)
            .arg(mode)
            .arg(policy.ttl.as_millis() as u64)
            .arg(epoch)
            .arg(since_epoch)
            .arg(since_offset)
            .arg(read.limit)
            .arg(read.max_bytes);
    }

    /// Answers the requests of `call` (see [`script_calls`]) with its
    /// reply.
    fn finish(&self, shard: usize, call: ScriptCall, value: Value, wakeups: &mut Wakeups) {
        let run = match call {
            ScriptCall::Publish(run) => run,
            ScriptCall::Read(read) => return self.finish_read(shard, read, value, wakeups),
        };
        // {totals, then epoch and offset of each publish}; a call that
        // failed fails each of its publishes the same way.
        let mut reply = ScriptReply::new(value).and_then(|mut r| {
            self.totals[shard].set(r.totals()?);
            Ok(r)
        });
        for PublishOp {
            subject,
            reply: answer,
            ..
        } in run
        {
            let outcome = match &mut reply {
                Ok(r) => r.position().map(|(epoch, offset)| {
                    epoch.map(|e| myriad_protocol::position::Position::new(e, offset))
                }),
                Err(e) => Err(e.clone()),
            };
            let outcome = outcome.map(|position| {
                let subscribers = self.router.subscribers(&subject);
                if subscribers == 0 {
                    self.publishes_unrouted.fetch_add(1, Ordering::Relaxed);
                }
                Published {
                    position,
                    subscribers: if position.is_some() { subscribers } else { 0 },
                }
            });
            if let Err(e) = &outcome {
                self.count_failure(e);
            }
            answer.send(self.router.hub(), outcome, wakeups);
        }
    }

    /// Answers an attach or history read with its script's reply.
    fn finish_read(&self, shard: usize, read: ReadOp, value: Value, wakeups: &mut Wakeups) {
        let hub = self.router.hub();
        match read {
            ReadOp::Attach { attach, life } => {
                let outcome = Read::parse(&attach.subject, value).map(|read| {
                    self.totals[shard].set(read.totals);
                    read.into_attachment()
                });
                if let Err(e) = &outcome {
                    self.count_failure(e);
                }
                self.router.answered(attach, life, outcome, wakeups);
            }
            ReadOp::History { query, reply } => {
                let outcome = Read::parse(&query.subject, value).map(|read| {
                    self.totals[shard].set(read.totals);
                    HistoryPage {
                        subject: query.subject,
                        position: read.position,
                        recovered: read.recovered,
                        publications: read.entries,
                    }
                });
                if let Err(e) = &outcome {
                    self.count_failure(e);
                }
                reply.send(hub, outcome, wakeups);
            }
        }
    }
}

/// Splits a batch's ops into script calls: each run of consecutive
/// publishes is one call of publish.lua (up to [`PUBLISH_RUN`] publishes
/// and about [`PUBLISH_RUN_BYTES`] of data, so one call never holds Redis
/// for long), each attach or read one call of read.lua. Order is kept:
/// Redis runs the calls in the pipeline's order.
fn script_calls(ops: Vec<Op>) -> Vec<ScriptCall> {
    let mut calls: Vec<ScriptCall> = Vec::new();
    let mut run_bytes = 0;
    for op in ops {
        match (op, calls.last_mut()) {
            (Op::Publish(p), Some(ScriptCall::Publish(run)))
                if run.len() < PUBLISH_RUN && run_bytes + p.data.len() <= PUBLISH_RUN_BYTES =>
            {
                run_bytes += p.data.len();
                run.push(p);
            }
            (Op::Publish(p), _) => {
                run_bytes = p.data.len();
                calls.push(ScriptCall::Publish(vec![p]));
            }
            (Op::Read(read), _) => calls.push(ScriptCall::Read(read)),
        }
    }
    calls
}

/// How read.lua treats a subject Redis has no stream for.
#[derive(Debug, Clone, Copy)]
enum ReadMode {
    /// A subscriber reads: the stream is created (and kept from expiring).
    Attach,
    /// A history read: the answer is a fresh epoch no stream shares.
    Read,
}

/// One read of a subject's position and history.
#[derive(Debug, Clone, Copy)]
struct ReadScript {
    mode: ReadMode,
    /// Publications after this position (a recovery); the last `limit`
    /// when unset.
    since: Option<myriad_protocol::position::Position>,
    limit: usize,
    /// Past this much, a recovery is reported incomplete.
    max_bytes: usize,
}

/// The engine of a node in a cluster joined over Redis.
pub struct RedisEngine {
    ctx: Arc<Context>,
    queues: Vec<ShardQueue>,
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
        if settings.urls.is_empty() {
            return Err(RedisEngineError::NoUrl);
        }
        let clients = settings
            .urls
            .iter()
            .map(|url| client(url, settings.tls.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        let shards = clients.len();
        let ctx = Arc::new(Context {
            router: Router::new(hub),
            namespaces,
            channel_prefix: format!("{}:c:", settings.prefix),
            settings,
            max_bytes,
            scripts: Scripts::new(),
            shards,
            totals: (0..shards).map(|_| TotalsCell::default()).collect(),
            failures: Failures::default(),
            publishes: AtomicU64::new(0),
            publishes_unrouted: AtomicU64::new(0),
            round_trips: AtomicU64::new(0),
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(RedisEngineError::Thread)?;
        let mut tasks = Vec::with_capacity(shards);
        let mut queues = Vec::with_capacity(shards);
        for (index, client) in clients.into_iter().enumerate() {
            let (mut shard, queue) = Shard::new(index, client, Arc::clone(&ctx));
            runtime
                .block_on(shard.connect())
                .map_err(|source| RedisEngineError::Unreachable {
                    url: ctx.settings.urls[index].clone(),
                    source,
                })?;
            tasks.push(shard);
            queues.push(queue);
        }
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("myriad-redis".into())
            .spawn(move || {
                let local = tokio::task::LocalSet::new();
                for shard in tasks {
                    local.spawn_local(shard.run());
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

    fn queue(&self, subject: &str) -> &ShardQueue {
        &self.queues[ring::shard_of(subject, self.queues.len())]
    }
}

/// A client for `url`, speaking RESP3 (channel messages and replies on one
/// connection), over TLS for a `rediss://` URL.
fn client(url: &str, tls: Option<&RedisTls>) -> Result<redis::Client, RedisEngineError> {
    use redis::IntoConnectionInfo;
    let bad = |source| RedisEngineError::BadUrl {
        url: url.to_owned(),
        source,
    };
    let info = url.into_connection_info().map_err(bad)?;
    let redis = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    let tls = tls.map(RedisTls::certificates);
    myriad_graph::redis_store::client_for(info.set_redis_settings(redis), tls).map_err(bad)
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

    fn congested(&self) -> bool {
        self.ctx.router.hub().congested() || self.queues.iter().any(ShardQueue::congested)
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
            waiting_attaches: self.queues.iter().map(|q| q.waiting() as u64).sum(),
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
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;

    use myriad_testkit::RedisServer;

    use super::*;
    use crate::engine::conformance::{self, Harness};

    /// The Redis of the running suite. Each harness gets its own prefix,
    /// which is a Redis of its own as far as the engine can tell (a
    /// restarted node over it would keep its epochs; a new prefix is a
    /// Redis that lost everything, as the suite's "restarted" engine
    /// expects). The server belongs to the test, which stops it: a static
    /// one would outlive the test process.
    static URL: Mutex<Option<String>> = Mutex::new(None);

    fn publish(bytes: usize) -> Op {
        Op::Publish(PublishOp {
            subject: Arc::from("s"),
            data: "x".repeat(bytes).into(),
            reply: Reply::Task(tokio::sync::oneshot::channel().0),
        })
    }

    fn read() -> Op {
        Op::Read(ReadOp::History {
            query: HistoryQuery {
                subject: Arc::from("s"),
                since: None,
                limit: 1,
            },
            reply: Reply::Task(tokio::sync::oneshot::channel().0),
        })
    }

    /// The calls `ops` make: publishes per publish.lua call, 0 for a read.
    fn calls(ops: Vec<Op>) -> Vec<usize> {
        script_calls(ops)
            .iter()
            .map(|call| match call {
                ScriptCall::Publish(run) => run.len(),
                ScriptCall::Read(_) => 0,
            })
            .collect()
    }

    #[test]
    fn publishes_share_a_call_until_a_read_or_a_bound_comes() {
        let ops = vec![publish(1), publish(1), read(), read(), publish(1)];
        assert_eq!(calls(ops), [2, 0, 0, 1]);
        let many: Vec<Op> = (0..PUBLISH_RUN * 2 + 1).map(|_| publish(1)).collect();
        let n = PUBLISH_RUN;
        assert_eq!(calls(many), [n, n, 1]);
        let half = PUBLISH_RUN_BYTES / 2;
        let big = vec![
            publish(half),
            publish(half),
            publish(1),
            publish(PUBLISH_RUN_BYTES * 2),
        ];
        assert_eq!(calls(big), [2, 1, 1]);
        assert!(script_calls(Vec::new()).is_empty());
    }

    fn redis(workers: usize, namespaces: Namespaces, max_bytes: usize) -> Harness {
        let url = URL.lock().unwrap().clone().expect("the suite's Redis");
        harness(settings(url), workers, namespaces, max_bytes)
    }

    /// The settings of an engine over `url`, under a prefix no other
    /// harness has.
    fn settings(url: String) -> RedisSettings {
        static HARNESSES: AtomicUsize = AtomicUsize::new(0);
        let n = HARNESSES.fetch_add(1, Ordering::Relaxed);
        RedisSettings {
            tls: None,
            urls: vec![url],
            prefix: format!("conformance{n}"),
            timeout: Duration::from_secs(10),
            queue: 100_000,
            queue_bytes: 64 << 20,
            queue_high_water: 0,
            linger: Duration::ZERO,
            feed_backlog: 1_000,
        }
    }

    fn harness(
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
    fn ten_kept() -> Namespaces {
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
        let feeds = 3 * shard::MAX_BATCH;
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
            feed_backlog: 2 * shard::MAX_BATCH,
            ..settings(server.url())
        };
        let h = harness(settings, 1, ten_kept(), 1 << 20);
        server.pause();
        // The task takes one batch at most, and is stuck with it.
        let feeds = 2 * shard::MAX_BATCH;
        for conn in 0..feeds as u32 {
            h.attach(&format!("feed{conn}"), conn, true);
        }
        h.engine.shut_down();
        assert_eq!(h.engine.stats().waiting_attaches, 0);
        for _ in 0..feeds - shard::MAX_BATCH {
            let attached = h.attached();
            assert!(matches!(attached.outcome, Err(EngineError::ShuttingDown)));
        }
        server.resume();
    }

    #[test]
    fn redis_engine_keeps_the_contract() {
        let server = RedisServer::start();
        *URL.lock().unwrap() = Some(server.url());
        conformance::run(redis);
    }
}
