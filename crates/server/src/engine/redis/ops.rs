//! What travels through a Redis instance's queue and what comes back: the
//! requests ([`Op`]), their grouping into script calls ([`script_calls`])
//! and the scripts' replies read field by field ([`ScriptReply`], [`Read`],
//! [`Totals`]).
//!
//! Below both the instance task (`instance.rs`) and the engine's shared
//! [`Context`](super::context::Context) that answers them, so neither
//! calls back into the other for these; it must not name either.

use std::sync::Arc;

use myriad_protocol::position::{Epoch, Position};
use redis::Value;

use super::codec;
use crate::engine::{
    Attach, Attachment, EngineError, HistoryPage, HistoryQuery, PresencePage, PresenceQuery,
    PresenceStats, Published, Reply,
};

/// Publishes one publish.lua call carries at most, and about how many
/// bytes of data: Redis runs nothing else while a script runs, so a call
/// is kept to a few milliseconds of its time.
const PUBLISH_RUN: usize = 256;
const PUBLISH_RUN_BYTES: usize = 1 << 20;

/// A request for one Redis: a publish (runs of them share a call of
/// publish.lua) or a read (a call of read.lua each).
pub enum Op {
    Publish(PublishOp),
    Read(ReadOp),
}

/// A publish waiting for its Redis.
pub struct PublishOp {
    pub subject: Arc<str>,
    pub data: Box<str>,
    pub reply: Reply<Published>,
}

/// A read of a subject's stream waiting for its Redis.
pub enum ReadOp {
    /// A subscriber attaches (its subject's stream is created if need be).
    Attach { attach: Attach, life: u64 },
    /// A history read.
    History {
        query: HistoryQuery,
        reply: Reply<HistoryPage>,
    },
    /// A member of this node leaves (a call of presence.lua); nobody
    /// waits on it: a leave that fails is made by the lease.
    Leave { subject: Arc<str>, member: Arc<str> },
    /// A page of a presence subject's members.
    Presence {
        query: PresenceQuery,
        reply: Reply<PresencePage>,
    },
    /// A presence subject's counts.
    PresenceStats {
        subject: Arc<str>,
        reply: Reply<PresenceStats>,
    },
}

impl ReadOp {
    pub(super) fn subject(&self) -> &str {
        match self {
            ReadOp::Attach { attach, .. } => &attach.subject,
            ReadOp::History { query, .. } => &query.subject,
            ReadOp::Leave { subject, .. } | ReadOp::PresenceStats { subject, .. } => subject,
            ReadOp::Presence { query, .. } => &query.subject,
        }
    }
}

impl Op {
    /// What the request holds of the node's memory while it waits, for the
    /// queue's byte bound: its subject, and a publication's data.
    pub(super) fn weight(&self) -> usize {
        match self {
            Op::Publish(p) => p.subject.len() + p.data.len(),
            Op::Read(read) => read.subject().len(),
        }
    }

    /// Whether it may wait in the backlog when the queue is full.
    pub(super) fn can_wait(&self) -> bool {
        matches!(self, Op::Read(ReadOp::Attach { attach, .. }) if attach.can_wait)
    }
}

/// One script call of a batch, with the requests it answers.
pub enum ScriptCall {
    /// A run of consecutive publishes: one call of publish.lua.
    Publish(Vec<PublishOp>),
    /// One call of read.lua.
    Read(ReadOp),
}

impl ScriptCall {
    /// The requests, to be refused together.
    pub(super) fn into_ops(self) -> Vec<Op> {
        match self {
            ScriptCall::Publish(run) => run.into_iter().map(Op::Publish).collect(),
            ScriptCall::Read(read) => vec![Op::Read(read)],
        }
    }
}

/// An instance's history totals, from its scripts' replies.
#[derive(Debug, Default, Clone, Copy)]
pub struct Totals {
    pub(super) bytes: i64,
    pub(super) messages: i64,
    pub(super) evictions: i64,
    pub(super) subjects: i64,
}

/// Splits a batch's ops into script calls: each run of consecutive
/// publishes is one call of publish.lua (up to [`PUBLISH_RUN`] publishes
/// and about [`PUBLISH_RUN_BYTES`] of data, so one call never holds Redis
/// for long), each attach or read one call of read.lua. Order is kept:
/// Redis runs the calls in the pipeline's order.
pub(super) fn script_calls(ops: Vec<Op>) -> Vec<ScriptCall> {
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

/// The reply of a publish or read script, read field by field.
pub struct ScriptReply {
    values: std::vec::IntoIter<Value>,
}

impl ScriptReply {
    pub fn new(value: Value) -> Result<ScriptReply, EngineError> {
        match value {
            Value::Array(values) => Ok(ScriptReply {
                values: values.into_iter(),
            }),
            // A master demoted under the connection: the instance task
            // finds the new one (instance.rs); meanwhile Redis is as
            // unavailable as when the connection is down.
            Value::ServerError(e) if e.code() == "READONLY" => Err(EngineError::RedisUnavailable),
            Value::ServerError(e) => Err(EngineError::Redis(e.to_string())),
            other => Err(EngineError::Redis(format!(
                "unexpected script reply {other:?}"
            ))),
        }
    }

    /// The next string, or `None` at the reply's end.
    pub fn next_bytes(&mut self) -> Result<Option<Vec<u8>>, EngineError> {
        match self.values.next() {
            None => Ok(None),
            Some(Value::BulkString(bytes)) => Ok(Some(bytes)),
            Some(Value::SimpleString(s)) => Ok(Some(s.into_bytes())),
            Some(other) => Err(EngineError::Redis(format!(
                "expected a string, got {other:?}"
            ))),
        }
    }

    fn next(&mut self) -> Result<Value, EngineError> {
        self.values
            .next()
            .ok_or_else(|| EngineError::Redis("short script reply".into()))
    }

    pub fn bytes(&mut self) -> Result<Vec<u8>, EngineError> {
        match self.next()? {
            Value::BulkString(bytes) => Ok(bytes),
            Value::SimpleString(s) => Ok(s.into_bytes()),
            other => Err(EngineError::Redis(format!(
                "expected a string, got {other:?}"
            ))),
        }
    }

    pub fn int(&mut self) -> Result<i64, EngineError> {
        match self.next()? {
            Value::Int(n) => Ok(n),
            other => Err(EngineError::Redis(format!(
                "expected an integer, got {other:?}"
            ))),
        }
    }

    /// An epoch, or `None` for the empty string (a dropped publish).
    pub fn epoch(&mut self) -> Result<Option<Epoch>, EngineError> {
        let bytes = self.bytes()?;
        if bytes.is_empty() {
            return Ok(None);
        }
        std::str::from_utf8(&bytes)
            .ok()
            .and_then(|s| s.parse().ok())
            .map(Some)
            .ok_or_else(|| {
                EngineError::Redis(format!("bad epoch {:?}", String::from_utf8_lossy(&bytes)))
            })
    }

    pub fn position(&mut self) -> Result<(Option<Epoch>, u64), EngineError> {
        let epoch = self.epoch()?;
        let offset =
            u64::try_from(self.int()?).map_err(|_| EngineError::Redis("negative offset".into()))?;
        Ok((epoch, offset))
    }

    pub fn totals(&mut self) -> Result<Totals, EngineError> {
        Ok(Totals {
            bytes: self.int()?,
            messages: self.int()?,
            evictions: self.int()?,
            subjects: self.int()?,
        })
    }

    /// The rest: history entries of `subject` in `epoch`.
    pub fn entries(
        self,
        subject: &Arc<str>,
        epoch: Epoch,
    ) -> Result<Vec<Arc<crate::publication::Publication>>, EngineError> {
        self.values
            .map(|v| match v {
                Value::BulkString(entry) => codec::history_entry(subject, epoch, &entry)
                    .map_err(|e| EngineError::Redis(e.to_string())),
                other => Err(EngineError::Redis(format!(
                    "expected an entry, got {other:?}"
                ))),
            })
            .collect()
    }
}

/// What a read script found.
pub struct Read {
    pub position: Position,
    pub recovered: Option<bool>,
    pub entries: Vec<Arc<crate::publication::Publication>>,
    pub totals: Totals,
}

impl Read {
    pub fn parse(subject: &Arc<str>, value: Value) -> Result<Read, EngineError> {
        let mut reply = ScriptReply::new(value)?;
        let (epoch, offset) = reply.position()?;
        let epoch = epoch.ok_or_else(|| EngineError::Redis("read without an epoch".into()))?;
        let recovered = match reply.int()? {
            -1 => None,
            flag => Some(flag == 1),
        };
        let totals = reply.totals()?;
        let entries = reply.entries(subject, epoch)?;
        Ok(Read {
            position: Position::new(epoch, offset),
            recovered,
            entries,
            totals,
        })
    }

    /// As an attach's answer, before the router places it.
    pub fn into_attachment(self) -> Attachment {
        Attachment {
            position: self.position,
            recovered: self.recovered,
            replay: self.entries,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::HistoryQuery;

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
}
