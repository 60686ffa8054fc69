//! Subscriptions waiting for the engine's attach answer, per worker.
//!
//! Between a subscribe and its answer a connection holds the subject in its
//! session but is not yet in the registry (it must not get live
//! publications before its replay). This list remembers those, each with a
//! token, so the worker can tell the current answer from a stale one (the
//! connection unsubscribed, or closed and its slab slot was reused, before
//! the answer came), and so it knows a subject still has a local subscriber
//! on its way. Entries live for one mailbox round trip; the list is empty
//! on an idle worker.

use std::sync::Arc;

use foldhash::fast::RandomState;
use hashbrown::HashMap;
use smallvec::SmallVec;

use crate::registry::ConnId;

/// Capacity kept after a burst drains; beyond it the table is freed.
const SHRINK_ABOVE: usize = 64;

/// The connections attaching to one subject, each with its answer's token.
type Attachers = SmallVec<[(ConnId, u64); 2]>;

#[derive(Debug, Default)]
pub(super) struct Attaching {
    waiting: HashMap<Arc<str>, Attachers, RandomState>,
    next_token: u64,
}

impl Attaching {
    /// Records that `id` is attaching to `subject`; returns the token its
    /// answer must carry.
    pub(super) fn insert(&mut self, subject: &Arc<str>, id: ConnId) -> u64 {
        self.next_token += 1;
        self.waiting
            .entry(Arc::clone(subject))
            .or_default()
            .push((id, self.next_token));
        self.next_token
    }

    /// Takes the entry of the answer `(id, token)`; false when it is stale.
    pub(super) fn remove(&mut self, subject: &str, id: ConnId, token: u64) -> bool {
        self.take(subject, |&(c, t)| c == id && t == token)
    }

    /// Takes `id`'s entry for `subject` whatever its token; false when the
    /// connection was not attaching to it.
    pub(super) fn remove_any(&mut self, subject: &str, id: ConnId) -> bool {
        self.take(subject, |&(c, _)| c == id)
    }

    fn take(&mut self, subject: &str, matches: impl Fn(&(ConnId, u64)) -> bool) -> bool {
        let Some(list) = self.waiting.get_mut(subject) else {
            return false;
        };
        let Some(i) = list.iter().position(matches) else {
            return false;
        };
        list.swap_remove(i);
        if list.is_empty() {
            self.waiting.remove(subject);
            // A burst of subscribes grew the table; give the memory back
            // once the burst is over (an idle worker holds no entries).
            if self.waiting.is_empty() && self.waiting.capacity() > SHRINK_ABOVE {
                self.waiting.shrink_to(0);
            }
        }
        true
    }

    /// Whether any connection is attaching to `subject`.
    pub(super) fn contains(&self, subject: &str) -> bool {
        self.waiting.contains_key(subject)
    }

    /// Whether `id` is attaching to `subject`.
    pub(super) fn holds(&self, subject: &str, id: ConnId) -> bool {
        self.waiting
            .get(subject)
            .is_some_and(|list| list.iter().any(|&(c, _)| c == id))
    }

    /// The shared name of a subject being attached to.
    pub(super) fn interned(&self, subject: &str) -> Option<Arc<str>> {
        self.waiting
            .get_key_value(subject)
            .map(|(name, _)| Arc::clone(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_current_token_is_taken() {
        let mut a = Attaching::default();
        let s: Arc<str> = Arc::from("s");
        let first = a.insert(&s, 1);
        assert!(a.remove_any("s", 1), "unsubscribed before the answer");
        let second = a.insert(&s, 1);
        assert!(!a.remove("s", 1, first), "the first answer is stale");
        assert!(a.contains("s"));
        assert!(a.remove("s", 1, second));
        assert!(!a.contains("s"));
        assert!(a.interned("s").is_none());
    }

    #[test]
    fn the_table_is_freed_after_a_burst() {
        let mut a = Attaching::default();
        let subjects: Vec<Arc<str>> = (0..1_000).map(|i| Arc::from(format!("s{i}"))).collect();
        let tokens: Vec<u64> = subjects.iter().map(|s| a.insert(s, 7)).collect();
        assert!(a.waiting.capacity() >= 1_000);
        for (s, t) in subjects.iter().zip(tokens) {
            assert!(a.remove(s, 7, t));
        }
        assert!(a.waiting.capacity() <= SHRINK_ABOVE);
    }
}
