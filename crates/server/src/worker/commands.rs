//! Protocol v1 commands on the pub/sub endpoint, the engine's answers to
//! them, and the subscription bookkeeping both drive.
//!
//! A subscription is recorded in four places that must agree: the
//! connection's session (to clean up when it closes), the worker's
//! `attaching` list while the engine's answer is on its way, the worker's
//! registry once it is live (for local fan-out), and, through the engine,
//! the subject's route (which workers to send to). Every change goes through
//! [`Worker::add_subscription`], [`Worker::on_attached`] and
//! [`Worker::remove_subscription`] / [`Worker::unsubscribe_all`], so they
//! cannot drift apart; `tests/agreement.rs` checks them against a model
//! through the node's counters, `delivered` counts and what arrives.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use myriad_protocol::message::{
    encode_error, encode_history, encode_ok, encode_pong, encode_published, encode_subject_error,
    encode_subscribed, parse_command, Command, ErrorCode,
};
use myriad_protocol::position::Position;
use myriad_protocol::subject::is_feed;

use super::abuse::Bucket;
use super::{Flow, Worker};
use crate::auth::Action;
use crate::conn::flags;
use crate::engine::{
    Answer, Attach, Attached, Broken, ConnAnswer, ConnRequest, EngineError, HistoryPage,
    HistoryQuery, Reply,
};
use crate::metrics::ErrorKind;
use crate::registry::{Change, ConnId};
use crate::transport;

impl Worker {
    /// Handles one text message on the pub/sub endpoint.
    pub(super) fn on_command(&mut self, id: ConnId, text: &str) -> Flow {
        match parse_command(text, self.shared.config.max_subject_len) {
            Ok(command) => self.run_command(id, command),
            Err(e) => {
                self.refuse(id, e.id, e.code, &e.detail);
                Flow::Continue
            }
        }
    }

    /// Runs one parsed command of `id`, whichever transport brought it.
    pub(super) fn run_command(&mut self, id: ConnId, command: Command<'_>) -> Flow {
        let request = command.id();
        match command {
            Command::Subscribe {
                subjects, since, ..
            } => {
                let session = &self.conns[id as usize].session;
                let mut new: Vec<&Cow<'_, str>> = Vec::new();
                for s in &subjects {
                    if !session.holds(s) && !new.contains(&s) {
                        new.push(s);
                    }
                }
                let limit = self.shared.config.max_subscriptions;
                let held = session.client_subscriptions();
                let refused = new.iter().find_map(|s| {
                    self.shared
                        .auth
                        .check(Action::Subscribe, s, session.access())
                        .err()
                });
                if let Some(forbidden) = refused {
                    self.refuse(id, request, ErrorCode::Forbidden, &forbidden.to_string());
                    return Flow::Continue;
                }
                if held + new.len() > limit {
                    let detail = format!(
                        "{held} held + {} new would pass the limit of {limit}",
                        new.len()
                    );
                    self.refuse(id, request, ErrorCode::TooManySubscriptions, &detail);
                    return Flow::Continue;
                }
                if !self.abuse.take(id, Bucket::Subscribe, new.len() as u32) {
                    let detail = "subscription changes past client_subscribe_rate";
                    self.refuse(id, request, ErrorCode::RateLimited, detail);
                    return Flow::Continue;
                }
                if new.is_empty() {
                    self.acknowledge(id, request);
                }
                for subject in new {
                    self.add_subscription(id, subject, since, request);
                    if is_feed(subject) {
                        self.conns[id as usize].session.feed_subscribed(subject);
                    }
                }
            }
            Command::Unsubscribe { subjects, .. } => {
                self.abuse
                    .charge(id, Bucket::Subscribe, subjects.len() as u32);
                for subject in &subjects {
                    if self.remove_subscription(id, subject) && is_feed(subject) {
                        self.conns[id as usize].session.feed_dropped(subject);
                    }
                }
                self.acknowledge(id, request);
            }
            Command::Publish { subject, data, .. } => {
                if self.within_publish_rate(id, request)
                    && self.permitted(id, request, Action::Publish, &subject)
                {
                    return self.publish_for(id, request, &subject, data.get());
                }
            }
            Command::History {
                subject,
                since,
                limit,
                ..
            } => {
                if !self.permitted(id, request, Action::History, &subject) {
                    return Flow::Continue;
                }
                let query = HistoryQuery {
                    subject: Arc::from(&*subject),
                    since,
                    limit: limit.map_or(usize::MAX, |l| l as usize),
                };
                let reply = self.owed_reply(id, request);
                self.shared.engine.history(query, reply, &mut self.wakeups);
            }
            Command::Send { data, .. } => {
                if self.within_publish_rate(id, request) {
                    return self.send_as_user(id, request, data);
                }
            }
            Command::Ping { .. } => self.send_reply(id, encode_pong(request).as_bytes()),
            Command::Connect { token, .. } => self.connect(id, request, &token),
            Command::Refresh { token, .. } => self.refresh(id, request, &token),
        }
        Flow::Continue
    }

    /// Spends a publish token of `id`; refuses the command when none is left.
    fn within_publish_rate(&mut self, id: ConnId, request: Option<u64>) -> bool {
        if self.abuse.take(id, Bucket::Publish, 1) {
            return true;
        }
        let detail = "publishes past client_publish_rate";
        self.refuse(id, request, ErrorCode::RateLimited, detail);
        false
    }

    /// Publishes for connection `id`, answered through its mailbox; pauses
    /// reading the connection while the engine is congested.
    pub(super) fn publish_for(
        &mut self,
        id: ConnId,
        request: Option<u64>,
        subject: &str,
        data: &str,
    ) -> Flow {
        let reply = self.owed_reply(id, request);
        self.shared
            .engine
            .publish(subject, data, reply, &mut self.wakeups);
        if self.shared.engine.congested() {
            return Flow::Pause;
        }
        Flow::Continue
    }

    /// Whether `to` is still the connection that asked: open, and not a
    /// later connection in a reused slab slot.
    pub(super) fn is_open_same_life(&self, to: &ConnRequest) -> bool {
        self.lives.get(to.conn as usize) == Some(&to.life)
            && self
                .conns
                .get(to.conn as usize)
                .is_some_and(|c| c.phase.is_open())
    }

    /// Where the engine answers a request of `id`; one with an id is owed
    /// its answer (counted until [`Worker::on_answer`] has it).
    fn owed_reply<T>(&mut self, id: ConnId, request: Option<u64>) -> Reply<T> {
        if request.is_some() {
            self.answers_owed += 1;
        }
        Reply::Conn(self.request_of(id, request))
    }

    pub(super) fn request_of(&self, conn: ConnId, request: Option<u64>) -> ConnRequest {
        ConnRequest {
            worker: self.index,
            conn,
            life: self.lives[conn as usize],
            request,
        }
    }

    pub(super) fn acknowledge(&mut self, id: ConnId, request: Option<u64>) {
        if let Some(request) = request {
            self.send_reply(id, encode_ok(request).as_bytes());
        }
    }

    pub(super) fn refuse(
        &mut self,
        id: ConnId,
        request: Option<u64>,
        code: ErrorCode,
        detail: &str,
    ) {
        self.shared.metrics.error(ErrorKind::Command(code));
        self.reply_error(id, request, code, detail);
    }

    /// Sends an error reply, leaving the counting to the caller.
    pub(super) fn reply_error(
        &mut self,
        id: ConnId,
        request: Option<u64>,
        code: ErrorCode,
        detail: &str,
    ) {
        self.send_reply(id, encode_error(request, code, detail).as_bytes());
    }

    /// Subscribes `id` to `subject` (not yet held): held by the session at
    /// once, live when the engine's attach answer arrives.
    pub(super) fn add_subscription(
        &mut self,
        id: ConnId,
        subject: &str,
        since: Option<Position>,
        request: Option<u64>,
    ) {
        let name = self
            .registry
            .interned(subject)
            .or_else(|| self.attaching.interned(subject))
            .unwrap_or_else(|| Arc::from(subject));
        let token = self.attaching.insert(&name, id);
        self.conns[id as usize]
            .session
            .subscriptions
            .push(Arc::clone(&name));
        self.metrics.subscriptions.inc();
        let session = &self.conns[id as usize].session;
        let can_wait = request.is_none() && session.is_graph_feed(&name);
        let attach = Attach {
            subject: name,
            since,
            max_replay_bytes: self.reply_room(id),
            to: self.request_of(id, request),
            token,
            can_wait,
        };
        self.shared.engine.attach(attach, &mut self.wakeups);
    }

    /// The engine's answer to an attach: replay what was missed, then the
    /// connection is live. A stale answer (unsubscribed or closed since) is
    /// dropped: its detach has been made already.
    pub(super) fn on_attached(&mut self, attached: Attached) {
        let id = attached.to.conn;
        if !self.attaching.remove(&attached.subject, id, attached.token) {
            return;
        }
        let attachment = match attached.outcome {
            Ok(attachment) => attachment,
            Err(e) => {
                self.fail_subscription(id, &attached.subject, attached.to.request, &e);
                return;
            }
        };
        let change = self.registry.subscribe(&attached.subject, id);
        debug_assert_ne!(change, Change::Unchanged, "live twice");
        let conn = &mut self.conns[id as usize];
        // Hold the engine's copy of the name, so that session, registry and
        // stream share one allocation however the subject was first met.
        conn.session.adopt_name(&attached.subject);
        // The room may have shrunk since the attach was asked for: a replay
        // that no longer fits goes unsent and the client is told to resync,
        // rather than cut as a slow consumer.
        let kind = conn.transport;
        let forms: Vec<Bytes> = attachment
            .replay
            .iter()
            .map(|p| kind.get().publication(p, &self.shared.config))
            .collect();
        let mut recovered = attachment.recovered;
        let mut replay = &attachment.replay[..];
        let mut position = attachment.position;
        if forms.iter().map(Bytes::len).sum::<usize>() > self.reply_room(id) {
            // Without a recovery asked, the replay is what live delivery
            // had already passed: the connection starts after it instead.
            if let (None, Some(last)) = (recovered, replay.last()) {
                position = last.position;
            }
            replay = &[];
            recovered = recovered.map(|_| false);
        }
        let conn = &mut self.conns[id as usize];
        // A cursor moves to the attach position unless the replay is about
        // to walk it there: the announcement's cursor must not claim what
        // the client has not received yet.
        if recovered != Some(true) {
            conn.session.advance(&attached.subject, position);
        }
        // Asked or not, the transport says whether the client must hear of
        // it (every transport tells a failed recovery).
        let feed = is_feed(&attached.subject);
        if attached.to.request.is_some() || kind.get().announces(recovered, feed) {
            let reply =
                encode_subscribed(attached.to.request, &attached.subject, position, recovered);
            self.send_reply(id, reply.as_bytes());
        }
        for (publication, form) in replay.iter().zip(&forms) {
            let conn = &mut self.conns[id as usize];
            let (bytes, more, owed) =
                transport::addressed(kind, form, publication, &mut conn.session);
            if owed {
                self.cursors_owed.push(id);
            }
            self.send_message(id, bytes);
            if let Some(more) = more {
                self.send(id, more);
            }
        }
        self.answered(id);
        let conn = &mut self.conns[id as usize];
        if conn.has_flag(flags::HELD) {
            // A long-poll may be ready now: this was what it waited for.
            if !replay.is_empty() {
                conn.set_flag(flags::NEWS);
            }
            self.answering.push(id);
        }
    }

    /// A subject's stream broke under its subscribers here: each is told
    /// (`subscribed` with `recovered: false`, as after a failed recovery)
    /// and continues from the new position.
    pub(super) fn on_stream_broken(&mut self, broken: &Broken) {
        let feed = is_feed(&broken.subject);
        let reply = encode_subscribed(None, &broken.subject, broken.position, Some(false));
        for id in self.registry.subscribers(&broken.subject).to_vec() {
            let conn = &mut self.conns[id as usize];
            if !conn.phase.is_open() {
                continue;
            }
            conn.session.advance(&broken.subject, broken.position);
            let settled = conn.session.cursor_settled();
            if conn.transport.get().announces(Some(false), feed) {
                self.send_reply(id, reply.as_bytes());
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
    fn reply_room(&self, id: ConnId) -> usize {
        let queued = self.conns[id as usize].pending_bytes();
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
    ) {
        let session = &self.conns[id as usize].session;
        // A feed the server made for the user's graph: nobody else would
        // ask again, so the keeper does, once the engine may be back.
        let graph_feed = request.is_none() && session.is_graph_feed(subject);
        let user = session.identity.as_ref().map(|i| i.user);
        let session = &mut self.conns[id as usize].session;
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
        self.detach(subject);
        // Named: a subscribe of several subjects (an HTTP transport's,
        // without an id) fails subject by subject.
        let code = ErrorCode::Unavailable;
        self.shared.metrics.error(ErrorKind::Command(code));
        let reply = encode_subject_error(request, code, subject, &error.to_string());
        self.send_reply(id, reply.as_bytes());
        self.answered(id);
    }

    /// The engine answered one subject of `id`'s opening request: after
    /// the last one the cursor is owed (once, instead of with every
    /// announcement; see `transport::sse`).
    fn answered(&mut self, id: ConnId) {
        if self.conns[id as usize].session.answered() {
            self.owe_cursor(id);
        }
    }

    /// `id`'s cursor moved with no event carrying it: it is handed out at
    /// the end of the turn, once however many moves the turn made.
    fn owe_cursor(&mut self, id: ConnId) {
        if self.conns[id as usize].session.owe_cursor() {
            self.cursors_owed.push(id);
        }
    }

    /// Sends each owed cursor, after everything this turn queued for its
    /// connection.
    pub(super) fn hand_out_cursors(&mut self) {
        // Taken and given back, so that its room serves every turn: a
        // burst on wide SSE streams lists each of them here.
        let mut owed = std::mem::take(&mut self.cursors_owed);
        for &id in &owed {
            let Some(conn) = self.conns.get_mut(id as usize) else {
                continue;
            };
            // A slot reused since owes only what its new session owes.
            if !conn.session.take_owed_cursor() || !conn.phase.is_open() {
                continue;
            }
            if let Some(bytes) = conn.transport.get().cursor(&conn.session) {
                self.send(id, bytes);
            }
        }
        owed.clear();
        self.cursors_owed = owed;
    }

    /// The engine's answer to a publish or history request.
    pub(super) fn on_answer(&mut self, answer: ConnAnswer) {
        let ConnAnswer { to, answer } = answer;
        if to.request.is_some() {
            // Every request with an id is answered once (the engine's contract).
            debug_assert!(self.answers_owed > 0, "an answer nobody was owed");
            self.answers_owed = self.answers_owed.saturating_sub(1);
        }
        if !self.is_open_same_life(&to) {
            return;
        }
        match answer {
            Answer::Published(Ok(published)) => {
                if let Some(request) = to.request {
                    let reply =
                        encode_published(request, published.position, published.subscribers);
                    self.send_reply(to.conn, reply.as_bytes());
                }
            }
            Answer::Published(Err(e)) => {
                self.refuse(
                    to.conn,
                    to.request,
                    ErrorCode::PublishFailed,
                    &e.to_string(),
                );
            }
            Answer::History(Ok(page)) => self.send_history(to, page),
            Answer::History(Err(e)) => {
                self.refuse(to.conn, to.request, ErrorCode::Unavailable, &e.to_string());
            }
        }
    }

    /// A history reply, cut to the oldest publications that fit half the
    /// outbound limit less what is already queued, so that it does not make
    /// its reader a slow consumer; the client pages on with `since` set to
    /// the last one it got.
    fn send_history(&mut self, to: ConnRequest, page: HistoryPage) {
        let budget = self.reply_room(to.conn);
        let body = encode_history(
            to.request,
            &page.subject,
            page.position,
            page.recovered,
            page.page(budget).iter().map(|p| p.envelope()),
        );
        self.send_reply(to.conn, &body);
    }

    /// Ends `id`'s subscription of `subject`; returns whether it held one.
    pub(super) fn remove_subscription(&mut self, id: ConnId, subject: &str) -> bool {
        let Some(name) = self.conns[id as usize].session.remove(subject) else {
            return false;
        };
        self.forget(id, &name);
        true
    }

    /// Drops every subscription of `id` (closing, or closed).
    pub(super) fn unsubscribe_all(&mut self, id: ConnId) {
        let held = self.conns[id as usize].session.take_all();
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
        self.detach(name);
        self.metrics.subscriptions.dec();
    }

    /// Tells the engine one subscription of this worker ended.
    fn detach(&mut self, name: &str) {
        let last_local =
            self.registry.subscribers(name).is_empty() && !self.attaching.contains(name);
        self.shared.engine.detach(name, self.index, last_local);
    }
}
