//! The HTTP transports against the real binary: Server-Sent Events through
//! reqwest and the eventsource-stream parser, HTTP streaming, long-poll,
//! heartbeats, slow consumers, shutdown and bad requests.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{next_event, Node};
use eventsource_stream::Eventsource;
use futures_util::{Stream, StreamExt};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(10);

/// Offsets of a cursor's entries (`epoch:offset,…`).
fn cursor_offsets(cursor: &str) -> Vec<u64> {
    cursor
        .split(',')
        .map(|e| e.split_once(':').unwrap().1.parse().unwrap())
        .collect()
}

#[tokio::test]
async fn sse_resumes_every_subject_from_last_event_id() {
    let node = Node::start(&["--workers", "2"]);
    let url = format!("http://{}/sse?subject=a&subject=b", node.ws);
    let client = reqwest::Client::new();
    let response = client.get(&url).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "text/event-stream",
        "{:?}",
        response.headers()
    );
    assert_eq!(response.headers()["access-control-allow-origin"], "*");
    let mut events = response.bytes_stream().eventsource();
    let mut announced = Vec::new();
    for _ in 0..2 {
        let event = next_event(&mut events).await;
        assert_eq!(event.event, "subscribed");
        let data: Value = serde_json::from_str(&event.data).unwrap();
        announced.push(data["subject"].as_str().unwrap().to_owned());
    }
    announced.sort();
    assert_eq!(announced, ["a", "b"]);

    node.publish("a", &json!("a1"));
    node.publish("b", &json!("b1"));
    for expected in ["a1", "b1"] {
        let event = next_event(&mut events).await;
        assert_eq!(event.event, "message");
        let data: Value = serde_json::from_str(&event.data).unwrap();
        assert_eq!(data["data"], expected);
    }
    // A message of a stream of several subjects carries no id: the cursor
    // follows in an id-only event at the end of the node's turn, which the
    // parser, like a browser, keeps for the events after it. So a2 bears
    // the cursor after b1; a client cut now resumes from there, and is
    // sent a2 again.
    node.publish("a", &json!("a2"));
    let event = next_event(&mut events).await;
    let data: Value = serde_json::from_str(&event.data).unwrap();
    assert_eq!(data["data"], "a2");
    let last_id = event.id;
    assert_eq!(cursor_offsets(&last_id), [1, 1], "{last_id}");
    drop(events);

    // Published while the client is away.
    node.publish("b", &json!("b2"));
    node.publish("a", &json!("a3"));

    let response = client
        .get(&url)
        .header("Last-Event-ID", &last_id)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut events = response.bytes_stream().eventsource();
    let mut got: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut recovered = 0;
    while got.values().map(Vec::len).sum::<usize>() < 3 {
        let event = next_event(&mut events).await;
        let data: Value = serde_json::from_str(&event.data).unwrap();
        match event.event.as_str() {
            "subscribed" => {
                assert_eq!(data["recovered"], true, "{data}");
                recovered += 1;
            }
            "message" => {
                let subject = data["subject"].as_str().unwrap().to_owned();
                got.entry(subject)
                    .or_default()
                    .push(data["data"].as_str().unwrap().to_owned());
                // The cursor is handed out once every subject is answered.
                assert_eq!(event.id, "", "an id while the stream opens");
            }
            other => panic!("unexpected event {other}: {data}"),
        }
    }
    assert_eq!(recovered, 2);
    assert_eq!(got["a"], ["a2", "a3"], "a2 again: its cursor never came");
    assert_eq!(got["b"], ["b2"]);
    // Live again after the replay: b3 bears the opening's cursor, a4 the
    // one after b3.
    node.publish("b", &json!("b3"));
    let event = next_event(&mut events).await;
    assert_eq!(
        serde_json::from_str::<Value>(&event.data).unwrap()["data"],
        "b3"
    );
    assert_eq!(cursor_offsets(&event.id), [3, 2], "the opening's cursor");
    node.publish("a", &json!("a4"));
    let event = next_event(&mut events).await;
    assert_eq!(
        serde_json::from_str::<Value>(&event.data).unwrap()["data"],
        "a4"
    );
    assert_eq!(cursor_offsets(&event.id), [3, 3], "b3's: {}", event.id);
    // The first stream is gone once the node has seen its end.
    node.wait_for_stats("one SSE connection", |s| {
        s["transports"]["sse"]["connections"] == 1
    });
}

/// Lines of a newline-delimited JSON stream, skipping heartbeats.
struct Lines<S> {
    body: S,
    buffer: Vec<u8>,
}

impl<S, E> Lines<S>
where
    S: Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    E: std::fmt::Debug,
{
    async fn next(&mut self) -> Value {
        loop {
            if let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                if line.len() > 1 {
                    return serde_json::from_slice(&line).unwrap();
                }
                continue;
            }
            let chunk = tokio::time::timeout(WAIT, self.body.next())
                .await
                .expect("a line within the wait")
                .expect("the stream goes on")
                .unwrap();
            self.buffer.extend_from_slice(&chunk);
        }
    }
}

#[tokio::test]
async fn http_stream_resumes_with_since() {
    let node = Node::start(&[]);
    let client = reqwest::Client::new();
    let url = format!("http://{}/stream?subject=s", node.ws);
    let response = client.get(&url).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["transfer-encoding"], "chunked");
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let mut lines = Lines {
        body: response.bytes_stream(),
        buffer: Vec::new(),
    };
    let subscribed = lines.next().await;
    assert_eq!(subscribed["op"], "subscribed");
    assert_eq!(subscribed["offset"], 0);
    for i in 1..=3 {
        node.publish("s", &json!(i));
    }
    let mut last = Value::Null;
    for i in 1..=3 {
        last = lines.next().await;
        assert_eq!(last["op"], "msg");
        assert_eq!(last["offset"], i);
    }
    drop(lines);
    for i in 4..=5 {
        node.publish("s", &json!(i));
    }
    let since = format!("{}:{}", last["epoch"].as_str().unwrap(), last["offset"]);
    let response = client
        .get(format!("{url}&since={since}"))
        .send()
        .await
        .unwrap();
    let mut lines = Lines {
        body: response.bytes_stream(),
        buffer: Vec::new(),
    };
    let subscribed = lines.next().await;
    assert_eq!(subscribed["recovered"], true, "{subscribed}");
    assert_eq!(lines.next().await["data"], 4);
    assert_eq!(lines.next().await["data"], 5);
}

/// One long-poll: the messages it carried and the cursor for the next.
async fn poll(client: &reqwest::Client, url: &str) -> (Vec<Value>, String) {
    let response = tokio::time::timeout(Duration::from_secs(30), client.get(url).send())
        .await
        .expect("the poll is answered")
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut answer: Vec<Value> = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    let end = answer.pop().unwrap();
    assert_eq!(end["op"], "poll", "{end}");
    (answer, end["since"].as_str().unwrap().to_owned())
}

#[tokio::test]
async fn a_long_poll_loop_loses_nothing_while_publishing() {
    let node = Node::start(&["--workers", "2", "--poll-timeout", "1"]);
    let accepted_before = node.stats()["connections_accepted"].as_u64().unwrap();
    let client = reqwest::Client::new();
    let base = format!("http://{}/poll?subject=p", node.ws);
    // Nothing published yet: held for the timeout, then answered empty,
    // with the position to poll from.
    let (messages, mut cursor) = poll(&client, &base).await;
    assert!(messages.is_empty());
    assert_eq!(cursor_offsets(&cursor), [0]);

    const TOTAL: u64 = 300;
    let admin = node.admin;
    let publisher = std::thread::spawn(move || {
        for i in 1..=TOTAL {
            let body = json!({"subject": "p", "data": i}).to_string();
            let (status, reply) = common::http(admin, "POST", "/api/publish", &[], &body);
            assert_eq!(status, 200, "{reply}");
            if i % 20 == 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    });
    let mut offsets = Vec::new();
    let mut polls = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while (offsets.len() as u64) < TOTAL {
        assert!(
            Instant::now() < deadline,
            "got {} of {TOTAL}",
            offsets.len()
        );
        let (messages, next) = poll(&client, &format!("{base}&since={cursor}")).await;
        for m in messages {
            assert_eq!(m["op"], "msg", "a gap was reported: {m}");
            offsets.push(m["offset"].as_u64().unwrap());
        }
        cursor = next;
        polls += 1;
    }
    publisher.join().unwrap();
    assert_eq!(offsets, (1..=TOTAL).collect::<Vec<_>>());
    assert!(polls > 1, "the loop took several polls ({polls})");
    let stats = node.stats();
    let accepted = stats["connections_accepted"].as_u64().unwrap() - accepted_before;
    assert_eq!(
        accepted, 1,
        "every poll went over one kept-alive connection"
    );
    assert!(
        stats["transports"]["poll"]["messages_out"]
            .as_u64()
            .unwrap()
            >= TOTAL
    );
}

/// Reads until `needle` has arrived; returns everything read.
fn read_until(reader: &mut BufReader<TcpStream>, needle: &str) -> String {
    let mut seen = String::new();
    while !seen.contains(needle) {
        let mut line = String::new();
        let n = reader.read_line(&mut line).expect("read within the wait");
        assert!(n > 0, "ended before {needle:?}: {seen:?}");
        seen.push_str(&line);
    }
    seen
}

#[test]
fn heartbeats_arrive_on_idle_streams() {
    let node = Node::start(&["--stream-heartbeat-interval", "1"]);
    let mut sse = node.open_raw("/sse?subject=quiet", None);
    let mut stream = node.open_raw("/stream?subject=quiet", None);
    let seen = read_until(&mut sse, ": heartbeat\n");
    assert!(seen.starts_with("retry: 2000\n"), "{seen:?}");
    // A chunk holding one empty line: "1\r\n\n\r\n".
    read_until(&mut stream, "1\r\n\n\r\n");
}

/// The offset of each `data:` event of an SSE stream, until `count`.
fn sse_offsets(reader: &mut BufReader<TcpStream>, count: usize) -> Vec<u64> {
    let mut offsets = Vec::new();
    while offsets.len() < count {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).unwrap() > 0, "stream ended");
        if let Some(data) = line.strip_prefix("data: ") {
            let value: Value = serde_json::from_str(data).unwrap();
            if value["op"] == "msg" {
                offsets.push(value["offset"].as_u64().unwrap());
            }
        }
    }
    offsets
}

#[test]
fn a_slow_sse_consumer_is_cut_while_the_others_keep_receiving() {
    let node = Node::start(&[
        "--workers",
        "2",
        "--max-outbound-bytes",
        "262144",
        "--close-timeout",
        "120",
    ]);
    let mut slow = node.open_raw("/sse?subject=firehose", Some(4096));
    let mut fast = node.open_raw("/sse?subject=firehose", None);
    node.wait_for_stats("both subscribed", |s| s["subscriptions"] == 2);
    let offsets = node.firehose("firehose", move || sse_offsets(&mut fast, 1)[0]);
    assert_eq!(offsets, (1..=800).collect::<Vec<u64>>());
    // The fast reader got all 800 (and has hung up since); only the stalled
    // one was cut.
    let stats = node.wait_for_stats("slow consumer cut", |s| s["slow_consumer_disconnects"] == 1);
    assert_eq!(stats["closes"]["slow_consumer"], 1, "{stats}");
    // The stalled client, once it reads, finds its last event naming why.
    let seen = read_until(&mut slow, "event: close\n");
    assert!(!seen.is_empty());
    let close = read_until(&mut slow, "\n");
    assert!(close.contains("\"code\":4001"), "{close}");
}

#[test]
fn shutdown_ends_every_stream_and_answers_every_poll() {
    let mut node = Node::start(&["--workers", "2", "--shutdown-timeout", "5"]);
    let mut sse = node.open_raw("/sse?subject=bye", None);
    let mut stream = node.open_raw("/stream?subject=bye", None);
    let mut held = TcpStream::connect(node.ws).unwrap();
    held.set_read_timeout(Some(WAIT)).unwrap();
    write!(held, "GET /poll?subject=bye HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    node.wait_for_stats("all three subscribed", |s| s["subscriptions"] == 3);

    node.terminate();

    read_until(&mut sse, "event: close\n");
    assert!(read_until(&mut sse, "\n").contains("\"code\":1001"));
    let mut rest = String::new();
    sse.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "\n", "the stream ends after the close event");

    let seen = read_until(&mut stream, "\"op\":\"close\"");
    assert!(seen.contains("\"reason\":\"going_away\""), "{seen}");
    let mut rest = String::new();
    stream.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "\r\n0\r\n\r\n", "the last chunk ends the body");

    let mut answer = String::new();
    held.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.contains("Connection: close\r\n"), "{answer}");
    let body: Value = serde_json::from_str(answer.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(body[0]["op"], "poll", "{body}");

    node.wait_for_exit();
}

/// Sends a raw request; returns the status and the body.
fn raw_request(node: &Node, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(node.ws).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response.split_once("\r\n\r\n").unwrap().1.to_owned();
    (status, body)
}

/// Splits the first of several HTTP responses off `raw`: (status, body,
/// the rest), the body as long as its `Content-Length` says.
fn next_response(raw: &str) -> (u16, &str, &str) {
    let (head, rest) = raw.split_once("\r\n\r\n").expect("a whole head");
    let status = head[9..12].parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .expect("a Content-Length")
        .parse()
        .unwrap();
    (status, &rest[..len], &rest[len..])
}

/// A poll sent while another is held, in the same packet or later: the
/// held one is answered with the client's position, the second refused
/// with 400 `pipelined`, counted as protocol.md says, and the connection
/// closed.
#[test]
fn a_pipelined_poll_is_refused_and_the_held_one_keeps_its_position() {
    let node = Node::start(&[]);
    for i in 1..=3 {
        node.publish("pp", &json!(i));
    }
    let poll = "GET /poll?subject=pp HTTP/1.1\r\nHost: t\r\n\r\n";
    let read_all = |stream: &mut TcpStream| {
        let mut raw = String::new();
        stream.read_to_string(&mut raw).unwrap();
        raw
    };
    let answer_then_refusal = |raw: &str| {
        let (status, body, rest) = next_response(raw);
        assert_eq!(status, 200, "{raw}");
        let answer: Vec<Value> = serde_json::from_str(body).unwrap();
        let end = answer.last().unwrap();
        assert_eq!(end["op"], "poll", "{body}");
        let cursor = end["since"].as_str().unwrap().to_owned();
        let (status, body, rest) = next_response(rest);
        assert_eq!(status, 400, "{raw}");
        let error: Value = serde_json::from_str(body).unwrap();
        assert_eq!(error["error"]["code"], "pipelined", "{body}");
        assert_eq!(rest, "", "nothing after the refusal");
        cursor
    };

    // Both in one packet: the first poll (no `since`: from now) is still
    // attaching when the second is read; its answer waits for the attach,
    // so its cursor is where the subject stands, not "".
    let mut both = TcpStream::connect(node.ws).unwrap();
    both.set_read_timeout(Some(WAIT)).unwrap();
    both.write_all(format!("{poll}{poll}").as_bytes()).unwrap();
    let cursor = answer_then_refusal(&read_all(&mut both));
    assert_ne!(cursor, "", "the held poll lost the client's position");
    assert_eq!(cursor_offsets(&cursor), [3], "{cursor}");

    // The second a while after the first, which is held by then.
    let mut apart = TcpStream::connect(node.ws).unwrap();
    apart.set_read_timeout(Some(WAIT)).unwrap();
    let first = format!("GET /poll?subject=pp&since={cursor} HTTP/1.1\r\nHost: t\r\n\r\n");
    apart.write_all(first.as_bytes()).unwrap();
    node.wait_for_stats("the first poll held", |s| s["subscriptions"] == 1);
    apart.write_all(poll.as_bytes()).unwrap();
    assert_eq!(answer_then_refusal(&read_all(&mut apart)), cursor);
    drop((both, apart));

    let stats = node.wait_for_stats("both closed", |s| s["connections"] == 0);
    assert_eq!(stats["errors"]["handshake_400_bad_request"], 2, "{stats:#}");
    assert_eq!(stats["closes"]["handshake_rejected"], 2, "{stats:#}");
    assert!(
        stats["closes"].get("protocol_error").is_none_or(|n| n == 0),
        "{stats:#}"
    );
}

#[test]
fn bad_requests_get_a_status_and_a_code_and_harm_no_one() {
    let node = Node::start(&["--max-subscriptions", "2"]);
    let mut bystander = node.open_raw("/sse?subject=calm", None);
    node.wait_for_stats("bystander subscribed", |s| s["subscriptions"] == 1);
    let get =
        |target: &str, extra: &str| format!("GET {target} HTTP/1.1\r\nHost: t\r\n{extra}\r\n");
    let cases = [
        (get("/sse", ""), 400, "missing_subject"),
        (
            get("/sse?subject=a&colour=red", ""),
            400,
            "unknown_parameter",
        ),
        (get("/stream?subject=a%20b", ""), 400, "invalid_subject"),
        (
            get("/poll?subject=a&since=yesterday", ""),
            400,
            "invalid_position",
        ),
        (
            get("/sse?subject=a", "Last-Event-ID: 12\r\n"),
            400,
            "invalid_position",
        ),
        (
            get("/sse?subject=a&subject=b&subject=c", ""),
            400,
            "too_many_subscriptions",
        ),
        (
            "DELETE /sse?subject=a HTTP/1.1\r\nHost: t\r\n\r\n".to_owned(),
            405,
            "method_not_allowed",
        ),
        (get("/elsewhere", ""), 404, "not_found"),
    ];
    for (request, status, code) in &cases {
        let (got, body) = raw_request(&node, request);
        assert_eq!(got, *status, "{request:?}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["error"]["code"], *code, "{request:?}");
    }
    // A CORS preflight is answered, not refused.
    let (status, _) = raw_request(
        &node,
        "OPTIONS /sse?subject=a HTTP/1.1\r\nHost: t\r\nOrigin: http://elsewhere\r\n\r\n",
    );
    assert_eq!(status, 204);

    let stats = node.stats();
    let errors = &stats["errors"];
    for label in [
        "request_missing_subject",
        "request_unknown_parameter",
        "request_invalid_subject",
        "request_too_many_subscriptions",
        "request_method_not_allowed",
        "handshake_404_not_found",
    ] {
        assert_eq!(errors[label], 1, "{label}: {errors}");
    }
    assert_eq!(errors["request_invalid_position"], 2, "{errors}");
    // The bystander never noticed.
    node.publish("calm", &json!("still here"));
    assert_eq!(sse_offsets(&mut bystander, 1), [1]);
}

#[test]
fn the_admission_cap_holds_for_every_transport() {
    let node = Node::start(&["--max-connections", "2"]);
    let _sse = node.open_raw("/sse?subject=full", None);
    let _stream = node.open_raw("/stream?subject=full", None);
    node.wait_for_stats("two held", |s| s["connections"] == 2);
    for target in [
        "/sse?subject=full",
        "/stream?subject=full",
        "/poll?subject=full",
    ] {
        let (status, body) =
            raw_request(&node, &format!("GET {target} HTTP/1.1\r\nHost: t\r\n\r\n"));
        assert_eq!(status, 503, "{target}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["error"]["code"], "over_capacity");
    }
    let stats = node.wait_for_stats("refusals closed", |s| s["connections"] == 2);
    assert_eq!(stats["errors"]["over_capacity"], 3, "{stats}");
}
