//! A value built from files at start and replaced on SIGHUP: the TLS
//! configuration (`tls::certs`) and the token keys (`auth`).
//!
//! A reload builds the new value first and swaps it in only if that
//! worked, so a reader sees either the old value whole or the new one
//! whole, never a half-read file, and a failed reload changes nothing.
//! Readers hold an `Arc` of the value they started with, so a swap never
//! pulls a value out from under work in progress (a handshake, a token
//! check). This module reads no files: its owners do, and decide what a
//! failure means.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

/// The value in force, and how many times it was replaced.
#[derive(Debug)]
pub struct Reloadable<T> {
    current: RwLock<Arc<T>>,
    /// Bumped by every swap, so that a [`View`] finds out with one atomic
    /// load that its copy is stale.
    generation: AtomicU64,
}

impl<T> Reloadable<T> {
    pub fn new(value: Arc<T>) -> Reloadable<T> {
        Reloadable {
            current: RwLock::new(value),
            generation: AtomicU64::new(0),
        }
    }

    /// Puts `value` in force: readers from now on get it.
    pub fn replace(&self, value: Arc<T>) {
        // A panic while holding this lock cannot leave the Arc half-written.
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = value;
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The value in force now.
    pub fn current(&self) -> Arc<T> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }
}

/// One reader's copy of the value, refreshed only when the generation
/// moved: for a path as hot as accepting a connection, where even an
/// uncontended lock would be paid for nothing nearly every time.
#[derive(Debug)]
pub struct View<T> {
    source: Arc<Reloadable<T>>,
    value: Arc<T>,
    generation: u64,
}

impl<T> View<T> {
    pub fn new(source: Arc<Reloadable<T>>) -> View<T> {
        let generation = source.generation.load(Ordering::Acquire);
        View {
            value: source.current(),
            source,
            generation,
        }
    }

    /// The value in force.
    pub fn get(&mut self) -> &Arc<T> {
        let generation = self.source.generation.load(Ordering::Acquire);
        if generation != self.generation {
            self.value = self.source.current();
            self.generation = generation;
        }
        &self.value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_follows_every_replacement_and_keeps_its_copy_otherwise() {
        let source = Arc::new(Reloadable::new(Arc::new(1)));
        let mut view = View::new(Arc::clone(&source));
        let first = Arc::clone(view.get());
        assert!(Arc::ptr_eq(&first, view.get()), "nothing replaced");
        source.replace(Arc::new(2));
        assert_eq!(**view.get(), 2);
        assert_eq!(*source.current(), 2);
        assert_eq!(*first, 1, "a reader keeps what it started with");
    }
}
