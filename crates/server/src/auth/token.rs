//! Verifying a connection token: a JWT's signature, its times, audience
//! and issuer, and the claims myriad reads from it.
//!
//! The claims: `sub`, the user id the connection acts as (a decimal
//! [`UserId`]); `exp`, when the token and any connection opened with it
//! end; `subscribe` and `publish`, lists of grant patterns (see
//! [`super::grants`]). Every refusal is a [`TokenError`], whose code the
//! client is told and whose label the node counts.

use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::errors::ErrorKind as JwtErrorKind;
use jsonwebtoken::{decode, Algorithm, Validation};
use myriad_graph::{UserId, UserIdError};
use serde::Deserialize;
use thiserror::Error;

use super::grants::{GrantError, Grants};
use super::keys::{VerifyKey, ALGORITHMS};

/// What a verified token allows its connection, kept for its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub grants: Grants,
    /// The Unix second from which the connection is closed: `exp` plus the
    /// configured leeway.
    pub expires: u64,
    /// The token's `info` claim as compact JSON: what the connection shows
    /// as a presence member (at most `presence_info_max_bytes`).
    pub info: Option<Arc<str>>,
}

/// A verified token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub user: UserId,
    pub access: Access,
}

/// Why a token was refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum TokenError {
    #[error("this node checks no tokens: no token key is configured")]
    Disabled,
    #[error("not a JWT: {0}")]
    Malformed(String),
    #[error("algorithm {0:?} is not accepted; HS256, RS256, ES256 and EdDSA are")]
    Algorithm(String),
    #[error("no key is configured for {0}")]
    NoKey(String),
    #[error("the signature does not verify")]
    Signature,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet (nbf)")]
    NotYetValid,
    #[error("the token is for another audience")]
    Audience,
    #[error("the token is from another issuer")]
    Issuer,
    #[error("claims: {0}")]
    Claims(String),
    #[error("sub: {0}")]
    Subject(UserIdError),
    #[error(transparent)]
    Grant(#[from] GrantError),
    #[error("the new token is for user {new}, the connection is user {held}")]
    UserChanged { held: UserId, new: UserId },
    #[error("refresh replaces a token and this connection has none: use connect")]
    NoneToRefresh,
    #[error("the info claim is {bytes} bytes, past presence_info_max_bytes ({max})")]
    Info { bytes: usize, max: usize },
    /// Refused before its signature was checked: a limit on token checks
    /// was reached. The client is told `rate_limited` (HTTP 429), not
    /// `invalid_token`: the token may be good, and worth sending later.
    #[error("{0}")]
    RateLimited(TokenLimit),
}

/// The limits on token checks, each a token bucket.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum TokenLimit {
    /// `client_token_rate`: `connect` and `refresh` commands on one
    /// connection.
    #[error("connect and refresh past client_token_rate")]
    Connection,
    /// `token_failures_per_ip`: failed checks from one source address.
    #[error("failed token checks from this address past token_failures_per_ip")]
    Address,
}

impl TokenError {
    /// Every metric label, `token_` and the reason.
    pub const LABELS: [&'static str; 17] = [
        "token_disabled",
        "token_malformed",
        "token_algorithm",
        "token_no_key",
        "token_signature",
        "token_expired",
        "token_not_yet_valid",
        "token_audience",
        "token_issuer",
        "token_claims",
        "token_subject",
        "token_grant",
        "token_user_changed",
        "token_none_to_refresh",
        "token_info",
        "token_rate_limited",
        "token_address_limited",
    ];

    /// The label this refusal is counted under in `myriad_errors_total`.
    pub fn label(&self) -> &'static str {
        match self {
            TokenError::Disabled => "token_disabled",
            TokenError::Malformed(_) => "token_malformed",
            TokenError::Algorithm(_) => "token_algorithm",
            TokenError::NoKey(_) => "token_no_key",
            TokenError::Signature => "token_signature",
            TokenError::Expired => "token_expired",
            TokenError::NotYetValid => "token_not_yet_valid",
            TokenError::Audience => "token_audience",
            TokenError::Issuer => "token_issuer",
            TokenError::Claims(_) => "token_claims",
            TokenError::Subject(_) => "token_subject",
            TokenError::Grant(_) => "token_grant",
            TokenError::UserChanged { .. } => "token_user_changed",
            TokenError::NoneToRefresh => "token_none_to_refresh",
            TokenError::Info { .. } => "token_info",
            TokenError::RateLimited(TokenLimit::Connection) => "token_rate_limited",
            TokenError::RateLimited(TokenLimit::Address) => "token_address_limited",
        }
    }
}

/// What the verifier checks besides the signature.
#[derive(Debug, Clone, Default)]
pub struct Expectations {
    /// When set, a token must carry this `aud`.
    pub audience: Option<String>,
    /// When set, a token must carry this `iss`.
    pub issuer: Option<String>,
    /// Seconds of clock skew allowed on `exp` and `nbf`.
    pub leeway: u64,
    /// Grant patterns longer than this match nothing and are refused.
    pub max_subject_len: usize,
    /// An `info` claim longer than this (as compact JSON) is refused.
    pub max_info_bytes: usize,
}

/// Checks tokens against the configured keys.
pub struct Verifier {
    keys: Vec<VerifyKey>,
    expect: Expectations,
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
    #[serde(default)]
    subscribe: Vec<String>,
    #[serde(default)]
    publish: Vec<String>,
    /// Shown with the connection's presence memberships.
    #[serde(default)]
    info: Option<serde_json::Value>,
}

impl Verifier {
    pub fn new(keys: Vec<VerifyKey>, expect: Expectations) -> Verifier {
        Verifier { keys, expect }
    }

    /// Verifies `token` at the current time.
    pub fn verify(&self, token: &str) -> Result<Verified, TokenError> {
        let header = read_header(token)?;
        let algorithm = ALGORITHMS
            .into_iter()
            .find(|a| format!("{a:?}") == header.alg)
            .ok_or_else(|| TokenError::Algorithm(header.alg.chars().take(16).collect()))?;
        let validation = self.validation(algorithm);
        let mut candidates = self.keys.iter().filter(|k| {
            k.algorithm == algorithm
                && (header.kid.is_none() || k.kid.is_none() || k.kid == header.kid)
        });
        let Some(first) = candidates.next() else {
            let kid = header.kid.map_or(String::new(), |k| format!(" kid {k:?}"));
            return Err(TokenError::NoKey(format!("{}{kid}", header.alg)));
        };
        let mut outcome = decode::<Claims>(token, &first.key, &validation);
        for key in candidates {
            // Several keys for one algorithm (a rotation): any may have signed.
            match &outcome {
                Err(e) if *e.kind() == JwtErrorKind::InvalidSignature => {
                    outcome = decode::<Claims>(token, &key.key, &validation);
                }
                _ => break,
            }
        }
        let claims = outcome.map_err(refusal)?.claims;
        // RFC 7519 §4.1.4: not accepted on or after `exp`; the library
        // still takes a token through its `exp` second.
        let expires = claims.exp.saturating_add(self.expect.leeway);
        if expires <= unix_now() {
            return Err(TokenError::Expired);
        }
        let user: UserId = claims.sub.parse().map_err(TokenError::Subject)?;
        // `{sub}` is the user id as the node writes it ("007" is user 7).
        let grants = Grants::parse(
            &claims.subscribe,
            &claims.publish,
            &user.to_string(),
            self.expect.max_subject_len,
        )?;
        let info = match claims.info {
            None => None,
            Some(info) => {
                let json = info.to_string();
                let max = self.expect.max_info_bytes;
                if json.len() > max {
                    let bytes = json.len();
                    return Err(TokenError::Info { bytes, max });
                }
                Some(Arc::from(json))
            }
        };
        Ok(Verified {
            user,
            access: Access {
                grants,
                expires,
                info,
            },
        })
    }

    fn validation(&self, algorithm: Algorithm) -> Validation {
        let mut v = Validation::new(algorithm);
        v.leeway = self.expect.leeway;
        v.validate_nbf = true;
        let mut required = vec!["exp", "sub"];
        v.validate_aud = self.expect.audience.is_some();
        if let Some(audience) = &self.expect.audience {
            v.set_audience(&[audience]);
            required.push("aud");
        }
        if let Some(issuer) = &self.expect.issuer {
            v.set_issuer(&[issuer]);
            required.push("iss");
        }
        v.set_required_spec_claims(&required);
        v
    }
}

/// Seconds since the Unix epoch: the clock `exp` is on.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The JOSE header, read by hand so that an algorithm the JWT library has
/// no name for (`none`) is reported as such instead of as bad JSON.
fn read_header(token: &str) -> Result<Header, TokenError> {
    let malformed = |what: &str| TokenError::Malformed(what.to_owned());
    let (head, rest) = token.split_once('.').ok_or_else(|| malformed("no '.'"))?;
    if rest.split('.').count() != 2 {
        return Err(malformed("a JWT has three parts"));
    }
    let json = URL_SAFE_NO_PAD
        .decode(head)
        .map_err(|_| malformed("the header is not base64url"))?;
    serde_json::from_slice(&json).map_err(|e| TokenError::Malformed(format!("header: {e}")))
}

fn refusal(e: jsonwebtoken::errors::Error) -> TokenError {
    match e.into_kind() {
        JwtErrorKind::InvalidSignature => TokenError::Signature,
        JwtErrorKind::ExpiredSignature => TokenError::Expired,
        JwtErrorKind::ImmatureSignature => TokenError::NotYetValid,
        JwtErrorKind::InvalidAudience => TokenError::Audience,
        JwtErrorKind::InvalidIssuer => TokenError::Issuer,
        JwtErrorKind::MissingRequiredClaim(claim) => {
            TokenError::Claims(format!("{claim} is required"))
        }
        JwtErrorKind::Json(e) => TokenError::Claims(e.to_string()),
        JwtErrorKind::Base64(_) | JwtErrorKind::Utf8(_) | JwtErrorKind::InvalidToken => {
            TokenError::Malformed("bad encoding".to_owned())
        }
        other => TokenError::Malformed(format!("{other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header as JwtHeader};
    use serde_json::json;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn verifier(expect: Expectations) -> Verifier {
        let keys = super::super::keys::load(Some(SECRET), &[], None).unwrap();
        Verifier::new(
            keys,
            Expectations {
                max_subject_len: 128,
                ..expect
            },
        )
    }

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    fn sign(claims: serde_json::Value) -> String {
        let key = EncodingKey::from_secret(SECRET.as_bytes());
        encode(&JwtHeader::default(), &claims, &key).unwrap()
    }

    #[test]
    fn a_good_token_gives_its_user_grants_and_end() {
        let exp = now() + 60;
        let token = sign(json!({"sub": "42", "exp": exp, "subscribe": ["user.{sub}.*"]}));
        let v = verifier(Expectations {
            leeway: 5,
            ..Default::default()
        });
        let verified = v.verify(&token).unwrap();
        assert_eq!(verified.user, "42".parse().unwrap());
        assert_eq!(verified.access.expires, exp + 5);
        assert!(verified.access.grants.may_subscribe("user.42.x"));
        assert!(!verified.access.grants.may_publish("user.42.x"));
        assert_eq!(verified.access.info, None);
        let with_info = sign(json!({"sub": "42", "exp": exp, "info": {"name": "Ann", "n": 1}}));
        let v = verifier(Expectations {
            max_info_bytes: 20,
            ..Default::default()
        });
        let info = v.verify(&with_info).unwrap().access.info;
        assert_eq!(
            info.as_deref(),
            Some(r#"{"n":1,"name":"Ann"}"#),
            "compact JSON"
        );
    }

    #[test]
    fn refusals_name_their_reason() {
        let v = verifier(Expectations {
            audience: Some("myriad".into()),
            issuer: Some("auth.example".into()),
            ..Default::default()
        });
        let good = json!({"sub": "1", "exp": now() + 60, "aud": "myriad", "iss": "auth.example"});
        assert!(v.verify(&sign(good.clone())).is_ok());
        let with = |key: &str, value: serde_json::Value| {
            let mut claims = good.clone();
            claims[key] = value;
            v.verify(&sign(claims)).unwrap_err()
        };
        assert_eq!(with("aud", json!("other")), TokenError::Audience);
        assert_eq!(with("iss", json!("other")), TokenError::Issuer);
        assert_eq!(with("exp", json!(now() - 10)), TokenError::Expired);
        assert_eq!(with("nbf", json!(now() + 100)), TokenError::NotYetValid);
        assert_eq!(
            with("info", json!({"name": "x"})),
            TokenError::Info { bytes: 12, max: 0 }
        );
        assert!(matches!(
            with("sub", json!("alice")),
            TokenError::Subject(_)
        ));
        assert!(matches!(
            with("publish", json!(["a*b"])),
            TokenError::Grant(_)
        ));
        assert!(matches!(
            with("subscribe", json!("x")),
            TokenError::Claims(_)
        ));

        let mut tampered = sign(good);
        let last = tampered.pop().unwrap();
        tampered.push(if last == 'A' { 'B' } else { 'A' });
        assert_eq!(v.verify(&tampered).unwrap_err().label(), "token_signature");
        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#),
            URL_SAFE_NO_PAD.encode(br#"{"sub":"1","exp":9999999999}"#)
        );
        assert_eq!(v.verify(&none), Err(TokenError::Algorithm("none".into())));
        let rs = format!("{}.e30.sig", URL_SAFE_NO_PAD.encode(br#"{"alg":"RS256"}"#));
        assert_eq!(v.verify(&rs), Err(TokenError::NoKey("RS256".into())));
        assert!(matches!(v.verify("garbage"), Err(TokenError::Malformed(_))));
    }

    #[test]
    fn the_user_placeholder_is_the_user_id_as_written_by_the_node() {
        let token = sign(json!({"sub": "007", "exp": now() + 60, "subscribe": ["u.{sub}"]}));
        let verified = verifier(Expectations::default()).verify(&token).unwrap();
        assert!(verified.access.grants.may_subscribe("u.7"));
        let lapsing = sign(json!({"sub": "1", "exp": now()}));
        assert_eq!(
            verifier(Expectations::default()).verify(&lapsing),
            Err(TokenError::Expired),
            "not accepted in its exp second"
        );
    }

    #[test]
    fn every_label_is_distinct() {
        let mut labels = TokenError::LABELS.to_vec();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), TokenError::LABELS.len());
    }
}
