//! The admin API's presence reads: `GET /api/presence` (one page of a
//! subject's members) and `GET /api/presence_stats` (its counts), the same
//! documents as the client commands' replies, asked of the engine like
//! `/api/history`.

use std::sync::Arc;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use myriad_protocol::message::encode_presence_stats;
use myriad_protocol::subject;

use super::body::BodyError;
use super::{error_reply, json_bytes_reply, refuse_body, HttpReply, NO_ANSWER};
use crate::engine::{EngineError, PresenceQuery, Reply};
use crate::hub::Wakeups;
use crate::shared::Shared;

/// `GET /api/presence?subject=S[&cursor=C][&limit=N]`.
pub async fn read(req: Request<Incoming>, shared: &Shared) -> HttpReply {
    let (subject, cursor, limit) = match parse_query(req.uri().query().unwrap_or(""), shared) {
        Ok(query) => query,
        Err(e) => return refuse_body(shared, &e),
    };
    let cap = shared.presence.policy_for(&subject).max_members;
    let query = PresenceQuery {
        subject,
        after: cursor,
        limit: limit.map_or(cap, |l| l.min(cap)),
    };
    let (tx, answer) = tokio::sync::oneshot::channel();
    let mut wakeups = Wakeups::default();
    shared.engine.presence(query, Reply::Task(tx), &mut wakeups);
    shared.hub.wake(wakeups);
    match answer.await {
        Ok(Ok(page)) => {
            let body = page.reply(None, shared.config.max_http_body);
            json_bytes_reply(StatusCode::OK, Bytes::from(body))
        }
        Ok(Err(e)) => unavailable(&e),
        Err(_) => error_reply(StatusCode::SERVICE_UNAVAILABLE, "unavailable", NO_ANSWER),
    }
}

/// `GET /api/presence_stats?subject=S`.
pub async fn stats(req: Request<Incoming>, shared: &Shared) -> HttpReply {
    let subject = match parse_query(req.uri().query().unwrap_or(""), shared) {
        Ok((subject, None, None)) => subject,
        Ok(_) => {
            let e = BodyError::InvalidQuery("only subject is taken".into());
            return refuse_body(shared, &e);
        }
        Err(e) => return refuse_body(shared, &e),
    };
    let (tx, answer) = tokio::sync::oneshot::channel();
    let mut wakeups = Wakeups::default();
    shared
        .engine
        .presence_stats(subject, Reply::Task(tx), &mut wakeups);
    shared.hub.wake(wakeups);
    match answer.await {
        Ok(Ok(s)) => {
            let body = encode_presence_stats(None, &s.subject, s.connections, s.users);
            json_bytes_reply(StatusCode::OK, Bytes::from(body))
        }
        Ok(Err(e)) => unavailable(&e),
        Err(_) => error_reply(StatusCode::SERVICE_UNAVAILABLE, "unavailable", NO_ANSWER),
    }
}

fn unavailable(e: &EngineError) -> HttpReply {
    error_reply(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        &e.to_string(),
    )
}

type Query = (Arc<str>, Option<Arc<str>>, Option<usize>);

/// `subject=S[&cursor=C][&limit=N]`, percent-decoded; the subject must keep
/// presence.
fn parse_query(query: &str, shared: &Shared) -> Result<Query, BodyError> {
    let (mut subject, mut cursor, mut limit) = (None, None, None);
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        let bad = |what: &str| BodyError::InvalidQuery(format!("{key}: {what}"));
        match key.as_ref() {
            "subject" => subject = Some(value.into_owned()),
            "cursor" => cursor = Some(Arc::from(value.as_ref())),
            "limit" => limit = Some(value.parse().map_err(|_| bad("not a number"))?),
            _ => return Err(bad("unknown parameter")),
        }
    }
    let subject = subject.ok_or(BodyError::MissingField("subject is required"))?;
    subject::validate(&subject, shared.config.max_subject_len)?;
    if !shared.presence.policy_for(&subject).on {
        return Err(BodyError::InvalidQuery(format!(
            "subject: presence is off in {subject:?}'s namespace"
        )));
    }
    Ok((Arc::from(subject), cursor, limit))
}
