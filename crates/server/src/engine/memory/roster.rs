//! [`Roster`]: the members of every presence subject on this node, for the
//! memory engine (contract clause 8).
//!
//! Per subject, the members by id (ordered, so a page is a range read
//! after the cursor) and a count of connections per user, kept in step
//! with them, so that `presence_stats` reads two lengths instead of
//! walking the members. Sharded by subject like the streams, under locks of
//! its own: the engine never holds a stream shard while it takes one.
//!
//! A subject with join/leave events hands each change, and every page
//! read of it, to a closure of the caller *under the subject's lock*: the
//! engine queues them to the workers there, so that in each worker's
//! mailbox a change comes before a page exactly when the page holds it
//! (the "snapshot then diffs" rule of docs/protocol.md). It must not know
//! about routes, history or the hub.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard};

use crate::engine::PresenceCounts;
use crate::messages::engine::{
    EngineError, Join, Member, PresenceChange, PresencePage, PresenceStats,
};
use crate::sharded::Sharded;

/// What one member holds besides its id.
#[derive(Debug, Clone)]
struct Entry {
    user: Option<Arc<str>>,
    info: Option<Arc<str>>,
}

/// One presence subject's members.
#[derive(Debug, Default)]
struct Roll {
    members: BTreeMap<Arc<str>, Entry>,
    /// Members per user: a user's first member adds it, its last removes
    /// it, so `len()` is the distinct user count.
    users: HashMap<Arc<str>, u32>,
    /// Joins and leaves are told (the namespace's `join_leave`, as its
    /// joins said).
    events: bool,
}

type Rolls = HashMap<Arc<str>, Roll>;

/// The node's presence subjects; see the module header.
#[derive(Default)]
pub struct Roster {
    shards: Sharded<Rolls>,
    members: AtomicU64,
    joined: AtomicU64,
    left: AtomicU64,
    refused: AtomicU64,
}

impl Roster {
    fn shard(&self, subject: &str) -> MutexGuard<'_, Rolls> {
        // Nothing runs under this lock but the maps and the callers'
        // closures, which only push onto worker mailboxes (a channel send:
        // no syscall, the wake-ups are made after the lock is let go).
        self.shards.lock(subject)
    }

    /// Adds member `conn` to `subject`, unless the subject holds
    /// `join.max_members` already. Joining again with the same id is no
    /// change. A new member of a subject with events is handed to
    /// `told`, under the subject's lock.
    pub fn join(
        &self,
        subject: &Arc<str>,
        conn: Arc<str>,
        join: &Join,
        told: impl FnOnce(PresenceChange),
    ) -> Result<(), EngineError> {
        let mut shard = self.shard(subject);
        let roll = shard.entry(Arc::clone(subject)).or_default();
        if roll.members.contains_key(&conn) {
            return Ok(());
        }
        if roll.members.len() >= join.max_members {
            let full = roll.members.is_empty();
            if full {
                // A cap of 0 must not leave an empty roll behind.
                shard.remove(subject);
            }
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(EngineError::PresenceFull {
                max: join.max_members,
            });
        }
        if let Some(user) = &join.user {
            *roll.users.entry(Arc::clone(user)).or_default() += 1;
        }
        let entry = Entry {
            user: join.user.clone(),
            info: join.info.clone(),
        };
        roll.members.insert(Arc::clone(&conn), entry);
        roll.events |= join.events;
        if roll.events {
            told(PresenceChange {
                subject: Arc::clone(subject),
                joined: true,
                member: Member {
                    conn,
                    user: join.user.clone(),
                    info: join.info.clone(),
                },
            });
        }
        self.members.fetch_add(1, Ordering::Relaxed);
        self.joined.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Removes member `conn` from `subject`; returns whether it was one.
    /// On a subject with events the change is handed to `told`, under the
    /// subject's lock.
    pub fn leave(&self, subject: &str, conn: &str, told: impl FnOnce(PresenceChange)) -> bool {
        let mut shard = self.shard(subject);
        let Some((name, roll)) = shard.get_key_value(subject) else {
            return false;
        };
        let (name, events) = (Arc::clone(name), roll.events);
        let roll = shard
            .get_mut(subject)
            .expect("found above, under the same lock");
        let Some((conn, entry)) = roll.members.remove_entry(conn) else {
            return false;
        };
        if let Some(user) = &entry.user {
            if let Some(count) = roll.users.get_mut(user) {
                *count -= 1;
                if *count == 0 {
                    roll.users.remove(user);
                }
            }
        }
        if roll.members.is_empty() {
            shard.remove(subject);
        }
        if events {
            told(PresenceChange {
                subject: name,
                joined: false,
                member: Member {
                    conn,
                    user: entry.user,
                    info: entry.info,
                },
            });
        }
        drop(shard);
        self.members.fetch_sub(1, Ordering::Relaxed);
        self.left.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// At most `limit` members of `subject` whose ids sort after `after`,
    /// handed to `answer` under the subject's lock.
    pub fn page(
        &self,
        subject: Arc<str>,
        after: Option<&str>,
        limit: usize,
        answer: impl FnOnce(PresencePage),
    ) {
        let shard = self.shard(&subject);
        let mut members = Vec::new();
        let mut more = false;
        if let Some(roll) = shard.get(&*subject) {
            let start = after.map_or(Bound::Unbounded, Bound::Excluded);
            let mut range =
                roll.members
                    .range::<str, _>((start, Bound::Unbounded))
                    .map(|(conn, entry)| Member {
                        conn: Arc::clone(conn),
                        user: entry.user.clone(),
                        info: entry.info.clone(),
                    });
            members.extend(range.by_ref().take(limit));
            more = range.next().is_some();
        }
        let next = more
            .then(|| members.last().map(|m| Arc::clone(&m.conn)))
            .flatten();
        answer(PresencePage {
            subject,
            members,
            next,
        });
        drop(shard);
    }

    /// `subject`'s member and user counts.
    pub fn stats(&self, subject: Arc<str>) -> PresenceStats {
        let (connections, users) = self.shard(&subject).get(&*subject).map_or((0, 0), |roll| {
            (roll.members.len() as u64, roll.users.len() as u64)
        });
        PresenceStats {
            subject,
            connections,
            users,
        }
    }

    pub fn counts(&self) -> PresenceCounts {
        PresenceCounts {
            members: self.members.load(Ordering::Relaxed),
            joined: self.joined.load(Ordering::Relaxed),
            left: self.left.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            // Members end with their node here: none outlives a lease.
            expired: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join(user: Option<&str>, max: usize) -> Join {
        Join {
            user: user.map(Arc::from),
            info: None,
            max_members: max,
            events: false,
        }
    }

    fn page(roster: &Roster, subject: &str, after: Option<&str>, limit: usize) -> PresencePage {
        let mut read = None;
        roster.page(Arc::from(subject), after, limit, |p| read = Some(p));
        read.expect("answered")
    }

    fn unheard(change: PresenceChange) {
        panic!("no events asked for: {change:?}");
    }

    #[test]
    fn changes_are_told_only_where_events_were_asked() {
        let roster = Roster::default();
        let s: Arc<str> = Arc::from("room");
        let mut told = Vec::new();
        let events = Join {
            events: true,
            ..join(Some("u1"), 10)
        };
        roster
            .join(&s, "c1".into(), &events, |c| told.push(c))
            .unwrap();
        roster
            .join(&s, "c1".into(), &events, |c| told.push(c))
            .unwrap();
        assert!(roster.leave(&s, "c1", |c| told.push(c)));
        assert!(!roster.leave(&s, "c1", |c| told.push(c)));
        let seen: Vec<(bool, &str)> = told.iter().map(|c| (c.joined, &*c.member.conn)).collect();
        assert_eq!(seen, [(true, "c1"), (false, "c1")], "once each");
        assert_eq!(told[1].member.user.as_deref(), Some("u1"));
        roster
            .join(&Arc::from("quiet"), "c1".into(), &join(None, 10), unheard)
            .unwrap();
        assert!(roster.leave("quiet", "c1", unheard));
    }

    #[test]
    fn users_are_counted_once_and_leave_with_their_last_member() {
        let roster = Roster::default();
        let s: Arc<str> = Arc::from("room");
        roster
            .join(&s, "c1".into(), &join(Some("u1"), 10), unheard)
            .unwrap();
        roster
            .join(&s, "c2".into(), &join(Some("u1"), 10), unheard)
            .unwrap();
        roster
            .join(&s, "c3".into(), &join(None, 10), unheard)
            .unwrap();
        roster
            .join(&s, "c3".into(), &join(None, 10), unheard)
            .unwrap();
        let stats = roster.stats(Arc::clone(&s));
        assert_eq!((stats.connections, stats.users), (3, 1));
        assert!(roster.leave(&s, "c1", unheard));
        assert!(
            !roster.leave(&s, "c1", unheard),
            "a second leave is no change"
        );
        assert_eq!(roster.stats(Arc::clone(&s)).users, 1);
        assert!(roster.leave(&s, "c2", unheard));
        assert_eq!(roster.stats(Arc::clone(&s)).users, 0);
        assert!(roster.leave(&s, "c3", unheard));
        assert_eq!(roster.shards.sum(|r| r.len()), 0, "an empty roll is freed");
        assert_eq!(
            roster.counts(),
            PresenceCounts {
                members: 0,
                joined: 3,
                left: 3,
                refused: 0,
                expired: 0
            }
        );
    }

    #[test]
    fn pages_follow_the_cursor_and_the_cap_refuses() {
        let roster = Roster::default();
        let s: Arc<str> = Arc::from("room");
        for c in ["c3", "c1", "c2"] {
            roster.join(&s, c.into(), &join(None, 3), unheard).unwrap();
        }
        assert_eq!(
            roster.join(&s, "c4".into(), &join(None, 3), unheard),
            Err(EngineError::PresenceFull { max: 3 })
        );
        let first = page(&roster, "room", None, 2);
        let ids: Vec<&str> = first.members.iter().map(|m| &*m.conn).collect();
        assert_eq!(ids, ["c1", "c2"]);
        assert_eq!(first.next.as_deref(), Some("c2"));
        let second = page(&roster, "room", first.next.as_deref(), 2);
        assert_eq!(second.members.len(), 1);
        assert_eq!(second.next, None);
        assert_eq!(roster.counts().refused, 1);
        assert_eq!(
            roster.join(&Arc::from("empty"), "c1".into(), &join(None, 0), unheard),
            Err(EngineError::PresenceFull { max: 0 })
        );
        assert!(page(&roster, "empty", None, 5).members.is_empty());
    }
}
