//! Requests that may wait for room in a full queue towards one Redis
//! instead of being refused: the attaches the node makes for users' graph
//! feeds ([`crate::engine::Attach::can_wait`]). A burst of connects makes
//! hundreds of thousands of them at once; refusing those past the queue
//! would send each client an error for a feed it never asked for, and the
//! keeper would ask again every 500 ms, over and over, until the burst
//! passed.
//!
//! Held oldest first, up to `redis_feed_backlog` per instance; past it they
//! are refused as before. The instance's task takes them into its batches
//! ([`Backlog::take`]) beside what comes through the queue. It owns no
//! Redis I/O and knows nothing of what it holds.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use tokio::sync::Notify;

/// The held requests of one instance.
pub struct Backlog<T> {
    /// A plain mutex: locked by workers and the instance's task only to push
    /// or drain, never across an `.await`.
    held: Mutex<VecDeque<T>>,
    /// How many are held, read without the lock (stats, batch shares).
    len: AtomicUsize,
    /// `redis_feed_backlog`.
    max: usize,
    /// Wakes the instance's task when one is held.
    pub added: Notify,
}

impl<T> Backlog<T> {
    /// A backlog that holds at most `max`.
    pub fn new(max: usize) -> Backlog<T> {
        Backlog {
            held: Mutex::new(VecDeque::new()),
            len: AtomicUsize::new(0),
            max,
            added: Notify::new(),
        }
    }

    /// Holds `item`, or gives it back when `max` are held already.
    pub fn hold(&self, item: T) -> Result<(), T> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.len() >= self.max {
            return Err(item);
        }
        held.push_back(item);
        self.len.store(held.len(), Ordering::Relaxed);
        drop(held);
        self.added.notify_one();
        Ok(())
    }

    /// Moves the oldest held to the end of `batch` until it holds `up_to`.
    pub fn take(&self, batch: &mut Vec<T>, up_to: usize) {
        let room = up_to.saturating_sub(batch.len());
        if room == 0 || self.len() == 0 {
            return;
        }
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let n = room.min(held.len());
        batch.extend(held.drain(..n));
        if held.is_empty() {
            // A burst's backlog may have grown to megabytes; it is over.
            held.shrink_to_fit();
        }
        self.len.store(held.len(), Ordering::Relaxed);
    }

    /// How many are held.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_up_to_its_bound_and_gives_back_the_rest() {
        let backlog = Backlog::new(2);
        assert_eq!(backlog.hold(1), Ok(()));
        assert_eq!(backlog.hold(2), Ok(()));
        assert_eq!(backlog.hold(3), Err(3));
        assert_eq!(backlog.len(), 2);
    }

    #[test]
    fn takes_the_oldest_first_within_the_room_given() {
        let backlog = Backlog::new(10);
        for i in 0..5 {
            backlog.hold(i).unwrap();
        }
        let mut batch = vec![100];
        backlog.take(&mut batch, 1);
        assert_eq!(batch, [100]);
        backlog.take(&mut batch, 4);
        assert_eq!(batch, [100, 0, 1, 2]);
        backlog.take(&mut batch, 10);
        assert_eq!(batch, [100, 0, 1, 2, 3, 4]);
        assert_eq!(backlog.len(), 0);
        // Room again once taken.
        assert_eq!(backlog.hold(5), Ok(()));
    }
}
