//! What the engine sends a connection's worker: attach answers, answers to
//! publishes, history and presence reads, broken streams, and the errors
//! they carry.
//!
//! These ride in a worker's mailbox (`crate::hub::Event`), so they sit
//! below the hub that carries them and the engine that makes them; the
//! engine re-exports them as part of its API. A leaf but for the
//! publication and connection-id types they hold: it must not name the
//! hub, the engine, or anything above them.

use std::sync::Arc;

use myriad_protocol::message::{encode_presence, PresenceMember};
use myriad_protocol::position::Position;
use thiserror::Error;

use crate::publication::Publication;
use crate::registry::ConnId;

/// Why an engine could not do what it was asked.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum EngineError {
    /// The node is shutting down and takes no more requests.
    #[error("the node is shutting down")]
    ShuttingDown,
    /// The subject's Redis cannot be reached (the node reconnects by
    /// itself); the request was not sent.
    #[error("redis_unavailable: the subject's Redis cannot be reached")]
    RedisUnavailable,
    /// The connection to the subject's Redis broke while the request was
    /// on it: Redis may have carried it out. Counted, and named, as
    /// unavailable; it differs only in what is known of the outcome.
    #[error(
        "redis_unavailable: the connection to the subject's Redis broke before it answered; \
         the request may have been carried out"
    )]
    RedisLost,
    /// The subject's Redis did not answer within the timeout: the request
    /// was sent, and Redis may carry it out when it wakes.
    #[error(
        "redis_timeout: the subject's Redis did not answer in time; the request may still be \
         carried out"
    )]
    RedisTimeout,
    /// Too many requests, or too many bytes of them, already wait for the
    /// subject's Redis.
    #[error("redis_busy: too many requests or bytes wait for the subject's Redis")]
    RedisBusy,
    /// Redis answered with an error.
    #[error("redis_error: {0}")]
    Redis(String),
    /// A join to a presence subject that holds `max` members already.
    #[error("presence_full: the subject already has its {max} members (presence_max_members)")]
    PresenceFull { max: usize },
}

impl EngineError {
    /// Whether the request may have been carried out although it failed
    /// (a publish published): it reached Redis, whose answer never came or
    /// could not be read. The other errors refuse a request before it is
    /// sent, so it was not.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            EngineError::RedisLost | EngineError::RedisTimeout | EngineError::Redis(_) => true,
            EngineError::ShuttingDown
            | EngineError::RedisUnavailable
            | EngineError::RedisBusy
            | EngineError::PresenceFull { .. } => false,
        }
    }
}

/// A publish's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// The position given to the publication; `None` when the subject had no
    /// subscribers and keeps no history, so the publication was dropped.
    pub position: Option<Position>,
    /// Subscribers on this node it was handed to.
    pub subscribers: u32,
}

/// What a history read found.
#[derive(Debug, Clone)]
pub struct HistoryPage {
    pub subject: Arc<str>,
    /// The subject's position when it was read.
    pub position: Position,
    /// With `since`: whether the publications are everything after it (up
    /// to `limit`); `false` means the epoch changed or history is too short.
    pub recovered: Option<bool>,
    /// Oldest first.
    pub publications: Vec<Arc<Publication>>,
}

impl HistoryPage {
    /// The oldest publications whose envelopes fit `budget` bytes, and at
    /// least the first, so that one large publication cannot hide the rest
    /// from a reader paging on with `since`.
    pub fn page(&self, budget: usize) -> &[Arc<Publication>] {
        let mut used = 0;
        let fit = self
            .publications
            .iter()
            .take_while(|p| {
                used += p.envelope().len() + 1;
                used <= budget
            })
            .count();
        &self.publications[..fit.max(self.publications.len().min(1))]
    }
}

/// What a connection joining a presence subject brings (see
/// `crate::engine::Attach::join`): the member is the connection itself,
/// named by the engine from the attach's `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Join {
    /// The user the connection acts as; `None` for an anonymous one.
    pub user: Option<Arc<str>>,
    /// The token's `info` claim, raw JSON.
    pub info: Option<Arc<str>>,
    /// The namespace's `presence_max_members`: a join past it is refused.
    pub max_members: usize,
    /// The namespace's `join_leave`: the subject's subscribers are told of
    /// every join and leave ([`PresenceChange`]).
    pub events: bool,
}

/// A member joined or left a subject whose namespace has `join_leave`:
/// for the subject's live subscribers, in line with presence answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresenceChange {
    pub subject: Arc<str>,
    pub joined: bool,
    pub member: Member,
}

/// One member of a presence subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The connection's member id: the node's id, then worker, slot and
    /// life, so unique in the cluster while the connection lives.
    pub conn: Arc<str>,
    pub user: Option<Arc<str>>,
    pub info: Option<Arc<str>>,
}

/// A read of a presence subject's members.
#[derive(Debug, Clone)]
pub struct PresenceQuery {
    pub subject: Arc<str>,
    /// Only members whose id sorts after this one (the previous page's
    /// `next`).
    pub after: Option<Arc<str>>,
    pub limit: usize,
}

/// One page of a presence subject's members, ordered by member id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresencePage {
    pub subject: Arc<str>,
    pub members: Vec<Member>,
    /// The cursor of the next page (the last member's id) when more
    /// members follow.
    pub next: Option<Arc<str>>,
}

/// Bytes a member's entry in a `presence` reply takes besides its fields.
const MEMBER_OVERHEAD: usize = 32;

impl PresencePage {
    /// The `presence` reply (request `id`), cut to the members that fit
    /// `budget` bytes (at least one), so that it does not make its reader a
    /// slow consumer; when cut, `next` is the last member sent.
    pub fn reply(&self, id: Option<u64>, budget: usize) -> Vec<u8> {
        let mut used = 0;
        let fit = self
            .members
            .iter()
            .take_while(|m| {
                used += MEMBER_OVERHEAD
                    + m.conn.len()
                    + m.user.as_deref().map_or(0, str::len)
                    + m.info.as_deref().map_or(0, str::len);
                used <= budget
            })
            .count()
            .max(self.members.len().min(1));
        let sent = &self.members[..fit];
        let next = if fit < self.members.len() {
            sent.last().map(|m| &*m.conn)
        } else {
            self.next.as_deref()
        };
        let members = sent.iter().map(|m| PresenceMember {
            conn: &m.conn,
            user: m.user.as_deref(),
            info: m.info.as_deref(),
        });
        encode_presence(id, &self.subject, members, next)
    }
}

/// A presence subject's counts, exact: every member, however many a page
/// holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresenceStats {
    pub subject: Arc<str>,
    pub connections: u64,
    /// Distinct users among the members (anonymous members count as
    /// connections only).
    pub users: u64,
}

/// A request made on behalf of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnRequest {
    pub worker: usize,
    pub conn: ConnId,
    /// Which connection of that slab slot: slots are reused, and an answer
    /// that arrives after its connection closed must not reach the next.
    pub life: u32,
    /// The client's request id, when it gave one.
    pub request: Option<u64>,
}

/// The answer to an `Attach` (see `crate::engine`), in line with the subject's publications.
#[derive(Debug)]
pub struct Attached {
    pub subject: Arc<str>,
    pub to: ConnRequest,
    pub token: u64,
    pub outcome: Result<Attachment, EngineError>,
}

/// A successful attach.
#[derive(Debug)]
pub struct Attachment {
    /// Where the attach was taken: live delivery continues after the last
    /// of `replay`, or after this position when there is none.
    pub position: Position,
    /// Whether the recovery asked for was complete; `None` when none was.
    pub recovered: Option<bool>,
    /// Oldest first: with a complete recovery, the publications after
    /// `since`; without one asked, the publications after `position` that
    /// an engine whose answers trail live delivery had already handed to
    /// the worker (always none from the memory engine). Empty when the
    /// recovery failed.
    pub replay: Vec<Arc<Publication>>,
}

/// A subject's stream broke under its live subscribers: an engine that
/// lost sight of it (a Redis that restarted empty, or history too short to
/// cover an outage) tells every worker with subscribers where it goes on.
#[derive(Debug)]
pub struct Broken {
    pub subject: Arc<str>,
    /// Live delivery continues after this position.
    pub position: Position,
}

/// An answer for a connection, delivered through its worker's mailbox.
#[derive(Debug)]
pub struct ConnAnswer {
    pub to: ConnRequest,
    pub answer: Answer,
}

/// What a connection's request came to.
#[derive(Debug)]
pub enum Answer {
    Published(Result<Published, EngineError>),
    History(Result<HistoryPage, EngineError>),
    Presence(Result<PresencePage, EngineError>),
    PresenceStats(Result<PresenceStats, EngineError>),
}

impl From<Result<PresencePage, EngineError>> for Answer {
    fn from(result: Result<PresencePage, EngineError>) -> Answer {
        Answer::Presence(result)
    }
}

impl From<Result<PresenceStats, EngineError>> for Answer {
    fn from(result: Result<PresenceStats, EngineError>) -> Answer {
        Answer::PresenceStats(result)
    }
}

impl From<Result<Published, EngineError>> for Answer {
    fn from(result: Result<Published, EngineError>) -> Answer {
        Answer::Published(result)
    }
}

impl From<Result<HistoryPage, EngineError>> for Answer {
    fn from(result: Result<HistoryPage, EngineError>) -> Answer {
        Answer::History(result)
    }
}
