//! The conformance suite's harness: the engine under test over a hub
//! whose worker mailboxes the suite reads ([`Harness`]), and [`Sim`],
//! which plays the workers' part, applying mailbox events exactly as a
//! worker does (a connection receives a subject's publications only
//! between its attach answer and its detach).
//!
//! It waits for what it expects, never for a time: a drain takes events
//! until every attach is answered and every attached connection has the
//! last publication the suite was told of, and fails after
//! [`SETTLE_WITHIN`] if that never happens. The clauses themselves are
//! `conformance.rs`'s; the harness checks only what every delivery must
//! keep (one epoch while attached) and events no engine may send here.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;
use myriad_protocol::position::Position;
use tokio::sync::oneshot;

use crate::engine::{
    Attach, Attached, ConnRequest, Engine, EngineError, HistoryPage, HistoryQuery, Join,
    PresencePage, PresenceQuery, PresenceStats, Published, Reply,
};
use crate::hub::{Event, Hub, Wakeups};
use crate::registry::ConnId;

/// Events waiting for one worker past which the harness's hub counts as
/// congested.
const CONGESTED_PAST: usize = 64;

/// How long a drain may wait for answers and deliveries it expects: far
/// beyond any round trip, so that only a lost answer fails it.
const SETTLE_WITHIN: Duration = Duration::from_secs(30);

/// One engine under test, its hub and the worker mailboxes behind it.
pub struct Harness {
    pub engine: Arc<dyn Engine>,
    pub hub: Arc<Hub>,
    mailboxes: Vec<Receiver<Event>>,
    _polls: Vec<mio::Poll>,
    /// The newest offset each subject's publishes were given, as answered.
    published: RefCell<HashMap<String, Position>>,
}

impl Harness {
    pub fn new(workers: usize, make: impl FnOnce(Arc<Hub>) -> Box<dyn Engine>) -> Harness {
        let (hub, mailboxes, polls) = crate::hub::test_hub(workers, CONGESTED_PAST);
        Harness {
            engine: Arc::from(make(Arc::clone(&hub))),
            hub,
            mailboxes,
            _polls: polls,
            published: RefCell::default(),
        }
    }

    pub fn publish(&self, subject: &str, data: &str) -> Published {
        let (tx, rx) = oneshot::channel();
        let mut wakeups = Wakeups::default();
        self.engine
            .publish(subject, data, Reply::Task(tx), &mut wakeups);
        self.hub.wake(wakeups);
        let published = rx.blocking_recv().expect("answered").expect("published");
        if let Some(position) = published.position {
            self.published
                .borrow_mut()
                .insert(subject.to_owned(), position);
        }
        published
    }

    /// Waits until every worker has at least `n` events waiting.
    pub(super) fn await_queued(&self, n: usize) {
        let deadline = std::time::Instant::now() + SETTLE_WITHIN;
        while (0..self.mailboxes.len()).any(|w| self.mailboxes[w].len() < n) {
            assert!(
                std::time::Instant::now() < deadline,
                "deliveries never arrived"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    pub fn history(&self, subject: &str, since: Option<Position>, limit: usize) -> HistoryPage {
        let (tx, rx) = oneshot::channel();
        let mut wakeups = Wakeups::default();
        let query = HistoryQuery {
            subject: Arc::from(subject),
            since,
            limit,
        };
        self.engine.history(query, Reply::Task(tx), &mut wakeups);
        self.hub.wake(wakeups);
        rx.blocking_recv().expect("answered").expect("read")
    }

    /// One page of `subject`'s members.
    pub fn presence(&self, subject: &str, after: Option<&str>, limit: usize) -> PresencePage {
        let (tx, rx) = oneshot::channel();
        let mut wakeups = Wakeups::default();
        let query = PresenceQuery {
            subject: Arc::from(subject),
            after: after.map(Arc::from),
            limit,
        };
        self.engine.presence(query, Reply::Task(tx), &mut wakeups);
        self.hub.wake(wakeups);
        rx.blocking_recv().expect("answered").expect("read")
    }

    /// Every member of `subject`, read page by page (`page` at a time).
    pub fn members(&self, subject: &str, page: usize) -> Vec<crate::engine::Member> {
        let mut all = Vec::new();
        let mut after: Option<Arc<str>> = None;
        loop {
            let read = self.presence(subject, after.as_deref(), page);
            assert!(read.members.len() <= page, "a page holds at most its limit");
            all.extend(read.members);
            match read.next {
                Some(next) => after = Some(next),
                None => return all,
            }
        }
    }

    /// `subject`'s counts: (connections, users).
    pub fn presence_stats(&self, subject: &str) -> (u64, u64) {
        let (tx, rx) = oneshot::channel();
        let mut wakeups = Wakeups::default();
        self.engine
            .presence_stats(Arc::from(subject), Reply::Task(tx), &mut wakeups);
        self.hub.wake(wakeups);
        let PresenceStats {
            connections, users, ..
        } = rx.blocking_recv().expect("answered").expect("read");
        (connections, users)
    }

    /// Attaches connection `conn` of worker 0 to `subject`, live from now;
    /// the answer is [`Harness::attached`]'s.
    pub fn attach(&self, subject: &str, conn: ConnId, can_wait: bool) {
        self.attach_as(subject, conn, can_wait, None);
    }

    /// Attaches connection `conn` of worker 0 to `subject`, joining its
    /// members with `join`; the answer is [`Harness::attached`]'s.
    pub fn attach_joining(&self, subject: &str, conn: ConnId, join: Join) {
        self.attach_as(subject, conn, false, Some(join));
    }

    fn attach_as(&self, subject: &str, conn: ConnId, can_wait: bool, join: Option<Join>) {
        let attach = Attach {
            subject: Arc::from(subject),
            since: None,
            max_replay_bytes: usize::MAX,
            to: request(0, conn),
            token: 1,
            can_wait,
            join,
        };
        let mut wakeups = Wakeups::default();
        self.engine.attach(attach, &mut wakeups);
        self.hub.wake(wakeups);
    }

    /// The next attach answer of worker 0 (publications are passed over),
    /// within [`SETTLE_WITHIN`].
    pub fn attached(&self) -> Attached {
        let deadline = std::time::Instant::now() + SETTLE_WITHIN;
        loop {
            let event = self.mailboxes[0]
                .recv_deadline(deadline)
                .expect("an attach answer in time");
            self.hub.mailbox(0).taken(1);
            if let Event::Attached(attached) = event {
                return *attached;
            }
        }
    }
}

/// The request of connection `conn` of `worker`, as the suite's workers
/// make it (every connection in its first life).
pub(super) fn request(worker: usize, conn: ConnId) -> ConnRequest {
    ConnRequest {
        worker,
        conn,
        life: 0,
        request: None,
    }
}

/// What one simulated connection saw of one subject.
#[derive(Debug, Default, Clone)]
pub(super) struct Seen {
    /// Position of the attach answer, and whether recovery was complete.
    pub(super) attached_at: Option<(Position, Option<bool>)>,
    /// Offsets received (replay, then live), in order.
    pub(super) offsets: Vec<u64>,
    /// Why the attach was refused, when it was.
    pub(super) refused: Option<EngineError>,
}

/// The workers' side: applies mailbox events the way a worker does.
pub(super) struct Sim {
    /// Live (attached) connections per (worker, subject).
    live: HashMap<(usize, Arc<str>), Vec<ConnId>>,
    /// Attaches waiting for their answer: (worker, conn, subject) → token.
    pending: HashMap<(usize, ConnId, Arc<str>), u64>,
    seen: HashMap<(ConnId, Arc<str>), Seen>,
    next_token: u64,
}

impl Sim {
    pub(super) fn new() -> Sim {
        Sim {
            live: HashMap::new(),
            pending: HashMap::new(),
            seen: HashMap::new(),
            next_token: 1,
        }
    }

    pub(super) fn attach(
        &mut self,
        h: &Harness,
        worker: usize,
        conn: ConnId,
        subject: &str,
        since: Option<Position>,
    ) {
        self.attach_limited(h, worker, conn, subject, since, usize::MAX);
    }

    /// An attach whose replay may not pass `max_replay_bytes`.
    pub(super) fn attach_limited(
        &mut self,
        h: &Harness,
        worker: usize,
        conn: ConnId,
        subject: &str,
        since: Option<Position>,
        max_replay_bytes: usize,
    ) {
        self.attach_as(h, (worker, conn), subject, since, max_replay_bytes, None);
    }

    /// An attach that joins `subject`'s members with `join`.
    pub(super) fn attach_joining(
        &mut self,
        h: &Harness,
        worker: usize,
        conn: ConnId,
        subject: &str,
        join: Join,
    ) {
        self.attach_as(h, (worker, conn), subject, None, usize::MAX, Some(join));
    }

    /// Ends connection `conn`'s subscription of presence subject
    /// `subject` as a worker does: it leaves, then detaches.
    pub(super) fn part(&mut self, h: &Harness, worker: usize, conn: ConnId, subject: &str) {
        let mut wakeups = Wakeups::default();
        h.engine.leave(subject, request(worker, conn), &mut wakeups);
        h.hub.wake(wakeups);
        self.detach(h, worker, conn, subject);
    }

    fn attach_as(
        &mut self,
        h: &Harness,
        (worker, conn): (usize, ConnId),
        subject: &str,
        since: Option<Position>,
        max_replay_bytes: usize,
        join: Option<Join>,
    ) {
        let subject: Arc<str> = Arc::from(subject);
        let token = self.next_token;
        self.next_token += 1;
        self.pending
            .insert((worker, conn, Arc::clone(&subject)), token);
        self.seen
            .insert((conn, Arc::clone(&subject)), Seen::default());
        let mut wakeups = Wakeups::default();
        h.engine.attach(
            Attach {
                subject,
                since,
                max_replay_bytes,
                to: request(worker, conn),
                token,
                can_wait: false,
                join,
            },
            &mut wakeups,
        );
        h.hub.wake(wakeups);
    }

    pub(super) fn detach(&mut self, h: &Harness, worker: usize, conn: ConnId, subject: &str) {
        let key = (worker, Arc::<str>::from(subject));
        self.pending.remove(&(worker, conn, Arc::clone(&key.1)));
        if let Some(list) = self.live.get_mut(&key) {
            list.retain(|&c| c != conn);
            if list.is_empty() {
                self.live.remove(&key);
            }
        }
        let last_local = !self.live.contains_key(&key)
            && !self
                .pending
                .keys()
                .any(|(w, _, s)| *w == worker && **s == *subject);
        h.engine.detach(subject, worker, last_local);
    }

    /// Takes events until every attach is answered and every attached
    /// connection has the newest publication of its subject the harness
    /// published.
    pub(super) fn drain(&mut self, h: &Harness) {
        let deadline = std::time::Instant::now() + SETTLE_WITHIN;
        loop {
            self.take(h);
            if self.settled(h) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "answers or deliveries never arrived: pending {:?}",
                self.pending.keys().collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Applies every event the workers' mailboxes hold now.
    pub(super) fn take(&mut self, h: &Harness) {
        for (worker, mailbox) in h.mailboxes.iter().enumerate() {
            let mut taken = 0;
            while let Ok(event) = mailbox.try_recv() {
                taken += 1;
                self.apply(worker, event);
            }
            h.hub.mailbox(worker).taken(taken);
        }
    }

    fn settled(&self, h: &Harness) -> bool {
        if !self.pending.is_empty() {
            return false;
        }
        let published = h.published.borrow();
        self.live.iter().all(|((_, subject), conns)| {
            let Some(newest) = published.get(&**subject) else {
                return true;
            };
            conns.iter().all(|conn| {
                let seen = &self.seen[&(*conn, Arc::clone(subject))];
                let Some((at, _)) = seen.attached_at else {
                    return true;
                };
                at.epoch != newest.epoch
                    || at.offset >= newest.offset
                    || seen.offsets.last() >= Some(&newest.offset)
            })
        })
    }

    fn apply(&mut self, worker: usize, event: Event) {
        match event {
            Event::Publication(p) => {
                for conn in self
                    .live
                    .get(&(worker, Arc::clone(&p.subject)))
                    .into_iter()
                    .flatten()
                {
                    let seen = self.seen.get_mut(&(*conn, Arc::clone(&p.subject))).unwrap();
                    assert_eq!(
                        seen.attached_at.map(|(at, _)| at.epoch),
                        Some(p.position.epoch),
                        "clause 1: one epoch while attached"
                    );
                    seen.offsets.push(p.position.offset);
                }
            }
            Event::Attached(a) => {
                let key = (worker, a.to.conn, Arc::clone(&a.subject));
                if self.pending.get(&key) != Some(&a.token) {
                    return; // a stale answer: detached meanwhile
                }
                self.pending.remove(&key);
                let seen = self
                    .seen
                    .get_mut(&(a.to.conn, Arc::clone(&a.subject)))
                    .unwrap();
                let attachment = match a.outcome {
                    Ok(attachment) => attachment,
                    Err(e @ EngineError::PresenceFull { .. }) => {
                        // Refused by the cap: the worker would detach it.
                        seen.refused = Some(e);
                        return;
                    }
                    Err(e) => panic!("attach failed: {e}"),
                };
                seen.attached_at = Some((attachment.position, attachment.recovered));
                seen.offsets
                    .extend(attachment.replay.iter().map(|p| p.position.offset));
                self.live
                    .entry((worker, a.subject))
                    .or_default()
                    .push(a.to.conn);
            }
            Event::Answer(_) => panic!("no connection request asked for an answer"),
            Event::Feeds(_) => panic!("engines never send feed changes"),
            Event::Broken(b) => panic!("no stream breaks while the engine is up: {b:?}"),
            Event::Presence(c) => panic!("no join asked for events: {c:?}"),
            Event::Proxied(p) => panic!("engines never send proxy verdicts: {p:?}"),
        }
    }

    pub(super) fn seen(&self, conn: ConnId, subject: &str) -> Seen {
        self.seen[&(conn, Arc::from(subject))].clone()
    }
}
