//! TLS for the tests: a certificate made at test time with rcgen, written
//! where the node reads it, and rustls clients (tungstenite for wss,
//! reqwest for https) that trust exactly the certificates they are given.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::ring as provider;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, SupportedProtocolVersion};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::Connector;

use super::{Node, Ws};

/// A certificate and key for `localhost` (or another name), as PEM files in
/// a directory of their own.
pub struct Pki {
    dir: tempfile::TempDir,
    name: String,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The certificate the files hold now.
    pub der: CertificateDer<'static>,
}

impl Pki {
    pub fn new() -> Pki {
        Pki::for_name("localhost")
    }

    /// A certificate for `name`, a host name or an IP address.
    pub fn for_name(name: &str) -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        let mut pki = Pki {
            dir,
            name: name.to_owned(),
            cert,
            key,
            der: CertificateDer::from(Vec::new()),
        };
        pki.renew();
        pki
    }

    /// Writes a new certificate and key over the files; returns the new
    /// certificate (also kept in `der`).
    pub fn renew(&mut self) -> CertificateDer<'static> {
        let certified = rcgen::generate_simple_self_signed(vec![self.name.clone()]).unwrap();
        std::fs::write(&self.cert, certified.cert.pem()).unwrap();
        std::fs::write(&self.key, certified.signing_key.serialize_pem()).unwrap();
        self.der = certified.cert.der().clone();
        self.der.clone()
    }

    /// A path in the same directory, for files a test writes itself.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The serve flags naming these files.
    pub fn flags(&self) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            self.cert.display().to_string(),
            "--tls-key".into(),
            self.key.display().to_string(),
        ]
    }

    /// Starts a node whose client listener speaks TLS with these files.
    pub fn start(&self, extra: &[&str]) -> Node {
        let flags = self.flags();
        let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
        args.extend_from_slice(extra);
        let mut node = Node::start(&args);
        node.tls = true;
        node
    }
}

/// A TLS 1.3 client config (ALPN `http/1.1`) trusting `trusted` only.
pub fn client_config(trusted: &[&CertificateDer<'static>]) -> Arc<ClientConfig> {
    client_config_for(trusted, &[&rustls::version::TLS13])
}

pub fn client_config_for(
    trusted: &[&CertificateDer<'static>],
    versions: &[&'static SupportedProtocolVersion],
) -> Arc<ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in trusted {
        roots.add((*cert).clone()).unwrap();
    }
    let mut config = ClientConfig::builder_with_provider(Arc::new(provider::default_provider()))
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// Opens a WebSocket over TLS to `path`, reads timing out after 10 s.
pub fn wss(node: &Node, path: &str, config: &Arc<ClientConfig>) -> Ws {
    try_wss(node, path, config).expect("wss connect")
}

pub fn try_wss(
    node: &Node,
    path: &str,
    config: &Arc<ClientConfig>,
) -> Result<Ws, Box<tungstenite::Error>> {
    let stream = TcpStream::connect(node.ws).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let url = node.url(path);
    let connector = Connector::Rustls(Arc::clone(config));
    let (ws, response) = tungstenite::client_tls_with_config(url, stream, None, Some(connector))
        .map_err(|e| match e {
            tungstenite::HandshakeError::Failure(e) => Box::new(e),
            tungstenite::HandshakeError::Interrupted(_) => panic!("a blocking socket"),
        })?;
    assert_eq!(response.status(), 101);
    Ok(ws)
}

/// The rustls side of a wss connection.
pub fn tls_of(ws: &mut Ws) -> &mut rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    match ws.get_mut() {
        MaybeTlsStream::Rustls(stream) => stream,
        _ => panic!("not a TLS stream"),
    }
}

/// The certificate the server presented on `ws`.
pub fn peer_certificate(ws: &mut Ws) -> CertificateDer<'static> {
    tls_of(ws).conn.peer_certificates().unwrap()[0].clone()
}

/// A reqwest client for `https://localhost` on the node's client port,
/// trusting `cert`.
pub fn https_client(node: &Node, cert: &CertificateDer<'static>) -> reqwest::Client {
    https_client_for(node.ws, &[cert])
}

/// A reqwest client sending `https://localhost` to `addr`, trusting
/// `trusted` only, with no connection kept between requests.
pub fn https_client_for(addr: SocketAddr, trusted: &[&CertificateDer<'static>]) -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .pool_max_idle_per_host(0)
        .resolve("localhost", addr);
    for cert in trusted {
        builder = builder.add_root_certificate(reqwest::Certificate::from_der(cert).unwrap());
    }
    builder.build().unwrap()
}

pub fn https_url(node: &Node, path_and_query: &str) -> String {
    format!("https://localhost:{}{path_and_query}", node.ws.port())
}
