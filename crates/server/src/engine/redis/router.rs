//! The node's side of every subject it has interest in: which workers hold
//! its subscribers, and the switch that places each attach answer exactly
//! in line with the publications arriving from Redis.
//!
//! # The switch
//! An attach runs a script that reads the subject's position P (and the
//! history a recovery needs) *after* the node's subscription to the
//! subject's channel is confirmed, so every publication after P arrives on
//! the channel. Publications at or before P may arrive too, and the answer
//! and the channel are read by different tasks, so either may come first.
//! The router orders them by offset, not by arrival:
//! - it remembers the newest position it handed to workers (`routed`);
//! - an answer at P with `routed` at or past P is placed at once, and the
//!   publications after P it already handed out (kept in `recent` while
//!   attaches are in flight) come with it as its replay;
//! - an answer ahead of `routed` waits until the publication at P has been
//!   handed out, and is placed right behind it;
//! - until the first answer of a subscription is placed, channel messages
//!   are only kept in `recent`: no worker has a subscriber to give them to.
//!   That answer starts the stream at its P, and those after P go out
//!   right behind it.
//!
//! This is contract clause 3, and the conformance suite's switch test
//! runs it against a real Redis; `router/tests.rs` runs it without one, in
//! every order of channel messages and answers one connection can give.
//!
//! Publications older than `routed` (a duplicate, or one published before
//! the subscriber's position) are dropped, so each connection sees each
//! offset once and in order (clause 2).
//!
//! The switch relies on a subject's answers coming in the order their
//! scripts ran, so that their positions never go back: one instance task
//! sends them all down one connection (instance.rs). An answer behind one
//! already placed would find `recent` without the publications that the
//! earlier answer skipped, and its replay would have a gap at its end
//! (the property test in `router/tests.rs` fails that way when it lets
//! answers come in any order).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, MutexGuard};

use foldhash::fast::RandomState;
use hashbrown::HashMap;
use myriad_protocol::position::Position;

use crate::engine::{Attach, Attached, Attachment, Broken, EngineError};
use crate::heap;
use crate::hub::{Event, Hub, Route, Wakeups};
use crate::publication::Publication;
use crate::sharded::Sharded;

/// Publications kept for attaches in flight, per subject; past it a
/// recovery that needed them reports `recovered: false`.
const RECENT_LIMIT: usize = 4_096;

/// An attach Redis has answered, waiting for its place in the stream.
#[derive(Debug)]
struct Answered {
    attach: Attach,
    answered: Attachment,
}

/// Kept only while attaches of the subject are in flight.
#[derive(Debug, Default)]
struct Switching {
    /// Attaches sent and not yet placed.
    in_flight: u32,
    /// Publications that arrived while attaches were in flight, oldest first.
    recent: VecDeque<Arc<Publication>>,
    waiting: Vec<Answered>,
    /// Set while the subject's Redis connection is being restored: the
    /// last position handed out before it was lost. The catch-up read
    /// brings live subscribers from here to the present (see `resumed`).
    resume_from: Option<Position>,
}

#[derive(Debug)]
struct Subject {
    /// Which life of the subject on this node: an answer to an attach of
    /// an earlier life (left and joined again meanwhile) is stale.
    life: u64,
    route: Route,
    /// The newest publication handed to workers (or the position the first
    /// answer placed), `None` until the first answer of this subscription.
    routed: Option<Position>,
    switching: Option<Box<Switching>>,
}

impl Subject {
    fn new(life: u64) -> Subject {
        Subject {
            life,
            route: Route::default(),
            routed: None,
            switching: None,
        }
    }

    fn switching(&mut self) -> &mut Switching {
        self.switching.get_or_insert_with(Box::default)
    }
}

type Shard = HashMap<Arc<str>, Subject, RandomState>;

/// Every subject with interest on this node.
pub struct Router {
    hub: Arc<Hub>,
    shards: Sharded<Shard>,
    lives: AtomicU64,
    /// What the subjects' entries take ([`heap::named_entry_bytes`]).
    held_bytes: AtomicUsize,
}

impl Router {
    pub fn new(hub: Arc<Hub>) -> Router {
        Router {
            hub,
            shards: Sharded::default(),
            lives: AtomicU64::new(0),
            held_bytes: AtomicUsize::new(0),
        }
    }

    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    fn lock(&self, subject: &str) -> MutexGuard<'_, Shard> {
        // Every update leaves the map consistent between statements, as
        // the sharded module's poison policy asks.
        self.shards.lock(subject)
    }

    /// An attach is on its way to Redis: counts its subscriber. Returns
    /// the subject's life, which its answer brings back.
    pub fn join(&self, subject: &Arc<str>, worker: usize) -> u64 {
        let mut shard = self.lock(subject);
        let entry = shard.entry_ref(&**subject).or_insert_with(|| {
            self.held_bytes.fetch_add(
                heap::named_entry_bytes::<Subject>(subject),
                Ordering::Relaxed,
            );
            Subject::new(self.lives.fetch_add(1, Ordering::Relaxed))
        });
        entry.switching().in_flight += 1;
        entry.route.enter(worker);
        entry.life
    }

    /// One subscriber fewer; true when it was the subject's last on the node
    /// (the subject is forgotten here; answers still in flight are stale).
    pub fn leave(&self, subject: &str, worker: usize, last_local: bool) -> bool {
        let mut shard = self.lock(subject);
        let Some(entry) = shard.get_mut(subject) else {
            debug_assert!(false, "detach from {subject}, which no attach joined");
            return false;
        };
        let last = entry.route.leave(worker, last_local);
        if last {
            shard.remove(subject);
            self.held_bytes.fetch_sub(
                heap::named_entry_bytes::<Subject>(subject),
                Ordering::Relaxed,
            );
        }
        last
    }

    /// Whether the attach that joined `subject`'s life `life` may still be
    /// waited for: false once every subscriber of that life left.
    pub fn is_current(&self, subject: &str, life: u64) -> bool {
        self.lock(subject)
            .get(subject)
            .is_some_and(|s| s.life == life)
    }

    /// Subscribers of `subject` on this node.
    pub fn subscribers(&self, subject: &str) -> u32 {
        self.lock(subject)
            .get(subject)
            .map_or(0, |s| s.route.subscribers())
    }

    /// Subjects with interest on this node.
    pub fn count(&self) -> usize {
        self.shards.sum(Shard::len)
    }

    /// What the entries of those subjects take on this node (their
    /// attaches in flight aside).
    pub fn held_bytes(&self) -> usize {
        self.held_bytes.load(Ordering::Relaxed)
    }

    /// The subjects with interest on this node that `keep` picks.
    pub fn subjects(&self, mut keep: impl FnMut(&str) -> bool) -> Vec<Arc<str>> {
        let mut out = Vec::new();
        self.shards.for_each(|shard| {
            out.extend(shard.keys().filter(|s| keep(s)).cloned());
        });
        out
    }

    /// A message arrived on `subject`'s channel. `decode` makes its
    /// publication, under the name the node already holds for the subject,
    /// and only when the node still has interest in it (a message sent
    /// before the node left is not even read); `None` drops it.
    pub fn deliver(
        &self,
        subject: &str,
        decode: impl FnOnce(&Arc<str>) -> Option<Publication>,
        wakeups: &mut Wakeups,
    ) {
        let mut shard = self.lock(subject);
        let Some((name, entry)) = shard.get_key_value_mut(subject) else {
            return;
        };
        let Some(publication) = decode(name) else {
            return;
        };
        let publication = Arc::new(publication);
        let position = publication.position;
        match entry.routed {
            None => {
                // No answer placed yet: nobody to hand it to; an answer may
                // need it.
                keep_recent(entry.switching(), publication);
                return;
            }
            Some(routed) if routed.epoch == position.epoch && position.offset <= routed.offset => {
                return; // already handed out, or older than every subscriber
            }
            Some(_) => {}
        }
        entry.route.deliver(&self.hub, &publication, wakeups);
        entry.routed = Some(position);
        let Some(switching) = entry.switching.as_deref_mut() else {
            return;
        };
        keep_recent(switching, publication);
        let (due, still): (Vec<Answered>, Vec<Answered>) = std::mem::take(&mut switching.waiting)
            .into_iter()
            .partition(|w| w.answered.position.offset <= position.offset);
        switching.waiting = still;
        for waiting in due {
            self.place(entry, waiting.attach, waiting.answered, wakeups);
        }
    }

    /// Redis answered an attach (or it failed): places the answer in line.
    pub fn answered(
        &self,
        attach: Attach,
        life: u64,
        outcome: Result<Attachment, EngineError>,
        wakeups: &mut Wakeups,
    ) {
        let mut shard = self.lock(&attach.subject);
        let Some(entry) = shard
            .get_mut(&*attach.subject)
            .filter(|entry| entry.life == life)
        else {
            // Detached while in flight: the worker drops the stale answer.
            drop(shard);
            self.send(attach, outcome, wakeups);
            return;
        };
        let answered = match outcome {
            Ok(answered) => answered,
            Err(e) => {
                settle(entry);
                drop(shard);
                self.send(attach, Err(e), wakeups);
                return;
            }
        };
        let resuming = entry
            .switching
            .as_ref()
            .is_some_and(|s| s.resume_from.is_some());
        match entry.routed {
            // Live subscribers are still catching up: after them.
            _ if resuming => entry
                .switching()
                .waiting
                .push(Answered { attach, answered }),
            Some(routed)
                if routed.epoch == answered.position.epoch
                    && routed.offset < answered.position.offset =>
            {
                // Publications up to P are still on their way: wait for P.
                entry
                    .switching()
                    .waiting
                    .push(Answered { attach, answered });
            }
            _ => self.place(entry, attach, answered, wakeups),
        }
    }

    /// Sends an answer whose place in the stream has come.
    fn place(
        &self,
        entry: &mut Subject,
        attach: Attach,
        answered: Attachment,
        wakeups: &mut Wakeups,
    ) {
        let at = answered.position;
        let newer: Vec<Arc<Publication>> = entry
            .switching()
            .recent
            .iter()
            .filter(|p| p.position.epoch == at.epoch && p.position.offset > at.offset)
            .cloned()
            .collect();
        let handed_out = entry.routed.is_some_and(|r| r.epoch == at.epoch);
        settle(entry);
        let worker = attach.to.worker;
        if !handed_out {
            // The subscription's first answer (or a new epoch's): the stream
            // starts at its position, and what arrived after it goes out
            // live, behind the answer.
            let attachment = fit(
                attach.max_replay_bytes,
                at,
                answered.recovered,
                answered.replay,
            );
            self.hub
                .send(worker, attached(attach, Ok(attachment)), wakeups);
            entry.routed = Some(at);
            for publication in newer {
                entry.route.deliver(&self.hub, &publication, wakeups);
                entry.routed = Some(publication.position);
            }
            return;
        }
        // Workers were handed the publications after `at` before this
        // answer: they come with it, if `recent` kept all of them.
        let complete = newer
            .iter()
            .zip(at.offset + 1..)
            .all(|(p, offset)| p.position.offset == offset);
        let newest = newer.last().map_or(at, |p| p.position);
        let attachment = match answered.recovered {
            Some(true) if complete => {
                let mut replay = answered.replay;
                replay.extend(newer);
                fit(attach.max_replay_bytes, at, Some(true), replay)
            }
            Some(_) => refused_recovery(newest),
            None if complete => Attachment {
                position: at,
                recovered: None,
                replay: newer,
            },
            // Starts later, past what it cannot be given.
            None => Attachment {
                position: newest,
                recovered: None,
                replay: Vec::new(),
            },
        };
        self.hub
            .send(worker, attached(attach, Ok(attachment)), wakeups);
    }

    fn send(
        &self,
        attach: Attach,
        outcome: Result<Attachment, EngineError>,
        wakeups: &mut Wakeups,
    ) {
        let worker = attach.to.worker;
        self.hub.send(worker, attached(attach, outcome), wakeups);
    }

    /// The connection to a subject's Redis was lost: answers waiting for
    /// publications that will not come are refused, and each subscription
    /// with live subscribers waits for its catch-up (`resumed`) before
    /// anything more is handed out.
    pub fn reset(
        &self,
        mut affected: impl FnMut(&str) -> bool,
        error: &EngineError,
        wakeups: &mut Wakeups,
    ) {
        self.shards.for_each(|shard| {
            for (subject, entry) in shard.iter_mut() {
                if !affected(subject) {
                    continue;
                }
                let handed_out = entry.routed.take();
                let switching = entry.switching();
                switching.recent.clear();
                for waiting in std::mem::take(&mut switching.waiting) {
                    switching.in_flight -= 1;
                    let worker = waiting.attach.to.worker;
                    self.hub.send(
                        worker,
                        attached(waiting.attach, Err(error.clone())),
                        wakeups,
                    );
                }
                if switching.resume_from.is_none() {
                    if let Some(position) = handed_out {
                        switching.resume_from = Some(position);
                        switching.in_flight += 1;
                    }
                }
                if switching.in_flight == 0 {
                    entry.switching = None;
                }
            }
        });
    }

    /// Subscriptions waiting for their catch-up, with where each stopped.
    pub fn resumes(&self, mut keep: impl FnMut(&str) -> bool) -> Vec<(Arc<str>, Position)> {
        let mut out = Vec::new();
        self.shards.for_each(|shard| {
            for (subject, entry) in shard.iter() {
                let from = entry.switching.as_ref().and_then(|s| s.resume_from);
                if let Some(from) = from.filter(|_| keep(subject)) {
                    out.push((Arc::clone(subject), from));
                }
            }
        });
        out
    }

    /// The catch-up read of a subscription whose connection came back
    /// (subscribed again before the read): live subscribers get what they
    /// missed, in order, when history still has it; otherwise every worker
    /// is told the stream broke. Then what arrived meanwhile follows, and
    /// the attach answers held back find their place.
    pub fn resumed(&self, subject: &str, caught_up: Attachment, wakeups: &mut Wakeups) {
        let mut shard = self.lock(subject);
        let Some(entry) = shard.get_mut(subject) else {
            return; // every subscriber left meanwhile
        };
        let Some(switching) = entry.switching.as_deref_mut() else {
            return;
        };
        if switching.resume_from.take().is_none() {
            return;
        }
        let at = caught_up.position;
        if caught_up.recovered == Some(true) {
            for publication in &caught_up.replay {
                entry.route.deliver(&self.hub, publication, wakeups);
            }
        } else {
            let subject: Arc<str> = Arc::from(subject);
            let broken = || {
                Event::Broken(Box::new(Broken {
                    subject: Arc::clone(&subject),
                    position: at,
                }))
            };
            entry.route.notify(&self.hub, broken, wakeups);
        }
        entry.routed = Some(at);
        let switching = entry.switching();
        let newer: Vec<Arc<Publication>> = switching
            .recent
            .iter()
            .filter(|p| p.position.epoch == at.epoch && p.position.offset > at.offset)
            .cloned()
            .collect();
        for publication in newer {
            entry.route.deliver(&self.hub, &publication, wakeups);
            entry.routed = Some(publication.position);
        }
        settle(entry);
        let routed = entry.routed.expect("just set");
        let held = entry
            .switching
            .as_deref_mut()
            .map(|s| std::mem::take(&mut s.waiting))
            .unwrap_or_default();
        for waiting in held {
            if waiting.answered.position.epoch == routed.epoch
                && waiting.answered.position.offset > routed.offset
            {
                entry.switching().waiting.push(waiting);
            } else {
                self.place(entry, waiting.attach, waiting.answered, wakeups);
            }
        }
    }
}

fn keep_recent(switching: &mut Switching, publication: Arc<Publication>) {
    if switching.recent.len() == RECENT_LIMIT {
        // The oldest go: a recovery that needed them finds a gap.
        switching.recent.pop_front();
    }
    switching.recent.push_back(publication);
}

/// One attach in flight fewer; the switching state goes with the last.
fn settle(entry: &mut Subject) {
    if let Some(switching) = entry.switching.as_deref_mut() {
        switching.in_flight = switching.in_flight.saturating_sub(1);
        if switching.in_flight == 0
            && switching.waiting.is_empty()
            && switching.resume_from.is_none()
        {
            entry.switching = None;
        }
    }
}

/// A recovery's replay, or `recovered: false` when it would pass what the
/// connection can take.
fn fit(
    max_bytes: usize,
    at: Position,
    recovered: Option<bool>,
    replay: Vec<Arc<Publication>>,
) -> Attachment {
    let bytes: usize = replay.iter().map(|p| p.held_bytes()).sum();
    if recovered == Some(true) && bytes > max_bytes {
        return refused_recovery(at);
    }
    Attachment {
        position: at,
        recovered,
        replay,
    }
}

fn refused_recovery(position: Position) -> Attachment {
    Attachment {
        position,
        recovered: Some(false),
        replay: Vec::new(),
    }
}

fn attached(attach: Attach, outcome: Result<Attachment, EngineError>) -> Event {
    Event::Attached(Box::new(Attached {
        subject: attach.subject,
        to: attach.to,
        token: attach.token,
        outcome,
    }))
}

#[cfg(test)]
mod tests;
