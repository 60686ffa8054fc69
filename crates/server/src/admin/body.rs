//! The admin API's request bodies and query strings, read into typed
//! requests: bytes or a query string in, a request or a [`BodyError`] out.
//!
//! Pure, so the handlers and the fuzz targets (`crates/fuzz`) run the same
//! code. It must not read the node's state: whether a user is known, the
//! API key, body size limits and what the engine does with a request are
//! the handlers' business, after parsing.

use std::borrow::Cow;
use std::sync::Arc;

use myriad_graph::{Edge, UserId};
use myriad_protocol::message::present;
use myriad_protocol::position::{Epoch, Position};
use myriad_protocol::subject::{self, SubjectError};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Number;
use thiserror::Error;

use crate::engine::HistoryQuery;

/// The default and the largest page of `/api/followers` and `/api/following`.
pub const DEFAULT_PAGE: usize = 1_000;
pub const MAX_PAGE: usize = 10_000;

/// Why a body or query was refused. Each variant has a stable code (the
/// `code` of the error body); all are answered with 400.
#[derive(Debug, Error)]
pub enum BodyError {
    /// Not JSON, or JSON of another shape than the endpoint takes.
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    /// A field the request needs is missing; the text says which.
    #[error("{0}")]
    MissingField(&'static str),
    #[error("{0}")]
    InvalidSubject(#[from] SubjectError),
    /// A publish to a user's feed, which only `/api/publish_as` writes.
    #[error("{0}: a user's feed takes only /api/publish_as")]
    ReservedSubject(String),
    /// A number that is not a user id; the text names the entry.
    #[error("{0}")]
    InvalidUser(String),
    /// A query parameter that is unknown or not of its type.
    #[error("{0}")]
    InvalidQuery(String),
    /// A history read with `epoch` but no `offset`, or the other way round.
    #[error("epoch and offset go together")]
    InvalidPosition,
}

impl BodyError {
    /// The stable code of the error body.
    pub fn code(&self) -> &'static str {
        match self {
            BodyError::Json(_) => "invalid_json",
            BodyError::MissingField(_) => "missing_field",
            BodyError::InvalidSubject(_) => "invalid_subject",
            BodyError::ReservedSubject(_) => "reserved_subject",
            BodyError::InvalidUser(_) => "invalid_user",
            BodyError::InvalidQuery(_) => "invalid_query",
            BodyError::InvalidPosition => "invalid_position",
        }
    }
}

/// One publication of `POST /api/publish`.
#[derive(Debug, Deserialize)]
pub struct PublishItem<'a> {
    #[serde(borrow)]
    pub subject: Cow<'a, str>,
    #[serde(borrow)]
    pub data: &'a RawValue,
}

/// `POST /api/publish`: one item, or a batch published all or nothing.
#[derive(Debug)]
pub struct Publish<'a> {
    pub items: Vec<PublishItem<'a>>,
    /// Sent as `{"messages":[…]}`: answered with a result per item.
    pub batch: bool,
}

/// `{"subject":..,"data":..}` or `{"messages":[{"subject":..,"data":..},..]}`.
#[derive(Deserialize)]
struct RawPublish<'a> {
    #[serde(default, borrow)]
    subject: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "present")]
    data: Option<&'a RawValue>,
    #[serde(default, borrow)]
    messages: Option<Vec<PublishItem<'a>>>,
}

/// Reads a publish body. Every subject is checked, so a request that
/// parses can be published whole.
pub fn parse_publish(body: &[u8], max_subject_len: usize) -> Result<Publish<'_>, BodyError> {
    let publish = match serde_json::from_slice(body)? {
        RawPublish {
            messages: Some(items),
            subject: None,
            data: None,
        } => Publish { items, batch: true },
        RawPublish {
            messages: None,
            subject: Some(subject),
            data: Some(data),
        } => Publish {
            items: vec![PublishItem { subject, data }],
            batch: false,
        },
        _ => {
            return Err(BodyError::MissingField(
                "expected {\"subject\",\"data\"} or {\"messages\":[...]}",
            ))
        }
    };
    for item in &publish.items {
        subject::validate(&item.subject, max_subject_len)?;
        if subject::is_feed(&item.subject) {
            return Err(BodyError::ReservedSubject(item.subject.to_string()));
        }
    }
    Ok(publish)
}

/// `POST /api/publish_as`: what `user`'s followers and own connections get.
#[derive(Debug)]
pub struct PublishAs<'a> {
    pub user: UserId,
    pub data: &'a RawValue,
}

/// `data` is required and may be any JSON, `null` included; a missing one
/// is serde's "missing field" (`invalid_json`).
#[derive(Deserialize)]
struct RawPublishAs<'a> {
    user: Number,
    #[serde(borrow)]
    data: &'a RawValue,
}

/// Reads a `publish_as` body, `{"user": X, "data": …}`.
pub fn parse_publish_as(body: &[u8]) -> Result<PublishAs<'_>, BodyError> {
    let raw: RawPublishAs<'_> = serde_json::from_slice(body)?;
    let user = user_of(&raw.user, "user")?;
    Ok(PublishAs {
        user,
        data: raw.data,
    })
}

#[derive(Deserialize)]
struct RawEdges {
    edges: Vec<(Number, Number)>,
}

/// Reads a follow or unfollow body, `{"edges": [[follower, followee], …]}`.
pub fn parse_edges(body: &[u8]) -> Result<Vec<Edge>, BodyError> {
    let raw: RawEdges = serde_json::from_slice(body)?;
    raw.edges
        .iter()
        .enumerate()
        .map(|(index, (follower, followee))| {
            let what = format!("edges[{index}]");
            Ok(Edge::new(
                user_of(follower, &what)?,
                user_of(followee, &what)?,
            ))
        })
        .collect()
}

#[derive(Deserialize)]
struct RawUsers {
    users: Vec<Number>,
}

/// Reads a `POST /api/users` body, `{"users": [...]}`.
pub fn parse_users(body: &[u8]) -> Result<Vec<UserId>, BodyError> {
    let raw: RawUsers = serde_json::from_slice(body)?;
    raw.users
        .iter()
        .enumerate()
        .map(|(index, number)| user_of(number, &format!("users[{index}]")))
        .collect()
}

/// A JSON number as a user id; `what` names it in the refusal.
fn user_of(number: &Number, what: &str) -> Result<UserId, BodyError> {
    let id = number.as_u64().and_then(|id| UserId::new(id).ok());
    id.ok_or_else(|| {
        BodyError::InvalidUser(format!(
            "{what}: {number} is not a user id (0 to {})",
            UserId::MAX
        ))
    })
}

/// Reads the query string of `GET /api/history?subject=S[&limit=N][&epoch=E&offset=O]`.
pub fn parse_history_query(query: &str, max_subject_len: usize) -> Result<HistoryQuery, BodyError> {
    let mut subject = None;
    let mut limit = usize::MAX;
    let (mut epoch, mut offset) = (None, None);
    // Percent-decoded: subjects may hold '/', '&', '+' or '='.
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        let bad = |what: &dyn std::fmt::Display| BodyError::InvalidQuery(format!("{key}: {what}"));
        match key.as_ref() {
            "subject" => subject = Some(value.into_owned()),
            "limit" => limit = value.parse().map_err(|_| bad(&"not a number"))?,
            "epoch" => epoch = Some(value.parse::<Epoch>().map_err(|e| bad(&e))?),
            "offset" => offset = Some(value.parse::<u64>().map_err(|_| bad(&"not a number"))?),
            _ => return Err(bad(&"unknown parameter")),
        }
    }
    let subject = subject.ok_or(BodyError::MissingField("subject is required"))?;
    subject::validate(&subject, max_subject_len)?;
    let since = match (epoch, offset) {
        (Some(epoch), Some(offset)) => Some(Position::new(epoch, offset)),
        (None, None) => None,
        _ => return Err(BodyError::InvalidPosition),
    };
    Ok(HistoryQuery {
        subject: Arc::from(subject),
        since,
        limit,
    })
}

/// One page of `GET /api/followers` or `/api/following`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageQuery {
    pub user: UserId,
    /// Only users above this one: the `next` of the previous page.
    pub after: Option<UserId>,
    /// 1 to [`MAX_PAGE`].
    pub limit: usize,
}

/// Reads the query string of a paged read, `user=X[&after=Y][&limit=N]`.
pub fn parse_page_query(query: &str) -> Result<PageQuery, BodyError> {
    let (mut user, mut after, mut limit) = (None, None, DEFAULT_PAGE);
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        let bad = |e: &dyn std::fmt::Display| BodyError::InvalidQuery(format!("{key}: {e}"));
        match key.as_ref() {
            "user" => user = Some(value.parse::<UserId>().map_err(|e| bad(&e))?),
            "after" => after = Some(value.parse::<UserId>().map_err(|e| bad(&e))?),
            "limit" => {
                limit = value.parse().map_err(|e| bad(&e))?;
                if !(1..=MAX_PAGE).contains(&limit) {
                    return Err(bad(&format!("between 1 and {MAX_PAGE}")));
                }
            }
            _ => return Err(bad(&"unknown parameter")),
        }
    }
    let user = user.ok_or_else(|| BodyError::InvalidQuery("user is required".to_owned()))?;
    Ok(PageQuery { user, after, limit })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_queries_need_a_user_and_bound_the_page() {
        let page = parse_page_query("user=3&after=10&limit=5").unwrap();
        assert_eq!(
            (page.user.get(), page.after.map(UserId::get), page.limit),
            (3, Some(10), 5)
        );
        assert_eq!(parse_page_query("user=3").unwrap().limit, DEFAULT_PAGE);
        for bad in [
            "",
            "after=1",
            "user=x",
            "user=1&limit=0",
            "user=1&limit=10001",
            "user=1&z=2",
        ] {
            let e = parse_page_query(bad).unwrap_err();
            assert_eq!(e.code(), "invalid_query", "{bad:?}");
        }
    }

    #[test]
    fn each_bad_body_has_its_code() {
        let cases: [(&[u8], &str); 7] = [
            (b"{", "invalid_json"),
            (b"{\"subject\":\"a\"}", "missing_field"),
            (b"{\"subject\":\"a b\",\"data\":1}", "invalid_subject"),
            (b"{\"subject\":\"@1\",\"data\":1}", "reserved_subject"),
            (
                b"{\"messages\":[{\"subject\":\"a\",\"data\":1}],\"subject\":\"a\"}",
                "missing_field",
            ),
            (b"{\"messages\":[{\"subject\":\"a\"}]}", "invalid_json"),
            (b"1", "invalid_json"),
        ];
        for (body, code) in cases {
            let e = parse_publish(body, 128).unwrap_err();
            assert_eq!(e.code(), code, "{}", String::from_utf8_lossy(body));
        }
        let one = parse_publish(b"{\"subject\":\"a\",\"data\":null}", 128).unwrap();
        assert_eq!((one.items.len(), one.batch), (1, false));
        assert_eq!(one.items[0].data.get(), "null");
        assert_eq!(
            parse_publish_as(b"{\"user\":1}").unwrap_err().code(),
            "invalid_json"
        );
        let null = parse_publish_as(b"{\"user\":1,\"data\":null}").unwrap();
        assert_eq!(null.data.get(), "null");
        assert_eq!(
            parse_publish_as(b"{\"user\":-1,\"data\":2}")
                .unwrap_err()
                .code(),
            "invalid_user"
        );
        let e = parse_edges(b"{\"edges\":[[1,2],[3,1.5]]}").unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("edges[1]: 1.5 is not a user id (0 to {})", UserId::MAX)
        );
        assert_eq!(parse_users(b"{\"users\":[0,7]}").unwrap().len(), 2);
    }

    #[test]
    fn history_queries() {
        let q = parse_history_query("subject=a%2Fb&limit=3&epoch=00000000000000ff&offset=9", 128)
            .unwrap();
        assert_eq!(&*q.subject, "a/b");
        assert_eq!(q.limit, 3);
        assert_eq!(q.since, Some(Position::new(Epoch(255), 9)));
        for (bad, code) in [
            ("", "missing_field"),
            ("subject=a&x=1", "invalid_query"),
            ("subject=a&limit=-1", "invalid_query"),
            ("subject=a&epoch=00000000000000ff", "invalid_position"),
            ("subject=a%20b", "invalid_subject"),
        ] {
            assert_eq!(
                parse_history_query(bad, 128).unwrap_err().code(),
                code,
                "{bad:?}"
            );
        }
    }
}
