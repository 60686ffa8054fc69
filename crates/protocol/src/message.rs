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

use crate::close::{CloseReason, Reconnect};
use crate::position::{Epoch, Position, EPOCH_LEN};
use crate::subject::{self, SubjectError};

/// A parsed client command.
#[derive(Debug)]
pub enum Command<'a> {
    /// Add subscriptions; already-held subjects are accepted again silently.
    /// `since` (one subject only) asks to recover what was published after
    /// that position before live delivery starts.
    Subscribe {
        id: Option<u64>,
        subjects: Vec<Cow<'a, str>>,
        since: Option<Position>,
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
    /// Read a subject's history: the last `limit` publications, or those
    /// after `since` (at most `limit`).
    History {
        id: Option<u64>,
        subject: Cow<'a, str>,
        since: Option<Position>,
        limit: Option<u64>,
    },
    /// Publish `data` to the feed of the connection's user (`@<user>`), so
    /// that it reaches everyone following that user and the user's own
    /// connections.
    Send { id: Option<u64>, data: &'a RawValue },
    /// Application-level ping, answered with a pong.
    Ping { id: Option<u64> },
    /// Authenticate a connection opened without a token, with a JWT.
    Connect {
        id: Option<u64>,
        token: Cow<'a, str>,
    },
    /// Swap the connection's token for a newer one of the same user,
    /// before the old one expires.
    Refresh {
        id: Option<u64>,
        token: Cow<'a, str>,
    },
    /// List a presence subject's members, ordered by member id: at most
    /// `limit` of them, those after the member id `cursor` (the `next` of
    /// the previous page) when it is given.
    Presence {
        id: Option<u64>,
        subject: Cow<'a, str>,
        cursor: Option<Cow<'a, str>>,
        limit: Option<u64>,
    },
    /// Count a presence subject's members: connections and distinct users.
    PresenceStats {
        id: Option<u64>,
        subject: Cow<'a, str>,
    },
}

impl Command<'_> {
    /// The request id, if the client gave one.
    pub fn id(&self) -> Option<u64> {
        match self {
            Command::Subscribe { id, .. }
            | Command::Unsubscribe { id, .. }
            | Command::Publish { id, .. }
            | Command::History { id, .. }
            | Command::Send { id, .. }
            | Command::Connect { id, .. }
            | Command::Refresh { id, .. }
            | Command::Presence { id, .. }
            | Command::PresenceStats { id, .. }
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
    /// A `since` position was malformed, or given with more than one subject.
    InvalidPosition,
    /// The publish was refused by the server (e.g. the engine failed).
    PublishFailed,
    /// The engine could not answer a subscribe or history request.
    Unavailable,
    /// A publish to a user's feed (`@…`): only `send` publishes there.
    ReservedSubject,
    /// A `send` on a connection that does not act as a user.
    NoUser,
    /// The connection may not do this with the subject: its token does not
    /// grant it, it has no token, or the subject's namespace forbids it.
    Forbidden,
    /// A `connect` or `refresh` token was refused.
    InvalidToken,
    /// A `connect` on a connection that already has a token or user.
    AlreadyConnected,
    /// The connection is over its publish or subscribe rate.
    RateLimited,
    /// A subscribe to a presence subject that already has its namespace's
    /// `presence_max_members` members: the connection is not subscribed.
    PresenceFull,
    /// The backend's proxy refused the command (its `reason` is the
    /// message).
    ProxyRefused,
    /// The backend's proxy gave no verdict (timeout, error, malformed
    /// answer) and `proxy_fail` is `closed`: nothing was done; retry later.
    ProxyUnavailable,
    /// `proxy_max_in_flight` proxy calls are out on the node: the command
    /// was not asked about and nothing was done; retry later.
    ProxyBusy,
    /// `proxy_max_held` commands of the connection already wait behind
    /// one parked for its proxy verdict: this one was not run.
    TooManyHeld,
}

impl ErrorCode {
    /// Every code, for metrics registration and documentation.
    pub const ALL: [ErrorCode; 19] = [
        ErrorCode::InvalidJson,
        ErrorCode::UnknownOp,
        ErrorCode::MissingField,
        ErrorCode::InvalidSubject,
        ErrorCode::TooManySubscriptions,
        ErrorCode::InvalidPosition,
        ErrorCode::PublishFailed,
        ErrorCode::Unavailable,
        ErrorCode::ReservedSubject,
        ErrorCode::NoUser,
        ErrorCode::Forbidden,
        ErrorCode::InvalidToken,
        ErrorCode::AlreadyConnected,
        ErrorCode::RateLimited,
        ErrorCode::PresenceFull,
        ErrorCode::ProxyRefused,
        ErrorCode::ProxyUnavailable,
        ErrorCode::ProxyBusy,
        ErrorCode::TooManyHeld,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidJson => "invalid_json",
            ErrorCode::UnknownOp => "unknown_op",
            ErrorCode::MissingField => "missing_field",
            ErrorCode::InvalidSubject => "invalid_subject",
            ErrorCode::TooManySubscriptions => "too_many_subscriptions",
            ErrorCode::InvalidPosition => "invalid_position",
            ErrorCode::PublishFailed => "publish_failed",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::ReservedSubject => "reserved_subject",
            ErrorCode::NoUser => "no_user",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::InvalidToken => "invalid_token",
            ErrorCode::AlreadyConnected => "already_connected",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::PresenceFull => "presence_full",
            ErrorCode::ProxyRefused => "proxy_refused",
            ErrorCode::ProxyUnavailable => "proxy_unavailable",
            ErrorCode::ProxyBusy => "proxy_busy",
            ErrorCode::TooManyHeld => "too_many_held",
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
    /// Present even when it is JSON `null`, which is valid data.
    #[serde(default, borrow, deserialize_with = "present")]
    data: Option<&'a RawValue>,
    /// Parsed on its own so a malformed one gets `invalid_position`.
    #[serde(default, borrow)]
    since: Option<&'a RawValue>,
    #[serde(default)]
    limit: Option<u64>,
    #[serde(default, borrow)]
    token: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    cursor: Option<Cow<'a, str>>,
}

/// Deserializes a field that is present as `Some`, even when it is `null`
/// (serde's `Option` would turn `null` into `None`, i.e. "missing").
pub fn present<'de, D>(d: D) -> Result<Option<&'de RawValue>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    <&'de RawValue>::deserialize(d).map(Some)
}

/// Parses one client text message. Subjects are validated here, so a command
/// that parses is one the registry can act on.
pub fn parse_command(text: &str, max_subject_len: usize) -> Result<Command<'_>, CommandError> {
    let raw: RawCommand<'_> = serde_json::from_str(text)
        .map_err(|e| CommandError::new(find_id(text), ErrorCode::InvalidJson, e.to_string()))?;
    let id = raw.id;
    match raw.op.as_ref() {
        "subscribe" => {
            let since = since_of(id, raw.since)?;
            let subjects = subjects_of(raw, max_subject_len)?;
            if since.is_some() && subjects.len() != 1 {
                return Err(CommandError::new(
                    id,
                    ErrorCode::InvalidPosition,
                    "\"since\" needs exactly one subject",
                ));
            }
            Ok(Command::Subscribe {
                id,
                subjects,
                since,
            })
        }
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
            if subject::is_feed(&subject) {
                return Err(CommandError::new(
                    id,
                    ErrorCode::ReservedSubject,
                    "a user's feed takes only \"send\" from that user",
                ));
            }
            let data = raw.data.ok_or_else(|| {
                CommandError::new(id, ErrorCode::MissingField, "\"data\" is required")
            })?;
            Ok(Command::Publish { id, subject, data })
        }
        "send" => {
            let data = raw.data.ok_or_else(|| {
                CommandError::new(id, ErrorCode::MissingField, "\"data\" is required")
            })?;
            Ok(Command::Send { id, data })
        }
        "history" => {
            let since = since_of(id, raw.since)?;
            let subject = raw.subject.ok_or_else(|| {
                CommandError::new(id, ErrorCode::MissingField, "\"subject\" is required")
            })?;
            subject::validate(&subject, max_subject_len)
                .map_err(|e| CommandError::subject(id, e))?;
            Ok(Command::History {
                id,
                subject,
                since,
                limit: raw.limit,
            })
        }
        "presence" | "presence_stats" => {
            let subject = raw.subject.ok_or_else(|| {
                CommandError::new(id, ErrorCode::MissingField, "\"subject\" is required")
            })?;
            subject::validate(&subject, max_subject_len)
                .map_err(|e| CommandError::subject(id, e))?;
            Ok(if raw.op == "presence" {
                Command::Presence {
                    id,
                    subject,
                    cursor: raw.cursor,
                    limit: raw.limit,
                }
            } else {
                Command::PresenceStats { id, subject }
            })
        }
        "ping" => Ok(Command::Ping { id }),
        "connect" | "refresh" => {
            let token = raw.token.ok_or_else(|| {
                CommandError::new(id, ErrorCode::MissingField, "\"token\" is required")
            })?;
            Ok(if raw.op == "connect" {
                Command::Connect { id, token }
            } else {
                Command::Refresh { id, token }
            })
        }
        other => Err(CommandError::new(
            id,
            ErrorCode::UnknownOp,
            format!("unknown op {other:?}"),
        )),
    }
}

/// The `since` position of a command, if it has one.
fn since_of(id: Option<u64>, raw: Option<&RawValue>) -> Result<Option<Position>, CommandError> {
    raw.map(|raw| {
        serde_json::from_str::<Position>(raw.get()).map_err(|e| {
            CommandError::new(
                id,
                ErrorCode::InvalidPosition,
                format!("\"since\" must be {{\"epoch\":\"<16 hex digits>\",\"offset\":N}}: {e}"),
            )
        })
    })
    .transpose()
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

const PUBLICATION_HEAD: &[u8] = b"{\"op\":\"msg\",\"subject\":\"";
const PUBLICATION_EPOCH: &[u8] = b"\",\"epoch\":\"";
const PUBLICATION_OFFSET: &[u8] = b"\",\"offset\":";
const PUBLICATION_DATA: &[u8] = b",\"data\":";

/// Length in bytes of [`write_publication`]'s output, so the caller can
/// reserve room for a frame header and write the envelope behind it, in one
/// allocation.
pub fn publication_len(subject: &str, offset: u64, data: &str) -> usize {
    PUBLICATION_HEAD.len()
        + subject.len()
        + PUBLICATION_EPOCH.len()
        + EPOCH_LEN
        + PUBLICATION_OFFSET.len()
        + decimal_len(offset)
        + PUBLICATION_DATA.len()
        + data.len()
        + 1
}

/// Writes the envelope of one publication,
/// `{"op":"msg","subject":S,"epoch":E,"offset":N,"data":D}`. `subject` must
/// be valid (see [`subject::validate`]) so it needs no escaping; `data` is
/// raw JSON copied verbatim and always comes last, one byte before the end.
pub fn write_publication(out: &mut Vec<u8>, subject: &str, position: Position, data: &str) {
    out.extend_from_slice(PUBLICATION_HEAD);
    out.extend_from_slice(subject.as_bytes());
    out.extend_from_slice(PUBLICATION_EPOCH);
    position.epoch.write_hex(out);
    out.extend_from_slice(PUBLICATION_OFFSET);
    write!(out, "{}", position.offset).expect("writing to a Vec cannot fail");
    out.extend_from_slice(PUBLICATION_DATA);
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

/// `"epoch":"E","offset":N` (no braces), shared by the replies that carry a
/// position flat beside their other fields.
fn position_fields(position: Position) -> String {
    format!(
        "\"epoch\":\"{}\",\"offset\":{}",
        position.epoch, position.offset
    )
}

/// `{"op":"subscribed","id":N,"subject":S,"epoch":E,"offset":N[,"recovered":B]}`:
/// the subscription is live from `position` on; `recovered` answers a
/// subscribe that carried `since`.
pub fn encode_subscribed(
    id: Option<u64>,
    subject: &str,
    position: Position,
    recovered: Option<bool>,
) -> String {
    let mut out = String::from("{\"op\":\"subscribed\"");
    if let Some(id) = id {
        out.push_str(&format!(",\"id\":{id}"));
    }
    out.push_str(&format!(
        ",\"subject\":\"{subject}\",{}",
        position_fields(position)
    ));
    if let Some(recovered) = recovered {
        out.push_str(&format!(",\"recovered\":{recovered}"));
    }
    out.push('}');
    out
}

/// `{"op":"history","id":N,"subject":S,"epoch":E,"offset":N[,"recovered":B],"publications":[…]}`,
/// where each publication is an envelope as [`write_publication`] wrote it
/// and `epoch`/`offset` give the subject's current position.
pub fn encode_history<'a>(
    id: Option<u64>,
    subject: &str,
    position: Position,
    recovered: Option<bool>,
    envelopes: impl IntoIterator<Item = &'a [u8]>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"{\"op\":\"history\"");
    if let Some(id) = id {
        write!(out, ",\"id\":{id}").expect("writing to a Vec cannot fail");
    }
    write!(
        out,
        ",\"subject\":\"{subject}\",{}",
        position_fields(position)
    )
    .expect("writing to a Vec cannot fail");
    if let Some(recovered) = recovered {
        write!(out, ",\"recovered\":{recovered}").expect("writing to a Vec cannot fail");
    }
    out.extend_from_slice(b",\"publications\":[");
    for (i, envelope) in envelopes.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(envelope);
    }
    out.extend_from_slice(b"]}");
    out
}

/// One member of a presence subject, as `presence` lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PresenceMember<'a> {
    /// The member's id: one connection, unique in the cluster while it lives.
    pub conn: &'a str,
    /// The user the connection acts as; `None` for an anonymous one.
    pub user: Option<&'a str>,
    /// The token's `info` claim, raw JSON, when it carried one.
    pub info: Option<&'a str>,
}

/// `{"op":"presence","id":N,"subject":S,"members":[{"conn":C,"user":U[,"info":I]}…],"next":C|null}`:
/// one page of a presence subject's members, ordered by `conn`; `next` is
/// the cursor of the page after it, `null` on the last page.
pub fn encode_presence<'a>(
    id: Option<u64>,
    subject: &str,
    members: impl IntoIterator<Item = PresenceMember<'a>>,
    next: Option<&str>,
) -> Vec<u8> {
    let quote = |s: &str| serde_json::to_string(s).expect("a str always serializes");
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"{\"op\":\"presence\"");
    if let Some(id) = id {
        write!(out, ",\"id\":{id}").expect("writing to a Vec cannot fail");
    }
    write!(out, ",\"subject\":{},\"members\":[", quote(subject))
        .expect("writing to a Vec cannot fail");
    for (i, member) in members.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_member(&mut out, member);
    }
    let next = next.map_or_else(|| "null".to_owned(), quote);
    write!(out, "],\"next\":{next}}}").expect("writing to a Vec cannot fail");
    out
}

/// `{"conn":C,"user":U[,"info":I]}`: one member as every presence message
/// writes it.
fn write_member(out: &mut Vec<u8>, member: PresenceMember<'_>) {
    let quote = |s: &str| serde_json::to_string(s).expect("a str always serializes");
    let user = member.user.map_or_else(|| "null".to_owned(), quote);
    write!(out, "{{\"conn\":{},\"user\":{user}", quote(member.conn))
        .expect("writing to a Vec cannot fail");
    if let Some(info) = member.info {
        write!(out, ",\"info\":{info}").expect("writing to a Vec cannot fail");
    }
    out.push(b'}');
}

/// `{"op":"join"|"leave","subject":S,"member":{…}}`: a member joined or
/// left a subject whose namespace has `join_leave`, sent to its
/// subscribers; no position (presence changes are not publications).
pub fn encode_presence_change(joined: bool, subject: &str, member: PresenceMember<'_>) -> Vec<u8> {
    let op = if joined { "join" } else { "leave" };
    let subject = serde_json::to_string(subject).expect("a str always serializes");
    let mut out = Vec::with_capacity(96);
    write!(out, "{{\"op\":\"{op}\",\"subject\":{subject},\"member\":")
        .expect("writing to a Vec cannot fail");
    write_member(&mut out, member);
    out.push(b'}');
    out
}

/// `{"op":"presence_stats","id":N,"subject":S,"connections":C,"users":U}`.
pub fn encode_presence_stats(
    id: Option<u64>,
    subject: &str,
    connections: u64,
    users: u64,
) -> String {
    let subject = serde_json::to_string(subject).expect("a str always serializes");
    let id = id.map_or_else(String::new, |id| format!(",\"id\":{id}"));
    format!(
        "{{\"op\":\"presence_stats\"{id},\"subject\":{subject},\"connections\":{connections},\"users\":{users}}}"
    )
}

/// `{"op":"ok","id":N,"epoch":E,"offset":O,"reached":R}`: a publish's or
/// send's answer. `reached` counts the connections on this node it was
/// handed to; the position is left out when it got none (no subscriber and
/// no history).
pub fn encode_published(id: u64, position: Option<Position>, reached: u32) -> String {
    match position {
        Some(position) => format!(
            "{{\"op\":\"ok\",\"id\":{id},{},\"reached\":{reached}}}",
            position_fields(position)
        ),
        None => format!("{{\"op\":\"ok\",\"id\":{id},\"reached\":{reached}}}"),
    }
}

/// `{"op":"ok","id":N}`: a subscribe's or unsubscribe's answer when there
/// is nothing else to say.
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

/// `{"op":"error",["id":N,]"code":C,"subject":S,"message":M}`: a subscribe
/// of `subject` the engine could not make. A subscribe without an id (an
/// HTTP transport's subjects, a user's feeds) has only the subject to say
/// which of its subjects failed.
pub fn encode_subject_error(
    id: Option<u64>,
    code: ErrorCode,
    subject: &str,
    message: &str,
) -> String {
    let message = serde_json::to_string(message).expect("a str always serializes");
    // Subjects need no escaping in JSON (see `crate::subject`).
    let id = id.map_or(String::new(), |id| format!("\"id\":{id},"));
    format!(
        "{{\"op\":\"error\",{id}\"code\":\"{}\",\"subject\":\"{subject}\",\"message\":{message}}}",
        code.as_str()
    )
}

/// `{"op":"close","code":C,"reason":R,"reconnect":B}`: the last message of
/// a stream the server ends (HTTP transports; WebSocket says the same in
/// its close frame). `code` is the reason's WebSocket code, so one table
/// serves every transport.
pub fn encode_close_notice(reason: CloseReason) -> String {
    format!(
        "{{\"op\":\"close\",\"code\":{},\"reason\":\"{}\",\"reconnect\":{}}}",
        reason.ws_code(),
        reason.name(),
        reason.reconnect() == Reconnect::WithBackoff
    )
}

/// `{"op":"poll","since":CURSOR}`: the last element of a long-poll answer,
/// the cursor to send with the next poll (see [`crate::cursor`]).
pub fn encode_poll_end(cursor: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + cursor.len());
    out.extend_from_slice(b"{\"op\":\"poll\",\"since\":\"");
    out.extend_from_slice(cursor);
    out.extend_from_slice(b"\"}");
    out
}

/// `{"error":{"code":C,"message":M}}`: the body of every refused HTTP
/// request, on the admin API and the client listener alike.
pub fn encode_http_error(code: &str, message: &str) -> String {
    let message = serde_json::to_string(message).expect("a str always serializes");
    format!("{{\"error\":{{\"code\":\"{code}\",\"message\":{message}}}}}")
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

/// `{"op":"subscribe","subject":S,"since":{"epoch":E,"offset":N},"id":N}`:
/// resubscribe after a blip and get what was missed.
pub fn encode_subscribe_since(subject: &str, since: Position, id: Option<u64>) -> String {
    let subject = serde_json::to_string(subject).expect("a str always serializes");
    let since = since.to_json();
    match id {
        Some(id) => {
            format!("{{\"op\":\"subscribe\",\"subject\":{subject},\"since\":{since},\"id\":{id}}}")
        }
        None => format!("{{\"op\":\"subscribe\",\"subject\":{subject},\"since\":{since}}}"),
    }
}

/// `{"op":"history","subject":S[,"since":P][,"limit":L],"id":N}`.
pub fn encode_history_request(
    subject: &str,
    since: Option<Position>,
    limit: Option<u64>,
    id: Option<u64>,
) -> String {
    let mut out = format!(
        "{{\"op\":\"history\",\"subject\":{}",
        serde_json::to_string(subject).expect("a str always serializes")
    );
    if let Some(since) = since {
        out.push_str(&format!(",\"since\":{}", since.to_json()));
    }
    end_read_request(out, limit, id)
}

/// Ends a read command (`history`, `presence`): its optional `limit` and
/// `id`, then the closing brace.
fn end_read_request(mut out: String, limit: Option<u64>, id: Option<u64>) -> String {
    if let Some(limit) = limit {
        out.push_str(&format!(",\"limit\":{limit}"));
    }
    if let Some(id) = id {
        out.push_str(&format!(",\"id\":{id}"));
    }
    out.push('}');
    out
}

/// `{"op":"presence","subject":S[,"cursor":C][,"limit":L],"id":N}`.
pub fn encode_presence_request(
    subject: &str,
    cursor: Option<&str>,
    limit: Option<u64>,
    id: Option<u64>,
) -> String {
    let quote = |s: &str| serde_json::to_string(s).expect("a str always serializes");
    let mut out = format!("{{\"op\":\"presence\",\"subject\":{}", quote(subject));
    if let Some(cursor) = cursor {
        out.push_str(&format!(",\"cursor\":{}", quote(cursor)));
    }
    end_read_request(out, limit, id)
}

/// `{"op":"presence_stats","subject":S,"id":N}`.
pub fn encode_presence_stats_request(subject: &str, id: Option<u64>) -> String {
    let subject = serde_json::to_string(subject).expect("a str always serializes");
    match id {
        Some(id) => format!("{{\"op\":\"presence_stats\",\"subject\":{subject},\"id\":{id}}}"),
        None => format!("{{\"op\":\"presence_stats\",\"subject\":{subject}}}"),
    }
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

/// `{"op":"send","data":D,"id":N}`: publishes to the feed of the
/// connection's user; `data_json` must be JSON.
pub fn encode_send(data_json: &str, id: Option<u64>) -> String {
    match id {
        Some(id) => format!("{{\"op\":\"send\",\"data\":{data_json},\"id\":{id}}}"),
        None => format!("{{\"op\":\"send\",\"data\":{data_json}}}"),
    }
}

/// A message from the server, as a client sees it.
#[derive(Debug)]
pub enum ServerMessage<'a> {
    Delivery {
        subject: Cow<'a, str>,
        position: Position,
        data: &'a RawValue,
    },
    Subscribed {
        id: Option<u64>,
        subject: Cow<'a, str>,
        position: Position,
        recovered: Option<bool>,
    },
    History {
        id: Option<u64>,
        subject: Cow<'a, str>,
        position: Position,
        recovered: Option<bool>,
        /// Each one a delivery envelope; parse with [`parse_server_message`].
        publications: Vec<&'a RawValue>,
    },
    Ok {
        id: Option<u64>,
        /// The position a publish got.
        position: Option<Position>,
        /// Connections on the node a publish or send was handed to.
        reached: Option<u64>,
    },
    Pong {
        id: Option<u64>,
    },
    Error {
        id: Option<u64>,
        code: Cow<'a, str>,
        message: Cow<'a, str>,
    },
    /// The last element of a long-poll answer: the cursor to poll from next
    /// (see [`encode_poll_end`] and [`crate::cursor`]).
    Poll {
        since: Cow<'a, str>,
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
    epoch: Option<Epoch>,
    #[serde(default)]
    offset: Option<u64>,
    #[serde(default)]
    recovered: Option<bool>,
    #[serde(default, borrow, deserialize_with = "present")]
    data: Option<&'a RawValue>,
    #[serde(default, borrow)]
    publications: Option<Vec<&'a RawValue>>,
    #[serde(default, borrow)]
    code: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    message: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    since: Option<Cow<'a, str>>,
    #[serde(default)]
    reached: Option<u64>,
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
    let position = || -> Result<Position, ServerMessageError> {
        Ok(Position::new(
            raw.epoch.ok_or_else(|| missing("epoch"))?,
            raw.offset.ok_or_else(|| missing("offset"))?,
        ))
    };
    let subject = || raw.subject.clone().ok_or_else(|| missing("subject"));
    match raw.op.as_ref() {
        "msg" => Ok(ServerMessage::Delivery {
            subject: subject()?,
            position: position()?,
            data: raw.data.ok_or_else(|| missing("data"))?,
        }),
        "subscribed" => Ok(ServerMessage::Subscribed {
            id: raw.id,
            subject: subject()?,
            position: position()?,
            recovered: raw.recovered,
        }),
        "history" => Ok(ServerMessage::History {
            id: raw.id,
            subject: subject()?,
            position: position()?,
            recovered: raw.recovered,
            publications: raw
                .publications
                .clone()
                .ok_or_else(|| missing("publications"))?,
        }),
        "ok" => Ok(ServerMessage::Ok {
            id: raw.id,
            position: raw.epoch.zip(raw.offset).map(|(e, o)| Position::new(e, o)),
            reached: raw.reached,
        }),
        "pong" => Ok(ServerMessage::Pong { id: raw.id }),
        "error" => Ok(ServerMessage::Error {
            id: raw.id,
            code: raw.code.clone().ok_or_else(|| missing("code"))?,
            message: raw.message.clone().unwrap_or_default(),
        }),
        "poll" => Ok(ServerMessage::Poll {
            since: raw.since.clone().ok_or_else(|| missing("since"))?,
        }),
        other => Err(ServerMessageError::UnknownOp(other.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `ALL` is kept by hand; metrics and the docs read it. A variant added to the enum
    /// breaks the build of `every_variant!` below until it is named here, and
    /// then this fails until `ALL` names it too.
    #[test]
    fn all_names_every_error_code() {
        let every = crate::every_variant!(
            ErrorCode:
            InvalidJson,
            UnknownOp,
            MissingField,
            InvalidSubject,
            TooManySubscriptions,
            InvalidPosition,
            PublishFailed,
            Unavailable,
            ReservedSubject,
            NoUser,
            Forbidden,
            InvalidToken,
            AlreadyConnected,
            RateLimited,
            PresenceFull,
            ProxyRefused,
            ProxyUnavailable,
            ProxyBusy,
            TooManyHeld
        );
        assert_eq!(every, ErrorCode::ALL);
    }

    const MAX: usize = subject::DEFAULT_MAX_SUBJECT_LEN;

    #[test]
    fn parses_each_command() {
        let c = parse_command(r#"{"op":"subscribe","subjects":["a","b/c"],"id":7}"#, MAX).unwrap();
        assert!(
            matches!(&c, Command::Subscribe { id: Some(7), subjects, since: None } if subjects == &["a", "b/c"]),
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
        let c = parse_command(
            r#"{"op":"subscribe","subject":"a","since":{"epoch":"00000000000000ff","offset":9},"id":2}"#,
            MAX,
        )
        .unwrap();
        let since = Position::new(Epoch(255), 9);
        assert!(
            matches!(&c, Command::Subscribe { id: Some(2), subjects, since: Some(s) } if subjects == &["a"] && *s == since),
            "{c:?}"
        );
        let c = parse_command(r#"{"op":"history","subject":"a","limit":5}"#, MAX).unwrap();
        assert!(
            matches!(&c, Command::History { id: None, subject, since: None, limit: Some(5) } if subject == "a"),
            "{c:?}"
        );
        let c = parse_command(r#"{"op":"connect","token":"a.b.c","id":8}"#, MAX).unwrap();
        assert!(
            matches!(&c, Command::Connect { id: Some(8), token } if token == "a.b.c"),
            "{c:?}"
        );
        let c = parse_command(r#"{"op":"refresh","token":"d.e.f"}"#, MAX).unwrap();
        assert!(
            matches!(&c, Command::Refresh { id: None, token } if token == "d.e.f"),
            "{c:?}"
        );
        let e = parse_command(r#"{"op":"refresh","id":9}"#, MAX).unwrap_err();
        assert_eq!((e.id, e.code), (Some(9), ErrorCode::MissingField));
    }

    #[test]
    fn null_is_data_like_any_other_json() {
        match parse_command(r#"{"op":"publish","subject":"a","data":null}"#, MAX).unwrap() {
            Command::Publish { data, .. } => assert_eq!(data.get(), "null"),
            other => panic!("{other:?}"),
        }
        let mut out = Vec::new();
        write_publication(&mut out, "a", Position::new(Epoch(1), 1), "null");
        match parse_server_message(std::str::from_utf8(&out).unwrap()).unwrap() {
            ServerMessage::Delivery { data, .. } => assert_eq!(data.get(), "null"),
            other => panic!("{other:?}"),
        }
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
            (
                r#"{"op":"subscribe","subject":"a","since":{"epoch":"x","offset":1},"id":8}"#,
                ErrorCode::InvalidPosition,
                Some(8),
            ),
            (
                r#"{"op":"subscribe","subjects":["a","b"],"since":{"epoch":"0000000000000001","offset":1}}"#,
                ErrorCode::InvalidPosition,
                None,
            ),
            (
                r#"{"op":"history","id":9}"#,
                ErrorCode::MissingField,
                Some(9),
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
    fn publication_layout_is_exact() {
        let mut out = Vec::new();
        let position = Position::new(Epoch(0xbeef), 42);
        write_publication(&mut out, "/p/s1", position, r#""hello""#);
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"op":"msg","subject":"/p/s1","epoch":"000000000000beef","offset":42,"data":"hello"}"#
        );
        assert_eq!(out.len(), publication_len("/p/s1", 42, r#""hello""#));
    }

    #[test]
    fn presence_commands_parse_and_replies_encode() {
        let c = parse_command(
            r#"{"op":"presence","id":3,"subject":"room.1","cursor":"a.1","limit":2}"#,
            MAX,
        )
        .unwrap();
        assert!(matches!(
            &c,
            Command::Presence { id: Some(3), subject, cursor: Some(cursor), limit: Some(2) }
                if subject == "room.1" && cursor == "a.1"
        ));
        let c = parse_command(r#"{"op":"presence_stats","subject":"room.1"}"#, MAX).unwrap();
        assert!(matches!(&c, Command::PresenceStats { id: None, subject } if subject == "room.1"));
        let again = encode_presence_request("room.1", Some("a.1"), Some(2), Some(3));
        assert!(matches!(
            parse_command(&again, MAX).unwrap(),
            Command::Presence { id: Some(3), cursor: Some(cursor), limit: Some(2), .. } if cursor == "a.1"
        ));
        let again = encode_presence_stats_request("room.1", None);
        assert!(matches!(
            parse_command(&again, MAX).unwrap(),
            Command::PresenceStats { id: None, subject } if subject == "room.1"
        ));
        let missing = parse_command(r#"{"op":"presence_stats","id":4}"#, MAX).unwrap_err();
        assert_eq!(
            (missing.id, missing.code),
            (Some(4), ErrorCode::MissingField)
        );
        let members = [
            PresenceMember {
                conn: "n.0.1.1",
                user: Some("7"),
                info: Some(r#"{"name":"ann"}"#),
            },
            PresenceMember {
                conn: "n.0.2.1",
                user: None,
                info: None,
            },
        ];
        assert_eq!(
            encode_presence(Some(3), "room.1", members, Some("n.0.2.1")),
            br#"{"op":"presence","id":3,"subject":"room.1","members":[{"conn":"n.0.1.1","user":"7","info":{"name":"ann"}},{"conn":"n.0.2.1","user":null}],"next":"n.0.2.1"}"#
        );
        assert_eq!(
            encode_presence_change(false, "room.1", members[1]),
            br#"{"op":"leave","subject":"room.1","member":{"conn":"n.0.2.1","user":null}}"#
        );
        assert_eq!(
            encode_presence_stats(None, "room.1", 3, 2),
            r#"{"op":"presence_stats","subject":"room.1","connections":3,"users":2}"#
        );
    }

    #[test]
    fn subscribed_and_history_replies_parse_back() {
        let p = Position::new(Epoch(7), 3);
        let text = encode_subscribed(Some(4), "a", p, Some(true));
        match parse_server_message(&text).unwrap() {
            ServerMessage::Subscribed {
                id,
                subject,
                position,
                recovered,
            } => {
                assert_eq!(
                    (id, subject.as_ref(), position, recovered),
                    (Some(4), "a", p, Some(true))
                );
            }
            other => panic!("{other:?}"),
        }
        let mut one = Vec::new();
        write_publication(&mut one, "a", p, "1");
        let reply = encode_history(None, "a", p, None, [one.as_slice(), one.as_slice()]);
        match parse_server_message(std::str::from_utf8(&reply).unwrap()).unwrap() {
            ServerMessage::History {
                id: None,
                position,
                recovered: None,
                publications,
                ..
            } => {
                assert_eq!(position, p);
                assert_eq!(publications.len(), 2);
                assert!(matches!(
                    parse_server_message(publications[1].get()).unwrap(),
                    ServerMessage::Delivery { position, .. } if position == p
                ));
            }
            other => panic!("{other:?}"),
        }
        let since = encode_subscribe_since("a", p, Some(1));
        assert!(matches!(
            parse_command(&since, MAX).unwrap(),
            Command::Subscribe { since: Some(s), .. } if s == p
        ));
        let history = encode_history_request("a", Some(p), Some(10), Some(2));
        assert!(matches!(
            parse_command(&history, MAX).unwrap(),
            Command::History { since: Some(s), limit: Some(10), id: Some(2), .. } if s == p
        ));
    }

    #[test]
    fn send_publishes_to_the_users_feed_and_feeds_refuse_publish() {
        assert!(matches!(
            parse_command(r#"{"op":"send","id":4,"data":{"x":1}}"#, MAX).unwrap(),
            Command::Send { id: Some(4), data } if data.get() == r#"{"x":1}"#
        ));
        let no_data = parse_command(r#"{"op":"send","id":5}"#, MAX).unwrap_err();
        assert_eq!(
            (no_data.id, no_data.code),
            (Some(5), ErrorCode::MissingField)
        );
        let feed =
            parse_command(r#"{"op":"publish","id":6,"subject":"@17","data":1}"#, MAX).unwrap_err();
        assert_eq!((feed.id, feed.code), (Some(6), ErrorCode::ReservedSubject));
        // Reading a feed is allowed.
        assert!(parse_command(r#"{"op":"subscribe","subjects":["@17"]}"#, MAX).is_ok());
        let ok = encode_published(9, Some(Position::new(Epoch(3), 4)), 12);
        assert!(matches!(
            parse_server_message(&ok).unwrap(),
            ServerMessage::Ok { id: Some(9), position: Some(p), reached: Some(12) }
                if p == Position::new(Epoch(3), 4)
        ));
    }

    #[test]
    fn replies_are_json() {
        for text in [
            encode_ok(1),
            encode_published(1, None, 0),
            encode_published(1, Some(Position::new(Epoch(3), 4)), 7),
            encode_pong(Some(2)),
            encode_pong(None),
            encode_error(Some(3), ErrorCode::UnknownOp, "unknown op \"x\""),
            encode_error(None, ErrorCode::InvalidJson, "line 1"),
            encode_subject_error(None, ErrorCode::Unavailable, "a.b", "redis_busy: \"x\""),
            encode_subject_error(Some(4), ErrorCode::Unavailable, "a", "down"),
        ] {
            serde_json::from_str::<serde_json::Value>(&text).unwrap();
            parse_server_message(&text).unwrap();
        }
    }

    #[test]
    fn http_transport_messages_are_json() {
        assert_eq!(
            encode_close_notice(CloseReason::SlowConsumer),
            r#"{"op":"close","code":4001,"reason":"slow_consumer","reconnect":true}"#
        );
        assert_eq!(
            encode_close_notice(CloseReason::MessageTooBig),
            r#"{"op":"close","code":1009,"reason":"message_too_big","reconnect":false}"#
        );
        let end = encode_poll_end(b"0000000000000003:4,");
        assert_eq!(end, br#"{"op":"poll","since":"0000000000000003:4,"}"#);
        assert!(matches!(
            parse_server_message(std::str::from_utf8(&end).unwrap()).unwrap(),
            ServerMessage::Poll { since } if since == "0000000000000003:4,"
        ));
        let error = encode_http_error("invalid_subject", "a \"quoted\" thing");
        let value: serde_json::Value = serde_json::from_str(&error).unwrap();
        assert_eq!(value["error"]["code"], "invalid_subject");
        assert_eq!(value["error"]["message"], "a \"quoted\" thing");
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
                Command::Subscribe { id: got, subjects: parsed, .. } => {
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

            let text = encode_send(&data, id);
            match parse_command(&text, MAX).unwrap() {
                Command::Send { id: got, data: d } => {
                    prop_assert_eq!(got, id);
                    prop_assert_eq!(d.get(), data.as_str());
                }
                other => prop_assert!(false, "{:?}", other),
            }
        }

        #[test]
        fn deliveries_parse_back(subject in "[A-Za-z0-9/._-]{1,40}", epoch in any::<u64>(), offset in any::<u64>(), n in any::<i64>()) {
            let data = n.to_string();
            let mut out = Vec::new();
            let position = Position::new(Epoch(epoch), offset);
            write_publication(&mut out, &subject, position, &data);
            prop_assert_eq!(out.len(), publication_len(&subject, offset, &data));
            let text = std::str::from_utf8(&out).unwrap();
            match parse_server_message(text).unwrap() {
                ServerMessage::Delivery { subject: s, position: p, data: d } => {
                    prop_assert_eq!(s.as_ref(), subject.as_str());
                    prop_assert_eq!(p, position);
                    prop_assert_eq!(d.get(), data.as_str());
                }
                other => prop_assert!(false, "{:?}", other),
            }
        }
    }
}
