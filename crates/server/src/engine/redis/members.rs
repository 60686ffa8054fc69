//! [`Members`]: the Redis engine's presence on this node's side: the
//! node's id, which of its connections are members of which subject (what
//! its lease renewals name), its counters, and how presence.lua is called
//! and its replies read. The members themselves live in Redis (lib.lua's
//! presence keys); this never decides membership, it only remembers what
//! Redis answered, and tells a Redis that lost them (restarted with
//! nothing on disk, a failover that lost the newest writes) the members it
//! had taken, so they are listed again.
//!
//! Below the instance task and the context, like [`ops`](super::ops): it
//! must not name either.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use redis::Value;

use super::ops::ScriptReply;
use super::scripts;
use crate::engine::{EngineError, Join, Member, PresenceCounts, PresencePage, PresenceStats};

/// Subjects a renewal names per script call: Redis runs nothing else
/// while a script runs.
pub(super) const RENEW_BATCH: usize = 500;

/// One member of this node, as its join named it.
#[derive(Clone)]
pub(super) struct Held {
    pub(super) user: Option<Arc<str>>,
    pub(super) info: Option<Arc<str>>,
    /// Redis took the join: only such a member is put back after a loss,
    /// since one whose join is on its way (or was refused by the cap) is
    /// not Redis's to list yet.
    taken: bool,
}

/// Member id → what its join named.
type Ids = HashMap<Arc<str>, Held>;

/// This node's members, by subject; see the module header.
pub struct Members {
    /// Starts every member id of this node, and names its leases.
    pub(super) node: String,
    /// Subject → the members of this node in it. Nothing runs under this
    /// lock but the map.
    held: Mutex<HashMap<Arc<str>, Ids>>,
    /// Leaves Redis did not take (unreachable, busy, an error): sent again
    /// with the next renewal of their instance, since this node's lease
    /// would otherwise keep them listed for as long as it lives.
    lost: Mutex<Vec<(Arc<str>, Arc<str>)>>,
    joined: AtomicU64,
    left: AtomicU64,
    refused: AtomicU64,
    /// Per instance, the members it ever expired (all nodes' leases), as
    /// of this node's last renewal there.
    expired: Box<[AtomicU64]>,
}

impl Members {
    pub(super) fn new(instances: usize) -> Members {
        Members {
            node: crate::engine::random_node_id(),
            held: Mutex::default(),
            lost: Mutex::default(),
            joined: AtomicU64::new(0),
            left: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            expired: (0..instances).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Instance `index` has expired `total` members so far.
    pub(super) fn expired_on(&self, index: usize, total: u64) {
        self.expired[index].fetch_max(total, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Ids>> {
        crate::sharded::lock(&self.held)
    }

    /// A join of `id` to `subject` as `join` names it is on its way to
    /// Redis: held from now, in the order the worker asks, so that a leave
    /// asked before the join's answer comes releases it.
    pub(super) fn hold(&self, subject: &Arc<str>, id: Arc<str>, join: &Join) {
        let held = Held {
            user: join.user.clone(),
            info: join.info.clone(),
            taken: false,
        };
        self.lock()
            .entry(Arc::clone(subject))
            .or_default()
            .insert(id, held);
    }

    /// Redis took the join of `id` to `subject`, unless it has left since.
    pub(super) fn taken(&self, subject: &str, id: &str) {
        if let Some(held) = self.lock().get_mut(subject).and_then(|ids| ids.get_mut(id)) {
            held.taken = true;
        }
    }

    /// `id` is no longer a member of `subject` (it left, or its join was
    /// refused).
    pub(super) fn release(&self, subject: &str, id: &str) {
        let mut held = self.lock();
        if let Some(ids) = held.get_mut(subject) {
            ids.remove(id);
            if ids.is_empty() {
                held.remove(subject);
            }
        }
    }

    /// A leave of `member` from `subject` did not reach Redis.
    pub(super) fn lost_leave(&self, subject: Arc<str>, member: Arc<str>) {
        crate::sharded::lock(&self.lost).push((subject, member));
    }

    /// The lost leaves `pick` keeps (those of one instance), taken.
    pub(super) fn take_lost(&self, pick: impl Fn(&str) -> bool) -> Vec<(Arc<str>, Arc<str>)> {
        let mut lost = crate::sharded::lock(&self.lost);
        let (mine, others) = lost.drain(..).partition(|(s, _)| pick(s));
        *lost = others;
        mine
    }

    /// Redis made a member.
    pub(super) fn joined(&self) {
        self.joined.fetch_add(1, Ordering::Relaxed);
    }

    /// Redis removed a member on a leave.
    pub(super) fn left(&self) {
        self.left.fetch_add(1, Ordering::Relaxed);
    }

    /// Redis refused a join by the cap.
    pub(super) fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// The subjects this node holds members of that `pick` keeps (those of
    /// one instance), each with how many of them Redis took: a renewal
    /// names both, and Redis holding fewer tells of a loss.
    pub(super) fn subjects(&self, pick: impl Fn(&str) -> bool) -> Vec<(Arc<str>, usize)> {
        let held = self.lock();
        let subjects = held.iter().filter(|(s, _)| pick(s));
        subjects
            .map(|(s, ids)| (Arc::clone(s), ids.values().filter(|h| h.taken).count()))
            .collect()
    }

    /// The members of `subject` Redis took, to be put back after a loss.
    pub(super) fn taken_in(&self, subject: &str) -> Vec<(Arc<str>, Held)> {
        let held = self.lock();
        let ids = held.get(subject).into_iter().flatten();
        ids.filter(|(_, h)| h.taken)
            .map(|(id, h)| (Arc::clone(id), h.clone()))
            .collect()
    }

    pub(super) fn counts(&self) -> PresenceCounts {
        let members = self.lock().values().map(HashMap::len).sum::<usize>();
        PresenceCounts {
            members: members as u64,
            joined: self.joined.load(Ordering::Relaxed),
            left: self.left.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            expired: self.expired.iter().map(|e| e.load(Ordering::Relaxed)).sum(),
        }
    }
}

/// One call of presence.lua in `mode` over the partition whose keys start
/// `base`; the caller adds the mode's arguments.
pub(super) fn call(script: &redis::Script, base: &str, mode: &str) -> redis::Cmd {
    let mut call = scripts::evalsha(script, base);
    call.arg(mode);
    call
}

/// Reads a `page` reply: `{more, id, entry, ...}`, each entry
/// `user "\x1f" info` (empty for none).
pub(super) fn page(subject: Arc<str>, value: Value) -> Result<PresencePage, EngineError> {
    let mut reply = ScriptReply::new(value)?;
    let more = reply.int()? == 1;
    let mut members = Vec::new();
    while let Some(id) = reply.next_bytes()? {
        let entry = reply.bytes()?;
        let text = |b: &[u8]| {
            std::str::from_utf8(b)
                .map_err(|_| EngineError::Redis("a presence entry is not UTF-8".into()))
                .map(|s| (!s.is_empty()).then(|| Arc::from(s)))
        };
        let split = entry
            .iter()
            .position(|&b| b == 0x1f)
            .ok_or_else(|| EngineError::Redis("a presence entry without its separator".into()))?;
        members.push(Member {
            conn: text(&id)?.unwrap_or_else(|| Arc::from("")),
            user: text(&entry[..split])?,
            info: text(&entry[split + 1..])?,
        });
    }
    let next = more
        .then(|| members.last().map(|m| Arc::clone(&m.conn)))
        .flatten();
    Ok(PresencePage {
        subject,
        members,
        next,
    })
}

/// Reads a `stats` reply: `{connections, users}`.
pub(super) fn stats(subject: Arc<str>, value: Value) -> Result<PresenceStats, EngineError> {
    let mut reply = ScriptReply::new(value)?;
    let count =
        |n: i64| u64::try_from(n).map_err(|_| EngineError::Redis("a negative count".into()));
    Ok(PresenceStats {
        subject,
        connections: count(reply.int()?)?,
        users: count(reply.int()?)?,
    })
}

/// Whether a script's error is read.lua's refusal of a join by the cap.
pub(super) fn is_full(error: &EngineError) -> bool {
    matches!(error, EngineError::Redis(e) if e.contains("presence_full"))
}
