//! Protocol v1: the commands a client sends in text frames
//! (`message::parse_command`), and the server messages a client reads
//! (`message::parse_server_message`, used by the bench and `myriad sub`).
//!
//! Input: the text of one message. Properties: a command that parses has
//! valid subjects, borrows its `data` verbatim from the text as JSON, and
//! encoded again by the client encoders parses to the same command; a
//! refused command's error reply is JSON that reads back with its id and
//! code; a delivery a client reads re-encodes to the same delivery.

use myriad_protocol::message::{
    encode_error, encode_history_request, encode_presence_request, encode_presence_stats_request,
    encode_publish, encode_send, encode_subscribe,
    encode_subscribe_since, encode_unsubscribe, parse_command, parse_server_message,
    write_publication, Command, ServerMessage,
};
use myriad_protocol::subject::{self, DEFAULT_MAX_SUBJECT_LEN};

use crate::support::assert_json_within;

const MAX: usize = DEFAULT_MAX_SUBJECT_LEN;

pub fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    check_command(&text);
    check_server_message(&text);
}

fn check_command(text: &str) {
    let command = match parse_command(text, MAX) {
        Ok(command) => command,
        Err(e) => {
            let reply = encode_error(e.id, e.code, &e.detail);
            match parse_server_message(&reply) {
                Ok(ServerMessage::Error { id, code, .. }) => {
                    assert_eq!((id, code.as_ref()), (e.id, e.code.as_str()));
                }
                other => panic!("error reply {reply:?} read back as {other:?}"),
            }
            return;
        }
    };
    let again = match &command {
        Command::Subscribe {
            id,
            subjects,
            since,
        } => {
            assert!(!subjects.is_empty());
            subjects.iter().for_each(|s| assert_valid(s));
            match since {
                Some(since) => {
                    assert_eq!(subjects.len(), 1, "since with one subject only");
                    encode_subscribe_since(&subjects[0], *since, *id)
                }
                None => encode_subscribe(&strs(subjects), *id),
            }
        }
        Command::Unsubscribe { id, subjects } => {
            assert!(!subjects.is_empty());
            subjects.iter().for_each(|s| assert_valid(s));
            encode_unsubscribe(&strs(subjects), *id)
        }
        Command::Publish { id, subject, data } => {
            assert_valid(subject);
            assert!(!subject::is_feed(subject), "publish to a feed");
            assert_json_within(text.as_bytes(), data);
            encode_publish(subject, data.get(), *id)
        }
        Command::Send { id, data } => {
            assert_json_within(text.as_bytes(), data);
            encode_send(data.get(), *id)
        }
        Command::History {
            id,
            subject,
            since,
            limit,
        } => {
            assert_valid(subject);
            encode_history_request(subject, *since, *limit, *id)
        }
        Command::Presence {
            id,
            subject,
            cursor,
            limit,
        } => {
            assert_valid(subject);
            encode_presence_request(subject, cursor.as_deref(), *limit, *id)
        }
        Command::PresenceStats { id, subject } => {
            assert_valid(subject);
            encode_presence_stats_request(subject, *id)
        }
        Command::Connect { id, token } => token_command("connect", token, *id),
        Command::Refresh { id, token } => token_command("refresh", token, *id),
        Command::Ping { .. } => return,
    };
    let reparsed = parse_command(&again, MAX).expect("an encoded command parses");
    assert_eq!(
        format!("{reparsed:?}"),
        format!("{command:?}"),
        "encoded as {again}"
    );
}

/// A client reading `text` as a server message: a delivery re-encodes to
/// the same delivery.
fn check_server_message(text: &str) {
    let Ok(ServerMessage::Delivery {
        subject,
        position,
        data,
    }) = parse_server_message(text)
    else {
        return;
    };
    assert_json_within(text.as_bytes(), data);
    // Only valid subjects go into an envelope without escaping.
    if subject::validate(&subject, usize::MAX).is_err() {
        return;
    }
    let mut envelope = Vec::new();
    write_publication(&mut envelope, &subject, position, data.get());
    let envelope = String::from_utf8(envelope).expect("UTF-8 in, UTF-8 out");
    match parse_server_message(&envelope) {
        Ok(ServerMessage::Delivery {
            subject: s,
            position: p,
            data: d,
        }) => assert_eq!((s, p, d.get()), (subject, position, data.get())),
        other => panic!("envelope {envelope:?} read back as {other:?}"),
    }
}

/// `connect` and `refresh`, which only SDKs send (no encoder here).
fn token_command(op: &str, token: &str, id: Option<u64>) -> String {
    let token = serde_json::to_string(token).expect("a str serializes");
    match id {
        Some(id) => format!("{{\"op\":\"{op}\",\"token\":{token},\"id\":{id}}}"),
        None => format!("{{\"op\":\"{op}\",\"token\":{token}}}"),
    }
}

fn assert_valid(s: &str) {
    assert_eq!(subject::validate(s, MAX), Ok(()), "{s:?}");
}


fn strs<'a>(subjects: &'a [std::borrow::Cow<'_, str>]) -> Vec<&'a str> {
    subjects.iter().map(|s| s.as_ref()).collect()
}
