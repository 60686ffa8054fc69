//! Presence, on the worker's side: which subscriptions join their
//! subject's members, the leave when one ends, the `presence` and
//! `presence_stats` commands with their answers, and the join/leave events
//! handed to a subject's WebSocket subscribers.
//!
//! The members themselves are the engine's (contract clause 8); this only
//! asks. A join rides on the subscription's attach, so the subscribe's one
//! answer says whether the cap let the connection in; the leave goes with
//! every detach of a presence subject (a connection that never joined is no
//! change to the engine).

use std::sync::Arc;

use bytes::Bytes;
use myriad_protocol::message::{
    encode_presence_change, encode_presence_stats, ErrorCode, PresenceMember,
};

use super::{Sessions, Wire};
use crate::auth::Action;
use crate::engine::{Answer, ConnRequest, Join, PresenceChange, PresenceQuery};
use crate::registry::ConnId;
use crate::transport::TransportKind;

impl Sessions {
    /// What `id` brings when it subscribes to `subject`: a join when the
    /// subject's namespace keeps presence.
    pub(super) fn join_for(&self, id: ConnId, subject: &str) -> Option<Join> {
        let policy = self.shared.presence.policy_for(subject);
        if !policy.on {
            return None;
        }
        let identity = self.by_conn[id as usize].identity.as_ref();
        let access = identity.and_then(|i| i.access.as_ref());
        Some(Join {
            user: identity.map(|i| Arc::from(i.user.to_string())),
            info: access.and_then(|a| a.info.clone()),
            max_members: policy.max_members,
            events: policy.join_leave,
        })
    }

    /// One subscription of `id` to `subject` ended: it leaves the
    /// subject's members, if the namespace keeps presence.
    pub(super) fn leave_for(&mut self, id: ConnId, subject: &str) {
        if self.shared.presence.policy_for(subject).on {
            let to = self.request_of(id, None);
            self.shared.engine.leave(subject, to, &mut self.wakeups);
        }
    }

    /// Whether `subject` keeps presence and `id` may ask about it (whoever
    /// may subscribe to it may); refuses the command otherwise.
    fn may_ask(
        &mut self,
        id: ConnId,
        request: Option<u64>,
        subject: &str,
        out: &mut impl Wire,
    ) -> bool {
        if !self.permitted(id, request, Action::Subscribe, subject, out) {
            return false;
        }
        if !self.shared.presence.policy_for(subject).on {
            let detail = "presence is off in this subject's namespace";
            self.refuse(id, request, ErrorCode::Forbidden, detail, out);
            return false;
        }
        true
    }

    /// `presence`: one page of `subject`'s members, at most `limit` and
    /// never more than the namespace's `presence_max_members`.
    pub(super) fn ask_presence(
        &mut self,
        id: ConnId,
        request: Option<u64>,
        subject: &str,
        cursor: Option<&str>,
        limit: Option<u64>,
        out: &mut impl Wire,
    ) {
        if !self.may_ask(id, request, subject, out) {
            return;
        }
        let cap = self.shared.presence.policy_for(subject).max_members;
        let query = PresenceQuery {
            subject: Arc::from(subject),
            after: cursor.map(Arc::from),
            limit: limit.map_or(cap, |l| (l as usize).min(cap)),
        };
        let reply = self.owed_reply(id, request);
        self.shared.engine.presence(query, reply, &mut self.wakeups);
    }

    /// `presence_stats`: `subject`'s member and user counts.
    pub(super) fn ask_presence_stats(
        &mut self,
        id: ConnId,
        request: Option<u64>,
        subject: &str,
        out: &mut impl Wire,
    ) {
        if !self.may_ask(id, request, subject, out) {
            return;
        }
        let reply = self.owed_reply(id, request);
        self.shared
            .engine
            .presence_stats(Arc::from(subject), reply, &mut self.wakeups);
    }

    /// A member joined or left a subject with join/leave events: each live
    /// WebSocket subscriber of it here gets the event, through the fan-out
    /// path like a publication (counted, and within the outbound bound),
    /// framed once per transport kind (with or without permessage-deflate,
    /// which browsers offer by default). Other transports are not sent
    /// events: they read presence with the commands.
    pub fn on_presence_change(&mut self, change: &PresenceChange, out: &mut impl Wire) {
        let mut frames: [Option<Bytes>; TransportKind::COUNT] = Default::default();
        for &id in self.registry.subscribers(&change.subject) {
            let Some(kind) = out.open_transport(id).filter(|kind| kind.is_websocket()) else {
                continue;
            };
            let bytes = frames[kind.index()].get_or_insert_with(|| {
                let member = PresenceMember {
                    conn: &change.member.conn,
                    user: change.member.user.as_deref(),
                    info: change.member.info.as_deref(),
                };
                let json = encode_presence_change(change.joined, &change.subject, member);
                kind.get().reply(&json, &self.by_conn[id as usize])
            });
            out.deliver(id, kind, bytes.clone(), None);
        }
    }

    /// The engine's answer to `presence` or `presence_stats`.
    pub(super) fn on_presence_answer(
        &mut self,
        to: ConnRequest,
        answer: Answer,
        out: &mut impl Wire,
    ) {
        let reply = match answer {
            Answer::Presence(Ok(page)) => {
                let budget = self.reply_room(to.conn, out);
                page.reply(to.request, budget)
            }
            Answer::PresenceStats(Ok(stats)) => {
                encode_presence_stats(to.request, &stats.subject, stats.connections, stats.users)
                    .into_bytes()
            }
            Answer::Presence(Err(e)) | Answer::PresenceStats(Err(e)) => {
                let code = ErrorCode::Unavailable;
                self.refuse(to.conn, to.request, code, &e.to_string(), out);
                return;
            }
            Answer::Published(_) | Answer::History(_) => {
                unreachable!("only presence answers are passed here")
            }
        };
        self.send_reply(to.conn, &reply, out);
    }
}
