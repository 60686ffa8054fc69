//! The hub: which workers hold subscribers of which subject on this node,
//! and the mailboxes that carry events to them.
//!
//! The hub is node-local plumbing under the engine: the engine decides
//! positions and calls [`Hub::deliver`] with each publication, [`Hub::join`]
//! when a connection attaches and [`Hub::leave`] when one detaches. A
//! publication is handed to each interested worker as one shared
//! `Arc<Publication>`; each worker then queues the same encoded bytes on
//! every local subscriber.
//!
//! The subject map is split into [`SHARDS`] independently locked shards, so
//! one operation only contends with operations on subjects of the same
//! shard. A shard lock is held for a map lookup and a few lock-free channel
//! pushes: never across a system call or an `.await`. Pushing under it is
//! what keeps an attach answer in line with the subject's publications in a
//! worker's mailbox (engine contract, clause 3); wake-ups happen after, once
//! per batch ([`Wakeups`]).
//!
//! The hub knows subjects with attached subscribers only; a subject's entry
//! goes with its last subscriber on the node.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crossbeam_channel::{Receiver, Sender};
use foldhash::fast::RandomState;
use hashbrown::HashMap;

use crate::engine::{Attached, ConnAnswer};
use crate::publication::Publication;

/// Number of subject-map shards; a power of two well above the core count.
pub const SHARDS: usize = 64;

/// What a worker's mailbox carries.
#[derive(Debug)]
pub enum Event {
    /// A publication for the worker's local subscribers of its subject.
    Publication(Arc<Publication>),
    /// A connection's attach is answered: from here on it is live.
    Attached(Box<Attached>),
    /// A connection's publish or history request is answered.
    Answer(Box<ConnAnswer>),
}

/// A worker's inbound queue and the means to wake it.
pub struct Mailbox {
    tx: Sender<Event>,
    waker: mio::Waker,
    /// Set by the worker just before it blocks in `epoll_wait`; a producer that
    /// swaps it back to false owes the worker one wake-up. Coalesces wake-ups:
    /// a burst of publishes costs one `eventfd` write, not one per message.
    sleeping: AtomicBool,
    queued: AtomicUsize,
}

impl Mailbox {
    /// Queues an event; waking the worker is left to [`Hub::wake`].
    fn push(&self, event: Event) {
        self.queued.fetch_add(1, Ordering::Relaxed);
        // The receiver lives as long as the worker; a send can only fail while
        // the node is shutting down, when dropping the event is correct.
        let _ = self.tx.send(event);
    }

    /// Wakes the worker if it is (about to be) blocked in its poll.
    pub fn wake_if_sleeping(&self) {
        if self.sleeping.swap(false, Ordering::SeqCst) {
            // A failed eventfd write means the worker is gone; nothing to wake.
            let _ = self.waker.wake();
        }
    }

    /// Called by the owning worker before blocking. Returns false when
    /// deliveries are already waiting, in which case it must not block.
    pub fn prepare_to_sleep(&self, rx: &Receiver<Event>) -> bool {
        self.sleeping.store(true, Ordering::SeqCst);
        if rx.is_empty() {
            true
        } else {
            self.sleeping.store(false, Ordering::SeqCst);
            false
        }
    }

    /// Called by the owning worker after its poll returns.
    pub fn awake(&self) {
        self.sleeping.store(false, Ordering::SeqCst);
    }

    /// Called by the owning worker after taking `n` events off the queue.
    pub fn taken(&self, n: usize) {
        self.queued.fetch_sub(n, Ordering::Relaxed);
    }
}

/// Workers owed a wake-up by a batch of publishes.
///
/// A publish queues its deliveries in the mailboxes at once but only notes
/// which workers must be woken; the publisher wakes each of them once when
/// its batch is done ([`Hub::wake`]). A worker reading a burst of publishes
/// thus costs every other worker one wake-up per burst instead of one per
/// message: on this VM a cross-core wake-up costs about 27 µs
/// (../shared/LIMITS.md), more than delivering the message does.
///
/// Dropping it with wake-ups still owed is a bug (deliveries would wait for
/// the worker's next timer tick); debug builds panic on it.
#[derive(Debug, Default)]
pub struct Wakeups(u64);

impl Wakeups {
    /// Whether no worker is owed a wake-up.
    pub fn is_empty(&self) -> bool {
        self.0 == 0
    }

    fn add(&mut self, worker: usize) {
        self.0 |= 1 << worker;
    }
}

impl Drop for Wakeups {
    fn drop(&mut self) {
        debug_assert!(
            self.0 == 0 || std::thread::panicking(),
            "publishes left workers {:#b} unwoken",
            self.0
        );
    }
}

/// What the hub knows of one subject.
#[derive(Debug)]
struct SubjectState {
    /// Bit `w` set while worker `w` has at least one subscriber.
    workers: u64,
    /// Attached subscribers on this node, across workers.
    subscribers: u32,
}

type Shard = HashMap<Arc<str>, SubjectState, RandomState>;

/// Subject → workers, shared by all workers and the admin API.
pub struct Hub {
    shards: Box<[Mutex<Shard>]>,
    mailboxes: Box<[Mailbox]>,
    shard_hasher: RandomState,
    /// Deliveries queued for one worker beyond which publishers are paused
    /// (see [`Hub::congested`]): bounded memory when publishers outrun workers.
    mailbox_high_water: usize,
}

impl Hub {
    /// A hub for `wakers.len()` workers that counts a worker congested past
    /// `mailbox_high_water` queued deliveries; returns each worker's
    /// receiving end, in worker order.
    pub fn new(
        wakers: Vec<mio::Waker>,
        mailbox_high_water: usize,
    ) -> (Arc<Hub>, Vec<Receiver<Event>>) {
        assert!(wakers.len() <= 64, "worker bitmask is a u64");
        let mut receivers = Vec::with_capacity(wakers.len());
        let mailboxes = wakers
            .into_iter()
            .map(|waker| {
                let (tx, rx) = crossbeam_channel::unbounded();
                receivers.push(rx);
                Mailbox {
                    tx,
                    waker,
                    sleeping: AtomicBool::new(false),
                    queued: AtomicUsize::new(0),
                }
            })
            .collect();
        let hub = Hub {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            mailboxes,
            shard_hasher: RandomState::default(),
            mailbox_high_water,
        };
        (Arc::new(hub), receivers)
    }

    fn shard(&self, subject: &str) -> MutexGuard<'_, Shard> {
        let index = self.shard_hasher.hash_one(subject) as usize % SHARDS;
        // A poisoned shard means a worker panicked mid-update; the map itself
        // is still consistent (every update is a single insert/remove), so go on.
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Worker `worker`'s mailbox.
    pub fn mailbox(&self, worker: usize) -> &Mailbox {
        &self.mailboxes[worker]
    }

    /// Records one more subscriber of `subject` on `worker` and queues
    /// `answer` for that worker in line with the subject's publications.
    /// Returns whether it is the subject's first subscriber on the node.
    pub fn join(
        &self,
        subject: &Arc<str>,
        worker: usize,
        answer: Event,
        wakeups: &mut Wakeups,
    ) -> bool {
        let mut shard = self.shard(subject);
        let state = shard.entry(Arc::clone(subject)).or_insert(SubjectState {
            workers: 0,
            subscribers: 0,
        });
        state.subscribers += 1;
        state.workers |= 1 << worker;
        self.mailboxes[worker].push(answer);
        wakeups.add(worker);
        state.subscribers == 1
    }

    /// Records one subscriber fewer; `last_local` says the worker has none
    /// left. Returns whether it was the subject's last on the node.
    pub fn leave(&self, subject: &str, worker: usize, last_local: bool) -> bool {
        let mut shard = self.shard(subject);
        let Some(state) = shard.get_mut(subject) else {
            debug_assert!(false, "leave of unknown subject {subject}");
            return false;
        };
        state.subscribers -= 1;
        if last_local {
            state.workers &= !(1 << worker);
        }
        if state.subscribers == 0 {
            debug_assert_eq!(state.workers, 0, "workers left without subscribers");
            shard.remove(subject);
            return true;
        }
        false
    }

    /// Hands `publication` to every worker with subscribers of its subject,
    /// noting in `wakeups` the workers to wake once the caller's batch is
    /// done. Returns the subscribers on the node it reached.
    pub fn deliver(&self, publication: &Arc<Publication>, wakeups: &mut Wakeups) -> u32 {
        let shard = self.shard(&publication.subject);
        let Some(state) = shard.get(&*publication.subject) else {
            return 0;
        };
        let mut workers = state.workers;
        wakeups.0 |= workers;
        while workers != 0 {
            let worker = workers.trailing_zeros() as usize;
            workers &= workers - 1;
            self.mailboxes[worker].push(Event::Publication(Arc::clone(publication)));
        }
        state.subscribers
    }

    /// Queues an event for one worker (an answer to one of its connections).
    pub fn send(&self, worker: usize, event: Event, wakeups: &mut Wakeups) {
        self.mailboxes[worker].push(event);
        wakeups.add(worker);
    }

    /// True while some worker has more than the high-water mark of
    /// deliveries waiting: publishers should hold off (workers stop reading
    /// from publishing connections; the HTTP API waits) until it clears.
    pub fn congested(&self) -> bool {
        self.mailboxes
            .iter()
            .any(|m| m.queued.load(Ordering::Relaxed) > self.mailbox_high_water)
    }

    /// Distinct subjects with subscribers on this node.
    pub fn subject_count(&self) -> usize {
        (0..SHARDS)
            .map(|i| {
                self.shards[i]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .len()
            })
            .sum()
    }

    /// Wakes the workers a batch of publishes handed deliveries to (those
    /// already awake are left alone).
    pub fn wake(&self, mut wakeups: Wakeups) {
        let mut workers = std::mem::take(&mut wakeups.0);
        while workers != 0 {
            let worker = workers.trailing_zeros() as usize;
            workers &= workers - 1;
            self.mailboxes[worker].wake_if_sleeping();
        }
    }

    /// Wakes every worker (shutdown).
    pub fn wake_all(&self) {
        for mailbox in self.mailboxes.iter() {
            // The worker may be gone already; nothing to do then.
            let _ = mailbox.waker.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use myriad_protocol::position::{Epoch, Position};

    fn hub(workers: usize) -> (Arc<Hub>, Vec<Receiver<Event>>, Vec<mio::Poll>) {
        let polls: Vec<mio::Poll> = (0..workers).map(|_| mio::Poll::new().unwrap()).collect();
        let wakers = polls
            .iter()
            .map(|p| mio::Waker::new(p.registry(), mio::Token(0)).unwrap())
            .collect();
        let (hub, rx) = Hub::new(wakers, 65_536);
        (hub, rx, polls)
    }

    fn publication(subject: &str, offset: u64) -> Arc<Publication> {
        Arc::new(Publication::new(
            Arc::from(subject),
            Position::new(Epoch(1), offset),
            "1",
            0,
        ))
    }

    fn marker() -> Event {
        Event::Publication(publication("marker", 0))
    }

    fn join(hub: &Hub, subject: &Arc<str>, worker: usize) -> bool {
        let mut wakeups = Wakeups::default();
        let first = hub.join(subject, worker, marker(), &mut wakeups);
        hub.wake(wakeups);
        first
    }

    fn deliver(hub: &Hub, p: &Arc<Publication>) -> u32 {
        let mut wakeups = Wakeups::default();
        let n = hub.deliver(p, &mut wakeups);
        hub.wake(wakeups);
        n
    }

    #[test]
    fn deliver_reaches_exactly_the_workers_with_subscribers() {
        let (hub, rx, _polls) = hub(3);
        let a: Arc<str> = Arc::from("a");
        assert!(join(&hub, &a, 0));
        assert!(!join(&hub, &a, 2));
        assert!(!join(&hub, &a, 2));
        rx.iter().for_each(|r| while r.try_recv().is_ok() {});
        let p = publication("a", 1);
        let mut wakeups = Wakeups::default();
        assert_eq!(hub.deliver(&p, &mut wakeups), 3);
        assert_eq!(wakeups.0, 0b101, "workers 0 and 2 are owed a wake-up");
        hub.wake(wakeups);
        assert_eq!((rx[0].len(), rx[1].len(), rx[2].len()), (1, 0, 1));
        let (Ok(Event::Publication(p0)), Ok(Event::Publication(p2))) =
            (rx[0].try_recv(), rx[2].try_recv())
        else {
            panic!("publications expected");
        };
        assert!(Arc::ptr_eq(&p0, &p2), "one publication shared");
    }

    #[test]
    fn an_attach_answer_sits_between_the_publications_around_it() {
        let (hub, rx, _polls) = hub(1);
        let a: Arc<str> = Arc::from("a");
        join(&hub, &a, 0);
        deliver(&hub, &publication("a", 1));
        join(&hub, &a, 0);
        deliver(&hub, &publication("a", 2));
        let kinds: Vec<String> = rx[0]
            .try_iter()
            .map(|e| match e {
                Event::Publication(p) => format!("{}{}", p.subject, p.position.offset),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(kinds, ["marker0", "a1", "marker0", "a2"]);
    }

    #[test]
    fn the_entry_goes_with_the_last_subscriber() {
        let (hub, rx, _polls) = hub(2);
        let a: Arc<str> = Arc::from("a");
        join(&hub, &a, 1);
        join(&hub, &a, 1);
        join(&hub, &a, 0);
        assert!(!hub.leave("a", 1, false));
        rx.iter().for_each(|r| while r.try_recv().is_ok() {});
        deliver(&hub, &publication("a", 1));
        assert_eq!((rx[0].len(), rx[1].len()), (1, 1));
        assert!(!hub.leave("a", 1, true));
        deliver(&hub, &publication("a", 2));
        assert_eq!((rx[0].len(), rx[1].len()), (2, 1));
        assert_eq!(hub.subject_count(), 1);
        assert!(hub.leave("a", 0, true), "last on the node");
        assert_eq!(hub.subject_count(), 0);
        assert_eq!(deliver(&hub, &publication("a", 3)), 0);
    }
}
