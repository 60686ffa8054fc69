//! The hub: the node's worker mailboxes, and the [`Route`] by which a
//! subject's events reach the workers holding its subscribers.
//!
//! The hub is node-local plumbing under the engine. It owns no subject
//! map: an engine keeps one [`Route`] inside its own per-subject state and
//! drives it under that state's lock, so a subject costs one map entry and
//! a publish one lock. [`Route::deliver`] hands a publication to each
//! interested worker as one shared `Arc<Publication>`; [`Route::join`]
//! queues an attach answer for the joining worker. Because the engine holds
//! the subject's lock across both, an attach answer sits in a worker's
//! mailbox exactly in line with the subject's publications (engine
//! contract, clause 3). Pushing into a mailbox is a lock-free channel send;
//! wake-ups happen after, once per batch ([`Wakeups`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use crate::messages::engine::{Attached, Broken, ConnAnswer, PresenceChange};
use crate::messages::feeds::FeedChange;
use crate::messages::proxy::Proxied;
use crate::publication::Publication;

/// What a worker's mailbox carries.
#[derive(Debug)]
pub enum Event {
    /// A publication for the worker's local subscribers of its subject.
    Publication(Arc<Publication>),
    /// A connection's attach is answered: from here on it is live.
    Attached(Box<Attached>),
    /// A connection's publish or history request is answered.
    Answer(Box<ConnAnswer>),
    /// A subject's stream broke under its live subscribers (its Redis lost
    /// it): they continue from a new position, having missed what was
    /// published in between.
    Broken(Box<Broken>),
    /// A connection's user follows or unfollows someone, or has just
    /// connected: feeds to add or drop (from the graph keeper).
    Feeds(Box<FeedChange>),
    /// A member joined or left a subject with join/leave events: for the
    /// worker's live subscribers of it.
    Presence(Arc<PresenceChange>),
    /// The backend's verdict on a command a connection parked for it.
    Proxied(Box<Proxied>),
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
/// (docs/limits.md), more than delivering the message does.
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

/// The workers whose bits are set in `mask`, lowest first.
fn workers_in(mut mask: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        let worker = (mask != 0).then(|| mask.trailing_zeros() as usize)?;
        mask &= mask - 1;
        Some(worker)
    })
}

/// Which workers hold subscribers of one subject, kept by the engine in
/// its per-subject state and used under that state's lock.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// Bit `w` set while worker `w` has at least one subscriber.
    workers: u64,
    /// Attached subscribers on this node, across workers.
    subscribers: u32,
}

impl Route {
    /// Subscribers on this node.
    pub fn subscribers(&self) -> u32 {
        self.subscribers
    }

    /// Records one more subscriber on `worker` and queues `answer` for that
    /// worker, in line with the subject's publications. Returns whether it
    /// is the subject's first subscriber on the node.
    pub fn join(&mut self, hub: &Hub, worker: usize, answer: Event, wakeups: &mut Wakeups) -> bool {
        let first = self.enter(worker);
        hub.send(worker, answer, wakeups);
        first
    }

    /// Records one more subscriber on `worker`, whose answer the caller
    /// sends later (an engine waiting on a network round trip). Returns
    /// whether it is the subject's first subscriber on the node.
    pub fn enter(&mut self, worker: usize) -> bool {
        self.subscribers += 1;
        self.workers |= 1 << worker;
        self.subscribers == 1
    }

    /// Records one subscriber fewer; `last_local` says the worker has none
    /// left. Returns whether it was the subject's last on the node.
    pub fn leave(&mut self, worker: usize, last_local: bool) -> bool {
        debug_assert!(self.subscribers > 0, "leave without join");
        self.subscribers = self.subscribers.saturating_sub(1);
        if last_local {
            self.workers &= !(1 << worker);
        }
        debug_assert!(
            self.subscribers > 0 || self.workers == 0,
            "workers left without subscribers"
        );
        self.subscribers == 0
    }

    /// Queues `event()` for every worker with subscribers.
    pub fn notify(&self, hub: &Hub, event: impl Fn() -> Event, wakeups: &mut Wakeups) {
        for worker in workers_in(self.workers) {
            hub.send(worker, event(), wakeups);
        }
    }

    /// Hands `publication` to every worker with subscribers, noting in
    /// `wakeups` the workers to wake once the caller's batch is done.
    /// Returns the subscribers on the node it reached.
    pub fn deliver(&self, hub: &Hub, publication: &Arc<Publication>, wakeups: &mut Wakeups) -> u32 {
        wakeups.0 |= self.workers;
        for worker in workers_in(self.workers) {
            hub.mailboxes[worker].push(Event::Publication(Arc::clone(publication)));
        }
        self.subscribers
    }
}

/// The workers' mailboxes, shared by all workers, the engine and the admin API.
pub struct Hub {
    mailboxes: Box<[Mailbox]>,
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
            mailboxes,
            mailbox_high_water,
        };
        (Arc::new(hub), receivers)
    }

    /// Worker `worker`'s mailbox.
    pub fn mailbox(&self, worker: usize) -> &Mailbox {
        &self.mailboxes[worker]
    }

    /// Queues an event for one worker (an answer to one of its connections).
    pub fn send(&self, worker: usize, event: Event, wakeups: &mut Wakeups) {
        self.mailboxes[worker].push(event);
        wakeups.add(worker);
    }

    /// Queues `change` for every worker: any may hold subscribers of its
    /// subject, and one without ignores it.
    pub fn send_to_all(&self, change: &Arc<PresenceChange>, wakeups: &mut Wakeups) {
        for worker in 0..self.mailboxes.len() {
            self.send(worker, Event::Presence(Arc::clone(change)), wakeups);
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

    /// Wakes the workers a batch of publishes handed deliveries to (those
    /// already awake are left alone).
    pub fn wake(&self, mut wakeups: Wakeups) {
        for worker in workers_in(std::mem::take(&mut wakeups.0)) {
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

/// A hub of `workers` for tests that read the workers' mailboxes
/// themselves; the polls keep the wakers valid and must outlive the hub.
#[cfg(test)]
pub(crate) fn test_hub(
    workers: usize,
    mailbox_high_water: usize,
) -> (Arc<Hub>, Vec<Receiver<Event>>, Vec<mio::Poll>) {
    let polls: Vec<mio::Poll> = (0..workers).map(|_| mio::Poll::new().unwrap()).collect();
    let wakers = polls
        .iter()
        .map(|p| mio::Waker::new(p.registry(), mio::Token(0)).unwrap())
        .collect();
    let (hub, mailboxes) = Hub::new(wakers, mailbox_high_water);
    (hub, mailboxes, polls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use myriad_protocol::position::{Epoch, Position};

    fn hub(workers: usize) -> (Arc<Hub>, Vec<Receiver<Event>>, Vec<mio::Poll>) {
        test_hub(workers, 65_536)
    }

    fn publication(offset: u64) -> Arc<Publication> {
        Arc::new(Publication::new(
            Arc::from("a"),
            Position::new(Epoch(1), offset),
            "1",
            0,
        ))
    }

    /// An answer for a connection, standing for an attach answer.
    fn marker() -> Event {
        let to = crate::messages::engine::ConnRequest {
            worker: 0,
            conn: 7,
            life: 0,
            request: None,
        };
        let answer =
            crate::messages::engine::Answer::Published(Ok(crate::messages::engine::Published {
                position: None,
                subscribers: 0,
            }));
        Event::Answer(Box::new(ConnAnswer { to, answer }))
    }

    fn join(hub: &Hub, route: &mut Route, worker: usize) -> bool {
        let mut wakeups = Wakeups::default();
        let first = route.join(hub, worker, marker(), &mut wakeups);
        hub.wake(wakeups);
        first
    }

    fn deliver(hub: &Hub, route: &Route, offset: u64) -> u32 {
        let mut wakeups = Wakeups::default();
        let n = route.deliver(hub, &publication(offset), &mut wakeups);
        hub.wake(wakeups);
        n
    }

    fn drain(rx: &[Receiver<Event>]) {
        rx.iter().for_each(|r| while r.try_recv().is_ok() {});
    }

    #[test]
    fn deliver_reaches_exactly_the_workers_with_subscribers() {
        let (hub, rx, _polls) = hub(3);
        let mut route = Route::default();
        assert!(join(&hub, &mut route, 0));
        assert!(!join(&hub, &mut route, 2));
        assert!(!join(&hub, &mut route, 2));
        drain(&rx);
        let p = publication(1);
        let mut wakeups = Wakeups::default();
        assert_eq!(route.deliver(&hub, &p, &mut wakeups), 3);
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

    /// One batch, woken once at its end as an engine's is: an answer
    /// queued anywhere but in the worker's own queue at the join (say,
    /// held for the wake-up) would come after the publications behind it.
    #[test]
    fn a_join_queues_its_answer_in_line_with_the_publications() {
        let (hub, rx, _polls) = hub(1);
        let mut route = Route::default();
        let mut wakeups = Wakeups::default();
        route.join(&hub, 0, marker(), &mut wakeups);
        route.deliver(&hub, &publication(1), &mut wakeups);
        route.join(&hub, 0, marker(), &mut wakeups);
        route.deliver(&hub, &publication(2), &mut wakeups);
        hub.wake(wakeups);
        let order: Vec<String> = rx[0]
            .try_iter()
            .map(|e| match e {
                Event::Publication(p) => p.position.offset.to_string(),
                Event::Answer(_) => "answer".to_owned(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(order, ["answer", "1", "answer", "2"]);
    }

    /// An attach answer standing for one taken at `offset`.
    fn answer_at(offset: u64) -> Event {
        Event::Attached(Box::new(Attached {
            subject: Arc::from("a"),
            to: crate::messages::engine::ConnRequest {
                worker: 0,
                conn: 7,
                life: 0,
                request: None,
            },
            token: offset,
            outcome: Ok(crate::messages::engine::Attachment {
                position: Position::new(Epoch(1), offset),
                recovered: None,
                replay: Vec::new(),
            }),
        }))
    }

    /// As an engine drives a route: a publisher and attaches share the
    /// subject's lock, each answer carrying the offset handed out last
    /// when it joined, and wake-ups come after the lock is let go. In the
    /// worker's queue every answer must sit right behind the publication
    /// it counts and right before the next: one out of line is a gap or a
    /// duplicate for the subscriber it starts.
    #[test]
    fn answers_stay_in_line_with_a_concurrent_publisher() {
        const PUBLISHES: u64 = 20_000;
        let (hub, rx, _polls) = hub(1);
        let subject = Arc::new(std::sync::Mutex::new((Route::default(), 0u64)));
        join(&hub, &mut subject.lock().unwrap().0, 0);
        drain(&rx);
        // The publisher starts with the first join and, halfway, waits for
        // an answer joined after its first publication, so the two overlap
        // whatever the scheduler does. Joins go on as fast as the lock
        // allows (up to a bound once that overlap is made): an answer out
        // of line shows between the joiner's unlock and its wake-up.
        const JOINS: u32 = 50_000;
        let joined_while_publishing = Arc::new(AtomicBool::new(false));
        let (start, started) = std::sync::mpsc::channel::<()>();
        let publisher = {
            let (hub, subject) = (Arc::clone(&hub), Arc::clone(&subject));
            let joined = Arc::clone(&joined_while_publishing);
            std::thread::spawn(move || {
                started.recv().unwrap();
                for offset in 1..=PUBLISHES {
                    let mut wakeups = Wakeups::default();
                    let mut guard = subject.lock().unwrap();
                    guard.0.deliver(&hub, &publication(offset), &mut wakeups);
                    guard.1 = offset;
                    drop(guard);
                    hub.wake(wakeups);
                    while offset == PUBLISHES / 2 && !joined.load(Ordering::Acquire) {
                        std::thread::yield_now();
                    }
                }
            })
        };
        let mut joins = 0;
        while !publisher.is_finished() {
            if joins >= JOINS && joined_while_publishing.load(Ordering::Acquire) {
                std::thread::yield_now();
                continue;
            }
            let mut wakeups = Wakeups::default();
            let mut guard = subject.lock().unwrap();
            let at = guard.1;
            guard.0.join(&hub, 0, answer_at(at), &mut wakeups);
            drop(guard);
            hub.wake(wakeups);
            joins += 1;
            if joins == 1 {
                start.send(()).unwrap();
            }
            if at > 0 {
                joined_while_publishing.store(true, Ordering::Release);
            }
        }
        publisher.join().unwrap();
        let mut last = 0;
        let mut between = 0;
        for event in rx[0].try_iter() {
            match event {
                Event::Publication(p) => {
                    assert_eq!(p.position.offset, last + 1, "no gap, no duplicate");
                    last = p.position.offset;
                }
                Event::Attached(a) => {
                    let at = a.outcome.expect("answered").position.offset;
                    assert_eq!(at, last, "the answer sits right behind what it counts");
                    between += usize::from(at > 0 && at < PUBLISHES);
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(last, PUBLISHES);
        assert!(between > 0, "some answer joined while the publisher ran");
    }

    #[test]
    fn a_worker_stops_receiving_with_its_last_subscriber() {
        let (hub, rx, _polls) = hub(2);
        let mut route = Route::default();
        join(&hub, &mut route, 1);
        join(&hub, &mut route, 1);
        join(&hub, &mut route, 0);
        assert!(!route.leave(1, false));
        drain(&rx);
        deliver(&hub, &route, 1);
        assert_eq!((rx[0].len(), rx[1].len()), (1, 1));
        assert!(!route.leave(1, true));
        deliver(&hub, &route, 2);
        assert_eq!((rx[0].len(), rx[1].len()), (2, 1));
        assert!(route.leave(0, true), "last on the node");
        assert_eq!(route, Route::default());
        assert_eq!(deliver(&hub, &route, 3), 0);
    }
}
