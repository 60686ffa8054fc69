//! The follow graph's admin API: send as a user, follow and unfollow in
//! batches, register users, and read followers and followings page by page.
//!
//! Every refusal names its entry and leaves the graph as it was: a batch
//! is checked whole before the keeper applies it, and the store applies it
//! in one transaction. A follow or unfollow is answered once every worker
//! holding a connection of the follower has applied it, so a send made
//! after the answer goes by the new graph.

use std::borrow::Cow;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use myriad_graph::{Edge, StoreError, UserId};
use myriad_protocol::message::present;
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;
use serde_json::Number;

use super::{
    bad_json, error_reply, json_reply, publish_items, published_json, read_body, HttpReply,
    PublishItem,
};
use crate::feeds::{feed_subject, Direction, FeedsError, Relation};
use crate::hub::Wakeups;
use crate::metrics::ErrorKind;
use crate::worker::Shared;

/// How long a follow waits for workers to apply it before answering 503.
const SETTLE_WAIT: Duration = Duration::from_secs(5);

/// The default and the largest page of `/api/followers` and `/api/following`.
const DEFAULT_PAGE: usize = 1_000;
const MAX_PAGE: usize = 10_000;

/// A refusal: counted under `graph_<code>` and answered with `status`.
fn refuse(shared: &Shared, status: StatusCode, code: &'static str, message: &str) -> HttpReply {
    let label = ErrorKind::GRAPH_LABELS
        .iter()
        .find(|l| l.strip_prefix("graph_") == Some(code))
        .expect("every graph refusal has a label");
    shared.metrics.error(ErrorKind::Graph(label));
    error_reply(status, code, message)
}

/// A JSON number as a user id; `what` names it in the refusal.
fn user_of(number: &Number, what: &str) -> Result<UserId, String> {
    let id = number.as_u64().and_then(|id| UserId::new(id).ok());
    id.ok_or_else(|| format!("{what}: {number} is not a user id (0 to {})", UserId::MAX))
}

fn invalid_user(shared: &Shared, message: &str) -> HttpReply {
    refuse(shared, StatusCode::BAD_REQUEST, "invalid_user", message)
}

/// The answer to a store that refused or failed.
fn store_refusal(shared: &Shared, error: &FeedsError) -> HttpReply {
    let message = error.to_string();
    match error {
        FeedsError::Store(StoreError::SelfFollow { .. }) => {
            refuse(shared, StatusCode::BAD_REQUEST, "self_follow", &message)
        }
        FeedsError::Store(StoreError::FollowingLimit { .. }) => refuse(
            shared,
            StatusCode::UNPROCESSABLE_ENTITY,
            "following_limit",
            &message,
        ),
        FeedsError::Store(StoreError::Backend(_)) | FeedsError::Stopped => refuse(
            shared,
            StatusCode::SERVICE_UNAVAILABLE,
            "store_failed",
            &message,
        ),
    }
}

#[derive(Deserialize)]
struct PublishAsRequest<'a> {
    user: Number,
    #[serde(borrow, deserialize_with = "present")]
    data: Option<&'a RawValue>,
}

/// `POST /api/publish_as {"user": X, "data": …}`: what X's followers and
/// X's own connections receive, answered with how many were reached.
pub(super) async fn publish_as(req: Request<Incoming>, shared: &Shared) -> HttpReply {
    let body = match read_body(req, shared).await {
        Ok(body) => body,
        Err(reply) => return reply,
    };
    let request: PublishAsRequest<'_> = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad_json(shared, &e),
    };
    let Some(data) = request.data else {
        shared.metrics.error(ErrorKind::ApiBadRequest);
        return error_reply(StatusCode::BAD_REQUEST, "missing_field", "data is required");
    };
    let user = match user_of(&request.user, "user") {
        Ok(user) => user,
        Err(message) => return invalid_user(shared, &message),
    };
    if !shared.feeds.known.contains(user) {
        let message = format!("user {user} is not in the follow graph");
        return refuse(shared, StatusCode::NOT_FOUND, "unknown_user", &message);
    }
    let item = PublishItem {
        subject: Cow::Owned(feed_subject(user)),
        data,
    };
    shared.metrics.feed_send();
    let mut wakeups = Wakeups::default();
    let outcome = publish_items(std::slice::from_ref(&item), shared, &mut wakeups).await;
    shared.hub.wake(wakeups);
    match outcome {
        Ok(results) => json_reply(StatusCode::OK, &published_json(&results[0], "reached")),
        Err(reply) => reply,
    }
}

#[derive(Deserialize)]
struct EdgesRequest {
    edges: Vec<(Number, Number)>,
}

/// `POST /api/follow` and `/api/unfollow` with `{"edges": [[follower,
/// followee], …]}`: applied whole or not at all, idempotent.
pub(super) async fn change(
    req: Request<Incoming>,
    shared: &Shared,
    direction: Direction,
) -> HttpReply {
    let body = match read_body(req, shared).await {
        Ok(body) => body,
        Err(reply) => return reply,
    };
    let request: EdgesRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad_json(shared, &e),
    };
    let mut edges = Vec::with_capacity(request.edges.len());
    for (index, (follower, followee)) in request.edges.iter().enumerate() {
        let what = format!("edges[{index}]");
        let edge =
            user_of(follower, &what).and_then(|a| Ok(Edge::new(a, user_of(followee, &what)?)));
        match edge {
            Ok(edge) => edges.push(edge),
            Err(message) => return invalid_user(shared, &message),
        }
    }
    let applied = match shared.feeds.change(direction, edges).await {
        Ok(applied) => applied,
        Err(e) => return store_refusal(shared, &e),
    };
    shared.metrics.graph_changed(direction, applied.changed);
    if tokio::time::timeout(SETTLE_WAIT, applied.settled)
        .await
        .is_err()
    {
        let message = "stored, but connected followers' workers did not apply it in time";
        return refuse(
            shared,
            StatusCode::SERVICE_UNAVAILABLE,
            "not_settled",
            message,
        );
    }
    let key = match direction {
        Direction::Follow => "added",
        Direction::Unfollow => "removed",
    };
    json_reply(StatusCode::OK, &json!({ key: applied.changed }))
}

#[derive(Deserialize)]
struct UsersRequest {
    users: Vec<Number>,
}

/// `POST /api/users {"users": [...]}`: makes users known without edges.
pub(super) async fn add_users(req: Request<Incoming>, shared: &Shared) -> HttpReply {
    let body = match read_body(req, shared).await {
        Ok(body) => body,
        Err(reply) => return reply,
    };
    let request: UsersRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad_json(shared, &e),
    };
    let mut users = Vec::with_capacity(request.users.len());
    for (index, number) in request.users.iter().enumerate() {
        match user_of(number, &format!("users[{index}]")) {
            Ok(user) => users.push(user),
            Err(message) => return invalid_user(shared, &message),
        }
    }
    match shared.feeds.add_users(users).await {
        Ok(added) => json_reply(StatusCode::OK, &json!({ "added": added })),
        Err(e) => store_refusal(shared, &e),
    }
}

/// `GET /api/followers?user=X[&after=Y][&limit=N]` (and `/api/following`):
/// one page, ascending; `next` is the `after` of the next page, or null.
pub(super) async fn read(req: Request<Incoming>, shared: &Shared, relation: Relation) -> HttpReply {
    let (user, after, limit) = match page_query(req.uri().query().unwrap_or("")) {
        Ok(query) => query,
        Err(message) => {
            shared.metrics.error(ErrorKind::ApiBadRequest);
            return error_reply(StatusCode::BAD_REQUEST, "invalid_query", &message);
        }
    };
    if !shared.feeds.known.contains(user) {
        let message = format!("user {user} is not in the follow graph");
        return refuse(shared, StatusCode::NOT_FOUND, "unknown_user", &message);
    }
    match shared.feeds.read(relation, user, after, limit).await {
        Ok(page) => {
            // A full page may have more after it; a short one is the last.
            let next = page.last().filter(|_| page.len() == limit).map(|u| u.get());
            let key = match relation {
                Relation::Followers => "followers",
                Relation::Following => "following",
            };
            let ids: Vec<u64> = page.iter().map(|u| u.get()).collect();
            json_reply(
                StatusCode::OK,
                &json!({"user": user.get(), key: ids, "next": next}),
            )
        }
        Err(e) => store_refusal(shared, &e),
    }
}

/// The user, `after` and page size of a paged read.
fn page_query(query: &str) -> Result<(UserId, Option<UserId>, usize), String> {
    let (mut user, mut after, mut limit) = (None, None, DEFAULT_PAGE);
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        let bad = |e: &dyn std::fmt::Display| format!("{key}: {e}");
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
    Ok((user.ok_or("user is required")?, after, limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_queries_need_a_user_and_bound_the_page() {
        let (user, after, limit) = page_query("user=3&after=10&limit=5").unwrap();
        assert_eq!(
            (user.get(), after.map(UserId::get), limit),
            (3, Some(10), 5)
        );
        assert_eq!(page_query("user=3").unwrap().2, DEFAULT_PAGE);
        for bad in [
            "",
            "after=1",
            "user=x",
            "user=1&limit=0",
            "user=1&limit=10001",
            "user=1&z=2",
        ] {
            assert!(page_query(bad).is_err(), "{bad:?}");
        }
    }
}
