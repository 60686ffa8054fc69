//! The per-worker subject registry: subject → the worker's connections
//! subscribed to it.
//!
//! Owned by exactly one worker thread, so it takes no locks. It is sized for
//! the two shapes that matter: millions of subjects with one subscriber each
//! (the MigratoryData shape, where bytes per entry decide RSS per connection)
//! and one subject with tens of thousands of subscribers (the broadcast
//! shape, where iteration speed and O(1) removal matter). A subject starts as
//! a small inline list and becomes an index set once it grows past
//! [`INLINE_SUBSCRIBERS`]. An empty subject is removed at once, so the
//! registry holds only subjects with subscribers.

use std::collections::HashMap;
use std::sync::Arc;

use foldhash::fast::RandomState;
use smallvec::SmallVec;

/// A connection's key in its worker's slab.
pub type ConnId = u32;

/// Subscribers kept inline before a subject switches to an index set.
/// Four `u32`s fit in the same 16 bytes a spilled `SmallVec` uses for its
/// pointer and length, so inline storage costs nothing extra.
pub const INLINE_SUBSCRIBERS: usize = 4;

/// The subscribers of one subject on one worker.
#[derive(Debug)]
enum Subscribers {
    /// Few subscribers: no allocation beyond the map entry itself.
    Inline(SmallVec<[ConnId; INLINE_SUBSCRIBERS]>),
    /// Many: O(1) insert and removal, dense iteration for fan-out. Boxed so
    /// the common one-subscriber entry stays small.
    Indexed(Box<IndexedIds>),
}

/// A dense list of ids plus each id's position in it, so removal is a
/// swap-remove instead of a scan of tens of thousands of subscribers.
#[derive(Debug, Default)]
struct IndexedIds {
    ids: Vec<ConnId>,
    positions: HashMap<ConnId, u32, RandomState>,
}

impl IndexedIds {
    fn insert(&mut self, id: ConnId) -> bool {
        if self.positions.contains_key(&id) {
            return false;
        }
        self.positions.insert(id, self.ids.len() as u32);
        self.ids.push(id);
        true
    }

    fn remove(&mut self, id: ConnId) -> bool {
        let Some(position) = self.positions.remove(&id) else {
            return false;
        };
        self.ids.swap_remove(position as usize);
        if let Some(&moved) = self.ids.get(position as usize) {
            self.positions.insert(moved, position);
        }
        true
    }
}

impl Subscribers {
    fn insert(&mut self, id: ConnId) -> bool {
        match self {
            Subscribers::Inline(list) => {
                if list.contains(&id) {
                    return false;
                }
                if list.len() < INLINE_SUBSCRIBERS {
                    list.push(id);
                } else {
                    let mut set = Box::<IndexedIds>::default();
                    for &existing in list.iter() {
                        set.insert(existing);
                    }
                    set.insert(id);
                    *self = Subscribers::Indexed(set);
                }
                true
            }
            Subscribers::Indexed(set) => set.insert(id),
        }
    }

    fn remove(&mut self, id: ConnId) -> bool {
        match self {
            Subscribers::Inline(list) => match list.iter().position(|&c| c == id) {
                Some(i) => {
                    list.swap_remove(i);
                    true
                }
                None => false,
            },
            Subscribers::Indexed(set) => set.remove(id),
        }
    }

    fn len(&self) -> usize {
        match self {
            Subscribers::Inline(list) => list.len(),
            Subscribers::Indexed(set) => set.ids.len(),
        }
    }

    fn as_slice(&self) -> &[ConnId] {
        match self {
            Subscribers::Inline(list) => list,
            Subscribers::Indexed(set) => &set.ids,
        }
    }
}

/// What a registry change meant for this worker, so the caller knows when to
/// tell the hub (only the first and last local subscriber matter there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The connection was added and is the subject's first on this worker.
    FirstLocal,
    /// The connection was removed and was the subject's last on this worker.
    LastLocal,
    /// Added or removed, with other local subscribers remaining.
    Changed,
    /// Nothing changed (already subscribed, or was not subscribed).
    Unchanged,
}

/// Subject → subscribed connections, for one worker.
#[derive(Debug, Default)]
pub struct Registry {
    subjects: HashMap<Arc<str>, Subscribers, RandomState>,
    subscriptions: usize,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Subscribes `id` to `subject`.
    pub fn subscribe(&mut self, subject: &Arc<str>, id: ConnId) -> Change {
        if let Some(subs) = self.subjects.get_mut(subject) {
            if subs.insert(id) {
                self.subscriptions += 1;
                return Change::Changed;
            }
            return Change::Unchanged;
        }
        let mut list = SmallVec::new();
        list.push(id);
        self.subjects
            .insert(Arc::clone(subject), Subscribers::Inline(list));
        self.subscriptions += 1;
        Change::FirstLocal
    }

    /// Unsubscribes `id` from `subject`.
    pub fn unsubscribe(&mut self, subject: &str, id: ConnId) -> Change {
        let Some(subs) = self.subjects.get_mut(subject) else {
            return Change::Unchanged;
        };
        if !subs.remove(id) {
            return Change::Unchanged;
        }
        self.subscriptions -= 1;
        if subs.len() == 0 {
            self.subjects.remove(subject);
            Change::LastLocal
        } else {
            Change::Changed
        }
    }

    /// The local subscribers of `subject` (empty when there are none).
    pub fn subscribers(&self, subject: &str) -> &[ConnId] {
        self.subjects
            .get(subject)
            .map_or(&[], Subscribers::as_slice)
    }

    /// The shared name of a subject held here, so callers can reuse one
    /// allocation for the same subject string.
    pub fn interned(&self, subject: &str) -> Option<Arc<str>> {
        self.subjects
            .get_key_value(subject)
            .map(|(name, _)| Arc::clone(name))
    }

    /// Number of subjects with at least one local subscriber.
    pub fn subject_count(&self) -> usize {
        self.subjects.len()
    }

    /// Number of (subject, connection) pairs.
    pub fn subscription_count(&self) -> usize {
        self.subscriptions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn s(name: &str) -> Arc<str> {
        Arc::from(name)
    }

    #[test]
    fn an_entry_stays_small() {
        // The map value is paid once per subject per worker: keep it at 32 bytes.
        assert!(std::mem::size_of::<Subscribers>() <= 32);
    }

    #[test]
    fn first_and_last_local_are_reported() {
        let mut r = Registry::new();
        let a = s("a");
        assert_eq!(r.subscribe(&a, 1), Change::FirstLocal);
        assert_eq!(r.subscribe(&a, 2), Change::Changed);
        assert_eq!(r.subscribe(&a, 2), Change::Unchanged);
        assert_eq!(r.unsubscribe("a", 1), Change::Changed);
        assert_eq!(r.unsubscribe("a", 1), Change::Unchanged);
        assert_eq!(r.unsubscribe("a", 2), Change::LastLocal);
        assert_eq!(r.subject_count(), 0);
        assert_eq!(r.subscription_count(), 0);
        assert!(r.subscribers("a").is_empty());
    }

    #[test]
    fn grows_past_inline_and_keeps_everyone() {
        let mut r = Registry::new();
        let a = s("a");
        for id in 0..1000 {
            r.subscribe(&a, id);
        }
        let got: BTreeSet<_> = r.subscribers("a").iter().copied().collect();
        assert_eq!(got, (0..1000).collect());
        for id in (0..1000).step_by(2) {
            assert_ne!(r.unsubscribe("a", id), Change::Unchanged);
        }
        let got: BTreeSet<_> = r.subscribers("a").iter().copied().collect();
        assert_eq!(got, (1..1000).step_by(2).collect());
    }

    proptest! {
        /// The registry agrees with a plain model under any sequence of operations.
        #[test]
        fn matches_a_model(ops in proptest::collection::vec((any::<bool>(), 0u8..4, 0u32..8), 0..300)) {
            let mut r = Registry::new();
            let mut model: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
            for (sub, subject, id) in ops {
                let name = format!("s{subject}");
                if sub {
                    let change = r.subscribe(&s(&name), id);
                    let set = model.entry(name.clone()).or_default();
                    let was_empty = set.is_empty();
                    let added = set.insert(id);
                    prop_assert_eq!(change, match (added, was_empty) {
                        (false, _) => Change::Unchanged,
                        (true, true) => Change::FirstLocal,
                        (true, false) => Change::Changed,
                    });
                } else {
                    let change = r.unsubscribe(&name, id);
                    let removed = model.get_mut(&name).is_some_and(|set| set.remove(&id));
                    let now_empty = model.get(&name).is_none_or(BTreeSet::is_empty);
                    if now_empty { model.remove(&name); }
                    prop_assert_eq!(change, match (removed, now_empty) {
                        (false, _) => Change::Unchanged,
                        (true, true) => Change::LastLocal,
                        (true, false) => Change::Changed,
                    });
                }
            }
            prop_assert_eq!(r.subject_count(), model.len());
            prop_assert_eq!(r.subscription_count(), model.values().map(BTreeSet::len).sum::<usize>());
            for (name, set) in &model {
                let got: BTreeSet<u32> = r.subscribers(name).iter().copied().collect();
                prop_assert_eq!(&got, set);
            }
        }
    }
}
