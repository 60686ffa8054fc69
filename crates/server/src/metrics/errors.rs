//! [`ErrorKind`]: every refused input or failure the node counts in
//! `myriad_errors_total`, and the label each is counted under.
//!
//! The vocabulary only: the counters and their families are `metrics.rs`'s.
//! `ErrorKind::labels` lists every label, so `/stats` can show each one,
//! zero or not; it is kept by hand, and the test below fails when a kind
//! is missing from it.

use crate::tls::TlsFailure;

/// Every kind of refused input or failure counted in `myriad_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// A protocol v1 command was refused (labelled with its error code).
    Command(myriad_protocol::message::ErrorCode),
    /// A request (upgrade or not) was refused with this HTTP status before
    /// any endpoint read it: malformed, too large, no such path, timed out.
    Handshake(u16),
    /// A request to an HTTP transport was refused (labelled
    /// `request_<code>`, see `transport::http::RequestError::label`).
    Request(&'static str),
    /// A connection arrived while the node was at `max_connections`.
    OverCapacity,
    /// A connection arrived from an address at `max_connections_per_ip`.
    OverIpLimit,
    /// A connection arrived while the node was at `max_connections` and
    /// its room for 503 refusals was full too: closed without an answer,
    /// so refusals cannot take the descriptors the admin listener keeps.
    OverCapacityDropped,
    /// `accept` failed (EMFILE, ENFILE, ENOMEM…); accepting pauses briefly.
    Accept,
    /// A socket read or write failed other than by the peer closing.
    Io,
    /// An admin API request had no key, or a wrong one (HTTP 401).
    ApiUnauthorized,
    /// An admin endpoint was called with the publish key (HTTP 403).
    ApiForbidden,
    /// An admin API request body was malformed.
    ApiBadRequest,
    /// An admin API request body passed `max_http_body` (HTTP 413).
    ApiBodyTooLarge,
    /// An API publish waited `CONGESTION_WAIT` for the node to catch up
    /// and was answered 503 `congested`.
    ApiCongested,
    /// A `/status/events` stream was refused: `max_status_streams` are open.
    TooManyStatusStreams,
    /// An admin connection arrived while `admin_max_connections` were open:
    /// answered 503 and closed.
    AdminOverCapacity,
    /// An admin request's head did not arrive within `admin_header_timeout`
    /// of its first byte: the connection was closed.
    AdminHeaderTimeout,
    /// An admin request's body did not arrive within `admin_body_timeout`
    /// (HTTP 408).
    AdminBodyTimeout,
    /// A follow-graph request of the admin API was refused or failed
    /// (labelled `graph_<code>`, one of [`ErrorKind::GRAPH_LABELS`]).
    Graph(&'static str),
    /// TLS refused or ended a connection, or a certificate reload failed.
    Tls(TlsFailure),
    /// A connection token was refused, at the request or in a `connect` or
    /// `refresh` command (labelled `token_<reason>`, see
    /// `auth::TokenError::label`).
    Token(&'static str),
    /// A SIGHUP reload of the token key files failed; the keys in force stay.
    TokenKeysReloadFailed,
}

impl ErrorKind {
    /// Every label a follow-graph refusal or failure is counted under.
    pub const GRAPH_LABELS: [&'static str; 6] = [
        "graph_invalid_user",
        "graph_unknown_user",
        "graph_self_follow",
        "graph_following_limit",
        "graph_store_failed",
        "graph_not_settled",
    ];
}

impl ErrorKind {
    /// The label it is counted under.
    pub(super) fn label(self) -> &'static str {
        match self {
            ErrorKind::Command(code) => code.as_str(),
            ErrorKind::Request(label) => label,
            ErrorKind::Handshake(400) => "handshake_400_bad_request",
            ErrorKind::Handshake(404) => "handshake_404_not_found",
            ErrorKind::Handshake(405) => "handshake_405_method_not_allowed",
            ErrorKind::Handshake(408) => "handshake_408_timeout",
            ErrorKind::Handshake(426) => "handshake_426_upgrade_required",
            ErrorKind::Handshake(431) => "handshake_431_too_large",
            ErrorKind::Handshake(_) => "handshake_other",
            ErrorKind::OverCapacity => "over_capacity",
            ErrorKind::OverIpLimit => "over_ip_limit",
            ErrorKind::OverCapacityDropped => "over_capacity_dropped",
            ErrorKind::Accept => "accept",
            ErrorKind::Io => "io",
            ErrorKind::ApiUnauthorized => "api_unauthorized",
            ErrorKind::ApiForbidden => "api_forbidden",
            ErrorKind::ApiBadRequest => "api_bad_request",
            ErrorKind::ApiBodyTooLarge => "api_body_too_large",
            ErrorKind::ApiCongested => "api_congested",
            ErrorKind::TooManyStatusStreams => "too_many_status_streams",
            ErrorKind::Tls(failure) => failure.label(),
            ErrorKind::AdminOverCapacity => "admin_over_capacity",
            ErrorKind::AdminHeaderTimeout => "admin_header_timeout",
            ErrorKind::AdminBodyTimeout => "admin_body_timeout",
            ErrorKind::Graph(label) | ErrorKind::Token(label) => label,
            ErrorKind::TokenKeysReloadFailed => "token_keys_reload_failed",
        }
    }
}

impl ErrorKind {
    /// Every label value, for snapshots and docs.
    pub(super) fn labels() -> Vec<&'static str> {
        let mut labels: Vec<&'static str> = myriad_protocol::message::ErrorCode::ALL
            .iter()
            .map(|c| ErrorKind::Command(*c).label())
            .collect();
        labels.extend(
            [400, 404, 405, 408, 426, 431, 0].map(|status| ErrorKind::Handshake(status).label()),
        );
        labels.extend(
            crate::transport::http::RequestError::LABELS
                .map(|label| ErrorKind::Request(label).label()),
        );
        labels.extend(ErrorKind::GRAPH_LABELS);
        labels.extend(TlsFailure::ALL.map(TlsFailure::label));
        labels.extend(crate::auth::TokenError::LABELS);
        labels.extend(
            [
                ErrorKind::OverCapacity,
                ErrorKind::OverIpLimit,
                ErrorKind::OverCapacityDropped,
                ErrorKind::Accept,
                ErrorKind::Io,
                ErrorKind::ApiUnauthorized,
                ErrorKind::ApiForbidden,
                ErrorKind::ApiBadRequest,
                ErrorKind::ApiBodyTooLarge,
                ErrorKind::ApiCongested,
                ErrorKind::TooManyStatusStreams,
                ErrorKind::AdminOverCapacity,
                ErrorKind::AdminHeaderTimeout,
                ErrorKind::AdminBodyTimeout,
                ErrorKind::TokenKeysReloadFailed,
            ]
            .map(ErrorKind::label),
        );
        labels
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind of error has its labels among `ErrorKind::labels()`
    /// (which `/stats` reads); the list there is kept by hand. A variant
    /// added to `ErrorKind` breaks the exhaustive match below until it is
    /// named here, and then this fails until `labels()` counts it.
    #[test]
    fn labels_name_every_error_kind() {
        macro_rules! units {
            ($($variant:ident),* $(,)?) => {{
                fn _exhaustive(kind: ErrorKind) {
                    match kind {
                        // Each of these is labelled from its own
                        // complete list, checked where that list lives.
                        ErrorKind::Command(_)
                        | ErrorKind::Handshake(_)
                        | ErrorKind::Request(_)
                        | ErrorKind::Graph(_)
                        | ErrorKind::Tls(_)
                        | ErrorKind::Token(_) => {}
                        $(ErrorKind::$variant => {})*
                    }
                }
                [$(ErrorKind::$variant),*]
            }};
        }
        let units = units!(
            OverCapacity,
            OverIpLimit,
            OverCapacityDropped,
            Accept,
            Io,
            ApiUnauthorized,
            ApiForbidden,
            ApiBadRequest,
            ApiBodyTooLarge,
            ApiCongested,
            TooManyStatusStreams,
            AdminOverCapacity,
            AdminHeaderTimeout,
            AdminBodyTimeout,
            TokenKeysReloadFailed,
        );
        let labels = ErrorKind::labels();
        for kind in units {
            assert!(
                labels.contains(&kind.label()),
                "{kind:?} is not in labels()"
            );
        }
        let lists = [
            myriad_protocol::message::ErrorCode::ALL
                .map(|c| ErrorKind::Command(c).label())
                .to_vec(),
            crate::transport::http::RequestError::LABELS.to_vec(),
            ErrorKind::GRAPH_LABELS.to_vec(),
            TlsFailure::ALL.map(TlsFailure::label).to_vec(),
            crate::auth::TokenError::LABELS.to_vec(),
        ];
        for label in lists.concat() {
            assert!(labels.contains(&label), "{label} is not in labels()");
        }
    }
}
