//! A lifecycle-hook receiver on a loopback port, written from
//! docs/operations.md ("Receiving hooks") alone: a plain-socket HTTP/1.1
//! server that checks each request's signature the documented way and
//! answers statuses from a script, so the node's tests and the delivery
//! task's tests talk to one receiver.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use ring::hmac;
use serde_json::Value;

/// One request the receiver took.
#[derive(Debug)]
pub struct Taken {
    /// The status it answered.
    pub status: u16,
    /// Whether `myriad-signature` matched the documented HMAC.
    pub verified: bool,
    /// The parsed body (`Null` when it was not JSON).
    pub body: Value,
}

/// See the module header. Its thread ends at the first request after the
/// receiver is dropped.
pub struct HookReceiver {
    url: String,
    taken: mpsc::Receiver<Taken>,
}

impl HookReceiver {
    /// Starts a receiver checking signatures with `secret` and answering
    /// `statuses` in turn, then 200 to everything.
    pub fn start(secret: &[u8], statuses: Vec<u16>) -> HookReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hooks", listener.local_addr().unwrap());
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
        let (report, taken) = mpsc::channel();
        thread::spawn(move || {
            let mut statuses = statuses.into_iter();
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let mut stream = BufReader::new(stream);
                let Some((timestamp, signature, body)) = read_request(&mut stream) else {
                    continue;
                };
                let verified = verify(&key, timestamp, &signature, &body);
                let status = statuses.next().unwrap_or(200);
                let answer = format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
                let _ = stream.get_mut().write_all(answer.as_bytes());
                let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                if report
                    .send(Taken {
                        status,
                        verified,
                        body,
                    })
                    .is_err()
                {
                    return;
                }
            }
        });
        HookReceiver { url, taken }
    }

    /// The URL to give the node as `hook_url`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The next request, if one comes within `within`.
    pub fn next_within(&self, within: Duration) -> Option<Taken> {
        self.taken.recv_timeout(within).ok()
    }

    /// The next request; panics when none comes within 30 s.
    pub fn next(&self) -> Taken {
        self.next_within(Duration::from_secs(30))
            .expect("a hook request within 30 s")
    }
}

/// Whether `signature` signs `body` at `timestamp` with `key`, checked the
/// documented way: HMAC-SHA256 over the timestamp's digits, ".", the raw
/// body; lowercase hex behind "v1="; compared in constant time (ring's
/// verify).
pub(crate) fn verify(key: &hmac::Key, timestamp: String, signature: &str, body: &[u8]) -> bool {
    let mut signed = timestamp.into_bytes();
    signed.push(b'.');
    signed.extend_from_slice(body);
    let tag = signature
        .strip_prefix("v1=")
        .and_then(unhex)
        .unwrap_or_default();
    hmac::verify(key, &signed, &tag).is_ok()
}

/// The timestamp and signature headers and the body of one request.
pub(crate) fn read_request(stream: &mut impl BufRead) -> Option<(String, String, Vec<u8>)> {
    let (mut length, mut timestamp, mut signature) = (0, String::new(), String::new());
    loop {
        let mut line = String::new();
        if stream.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').unwrap_or((line, ""));
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().ok()?,
            "myriad-timestamp" => timestamp = value.trim().to_owned(),
            "myriad-signature" => signature = value.trim().to_owned(),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    stream.read_exact(&mut body).ok()?;
    Some((timestamp, signature, body))
}

/// Bytes from lowercase or uppercase hex; `None` on anything else.
fn unhex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
        .collect()
}
