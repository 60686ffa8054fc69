//! The admin API's request bodies and query strings
//! (`myriad_server::admin::body`): publish, publish_as, follow and
//! unfollow, users, and the history and follower-page queries.
//!
//! Input: a byte choosing the endpoint (`'0'` to `'5'` in the kept
//! corpus, for readability), then the body or query. Properties: what
//! parses keeps the endpoint's rules (valid subjects, no feed, user ids in
//! range, a bounded page) and borrows `data` verbatim from the body; written
//! back as JSON or a query it parses to the same request; a refusal is one
//! the endpoint documents.

use std::fmt::Write as _;

use myriad_graph::UserId;
use myriad_protocol::position::Position;
use myriad_protocol::subject;
use myriad_server::admin::body::{
    parse_edges, parse_history_query, parse_page_query, parse_publish, parse_publish_as,
    parse_users, BodyError, Publish, MAX_PAGE,
};

use crate::support::assert_json_within;

const MAX: usize = subject::DEFAULT_MAX_SUBJECT_LEN;

/// One endpoint's reader, checked, and the codes it may refuse with.
struct Endpoint {
    read: fn(&[u8]) -> Result<(), BodyError>,
    refusals: &'static [&'static str],
}

const ENDPOINTS: [Endpoint; 6] = [
    Endpoint {
        read: publish,
        refusals: &[
            "invalid_json",
            "missing_field",
            "invalid_subject",
            "reserved_subject",
        ],
    },
    Endpoint {
        read: publish_as,
        refusals: &["invalid_json", "invalid_user"],
    },
    Endpoint {
        read: edges,
        refusals: &["invalid_json", "invalid_user"],
    },
    Endpoint {
        read: users,
        refusals: &["invalid_json", "invalid_user"],
    },
    Endpoint {
        read: history,
        refusals: &[
            "invalid_query",
            "missing_field",
            "invalid_subject",
            "invalid_position",
        ],
    },
    Endpoint {
        read: page,
        refusals: &["invalid_query"],
    },
];

pub fn check(data: &[u8]) {
    let Some((&endpoint, body)) = data.split_first() else {
        return;
    };
    let endpoint = &ENDPOINTS[usize::from(endpoint) % ENDPOINTS.len()];
    if let Err(e) = (endpoint.read)(body) {
        assert!(endpoint.refusals.contains(&e.code()), "refused with {e:?}");
    }
}

fn publish(body: &[u8]) -> Result<(), BodyError> {
    let publish = parse_publish(body, MAX)?;
    assert!(publish.batch || publish.items.len() == 1);
    let mut items = Vec::new();
    for item in &publish.items {
        assert_eq!(subject::validate(&item.subject, MAX), Ok(()));
        assert!(!subject::is_feed(&item.subject), "publish to a feed");
        assert_json_within(body, item.data);
        items.push(format!(
            "{{\"subject\":{},\"data\":{}}}",
            serde_json::to_string(&item.subject).expect("a str serializes"),
            item.data.get()
        ));
    }
    let again = match publish.batch {
        true => format!("{{\"messages\":[{}]}}", items.join(",")),
        false => items.pop().expect("one item"),
    };
    let reparsed = parse_publish(again.as_bytes(), MAX).expect("written back, it parses");
    assert_eq!(shape(&reparsed), shape(&publish), "written back as {again}");
    Ok(())
}

/// A publish as comparable values.
fn shape<'a>(publish: &'a Publish<'_>) -> (bool, Vec<(&'a str, &'a str)>) {
    let items = publish.items.iter();
    let items = items.map(|i| (i.subject.as_ref(), i.data.get())).collect();
    (publish.batch, items)
}

fn publish_as(body: &[u8]) -> Result<(), BodyError> {
    let request = parse_publish_as(body)?;
    assert!(request.user.get() <= UserId::MAX);
    assert_json_within(body, request.data);
    let again = format!(
        "{{\"user\":{},\"data\":{}}}",
        request.user,
        request.data.get()
    );
    let reparsed = parse_publish_as(again.as_bytes()).expect("written back, it parses");
    assert_eq!(
        (reparsed.user, reparsed.data.get()),
        (request.user, request.data.get())
    );
    Ok(())
}

fn edges(body: &[u8]) -> Result<(), BodyError> {
    let edges = parse_edges(body).inspect_err(|e| names_its_entry(e, "edges["))?;
    let mut again = String::from("{\"edges\":[");
    for (i, edge) in edges.iter().enumerate() {
        let comma = if i > 0 { "," } else { "" };
        write!(again, "{comma}[{},{}]", edge.follower, edge.followee).expect("to a String");
    }
    again.push_str("]}");
    assert_eq!(parse_edges(again.as_bytes()).ok(), Some(edges), "{again}");
    Ok(())
}

fn users(body: &[u8]) -> Result<(), BodyError> {
    let users = parse_users(body).inspect_err(|e| names_its_entry(e, "users["))?;
    let list: Vec<String> = users.iter().map(UserId::to_string).collect();
    let again = format!("{{\"users\":[{}]}}", list.join(","));
    assert_eq!(parse_users(again.as_bytes()).ok(), Some(users), "{again}");
    Ok(())
}

/// A refused id in a list says which entry it was.
fn names_its_entry(error: &BodyError, list: &str) {
    if let BodyError::InvalidUser(message) = error {
        assert!(message.starts_with(list), "{message}");
    }
}

fn history(query: &[u8]) -> Result<(), BodyError> {
    let parsed = parse_history_query(&String::from_utf8_lossy(query), MAX)?;
    assert_eq!(subject::validate(&parsed.subject, MAX), Ok(()));
    let mut again = form_urlencoded::Serializer::new(String::new());
    again.append_pair("subject", &parsed.subject);
    if parsed.limit != usize::MAX {
        again.append_pair("limit", &parsed.limit.to_string());
    }
    if let Some(Position { epoch, offset }) = parsed.since {
        again.append_pair("epoch", &epoch.to_string());
        again.append_pair("offset", &offset.to_string());
    }
    let again = again.finish();
    let reparsed = parse_history_query(&again, MAX).expect("written back, it parses");
    assert_eq!(
        (&reparsed.subject, reparsed.since, reparsed.limit),
        (&parsed.subject, parsed.since, parsed.limit),
        "written back as {again}"
    );
    Ok(())
}

fn page(query: &[u8]) -> Result<(), BodyError> {
    let parsed = parse_page_query(&String::from_utf8_lossy(query))?;
    assert!((1..=MAX_PAGE).contains(&parsed.limit));
    let mut again = format!("user={}&limit={}", parsed.user, parsed.limit);
    if let Some(after) = parsed.after {
        write!(again, "&after={after}").expect("to a String");
    }
    assert_eq!(parse_page_query(&again).ok(), Some(parsed), "{again}");
    Ok(())
}
