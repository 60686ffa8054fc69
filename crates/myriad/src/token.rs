//! `myriad token`: mints a connection token, for trying a node that checks
//! tokens and for load tests against one. Production tokens come from the
//! application's own authentication service; this signs the same claims
//! (docs/protocol.md, "Authentication") with a secret or a private key.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, ValueEnum};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::json;
use thiserror::Error;

#[derive(Args)]
pub struct TokenArgs {
    /// The user the token's connection acts as (`sub`).
    #[arg(long)]
    sub: u64,
    /// A subject pattern the connection may subscribe to (`chat.*`,
    /// `user.{sub}.*`); repeatable.
    #[arg(long)]
    subscribe: Vec<String>,
    /// A subject pattern the connection may publish to; repeatable.
    #[arg(long)]
    publish: Vec<String>,
    /// How long the token is valid, e.g. "1h" or "90s".
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// The HS256 secret the node has as `token_hmac_secret`.
    #[arg(
        long,
        env = "MYRIAD_TOKEN_HMAC_SECRET",
        hide_env_values = true,
        conflicts_with = "key"
    )]
    hmac_secret: Option<String>,
    /// A private key in PEM (PKCS#8) to sign with instead.
    #[arg(long, requires = "alg")]
    key: Option<PathBuf>,
    /// The algorithm of `--key`.
    #[arg(long, value_enum)]
    alg: Option<KeyAlgorithm>,
    /// The key id (`kid`), for a node that reads its keys from a JWKS.
    #[arg(long)]
    kid: Option<String>,
    /// `aud`, for a node with `token_audience`.
    #[arg(long)]
    aud: Option<String>,
    /// `iss`, for a node with `token_issuer`.
    #[arg(long)]
    iss: Option<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum KeyAlgorithm {
    #[value(name = "RS256")]
    Rs256,
    #[value(name = "ES256")]
    Es256,
    #[value(name = "EdDSA")]
    EdDsa,
}

#[derive(Debug, Error)]
pub enum TokenError {
    #[error("give --hmac-secret (or MYRIAD_TOKEN_HMAC_SECRET), or --key with --alg")]
    NoKey,
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot sign: {0}")]
    Sign(#[from] jsonwebtoken::errors::Error),
}

/// Prints the token on stdout.
pub fn run(args: TokenArgs) -> Result<(), TokenError> {
    let (algorithm, key) = match (&args.hmac_secret, &args.key, args.alg) {
        (Some(secret), _, _) => (
            Algorithm::HS256,
            EncodingKey::from_secret(secret.as_bytes()),
        ),
        (None, Some(path), Some(alg)) => {
            let pem = std::fs::read(path).map_err(|source| TokenError::Read {
                path: path.clone(),
                source,
            })?;
            match alg {
                KeyAlgorithm::Rs256 => (Algorithm::RS256, EncodingKey::from_rsa_pem(&pem)?),
                KeyAlgorithm::Es256 => (Algorithm::ES256, EncodingKey::from_ec_pem(&pem)?),
                KeyAlgorithm::EdDsa => (Algorithm::EdDSA, EncodingKey::from_ed_pem(&pem)?),
            }
        }
        _ => return Err(TokenError::NoKey),
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let mut claims = json!({
        "sub": args.sub.to_string(),
        "exp": (now + args.ttl).as_secs(),
        "subscribe": args.subscribe,
        "publish": args.publish,
    });
    if let Some(aud) = args.aud {
        claims["aud"] = json!(aud);
    }
    if let Some(iss) = args.iss {
        claims["iss"] = json!(iss);
    }
    let header = Header {
        kid: args.kid,
        ..Header::new(algorithm)
    };
    println!("{}", encode(&header, &claims, &key)?);
    Ok(())
}
