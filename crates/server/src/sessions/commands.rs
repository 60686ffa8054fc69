//! Protocol v1 commands on the pub/sub endpoint, whichever transport
//! brought them (a WebSocket message, a posted command): each is checked
//! against the connection's token and rate limits, then run here or handed
//! to the engine, whose answer comes back through `answers`.

use std::borrow::Cow;
use std::sync::Arc;

use myriad_protocol::message::{
    encode_error, encode_ok, encode_pong, parse_command, Command, ErrorCode,
};
use myriad_protocol::subject::is_feed;

use super::abuse::Bucket;
use super::{Flow, Sessions, Wire};
use crate::auth::Action;
use crate::engine::{HistoryQuery, Reply};
use crate::metrics::ErrorKind;
use crate::registry::ConnId;

impl Sessions {
    /// Handles one text message on the pub/sub endpoint: run now, or, while
    /// an earlier command of `id` waits for its proxy verdict, held to run
    /// in its turn (see `proxied`).
    pub fn on_command(&mut self, id: ConnId, text: &str, out: &mut impl Wire) -> Flow {
        match parse_command(text, self.shared.config.max_subject_len) {
            Ok(command @ Command::Ping { .. }) => self.run_command(id, command, out),
            Ok(command) if self.parked.waiting(id) => {
                self.hold(id, command.id(), text, out);
                Flow::Continue
            }
            Ok(command) => self.run_command(id, command, out),
            Err(e) => {
                self.refuse(id, e.id, e.code, &e.detail, out);
                Flow::Continue
            }
        }
    }

    /// Runs one parsed command of `id`, whichever transport brought it.
    pub fn run_command(&mut self, id: ConnId, command: Command<'_>, out: &mut impl Wire) -> Flow {
        let request = command.id();
        match command {
            Command::Subscribe {
                subjects, since, ..
            } => {
                let session = &self.by_conn[id as usize];
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
                    self.forbid(id, request, &forbidden, out);
                    return Flow::Continue;
                }
                if held + new.len() > limit {
                    let detail = format!(
                        "{held} held + {} new would pass the limit of {limit}",
                        new.len()
                    );
                    self.refuse(id, request, ErrorCode::TooManySubscriptions, &detail, out);
                    return Flow::Continue;
                }
                if !self.abuse.take(id, Bucket::Subscribe, new.len() as u32) {
                    let detail = "subscription changes past client_subscribe_rate";
                    self.refuse(id, request, ErrorCode::RateLimited, detail, out);
                    return Flow::Continue;
                }
                if new.is_empty() {
                    self.acknowledge(id, request, out);
                }
                for subject in new {
                    if self.proxy_subscribe(id, subject, since, request, out) {
                        continue;
                    }
                    self.add_subscription(id, subject, since, request, out);
                    if is_feed(subject) {
                        self.by_conn[id as usize].feed_subscribed(subject);
                    }
                }
            }
            Command::Unsubscribe { subjects, .. } => {
                self.abuse
                    .charge(id, Bucket::Subscribe, subjects.len() as u32);
                for subject in &subjects {
                    if self.remove_subscription(id, subject) && is_feed(subject) {
                        self.by_conn[id as usize].feed_dropped(subject);
                    }
                }
                self.acknowledge(id, request, out);
            }
            Command::Publish { subject, data, .. } => {
                if self.within_publish_rate(id, request, out)
                    && self.permitted(id, request, Action::Publish, &subject, out)
                    && !self.proxy_publish(id, request, &subject, data.get(), out)
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
                if !self.permitted(id, request, Action::History, &subject, out) {
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
                if self.within_publish_rate(id, request, out) {
                    return self.send_as_user(id, request, data, out);
                }
            }
            Command::Presence {
                subject,
                cursor,
                limit,
                ..
            } => self.ask_presence(id, request, &subject, cursor.as_deref(), limit, out),
            Command::PresenceStats { subject, .. } => {
                self.ask_presence_stats(id, request, &subject, out);
            }
            Command::Ping { .. } => self.send_reply(id, encode_pong(request).as_bytes(), out),
            Command::Connect { token, .. } => self.connect(id, request, &token, out),
            Command::Refresh { token, .. } => self.refresh(id, request, &token, out),
        }
        Flow::Continue
    }

    /// Spends a publish token of `id`; refuses the command when none is left.
    fn within_publish_rate(
        &mut self,
        id: ConnId,
        request: Option<u64>,
        out: &mut impl Wire,
    ) -> bool {
        if self.abuse.take(id, Bucket::Publish, 1) {
            return true;
        }
        let detail = "publishes past client_publish_rate";
        self.refuse(id, request, ErrorCode::RateLimited, detail, out);
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

    /// Where the engine answers a request of `id`; one with an id is owed
    /// its answer (counted until [`Sessions::on_answer`] has it).
    pub(super) fn owed_reply<T>(&mut self, id: ConnId, request: Option<u64>) -> Reply<T> {
        if request.is_some() {
            self.answers_owed += 1;
        }
        Reply::Conn(self.request_of(id, request))
    }

    pub(super) fn acknowledge(&mut self, id: ConnId, request: Option<u64>, out: &mut impl Wire) {
        if let Some(request) = request {
            self.send_reply(id, encode_ok(request).as_bytes(), out);
        }
    }

    pub fn refuse(
        &mut self,
        id: ConnId,
        request: Option<u64>,
        code: ErrorCode,
        detail: &str,
        out: &mut impl Wire,
    ) {
        self.shared.metrics.error(ErrorKind::Command(code));
        self.reply_error(id, request, code, detail, out);
    }

    /// Refuses a command the connection's grants do not allow.
    pub(super) fn forbid(
        &mut self,
        id: ConnId,
        request: Option<u64>,
        forbidden: &dyn std::fmt::Display,
        out: &mut impl Wire,
    ) {
        let detail = forbidden.to_string();
        self.refuse(id, request, ErrorCode::Forbidden, &detail, out);
    }

    /// Sends an error reply, leaving the counting to the caller.
    pub(super) fn reply_error(
        &mut self,
        id: ConnId,
        request: Option<u64>,
        code: ErrorCode,
        detail: &str,
        out: &mut impl Wire,
    ) {
        self.send_reply(id, encode_error(request, code, detail).as_bytes(), out);
    }
}
