//! The command endpoint (`POST /cmd`) against the real binary: a client on
//! a one-way transport publishes, sends to its feed and reads history with
//! the commands and replies of the WebSocket, admitted by the same token
//! and rules, held to the same limits, and counted in the same metrics.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{recv, subscribe, Node};
use jsonwebtoken::{encode, EncodingKey, Header};
use serde_json::{json, Value};

const SECRET: &str = "a-test-secret-of-at-least-32-bytes!";

/// A token for user `sub` with these grants, valid for a minute.
fn token(sub: u64, subscribe: &[&str], publish: &[&str]) -> String {
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 60;
    let claims =
        json!({"sub": sub.to_string(), "exp": exp, "subscribe": subscribe, "publish": publish});
    let key = EncodingKey::from_secret(SECRET.as_bytes());
    encode(&Header::default(), &claims, &key).unwrap()
}

/// One HTTP/1.1 connection to the client listener that posts commands.
struct Poster {
    reader: BufReader<TcpStream>,
}

/// An answer: status, head (lines as sent), body.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// The error code of a refused request (the HTTP API's error body).
    fn refusal(&self) -> (u16, String) {
        let code = self.json()["error"]["code"].as_str().unwrap().to_owned();
        (self.status, code)
    }
}

impl Poster {
    fn open(addr: SocketAddr) -> Poster {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Poster {
            reader: BufReader::new(stream),
        }
    }

    /// Sends `request` (head and body, as given) and reads one answer.
    fn raw(&mut self, request: &str) -> Answer {
        self.reader.get_mut().write_all(request.as_bytes()).unwrap();
        let mut head = String::new();
        let mut length = 0;
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line).unwrap();
            assert!(!line.is_empty(), "closed before the answer: {head}");
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap();
                }
            }
            head.push_str(&line);
        }
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body).unwrap();
        Answer {
            status: head[9..12].parse().unwrap(),
            head,
            body: String::from_utf8(body).unwrap(),
        }
    }

    /// Posts `command` to `/cmd` with `headers`.
    fn post(&mut self, command: &Value, headers: &[(&str, &str)]) -> Answer {
        self.post_to("/cmd", &command.to_string(), headers)
    }

    fn post_to(&mut self, target: &str, body: &str, headers: &[(&str, &str)]) -> Answer {
        let mut request = format!(
            "POST {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        request.push_str(body);
        self.raw(&request)
    }

    /// Whether the node closed the connection (after a refusal).
    fn closed(&mut self) -> bool {
        let mut rest = Vec::new();
        matches!(self.reader.read_to_end(&mut rest), Ok(0))
    }
}

fn error_code(reply: &Value) -> &str {
    assert_eq!(reply["op"], "error", "{reply}");
    reply["code"].as_str().unwrap()
}

#[test]
fn publish_and_history_are_answered_with_the_websocket_replies() {
    let node = Node::start(&["--workers", "2"]);
    let mut ws = node.connect();
    subscribe(&mut ws, &["room"]);
    let mut poster = Poster::open(node.ws);
    // Several commands on one kept-alive connection, each answered in turn.
    for i in 1..=3u64 {
        let answer = poster.post(
            &json!({"op": "publish", "id": i, "subject": "room", "data": {"n": i}}),
            &[],
        );
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert!(
            answer.head.contains("Connection: keep-alive"),
            "{}",
            answer.head
        );
        let reply = answer.json();
        assert_eq!(
            (&reply["op"], &reply["id"]),
            (&json!("ok"), &json!(i)),
            "{reply}"
        );
        assert_eq!(reply["reached"], 1);
        let delivered = recv(&mut ws);
        assert_eq!(
            (&delivered["subject"], &delivered["data"]["n"]),
            (&json!("room"), &json!(i))
        );
    }
    let history = poster
        .post(
            &json!({"op": "history", "id": 4, "subject": "room", "limit": 2}),
            &[],
        )
        .json();
    assert_eq!(
        (&history["op"], &history["id"]),
        (&json!("history"), &json!(4)),
        "{history}"
    );
    let data: Vec<&Value> = history["publications"]
        .as_array()
        .unwrap_or_else(|| panic!("{history}"))
        .iter()
        .map(|p| &p["data"]["n"])
        .collect();
    assert_eq!(data, [&json!(2), &json!(3)]);
    // Counted as messages in, on the transport `cmd`.
    let stats = node.stats();
    assert_eq!(stats["messages_in"], 5, "{stats}");
    assert!(stats["transports"]["cmd"].is_object(), "{stats}");
}

#[test]
fn commands_are_refused_with_the_codes_of_the_websocket() {
    let node = Node::start(&["--workers", "1", "--client-history", "false"]);
    let mut poster = Poster::open(node.ws);
    let mut ask = |command: Value| poster.post(&command, &[]).json();
    let cases = [
        (
            json!({"op": "publish", "subject": "room", "data": 1}),
            "missing_field",
        ),
        (
            json!({"op": "subscribe", "id": 1, "subject": "room"}),
            "unknown_op",
        ),
        (
            json!({"op": "connect", "id": 1, "token": "x"}),
            "unknown_op",
        ),
        (json!({"op": "nope", "id": 1}), "unknown_op"),
        (
            json!({"op": "publish", "id": 1, "subject": "a b", "data": 1}),
            "invalid_subject",
        ),
        (
            json!({"op": "publish", "id": 1, "subject": "@5", "data": 1}),
            "reserved_subject",
        ),
        (json!({"op": "send", "id": 1, "data": 1}), "no_user"),
        (
            json!({"op": "history", "id": 1, "subject": "room"}),
            "forbidden",
        ),
    ];
    for (command, code) in &cases {
        let reply = ask(command.clone());
        assert_eq!(error_code(&reply), *code, "{command}: {reply}");
    }
    let reply = poster.post_to("/cmd", "{not json", &[]).json();
    assert_eq!(error_code(&reply), "invalid_json");
    let reply = poster.post_to("/cmd", "", &[]).json();
    assert_eq!(error_code(&reply), "invalid_json");
    let stats = node.wait_for_stats("refusals counted", |s| s["errors"]["invalid_json"] == 2);
    let errors = &stats["errors"];
    assert_eq!(errors["unknown_op"], 3, "{stats:#}");
    assert_eq!(errors["forbidden"], 1, "{stats:#}");
    assert_eq!(errors["missing_field"], 1, "{stats:#}");
}

#[test]
fn requests_are_refused_like_the_other_http_endpoints() {
    let limit = 256;
    let node = Node::start(&[
        "--workers",
        "1",
        "--max-message-size",
        &limit.to_string(),
        "--cmd-path",
        "/commands",
    ]);
    let publish = json!({"op": "publish", "id": 1, "subject": "room", "data": 1}).to_string();
    let refused = |request: String| {
        let mut poster = Poster::open(node.ws);
        let answer = poster.raw(&request);
        assert!(poster.closed(), "a refusal ends the connection");
        answer
    };
    let wrong_method = refused("GET /commands HTTP/1.1\r\nHost: x\r\n\r\n".into());
    assert_eq!(wrong_method.refusal(), (405, "method_not_allowed".into()));
    assert!(
        wrong_method.head.contains("Allow: POST, OPTIONS"),
        "{}",
        wrong_method.head
    );
    let chunked = refused(format!(
        "POST /commands HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{publish}\r\n0\r\n\r\n",
        publish.len()
    ));
    assert_eq!(chunked.refusal(), (411, "length_required".into()));
    let big = format!(
        "{{\"op\":\"publish\",\"id\":1,\"subject\":\"room\",\"data\":\"{}\"}}",
        "x".repeat(limit)
    );
    let too_large = refused(format!(
        "POST /commands HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{big}",
        big.len()
    ));
    assert_eq!(too_large.refusal(), (413, "message_too_large".into()));
    let in_url = refused(format!(
        "POST /commands?token=abc HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{publish}",
        publish.len()
    ));
    assert_eq!(in_url.refusal(), (400, "unknown_parameter".into()));
    // The default path is not served when another is set.
    let mut poster = Poster::open(node.ws);
    assert_eq!(poster.post_to("/cmd", &publish, &[]).status, 404);
    // A message of exactly the limit is taken.
    let fits = format!(
        "{{\"op\":\"publish\",\"id\":1,\"subject\":\"room\",\"data\":\"{}\"}}",
        "x".repeat(limit - 50)
    );
    assert_eq!(fits.len(), limit);
    let reply = Poster::open(node.ws)
        .post_to("/commands", &fits, &[])
        .json();
    assert_eq!(reply["op"], "ok", "{reply}");
    // A browser on another origin asks first.
    let preflight = refused("OPTIONS /commands HTTP/1.1\r\nHost: x\r\nOrigin: https://app.example\r\nAccess-Control-Request-Method: POST\r\n\r\n".into());
    assert_eq!(preflight.status, 204);
    assert!(
        preflight
            .head
            .contains("Access-Control-Allow-Methods: POST, OPTIONS"),
        "{}",
        preflight.head
    );
    assert!(
        preflight
            .head
            .contains("Access-Control-Allow-Headers: Content-Type, Authorization"),
        "{}",
        preflight.head
    );
    assert!(
        preflight.head.contains("Access-Control-Allow-Origin: *"),
        "{}",
        preflight.head
    );
    let stats = node.stats();
    let errors = &stats["errors"];
    assert_eq!(errors["request_method_not_allowed"], 1, "{stats:#}");
    assert_eq!(errors["request_length_required"], 1, "{stats:#}");
    assert_eq!(errors["request_message_too_large"], 1, "{stats:#}");
    assert_eq!(errors["request_unknown_parameter"], 1, "{stats:#}");
}

#[test]
fn origins_are_checked_as_for_a_websocket() {
    let node = Node::start(&["--workers", "1", "--allowed-origins", "https://app.example"]);
    let publish = json!({"op": "publish", "id": 1, "subject": "room", "data": 1});
    let mut poster = Poster::open(node.ws);
    let evil = poster.post(&publish, &[("Origin", "https://evil.example")]);
    assert_eq!(evil.refusal(), (403, "origin_not_allowed".into()));
    let mut poster = Poster::open(node.ws);
    let own = poster.post(&publish, &[("Origin", "https://app.example")]);
    assert_eq!(own.json()["op"], "ok", "{}", own.body);
}

#[test]
fn tokens_and_grants_decide_as_on_a_websocket() {
    let node = Node::start(&["--workers", "1", "--token-hmac-secret", SECRET]);
    let watcher = token(3, &["chat.room", "@7"], &[]);
    let mut ws = node.connect_path(&format!("/ws?token={watcher}"));
    common::send(
        &mut ws,
        json!({"op": "subscribe", "id": 1, "subjects": ["chat.room", "@7"]}),
    );
    // Its own feed is announced unasked; the two asked for, each.
    let mut live = 0;
    while live < 2 {
        let reply = recv(&mut ws);
        assert_eq!(reply["op"], "subscribed", "{reply}");
        live += usize::from(reply["id"] == 1);
    }

    let writer = token(7, &["chat.*"], &["chat.room"]);
    let bearer = format!("Bearer {writer}");
    let auth = [("Authorization", bearer.as_str())];
    let mut poster = Poster::open(node.ws);
    let ok = poster.post(
        &json!({"op": "publish", "id": 1, "subject": "chat.room", "data": "hi"}),
        &auth,
    );
    assert_eq!(ok.json()["op"], "ok", "{}", ok.body);
    assert_eq!(recv(&mut ws)["data"], "hi");
    let other = poster.post(
        &json!({"op": "publish", "id": 2, "subject": "chat.other", "data": 1}),
        &auth,
    );
    assert_eq!(error_code(&other.json()), "forbidden");
    // `send` as the token's user reaches its feed.
    let sent = poster.post(
        &json!({"op": "send", "id": 3, "data": "to my followers"}),
        &auth,
    );
    assert_eq!(sent.json()["op"], "ok", "{}", sent.body);
    let delivered = recv(&mut ws);
    assert_eq!(
        (&delivered["subject"], &delivered["data"]),
        (&json!("@7"), &json!("to my followers"))
    );
    let history = poster.post(
        &json!({"op": "history", "id": 4, "subject": "chat.room"}),
        &auth,
    );
    assert_eq!(history.json()["op"], "history", "{}", history.body);
    // The next request on the same connection is anonymous: the token was
    // that request's.
    let anonymous = poster.post(
        &json!({"op": "publish", "id": 5, "subject": "chat.room", "data": 1}),
        &[],
    );
    assert_eq!(error_code(&anonymous.json()), "forbidden");
    // A token that fails is refused as an upgrade's is.
    let mut poster = Poster::open(node.ws);
    let bad = poster.post(
        &json!({"op": "publish", "id": 1, "subject": "chat.room", "data": 1}),
        &[("Authorization", "Bearer not.a.token")],
    );
    assert_eq!(bad.refusal(), (401, "invalid_token".into()));
    assert!(
        bad.head.contains("WWW-Authenticate: Bearer"),
        "{}",
        bad.head
    );
    assert!(poster.closed());
}

#[test]
fn the_publish_rate_is_the_connections_as_on_a_websocket() {
    let node = Node::start(&[
        "--workers",
        "1",
        "--client-publish-rate",
        "1",
        "--client-publish-burst",
        "3",
    ]);
    let mut poster = Poster::open(node.ws);
    let replies: Vec<Value> = (1..=5)
        .map(|i| {
            poster
                .post(
                    &json!({"op": "publish", "id": i, "subject": "room", "data": i}),
                    &[],
                )
                .json()
        })
        .collect();
    let ok = replies.iter().filter(|r| r["op"] == "ok").count();
    let limited = replies
        .iter()
        .filter(|r| r["op"] == "error" && r["code"] == "rate_limited")
        .count();
    // The burst, perhaps one more refilled meanwhile; the rest refused.
    assert!((3..=4).contains(&ok) && ok + limited == 5, "{replies:?}");
    let stats = node.stats();
    assert_eq!(stats["errors"]["rate_limited"], limited as u64, "{stats:#}");
}

#[test]
fn a_command_sent_before_the_previous_answer_is_refused_after_it() {
    let node = Node::start(&["--workers", "1"]);
    let one = json!({"op": "publish", "id": 1, "subject": "room", "data": 1}).to_string();
    let two = json!({"op": "publish", "id": 2, "subject": "room", "data": 2}).to_string();
    let post = |body: &str| {
        format!(
            "POST /cmd HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let mut poster = Poster::open(node.ws);
    // Both in one write: the second arrives while the first is held.
    let first = poster.raw(&(post(&one) + &post(&two)));
    assert_eq!(first.json()["id"], 1, "{}", first.body);
    assert!(first.head.contains("Connection: close"), "{}", first.head);
    let refused = poster.raw("");
    assert_eq!(refused.refusal(), (400, "pipelined".into()));
    assert!(poster.closed());
}
