//! TLS towards Redis, for `rediss://` URLs: the PEM files of
//! `redis_tls_ca`, `redis_tls_cert` and `redis_tls_key`, read once at start
//! into what the node checks a Redis's certificate against and what it
//! shows a Redis that asks for a client certificate (`tls-auth-clients`).
//! The engine's instances and the follow graph's Redis use the same
//! certificates.
//!
//! Without any of the files a `rediss://` URL still speaks TLS, checked
//! against the system's trusted roots (`SSL_CERT_FILE` and `SSL_CERT_DIR`
//! name others), with no client certificate. The Redis client reads the
//! system's roots at every connection even with `redis_tls_ca` (and then
//! trusts only `redis_tls_ca`), so a broken `SSL_CERT_FILE` fails them all.
//! How a client is made from them is
//! [`myriad_graph::redis_store::client_for`], the graph store's and the
//! engine's alike.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use redis::{ClientTlsConfig, TlsCertificates};
use rustls::crypto::ring::default_provider;
use rustls::{ClientConfig, RootCertStore};
use thiserror::Error;

use crate::tls::{read_chain, read_key, CertError};

/// Why a file of the Redis TLS settings cannot be used; each names its
/// setting.
#[derive(Debug, Error)]
pub enum RedisTlsError {
    #[error("{setting}: {source}")]
    File {
        setting: &'static str,
        /// Boxed: the error of a start-up, kept small on every `Result`.
        source: Box<CertError>,
    },
    #[error("redis_tls_ca {path:?}: a certificate that cannot be trusted: {source}")]
    BadAuthority {
        path: PathBuf,
        source: rustls::Error,
    },
}

/// Where the Redis TLS files are, from the configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTlsFiles {
    /// Certificate authorities to check a Redis's certificate against,
    /// instead of the system's roots.
    pub ca: Option<PathBuf>,
    /// The client certificate chain and its key (both or neither).
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// The contents of the Redis TLS files, read at start: PEM, as the Redis
/// client takes them.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisTls {
    ca: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl RedisTlsFiles {
    /// Reads the files and checks that each holds what it is for, as the
    /// Redis client will use it (authorities it can trust, a certificate
    /// its key matches), so that nothing about them is first found when a
    /// connection is made; `None` when none is set.
    pub fn load(&self) -> Result<Option<RedisTls>, RedisTlsError> {
        let file = |setting| {
            move |source| RedisTlsError::File {
                setting,
                source: Box::new(source),
            }
        };
        let ca = match &self.ca {
            Some(path) => {
                let (bytes, found) = read_chain(path).map_err(file("redis_tls_ca"))?;
                let mut roots = RootCertStore::empty();
                for certificate in found {
                    roots
                        .add(certificate)
                        .map_err(|source| RedisTlsError::BadAuthority {
                            path: path.clone(),
                            source,
                        })?;
                }
                Some(bytes)
            }
            None => None,
        };
        let client = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let (chain_bytes, chain) = read_chain(cert).map_err(file("redis_tls_cert"))?;
                let (key_bytes, private_key) = read_key(key).map_err(file("redis_tls_key"))?;
                let unusable = |source| {
                    file("redis_tls_cert")(CertError::Unusable {
                        cert: cert.clone(),
                        key: key.clone(),
                        source,
                    })
                };
                ClientConfig::builder_with_provider(Arc::new(default_provider()))
                    .with_safe_default_protocol_versions()
                    .map_err(unusable)?
                    .with_root_certificates(RootCertStore::empty())
                    .with_client_auth_cert(chain, private_key)
                    .map_err(unusable)?;
                Some((chain_bytes, key_bytes))
            }
            // The configuration refuses one without the other.
            _ => None,
        };
        Ok((ca.is_some() || client.is_some()).then_some(RedisTls { ca, client }))
    }
}

impl RedisTls {
    /// The certificates in the form the Redis client takes them.
    pub fn certificates(&self) -> TlsCertificates {
        TlsCertificates {
            client_tls: self.client.as_ref().map(|(cert, key)| ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
            root_cert: self.ca.clone(),
        }
    }
}

/// Never prints the key.
impl fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca", &self.ca.as_ref().map(Vec::len))
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn files_in(dir: &Path, names: [Option<&str>; 3]) -> RedisTlsFiles {
        let path = |name: Option<&str>| name.map(|n| dir.join(n));
        RedisTlsFiles {
            ca: path(names[0]),
            cert: path(names[1]),
            key: path(names[2]),
        }
    }

    /// A directory with a certificate (`cert.pem`), its key (`key.pem`),
    /// another certificate's key (`other.key`), a file that is no PEM
    /// (`junk.pem`) and PEM armour around bytes that are no certificate
    /// (`garbled.pem`).
    fn pki() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
        write("cert.pem", &certified.cert.pem());
        write("key.pem", &certified.signing_key.serialize_pem());
        let other = rcgen::generate_simple_self_signed(vec!["other".into()]).unwrap();
        write("other.key", &other.signing_key.serialize_pem());
        write("junk.pem", "not PEM at all");
        write(
            "garbled.pem",
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        );
        dir
    }

    #[test]
    fn no_file_set_is_no_tls_setting() {
        assert_eq!(RedisTlsFiles::default().load().unwrap(), None);
    }

    #[test]
    fn the_files_are_read_into_the_certificates_the_client_takes() {
        let dir = pki();
        let read = |name| std::fs::read(dir.path().join(name)).unwrap();
        let files = files_in(
            dir.path(),
            [Some("cert.pem"), Some("cert.pem"), Some("key.pem")],
        );
        let tls = files.load().unwrap().unwrap();
        let certs = tls.certificates();
        assert_eq!(certs.root_cert, Some(read("cert.pem")));
        let client = certs.client_tls.unwrap();
        assert_eq!(client.client_cert, read("cert.pem"));
        assert_eq!(client.client_key, read("key.pem"));
        assert!(
            !format!("{tls:?}").contains("PRIVATE"),
            "the key is never printed"
        );
        // The authorities alone are a setting too.
        let ca_only = files_in(dir.path(), [Some("cert.pem"), None, None])
            .load()
            .unwrap();
        assert!(ca_only.unwrap().certificates().client_tls.is_none());
    }

    #[test]
    fn a_file_that_cannot_serve_is_named_with_its_setting() {
        let dir = pki();
        let refusal = |names| files_in(dir.path(), names).load().unwrap_err().to_string();
        let missing = refusal([None, Some("gone.pem"), Some("key.pem")]);
        assert!(missing.starts_with("redis_tls_cert: "), "{missing}");
        assert!(missing.contains("gone.pem"), "{missing}");
        let no_cert = refusal([Some("junk.pem"), None, None]);
        assert!(no_cert.starts_with("redis_tls_ca: "), "{no_cert}");
        assert!(no_cert.ends_with("holds no certificate"), "{no_cert}");
        // A certificate where the key should be.
        let no_key = refusal([None, Some("cert.pem"), Some("cert.pem")]);
        assert!(no_key.starts_with("redis_tls_key: "), "{no_key}");
        // A key of another certificate.
        let mismatch = refusal([None, Some("cert.pem"), Some("other.key")]);
        assert!(mismatch.starts_with("redis_tls_cert: "), "{mismatch}");
        assert!(mismatch.contains("other.key"), "{mismatch}");
        let untrusted = refusal([Some("garbled.pem"), None, None]);
        assert!(untrusted.starts_with("redis_tls_ca "), "{untrusted}");
        assert!(untrusted.contains("cannot be trusted"), "{untrusted}");
    }
}
