//! A connection's token over its life: `connect` on a connection opened
//! without one, `refresh` before it expires, and the checks every command
//! on a subject passes (see `crate::auth` for the rules themselves).
//! Expiry is found by the once-a-second sweep (`Worker::sweep`), which
//! closes the connection with 4501.

use myriad_protocol::message::ErrorCode;
use myriad_protocol::subject::is_feed;

use super::Worker;
use crate::auth::{Action, TokenError};
use crate::metrics::ErrorKind;
use crate::registry::ConnId;

impl Worker {
    /// Whether `id` may do `action` with `subject`; refuses the command
    /// with `forbidden` when it may not.
    pub(super) fn permitted(
        &mut self,
        id: ConnId,
        request: Option<u64>,
        action: Action,
        subject: &str,
    ) -> bool {
        let access = self.conns[id as usize].session.access();
        match self.shared.auth.check(action, subject, access) {
            Ok(()) => true,
            Err(forbidden) => {
                self.refuse(id, request, ErrorCode::Forbidden, &forbidden.to_string());
                false
            }
        }
    }

    /// `connect`: a connection opened without a token presents one and
    /// from then on acts as its user, feeds included.
    pub(super) fn connect(&mut self, id: ConnId, request: Option<u64>, token: &str) {
        if let Some(identity) = &self.conns[id as usize].session.identity {
            let detail = format!(
                "the connection already acts as user {}; a new token goes in refresh",
                identity.user
            );
            self.refuse(id, request, ErrorCode::AlreadyConnected, &detail);
            return;
        }
        match self.shared.auth.verify(token) {
            Ok(verified) => {
                self.open_as_user(id, verified.user, Some(verified.access));
                self.acknowledge(id, request);
            }
            Err(e) => self.refuse_token(id, request, &e),
        }
    }

    /// `refresh`: swaps in a newer token of the same user. The new grants
    /// must still cover every subscription the connection holds (feeds
    /// aside, which the graph decides): a refresh that would quietly leave
    /// the client subscribed beyond its grants is refused, and the old
    /// token stays, expiry and all.
    pub(super) fn refresh(&mut self, id: ConnId, request: Option<u64>, token: &str) {
        let session = &self.conns[id as usize].session;
        let Some(held) = session
            .identity
            .as_ref()
            .filter(|i| i.access.is_some())
            .map(|i| i.user)
        else {
            let detail = "refresh replaces a token; this connection has none (use connect)";
            self.refuse(id, request, ErrorCode::InvalidToken, detail);
            return;
        };
        let verified = match self.shared.auth.verify(token) {
            Ok(v) if v.user != held => Err(TokenError::UserChanged { held, new: v.user }),
            other => other,
        };
        let verified = match verified {
            Ok(v) => v,
            Err(e) => return self.refuse_token(id, request, &e),
        };
        let lost = session.subscriptions.iter().find(|s| {
            !is_feed(s)
                && self
                    .shared
                    .auth
                    .check(Action::Subscribe, s, Some(&verified.access))
                    .is_err()
        });
        if let Some(lost) = lost {
            let detail = format!(
                "the new token does not grant {lost:?}, which this connection holds: \
                 unsubscribe first"
            );
            self.refuse(id, request, ErrorCode::Forbidden, &detail);
            return;
        }
        if let Some(identity) = self.conns[id as usize].session.identity.as_mut() {
            identity.access = Some(verified.access);
        }
        self.acknowledge(id, request);
    }

    /// Answers a refused token with `invalid_token`, counted under its
    /// reason (`token_…`) rather than the code.
    fn refuse_token(&mut self, id: ConnId, request: Option<u64>, error: &TokenError) {
        self.shared.metrics.error(ErrorKind::Token(error.label()));
        self.reply_error(id, request, ErrorCode::InvalidToken, &error.to_string());
    }
}
