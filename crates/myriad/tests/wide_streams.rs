//! HTTP streams of many subjects against the real binary: a Server-Sent
//! Events stream opens in bytes proportional to its subjects (its cursor is
//! written once, not with every `subscribed` event), is not cut as a slow
//! consumer for its own opening, and every stream the node admits can be
//! resumed with the cursor it was handed, within `max_request_head`; a
//! stream too wide for that is refused at open. The same for HTTP
//! streaming, whose client builds its cursor from the positions it read.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::Node;
use myriad_testkit::RedisServer;
use serde_json::{json, Value};

/// The longest cursor entry (`epoch:offset` with 16 hex digits and 20
/// decimal ones) and its comma: what the node keeps room for per subject.
const ENTRY_ROOM: usize = 16 + 1 + 20 + 1;
/// `Last-Event-ID: ` and its CRLF, the longest way a cursor is carried.
const FRAMING: usize = 17;

fn target(path: &str, subjects: usize) -> String {
    named(path, 's', subjects)
}

/// `path?subject=P0&subject=P1…` for the prefix `P`.
fn named(path: &str, prefix: char, subjects: usize) -> String {
    let query: Vec<String> = (0..subjects)
        .map(|i| format!("subject={prefix}{i}"))
        .collect();
    format!("{path}?{}", query.join("&"))
}

fn request(target: &str, headers: &str) -> String {
    format!("GET {target} HTTP/1.1\r\nHost: test\r\n{headers}\r\n")
}

/// The most subjects `s0…` on `path` the node admits with `limit` as
/// `max_request_head`: the request plus room for their longest cursor fits.
fn widest(path: &str, limit: usize) -> usize {
    (1..)
        .take_while(|&n| {
            request(&target(path, n), "").len() + FRAMING + n * ENTRY_ROOM - 1 <= limit
        })
        .last()
        .unwrap()
}

/// Sends `request` on a fresh socket; returns the status and the reader
/// positioned after the response head.
fn send(node: &Node, request: &str) -> (u16, BufReader<TcpStream>) {
    let mut stream = TcpStream::connect(node.ws).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    let code = status.split(' ').nth(1).unwrap().parse().unwrap();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" || line.is_empty() {
            return (code, reader);
        }
    }
}

/// One SSE event: its lines, and the bytes it took (blank line included).
fn next_event(reader: &mut BufReader<TcpStream>) -> (Vec<String>, usize) {
    let mut lines = Vec::new();
    let mut bytes = 0;
    loop {
        let mut line = String::new();
        let n = reader
            .read_line(&mut line)
            .expect("an event within the wait");
        assert!(n > 0, "the stream ended after {lines:?}");
        bytes += n;
        if line == "\n" {
            if lines.is_empty() {
                continue;
            }
            return (lines, bytes);
        }
        lines.push(line.trim_end_matches('\n').to_owned());
    }
}

fn field<'a>(lines: &'a [String], name: &str) -> Option<&'a str> {
    lines.iter().find_map(|l| l.strip_prefix(name))
}

/// What an SSE stream's opening brought, up to the event that hands out
/// the cursor.
struct Opening {
    reader: BufReader<TcpStream>,
    /// Bytes from the response head's end to the cursor's event, included.
    bytes: usize,
    subscribed: Vec<Value>,
    /// Messages replayed while opening, with their subjects.
    replayed: Vec<(String, Value)>,
    cursor: String,
}

/// Opens `/sse` on `subjects` subjects (resuming from `last_id` if given)
/// on a node whose `max_request_head` is `limit`, and reads its opening.
fn open_sse(
    node: &Node,
    limit: usize,
    (prefix, subjects): (char, usize),
    last_id: Option<&str>,
) -> Opening {
    let headers = last_id.map_or(String::new(), |id| format!("Last-Event-ID: {id}\r\n"));
    let request = request(&named("/sse", prefix, subjects), &headers);
    assert!(request.len() <= limit, "{} bytes of request", request.len());
    let (status, reader) = send(node, &request);
    assert_eq!(status, 200);
    let mut opening = Opening {
        reader,
        bytes: 0,
        subscribed: Vec::new(),
        replayed: Vec::new(),
        cursor: String::new(),
    };
    let mut ids = 0;
    loop {
        let (lines, bytes) = next_event(&mut opening.reader);
        opening.bytes += bytes;
        assert_ne!(field(&lines, "event: "), Some("close"), "cut: {lines:?}");
        if field(&lines, "retry: ").is_some() {
            continue;
        }
        let Some(data) = field(&lines, "data: ") else {
            assert_eq!(opening.subscribed.len(), subjects, "{lines:?}");
            opening.cursor = field(&lines, "id: ").expect("an id-only event").to_owned();
            return opening;
        };
        ids += usize::from(field(&lines, "id: ").is_some());
        let value: Value = serde_json::from_str(data).unwrap();
        let announced = value["op"] == "subscribed";
        match value["op"].as_str() {
            Some("subscribed") => opening.subscribed.push(value),
            Some("msg") => opening.replayed.push((
                value["subject"].as_str().unwrap().to_owned(),
                value["data"].clone(),
            )),
            _ => panic!("{value}"),
        }
        if announced && opening.subscribed.len() == subjects {
            // About 100 bytes per `subscribed` event: the opening used to
            // write a cursor of every subject with each, N² bytes.
            assert!(
                opening.bytes < 130 * subjects,
                "{} bytes to announce {subjects} subjects",
                opening.bytes
            );
            assert_eq!(ids, 0, "no cursor before every subject is announced");
        }
    }
}

/// Reads events until a `msg`; returns it and the cursor after it. On a
/// stream of several subjects a message carries no id: the cursor follows
/// in an id-only event at the end of the node's turn.
fn next_msg(reader: &mut BufReader<TcpStream>) -> (Value, String) {
    let mut msg = None;
    loop {
        let (lines, _) = next_event(reader);
        if let Some(data) = field(&lines, "data: ") {
            let value: Value = serde_json::from_str(data).unwrap();
            if value["op"] == "msg" {
                assert!(msg.is_none(), "one message, then its cursor: {value}");
                msg = Some(value);
            }
        }
        if let (Some(id), Some(_)) = (field(&lines, "id: "), &msg) {
            return (msg.unwrap(), id.to_owned());
        }
    }
}

/// A stream of `subjects` opens in O(subjects) bytes, uncut, gets a
/// publication and then the whole cursor as an id, and resumes from that id
/// with the same URL, recovering what was published while it was away.
/// The subjects are `P0…` for the prefix `P`, all new to the node.
fn opens_and_resumes(node: &Node, limit: usize, prefix: char, subjects: usize) {
    let opening = open_sse(node, limit, (prefix, subjects), None);
    // The announcements, then one cursor of about 19 bytes per subject.
    assert!(
        opening.bytes < 150 * subjects,
        "{} bytes to open {subjects} subjects",
        opening.bytes
    );
    let entries: Vec<&str> = opening.cursor.split(',').collect();
    assert_eq!(entries.len(), subjects, "one entry per subject");
    assert!(
        entries.iter().all(|e| e.ends_with(":0")),
        "nothing published yet"
    );
    let mut reader = opening.reader;
    let first = format!("{prefix}0");
    let last = format!("{prefix}{}", subjects - 1);
    node.publish(&last, &json!("live"));
    let (msg, id) = next_msg(&mut reader);
    assert_eq!(msg["subject"].as_str(), Some(&*last));
    assert_eq!(msg["data"], "live");
    assert_eq!(id.split(',').count(), subjects);
    drop(reader);

    // Published while the client is away: recovered on resuming.
    node.publish(&first, &json!("missed"));
    node.publish(&last, &json!("missed too"));
    let mut resumed = open_sse(node, limit, (prefix, subjects), Some(&id));
    assert_eq!(resumed.subscribed.len(), subjects);
    assert!(
        resumed.subscribed.iter().all(|a| a["recovered"] == true),
        "every subject resumed"
    );
    resumed.replayed.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        resumed.replayed,
        [
            (first, json!("missed")),
            (last.clone(), json!("missed too"))
        ]
    );
    // The cursor handed out at the end covers what was replayed.
    let entries: Vec<&str> = resumed.cursor.split(',').collect();
    assert!(entries[0].ends_with(":1") && entries[subjects - 1].ends_with(":2"));
    assert!(entries[1..subjects - 1].iter().all(|e| e.ends_with(":0")));
}

#[test]
fn an_sse_stream_of_500_and_of_the_most_subjects_opens_whole_and_resumes() {
    let node = Node::start(&["--max-request-head", "65536"]);
    opens_and_resumes(&node, 65_536, 's', 500);
    // The most the node takes at this head size: max_subscriptions (1,024).
    assert!(widest("/sse", 65_536) > 1_024);
    opens_and_resumes(&node, 65_536, 't', 1_024);
    assert_eq!(
        node.metric("myriad_connections_closed_total{reason=\"slow_consumer\"}"),
        0
    );
}

#[test]
fn at_the_default_head_size_the_widest_stream_resumes_and_a_wider_one_is_refused() {
    let node = Node::start(&[]);
    let n = widest("/sse", 8192);
    assert!(n >= 100, "{n}");
    opens_and_resumes(&node, 8192, 's', n);
    for path in ["/sse", "/stream", "/poll"] {
        let (status, mut reader) = send(&node, &request(&target(path, n + 1), ""));
        assert_eq!(status, 431, "{path}");
        let mut body = String::new();
        reader.read_to_string(&mut body).unwrap();
        assert!(body.contains("\"code\":\"cursor_would_not_fit\""), "{body}");
    }
    assert_eq!(
        node.metric("myriad_errors_total{kind=\"request_cursor_would_not_fit\"}"),
        3
    );
    // 500 subjects of this size need more room than 8 KiB.
    let (status, _) = send(&node, &request(&target("/sse", 500), ""));
    assert_eq!(status, 431);
}

/// One NDJSON line of a chunked stream: the chunk's size line, then the line.
fn next_line(reader: &mut BufReader<TcpStream>) -> Value {
    loop {
        let mut size = String::new();
        reader.read_line(&mut size).unwrap();
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let mut crlf = [0; 2];
        reader.read_exact(&mut crlf).unwrap();
        if line.trim().is_empty() {
            continue; // a heartbeat
        }
        return serde_json::from_str(&line).unwrap();
    }
}

#[test]
fn the_widest_http_stream_resumes_with_since_built_from_its_positions() {
    let node = Node::start(&[]);
    let n = widest("/stream", 8192);
    // One wider would be handed positions it could not resume from: its
    // `since` would pass max_request_head (431). Refused at open instead.
    let (status, _) = send(&node, &request(&target("/stream", n + 1), ""));
    assert_eq!(status, 431);
    let url = target("/stream", n);
    let (status, mut reader) = send(&node, &request(&url, ""));
    assert_eq!(status, 200);
    let mut positions = vec![String::new(); n];
    for _ in 0..n {
        let line = next_line(&mut reader);
        assert_eq!(line["op"], "subscribed", "{line}");
        let i: usize = line["subject"].as_str().unwrap()[1..].parse().unwrap();
        positions[i] = format!("{}:{}", line["epoch"].as_str().unwrap(), line["offset"]);
    }
    node.publish("s1", &json!("live"));
    let msg = next_line(&mut reader);
    assert_eq!(msg["data"], "live");
    positions[1] = format!("{}:{}", msg["epoch"].as_str().unwrap(), msg["offset"]);
    drop(reader);

    node.publish("s1", &json!("missed"));
    let resume = request(&format!("{url}&since={}", positions.join(",")), "");
    assert!(resume.len() <= 8192, "{} bytes", resume.len());
    let (status, mut reader) = send(&node, &resume);
    assert_eq!(status, 200);
    let mut recovered = 0;
    loop {
        let line = next_line(&mut reader);
        if line["op"] == "subscribed" {
            assert_eq!(line["recovered"], true, "{line}");
            recovered += 1;
        } else {
            assert_eq!(
                (&line["subject"], &line["data"]),
                (&json!("s1"), &json!("missed"))
            );
            break;
        }
    }
    assert!(recovered >= 2, "s1's replay follows its subscribed");
}

/// A Redis that restarts empty breaks every subject of a wide stream at
/// once: each is told (`subscribed`, `"recovered":false`), and the stream
/// is not cut for it. One cursor per announcement would be N² bytes again.
#[test]
fn a_wide_stream_whose_every_subject_breaks_at_once_is_told_and_not_cut() {
    let mut redis = RedisServer::start();
    let node = Node::in_cluster_of(&[&redis], "wide", &["--max-request-head", "65536"]);
    let subjects = 1_024;
    let opening = open_sse(&node, 65_536, ('w', subjects), None);
    let before: Vec<String> = opening.cursor.split(',').map(str::to_owned).collect();
    let mut reader = opening.reader;
    redis.restart();
    let (mut broken, mut told_bytes, mut cursors) = (0, 0, 0);
    let cursor = loop {
        let (lines, size) = next_event(&mut reader);
        assert_ne!(field(&lines, "event: "), Some("close"), "cut: {lines:?}");
        match field(&lines, "data: ") {
            Some(data) => {
                let value: Value = serde_json::from_str(data).unwrap();
                assert_eq!(value["recovered"], false, "{value}");
                broken += 1;
                told_bytes += size;
            }
            None if lines.iter().all(|l| l.starts_with(':')) => {} // a heartbeat
            None if broken == subjects => break field(&lines, "id: ").unwrap().to_owned(),
            None => {
                assert!(field(&lines, "id: ").is_some(), "{lines:?}");
                cursors += 1;
            }
        }
    };
    // Each announcement carries no cursor, and a cursor goes out once per
    // worker turn that moved it, not once per break: how many turns the
    // breaks take depends on the box's load, N of them would be N² bytes.
    assert!(
        told_bytes < 150 * subjects,
        "{told_bytes} bytes to tell {subjects} breaks"
    );
    assert!(
        cursors < 64,
        "{cursors} cursors of {subjects} entries sent while telling the breaks"
    );
    let after: Vec<&str> = cursor.split(',').collect();
    assert_eq!(after.len(), subjects);
    assert!(after
        .iter()
        .zip(&before)
        .all(|(a, b)| a != b && a.ends_with(":0")));
}

/// Reads an SSE stream's opening by hand (some subjects may fail): the
/// `subscribed` and `error` messages, the replayed `msg`s, and the cursor
/// handed out at its end.
fn read_opening(reader: &mut BufReader<TcpStream>, subjects: usize) -> (Vec<Value>, String) {
    let mut told: Vec<Value> = Vec::new();
    loop {
        let (lines, _) = next_event(reader);
        assert_ne!(field(&lines, "event: "), Some("close"), "cut: {lines:?}");
        if field(&lines, "retry: ").is_some() || lines.iter().all(|l| l.starts_with(':')) {
            continue;
        }
        match field(&lines, "data: ") {
            Some(data) => told.push(serde_json::from_str(data).unwrap()),
            None => {
                let answered = told.iter().filter(|v| v["op"] != "msg").count();
                assert_eq!(answered, subjects, "every subject answered: {told:?}");
                return (told, field(&lines, "id: ").unwrap().to_owned());
            }
        }
    }
}

/// The subjects of `told` whose messages have `op`.
fn subjects_of(told: &[Value], op: &str) -> Vec<String> {
    let mut subjects: Vec<String> = told
        .iter()
        .filter(|v| v["op"] == op)
        .map(|v| v["subject"].as_str().unwrap().to_owned())
        .collect();
    subjects.sort();
    subjects
}

/// A stream whose subscribe fails for some of its subjects (their Redis is
/// down) still hands out a cursor of every subject of its URL, so the
/// browser's reconnect is taken (not 400 `invalid_position`) and resumes
/// the subjects that were live without loss; the failed ones are tried
/// again, from the entry the request brought.
#[test]
fn a_stream_whose_subscribe_failed_for_some_subjects_resumes_with_its_cursor() {
    let mut instances = [RedisServer::start(), RedisServer::start()];
    let node = Node::in_cluster_of(
        &[&instances[0], &instances[1]],
        "gaps",
        &["--workers", "1", "--redis-timeout", "2s"],
    );
    instances[1].kill();
    let subjects = 8;
    let url = named("/sse", 'g', subjects);
    let (status, mut reader) = send(&node, &request(&url, ""));
    assert_eq!(status, 200);
    let (told, cursor) = read_opening(&mut reader, subjects);
    let live = subjects_of(&told, "subscribed");
    let failed = subjects_of(&told, "error");
    assert!(!live.is_empty() && !failed.is_empty(), "{told:?}");
    assert!(told
        .iter()
        .filter(|v| v["op"] == "error")
        .all(|v| v["code"] == "unavailable"));
    let entries: Vec<&str> = cursor.split(',').collect();
    assert_eq!(entries.len(), subjects, "one entry per subject: {cursor}");
    for (i, entry) in entries.iter().enumerate() {
        let failed_here = failed.contains(&format!("g{i}"));
        assert_eq!(entry.is_empty(), failed_here, "g{i}: {cursor}");
    }

    // A live subject's publication; then the client is cut.
    node.publish(&live[0], &json!("seen"));
    let (msg, last_id) = next_msg(&mut reader);
    assert_eq!(msg["data"], "seen");
    drop(reader);
    assert_eq!(last_id.split(',').count(), subjects, "{last_id}");

    // Published while away, on every live subject: recovered on resuming
    // with the id the stream handed out.
    for subject in &live {
        node.publish(subject, &json!(format!("missed {subject}")));
    }
    let (status, mut reader) = send(
        &node,
        &request(&url, &format!("Last-Event-ID: {last_id}\r\n")),
    );
    assert_eq!(status, 200, "the cursor handed out is taken");
    let (told, cursor) = read_opening(&mut reader, subjects);
    assert_eq!(subjects_of(&told, "subscribed"), live);
    assert!(told
        .iter()
        .filter(|v| v["op"] == "subscribed")
        .all(|v| v["recovered"] == true));
    assert_eq!(subjects_of(&told, "error"), failed, "tried again");
    let replayed: Vec<String> = told
        .iter()
        .filter(|v| v["op"] == "msg")
        .map(|v| v["data"].as_str().unwrap().to_owned())
        .collect();
    let mut want: Vec<String> = live.iter().map(|s| format!("missed {s}")).collect();
    let mut got = replayed.clone();
    got.sort();
    want.sort();
    assert_eq!(got, want, "nothing lost, nothing repeated");
    assert_eq!(cursor.split(',').count(), subjects, "{cursor}");
    drop(reader);

    // A long-poll takes the same cursor as `since`, and answers with one
    // of every subject too.
    node.publish(&live[0], &json!("polled"));
    let poll = named("/poll", 'g', subjects);
    let (status, mut reader) = send(
        &node,
        &request(&format!("{poll}&since={cursor}"), "Connection: close\r\n"),
    );
    assert_eq!(status, 200, "the cursor handed out is taken as since");
    let mut body = String::new();
    reader.read_to_string(&mut body).unwrap();
    let answer: Vec<Value> = serde_json::from_str(&body).unwrap();
    assert!(answer.iter().any(|v| v["data"] == "polled"), "{body}");
    let since = answer.last().unwrap()["since"].as_str().unwrap();
    assert_eq!(since.split(',').count(), subjects, "{since}");
}

/// A burst of publications on a wide SSE stream costs O(1) bytes each
/// beyond their `data:` lines: the whole cursor is handed out once per
/// worker turn, after the turn's last publication, not with every event
/// (100 entries, about 3.8 KB). The last cursor still resumes every subject.
#[test]
fn a_burst_on_a_wide_sse_stream_costs_o1_bytes_a_publication_and_one_cursor_a_turn() {
    // Room for the old way's cursor per event, so that both are measured
    // whole instead of cut.
    let node = Node::start(&["--workers", "1", "--max-outbound-bytes", "16777216"]);
    let subjects = 100;
    let opening = open_sse(&node, 8192, ('p', subjects), None);
    let mut reader = opening.reader;
    let per_subject = 10;
    let total = subjects * per_subject;
    let messages: Vec<Value> = (0..total)
        .map(|i| json!({"subject": format!("p{}", i % subjects), "data": i}))
        .collect();
    let body = json!({ "messages": messages }).to_string();
    let (status, reply) = node.http("POST", "/api/publish", &node.key_headers(), &body);
    assert_eq!(status, 200, "{reply}");

    let (mut bytes, mut data_bytes, mut received, mut cursors) = (0, 0, 0, 0);
    let last_id = loop {
        let (lines, size) = next_event(&mut reader);
        if lines.iter().all(|l| l.starts_with(':')) {
            continue; // a heartbeat
        }
        bytes += size;
        if let Some(data) = field(&lines, "data: ") {
            let value: Value = serde_json::from_str(data).unwrap();
            assert_eq!(value["op"], "msg", "{value}");
            received += 1;
            data_bytes += "data: ".len() + data.len() + 1;
        }
        let Some(id) = field(&lines, "id: ") else {
            continue;
        };
        cursors += 1;
        let done = format!(":{per_subject}");
        if received == total && id.split(',').all(|e| e.ends_with(&done)) {
            break id.to_owned();
        }
    };
    let overhead = bytes - data_bytes;
    eprintln!(
        "{total} publications on {subjects} subjects: {bytes} bytes, {data_bytes} of data \
         lines, {overhead} more ({:.1} a publication), {cursors} cursors",
        overhead as f64 / total as f64
    );
    // One blank line a publication, and a few cursors of 100 entries.
    assert!(cursors <= total / 50, "{cursors} cursors for {total}");
    let cursor_room = "id: ".len() + subjects * ENTRY_ROOM + 1;
    assert!(
        overhead <= total + cursors * cursor_room,
        "{overhead} bytes beside the data for {total} publications"
    );
    drop(reader);

    // The last cursor resumes every subject: only what came after it.
    node.publish("p7", &json!("after"));
    let resumed = open_sse(&node, 8192, ('p', subjects), Some(&last_id));
    assert!(resumed.subscribed.iter().all(|a| a["recovered"] == true));
    assert_eq!(resumed.replayed, [("p7".to_owned(), json!("after"))]);
}
