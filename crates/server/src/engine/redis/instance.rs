//! One Redis instance and the task that talks to it: the bounded queue of
//! requests towards it, their batching into round trips, its subscription
//! connection, and what happens when it goes away.
//!
//! Workers never wait on Redis: they put a request in the instance's queue
//! (`try_send`; a full queue refuses at once with `redis_busy`, except an
//! attach that can wait, which the [`Backlog`] holds) and the answer comes
//! back through the worker's mailbox. A subject losing its
//! last subscriber on the node is not a request that may be refused: it
//! goes in a set beside the queue (one entry per subject, however often it
//! comes and goes), so the node never keeps listening to a subject nobody
//! here wants. The task takes whatever has come (up to [`MAX_BATCH`]
//! requests, of which up to [`BACKLOG_SHARE`] are kept for the backlog's
//! oldest, so a queue kept full cannot starve it; with a `linger`, a batch
//! short of that waits as long for more) and runs it in at most four round
//! trips, however many there are:
//! 1. one `SUNSUBSCRIBE` for every subject still without subscribers;
//! 2. one pipeline of `forget` scripts for those;
//! 3. one `SSUBSCRIBE` for every subject that gained interest;
//! 4. one pipeline of scripts: the publishes (a run of them per call),
//!    attaches and reads, in order.
//!
//! Leaving before the scripts means a publish after the last detach finds
//! nobody listening here; subscribing before them is what makes an
//! attach's position come after its subscription (see router.rs). An
//! attach whose subscriber left while it waited is dropped unanswered (its
//! worker detached it and expects no answer) and subscribes nothing.
//!
//! One RESP3 connection carries commands and channel messages alike. When
//! it fails the task refuses everything (`redis_unavailable`) until it has
//! connected again, loaded its scripts and resubscribed every subject this
//! node still has interest in; the router restarts each subject's switch.
//! Behind Sentinels ([`Target`]) every connect asks them for the master
//! again, and a `-READONLY` answer (the master was demoted under the
//! connection) fails the connection like a drop, so the task follows a
//! failover by itself.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{AsyncPushSender, MultiplexedConnection, SendError};
use redis::{AsyncConnectionConfig, PushInfo, PushKind, Value};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use super::backlog::Backlog;
use super::context::{Context, ReadMode, ReadScript};
use super::ops::{script_calls, Op, Read, ReadOp, ScriptCall};
use super::target::{ConnectError, Master, Target};
use crate::engine::EngineError;
use crate::hub::Wakeups;

/// Requests one round trip carries at most.
pub(super) const MAX_BATCH: usize = 1_024;

/// Of a batch, the requests kept for the backlog while it holds any.
const BACKLOG_SHARE: usize = MAX_BATCH / 4;

/// Subjects per resubscribe command after a reconnect.
const RESUBSCRIBE_CHUNK: usize = 1_000;

/// Subjects the sweep visits per run, per second.
const SWEEP_BATCH: usize = 1_000;

/// First wait before reconnecting; doubled up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Subjects whose last subscriber on the node left, waiting for the task.
#[derive(Default)]
struct Leaving {
    subjects: Mutex<HashSet<Arc<str>>>,
    /// Wakes the task when the set gains one.
    added: Notify,
}

/// The sending side of an instance's queue.
pub struct InstanceQueue {
    tx: mpsc::Sender<Op>,
    leaving: Arc<Leaving>,
    /// Bytes (subjects and data) of the requests queued, or taken from the
    /// queue into the task's batch, shared with the task, which takes their
    /// weight off once the batch is answered. What the backlog holds is not
    /// weighed: its own count bounds it.
    queued_bytes: Arc<AtomicUsize>,
    /// The byte bound (`redis_queue_bytes`) beside the count bound
    /// (`redis_queue`, the channel's capacity): 65,536 requests of 64 KiB
    /// messages would otherwise let a stalled Redis hold 4 GiB of the node.
    max_bytes: usize,
    /// Waiting requests past which publishing pauses (0: never).
    high_water: usize,
    /// Where attaches that can wait go when the queue is full.
    backlog: Arc<Backlog<Op>>,
}

impl InstanceQueue {
    /// More requests wait than `redis_queue_high_water`.
    pub fn congested(&self) -> bool {
        self.high_water > 0 && self.tx.max_capacity() - self.tx.capacity() > self.high_water
    }

    /// The node's last subscriber of `subject` left: never refused.
    pub fn leave(&self, subject: &str) {
        let mut subjects = self
            .leaving
            .subjects
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if !subjects.contains(subject) {
            subjects.insert(Arc::from(subject));
            self.leaving.added.notify_one();
        }
    }

    /// Queues `op`; when the queue is full (in requests or in bytes), an
    /// op that can wait goes to the backlog, and the rest, or all once the
    /// backlog is full too, are answered at once, as are ops for a queue
    /// that is gone.
    pub fn send(&self, op: Op, ctx: &Context, wakeups: &mut Wakeups) {
        let weight = op.weight();
        // Reserved only if it fits, so a sender that does not fit never
        // makes a concurrent one that would look full.
        let fits = |held: usize| Some(held + weight).filter(|&after| after <= self.max_bytes);
        if self
            .queued_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, fits)
            .is_err()
        {
            return self.full(op, ctx, wakeups);
        }
        if let Err(e) = self.tx.try_send(op) {
            self.queued_bytes.fetch_sub(weight, Ordering::AcqRel);
            match e {
                mpsc::error::TrySendError::Full(op) => self.full(op, ctx, wakeups),
                mpsc::error::TrySendError::Closed(op) => {
                    ctx.fail(op, EngineError::ShuttingDown, wakeups)
                }
            }
        }
    }

    /// `op` found the queue full.
    fn full(&self, op: Op, ctx: &Context, wakeups: &mut Wakeups) {
        if !op.can_wait() {
            return ctx.fail(op, EngineError::RedisBusy, wakeups);
        }
        if let Err(op) = self.backlog.hold(op) {
            ctx.fail(op, EngineError::RedisBusy, wakeups);
        }
    }

    /// Attaches waiting in the backlog.
    pub fn waiting(&self) -> usize {
        self.backlog.len()
    }

    /// Answers every attach waiting in the backlog with `error`.
    pub fn refuse_waiting(&self, ctx: &Context, error: EngineError, wakeups: &mut Wakeups) {
        let mut waiting = Vec::new();
        self.backlog.take(&mut waiting, usize::MAX);
        for op in waiting {
            ctx.fail(op, error.clone(), wakeups);
        }
    }
}

/// Hands the channel messages of one connection to the router, in the
/// connection's own task (so in the order Redis sent them).
struct Inbox {
    ctx: Arc<Context>,
    lost: Arc<Notify>,
    closed: Arc<AtomicBool>,
}

impl AsyncPushSender for Inbox {
    fn send(&self, info: PushInfo) -> Result<(), SendError> {
        match info.kind {
            PushKind::SMessage => {
                if let [Value::BulkString(channel), Value::BulkString(payload)] = &info.data[..] {
                    self.ctx.on_message(channel, payload);
                }
            }
            PushKind::Disconnection => {
                self.closed.store(true, Ordering::Release);
                self.lost.notify_one();
            }
            _ => {}
        }
        Ok(())
    }
}

/// The task owning one Redis.
pub struct Instance {
    index: usize,
    target: Target,
    /// What the last connect reached: a new address behind Sentinels is a
    /// failover seen; the replication id goes to every script.
    master: Option<Master>,
    /// Since when the instance has had no connection, for the metric of
    /// time without one (moved on at every attempt to connect).
    down_since: Option<Instant>,
    /// Behind Sentinels, the new masters they announce (`host:port`).
    switches: Option<mpsc::UnboundedReceiver<String>>,
    ctx: Arc<Context>,
    rx: mpsc::Receiver<Op>,
    conn: Option<MultiplexedConnection>,
    /// Set by the inbox when the connection drops.
    closed: Arc<AtomicBool>,
    lost: Arc<Notify>,
    /// Subjects whose channel this node listens to on this Redis.
    subscribed: HashSet<Arc<str>>,
    leaving: Arc<Leaving>,
    /// See [`InstanceQueue::queued_bytes`].
    queued_bytes: Arc<AtomicUsize>,
    /// See [`InstanceQueue::backlog`]; the task takes from it with each batch.
    backlog: Arc<Backlog<Op>>,
    backoff: Duration,
    next_attempt: Instant,
}

impl Instance {
    /// The task of instance `index` and its queue, bounded as
    /// `ctx.settings` says.
    pub fn new(index: usize, target: Target, ctx: Arc<Context>) -> (Instance, InstanceQueue) {
        let (tx, rx) = mpsc::channel(ctx.settings.queue.max(1));
        let max_bytes = ctx.settings.queue_bytes;
        let high_water = ctx.settings.queue_high_water;
        let leaving = Arc::new(Leaving::default());
        let queued_bytes = Arc::new(AtomicUsize::new(0));
        let backlog = Arc::new(Backlog::new(ctx.settings.feed_backlog));
        let instance = Instance {
            index,
            target,
            master: None,
            down_since: None,
            switches: None,
            ctx,
            rx,
            conn: None,
            closed: Arc::new(AtomicBool::new(false)),
            lost: Arc::new(Notify::new()),
            subscribed: HashSet::new(),
            leaving: Arc::clone(&leaving),
            queued_bytes: Arc::clone(&queued_bytes),
            backlog: Arc::clone(&backlog),
            backoff: MIN_BACKOFF,
            next_attempt: Instant::now(),
        };
        let queue = InstanceQueue {
            tx,
            leaving,
            queued_bytes,
            max_bytes,
            high_water,
            backlog,
        };
        (instance, queue)
    }

    /// Finds the instance (behind Sentinels: asks them), opens a
    /// connection to it ([`Instance::open`]), checks it is the master, and
    /// catches live subscribers up. The master is recorded before the
    /// catch-up, whose reads carry its replication id.
    pub async fn connect(&mut self) -> Result<(), ConnectError> {
        self.count_down_time();
        let (client, at, addr) = self.target.client().await?;
        let failed = |source| ConnectError::Redis {
            at: at.clone(),
            source,
        };
        let mut conn = self.open(&client).await.map_err(failed)?;
        let master = self.target.check(&mut conn, at.clone(), addr).await?;
        if self.master.as_ref().is_some_and(|m| m.at != master.at) {
            self.ctx.failovers.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(instance = self.index, master = %master.at, "followed a failover");
        }
        self.master = Some(master);
        self.catch_up(&mut conn).await.map_err(failed)?;
        self.conn = Some(conn);
        self.down_since = None;
        self.backoff = MIN_BACKOFF;
        Ok(())
    }

    /// Adds the time without a connection so far to its metric.
    fn count_down_time(&mut self) {
        if let Some(since) = self.down_since.replace(Instant::now()) {
            let ms = since.elapsed().as_millis() as u64;
            self.ctx.unavailable_ms.fetch_add(ms, Ordering::Relaxed);
        }
    }

    /// The replication id the scripts compare streams with (see
    /// [`Master::replid`]).
    fn replid(&self) -> &str {
        self.master.as_ref().map_or("", |m| &m.replid)
    }

    /// Opens a connection, loads the scripts and subscribes it to every
    /// subject this node has interest in on this instance.
    async fn open(
        &mut self,
        client: &redis::Client,
    ) -> Result<MultiplexedConnection, redis::RedisError> {
        let timeout = self.ctx.settings.timeout;
        self.closed = Arc::new(AtomicBool::new(false));
        let inbox = Inbox {
            ctx: Arc::clone(&self.ctx),
            lost: Arc::clone(&self.lost),
            closed: Arc::clone(&self.closed),
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_push_sender(inbox);
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        for script in self.ctx.scripts.all() {
            script.load_async(&mut conn).await?;
        }
        let index = self.index;
        let instances = self.ctx.instances;
        let subjects = self
            .ctx
            .router
            .subjects(|s| super::ring::instance_of(s, instances) == index);
        for chunk in subjects.chunks(RESUBSCRIBE_CHUNK) {
            let channels: Vec<String> = chunk.iter().map(|s| self.ctx.channel(s)).collect();
            shard_subscription(&mut conn, "SSUBSCRIBE", &channels).await?;
        }
        self.subscribed = subjects.into_iter().collect();
        Ok(conn)
    }

    /// Brings the live subscribers of every resubscribed subject from where
    /// they stopped to the present: one read per subject, pipelined.
    async fn catch_up(&self, conn: &mut MultiplexedConnection) -> Result<(), redis::RedisError> {
        let (index, instances) = (self.index, self.ctx.instances);
        let resumes = self
            .ctx
            .router
            .resumes(|s| super::ring::instance_of(s, instances) == index);
        let epoch = crate::engine::random_epoch().to_string();
        for chunk in resumes.chunks(RESUBSCRIBE_CHUNK) {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for (subject, from) in chunk {
                // As an attach: the stream is created again if Redis lost
                // it, so the position it announces is the one that goes on.
                let read = ReadScript {
                    mode: ReadMode::Attach,
                    since: Some(*from),
                    limit: usize::MAX,
                    max_bytes: usize::MAX,
                };
                self.ctx
                    .add_read(&mut pipe, subject, read, &epoch, self.replid());
            }
            let values: Vec<Value> = pipe.query_async(conn).await?;
            let mut wakeups = Wakeups::default();
            for ((subject, _), value) in chunk.iter().zip(values) {
                // A read that fails fails the connection: the next one
                // tries again, and the subject holds what arrives meanwhile.
                let read = Read::parse(subject, value).map_err(|e| {
                    self.ctx.count_failure(&e);
                    protocol_error(format!("catch-up read of {subject}: {e}"))
                })?;
                self.ctx.totals[index].set(read.totals);
                self.ctx
                    .router
                    .resumed(subject, read.into_attachment(), &mut wakeups);
            }
            self.ctx.router.hub().wake(wakeups);
        }
        Ok(())
    }

    /// The connection is gone: every subject of this instance starts over.
    fn disconnect(&mut self, why: &dyn std::fmt::Display) {
        if self.conn.take().is_some() {
            tracing::warn!(instance = self.index, error = %why, "lost the connection to Redis");
        }
        self.down_since.get_or_insert_with(Instant::now);
        self.subscribed.clear();
        let (index, instances) = (self.index, self.ctx.instances);
        let mut wakeups = Wakeups::default();
        self.ctx.router.reset(
            |s| super::ring::instance_of(s, instances) == index,
            &EngineError::RedisUnavailable,
            &mut wakeups,
        );
        self.ctx.router.hub().wake(wakeups);
        self.next_attempt = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    pub async fn run(mut self) {
        let mut sweep = tokio::time::interval(Duration::from_secs(1));
        self.switches = self.target.watch_switches();
        // A third of a lease: two renewals may fail before members lapse.
        let mut renew = tokio::time::interval(self.ctx.settings.presence_lease / 3);
        loop {
            // The backlog's wake-up is one stored permit however many were
            // held meanwhile: while it holds any, the next batch is due now.
            let backlogged = self.backlog.len() > 0;
            let first = tokio::select! {
                op = self.rx.recv() => match op {
                    Some(op) => Some(op),
                    None => return,
                },
                _ = self.leaving.added.notified() => None,
                _ = self.backlog.added.notified() => None,
                () = std::future::ready(()), if backlogged => None,
                switch = next_switch(&mut self.switches) => {
                    if switched_away(&mut self.switches, self.master.as_ref(), switch) {
                        if self.conn.is_some() {
                            self.disconnect(&switched());
                        }
                        // Asked again at once, not after the back-off.
                        self.next_attempt = Instant::now();
                    }
                    continue;
                }
                _ = self.lost.notified(), if self.conn.is_some() => {
                    if self.closed.load(Ordering::Acquire) {
                        self.disconnect(&connection_dropped());
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(self.next_attempt), if self.conn.is_none() => {
                    self.reconnect().await;
                    continue;
                }
                _ = sweep.tick(), if self.conn.is_some() => {
                    self.sweep().await;
                    continue;
                }
                _ = renew.tick(), if self.conn.is_some() => {
                    self.renew().await;
                    continue;
                }
            };
            let mut ops: Vec<Op> = first.into_iter().collect();
            self.collect(&mut ops);
            let linger = self.ctx.settings.linger;
            let short = ops.len() + self.backlog.len() < MAX_BATCH;
            if !linger.is_zero() && !ops.is_empty() && short && self.conn.is_some() {
                // Publishes spread thinly over many subjects would each
                // wake Redis for a script call of their own, the costliest
                // part of a publish there (docs/benchmarks.md, "A linger
                // towards Redis"); held back, they share one. A full batch
                // has nothing to wait for, nor one Redis would refuse.
                tokio::time::sleep(linger).await;
                self.collect(&mut ops);
            }
            // What came through the queue is weighed off its byte bound
            // once answered; what the backlog held never weighed on it.
            let weight: usize = ops.iter().map(Op::weight).sum();
            self.backlog.take(&mut ops, MAX_BATCH);
            let leaving = self.take_leaving();
            if self.conn.is_none() && Instant::now() >= self.next_attempt {
                self.reconnect().await;
            }
            let mut wakeups = Wakeups::default();
            if self.conn.is_none() {
                // The subscriptions went with the connection; a reconnect
                // subscribes only to subjects with subscribers.
                for op in ops {
                    self.ctx
                        .fail(op, EngineError::RedisUnavailable, &mut wakeups);
                }
            } else {
                self.execute(leaving, ops, &mut wakeups).await;
            }
            self.queued_bytes.fetch_sub(weight, Ordering::AcqRel);
            self.ctx.router.hub().wake(wakeups);
        }
    }

    async fn reconnect(&mut self) {
        if let Err(e) = self.connect().await {
            self.ctx.count_failure(&EngineError::RedisUnavailable);
            self.disconnect(&e);
        }
    }

    /// The subjects that lost their last subscriber since the last batch.
    fn take_leaving(&self) -> Vec<Arc<str>> {
        let mut subjects = self
            .leaving
            .subjects
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        subjects.drain().collect()
    }

    /// Adds what has queued up to `batch`, up to [`MAX_BATCH`] less the
    /// backlog's share.
    fn collect(&mut self, batch: &mut Vec<Op>) {
        let limit = MAX_BATCH - self.backlog.len().min(BACKLOG_SHARE);
        while batch.len() < limit {
            match self.rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
    }

    /// Runs one batch in the order the module header gives.
    async fn execute(&mut self, leaving: Vec<Arc<str>>, ops: Vec<Op>, wakeups: &mut Wakeups) {
        let ctx = Arc::clone(&self.ctx);
        let mut conn = self.conn.clone().expect("connected");
        // A subject may have gained a subscriber again since it was left.
        let gone: Vec<Arc<str>> = leaving
            .into_iter()
            .filter(|s| ctx.router.subscribers(s) == 0 && self.subscribed.remove(s))
            .collect();
        if !gone.is_empty() {
            if let Err(e) = self.unsubscribe(&mut conn, &gone).await {
                return self.fail_all(ops, &e, false, wakeups);
            }
        }
        let mut subscribe = Vec::new();
        let mut scripted = Vec::with_capacity(ops.len());
        for op in ops {
            if let Op::Read(ReadOp::Attach { attach, life }) = &op {
                if !ctx.router.is_current(&attach.subject, *life) {
                    // Its subscriber left while it waited: nobody wants
                    // the answer, and the subject needs no subscription.
                    continue;
                }
                if self.subscribed.insert(Arc::clone(&attach.subject)) {
                    subscribe.push(ctx.channel(&attach.subject));
                }
            }
            scripted.push(op);
        }
        if !subscribe.is_empty() {
            let subscribed = shard_subscription(&mut conn, "SSUBSCRIBE", &subscribe);
            let master = self.master.as_ref();
            if let Err(e) = unless_switched(&mut self.switches, master, subscribed).await {
                return self.fail_all(scripted, &e, false, wakeups);
            }
        }
        if scripted.is_empty() {
            return;
        }
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        // One fresh epoch serves the batch: only streams that do not exist
        // take it, and a subject is created at most once per batch.
        let epoch = crate::engine::random_epoch().to_string();
        let calls = script_calls(scripted);
        for call in &calls {
            ctx.add_script(&mut pipe, call, &epoch, self.replid());
        }
        ctx.round_trips.fetch_add(1, Ordering::Relaxed);
        let replies = pipe.query_async::<Vec<Value>>(&mut conn);
        let master = self.master.as_ref();
        let failed = match unless_switched(&mut self.switches, master, replies).await {
            Ok(values) if values.len() == calls.len() => {
                let demoted = values.iter().any(is_read_only);
                for (call, value) in calls.into_iter().zip(values) {
                    ctx.finish(self.index, call, value, wakeups);
                }
                if demoted {
                    // Answered `redis_unavailable` (ScriptReply); the next
                    // connect asks the Sentinels where the master is now.
                    self.disconnect(&"the master became a replica (-READONLY)");
                }
                return;
            }
            Ok(values) => protocol_error(format!(
                "{} replies to {} scripts",
                values.len(),
                calls.len()
            )),
            Err(e) => e,
        };
        let ops = calls.into_iter().flat_map(ScriptCall::into_ops).collect();
        self.fail_all(ops, &failed, true, wakeups);
    }

    /// Stops listening to `subjects`, then lets Redis forget those nobody
    /// listens to any more.
    async fn unsubscribe(
        &self,
        conn: &mut MultiplexedConnection,
        subjects: &[Arc<str>],
    ) -> Result<(), redis::RedisError> {
        let ctx = &*self.ctx;
        let channels: Vec<String> = subjects.iter().map(|s| ctx.channel(s)).collect();
        shard_subscription(conn, "SUNSUBSCRIBE", &channels).await?;
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for subject in subjects {
            let policy = ctx.namespaces.policy_for(subject);
            pipe.add_command(super::scripts::evalsha(
                &ctx.scripts.forget,
                ctx.base_of(subject),
            ))
            .arg(&**subject)
            .arg(policy.size);
        }
        let mut values: Vec<Value> = pipe.query_async(conn).await?;
        if let Some(Value::Array(totals)) = values.pop() {
            ctx.totals[self.index].store(totals);
        }
        Ok(())
    }

    /// A round trip failed: its requests are refused, and a connection
    /// failure starts the reconnecting. `sent`: the requests were on the
    /// connection, so Redis may have carried them out; otherwise what
    /// failed came before them, and they are only unavailable.
    fn fail_all(
        &mut self,
        ops: Vec<Op>,
        error: &redis::RedisError,
        sent: bool,
        wakeups: &mut Wakeups,
    ) {
        let engine_error = match classify(error) {
            EngineError::RedisTimeout | EngineError::RedisLost if !sent => {
                EngineError::RedisUnavailable
            }
            e => e,
        };
        for op in ops {
            self.ctx.fail(op, engine_error.clone(), wakeups);
        }
        if error.is_unrecoverable_error()
            || error.is_timeout()
            || error.is_connection_dropped()
            || error.code() == Some("READONLY")
        {
            self.disconnect(error);
        }
    }

    async fn sweep(&mut self) {
        let Some(mut conn) = self.conn.clone() else {
            return;
        };
        let base = &self.ctx.bases[self.index];
        let mut invocation = self.ctx.scripts.sweep.prepare_invoke();
        for key in super::keys::shared(base) {
            invocation.key(key);
        }
        invocation.arg(base).arg(SWEEP_BATCH);
        let totals = invocation.invoke_async::<Vec<Value>>(&mut conn);
        match unless_switched(&mut self.switches, self.master.as_ref(), totals).await {
            Ok(totals) => self.ctx.totals[self.index].store(totals),
            Err(e) => {
                let mut wakeups = Wakeups::default();
                self.fail_all(Vec::new(), &e, false, &mut wakeups);
                self.ctx.router.hub().wake(wakeups);
            }
        }
    }
}

/// The engine error a Redis failure is reported as.
fn classify(error: &redis::RedisError) -> EngineError {
    if error.is_timeout() {
        EngineError::RedisTimeout
    } else if error.is_unrecoverable_error() || error.is_connection_dropped() || error.is_io_error()
    {
        EngineError::RedisLost
    } else {
        EngineError::Redis(error.to_string())
    }
}

/// `reply`, unless the Sentinels first announce a master other than
/// `master`: one cut off with its connection open (a partition, a stopped
/// process) would hold the task until `redis_timeout`. Then the connection
/// counts as lost, and what was sent on it is of unknown outcome.
async fn unless_switched<T>(
    switches: &mut Option<mpsc::UnboundedReceiver<String>>,
    master: Option<&Master>,
    reply: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    tokio::pin!(reply);
    loop {
        tokio::select! {
            answer = &mut reply => return answer,
            switch = next_switch(switches) => {
                if switched_away(switches, master, switch) {
                    return Err(switched());
                }
            }
        }
    }
}

/// Whether `switch`, the next of `switches`, names a master other than
/// `master`; a watch that ended is dropped.
fn switched_away(
    switches: &mut Option<mpsc::UnboundedReceiver<String>>,
    master: Option<&Master>,
    switch: Option<String>,
) -> bool {
    match switch {
        Some(addr) => master.is_some_and(|m| m.addr != addr),
        None => {
            *switches = None;
            false
        }
    }
}

fn switched() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "the Sentinels announced a new master",
    ))
}

/// The next master the Sentinels announce; never, without them.
async fn next_switch(switches: &mut Option<mpsc::UnboundedReceiver<String>>) -> Option<String> {
    match switches {
        Some(switches) => switches.recv().await,
        None => std::future::pending().await,
    }
}

/// `command` (`SSUBSCRIBE` or `SUNSUBSCRIBE`) of `channels`. Subjects'
/// channels are sharded channels (Redis 7): a Redis Cluster keeps each on
/// its slot's master instead of sending every message to every node, and
/// a lone Redis serves them alike. One command per channel, in one
/// pipeline: the connection takes each confirmation as the reply of the
/// oldest command waiting, so one channel a command keeps the two paired
/// (the crate's own `ssubscribe` is its cluster client's only).
async fn shard_subscription(
    conn: &mut MultiplexedConnection,
    command: &str,
    channels: &[String],
) -> Result<(), redis::RedisError> {
    if channels.is_empty() {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    for channel in channels {
        pipe.cmd(command).arg(channel);
    }
    pipe.query_async::<Vec<Value>>(conn).await.map(drop)
}

/// A script's answer from a master demoted to a replica.
fn is_read_only(value: &Value) -> bool {
    matches!(value, Value::ServerError(e) if e.code() == "READONLY")
}

fn connection_dropped() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "the connection to Redis closed",
    ))
}

fn protocol_error(what: String) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::InvalidData, what))
}

mod presence;
#[cfg(test)]
mod tests;
