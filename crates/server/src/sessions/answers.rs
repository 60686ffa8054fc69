//! The engine's answers and the subscription bookkeeping they drive.
//!
//! A subscription is recorded in four places that must agree: the
//! connection's session (to clean up when it closes), the `attaching` list
//! while the engine's answer is on its way, the registry once it is live
//! (for local fan-out), and, through the engine, the subject's route
//! (which workers to send to). Every change goes through
//! [`Sessions::add_subscription`], [`Sessions::on_attached`] and
//! [`Sessions::remove_subscription`] / [`Sessions::unsubscribe_all`], so
//! they cannot drift apart; `sessions::tests` checks them against a model
//! without sockets, and `tests/agreement.rs` through the real binary's
//! counters, `delivered` counts and what arrives.

use std::sync::Arc;

use bytes::Bytes;
use myriad_protocol::message::{
    encode_history, encode_published, encode_subject_error, encode_subscribed, ErrorCode,
};
use myriad_protocol::position::Position;
use myriad_protocol::subject::is_feed;

use super::{Sessions, Wire};
use crate::engine::{
    Answer, Attach, Attached, Broken, ConnAnswer, ConnRequest, EngineError, HistoryPage,
};
use crate::hooks::Signal;
use crate::metrics::ErrorKind;
use crate::registry::{Change, ConnId};
use crate::transport;

impl Sessions {
    /// Subscribes `id` to `subject` (not yet held): held by the session at
    /// once, live when the engine's attach answer arrives.
    pub fn add_subscription(
        &mut self,
        id: ConnId,
        subject: &str,
        since: Option<Position>,
        request: Option<u64>,
        out: &mut impl Wire,
    ) {
        let name = self
            .registry
            .interned(subject)
            .or_else(|| self.attaching.interned(subject))
            .unwrap_or_else(|| Arc::from(subject));
        // The worker's first subscriber of the subject, by the very test
        // `detach` makes for its last (live or attaching), so that every
        // `Attached` is matched by one `Detached` however the attach ends.
        let first_local = !self.held_here(&name);
        let token = self.attaching.insert(&name, id);
        self.by_conn[id as usize]
            .subscriptions
            .push(Arc::clone(&name));
        self.metrics.subscriptions.inc();
        let session = &self.by_conn[id as usize];
        let can_wait = request.is_none() && session.is_graph_feed(&name);
        let join = self.join_for(id, &name);
        let attach = Attach {
            subject: name,
            since,
            max_replay_bytes: self.reply_room(id, out),
            to: self.request_of(id, request),
            token,
            can_wait,
            join,
        };
        if first_local {
            let subject = attach.subject.to_string();
            self.shared.hook(|| Signal::Attached(subject));
        }
        self.shared.engine.attach(attach, &mut self.wakeups);
    }

    /// The engine's answer to an attach: replay what was missed, then the
    /// connection is live. A stale answer (unsubscribed or closed since) is
    /// dropped: its detach has been made already.
    pub fn on_attached(&mut self, attached: Attached, out: &mut impl Wire) {
        let id = attached.to.conn;
        if !self.attaching.remove(&attached.subject, id, attached.token) {
            return;
        }
        let attachment = match attached.outcome {
            Ok(attachment) => attachment,
            Err(e) => {
                self.fail_subscription(id, &attached.subject, attached.to.request, &e, out);
                return;
            }
        };
        let change = self.registry.subscribe(&attached.subject, id);
        debug_assert_ne!(change, Change::Unchanged, "live twice");
        // Hold the engine's copy of the name, so that session, registry and
        // stream share one allocation however the subject was first met.
        self.by_conn[id as usize].adopt_name(&attached.subject);
        // The room may have shrunk since the attach was asked for: a replay
        // that no longer fits goes unsent and the client is told to resync,
        // rather than cut as a slow consumer.
        let kind = out.transport(id);
        let forms: Vec<Bytes> = attachment
            .replay
            .iter()
            .map(|p| kind.get().publication(p, &self.shared.config))
            .collect();
        let mut recovered = attachment.recovered;
        let mut replay = &attachment.replay[..];
        let mut position = attachment.position;
        if forms.iter().map(Bytes::len).sum::<usize>() > self.reply_room(id, out) {
            // Without a recovery asked, the replay is what live delivery
            // had already passed: the connection starts after it instead.
            if let (None, Some(last)) = (recovered, replay.last()) {
                position = last.position;
            }
            replay = &[];
            recovered = recovered.map(|_| false);
        }
        // A cursor moves to the attach position unless the replay is about
        // to walk it there: the announcement's cursor must not claim what
        // the client has not received yet.
        if recovered != Some(true) {
            self.by_conn[id as usize].advance(&attached.subject, position);
        }
        // Asked or not, the transport says whether the client must hear of
        // it (every transport tells a failed recovery).
        let feed = is_feed(&attached.subject);
        if attached.to.request.is_some() || kind.get().announces(recovered, feed) {
            let reply =
                encode_subscribed(attached.to.request, &attached.subject, position, recovered);
            self.send_reply(id, reply.as_bytes(), out);
        }
        for (publication, form) in replay.iter().zip(&forms) {
            let session = &mut self.by_conn[id as usize];
            let (bytes, more, owed) = transport::addressed(kind, form, publication, session);
            if owed {
                self.cursors_owed.push(id);
            }
            out.message(id, bytes);
            if let Some(more) = more {
                out.send(id, more);
            }
        }
        self.answered(id);
        // A long-poll may be ready now: this was what it waited for.
        out.settled(id, !replay.is_empty());
    }

    /// A subject's stream broke under its subscribers here: each is told
    /// (`subscribed` with `recovered: false`, as after a failed recovery)
    /// and continues from the new position.
    pub fn on_stream_broken(&mut self, broken: &Broken, out: &mut impl Wire) {
        let feed = is_feed(&broken.subject);
        let reply = encode_subscribed(None, &broken.subject, broken.position, Some(false));
        for id in self.registry.subscribers(&broken.subject).to_vec() {
            let Some(kind) = out.open_transport(id) else {
                continue;
            };
            let session = &mut self.by_conn[id as usize];
            session.advance(&broken.subject, broken.position);
            let settled = session.cursor_settled();
            if kind.get().announces(Some(false), feed) {
                self.send_reply(id, reply.as_bytes(), out);
            }
            // A Redis that restarted empty breaks every subject at once: one
            // cursor after them all, not one per subject (N² bytes).
            if settled {
                self.owe_cursor(id);
            }
        }
    }

    /// What a replay or history reply sent to `id` may take: half the
    /// outbound limit (live traffic comes behind it) less what is queued.
    pub(super) fn reply_room(&self, id: ConnId, out: &impl Wire) -> usize {
        let queued = out.pending_bytes(id);
        (self.shared.config.max_outbound_bytes / 2).saturating_sub(queued)
    }

    /// An attach the engine could not make: the subscription is dropped
    /// (and detached, which every attach needs) and the client told which
    /// subject and why. A cursor keeps the subject's entry (see
    /// `Session::remove`), so it still fits the URL it resumes.
    fn fail_subscription(
        &mut self,
        id: ConnId,
        subject: &str,
        request: Option<u64>,
        error: &EngineError,
        out: &mut impl Wire,
    ) {
        let session = &self.by_conn[id as usize];
        // A feed the server made for the user's graph: nobody else would
        // ask again, so the keeper does, once the engine may be back.
        let graph_feed = request.is_none() && session.is_graph_feed(subject);
        let user = session.identity.as_ref().map(|i| i.user);
        let session = &mut self.by_conn[id as usize];
        if session.remove(subject).is_some() {
            self.metrics.subscriptions.dec();
            if is_feed(subject) {
                session.feed_dropped(subject);
            }
        }
        if let (true, Some(user)) = (graph_feed, user) {
            let me = self.request_of(id, None);
            self.shared.feeds.refused(user, me);
        }
        self.detach(id, subject);
        // Named: a subscribe of several subjects (an HTTP transport's,
        // without an id) fails subject by subject.
        let code = match error {
            EngineError::PresenceFull { .. } => ErrorCode::PresenceFull,
            _ => ErrorCode::Unavailable,
        };
        self.shared.metrics.error(ErrorKind::Command(code));
        let reply = encode_subject_error(request, code, subject, &error.to_string());
        self.send_reply(id, reply.as_bytes(), out);
        self.answered(id);
    }

    /// The engine answered one subject of `id`'s opening request: after
    /// the last one the cursor is owed (once, instead of with every
    /// announcement; see `transport::sse`).
    fn answered(&mut self, id: ConnId) {
        if self.by_conn[id as usize].answered() {
            self.owe_cursor(id);
        }
    }

    /// `id`'s cursor moved with no event carrying it: it is handed out at
    /// the end of the turn, once however many moves the turn made.
    fn owe_cursor(&mut self, id: ConnId) {
        if self.by_conn[id as usize].owe_cursor() {
            self.cursors_owed.push(id);
        }
    }

    /// The engine's answer to a publish or history request.
    pub fn on_answer(&mut self, answer: ConnAnswer, out: &mut impl Wire) {
        let ConnAnswer { to, answer } = answer;
        if to.request.is_some() {
            // Every request with an id is answered once (the engine's contract).
            debug_assert!(self.answers_owed > 0, "an answer nobody was owed");
            self.answers_owed = self.answers_owed.saturating_sub(1);
        }
        if !self.is_open_same_life(&to, out) {
            return;
        }
        match answer {
            Answer::Published(Ok(published)) => {
                if let Some(request) = to.request {
                    let reply =
                        encode_published(request, published.position, published.subscribers);
                    self.send_reply(to.conn, reply.as_bytes(), out);
                }
            }
            Answer::Published(Err(e)) => {
                self.refuse(
                    to.conn,
                    to.request,
                    ErrorCode::PublishFailed,
                    &e.to_string(),
                    out,
                );
            }
            Answer::History(Ok(page)) => self.send_history(to, page, out),
            answer @ (Answer::Presence(_) | Answer::PresenceStats(_)) => {
                self.on_presence_answer(to, answer, out);
            }
            Answer::History(Err(e)) => {
                self.refuse(
                    to.conn,
                    to.request,
                    ErrorCode::Unavailable,
                    &e.to_string(),
                    out,
                );
            }
        }
    }

    /// A history reply, cut to the oldest publications that fit half the
    /// outbound limit less what is already queued, so that it does not make
    /// its reader a slow consumer; the client pages on with `since` set to
    /// the last one it got.
    fn send_history(&mut self, to: ConnRequest, page: HistoryPage, out: &mut impl Wire) {
        let budget = self.reply_room(to.conn, out);
        let body = encode_history(
            to.request,
            &page.subject,
            page.position,
            page.recovered,
            page.page(budget).iter().map(|p| p.envelope()),
        );
        self.send_reply(to.conn, &body, out);
    }

    /// Ends `id`'s subscription of `subject`; returns whether it held one.
    pub(super) fn remove_subscription(&mut self, id: ConnId, subject: &str) -> bool {
        let Some(name) = self.by_conn[id as usize].remove(subject) else {
            return false;
        };
        self.forget(id, &name);
        true
    }

    /// Drops every subscription of `id` (closing, or closed).
    pub fn unsubscribe_all(&mut self, id: ConnId) {
        let held = self.by_conn[id as usize].take_all();
        for name in &held {
            self.forget(id, name);
        }
    }

    /// Ends one subscription, live or still attaching.
    fn forget(&mut self, id: ConnId, name: &str) {
        if !self.attaching.remove_any(name, id) {
            let change = self.registry.unsubscribe(name, id);
            debug_assert_ne!(change, Change::Unchanged, "registry and session disagree");
        }
        self.detach(id, name);
        self.metrics.subscriptions.dec();
    }

    /// Tells the engine one subscription of this worker, `id`'s, ended.
    fn detach(&mut self, id: ConnId, name: &str) {
        self.leave_for(id, name);
        let last_local = !self.held_here(name);
        self.shared.engine.detach(name, self.worker, last_local);
        if last_local {
            self.shared.hook(|| Signal::Detached(name.to_owned()));
        }
    }

    /// Whether a connection of this worker holds `name`, live or attaching:
    /// the one test for a subject's first and last subscriber here, which
    /// the engine's route (`last_local`) and the hooks' `Attached` and
    /// `Detached` both count by.
    pub(super) fn held_here(&self, name: &str) -> bool {
        !self.registry.subscribers(name).is_empty() || self.attaching.contains(name)
    }
}
