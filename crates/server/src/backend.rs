//! The one HTTP client to the application's backend: where a backend URL
//! points ([`Target`]) and one signed POST to it ([`post`]), used by the
//! lifecycle hooks' delivery thread and the proxies' thread alike.
//!
//! It owns the wire only: a connection per request, or kept alive in a
//! [`Pool`] between requests (hyper's HTTP/1.1 client over a tokio
//! `TcpStream`, inside TLS for an `https://` URL, the backend's
//! certificate checked against `backend_ca_file` or else the system's
//! trusted roots), the headers its caller adds (the
//! HMAC signature of `hooks::sign::headers`, which both callers use, so
//! the backend verifies one scheme), the deadline and a bound on the
//! answer's body. What a status or a body means is its callers'. It runs
//! only inside a tokio runtime of its caller's thread, never on a worker.
//! A leaf: it names no other module of the crate.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use rustls::crypto::ring::default_provider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};

/// Where requests to one backend URL go, taken apart once.
#[derive(Clone, Debug)]
pub struct Target {
    /// `host:port`, the port made explicit, what is connected to and the
    /// `Host` header.
    authority: String,
    /// The path and query, `/` when the URL has none.
    path: String,
    /// For an `https://` URL: the name its certificate must carry, and
    /// the roots it is checked against.
    tls: Option<(ServerName<'static>, Arc<ClientConfig>)>,
}

/// Why a backend URL cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("not an http:// or https:// URL with a host")]
    Scheme,
    #[error("backend_ca_file {path:?}: {why}")]
    Authorities { path: String, why: String },
    #[error("no trusted roots for https:// (the system has none: set backend_ca_file)")]
    NoRoots,
}

impl Target {
    /// Takes an `http://` or `https://` URL with a host apart; an
    /// `https://` one trusts the certificate authorities of the PEM file
    /// `ca` when given, else the system's roots (read here, once).
    pub fn parse(url: &str, ca: Option<&Path>) -> Result<Target, TargetError> {
        let uri: hyper::Uri = url.parse().map_err(|_| TargetError::Scheme)?;
        let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
            return Err(TargetError::Scheme);
        };
        let port = match scheme {
            "http" => 80,
            "https" => 443,
            _ => return Err(TargetError::Scheme),
        };
        if authority.host().is_empty() {
            return Err(TargetError::Scheme);
        }
        let tls = if port == 443 {
            let host = authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']');
            let name = ServerName::try_from(host.to_owned()).map_err(|_| TargetError::Scheme)?;
            Some((name, client_config(ca)?))
        } else {
            None
        };
        Ok(Target {
            authority: format!(
                "{}:{}",
                authority.host(),
                authority.port_u16().unwrap_or(port)
            ),
            path: uri
                .path_and_query()
                .map_or("/".to_owned(), |p| p.as_str().to_owned()),
            tls,
        })
    }
}

/// What an `https://` backend's certificate is checked against: the
/// authorities of `ca`, or the system's roots.
fn client_config(ca: Option<&Path>) -> Result<Arc<ClientConfig>, TargetError> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(path) => {
            let failed = |why: String| TargetError::Authorities {
                path: path.display().to_string(),
                why,
            };
            let bytes = std::fs::read(path).map_err(|e| failed(e.to_string()))?;
            for certificate in CertificateDer::pem_slice_iter(&bytes) {
                let certificate = certificate.map_err(|e| failed(e.to_string()))?;
                roots.add(certificate).map_err(|e| failed(e.to_string()))?;
            }
        }
        None => {
            // Certificates the system lists but rustls cannot read are
            // skipped, as every other TLS client does.
            let _ = roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    if roots.is_empty() {
        return Err(TargetError::NoRoots);
    }
    let config = ClientConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring offers the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The backend's answer: its status and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
}

/// Why no answer came back.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    #[error("{0}")]
    Failed(String),
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The most idle connections a [`Pool`] keeps.
pub const MAX_IDLE: usize = 64;

/// Kept-alive connections to one target, idle between calls: a call takes
/// one (or opens one) and gives it back once its answer is read whole, so
/// a busy caller neither pays a TCP handshake per call nor leaves a
/// TIME_WAIT socket behind each. The lock is taken only to push or pop,
/// never across an `.await`.
#[derive(Default)]
pub struct Pool {
    idle: Mutex<Vec<Sender>>,
}

impl Pool {
    /// An idle connection still open and ready for a request.
    fn take(&self) -> Option<Sender> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(sender) = idle.pop() {
            if sender.is_ready() {
                return Some(sender);
            }
        }
        None
    }

    fn give(&self, sender: Sender) {
        if !sender.is_ready() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(sender);
        }
    }
}

/// Opens a connection to `target`, driven by a task of its own until its
/// sender is dropped or the peer closes it.
async fn connect(target: &Target) -> Result<Sender, BoxError> {
    let stream = tokio::net::TcpStream::connect(target.authority.as_str()).await?;
    let Some((name, config)) = &target.tls else {
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        return Ok(sender);
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(config));
    let stream = connector.connect(name.clone(), stream).await?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

/// One request on `sender`, its body read as [`post`] says.
async fn exchange(
    sender: &mut Sender,
    request: hyper::Request<Full<Bytes>>,
    max_answer: usize,
) -> Result<Answer, BoxError> {
    let answer = sender.send_request(request).await?;
    let status = answer.status().as_u16();
    if max_answer == 0 {
        return Ok(Answer {
            status,
            body: Bytes::new(),
        });
    }
    let body = Limited::new(answer.into_body(), max_answer)
        .collect()
        .await?
        .to_bytes();
    Ok(Answer { status, body })
}

/// POSTs `body` as JSON to `target` with `headers` (the signature's)
/// within `timeout` (connect to the status line, and to the body's last
/// byte when it is read); the answer's body is read up to `max_answer`
/// bytes (a longer one is a failure), and not at all with 0 (a receiver
/// whose status alone counts). Without a `pool` the request has a
/// connection of its own; with one it takes a kept-alive connection, and a
/// request that fails on one (the backend may have closed it meanwhile) is
/// made once more on a new connection, within the same `timeout`.
pub async fn post(
    target: &Target,
    pool: Option<&Pool>,
    headers: &[(&'static str, String)],
    body: Bytes,
    timeout: Duration,
    max_answer: usize,
) -> Result<Answer, PostError> {
    let request = || {
        let mut request = hyper::Request::post(target.path.as_str())
            .header(hyper::header::HOST, target.authority.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json");
        for (name, value) in headers {
            request = request.header(*name, value.as_str());
        }
        request
            .body(Full::new(body.clone()))
            .expect("a request from checked parts")
    };
    let attempt = async {
        if let Some(mut sender) = pool.and_then(Pool::take) {
            if let Ok(answer) = exchange(&mut sender, request(), max_answer).await {
                if let Some(pool) = pool {
                    pool.give(sender);
                }
                return Ok(answer);
            }
        }
        let mut sender = connect(target).await?;
        let answer = exchange(&mut sender, request(), max_answer).await?;
        if let Some(pool) = pool {
            pool.give(sender);
        }
        Ok::<Answer, BoxError>(answer)
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(error)) => Err(PostError::Failed(error.to_string())),
        Err(_) => Err(PostError::TimedOut(timeout)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_urls_taken_apart() {
        let t = Target::parse("http://127.0.0.1:9/p?q=1", None).unwrap();
        assert_eq!(t.authority, "127.0.0.1:9");
        assert_eq!(t.path, "/p?q=1");
        assert!(t.tls.is_none());
        let t = Target::parse("http://backend.test", None).unwrap();
        assert_eq!(t.authority, "backend.test:80");
        assert_eq!(t.path, "/");
    }

    #[test]
    fn other_urls_refused() {
        for url in ["ftp://a/", "a/b", "", "http://", "http:///x", "https://"] {
            assert!(
                matches!(Target::parse(url, None), Err(TargetError::Scheme)),
                "{url}"
            );
        }
        let missing = Path::new("/nonexistent/ca.pem");
        assert!(matches!(
            Target::parse("https://a/", Some(missing)),
            Err(TargetError::Authorities { .. })
        ));
    }
}
