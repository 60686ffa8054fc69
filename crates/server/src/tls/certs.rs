//! The node's certificate and key: read from PEM files into the rustls
//! configuration every handshake starts from, at start and again on
//! SIGHUP.
//!
//! A reload swaps the configuration only if the new files make a working
//! one; otherwise the previous certificate stays in use. Connections hold
//! no reference to it once their handshake is done, and a handshake in
//! progress keeps the configuration it started with, so a reload drops
//! nothing (`crate::reloadable` holds the swap, shared with the token
//! keys). Workers read the current configuration through an [`Acceptor`],
//! which takes the lock only after a reload changed it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::ring as provider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::NoServerSessionStorage;
use rustls::ServerConfig;
use thiserror::Error;

use crate::reloadable::{Reloadable, View};

/// Where the certificate chain and its private key are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificates, the server's own first, then its chain.
    pub cert: PathBuf,
    /// The PEM private key of the first certificate.
    pub key: PathBuf,
}

/// Why the files could not be made into a TLS configuration.
#[derive(Debug, Error)]
pub enum CertError {
    #[error("TLS certificate file {path}: {source}")]
    Certificate { path: PathBuf, source: pem::Error },
    #[error("TLS certificate file {path} holds no certificate")]
    NoCertificate { path: PathBuf },
    #[error("TLS key file {path}: {source}")]
    Key { path: PathBuf, source: pem::Error },
    #[error("TLS certificate {cert} with key {key}: {source}")]
    Unusable {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
}

/// Builds the configuration every client handshake uses: TLS 1.3 only
/// (the record layer in `super::record` speaks nothing else), ALPN
/// `http/1.1` (WebSocket and the HTTP transports are HTTP/1.1), no session
/// tickets or resumption (nothing may follow the handshake but what the
/// record layer handles; a ticket store would be memory of its own), and
/// secret extraction on (the record layer needs the traffic keys).
pub fn server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, CertError> {
    let (_, chain) = read_chain(&files.cert)?;
    let (_, key) = read_key(&files.key)?;
    let unusable = |source| CertError::Unusable {
        cert: files.cert.clone(),
        key: files.key.clone(),
        source,
    };
    let mut config = ServerConfig::builder_with_provider(Arc::new(provider::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(unusable)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(unusable)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.enable_secret_extraction = true;
    Ok(Arc::new(config))
}

/// A PEM file's bytes and the certificates they hold: at least one, and
/// nothing malformed. Also what the node's TLS towards Redis reads.
pub fn read_chain(path: &Path) -> Result<(Vec<u8>, Vec<CertificateDer<'static>>), CertError> {
    let failed = |source| CertError::Certificate {
        path: path.to_owned(),
        source,
    };
    let bytes = std::fs::read(path).map_err(|e| failed(pem::Error::Io(e)))?;
    let chain = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(failed)?;
    if chain.is_empty() {
        return Err(CertError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok((bytes, chain))
}

/// A PEM file's bytes and the private key they hold (the first).
pub fn read_key(path: &Path) -> Result<(Vec<u8>, PrivateKeyDer<'static>), CertError> {
    let failed = |source| CertError::Key {
        path: path.to_owned(),
        source,
    };
    let bytes = std::fs::read(path).map_err(|e| failed(pem::Error::Io(e)))?;
    let key = PrivateKeyDer::from_pem_slice(&bytes).map_err(failed)?;
    Ok((bytes, key))
}

/// The configuration in force, and the files it is reloaded from.
#[derive(Debug)]
pub struct Certificates {
    files: TlsFiles,
    current: Arc<Reloadable<ServerConfig>>,
}

impl Certificates {
    /// Reads the files; fails if they do not make a working configuration.
    pub fn load(files: TlsFiles) -> Result<Certificates, CertError> {
        let config = server_config(&files)?;
        Ok(Certificates {
            files,
            current: Arc::new(Reloadable::new(config)),
        })
    }

    /// Reads the files again. On success new handshakes use them; on
    /// failure nothing changes.
    pub fn reload(&self) -> Result<(), CertError> {
        self.current.replace(server_config(&self.files)?);
        Ok(())
    }

    /// The configuration new handshakes start from.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.current.current()
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }
}

/// A worker's view of the configuration: accepting a connection costs an
/// atomic load, not a lock (see [`View`]).
pub struct Acceptor {
    view: View<ServerConfig>,
}

impl Acceptor {
    pub fn new(certs: Arc<Certificates>) -> Acceptor {
        Acceptor {
            view: View::new(Arc::clone(&certs.current)),
        }
    }

    /// The configuration a new handshake starts from.
    pub fn config(&mut self) -> Arc<ServerConfig> {
        Arc::clone(self.view.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::testing;

    #[test]
    fn a_reload_reaches_acceptors_and_a_bad_one_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (files, _) = testing::certificate(dir.path());
        let certs = Arc::new(Certificates::load(files.clone()).unwrap());
        let mut acceptor = Acceptor::new(Arc::clone(&certs));
        let first = acceptor.config();
        assert!(
            Arc::ptr_eq(&first, &acceptor.config()),
            "no reload, same config"
        );

        testing::certificate(dir.path());
        certs.reload().unwrap();
        let second = acceptor.config();
        assert!(
            !Arc::ptr_eq(&first, &second),
            "the reload reached the acceptor"
        );

        std::fs::write(&files.key, "not a key").unwrap();
        assert!(matches!(certs.reload(), Err(CertError::Key { .. })));
        assert!(
            Arc::ptr_eq(&second, &acceptor.config()),
            "a failed reload changes nothing"
        );
    }

    #[test]
    fn bad_files_are_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let (files, _) = testing::certificate(dir.path());
        let missing = TlsFiles {
            cert: dir.path().join("missing.pem"),
            key: files.key.clone(),
        };
        let error = Certificates::load(missing).unwrap_err();
        assert!(error.to_string().contains("missing.pem"), "{error}");

        std::fs::write(dir.path().join("empty.pem"), "").unwrap();
        let empty = TlsFiles {
            cert: dir.path().join("empty.pem"),
            key: files.key.clone(),
        };
        assert!(matches!(
            Certificates::load(empty),
            Err(CertError::NoCertificate { .. })
        ));

        // A key that is not the certificate's.
        let other = tempfile::tempdir().unwrap();
        let (other_files, _) = testing::certificate(other.path());
        let mismatched = TlsFiles {
            cert: files.cert.clone(),
            key: other_files.key,
        };
        assert!(matches!(
            Certificates::load(mismatched),
            Err(CertError::Unusable { .. })
        ));
    }
}
