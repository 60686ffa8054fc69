//! The engine seam: where publications get their positions, where history
//! lives, and where a subject's traffic leaves and enters the node.
//!
//! Workers and the admin API reach subjects only through an [`Engine`]; only
//! the engine knows whether the world is this node ([`memory`]) or a cluster
//! joined over Redis ([`redis`]). The engine in turn hands publications to the
//! node's [`Hub`](crate::hub::Hub), which fans them out to workers.
//!
//! # The contract
//! Every engine keeps these, and `conformance` checks them; any engine runs
//! that same suite unchanged.
//! 1. **Positions.** `publish` gives each publication the next offset of its
//!    subject: one more than the last, never going back within an epoch. The
//!    epoch changes whenever the engine cannot promise that offsets continue
//!    (a restart that lost history, a subject forgotten and created again).
//! 2. **Order.** Every subscriber receives a subject's publications in offset
//!    order, without gaps or duplicates, for as long as it stays attached.
//! 3. **Attach is the switch to live.** `attach` answers with an
//!    [`Event::Attached`] placed in the worker's mailbox *in line with* the
//!    subject's publications: it carries the position it was taken at (and,
//!    when recovery was asked, the publications after `since`), and every
//!    publication of that subject the worker takes after it has a higher
//!    offset than that position, with none missing. A recovery is complete
//!    only when the epoch matches and history holds every offset after
//!    `since`; otherwise the answer says `recovered: false` and replays
//!    nothing.
//! 4. **Interest.** Every `attach` is matched by exactly one `detach`, and
//!    the engine counts them per subject in its route: a subject gains
//!    interest on the node with its first attach and loses it with its last
//!    detach. Publications reach a worker only between its first attach and
//!    its last detach of that subject. A subject without history is
//!    forgotten with its last subscriber, so its next life starts a new
//!    epoch; one with history keeps its position while it holds
//!    publications and for its age limit after.
//! 5. **History.** Each subject keeps at most its namespace's `history_size`
//!    publications, none older than its `history_ttl`, and all history on a
//!    node stays within `history_max_bytes`, evicting the node's oldest
//!    publications first. A subject with history keeps its position after
//!    its last subscriber leaves.
//! 6. **Shutdown.** After `shut_down`, every request is answered with
//!    [`EngineError::ShuttingDown`]; an attach refused so is still matched
//!    by its detach.
//! 7. **Answers may come later.** `publish`, `history`, `presence` and
//!    `presence_stats` answer through a
//!    [`Reply`], attach through the worker's mailbox. A caller never blocks
//!    on an engine: an engine that must make a network round trip answers
//!    when it is done. `publish` never waits on a slow subscriber.
//! 8. **Presence.** An attach with a [`Join`] makes its connection a member
//!    of the subject before it is answered, unless the subject holds the
//!    join's `max_members` already: then the attach fails with
//!    [`EngineError::PresenceFull`] and nothing joins. `leave` ends the
//!    membership (a connection that is not a member is no change).
//!    `presence` pages the members in member-id order; `presence_stats`
//!    counts every member and every distinct user, exactly. An engine
//!    that keeps leases (Redis) removes a dead node's members within one
//!    lease. A join with `events` makes its subject tell every worker of
//!    each join and leave ([`Event::Presence`]), and a page of that subject
//!    is answered in line with them: in a worker's mailbox a change comes
//!    before a page exactly when the page holds it (the memory engine; the
//!    config keeps `join_leave` off the Redis engine).
//!
//! Submodules: [`memory`] (the single-node engine), [`redis`] (nodes
//! joined over Redis).

pub mod memory;
pub mod redis;

#[cfg(test)]
pub(crate) mod conformance;

use std::sync::Arc;

use myriad_protocol::position::{Epoch, Position};
use tokio::sync::oneshot;

use crate::hub::{Event, Hub, Wakeups};

// The mailbox messages are defined below the hub (see `crate::messages`);
// to the engine's callers they are part of its API.
pub use crate::messages::engine::{
    Answer, Attached, Attachment, Broken, ConnAnswer, ConnRequest, EngineError, HistoryPage, Join,
    Member, PresenceChange, PresencePage, PresenceQuery, PresenceStats, Published,
};

pub use memory::MemoryEngine;
pub use redis::{RedisEngine, RedisEngineError, RedisSettings, SentinelSettings};

/// The member id of the connection `to` names on node `node`: unique in
/// the cluster while the connection lives (its slot's life tells it from a
/// later connection in the same slot).
pub(crate) fn member_id(node: &str, to: &ConnRequest) -> Arc<str> {
    Arc::from(format!("{node}.{}.{}.{}", to.worker, to.conn, to.life))
}

/// A node id: random per start, as an epoch is.
pub(crate) fn random_node_id() -> String {
    format!("{:016x}", random_epoch().0)
}

/// A new epoch: random, so that a stream created again, on any node or
/// after any restart, never continues an old one's offsets.
pub(crate) fn random_epoch() -> Epoch {
    use std::hash::{BuildHasher as _, Hasher};
    // The standard library's per-process hash keys are seeded by the OS
    // and differ on every call; the time and pid separate nodes started
    // together.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    Epoch(hasher.finish())
}

/// A read of a subject's history.
#[derive(Debug, Clone)]
pub struct HistoryQuery {
    pub subject: Arc<str>,
    /// Only publications after this position; the last `limit` when unset.
    pub since: Option<Position>,
    pub limit: usize,
}

/// A connection asking to receive a subject.
#[derive(Debug, Clone)]
pub struct Attach {
    pub subject: Arc<str>,
    /// Recover from here before going live.
    pub since: Option<Position>,
    /// A replay larger than this is refused (`recovered: false`): it would
    /// not fit the connection's outbound limit.
    pub max_replay_bytes: usize,
    pub to: ConnRequest,
    /// Names this attach among others of the same connection and subject,
    /// so the worker can tell a stale answer from the current one.
    pub token: u64,
    /// Nobody waits on this attach: the node made it for a user's follow
    /// graph. An engine with a bounded queue towards a store lets it wait
    /// for room there instead of refusing it at once: a refusal is an error
    /// to a client that asked for nothing, and a retry from the keeper.
    pub can_wait: bool,
    /// The subject is a presence subject: the connection joins it
    /// (contract clause 8).
    pub join: Option<Join>,
}

/// Where an engine sends an answer.
#[derive(Debug)]
pub enum Reply<T> {
    /// A connection's request: the answer arrives in its worker's mailbox.
    /// A success nobody asked to hear about (no request id) is not sent.
    Conn(ConnRequest),
    /// A task awaiting it (the HTTP API).
    Task(oneshot::Sender<Result<T, EngineError>>),
}

impl<T> Reply<T>
where
    Result<T, EngineError>: Into<Answer>,
{
    /// Delivers `result`; a worker owed a wake-up is noted in `wakeups`.
    pub fn send(self, hub: &Hub, result: Result<T, EngineError>, wakeups: &mut Wakeups) {
        match self {
            Reply::Conn(to) => {
                if to.request.is_none() && result.is_ok() {
                    return;
                }
                let answer = ConnAnswer {
                    to,
                    answer: result.into(),
                };
                hub.send(to.worker, Event::Answer(Box::new(answer)), wakeups);
            }
            Reply::Task(tx) => {
                // The task may have given up (client gone); nothing to do then.
                let _ = tx.send(result);
            }
        }
    }
}

/// What an engine has done and holds, for `/stats` and `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EngineStats {
    /// Subjects with subscribers on this node.
    pub subjects: u64,
    /// What the engine keeps for those subjects on this node (outside the
    /// history budget: their subscriptions pay for it).
    pub subject_bytes: u64,
    /// Publishes taken (from this node).
    pub publishes: u64,
    /// Of those, publishes no subscriber on this node received.
    pub publishes_unrouted: u64,
    /// Round trips to an outside store that carried publishes, attaches
    /// and reads (a pipeline of Redis scripts each; none from the memory
    /// engine): with `publishes`, how well they share them.
    pub round_trips: u64,
    /// Connects to a Redis master other than the one before: failovers
    /// the engine followed (behind Sentinels; none on the memory engine).
    pub failovers: u64,
    /// Milliseconds the engine's Redis instances spent without a
    /// connection (no master, or unreachable), summed over instances.
    pub unavailable_ms: u64,
    /// Attaches that can wait ([`Attach::can_wait`]) waiting for room in a
    /// full queue towards the store (none on the memory engine).
    pub waiting_attaches: u64,
    pub history: HistoryStats,
    pub presence: PresenceCounts,
    pub failures: EngineFailures,
}

/// What presence holds and has done, on the node's part.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PresenceCounts {
    /// Members held now.
    pub members: u64,
    pub joined: u64,
    pub left: u64,
    /// Joins refused by `presence_max_members`.
    pub refused: u64,
    /// Members removed because their node's lease ended (its node died),
    /// by anyone in the cluster (none on the memory engine, whose members
    /// end with their node).
    pub expired: u64,
}

/// Requests an engine could not serve, by the error they got (always none
/// from the memory engine).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EngineFailures {
    /// [`EngineError::RedisUnavailable`] and [`EngineError::RedisLost`],
    /// including failed reconnects.
    pub unavailable: u64,
    /// [`EngineError::RedisTimeout`].
    pub timeout: u64,
    /// [`EngineError::RedisBusy`].
    pub busy: u64,
    /// [`EngineError::Redis`], and malformed messages from Redis.
    pub error: u64,
}

impl EngineFailures {
    /// The metric labels, in [`EngineFailures::by_kind`] order.
    pub const KINDS: [&'static str; 4] = [
        "redis_unavailable",
        "redis_timeout",
        "redis_busy",
        "redis_error",
    ];

    pub fn by_kind(&self) -> [(&'static str, u64); 4] {
        let [a, b, c, d] = Self::KINDS;
        [
            (a, self.unavailable),
            (b, self.timeout),
            (c, self.busy),
            (d, self.error),
        ]
    }
}

/// What all history on the node holds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HistoryStats {
    /// Subjects holding at least one publication.
    pub subjects: u64,
    /// Subjects kept with neither subscribers nor history: only their
    /// position, so that a client coming back recovers in the same epoch.
    pub positions: u64,
    pub messages: u64,
    /// Everything charged to `history_max_bytes` on this node: the
    /// publications, each history's own queue, and the state of every
    /// subject kept without subscribers.
    pub bytes: u64,
    /// Publications evicted to stay within the memory budget.
    pub evictions: u64,
    /// Idle positions forgotten to stay within the memory budget.
    pub evicted_positions: u64,
}

/// Positions, history and routing of publications; see the module contract.
pub trait Engine: Send + Sync + 'static {
    /// Publishes raw JSON `data` to `subject`.
    fn publish(&self, subject: &str, data: &str, reply: Reply<Published>, wakeups: &mut Wakeups);

    /// Starts delivering `attach.subject` to a connection (clauses 3 and 4).
    fn attach(&self, attach: Attach, wakeups: &mut Wakeups);

    /// Ends one attach of `subject` on `worker`; `last_local` says the worker
    /// has no other subscriber of it (attached or attaching) left.
    fn detach(&self, subject: &str, worker: usize, last_local: bool);

    /// Reads history.
    fn history(&self, query: HistoryQuery, reply: Reply<HistoryPage>, wakeups: &mut Wakeups);

    /// Ends the membership of the connection `to` names in `subject`
    /// (clause 8).
    fn leave(&self, subject: &str, to: ConnRequest, wakeups: &mut Wakeups);

    /// Reads one page of a presence subject's members (clause 8).
    fn presence(&self, query: PresenceQuery, reply: Reply<PresencePage>, wakeups: &mut Wakeups);

    /// Counts a presence subject's members and users (clause 8).
    fn presence_stats(&self, subject: Arc<str>, reply: Reply<PresenceStats>, wakeups: &mut Wakeups);

    /// True while the node cannot keep up with deliveries (or, for an
    /// engine with a store behind it, while requests pile up towards that
    /// store): callers that can wait (the HTTP API, connections sending
    /// publishes) should.
    fn congested(&self) -> bool;

    /// Counts of publishes, and what history holds now.
    fn stats(&self) -> EngineStats;

    /// The node is shutting down: from now on publishes, attaches and
    /// history reads are answered with [`EngineError::ShuttingDown`].
    fn shut_down(&self);
}
