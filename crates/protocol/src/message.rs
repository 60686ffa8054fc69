//! Protocol v1: the JSON commands a client sends in text frames, and the JSON
//! the server answers with. docs/protocol.md is the prose version of this file.
//!
//! Parsing borrows from the frame (`Cow` only allocates for escaped strings,
//! and `data` stays a raw JSON slice), because the server parses every inbound
//! message on its hot path. Deliveries are written by hand rather than through
//! serde: a delivery is encoded once per publish and then shared by every
//! recipient, and its layout (`data` last, verbatim) is part of the protocol.

use std::borrow::Cow;
use std::io::Write;

use serde::Deserialize;
use serde_json::value::RawValue;
use thiserror::Error;

use crate::subject::{self, SubjectError};

/// A parsed client command.
#[derive(Debug)]
pub enum Command<'a> {
    /// Add subscriptions; already-held subjects are accepted again silently.
    Subscribe {
        id: Option<u64>,
        subjects: Vec<Cow<'a, str>>,
    },
    /// Drop subscriptions; subjects not held are ignored.
    Unsubscribe {
        id: Option<u64>,
        subjects: Vec<Cow<'a, str>>,
    },
    /// Publish `data` (any JSON value, kept verbatim) to `subject`.
    Publish {
        id: Option<u64>,
        subject: Cow<'a, str>,
        data: &'a RawValue,
    },
    /// Application-level ping, answered with a pong.
    Ping { id: Option<u64> },
}

impl Command<'_> {
    /// The request id, if the client gave one.
    pub fn id(&self) -> Option<u64> {
        match self {
            Command::Subscribe { id, .. }
            | Command::Unsubscribe { id, .. }
            | Command::Publish { id, .. }
            | Command::Ping { id } => *id,
        }
    }
}

/// The stable error codes of protocol v1, sent as `"code"` in error replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The text frame was not a JSON object of the expected shape.
    InvalidJson,
    /// `op` named no known command.
    UnknownOp,
    /// A field the command needs was missing or of the wrong type.
    MissingField,
    /// A subject broke the syntax rules or the length limit.
    InvalidSubject,
    /// The subscription would pass the per-connection limit.
    TooManySubscriptions,
    /// The publish was refused by the server (e.g. the engine failed).
    PublishFailed,
}

impl ErrorCode {
    /// Every code, for metrics registration and documentation.
    pub const ALL: [ErrorCode; 6] = [
        ErrorCode::InvalidJson,
        ErrorCode::UnknownOp,
        ErrorCode::MissingField,
        ErrorCode::InvalidSubject,
        ErrorCode::TooManySubscriptions,
        ErrorCode::PublishFailed,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidJson => "invalid_json",
            ErrorCode::UnknownOp => "unknown_op",
            ErrorCode::MissingField => "missing_field",
            ErrorCode::InvalidSubject => "invalid_subject",
            ErrorCode::TooManySubscriptions => "too_many_subscriptions",
            ErrorCode::PublishFailed => "publish_failed",
        }
    }
}

/// A command the server could not accept, with the id to answer to when the
/// JSON was readable enough to find one.
#[derive(Debug, Error, PartialEq)]
#[error("{code:?}: {detail}")]
pub struct CommandError {
    pub id: Option<u64>,
    pub code: ErrorCode,
    pub detail: String,
}

impl CommandError {
    fn new(id: Option<u64>, code: ErrorCode, detail: impl Into<String>) -> Self {
        CommandError {
            id,
            code,
            detail: detail.into(),
        }
    }

    fn subject(id: Option<u64>, err: SubjectError) -> Self {
        CommandError::new(id, ErrorCode::InvalidSubject, err.to_string())
    }
}

/// The flat shape every command shares; `op` picks which fields matter.
#[derive(Deserialize)]
struct RawCommand<'a> {
    #[serde(borrow)]
    op: Cow<'a, str>,
    #[serde(default)]
    id: Option<u64>,
    #[serde(default, borrow)]
    subject: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    subjects: Option<Vec<Cow<'a, str>>>,
    #[serde(default, borrow)]
    data: Option<&'a RawValue>,
}

/// Parses one client text message. Subjects are validated here, so a command
/// that parses is one the registry can act on.
pub fn parse_command(text: &str, max_subject_len: usize) -> Result<Command<'_>, CommandError> {
    let raw: RawCommand<'_> = serde_json::from_str(text)
        .map_err(|e| CommandError::new(find_id(text), ErrorCode::InvalidJson, e.to_string()))?;
    let id = raw.id;
    match raw.op.as_ref() {
        "subscribe" => Ok(Command::Subscribe {
            id,
            subjects: subjects_of(raw, max_subject_len)?,
        }),
        "unsubscribe" => Ok(Command::Unsubscribe {
            id,
            subjects: subjects_of(raw, max_subject_len)?,
        }),
        "publish" => {
            let subject = raw.subject.ok_or_else(|| {
                CommandError::new(id, ErrorCode::MissingField, "\"subject\" is required")
            })?;
            subject::validate(&subject, max_subject_len)
                .map_err(|e| CommandError::subject(id, e))?;
            let data = raw.data.ok_or_else(|| {
                CommandError::new(id, ErrorCode::MissingField, "\"data\" is required")
            })?;
            Ok(Command::Publish { id, subject, data })
        }
        "ping" => Ok(Command::Ping { id }),
        other => Err(CommandError::new(
            id,
            ErrorCode::UnknownOp,
            format!("unknown op {other:?}"),
        )),
    }
}

/// The validated subject list of a subscribe or unsubscribe: `subjects`,
/// `subject`, or both.
fn subjects_of(
    raw: RawCommand<'_>,
    max_subject_len: usize,
) -> Result<Vec<Cow<'_, str>>, CommandError> {
    let id = raw.id;
    let list = match (raw.subjects, raw.subject) {
        (Some(list), None) => list,
        (None, Some(one)) => vec![one],
        (Some(mut list), Some(one)) => {
            list.push(one);
            list
        }
        (None, None) => {
            return Err(CommandError::new(
                id,
                ErrorCode::MissingField,
                "\"subjects\" (array of strings) or \"subject\" is required",
            ))
        }
    };
    if list.is_empty() {
        return Err(CommandError::new(
            id,
            ErrorCode::MissingField,
            "\"subjects\" is empty",
        ));
    }
    for s in &list {
        subject::validate(s, max_subject_len).map_err(|e| CommandError::subject(id, e))?;
    }
    Ok(list)
}

/// Best effort: the `id` of a message that failed to parse as a command, so
/// the error reply can still name the request it answers.
fn find_id(text: &str) -> Option<u64> {
    #[derive(Deserialize)]
    struct IdOnly {
        id: Option<u64>,
    }
    serde_json::from_str::<IdOnly>(text).ok()?.id
}

// ---- server → client --------------------------------------------------------

const DELIVERY_HEAD: &[u8] = b"{\"op\":\"msg\",\"subject\":\"";
const DELIVERY_SEQ: &[u8] = b"\",\"seq\":";
const DELIVERY_DATA: &[u8] = b",\"data\":";

/// Length in bytes of [`write_delivery`]'s output, so the caller can write the
/// frame header first and the payload straight after it, in one allocation.
pub fn delivery_len(subject: &str, seq: u64, data: &str) -> usize {
    DELIVERY_HEAD.len()
        + subject.len()
        + DELIVERY_SEQ.len()
        + decimal_len(seq)
        + DELIVERY_DATA.len()
        + data.len()
        + 1
}

/// Writes `{"op":"msg","subject":S,"seq":N,"data":D}`. `subject` must be
/// valid (see [`subject::validate`]) so it needs no escaping; `data` is raw
/// JSON copied verbatim.
pub fn write_delivery(out: &mut Vec<u8>, subject: &str, seq: u64, data: &str) {
    out.extend_from_slice(DELIVERY_HEAD);
    out.extend_from_slice(subject.as_bytes());
    out.extend_from_slice(DELIVERY_SEQ);
    write!(out, "{seq}").expect("writing to a Vec cannot fail");
    out.extend_from_slice(DELIVERY_DATA);
    out.extend_from_slice(data.as_bytes());
    out.push(b'}');
}

fn decimal_len(mut n: u64) -> usize {
    let mut len = 1;
    while n >= 10 {
        n /= 10;
        len += 1;
    }
    len
}

/// `{"op":"ok","id":N}`.
pub fn encode_ok(id: u64) -> String {
    format!("{{\"op\":\"ok\",\"id\":{id}}}")
}

/// `{"op":"pong"}` or `{"op":"pong","id":N}`.
pub fn encode_pong(id: Option<u64>) -> String {
    match id {
        Some(id) => format!("{{\"op\":\"pong\",\"id\":{id}}}"),
        None => "{\"op\":\"pong\"}".to_owned(),
    }
}

/// `{"op":"error","id":N,"code":C,"message":M}` (`id` left out when unknown).
pub fn encode_error(id: Option<u64>, code: ErrorCode, message: &str) -> String {
    let message = serde_json::to_string(message).expect("a str always serializes");
    match id {
        Some(id) => format!(
            "{{\"op\":\"error\",\"id\":{id},\"code\":\"{}\",\"message\":{message}}}",
            code.as_str()
        ),
        None => format!(
            "{{\"op\":\"error\",\"code\":\"{}\",\"message\":{message}}}",
            code.as_str()
        ),
    }
}

// ---- client side: used by `myriad sub`/`myriad pub`, the bench and tests ----

fn encode_subjects_command(op: &str, subjects: &[&str], id: Option<u64>) -> String {
    let subjects = serde_json::to_string(subjects).expect("strings always serialize");
    match id {
        Some(id) => format!("{{\"op\":\"{op}\",\"subjects\":{subjects},\"id\":{id}}}"),
        None => format!("{{\"op\":\"{op}\",\"subjects\":{subjects}}}"),
    }
}

/// `{"op":"subscribe","subjects":[..],"id":N}`.
pub fn encode_subscribe(subjects: &[&str], id: Option<u64>) -> String {
    encode_subjects_command("subscribe", subjects, id)
}

/// `{"op":"unsubscribe","subjects":[..],"id":N}`.
pub fn encode_unsubscribe(subjects: &[&str], id: Option<u64>) -> String {
    encode_subjects_command("unsubscribe", subjects, id)
}

/// `{"op":"publish","subject":S,"data":D,"id":N}`; `data_json` must be JSON.
pub fn encode_publish(subject: &str, data_json: &str, id: Option<u64>) -> String {
    let subject = serde_json::to_string(subject).expect("a str always serializes");
    match id {
        Some(id) => {
            format!("{{\"op\":\"publish\",\"subject\":{subject},\"data\":{data_json},\"id\":{id}}}")
        }
        None => format!("{{\"op\":\"publish\",\"subject\":{subject},\"data\":{data_json}}}"),
    }
}

/// A message from the server, as a client sees it.
#[derive(Debug)]
pub enum ServerMessage<'a> {
    Delivery {
        subject: Cow<'a, str>,
        seq: u64,
        data: &'a RawValue,
    },
    Ok {
        id: Option<u64>,
    },
    Pong {
        id: Option<u64>,
    },
    Error {
        id: Option<u64>,
        code: Cow<'a, str>,
        message: Cow<'a, str>,
    },
}

#[derive(Deserialize)]
struct RawServerMessage<'a> {
    #[serde(borrow)]
    op: Cow<'a, str>,
    #[serde(default)]
    id: Option<u64>,
    #[serde(default, borrow)]
    subject: Option<Cow<'a, str>>,
    #[serde(default)]
    seq: Option<u64>,
    #[serde(default, borrow)]
    data: Option<&'a RawValue>,
    #[serde(default, borrow)]
    code: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    message: Option<Cow<'a, str>>,
}

/// Why a server message could not be understood by a client.
#[derive(Debug, Error)]
pub enum ServerMessageError {
    #[error("not JSON of the expected shape: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{op:?} message lacks {field:?}")]
    MissingField { op: String, field: &'static str },
    #[error("unknown op {0:?}")]
    UnknownOp(String),
}

/// Parses one server text message (client side).
pub fn parse_server_message(text: &str) -> Result<ServerMessage<'_>, ServerMessageError> {
    let raw: RawServerMessage<'_> = serde_json::from_str(text)?;
    let missing = |field| ServerMessageError::MissingField {
        op: raw.op.to_string(),
        field,
    };
    match raw.op.as_ref() {
        "msg" => Ok(ServerMessage::Delivery {
            subject: raw.subject.clone().ok_or_else(|| missing("subject"))?,
            seq: raw.seq.ok_or_else(|| missing("seq"))?,
            data: raw.data.ok_or_else(|| missing("data"))?,
        }),
        "ok" => Ok(ServerMessage::Ok { id: raw.id }),
        "pong" => Ok(ServerMessage::Pong { id: raw.id }),
        "error" => Ok(ServerMessage::Error {
            id: raw.id,
            code: raw.code.clone().ok_or_else(|| missing("code"))?,
            message: raw.message.clone().unwrap_or_default(),
        }),
        other => Err(ServerMessageError::UnknownOp(other.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAX: usize = subject::DEFAULT_MAX_SUBJECT_LEN;

    #[test]
    fn parses_each_command() {
        let c = parse_command(r#"{"op":"subscribe","subjects":["a","b/c"],"id":7}"#, MAX).unwrap();
        assert!(
            matches!(&c, Command::Subscribe { id: Some(7), subjects } if subjects == &["a", "b/c"]),
            "{c:?}"
        );
        let c = parse_command(r#"{"op":"unsubscribe","subject":"a"}"#, MAX).unwrap();
        assert!(
            matches!(&c, Command::Unsubscribe { id: None, subjects } if subjects == &["a"]),
            "{c:?}"
        );
        let c = parse_command(
            r#"{"op":"publish","subject":"a","data":{"x":[1,2]},"id":1}"#,
            MAX,
        )
        .unwrap();
        match c {
            Command::Publish { id, subject, data } => {
                assert_eq!(id, Some(1));
                assert_eq!(subject, "a");
                assert_eq!(data.get(), r#"{"x":[1,2]}"#);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse_command(r#"{"op":"ping","id":3}"#, MAX).unwrap(),
            Command::Ping { id: Some(3) }
        ));
    }

    #[test]
    fn each_bad_input_has_its_code() {
        let cases = [
            ("not json", ErrorCode::InvalidJson, None),
            ("[1,2]", ErrorCode::InvalidJson, None),
            (r#"{"id":4}"#, ErrorCode::InvalidJson, Some(4)),
            (r#"{"op":"dance","id":5}"#, ErrorCode::UnknownOp, Some(5)),
            (
                r#"{"op":"subscribe","id":6}"#,
                ErrorCode::MissingField,
                Some(6),
            ),
            (
                r#"{"op":"subscribe","subjects":[]}"#,
                ErrorCode::MissingField,
                None,
            ),
            (
                r#"{"op":"subscribe","subjects":["a b"]}"#,
                ErrorCode::InvalidSubject,
                None,
            ),
            (
                r#"{"op":"publish","subject":"a"}"#,
                ErrorCode::MissingField,
                None,
            ),
            (
                r#"{"op":"publish","data":1}"#,
                ErrorCode::MissingField,
                None,
            ),
            (
                r#"{"op":"publish","subject":"*","data":1}"#,
                ErrorCode::InvalidSubject,
                None,
            ),
            (
                r#"{"op":"subscribe","subjects":"a"}"#,
                ErrorCode::InvalidJson,
                None,
            ),
        ];
        for (text, code, id) in cases {
            let err = parse_command(text, MAX).unwrap_err();
            assert_eq!((err.code, err.id), (code, id), "{text}");
        }
        let long = format!(
            r#"{{"op":"subscribe","subject":"{}"}}"#,
            "a".repeat(MAX + 1)
        );
        assert_eq!(
            parse_command(&long, MAX).unwrap_err().code,
            ErrorCode::InvalidSubject
        );
    }

    #[test]
    fn delivery_layout_is_exact() {
        let mut out = Vec::new();
        write_delivery(&mut out, "/p/s1", 42, r#""hello""#);
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"op":"msg","subject":"/p/s1","seq":42,"data":"hello"}"#
        );
        assert_eq!(out.len(), delivery_len("/p/s1", 42, r#""hello""#));
    }

    #[test]
    fn replies_are_json() {
        for text in [
            encode_ok(1),
            encode_pong(Some(2)),
            encode_pong(None),
            encode_error(Some(3), ErrorCode::UnknownOp, "unknown op \"x\""),
            encode_error(None, ErrorCode::InvalidJson, "line 1"),
        ] {
            serde_json::from_str::<serde_json::Value>(&text).unwrap();
            parse_server_message(&text).unwrap();
        }
    }

    proptest! {
        #[test]
        fn client_encoders_round_trip_through_the_server_parser(
            subjects in proptest::collection::vec("[a-z0-9/._-]{1,20}", 1..5),
            id in proptest::option::of(any::<u64>()),
            n in any::<i64>(),
        ) {
            let refs: Vec<&str> = subjects.iter().map(String::as_str).collect();
            let text = encode_subscribe(&refs, id);
            match parse_command(&text, MAX).unwrap() {
                Command::Subscribe { id: got, subjects: parsed } => {
                    prop_assert_eq!(got, id);
                    prop_assert_eq!(parsed, subjects.clone());
                }
                other => prop_assert!(false, "{:?}", other),
            }

            let data = n.to_string();
            let text = encode_publish(&subjects[0], &data, id);
            match parse_command(&text, MAX).unwrap() {
                Command::Publish { id: got, subject, data: d } => {
                    prop_assert_eq!(got, id);
                    prop_assert_eq!(subject.as_ref(), subjects[0].as_str());
                    prop_assert_eq!(d.get(), data.as_str());
                }
                other => prop_assert!(false, "{:?}", other),
            }
        }

        #[test]
        fn deliveries_parse_back(subject in "[A-Za-z0-9/._-]{1,40}", seq in any::<u64>(), n in any::<i64>()) {
            let data = n.to_string();
            let mut out = Vec::new();
            write_delivery(&mut out, &subject, seq, &data);
            prop_assert_eq!(out.len(), delivery_len(&subject, seq, &data));
            let text = std::str::from_utf8(&out).unwrap();
            match parse_server_message(text).unwrap() {
                ServerMessage::Delivery { subject: s, seq: q, data: d } => {
                    prop_assert_eq!(s.as_ref(), subject.as_str());
                    prop_assert_eq!(q, seq);
                    prop_assert_eq!(d.get(), data.as_str());
                }
                other => prop_assert!(false, "{:?}", other),
            }
        }
    }
}
