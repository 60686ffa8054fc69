//! A backend answering the node's proxy calls on a loopback port, written
//! from docs/operations.md ("Backend proxies") alone: a plain-socket
//! HTTP/1.1 server, a thread per connection (so one slow answer holds
//! only its own call) kept alive across calls and counted, that reads each
//! call's JSON, checks its signature
//! like the hook receiver, and answers what the test's function says:
//! allow, refuse, an admission, after a delay, or malformed. Over TLS
//! too ([`ProxyBackend::start_tls`]), with a certificate for `127.0.0.1`
//! made at start and signed by itself, its PEM in a file to trust.

use std::io::{BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
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
    /// With TLS: the directory holding `ca.pem` (removed with the
    /// backend), and that file's path, the certificate to trust.
    pki: Option<(tempfile::TempDir, PathBuf)>,
}

/// Answers the node's calls on one accepted connection until it closes.
fn serve(
    stream: impl Read + Write,
    key: &hmac::Key,
    answer: &(dyn Fn(&Value) -> Reply + Send + Sync),
    report: &mpsc::Sender<Taken>,
) {
    let mut stream = BufReader::new(stream);
    // Kept alive: one request after another until the node closes the
    // connection.
    while let Some((timestamp, signature, body)) = read_request(&mut stream) {
        let verified = verify(key, timestamp, &signature, &body);
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
            .and_then(|()| out.write_all(reply.body.as_bytes()))
            .and_then(|()| out.flush());
        let _ = report.send(Taken {
            status: reply.status,
            verified,
            body,
        });
        if sent.is_err() {
            return;
        }
    }
}

impl ProxyBackend {
    /// Starts a backend checking signatures with `secret` and answering
    /// each call (its parsed body) with `answer`.
    pub fn start(
        secret: &[u8],
        answer: impl Fn(&Value) -> Reply + Send + Sync + 'static,
    ) -> ProxyBackend {
        ProxyBackend::listen(secret, answer, None)
    }

    /// The same over TLS: its URL is `https://`, its certificate in
    /// [`ProxyBackend::ca_file`].
    pub fn start_tls(
        secret: &[u8],
        answer: impl Fn(&Value) -> Reply + Send + Sync + 'static,
    ) -> ProxyBackend {
        let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), certified.cert.pem()).unwrap();
        let key =
            rustls::pki_types::PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .unwrap();
        let mut backend = ProxyBackend::listen(secret, answer, Some(Arc::new(config)));
        let ca = dir.path().join("ca.pem");
        backend.pki = Some((dir, ca));
        backend
    }

    fn listen(
        secret: &[u8],
        answer: impl Fn(&Value) -> Reply + Send + Sync + 'static,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> ProxyBackend {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{}/proxy", listener.local_addr().unwrap());
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
        let answer: Arc<dyn Fn(&Value) -> Reply + Send + Sync> = Arc::new(answer);
        let (report, taken) = mpsc::channel();
        let connections = Arc::new(AtomicUsize::new(0));
        let opened = Arc::clone(&connections);
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                opened.fetch_add(1, Ordering::Relaxed);
                let (key, answer, report) = (key.clone(), Arc::clone(&answer), report.clone());
                let tls = tls.clone();
                thread::spawn(move || match tls {
                    None => serve(stream, &key, &*answer, &report),
                    Some(config) => {
                        let Ok(session) = rustls::ServerConnection::new(config) else {
                            return;
                        };
                        let stream: rustls::StreamOwned<_, TcpStream> =
                            rustls::StreamOwned::new(session, stream);
                        serve(stream, &key, &*answer, &report);
                    }
                });
            }
        });
        ProxyBackend {
            url,
            taken: Mutex::new(taken),
            connections,
            pki: None,
        }
    }

    /// With TLS, the PEM file of the certificate to trust
    /// (`backend_ca_file`).
    pub fn ca_file(&self) -> &Path {
        &self.pki.as_ref().expect("started with start_tls").1
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
