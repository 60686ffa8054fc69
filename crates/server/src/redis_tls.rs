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

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redis::{ClientTlsConfig, ConnectionAddr, ConnectionInfo, TlsCertificates};
use rustls::crypto::ring::default_provider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};
use thiserror::Error;

/// Why a file of the Redis TLS settings cannot be used; each names its
/// setting and path.
#[derive(Debug, Error)]
pub enum RedisTlsError {
    #[error("cannot read {setting} {path:?}: {source}")]
    Read {
        setting: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{setting} {path:?}: {source}")]
    Pem {
        setting: &'static str,
        path: PathBuf,
        source: pem::Error,
    },
    #[error("{setting} {path:?} holds no PEM certificate")]
    NoCertificate {
        setting: &'static str,
        path: PathBuf,
    },
    #[error("redis_tls_ca {path:?}: a certificate that cannot be trusted: {source}")]
    BadAuthority {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("redis_tls_cert {cert:?} with redis_tls_key {key:?}: {source}")]
    BadClientCertificate {
        cert: PathBuf,
        key: PathBuf,
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

/// The contents of the Redis TLS files, read at start.
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
        let ca = match &self.ca {
            Some(path) => {
                let (bytes, found) = certificates_in("redis_tls_ca", path)?;
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
                let (chain_bytes, chain) = certificates_in("redis_tls_cert", cert)?;
                let (key_bytes, private_key) = key_in("redis_tls_key", key)?;
                let bad = |source| RedisTlsError::BadClientCertificate {
                    cert: cert.clone(),
                    key: key.clone(),
                    source,
                };
                ClientConfig::builder_with_provider(Arc::new(default_provider()))
                    .with_safe_default_protocol_versions()
                    .map_err(bad)?
                    .with_root_certificates(RootCertStore::empty())
                    .with_client_auth_cert(chain, private_key)
                    .map_err(bad)?;
                Some((chain_bytes, key_bytes))
            }
            // The configuration refuses one without the other.
            _ => None,
        };
        Ok((ca.is_some() || client.is_some()).then_some(RedisTls { ca, client }))
    }
}

fn read(setting: &'static str, path: &Path) -> Result<Vec<u8>, RedisTlsError> {
    std::fs::read(path).map_err(|source| RedisTlsError::Read {
        setting,
        path: path.to_owned(),
        source,
    })
}

/// A file's bytes and the certificates it holds.
type Certificates = (Vec<u8>, Vec<CertificateDer<'static>>);

/// The file's bytes and its certificates: at least one, and nothing
/// malformed. An empty list of trusted roots would only show at the first
/// connection, as an unknown issuer.
fn certificates_in(setting: &'static str, path: &Path) -> Result<Certificates, RedisTlsError> {
    let bytes = read(setting, path)?;
    let found = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| RedisTlsError::Pem {
            setting,
            path: path.to_owned(),
            source,
        })?;
    if found.is_empty() {
        return Err(RedisTlsError::NoCertificate {
            setting,
            path: path.to_owned(),
        });
    }
    Ok((bytes, found))
}

/// The file's bytes and the private key they hold.
fn key_in(
    setting: &'static str,
    path: &Path,
) -> Result<(Vec<u8>, PrivateKeyDer<'static>), RedisTlsError> {
    let bytes = read(setting, path)?;
    let key = PrivateKeyDer::from_pem_slice(&bytes).map_err(|source| RedisTlsError::Pem {
        setting,
        path: path.to_owned(),
        source,
    })?;
    Ok((bytes, key))
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

/// A client for `info`, with `tls`'s certificates when it is a `rediss://`
/// URL (a `redis://` one has no use for them).
pub fn client(info: ConnectionInfo, tls: Option<&RedisTls>) -> redis::RedisResult<redis::Client> {
    match tls {
        Some(tls) if matches!(info.addr(), ConnectionAddr::TcpTls { .. }) => {
            redis::Client::build_with_tls(info, tls.certificates())
        }
        _ => redis::Client::open(info),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::IntoConnectionInfo;

    fn files_in(dir: &Path, names: [Option<&str>; 3]) -> RedisTlsFiles {
        let path = |name: Option<&str>| name.map(|n| dir.join(n));
        RedisTlsFiles {
            ca: path(names[0]),
            cert: path(names[1]),
            key: path(names[2]),
        }
    }

    /// A directory with a certificate (`cert.pem`), its key (`key.pem`)
    /// and a file that is neither (`junk.pem`).
    fn pki() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
        std::fs::write(dir.path().join("cert.pem"), certified.cert.pem()).unwrap();
        let key = certified.signing_key.serialize_pem();
        std::fs::write(dir.path().join("key.pem"), key).unwrap();
        std::fs::write(dir.path().join("junk.pem"), "not PEM at all").unwrap();
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
        assert!(
            missing.starts_with("cannot read redis_tls_cert"),
            "{missing}"
        );
        assert!(missing.contains("gone.pem"), "{missing}");
        let no_cert = refusal([Some("junk.pem"), None, None]);
        assert!(no_cert.starts_with("redis_tls_ca"), "{no_cert}");
        assert!(no_cert.ends_with("holds no PEM certificate"), "{no_cert}");
        // A certificate where the key should be.
        let no_key = refusal([None, Some("cert.pem"), Some("cert.pem")]);
        assert!(no_key.starts_with("redis_tls_key"), "{no_key}");
        // A key of another certificate.
        let other = rcgen::generate_simple_self_signed(vec!["other".into()]).unwrap();
        let other_key = other.signing_key.serialize_pem();
        std::fs::write(dir.path().join("other.key"), other_key).unwrap();
        let mismatch = refusal([None, Some("cert.pem"), Some("other.key")]);
        assert!(mismatch.starts_with("redis_tls_cert"), "{mismatch}");
        assert!(mismatch.contains("other.key"), "{mismatch}");
        // PEM armour around bytes that are no certificate.
        let garbled = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        std::fs::write(dir.path().join("garbled.pem"), garbled).unwrap();
        let untrusted = refusal([Some("garbled.pem"), None, None]);
        assert!(untrusted.starts_with("redis_tls_ca"), "{untrusted}");
        assert!(untrusted.contains("cannot be trusted"), "{untrusted}");
    }

    #[test]
    fn the_certificates_go_to_tls_urls_only() {
        let dir = pki();
        let files = files_in(dir.path(), [Some("cert.pem"), None, None]);
        let tls = files.load().unwrap();
        let info = |url: &str| url.into_connection_info().unwrap();
        let with_certificates = |url| {
            let client = client(info(url), tls.as_ref()).unwrap();
            matches!(
                client.get_connection_info().addr(),
                ConnectionAddr::TcpTls {
                    tls_params: Some(_),
                    ..
                }
            )
        };
        assert!(with_certificates("rediss://127.0.0.1:1"));
        // build_with_tls would refuse a redis:// URL: it gets none.
        assert!(!with_certificates("redis://127.0.0.1:1"));
        let plain = client(info("rediss://127.0.0.1:1"), None).unwrap();
        assert!(matches!(
            plain.get_connection_info().addr(),
            ConnectionAddr::TcpTls {
                tls_params: None,
                ..
            }
        ));
    }
}
