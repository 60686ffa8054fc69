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
use myriad_graph::StoreError;
use serde_json::json;

use super::body::{self, PageQuery, PublishAs};
use super::{
    error_reply, json_reply, publish_items, published_json, read_body, refuse_body, HttpReply,
    PublishItem,
};
use crate::feeds::{feed_subject, Direction, FeedsError, Relation};
use crate::hub::Wakeups;
use crate::metrics::ErrorKind;
use crate::shared::Shared;

/// How long a follow waits for workers to apply it before answering 503.
const SETTLE_WAIT: Duration = Duration::from_secs(5);

/// A refusal: counted under `graph_<code>` and answered with `status`.
fn refuse(shared: &Shared, status: StatusCode, code: &'static str, message: &str) -> HttpReply {
    let label = ErrorKind::GRAPH_LABELS
        .iter()
        .find(|l| l.strip_prefix("graph_") == Some(code))
        .expect("every graph refusal has a label");
    shared.metrics.error(ErrorKind::Graph(label));
    error_reply(status, code, message)
}

/// The refusal of an id that is not a user id.
pub(super) fn invalid_user(shared: &Shared, message: &str) -> HttpReply {
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
        FeedsError::Store(
            StoreError::Backend(_)
            | StoreError::Config(_)
            | StoreError::Unreachable(_)
            | StoreError::NoAnswer(_)
            | StoreError::Busy
            | StoreError::LeaseLost,
        )
        | FeedsError::Stopped => refuse(
            shared,
            StatusCode::SERVICE_UNAVAILABLE,
            "store_failed",
            &message,
        ),
    }
}

/// `POST /api/publish_as {"user": X, "data": …}`: what X's followers and
/// X's own connections receive, answered with how many were reached.
pub(super) async fn publish_as(req: Request<Incoming>, shared: &Shared) -> HttpReply {
    let payload = match read_body(req, shared).await {
        Ok(payload) => payload,
        Err(reply) => return reply,
    };
    let PublishAs { user, data } = match body::parse_publish_as(&payload) {
        Ok(request) => request,
        Err(e) => return refuse_body(shared, &e),
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

/// `POST /api/follow` and `/api/unfollow` with `{"edges": [[follower,
/// followee], …]}`: applied whole or not at all, idempotent.
pub(super) async fn change(
    req: Request<Incoming>,
    shared: &Shared,
    direction: Direction,
) -> HttpReply {
    let payload = match read_body(req, shared).await {
        Ok(payload) => payload,
        Err(reply) => return reply,
    };
    let edges = match body::parse_edges(&payload) {
        Ok(edges) => edges,
        Err(e) => return refuse_body(shared, &e),
    };
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

/// `POST /api/users {"users": [...]}`: makes users known without edges.
pub(super) async fn add_users(req: Request<Incoming>, shared: &Shared) -> HttpReply {
    let payload = match read_body(req, shared).await {
        Ok(payload) => payload,
        Err(reply) => return reply,
    };
    let users = match body::parse_users(&payload) {
        Ok(users) => users,
        Err(e) => return refuse_body(shared, &e),
    };
    match shared.feeds.add_users(users).await {
        Ok(added) => json_reply(StatusCode::OK, &json!({ "added": added })),
        Err(e) => store_refusal(shared, &e),
    }
}

/// `GET /api/followers?user=X[&after=Y][&limit=N]` (and `/api/following`):
/// one page, ascending; `next` is the `after` of the next page, or null.
pub(super) async fn read(req: Request<Incoming>, shared: &Shared, relation: Relation) -> HttpReply {
    let PageQuery { user, after, limit } =
        match body::parse_page_query(req.uri().query().unwrap_or("")) {
            Ok(query) => query,
            Err(e) => return refuse_body(shared, &e),
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
