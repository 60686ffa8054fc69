//! A connection's token over its life: who its opening request says it is
//! (a WebSocket upgrade's token or `?user=`, an HTTP transport's token and
//! subjects), `connect` on a connection opened without one, `refresh`
//! before it expires, and the checks every command on a subject passes (see `crate::auth` for the rules themselves).
//! Expiry is found by the worker's once-a-second sweep, which closes the
//! connection with 4501.
//!
//! Every token a connection presents is checked here, within two limits
//! (each check costs a signature verification, and a refused `connect`
//! leaves its connection open to try again): `connect` and `refresh`
//! spend the connection's token bucket (`client_token_rate`), and a source
//! address past `token_failures_per_ip` failed checks has its tokens
//! refused unchecked, wherever they came from, so that opening many
//! connections does not buy more checks.

use myriad_graph::UserId;
use myriad_protocol::handshake::RequestHead;
use myriad_protocol::message::ErrorCode;

use super::abuse::Bucket;
use super::{Sessions, Wire};
use crate::auth::{clip, Access, Action, Forbidden, TokenError, TokenLimit, Verified};
use crate::messages::proxy::ProxyKind;
use crate::metrics::ErrorKind;
use crate::registry::ConnId;
use crate::transport::http::{parse_upgrade_query, RequestError, StreamRequest};

impl Sessions {
    /// Whether `id` may do `action` with `subject`; refuses the command
    /// with `forbidden` when it may not.
    pub(super) fn permitted(
        &mut self,
        id: ConnId,
        request: Option<u64>,
        action: Action,
        subject: &str,
        out: &mut impl Wire,
    ) -> bool {
        let access = self.by_conn[id as usize].access();
        match self.shared.auth.check(action, subject, access) {
            Ok(()) => true,
            Err(forbidden) => {
                self.forbid(id, request, &forbidden, out);
                false
            }
        }
    }

    /// `connect`: a connection opened without a token presents one and
    /// from then on acts as its user, feeds included.
    pub(super) fn connect(
        &mut self,
        id: ConnId,
        request: Option<u64>,
        token: &str,
        out: &mut impl Wire,
    ) {
        if let Some(identity) = &self.by_conn[id as usize].identity {
            let detail = format!(
                "the connection already acts as user {}; a new token goes in refresh",
                identity.user
            );
            self.refuse(id, request, ErrorCode::AlreadyConnected, &detail, out);
            return;
        }
        if !self.proxy_connect(id, request, token, out) {
            self.connect_locally(id, request, token, out);
        }
    }

    /// A `connect` whose token the node checks with its own keys.
    pub(super) fn connect_locally(
        &mut self,
        id: ConnId,
        request: Option<u64>,
        token: &str,
        out: &mut impl Wire,
    ) {
        match self.verify_command_token(id, token) {
            Ok(verified) => {
                self.open_as_user(id, verified.user, Some(verified.access), out);
                self.acknowledge(id, request, out);
            }
            Err(e) => self.refuse_token(id, request, &e, out),
        }
    }

    /// `refresh`: swaps in a newer token of the same user. The new grants
    /// must still cover every subscription the connection holds (the feeds
    /// the graph made aside, which it decides): a refresh that would quietly leave
    /// the client subscribed beyond its grants is refused, and the old
    /// token stays, expiry and all.
    pub(super) fn refresh(
        &mut self,
        id: ConnId,
        request: Option<u64>,
        token: &str,
        out: &mut impl Wire,
    ) {
        let Some(held) = self.by_conn[id as usize]
            .identity
            .as_ref()
            .filter(|i| i.access.is_some())
            .map(|i| i.user)
        else {
            return self.refuse_token(id, request, &TokenError::NoneToRefresh, out);
        };
        let verified = match self.verify_command_token(id, token) {
            Ok(v) if v.user != held => Err(TokenError::UserChanged { held, new: v.user }),
            other => other,
        };
        let verified = match verified {
            Ok(v) => v,
            Err(e) => return self.refuse_token(id, request, &e, out),
        };
        let session = &self.by_conn[id as usize];
        let lost = session.subscriptions.iter().find(|s| {
            !session.is_graph_feed(s)
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
            self.refuse(id, request, ErrorCode::Forbidden, &detail, out);
            return;
        }
        if let Some(identity) = self.by_conn[id as usize].identity.as_mut() {
            identity.access = Some(verified.access);
        }
        self.acknowledge(id, request, out);
    }

    /// Checks the token of a `connect` or `refresh`: one of the
    /// connection's `client_token_rate` tokens, then [`Self::verify_token`].
    fn verify_command_token(&mut self, id: ConnId, token: &str) -> Result<Verified, TokenError> {
        if self.shared.auth.checks_tokens() && !self.abuse.take(id, Bucket::Token, 1) {
            return Err(TokenError::RateLimited(TokenLimit::Connection));
        }
        self.verify_token(id, token)
    }

    /// Checks a token connection `id` presents, unless its source address
    /// is past `token_failures_per_ip`; a refusal spends one of the
    /// address's failures. On a node that checks no tokens nothing is
    /// verified (`token_disabled`), so nothing is limited.
    pub fn verify_token(&self, id: ConnId, token: &str) -> Result<Verified, TokenError> {
        let auth = &self.shared.auth;
        let failures = &self.shared.token_failures;
        let address = self.abuse.address(id).filter(|_| failures.on());
        let Some(address) = address.filter(|_| auth.checks_tokens()) else {
            return auth.verify(token);
        };
        if !failures.allows(address) {
            return Err(TokenError::RateLimited(TokenLimit::Address));
        }
        let verified = auth.verify(token);
        if verified.is_err() {
            failures.failed(address);
        }
        verified
    }

    /// Answers a refused token with `invalid_token`, or `rate_limited` when
    /// a limit refused it unchecked, counted under its reason (`token_…`)
    /// rather than the code.
    fn refuse_token(
        &mut self,
        id: ConnId,
        request: Option<u64>,
        error: &TokenError,
        out: &mut impl Wire,
    ) {
        self.shared.metrics.error(ErrorKind::Token(error.label()));
        let code = match error {
            TokenError::RateLimited(_) => ErrorCode::RateLimited,
            _ => ErrorCode::InvalidToken,
        };
        self.reply_error(id, request, code, &error.to_string(), out);
    }

    /// Who a WebSocket upgrade says it is: its token (`Authorization:
    /// Bearer`, or `?token=`), or, on a node that checks no tokens, the
    /// known user of `?user=`.
    pub fn upgrade_credentials(
        &self,
        id: ConnId,
        head: &RequestHead<'_>,
    ) -> Result<Credentials, RequestError> {
        let query = parse_upgrade_query(head.query)?;
        let auth = &self.shared.auth;
        if query.user.is_some() && auth.checks_tokens() {
            return Err(RequestError::UserWithoutToken);
        }
        if let Some(token) = head.bearer.or(query.token.as_deref()) {
            return self
                .verify_token(id, token)
                .map(Credentials::Token)
                .map_err(RequestError::InvalidToken);
        }
        match query.user {
            Some(user) if !self.shared.feeds.known.contains(user) => {
                Err(RequestError::UnknownUser(user))
            }
            Some(user) => Ok(Credentials::User(user)),
            None => Ok(Credentials::Anonymous),
        }
    }

    /// Checks an HTTP transport's token and that it may read every subject
    /// it asks for.
    pub fn admit_stream(
        &self,
        id: ConnId,
        head: &RequestHead<'_>,
        request: StreamRequest,
    ) -> Result<(StreamRequest, Option<Verified>), RequestError> {
        let auth = &self.shared.auth;
        let verified = match head.bearer.or(request.token.as_deref()) {
            Some(token) => Some(
                self.verify_token(id, token)
                    .map_err(RequestError::InvalidToken)?,
            ),
            None => None,
        };
        let access = verified.as_ref().map(|v| &v.access);
        for subject in &request.subjects {
            auth.check(Action::Subscribe, subject, access)
                .map_err(RequestError::Forbidden)?;
            if self.asks_proxy(ProxyKind::Subscribe, subject) {
                return Err(RequestError::Forbidden(Forbidden::Proxied(clip(subject))));
            }
        }
        Ok((request, verified))
    }
}

/// Who a request says it is.
pub enum Credentials {
    Anonymous,
    /// `?user=`, on a node that checks no tokens.
    User(UserId),
    /// A verified token.
    Token(Verified),
}

impl Credentials {
    /// The user the request acts as, and what its token allows.
    pub fn user_and_access(self) -> (Option<UserId>, Option<Access>) {
        match self {
            Credentials::Token(v) => (Some(v.user), Some(v.access)),
            Credentials::User(user) => (Some(user), None),
            Credentials::Anonymous => (None, None),
        }
    }
}
