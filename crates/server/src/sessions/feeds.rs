//! A connection acting as a user: present on the node, subscribed to the
//! feeds its user follows (kept in step with the graph by the keeper's
//! changes), and sending to its own feed.
//!
//! Feed subscriptions are ordinary subscriptions of subjects `@<user>`,
//! made through [`Sessions::add_subscription`] like a client's, so fan-out,
//! limits on the outbound queue and cleanup at close need nothing of
//! their own. They are not counted against `max_subscriptions` (the graph
//! has its own bound, `max_following`).

use std::collections::HashSet;
use std::sync::Arc;

use myriad_graph::UserId;
use myriad_protocol::message::ErrorCode;
use serde_json::value::RawValue;

use super::{Flow, Sessions, Wire};
use crate::auth::{Access, Action};
use crate::feeds::{feed_subject, Apply, FeedChange};
use crate::hooks::Signal;
use crate::registry::ConnId;
use crate::session::Identity;

impl Sessions {
    /// Opens `id` as `user`, with what its token allows if it has one. The
    /// connection is present on the node before the keeper is asked whom
    /// its user follows (see `feeds::keeper`), and gets its own feed at once.
    pub fn open_as_user(
        &mut self,
        id: ConnId,
        user: UserId,
        access: Option<Access>,
        out: &mut impl Wire,
    ) {
        self.by_conn[id as usize].identity = Some(Box::new(Identity {
            user,
            graph_feeds: 1,
            client_feeds: Vec::new(),
            access,
            online: true,
        }));
        self.shared.hook(|| Signal::Connected(user.to_string()));
        let me = self.request_of(id, None);
        self.shared.feeds.presence.add(user, me);
        self.add_subscription(id, &feed_subject(user), None, None, out);
        self.shared.feeds.opened(user, me);
    }

    /// Applies a change from the keeper. A change for a connection that has
    /// closed since is dropped, which settles its part of the batch too.
    pub fn on_feed_change(&mut self, change: FeedChange, out: &mut impl Wire) {
        if !self.is_open_same_life(&change.to, out) {
            return;
        }
        let id = change.to.conn;
        if change.how == Apply::Replace {
            self.drop_feeds_but(id, &change.feeds);
            let own = self.by_conn[id as usize].identity.as_ref().map(|i| i.user);
            if let Some(own) = own {
                self.hold_graph_feed(id, own, out);
            }
        }
        for &user in &change.feeds {
            match change.how {
                Apply::Add | Apply::Replace => self.hold_graph_feed(id, user, out),
                Apply::Drop => self.drop_feed(id, &feed_subject(user)),
            }
        }
        // `change.acks` are dropped here, after the attaches: an engine
        // places a subject's later publications behind an attach (its
        // contract, clause 3), so a send acknowledged after this reaches
        // the feed.
    }

    /// Subscribes `id` to `user`'s feed for its graph, unless it holds it.
    fn hold_graph_feed(&mut self, id: ConnId, user: UserId, out: &mut impl Wire) {
        let subject = feed_subject(user);
        let session = &mut self.by_conn[id as usize];
        if !session.holds(&subject) {
            if let Some(identity) = session.identity.as_mut() {
                identity.graph_feeds += 1;
            }
            self.add_subscription(id, &subject, None, None, out);
        }
    }

    /// Drops the graph feeds of `id` that are not in `keep` (nor its
    /// user's own feed); the feeds its client subscribed to itself stay.
    fn drop_feeds_but(&mut self, id: ConnId, keep: &[UserId]) {
        let session = &self.by_conn[id as usize];
        let Some(own) = session.identity.as_ref().map(|i| feed_subject(i.user)) else {
            return;
        };
        let keep: HashSet<String> = keep.iter().map(|&u| feed_subject(u)).collect();
        let gone: Vec<Arc<str>> = session
            .subscriptions
            .iter()
            .filter(|s| session.is_graph_feed(s) && ***s != *own && !keep.contains(&***s))
            .cloned()
            .collect();
        for subject in gone {
            self.drop_feed(id, &subject);
        }
    }

    fn drop_feed(&mut self, id: ConnId, subject: &str) {
        if self.remove_subscription(id, subject) {
            self.by_conn[id as usize].feed_dropped(subject);
        }
    }

    /// `send`: publishes `data` to the feed of the connection's user.
    pub(super) fn send_as_user(
        &mut self,
        id: ConnId,
        request: Option<u64>,
        data: &RawValue,
        out: &mut impl Wire,
    ) -> Flow {
        let Some(identity) = self.by_conn[id as usize].identity.as_deref() else {
            let detail = "send needs a connection opened as a user (?user=ID)";
            self.refuse(id, request, ErrorCode::NoUser, detail, out);
            return Flow::Continue;
        };
        let subject = feed_subject(identity.user);
        if !self.permitted(id, request, Action::Send, &subject, out) {
            return Flow::Continue;
        }
        self.shared.metrics.feed_send();
        self.publish_for(id, request, &subject, data.get())
    }
}
