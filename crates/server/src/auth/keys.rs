//! The keys tokens are verified with, loaded from the settings: an HMAC
//! secret, public keys in PEM files, and a JWKS file.
//!
//! Every key is tied to one algorithm when it is loaded (HS256, RS256,
//! ES256 or EdDSA, from the kind of key), so a token can never pick how its
//! own signature is checked: the classic confusion of an RSA public key
//! used as an HMAC secret cannot happen, and `alg: none` has no key.

use std::path::{Path, PathBuf};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey};
use thiserror::Error;

/// The algorithms myriad verifies.
pub const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::HS256,
    Algorithm::RS256,
    Algorithm::ES256,
    Algorithm::EdDSA,
];

/// The shortest HMAC secret taken: HS256 is only as strong as its secret.
const MIN_SECRET: usize = 32;

/// One key, for one algorithm.
pub struct VerifyKey {
    /// The JWKS `kid`; a token naming a `kid` is checked only against it.
    pub kid: Option<String>,
    pub algorithm: Algorithm,
    pub key: DecodingKey,
}

/// Why the keys could not be loaded (the node does not start).
#[derive(Debug, Error)]
pub enum KeyError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not an RSA, P-256 or Ed25519 public key in PEM")]
    Pem { path: PathBuf },
    #[error("{path}: not a JWKS document: {source}")]
    Jwks {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path}: key {index}: {reason}")]
    Jwk {
        path: PathBuf,
        index: usize,
        reason: String,
    },
    #[error("token_hmac_secret must be at least 32 bytes (HS256 is only as strong as its secret)")]
    ShortSecret,
    /// A reload found no key at all (an empty JWKS, say): the node would
    /// refuse every token, so the keys in force stay.
    #[error("the token key files hold no key")]
    NoKeys,
}

/// Where the keys come from: the settings, kept so that SIGHUP can read
/// the files again.
#[derive(Debug, Clone, Default)]
pub struct KeySources {
    /// Given as a setting's value, not a file: read once, at start.
    pub hmac_secret: Option<String>,
    pub pem_files: Vec<PathBuf>,
    pub jwks_file: Option<PathBuf>,
}

impl KeySources {
    /// Whether any key comes from a file, that is, whether a reload can
    /// change anything.
    pub fn has_files(&self) -> bool {
        !self.pem_files.is_empty() || self.jwks_file.is_some()
    }

    /// Reads every key, the files as they are now.
    pub fn load(&self) -> Result<Vec<VerifyKey>, KeyError> {
        load(
            self.hmac_secret.as_deref(),
            &self.pem_files,
            self.jwks_file.as_deref(),
        )
    }

    /// The files, for logs.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.pem_files
            .iter()
            .map(PathBuf::as_path)
            .chain(self.jwks_file.as_deref())
    }
}

/// Loads every configured key.
pub fn load(
    hmac_secret: Option<&str>,
    pem_files: &[PathBuf],
    jwks_file: Option<&Path>,
) -> Result<Vec<VerifyKey>, KeyError> {
    let mut keys = Vec::new();
    if let Some(secret) = hmac_secret {
        if secret.len() < MIN_SECRET {
            return Err(KeyError::ShortSecret);
        }
        keys.push(VerifyKey {
            kid: None,
            algorithm: Algorithm::HS256,
            key: DecodingKey::from_secret(secret.as_bytes()),
        });
    }
    for path in pem_files {
        keys.push(pem_key(path, &read(path)?)?);
    }
    if let Some(path) = jwks_file {
        keys.extend(jwks_keys(path, &read(path)?)?);
    }
    Ok(keys)
}

fn read(path: &Path) -> Result<Vec<u8>, KeyError> {
    std::fs::read(path).map_err(|source| KeyError::Read {
        path: path.to_owned(),
        source,
    })
}

/// A public key in PEM: which algorithm it serves follows from its kind.
fn pem_key(path: &Path, pem: &[u8]) -> Result<VerifyKey, KeyError> {
    let key = |algorithm, key| VerifyKey {
        kid: None,
        algorithm,
        key,
    };
    if let Ok(k) = DecodingKey::from_rsa_pem(pem) {
        return Ok(key(Algorithm::RS256, k));
    }
    if let Ok(k) = DecodingKey::from_ec_pem(pem) {
        return Ok(key(Algorithm::ES256, k));
    }
    if let Ok(k) = DecodingKey::from_ed_pem(pem) {
        return Ok(key(Algorithm::EdDSA, k));
    }
    Err(KeyError::Pem {
        path: path.to_owned(),
    })
}

fn jwks_keys(path: &Path, text: &[u8]) -> Result<Vec<VerifyKey>, KeyError> {
    let set: JwkSet = serde_json::from_slice(text).map_err(|source| KeyError::Jwks {
        path: path.to_owned(),
        source,
    })?;
    let refuse = |index, reason: &str| KeyError::Jwk {
        path: path.to_owned(),
        index,
        reason: reason.to_owned(),
    };
    let mut keys = Vec::with_capacity(set.keys.len());
    for (index, jwk) in set.keys.iter().enumerate() {
        let by_kind = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => Algorithm::RS256,
            AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => {
                Algorithm::ES256
            }
            AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => {
                Algorithm::EdDSA
            }
            AlgorithmParameters::OctetKey(oct) => {
                let secret = URL_SAFE_NO_PAD
                    .decode(oct.value.trim_end_matches('='))
                    .map_err(|_| refuse(index, "its \"k\" is not base64url"))?;
                if secret.len() < MIN_SECRET {
                    return Err(refuse(index, "an oct key must be at least 32 bytes"));
                }
                Algorithm::HS256
            }
            _ => return Err(refuse(index, "only RSA, P-256, Ed25519 and oct keys")),
        };
        // A key that names its algorithm must name the one its kind serves.
        let named = jwk.common.key_algorithm.map(|alg| match alg {
            KeyAlgorithm::HS256 => Some(Algorithm::HS256),
            KeyAlgorithm::RS256 => Some(Algorithm::RS256),
            KeyAlgorithm::ES256 => Some(Algorithm::ES256),
            KeyAlgorithm::EdDSA => Some(Algorithm::EdDSA),
            _ => None,
        });
        if named.is_some_and(|n| n != Some(by_kind)) {
            return Err(refuse(
                index,
                "its \"alg\" is not HS256, RS256, ES256 or EdDSA for its key type",
            ));
        }
        let key = DecodingKey::from_jwk(jwk).map_err(|e| refuse(index, &e.to_string()))?;
        keys.push(VerifyKey {
            kid: jwk.common.key_id.clone(),
            algorithm: by_kind,
            key,
        });
    }
    Ok(keys)
}
