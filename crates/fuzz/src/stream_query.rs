//! What the HTTP transports (Server-Sent Events, streaming, long-poll)
//! read from a request: the query's subjects, `since` and `token`, the
//! `Last-Event-ID` cursor, and a WebSocket upgrade's `?user=` and
//! `?token=`.
//!
//! Input: a settings byte (`max_subscriptions`, whether a body is
//! announced), then text: the query string, and after the first newline,
//! if any, a `Last-Event-ID` value. Properties: a cursor that parses
//! writes back to one no longer than it that parses to the same
//! positions, and a long-poll answer carries it unchanged; a request that
//! parses keeps the limits and, written back as a query, reads the same;
//! every refusal has a status, a metric label and a well-formed response.

use myriad_protocol::cursor::{parse_cursor, write_cursor, CursorError};
use myriad_protocol::handshake::RequestHead;
use myriad_protocol::message::{encode_poll_end, parse_server_message, ServerMessage};
use myriad_protocol::subject;
use myriad_server::transport::http::{parse_stream_request, parse_upgrade_query, RequestError};
use myriad_server::Config;

use crate::support::{assert_http_response, default_config, small_configs};

pub fn check(data: &[u8]) {
    let Some((&settings, text)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(text);
    let (query, last_event_id) = match text.split_once('\n') {
        Some((query, id)) => (query, Some(id)),
        None => (&*text, None),
    };
    let config = &small_configs()[usize::from(settings & 0x0F)];
    let head = RequestHead {
        method: "GET",
        path: &config.sse_path,
        query: Some(query),
        host: Some("localhost"),
        last_event_id,
        has_body: settings & 0x80 != 0,
        ..RequestHead::default()
    };
    check_stream_request(&head, config);
    check_upgrade_query(Some(query));
    check_cursor(last_event_id.unwrap_or(query));
}

/// A cursor, parsed for as many subjects as it has entries and for one more.
fn check_cursor(text: &str) {
    let entries = text.split(',').count();
    for subjects in [entries, entries + 1] {
        match parse_cursor(text, subjects) {
            Ok(positions) => {
                assert_eq!(positions.len(), entries);
                let mut written = Vec::new();
                write_cursor(&positions, &mut written);
                assert!(written.len() <= text.len(), "the written form is the shortest");
                let written = std::str::from_utf8(&written).expect("a cursor is ASCII");
                assert_eq!(parse_cursor(written, entries).as_ref(), Ok(&positions));
                let answer = encode_poll_end(written.as_bytes());
                let answer = std::str::from_utf8(&answer).expect("ASCII");
                match parse_server_message(answer) {
                    Ok(ServerMessage::Poll { since }) => assert_eq!(since, written),
                    other => panic!("a poll's end read back as {other:?}"),
                }
            }
            Err(CursorError::Length { found, expected }) => {
                assert_eq!((found, expected), (entries, subjects));
                assert_ne!(found, expected);
            }
            Err(CursorError::Entry { index, entry }) => {
                assert!(index < entries);
                assert!(entry.chars().count() <= 64, "an error quotes at most 64 chars");
            }
        }
    }
}

/// `parse_stream_request` on `head`: what it accepts keeps the limits and
/// reads back from its own query; what it refuses is answered properly.
pub(crate) fn check_stream_request(head: &RequestHead<'_>, config: &Config) {
    let request = match parse_stream_request(head, config) {
        Ok(request) => request,
        Err(e) => return check_refusal(&e, config),
    };
    let subjects = &request.subjects;
    assert!(!subjects.is_empty() && subjects.len() <= config.max_subscriptions);
    assert_eq!(request.since.len(), subjects.len(), "one position per subject");
    for (i, s) in subjects.iter().enumerate() {
        assert_eq!(subject::validate(s, config.max_subject_len), Ok(()));
        assert!(!subjects[..i].contains(s), "{s:?} listed twice");
    }
    let mut query = form_urlencoded::Serializer::new(String::new());
    for s in subjects {
        query.append_pair("subject", s);
    }
    if request.since.iter().any(Option::is_some) {
        let mut cursor = Vec::new();
        write_cursor(&request.since, &mut cursor);
        query.append_pair("since", std::str::from_utf8(&cursor).expect("ASCII"));
    }
    if let Some(token) = &request.token {
        query.append_pair("token", token);
    }
    let query = query.finish();
    let again = RequestHead {
        method: "GET",
        query: Some(&query),
        ..RequestHead::default()
    };
    assert_eq!(
        parse_stream_request(&again, config).as_ref(),
        Ok(&request),
        "written back as {query:?}"
    );
}

/// A WebSocket upgrade's `?user=` and `?token=`: what parses reads back
/// from its own query.
pub(crate) fn check_upgrade_query(query: Option<&str>) {
    let parsed = match parse_upgrade_query(query) {
        Ok(parsed) => parsed,
        Err(e) => return check_refusal(&e, default_config()),
    };
    let mut again = form_urlencoded::Serializer::new(String::new());
    if let Some(user) = parsed.user {
        again.append_pair("user", &user.to_string());
    }
    if let Some(token) = &parsed.token {
        again.append_pair("token", token);
    }
    let again = again.finish();
    assert_eq!(
        parse_upgrade_query(Some(&again)).as_ref(),
        Ok(&parsed),
        "written back as {again:?}"
    );
}

/// A refusal has a status, a metric label and a well-formed response.
pub(crate) fn check_refusal(e: &RequestError, config: &Config) {
    assert!((400..500).contains(&e.status()), "{e:?}");
    if !matches!(e, RequestError::InvalidToken(_)) {
        assert_eq!(e.label(), format!("request_{}", e.code()));
    }
    assert_http_response(&e.response(config), e.status());
}
