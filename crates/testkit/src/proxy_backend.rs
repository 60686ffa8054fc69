//! A backend answering the node's proxy calls on a loopback port, written
//! from docs/operations.md ("Backend proxies") alone: a plain-socket
//! HTTP/1.1 server, a thread per connection (so one slow answer holds
//! only its own call) kept alive across calls and counted, that reads each
//! call's JSON, checks its signature
//! like the hook receiver, and answers what the test's function says:
//! allow, refuse, an admission, after a delay, or malformed.

use std::io::{BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::Duration;

use ring::hmac;
use serde_json::Value;

use crate::hook_receiver::{read_request, verify, Taken};

/// What the backend answers one call.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: String,
    /// How long it waits before answering.
    pub delay: Duration,
}

impl Reply {
    pub fn json(body: Value) -> Reply {
        Reply {
            status: 200,
            body: body.to_string(),
            delay: Duration::ZERO,
        }
    }

    pub fn allow() -> Reply {
        Reply::json(serde_json::json!({"allow": true}))
    }

    pub fn refuse(code: &str, reason: &str) -> Reply {
        Reply::json(serde_json::json!({"allow": false, "code": code, "reason": reason}))
    }

    /// A body that is not JSON, with a 200.
    pub fn malformed() -> Reply {
        Reply {
            status: 200,
            body: "{\"allow\": tru".to_owned(),
            delay: Duration::ZERO,
        }
    }

    /// The same answer, `delay` later.
    pub fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

/// See the module header. Its threads end with the test process.
pub struct ProxyBackend {
    url: String,
    taken: Mutex<mpsc::Receiver<Taken>>,
    /// Connections accepted so far.
    connections: Arc<AtomicUsize>,
}

impl ProxyBackend {
    /// Starts a backend checking signatures with `secret` and answering
    /// each call (its parsed body) with `answer`.
    pub fn start(
        secret: &[u8],
        answer: impl Fn(&Value) -> Reply + Send + Sync + 'static,
    ) -> ProxyBackend {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/proxy", listener.local_addr().unwrap());
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
        let answer = Arc::new(answer);
        let (report, taken) = mpsc::channel();
        let connections = Arc::new(AtomicUsize::new(0));
        let opened = Arc::clone(&connections);
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                opened.fetch_add(1, Ordering::Relaxed);
                let (key, answer, report) = (key.clone(), Arc::clone(&answer), report.clone());
                thread::spawn(move || {
                    let mut stream = BufReader::new(stream);
                    // Kept alive: one request after another until the node
                    // closes the connection.
                    while let Some((timestamp, signature, body)) = read_request(&mut stream) {
                        let verified = verify(&key, timestamp, &signature, &body);
                        let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        let reply = answer(&body);
                        thread::sleep(reply.delay);
                        let head = format!(
                            "HTTP/1.1 {} X\r\ncontent-type: application/json\r\n\
                             content-length: {}\r\n\r\n",
                            reply.status,
                            reply.body.len()
                        );
                        let out = stream.get_mut();
                        let sent = out
                            .write_all(head.as_bytes())
                            .and_then(|()| out.write_all(reply.body.as_bytes()));
                        let _ = report.send(Taken {
                            status: reply.status,
                            verified,
                            body,
                        });
                        if sent.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        ProxyBackend {
            url,
            taken: Mutex::new(taken),
            connections,
        }
    }

    /// The URL to give the node as a `proxy_*_url`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Connections the node has opened to it so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// The next call answered, if one is within `within`.
    pub fn next_within(&self, within: Duration) -> Option<Taken> {
        self.taken.lock().unwrap().recv_timeout(within).ok()
    }
}
