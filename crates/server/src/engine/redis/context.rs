//! [`Context`]: what the Redis engine's callers, instance tasks and
//! inboxes share (the router, settings, scripts, counters), and how a
//! script call is put into a pipeline and its reply answered.
//!
//! Below the instance task (`instance.rs`), which holds it and calls it, and
//! above [`ops`](super::ops), whose requests it answers; it must not name
//! the instance task or the engine in `mod.rs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use redis::Value;

use super::codec;
use super::keys;
use super::members::{self, Members};
use super::ops::{Op, PublishOp, Read, ReadOp, ScriptCall, ScriptReply, Totals};
use super::router::Router;
use super::scripts::{self, publish_call, Scripts};
use super::settings::RedisSettings;
use crate::engine::{EngineError, HistoryPage, Published};
use crate::hub::{Hub, Wakeups};
use crate::namespace::Namespaces;

#[derive(Debug, Default)]
pub(super) struct TotalsCell {
    pub(super) bytes: AtomicU64,
    pub(super) messages: AtomicU64,
    pub(super) evictions: AtomicU64,
    pub(super) subjects: AtomicU64,
}

impl TotalsCell {
    pub(super) fn set(&self, t: Totals) {
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        self.bytes.store(n(t.bytes), Ordering::Relaxed);
        self.messages.store(n(t.messages), Ordering::Relaxed);
        self.evictions.store(n(t.evictions), Ordering::Relaxed);
        self.subjects.store(n(t.subjects), Ordering::Relaxed);
    }

    /// From a `{bytes, messages, evictions, subjects}` reply.
    pub(super) fn store(&self, values: Vec<Value>) {
        let reply = ScriptReply::new(Value::Array(values));
        if let Ok(totals) = reply.and_then(|mut r| r.totals()) {
            self.set(totals);
        }
    }
}

/// Failures towards Redis, by kind, for `/metrics`.
#[derive(Debug, Default)]
pub(super) struct Failures {
    pub(super) unavailable: AtomicU64,
    pub(super) timeout: AtomicU64,
    pub(super) busy: AtomicU64,
    pub(super) error: AtomicU64,
}

/// What the engine's callers, instance tasks and inboxes share.
pub struct Context {
    pub(super) router: Router,
    pub(super) namespaces: Namespaces,
    pub(super) settings: RedisSettings,
    pub(super) max_bytes: usize,
    pub(super) scripts: Scripts,
    pub(super) instances: usize,
    pub(super) totals: Box<[TotalsCell]>,
    pub(super) failures: Failures,
    pub(super) publishes: AtomicU64,
    pub(super) publishes_unrouted: AtomicU64,
    /// Connects that reached another master than the one before (behind
    /// Sentinels: a failover followed).
    pub(super) failovers: AtomicU64,
    /// Milliseconds instances spent without a connection, summed.
    pub(super) unavailable_ms: AtomicU64,
    /// Script pipelines sent, over every instance.
    pub(super) round_trips: AtomicU64,
    /// Each partition's base ([`keys::base`]), by partition (today one
    /// per instance, in the same order).
    pub(super) bases: Box<[String]>,
    /// This node's presence members, for its lease renewals.
    pub(super) members: Members,
}

impl Context {
    /// What an engine over `instances` Redis instances shares, before any
    /// instance is connected.
    pub(super) fn new(
        hub: Arc<Hub>,
        namespaces: Namespaces,
        max_bytes: usize,
        settings: RedisSettings,
        instances: usize,
    ) -> Context {
        Context {
            router: Router::new(hub),
            namespaces,
            bases: (0..instances)
                .map(|i| keys::base(&settings.prefix, i))
                .collect(),
            members: Members::new(instances),
            settings,
            max_bytes,
            scripts: Scripts::new(),
            instances,
            totals: (0..instances).map(|_| TotalsCell::default()).collect(),
            failures: Failures::default(),
            publishes: AtomicU64::new(0),
            publishes_unrouted: AtomicU64::new(0),
            failovers: AtomicU64::new(0),
            unavailable_ms: AtomicU64::new(0),
            round_trips: AtomicU64::new(0),
        }
    }

    /// Answers the request with `error`.
    pub(super) fn fail(&self, op: Op, error: EngineError, wakeups: &mut Wakeups) {
        self.count_failure(&error);
        let hub = self.router.hub();
        match op {
            Op::Publish(p) => p.reply.send(hub, Err(error), wakeups),
            Op::Read(ReadOp::Attach { attach, life }) => {
                self.router.answered(attach, life, Err(error), wakeups)
            }
            Op::Read(ReadOp::History { reply, .. }) => reply.send(hub, Err(error), wakeups),
            // Sent again with the next renewal.
            Op::Read(ReadOp::Leave { subject, member }) => {
                self.members.lost_leave(subject, member);
            }
            Op::Read(ReadOp::Presence { reply, .. }) => reply.send(hub, Err(error), wakeups),
            Op::Read(ReadOp::PresenceStats { reply, .. }) => reply.send(hub, Err(error), wakeups),
        }
    }

    /// The base of `subject`'s partition.
    pub(super) fn base_of(&self, subject: &str) -> &str {
        &self.bases[keys::partition_of(subject, self.bases.len())]
    }

    pub(super) fn channel(&self, subject: &str) -> String {
        keys::channel(self.base_of(subject), subject)
    }

    pub(super) fn count_failure(&self, error: &EngineError) {
        let counter = match error {
            EngineError::RedisUnavailable | EngineError::RedisLost => &self.failures.unavailable,
            EngineError::RedisTimeout => &self.failures.timeout,
            EngineError::RedisBusy => &self.failures.busy,
            EngineError::Redis(_) => &self.failures.error,
            EngineError::ShuttingDown | EngineError::PresenceFull { .. } => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A message on one of this node's channels.
    pub(super) fn on_message(&self, channel: &[u8], payload: &[u8]) {
        let Some(subject) = keys::subject_of(&self.settings.prefix, channel) else {
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
    /// created (or renewed) by it starts, `replid` the master's (lib.lua,
    /// "failover").
    pub(super) fn add_script(
        &self,
        pipe: &mut redis::Pipeline,
        call: &ScriptCall,
        epoch: &str,
        replid: &str,
    ) {
        match call {
            ScriptCall::Publish(run) => {
                // A run is one instance's, so one partition's.
                let base = run.first().map_or("", |p| self.base_of(&p.subject));
                let publications = run.iter().map(|PublishOp { subject, data, .. }| {
                    let policy = self.namespaces.policy_for(subject);
                    let ttl_ms = policy.ttl.as_millis() as u64;
                    (&**subject, &**data, policy.size, ttl_ms)
                });
                pipe.add_command(publish_call(
                    &self.scripts.publish,
                    base,
                    self.max_bytes,
                    epoch,
                    replid,
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
                self.add_read(pipe, &attach.subject, read, epoch, replid);
                if let Some(join) = &attach.join {
                    // read.lua's join arguments, after its own (the last
                    // of which is the replication id).
                    let id = crate::engine::member_id(&self.members.node, &attach.to);
                    pipe.arg(&self.members.node)
                        .arg(&*id)
                        .arg(join.user.as_deref().unwrap_or(""))
                        .arg(join.info.as_deref().unwrap_or(""))
                        .arg(join.max_members)
                        .arg(self.settings.presence_lease.as_millis() as u64);
                }
            }
            ScriptCall::Read(ReadOp::Leave { subject, member }) => {
                let base = self.base_of(subject);
                let mut call = members::call(&self.scripts.presence, base, "leave");
                call.arg(&**subject).arg(&self.members.node).arg(&**member);
                pipe.add_command(call);
            }
            ScriptCall::Read(ReadOp::Presence { query, .. }) => {
                let base = self.base_of(&query.subject);
                let mut call = members::call(&self.scripts.presence, base, "page");
                call.arg(&*query.subject)
                    .arg(query.after.as_deref().unwrap_or(""))
                    .arg(query.limit);
                pipe.add_command(call);
            }
            ScriptCall::Read(ReadOp::PresenceStats { subject, .. }) => {
                let base = self.base_of(subject);
                let mut call = members::call(&self.scripts.presence, base, "stats");
                call.arg(&**subject);
                pipe.add_command(call);
            }
            ScriptCall::Read(ReadOp::History { query, .. }) => {
                let read = ReadScript {
                    mode: ReadMode::Read,
                    since: query.since,
                    limit: query.limit,
                    max_bytes: usize::MAX,
                };
                self.add_read(pipe, &query.subject, read, epoch, replid);
            }
        }
    }

    /// Adds a run of read.lua for `subject` to a pipeline.
    pub(super) fn add_read(
        &self,
        pipe: &mut redis::Pipeline,
        subject: &str,
        read: ReadScript,
        epoch: &str,
        replid: &str,
    ) {
        let policy = self.namespaces.policy_for(subject);
        let (since_epoch, since_offset) = read
            .since
            .map_or((String::new(), 0), |p| (p.epoch.to_string(), p.offset));
        let mode = match read.mode {
            ReadMode::Attach => "attach",
            ReadMode::Read => "read",
        };
        pipe.add_command(scripts::evalsha(&self.scripts.read, self.base_of(subject)))
            .arg(subject)
            .arg(mode)
            .arg(policy.ttl.as_millis() as u64)
            .arg(epoch)
            .arg(since_epoch)
            .arg(since_offset)
            .arg(read.limit)
            .arg(read.max_bytes)
            .arg(replid);
    }

    /// Answers the requests of `call` (see [`script_calls`](super::ops::script_calls)) with its
    /// reply.
    pub(super) fn finish(
        &self,
        instance: usize,
        call: ScriptCall,
        value: Value,
        wakeups: &mut Wakeups,
    ) {
        let run = match call {
            ScriptCall::Publish(run) => run,
            ScriptCall::Read(read) => return self.finish_read(instance, read, value, wakeups),
        };
        // {totals, then epoch and offset of each publish}; a call that
        // failed fails each of its publishes the same way.
        let mut reply = ScriptReply::new(value).and_then(|mut r| {
            self.totals[instance].set(r.totals()?);
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
    pub(super) fn finish_read(
        &self,
        instance: usize,
        read: ReadOp,
        value: Value,
        wakeups: &mut Wakeups,
    ) {
        let hub = self.router.hub();
        match read {
            ReadOp::Attach { attach, life } => {
                let outcome = Read::parse(&attach.subject, value).map(|read| {
                    self.totals[instance].set(read.totals);
                    read.into_attachment()
                });
                let outcome = match (outcome, &attach.join) {
                    (Ok(attachment), Some(_)) => {
                        let id = crate::engine::member_id(&self.members.node, &attach.to);
                        self.members.taken(&attach.subject, &id);
                        self.members.joined();
                        Ok(attachment)
                    }
                    (Err(e), Some(join)) => {
                        let id = crate::engine::member_id(&self.members.node, &attach.to);
                        self.members.release(&attach.subject, &id);
                        if members::is_full(&e) {
                            self.members.refused();
                            Err(EngineError::PresenceFull {
                                max: join.max_members,
                            })
                        } else {
                            Err(e)
                        }
                    }
                    (outcome, None) => outcome,
                };
                if let Err(e) = &outcome {
                    self.count_failure(e);
                }
                self.router.answered(attach, life, outcome, wakeups);
            }
            ReadOp::Leave { subject, member } => {
                match ScriptReply::new(value).and_then(|mut r| r.int()) {
                    Ok(1) => self.members.left(),
                    Ok(_) => {}
                    Err(e) => {
                        self.count_failure(&e);
                        self.members.lost_leave(subject, member);
                    }
                }
            }
            ReadOp::Presence { query, reply } => {
                let outcome = members::page(query.subject, value);
                if let Err(e) = &outcome {
                    self.count_failure(e);
                }
                reply.send(hub, outcome, wakeups);
            }
            ReadOp::PresenceStats { subject, reply } => {
                let outcome = members::stats(subject, value);
                if let Err(e) = &outcome {
                    self.count_failure(e);
                }
                reply.send(hub, outcome, wakeups);
            }
            ReadOp::History { query, reply } => {
                let outcome = Read::parse(&query.subject, value).map(|read| {
                    self.totals[instance].set(read.totals);
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

/// How read.lua treats a subject Redis has no stream for.
#[derive(Debug, Clone, Copy)]
pub(super) enum ReadMode {
    /// A subscriber reads: the stream is created (and kept from expiring).
    Attach,
    /// A history read: the answer is a fresh epoch no stream shares.
    Read,
}

/// One read of a subject's position and history.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReadScript {
    pub(super) mode: ReadMode,
    /// Publications after this position (a recovery); the last `limit`
    /// when unset.
    pub(super) since: Option<myriad_protocol::position::Position>,
    pub(super) limit: usize,
    /// Past this much, a recovery is reported incomplete.
    pub(super) max_bytes: usize,
}
