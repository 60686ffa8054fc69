//! TLS for `wss://` targets: the rustls client configuration a worker's
//! connections share, and the server name each one checks.
//!
//! The bench runs rustls as it comes (its buffered client connection): the
//! bench's own memory per connection is reported, not judged, and what it
//! measures over TLS is the server's handshakes and the server's memory.
//! The configuration matches a browser's for what the server sees: TLS 1.3,
//! ALPN `http/1.1`, no client certificate.

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::ring as provider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};
use thiserror::Error;

/// Why TLS could not be set up.
#[derive(Debug, Error)]
pub enum TlsError {
    #[error("a wss:// URL needs --tls-ca: the PEM certificate(s) to trust")]
    NoCa,
    #[error("--tls-ca {path}: {message}")]
    Ca { path: String, message: String },
    #[error("{0:?}: not a name or address TLS can check a certificate for")]
    ServerName(String),
    #[error("TLS: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The client configuration, trusting the certificates in the PEM file `ca`.
pub fn client_config(ca: Option<&Path>) -> Result<Arc<ClientConfig>, TlsError> {
    let ca = ca.ok_or(TlsError::NoCa)?;
    let bad = |message: String| TlsError::Ca {
        path: ca.display().to_string(),
        message,
    };
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca).map_err(|e| bad(e.to_string()))?;
    for cert in certs {
        roots
            .add(cert.map_err(|e| bad(e.to_string()))?)
            .map_err(|e| bad(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(bad("no certificate in the file".into()));
    }
    let mut config = ClientConfig::builder_with_provider(Arc::new(provider::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A client connection to `host` (`name:port` as in the URL).
pub fn connect(config: &Arc<ClientConfig>, host: &str) -> Result<ClientConnection, TlsError> {
    let name = host.rsplit_once(':').map_or(host, |(name, _)| name);
    let name = name.trim_start_matches('[').trim_end_matches(']');
    let server =
        ServerName::try_from(name.to_owned()).map_err(|_| TlsError::ServerName(host.to_owned()))?;
    Ok(ClientConnection::new(Arc::clone(config), server)?)
}
