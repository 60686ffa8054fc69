//! [`Sharded`]: a value split over [`SHARDS`] locks by key hash, so that
//! threads touching different keys rarely meet on one lock; and [`lock`],
//! the one policy for a poisoned lock that every sharded map of the node
//! follows.
//!
//! The poison policy: a lock whose holder panicked is taken anyway. Every
//! user keeps its guarded data consistent between statements (a map entry
//! inserted, changed or removed in one step), so what a panicking thread
//! leaves behind is still sound; refusing it would turn one thread's panic
//! into a panic of every thread that touches the same shard.
//!
//! A leaf: it must not name any other module of the crate. It holds no
//! lock across anything but the caller's own use of the guard, and the
//! callers say why theirs are safe.

use std::hash::{BuildHasher, Hash};
use std::sync::{Mutex, MutexGuard};

use foldhash::fast::RandomState;

/// Shards per sharded value: a power of two well above the core count.
pub const SHARDS: usize = 64;

/// Takes `mutex` under the poison policy of this module.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `SHARDS` values of `T`, each behind its own lock, picked by key hash.
pub struct Sharded<T> {
    shards: Box<[Mutex<T>]>,
    /// Picks a key's shard. Hashed, because keys are often alike in their
    /// low bits, and seeded per process so that nobody can aim many keys
    /// at one lock.
    spread: RandomState,
}

impl<T: Default> Default for Sharded<T> {
    fn default() -> Self {
        Sharded {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            spread: RandomState::default(),
        }
    }
}

impl<T> Sharded<T> {
    /// The shard `key` belongs to.
    pub fn index_of<K: Hash + ?Sized>(&self, key: &K) -> usize {
        self.spread.hash_one(key) as usize % SHARDS
    }

    /// Locks the shard `key` belongs to.
    pub fn lock<K: Hash + ?Sized>(&self, key: &K) -> MutexGuard<'_, T> {
        self.lock_index(self.index_of(key))
    }

    /// Locks shard `index` (below [`SHARDS`]).
    pub fn lock_index(&self, index: usize) -> MutexGuard<'_, T> {
        lock(&self.shards[index])
    }

    /// Locks each shard in turn, one at a time, and sums `f` over them.
    pub fn sum(&self, mut f: impl FnMut(&T) -> usize) -> usize {
        self.shards.iter().map(|shard| f(&lock(shard))).sum()
    }

    /// Calls `f` on each shard in turn, holding one lock at a time.
    pub fn for_each(&self, mut f: impl FnMut(&mut T)) {
        for shard in self.shards.iter() {
            f(&mut lock(shard));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_always_finds_its_shard_and_keys_spread() {
        let sharded: Sharded<Vec<u32>> = Sharded::default();
        for key in 0u32..1_000 {
            sharded.lock(&key).push(key);
        }
        for key in 0u32..1_000 {
            assert!(sharded.lock(&key).contains(&key));
        }
        assert_eq!(sharded.sum(Vec::len), 1_000);
        let mut used = 0;
        sharded.for_each(|shard| used += usize::from(!shard.is_empty()));
        assert!(used > SHARDS / 2, "1,000 keys used only {used} shards");
    }

    #[test]
    fn a_poisoned_shard_is_taken_anyway() {
        let sharded: Sharded<Vec<u32>> = Sharded::default();
        let poisoned = std::thread::scope(|s| {
            s.spawn(|| {
                let mut shard = sharded.lock(&7u32);
                shard.push(7);
                panic!("a thread panics holding the lock");
            })
            .join()
        });
        assert!(poisoned.is_err());
        assert_eq!(*sharded.lock(&7u32), vec![7]);
    }
}
