//! What the HTTP transports (Server-Sent Events, streaming, long-poll)
//! share: reading a request's subjects and cursor, refusing bad ones with
//! the error body of the HTTP API, and writing response heads.
//!
//! Pure: a request head in, a [`StreamRequest`] or a [`RequestError`] out.
//! The worker decides what to do with either.

use myriad_graph::{UserId, UserIdError};
use myriad_protocol::close::{CloseReason, HttpEnding};
use myriad_protocol::cursor::{max_cursor_len, parse_cursor, CursorError};
use myriad_protocol::handshake::{http_response, reason_phrase, RequestHead};
use myriad_protocol::message::{encode_close_notice, encode_http_error};
use myriad_protocol::position::Position;
use myriad_protocol::subject::{self, SubjectError};
use thiserror::Error;

use crate::auth::{clip, Forbidden, TokenError};
use crate::config::Config;

/// A valid request for an HTTP transport: the subjects, in the order given,
/// and where to resume each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRequest {
    pub subjects: Vec<String>,
    /// One entry per subject; `None` means "live from now".
    pub since: Vec<Option<Position>>,
    /// The `token` parameter, for clients that cannot set `Authorization`
    /// (a browser's EventSource).
    pub token: Option<String>,
}

/// What a WebSocket upgrade's query says about who the client is. Other
/// parameters are the application's and are left alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpgradeQuery {
    /// `user`: the user to act as, on a node that checks no tokens.
    pub user: Option<UserId>,
    /// `token`: the connection token, for clients that cannot set
    /// `Authorization` (a browser's WebSocket).
    pub token: Option<String>,
}

/// Why a request to an HTTP transport was refused. Each variant has a
/// status and a stable code, which is also its metric label.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RequestError {
    /// The method was not the one the endpoint takes, which is given.
    #[error("method not allowed: use {0}")]
    MethodNotAllowed(&'static str),
    #[error("a request to this endpoint cannot carry a body")]
    BodyNotAllowed,
    #[error("a command must come with a Content-Length (not chunked)")]
    LengthRequired,
    #[error("a command of {len} bytes passes max_message_size ({limit})")]
    BodyTooLarge { len: u64, limit: usize },
    #[error("unknown query parameter {0:?}; known: subject, since, token")]
    UnknownParameter(String),
    #[error("query parameter {0:?} given more than once")]
    RepeatedParameter(&'static str),
    #[error("at least one subject parameter is required")]
    NoSubject,
    #[error("subject {subject:?}: {error}")]
    InvalidSubject {
        subject: String,
        error: SubjectError,
    },
    #[error("subject {0:?} is listed twice")]
    RepeatedSubject(String),
    #[error("{count} subjects pass the limit of {limit}")]
    TooManySubjects { count: usize, limit: usize },
    #[error(
        "{subjects} subjects need room for a cursor of up to {cursor} bytes to resume; \
         this request with it would be {needed} bytes, past max_request_head ({limit}): \
         use fewer subjects per stream, shorter headers, or a larger max_request_head"
    )]
    CursorWouldNotFit {
        subjects: usize,
        cursor: usize,
        needed: usize,
        limit: usize,
    },
    #[error("{source_name}: {error}")]
    InvalidPosition {
        source_name: &'static str,
        error: CursorError,
    },
    #[error("user: {0}")]
    InvalidUser(UserIdError),
    #[error("user {0} is not in the follow graph")]
    UnknownUser(UserId),
    #[error("this node checks tokens: the user is the token's sub, not a user= parameter")]
    UserWithoutToken,
    #[error("{0}")]
    InvalidToken(TokenError),
    #[error("{0}")]
    Forbidden(Forbidden),
    #[error("origin {0:?} is not allowed")]
    OriginNotAllowed(String),
    #[error("subscription changes past client_subscribe_rate")]
    RateLimited,
}

impl RequestError {
    /// Every metric label, `request_` and the code.
    pub const LABELS: [&'static str; 17] = [
        "request_method_not_allowed",
        "request_body_not_allowed",
        "request_length_required",
        "request_message_too_large",
        "request_unknown_parameter",
        "request_repeated_parameter",
        "request_missing_subject",
        "request_invalid_subject",
        "request_too_many_subscriptions",
        "request_cursor_would_not_fit",
        "request_invalid_position",
        "request_invalid_user",
        "request_unknown_user",
        "request_user_without_token",
        "request_forbidden",
        "request_origin_not_allowed",
        "request_rate_limited",
    ];

    /// The label this refusal is counted under in `myriad_errors_total`;
    /// a refused token under its own reason (`token_…`).
    pub fn label(&self) -> &'static str {
        if let RequestError::InvalidToken(e) = self {
            return e.label();
        }
        Self::LABELS
            .iter()
            .find(|label| label.strip_prefix("request_") == Some(self.code()))
            .expect("every code has a label")
    }

    pub fn status(&self) -> u16 {
        match self {
            RequestError::MethodNotAllowed(_) => 405,
            RequestError::LengthRequired => 411,
            RequestError::BodyTooLarge { .. } => 413,
            RequestError::UnknownUser(_) => 404,
            RequestError::InvalidToken(TokenError::RateLimited(_)) => 429,
            RequestError::InvalidToken(_) => 401,
            RequestError::Forbidden(_) | RequestError::OriginNotAllowed(_) => 403,
            RequestError::RateLimited => 429,
            // RFC 6585 §5: the request that resumes it would carry header
            // fields (or a URL) past the limit.
            RequestError::CursorWouldNotFit { .. } => 431,
            _ => 400,
        }
    }

    /// The stable code in the error body, and the metric label.
    pub fn code(&self) -> &'static str {
        match self {
            RequestError::MethodNotAllowed(_) => "method_not_allowed",
            RequestError::BodyNotAllowed => "body_not_allowed",
            RequestError::LengthRequired => "length_required",
            RequestError::BodyTooLarge { .. } => "message_too_large",
            RequestError::UnknownParameter(_) => "unknown_parameter",
            RequestError::RepeatedParameter(_) => "repeated_parameter",
            RequestError::NoSubject => "missing_subject",
            RequestError::InvalidSubject { .. } | RequestError::RepeatedSubject(_) => {
                "invalid_subject"
            }
            RequestError::TooManySubjects { .. } => "too_many_subscriptions",
            RequestError::CursorWouldNotFit { .. } => "cursor_would_not_fit",
            RequestError::InvalidPosition { .. } => "invalid_position",
            RequestError::InvalidUser(_) => "invalid_user",
            RequestError::UnknownUser(_) => "unknown_user",
            RequestError::UserWithoutToken => "user_without_token",
            RequestError::InvalidToken(TokenError::RateLimited(_)) => "rate_limited",
            RequestError::InvalidToken(_) => "invalid_token",
            RequestError::Forbidden(_) => "forbidden",
            RequestError::OriginNotAllowed(_) => "origin_not_allowed",
            RequestError::RateLimited => "rate_limited",
        }
    }

    /// The complete refusal, with `Connection: close`.
    pub fn response(&self, config: &Config) -> Vec<u8> {
        let mut headers = cors_headers(config);
        match self {
            RequestError::MethodNotAllowed("GET") => headers.push(("Allow", "GET, OPTIONS")),
            RequestError::MethodNotAllowed(_) => headers.push(("Allow", "POST, OPTIONS")),
            RequestError::InvalidToken(TokenError::RateLimited(_)) => {
                headers.push(("Retry-After", "1"))
            }
            // RFC 6750 §3: the scheme, and that the token was the problem.
            RequestError::InvalidToken(_) => {
                headers.push(("WWW-Authenticate", "Bearer error=\"invalid_token\""))
            }
            RequestError::RateLimited => headers.push(("Retry-After", "1")),
            _ => {}
        }
        error_response(self.status(), self.code(), &self.to_string(), &headers)
    }
}

/// A JSON error response (`{"error":{"code","message"}}`, as the admin API
/// answers) with `Connection: close`.
pub fn error_response(status: u16, code: &str, message: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut all = headers.to_vec();
    all.push(("Content-Type", "application/json"));
    let body = encode_http_error(code, message);
    http_response(status, reason_phrase(status), &all, &body)
}

/// Reads `user` and `token` from a WebSocket upgrade's query.
pub fn parse_upgrade_query(query: Option<&str>) -> Result<UpgradeQuery, RequestError> {
    let mut out = UpgradeQuery::default();
    for (name, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match &*name {
            "user" if out.user.is_some() => return Err(RequestError::RepeatedParameter("user")),
            "user" => out.user = Some(value.parse().map_err(RequestError::InvalidUser)?),
            "token" if out.token.is_some() => return Err(RequestError::RepeatedParameter("token")),
            "token" => out.token = Some(value.into_owned()),
            _ => {}
        }
    }
    Ok(out)
}

/// Whether a browser page from the request's `Origin` may open a
/// connection, against cross-site WebSocket hijacking (a page on another
/// site opening a connection with the user's cookies). A request without
/// `Origin` does not come from a browser page and passes. `allowed_origins`
/// lists the origins that pass (`*`: all); when it is empty, a node whose
/// client listener is on loopback lets every origin in (development), and
/// any other admits only its own origin: one whose host is the request's
/// `Host`.
pub fn check_origin(head: &RequestHead<'_>, config: &Config) -> Result<(), RequestError> {
    let Some(origin) = head.origin else {
        return Ok(());
    };
    let allowed = if config.allowed_origins.is_empty() {
        config.listen.ip().is_loopback()
            || origin
                .split_once("://")
                .is_some_and(|(_, host)| head.host.is_some_and(|h| h.eq_ignore_ascii_case(host)))
    } else {
        config
            .allowed_origins
            .iter()
            .any(|o| o == "*" || o.eq_ignore_ascii_case(origin))
    };
    if allowed {
        Ok(())
    } else {
        Err(RequestError::OriginNotAllowed(clip(origin)))
    }
}

/// Reads the subjects and resume positions of a `GET` to an HTTP
/// transport. `Last-Event-ID`, which a browser's EventSource sends when it
/// reconnects, wins over a `since` parameter: it is newer.
pub fn parse_stream_request(
    head: &RequestHead<'_>,
    config: &Config,
) -> Result<StreamRequest, RequestError> {
    if head.method != "GET" {
        return Err(RequestError::MethodNotAllowed("GET"));
    }
    if head.has_body {
        return Err(RequestError::BodyNotAllowed);
    }
    let mut subjects: Vec<String> = Vec::new();
    let mut since: Option<String> = None;
    let mut token: Option<String> = None;
    for (name, value) in form_urlencoded::parse(head.query.unwrap_or("").as_bytes()) {
        match &*name {
            "subject" => {
                subject::validate(&value, config.max_subject_len).map_err(|error| {
                    RequestError::InvalidSubject {
                        subject: clip(&value),
                        error,
                    }
                })?;
                if subjects.iter().any(|s| *s == value) {
                    return Err(RequestError::RepeatedSubject(value.into_owned()));
                }
                subjects.push(value.into_owned());
                if subjects.len() > config.max_subscriptions {
                    return Err(RequestError::TooManySubjects {
                        count: subjects.len(),
                        limit: config.max_subscriptions,
                    });
                }
            }
            "since" if since.is_some() => return Err(RequestError::RepeatedParameter("since")),
            "since" => since = Some(value.into_owned()),
            "token" if token.is_some() => return Err(RequestError::RepeatedParameter("token")),
            "token" => token = Some(value.into_owned()),
            other => return Err(RequestError::UnknownParameter(clip(other))),
        }
    }
    if subjects.is_empty() {
        return Err(RequestError::NoSubject);
    }
    check_resume_room(head, subjects.len(), config)?;
    let resume = match (head.last_event_id, since.as_deref()) {
        (Some(id), _) => Some(("Last-Event-ID", id)),
        (None, Some(since)) => Some(("since", since)),
        (None, None) => None,
    };
    let since = match resume {
        Some((source_name, text)) => parse_cursor(text, subjects.len())
            .map_err(|error| RequestError::InvalidPosition { source_name, error })?,
        None => vec![None; subjects.len()],
    };
    Ok(StreamRequest {
        subjects,
        since,
        token,
    })
}

/// What a cursor adds to a request, framing included, at most: as a
/// browser sends it, `Last-Event-ID: ` and CRLF (as `&since=`, 7 bytes).
const RESUME_FRAMING: usize = "Last-Event-ID: \r\n".len();

/// Refuses a stream that could not be resumed. The request that resumes it
/// is this one carrying the stream's cursor, which holds an entry per
/// subject and grows with the offsets; unless the longest cursor of these
/// subjects fits under `max_request_head` beside the rest of the head, the
/// node would hand out a cursor that its own limit refuses (431), and a
/// browser would lose its place for good. So the room is asked for at
/// open, whatever cursor this request itself carries.
fn check_resume_room(
    head: &RequestHead<'_>,
    subjects: usize,
    config: &Config,
) -> Result<(), RequestError> {
    // Take out the cursor this request carries, with the least framing it
    // can have, so the rest is never underestimated.
    let since: usize = head
        .query
        .unwrap_or("")
        .split('&')
        .filter(|p| p.starts_with("since="))
        .map(|p| p.len() + 1)
        .sum();
    let last_event_id = head
        .last_event_id
        .map_or(0, |id| "Last-Event-ID:\r\n".len() + id.len());
    let cursor = max_cursor_len(subjects);
    let needed = head.header_len.saturating_sub(since + last_event_id) + RESUME_FRAMING + cursor;
    if needed > config.max_request_head {
        return Err(RequestError::CursorWouldNotFit {
            subjects,
            cursor,
            needed,
            limit: config.max_request_head,
        });
    }
    Ok(())
}

/// The CORS headers every HTTP transport response carries, from
/// `cors_origin` (none when it is empty).
pub fn cors_headers(config: &Config) -> Vec<(&'static str, &str)> {
    if config.cors_origin.is_empty() {
        return Vec::new();
    }
    let mut headers = vec![("Access-Control-Allow-Origin", config.cors_origin.as_str())];
    if config.cors_origin != "*" {
        headers.push(("Vary", "Origin"));
    }
    headers
}

/// The answer to a CORS preflight (`OPTIONS`): which method and headers a
/// page on another origin may use. EventSource sends `Last-Event-ID`; a
/// command (`post`) is JSON with a token.
pub fn preflight_response(config: &Config, post: bool) -> Vec<u8> {
    let mut headers = cors_headers(config);
    headers.extend(if post {
        [
            ("Access-Control-Allow-Methods", "POST, OPTIONS"),
            (
                "Access-Control-Allow-Headers",
                "Content-Type, Authorization",
            ),
        ]
    } else {
        [
            ("Access-Control-Allow-Methods", "GET, OPTIONS"),
            (
                "Access-Control-Allow-Headers",
                "Last-Event-ID, Cache-Control, Authorization",
            ),
        ]
    });
    headers.extend([("Access-Control-Max-Age", "86400")]);
    http_response(204, reason_phrase(204), &headers, "")
}

/// The head of a streaming `200 OK` of `content_type`: the body runs until
/// the server ends it, so it is never cached or buffered by proxies.
/// `extra` adds transport-specific headers (`Transfer-Encoding: chunked`).
pub fn stream_head(config: &Config, content_type: &str, extra: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(256);
    out.push_str("HTTP/1.1 200 OK\r\nContent-Type: ");
    out.push_str(content_type);
    out.push_str("\r\nCache-Control: no-cache, no-store\r\nX-Accel-Buffering: no\r\n");
    for (name, value) in cors_headers(config).iter().chain(extra) {
        out.push_str(name);
        out.push_str(": ");
        out.push_str(value);
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    out
}

/// The close message (`{"op":"close",…}`) a stream the server ends for
/// `reason` carries last; `None` when nothing can be sent (the peer is gone).
pub fn close_notice(reason: CloseReason) -> Option<String> {
    match reason.http() {
        HttpEnding::EndStream | HttpEnding::Status(_) => Some(encode_close_notice(reason)),
        HttpEnding::Drop => None,
    }
}

/// Appends `json` with any CR or LF turned into a space. Line-framed
/// transports (SSE fields, NDJSON lines) need one line per message; in
/// valid JSON a line break can only be whitespace between tokens (inside a
/// string it must be escaped), so the value is unchanged.
pub fn push_one_line(out: &mut Vec<u8>, json: &[u8]) {
    let start = out.len();
    out.extend_from_slice(json);
    for b in &mut out[start..] {
        if *b == b'\n' || *b == b'\r' {
            *b = b' ';
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::TokenLimit;
    use myriad_protocol::handshake::parse_request;
    use myriad_protocol::position::Epoch;

    fn request(target: &str, extra: &str) -> Result<StreamRequest, RequestError> {
        let text = format!("GET {target} HTTP/1.1\r\nHost: x\r\n{extra}\r\n");
        let head = parse_request(text.as_bytes(), 8192).unwrap().unwrap();
        parse_stream_request(&head, &Config::default())
    }

    #[test]
    fn the_upgrade_query_names_a_user_and_a_token_once_each() {
        let user = |q| parse_upgrade_query(q).map(|q| q.user);
        assert_eq!(user(None), Ok(None));
        assert_eq!(user(Some("x=1&y")), Ok(None));
        assert_eq!(
            parse_upgrade_query(Some("token=a.b.c&user=17")),
            Ok(UpgradeQuery {
                user: Some(UserId::new(17).unwrap()),
                token: Some("a.b.c".into())
            })
        );
        let bad = parse_upgrade_query(Some("user=-3")).unwrap_err();
        assert_eq!((bad.status(), bad.label()), (400, "request_invalid_user"));
        let huge = parse_upgrade_query(Some("user=9007199254740992")).unwrap_err();
        assert_eq!(huge.code(), "invalid_user");
        assert_eq!(
            user(Some("user=1&user=2")),
            Err(RequestError::RepeatedParameter("user"))
        );
        assert_eq!(
            parse_upgrade_query(Some("token=1&token=2")),
            Err(RequestError::RepeatedParameter("token"))
        );
        let unknown = RequestError::UnknownUser(UserId::new(5).unwrap());
        assert_eq!(
            (unknown.status(), unknown.label()),
            (404, "request_unknown_user")
        );
        let token = RequestError::InvalidToken(TokenError::Expired);
        assert_eq!((token.status(), token.label()), (401, "token_expired"));
        let response = String::from_utf8(token.response(&Config::default())).unwrap();
        assert!(response.contains("WWW-Authenticate: Bearer error=\"invalid_token\""));
        let limited = RequestError::InvalidToken(TokenError::RateLimited(TokenLimit::Address));
        assert_eq!(
            (limited.status(), limited.code(), limited.label()),
            (429, "rate_limited", "token_address_limited")
        );
        let response = String::from_utf8(limited.response(&Config::default())).unwrap();
        assert!(response.contains("Retry-After: 1"), "{response}");
    }

    #[test]
    fn origins_pass_by_list_by_host_or_on_loopback() {
        let check = |origin: &str, listen: &str, allowed: &[&str]| {
            let text = format!("GET /ws HTTP/1.1\r\nHost: chat.example:8080\r\n{origin}\r\n");
            let head = parse_request(text.as_bytes(), 8192).unwrap().unwrap();
            let config = Config {
                listen: listen.parse().unwrap(),
                allowed_origins: allowed.iter().map(|s| s.to_string()).collect(),
                ..Config::default()
            };
            check_origin(&head, &config).is_ok()
        };
        let evil = "Origin: https://evil.example\r\n";
        let own = "Origin: https://chat.example:8080\r\n";
        assert!(
            check("", "0.0.0.0:8080", &[]),
            "no Origin: not a browser page"
        );
        assert!(check(evil, "127.0.0.1:8080", &[]), "loopback lets all in");
        assert!(!check(evil, "0.0.0.0:8080", &[]));
        assert!(check(own, "0.0.0.0:8080", &[]), "the node's own origin");
        assert!(!check(evil, "127.0.0.1:8080", &["https://app.example"]));
        assert!(check(evil, "0.0.0.0:8080", &["https://EVIL.example"]));
        assert!(check(evil, "0.0.0.0:8080", &["*"]));
        assert!(
            !check(own, "0.0.0.0:8080", &["https://app.example"]),
            "a list is the whole list"
        );
    }

    #[test]
    fn subjects_and_cursors() {
        let r = request("/sse?subject=a&subject=b%2Fc", "").unwrap();
        assert_eq!(r.subjects, ["a", "b/c"]);
        assert_eq!(r.since, [None, None]);
        let p = Position::new(Epoch(0xab), 3);
        let r = request("/sse?subject=a&subject=b&since=00000000000000ab:3,", "").unwrap();
        assert_eq!(r.since, [Some(p), None]);
        let r = request(
            "/sse?subject=a&since=00000000000000ab:1",
            "Last-Event-ID: 00000000000000ab:3\r\n",
        )
        .unwrap();
        assert_eq!(r.since, [Some(p)], "Last-Event-ID wins over since");
    }

    #[test]
    fn bad_requests_have_codes() {
        let cases = [
            ("/sse", "", "missing_subject"),
            ("/sse?subject=a&x=1", "", "unknown_parameter"),
            ("/sse?subject=a&user=1", "", "unknown_parameter"),
            ("/sse?subject=a&token=1&token=2", "", "repeated_parameter"),
            ("/sse?subject=a&since=&since=", "", "repeated_parameter"),
            ("/sse?subject=a%20b", "", "invalid_subject"),
            ("/sse?subject=a&subject=a", "", "invalid_subject"),
            ("/sse?subject=a&since=nope", "", "invalid_position"),
            ("/sse?subject=a&since=,", "", "invalid_position"),
            (
                "/sse?subject=a",
                "Last-Event-ID: 1:2\r\n",
                "invalid_position",
            ),
            (
                "/sse?subject=a",
                "Content-Length: 3\r\n",
                "body_not_allowed",
            ),
        ];
        for (target, extra, code) in cases {
            let e = request(target, extra).unwrap_err();
            assert_eq!(e.code(), code, "{target} {extra}");
            assert_eq!(e.label(), format!("request_{code}"));
            let response = String::from_utf8(e.response(&Config::default())).unwrap();
            assert!(response.starts_with("HTTP/1.1 400 "), "{response}");
            assert!(response.contains(&format!("{{\"error\":{{\"code\":\"{code}\"")));
        }
        let config = Config {
            max_subscriptions: 2,
            ..Config::default()
        };
        let text = "GET /sse?subject=a&subject=b&subject=c HTTP/1.1\r\nHost: x\r\n\r\n";
        let head = parse_request(text.as_bytes(), 8192).unwrap().unwrap();
        let e = parse_stream_request(&head, &config).unwrap_err();
        assert_eq!(e.code(), "too_many_subscriptions");
    }

    #[test]
    fn every_stream_admitted_can_be_resumed_with_its_longest_cursor() {
        let config = Config {
            max_request_head: 1024,
            ..Config::default()
        };
        let target = |n: usize| {
            let query: Vec<String> = (0..n).map(|i| format!("subject=s{i}")).collect();
            format!("/sse?{}", query.join("&"))
        };
        let text =
            |n: usize, extra: &str| format!("GET {} HTTP/1.1\r\nHost: x\r\n{extra}\r\n", target(n));
        let parse = |text: &str| {
            let head = parse_request(text.as_bytes(), 65_536).unwrap().unwrap();
            (head.header_len, parse_stream_request(&head, &config))
        };
        // The widest stream this node admits...
        let widest = (1..100)
            .take_while(|&n| parse(&text(n, "")).1.is_ok())
            .last()
            .unwrap();
        assert!(widest >= 10, "{widest}");
        let e = parse(&text(widest + 1, "")).1.unwrap_err();
        assert_eq!(
            (e.status(), e.label()),
            (431, "request_cursor_would_not_fit")
        );
        let response = String::from_utf8(e.response(&config)).unwrap();
        assert!(response.starts_with("HTTP/1.1 431 "), "{response}");
        assert!(response.contains("max_request_head (1024)"), "{response}");
        // ...is resumed with the longest cursor its subjects can have, by
        // Last-Event-ID or by since, within max_request_head.
        let last = Some(Position::new(Epoch(u64::MAX), u64::MAX));
        let mut cursor = Vec::new();
        myriad_protocol::cursor::write_cursor(&vec![last; widest], &mut cursor);
        let cursor = String::from_utf8(cursor).unwrap();
        let (len, resumed) = parse(&text(widest, &format!("Last-Event-ID: {cursor}\r\n")));
        assert!(len <= 1024, "{len}");
        assert_eq!(resumed.unwrap().since, vec![last; widest]);
        let since = format!(
            "GET {}&since={cursor} HTTP/1.1\r\nHost: x\r\n\r\n",
            target(widest)
        );
        let (len, resumed) = parse(&since);
        assert!(len <= 1024, "{len}");
        assert_eq!(resumed.unwrap().since, vec![last; widest]);
    }

    #[test]
    fn line_breaks_become_spaces() {
        let mut out = b"data: ".to_vec();
        push_one_line(&mut out, b"{\"a\":\r\n 1}");
        assert_eq!(out, b"data: {\"a\":   1}");
    }

    #[test]
    fn only_get_is_allowed() {
        let text = "POST /sse?subject=a HTTP/1.1\r\nHost: x\r\n\r\n";
        let head = parse_request(text.as_bytes(), 8192).unwrap().unwrap();
        let e = parse_stream_request(&head, &Config::default()).unwrap_err();
        let response = String::from_utf8(e.response(&Config::default())).unwrap();
        assert!(response.starts_with("HTTP/1.1 405 "));
        assert!(response.contains("Allow: GET, OPTIONS\r\n"));
    }
}
