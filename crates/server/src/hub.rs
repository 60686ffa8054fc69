//! The hub: which workers hold subscribers of which subject, and the
//! mailboxes that carry encoded deliveries to them.
//!
//! The subject map is split into [`SHARDS`] independently locked shards, so a
//! publish or subscribe only contends with operations on subjects that hash to
//! the same shard. A shard lock is held for a map lookup, one encoding of the
//! delivery frame and a few lock-free channel pushes: never across a system
//! call other than a wake-up, and never across an `.await`. Holding it while
//! pushing is what keeps deliveries of one subject in sequence order on every
//! worker even when two workers publish to it at once.
//!
//! The hub knows subjects with subscribers only: a publish to a subject nobody
//! holds is counted and dropped, and a subject's state (including its
//! sequence counter) is freed when its last subscriber on the node leaves.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
use foldhash::fast::RandomState;
use hashbrown::HashMap;
use myriad_protocol::message::{delivery_len, write_delivery};
use myriad_protocol::ws::{write_frame_header, OpCode, MAX_HEADER_LEN};

/// Number of subject-map shards; a power of two well above the core count.
pub const SHARDS: usize = 64;

/// One encoded message on its way to a worker's local subscribers.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub subject: Arc<str>,
    /// The complete WebSocket frame, encoded once and shared by every recipient.
    pub frame: Bytes,
}

/// A worker's inbound queue and the means to wake it.
pub struct Mailbox {
    tx: Sender<Delivery>,
    waker: mio::Waker,
    /// Set by the worker just before it blocks in `epoll_wait`; a producer that
    /// swaps it back to false owes the worker one wake-up. Coalesces wake-ups:
    /// a burst of publishes costs one `eventfd` write, not one per message.
    sleeping: AtomicBool,
    queued: AtomicUsize,
}

impl Mailbox {
    /// Queues a delivery; waking the worker is left to [`Hub::wake`].
    fn push(&self, delivery: Delivery) {
        self.queued.fetch_add(1, Ordering::Relaxed);
        // The receiver lives as long as the worker; a send can only fail while
        // the node is shutting down, when dropping the delivery is correct.
        let _ = self.tx.send(delivery);
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
    pub fn prepare_to_sleep(&self, rx: &Receiver<Delivery>) -> bool {
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

    /// Called by the owning worker after taking `n` deliveries off the queue.
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
    /// Subscribers on this node, across workers.
    subscribers: u32,
    /// The last sequence number assigned to a publish.
    seq: u64,
}

/// The outcome of handing one publish to the hub.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// The sequence number given to the message; `None` when the subject had
    /// no subscribers on this node and the message was dropped.
    pub seq: Option<u64>,
    /// Subscribers on this node the message was handed to.
    pub subscribers: u32,
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
    ) -> (Arc<Hub>, Vec<Receiver<Delivery>>) {
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

    /// Records one more subscriber of `subject` on `worker`; `first_local`
    /// says it is that worker's first, so the worker starts receiving it.
    pub fn subscribe(&self, subject: &Arc<str>, worker: usize, first_local: bool) {
        let mut shard = self.shard(subject);
        let state = shard.entry(Arc::clone(subject)).or_insert(SubjectState {
            workers: 0,
            subscribers: 0,
            seq: 0,
        });
        state.subscribers += 1;
        if first_local {
            state.workers |= 1 << worker;
        }
    }

    /// Records one subscriber fewer; `last_local` says the worker has none left.
    pub fn unsubscribe(&self, subject: &str, worker: usize, last_local: bool) {
        let mut shard = self.shard(subject);
        let Some(state) = shard.get_mut(subject) else {
            debug_assert!(false, "unsubscribe from unknown subject {subject}");
            return;
        };
        state.subscribers -= 1;
        if last_local {
            state.workers &= !(1 << worker);
        }
        if state.subscribers == 0 {
            shard.remove(subject);
        }
    }

    /// Assigns the next sequence number of `subject`, encodes the delivery
    /// frame once and hands it to every worker with subscribers, noting in
    /// `wakeups` the workers to wake once the caller's batch is done.
    pub fn publish(&self, subject: &str, data: &str, wakeups: &mut Wakeups) -> Published {
        let mut shard = self.shard(subject);
        let Some((name, state)) = shard.get_key_value_mut(subject) else {
            return Published {
                seq: None,
                subscribers: 0,
            };
        };
        state.seq += 1;
        let frame = encode_delivery_frame(subject, state.seq, data);
        let mut workers = state.workers;
        wakeups.0 |= workers;
        while workers != 0 {
            let worker = workers.trailing_zeros() as usize;
            workers &= workers - 1;
            self.mailboxes[worker].push(Delivery {
                subject: Arc::clone(name),
                frame: frame.clone(),
            });
        }
        Published {
            seq: Some(state.seq),
            subscribers: state.subscribers,
        }
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

/// The WebSocket text frame carrying one delivery: header and JSON written
/// into a single allocation that all recipients then share.
pub fn encode_delivery_frame(subject: &str, seq: u64, data: &str) -> Bytes {
    let len = delivery_len(subject, seq, data);
    let mut frame = Vec::with_capacity(MAX_HEADER_LEN + len);
    write_frame_header(&mut frame, true, OpCode::Text, len, None);
    write_delivery(&mut frame, subject, seq, data);
    Bytes::from(frame)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub(workers: usize) -> (Arc<Hub>, Vec<Receiver<Delivery>>, Vec<mio::Poll>) {
        let polls: Vec<mio::Poll> = (0..workers).map(|_| mio::Poll::new().unwrap()).collect();
        let wakers = polls
            .iter()
            .map(|p| mio::Waker::new(p.registry(), mio::Token(0)).unwrap())
            .collect();
        let (hub, rx) = Hub::new(wakers, 65_536);
        (hub, rx, polls)
    }

    #[test]
    fn publish_reaches_exactly_the_workers_with_subscribers() {
        let (hub, rx, _polls) = hub(3);
        let a: Arc<str> = Arc::from("a");
        hub.subscribe(&a, 0, true);
        hub.subscribe(&a, 2, true);
        hub.subscribe(&a, 2, false);
        let mut wakeups = Wakeups::default();
        let p = hub.publish("a", "1", &mut wakeups);
        assert_eq!(wakeups.0, 0b101, "workers 0 and 2 are owed a wake-up");
        hub.wake(wakeups);
        assert_eq!(
            p,
            Published {
                seq: Some(1),
                subscribers: 3
            }
        );
        assert_eq!(rx[0].len(), 1);
        assert_eq!(rx[1].len(), 0);
        assert_eq!(rx[2].len(), 1);
        let d = rx[2].try_recv().unwrap();
        assert_eq!(&*d.subject, "a");
        let d0 = rx[0].try_recv().unwrap();
        assert_eq!(d.frame.as_ptr(), d0.frame.as_ptr(), "one encoding shared");
    }

    /// One publish, waking its workers at once.
    fn publish(hub: &Hub, subject: &str, data: &str) -> Published {
        let mut wakeups = Wakeups::default();
        let published = hub.publish(subject, data, &mut wakeups);
        hub.wake(wakeups);
        published
    }

    #[test]
    fn sequence_is_per_subject_and_state_goes_with_the_last_subscriber() {
        let (hub, _rx, _polls) = hub(1);
        let a: Arc<str> = Arc::from("a");
        let b: Arc<str> = Arc::from("b");
        hub.subscribe(&a, 0, true);
        hub.subscribe(&b, 0, true);
        assert_eq!(publish(&hub, "a", "1").seq, Some(1));
        assert_eq!(publish(&hub, "a", "1").seq, Some(2));
        assert_eq!(publish(&hub, "b", "1").seq, Some(1));
        assert_eq!(
            publish(&hub, "c", "1"),
            Published {
                seq: None,
                subscribers: 0
            }
        );
        assert_eq!(hub.subject_count(), 2);
        hub.unsubscribe("a", 0, true);
        assert_eq!(hub.subject_count(), 1);
        assert_eq!(publish(&hub, "a", "1").seq, None);
    }

    #[test]
    fn worker_bit_clears_only_with_its_last_subscriber() {
        let (hub, rx, _polls) = hub(2);
        let a: Arc<str> = Arc::from("a");
        hub.subscribe(&a, 1, true);
        hub.subscribe(&a, 1, false);
        hub.subscribe(&a, 0, true);
        hub.unsubscribe("a", 1, false);
        publish(&hub, "a", "1");
        assert_eq!((rx[0].len(), rx[1].len()), (1, 1));
        hub.unsubscribe("a", 1, true);
        publish(&hub, "a", "1");
        assert_eq!((rx[0].len(), rx[1].len()), (2, 1));
    }

    #[test]
    fn the_frame_is_a_complete_text_frame() {
        let frame = encode_delivery_frame("s", 7, "\"x\"");
        let body = br#"{"op":"msg","subject":"s","seq":7,"data":"x"}"#;
        assert_eq!(frame[0], 0x81);
        assert_eq!(frame[1] as usize, body.len());
        assert_eq!(&frame[2..], body);
    }
}
