//! What the HTTP transports (Server-Sent Events, streaming, long-poll)
//! share: reading a request's subjects and cursor, refusing bad ones with
//! the error body of the HTTP API, and writing response heads.
//!
//! Pure: a request head in, a [`StreamRequest`] or a [`RequestError`] out.
//! The worker decides what to do with either.

use myriad_graph::{UserId, UserIdError};
use myriad_protocol::close::{CloseReason, HttpEnding};
use myriad_protocol::cursor::{parse_cursor, CursorError};
use myriad_protocol::handshake::{http_response, reason_phrase, RequestHead};
use myriad_protocol::message::{encode_close_notice, encode_http_error};
use myriad_protocol::position::Position;
use myriad_protocol::subject::{self, SubjectError};
use thiserror::Error;

use crate::config::Config;

/// A valid request for an HTTP transport: the subjects, in the order given,
/// and where to resume each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRequest {
    pub subjects: Vec<String>,
    /// One entry per subject; `None` means "live from now".
    pub since: Vec<Option<Position>>,
}

/// Why a request to an HTTP transport was refused. Each variant has a
/// status and a stable code, which is also its metric label.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RequestError {
    #[error("method not allowed: use GET")]
    MethodNotAllowed,
    #[error("a request to this endpoint cannot carry a body")]
    BodyNotAllowed,
    #[error("unknown query parameter {0:?}; known: subject, since")]
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
    #[error("{source_name}: {error}")]
    InvalidPosition {
        source_name: &'static str,
        error: CursorError,
    },
    #[error("user: {0}")]
    InvalidUser(UserIdError),
    #[error("user {0} is not in the follow graph")]
    UnknownUser(UserId),
}

impl RequestError {
    /// Every metric label, `request_` and the code.
    pub const LABELS: [&'static str; 10] = [
        "request_method_not_allowed",
        "request_body_not_allowed",
        "request_unknown_parameter",
        "request_repeated_parameter",
        "request_missing_subject",
        "request_invalid_subject",
        "request_too_many_subscriptions",
        "request_invalid_position",
        "request_invalid_user",
        "request_unknown_user",
    ];

    /// The label this refusal is counted under in `myriad_errors_total`.
    pub fn label(&self) -> &'static str {
        Self::LABELS
            .iter()
            .find(|label| label.strip_prefix("request_") == Some(self.code()))
            .expect("every code has a label")
    }

    pub fn status(&self) -> u16 {
        match self {
            RequestError::MethodNotAllowed => 405,
            RequestError::UnknownUser(_) => 404,
            _ => 400,
        }
    }

    /// The stable code in the error body, and the metric label.
    pub fn code(&self) -> &'static str {
        match self {
            RequestError::MethodNotAllowed => "method_not_allowed",
            RequestError::BodyNotAllowed => "body_not_allowed",
            RequestError::UnknownParameter(_) => "unknown_parameter",
            RequestError::RepeatedParameter(_) => "repeated_parameter",
            RequestError::NoSubject => "missing_subject",
            RequestError::InvalidSubject { .. } | RequestError::RepeatedSubject(_) => {
                "invalid_subject"
            }
            RequestError::TooManySubjects { .. } => "too_many_subscriptions",
            RequestError::InvalidPosition { .. } => "invalid_position",
            RequestError::InvalidUser(_) => "invalid_user",
            RequestError::UnknownUser(_) => "unknown_user",
        }
    }

    /// The complete refusal, with `Connection: close`.
    pub fn response(&self, config: &Config) -> Vec<u8> {
        let mut headers = cors_headers(config);
        if *self == RequestError::MethodNotAllowed {
            headers.push(("Allow", "GET, OPTIONS"));
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

/// The user a WebSocket upgrade asks to act as (`?user=ID`), if any. Other
/// query parameters are the application's and are left alone.
pub fn parse_user(query: Option<&str>) -> Result<Option<UserId>, RequestError> {
    let mut user = None;
    for (name, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if name == "user" {
            if user.is_some() {
                return Err(RequestError::RepeatedParameter("user"));
            }
            user = Some(value.parse().map_err(RequestError::InvalidUser)?);
        }
    }
    Ok(user)
}

/// Reads the subjects and resume positions of a `GET` to an HTTP
/// transport. `Last-Event-ID`, which a browser's EventSource sends when it
/// reconnects, wins over a `since` parameter: it is newer.
pub fn parse_stream_request(
    head: &RequestHead<'_>,
    config: &Config,
) -> Result<StreamRequest, RequestError> {
    if head.method != "GET" {
        return Err(RequestError::MethodNotAllowed);
    }
    if head.has_body {
        return Err(RequestError::BodyNotAllowed);
    }
    let mut subjects: Vec<String> = Vec::new();
    let mut since: Option<String> = None;
    for (name, value) in form_urlencoded::parse(head.query.unwrap_or("").as_bytes()) {
        match &*name {
            "subject" => {
                subject::validate(&value, config.max_subject_len).map_err(|error| {
                    RequestError::InvalidSubject {
                        subject: value.chars().take(64).collect(),
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
            other => {
                return Err(RequestError::UnknownParameter(
                    other.chars().take(64).collect(),
                ))
            }
        }
    }
    if subjects.is_empty() {
        return Err(RequestError::NoSubject);
    }
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
    Ok(StreamRequest { subjects, since })
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
/// page on another origin may use. EventSource sends `Last-Event-ID`.
pub fn preflight_response(config: &Config) -> Vec<u8> {
    let mut headers = cors_headers(config);
    headers.extend([
        ("Access-Control-Allow-Methods", "GET, OPTIONS"),
        (
            "Access-Control-Allow-Headers",
            "Last-Event-ID, Cache-Control",
        ),
        ("Access-Control-Max-Age", "86400"),
    ]);
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
    use myriad_protocol::handshake::parse_request;
    use myriad_protocol::position::Epoch;

    fn request(target: &str, extra: &str) -> Result<StreamRequest, RequestError> {
        let text = format!("GET {target} HTTP/1.1\r\nHost: x\r\n{extra}\r\n");
        let head = parse_request(text.as_bytes(), 8192).unwrap().unwrap();
        parse_stream_request(&head, &Config::default())
    }

    #[test]
    fn the_user_parameter_is_a_user_id_given_once() {
        assert_eq!(parse_user(None), Ok(None));
        assert_eq!(parse_user(Some("x=1&y")), Ok(None));
        assert_eq!(
            parse_user(Some("token=a&user=17")),
            Ok(Some(UserId::new(17).unwrap()))
        );
        let bad = parse_user(Some("user=-3")).unwrap_err();
        assert_eq!((bad.status(), bad.label()), (400, "request_invalid_user"));
        let huge = parse_user(Some("user=9007199254740992")).unwrap_err();
        assert_eq!(huge.code(), "invalid_user");
        assert_eq!(
            parse_user(Some("user=1&user=2")),
            Err(RequestError::RepeatedParameter("user"))
        );
        let unknown = RequestError::UnknownUser(UserId::new(5).unwrap());
        assert_eq!(
            (unknown.status(), unknown.label()),
            (404, "request_unknown_user")
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
