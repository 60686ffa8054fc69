//! Who may call what on the admin listener.
//!
//! Two keys. The publish key opens the message API that backends call:
//! `/api/publish`, `/api/publish_as`, `/api/history` and the presence reads
//! (`/api/presence`, `/api/presence_stats`). The admin key opens
//! everything else (`/stats`, `/metrics`, `/status`, `/status/events`, the
//! follow graph's API) and, as the superset, the message API too, so a
//! node may run with the admin key alone. `/healthz` needs no key: probes
//! carry none, and it tells only whether the node is up.
//!
//! A key is sent as `X-Api-Key: KEY`, `Authorization: Bearer KEY`, or, on
//! `GET` and `HEAD` only, as the password of `Authorization: Basic`, which
//! is what a browser sends for the status page once asked (the page's
//! `EventSource` cannot set a header, but the browser sends the credentials
//! it was given for the page). A browser also attaches those cached
//! credentials to requests other sites' pages make to the node, such as a
//! cross-site form's POST, so Basic never opens a request that changes
//! anything: that would hand any page the operator visits the publish and
//! follow-graph API (cross-site request forgery).
//!
//! This module owns the endpoint → access table and the check; it must not
//! answer: `mod.rs` turns a refusal into its reply and counts it.

use base64::Engine as _;
use hyper::header::{HeaderMap, AUTHORIZATION};
use hyper::Method;
use thiserror::Error;

use crate::config::Config;

/// Header carrying a key (`Authorization` works too).
const API_KEY_HEADER: &str = "x-api-key";

/// What an endpoint asks of a caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyNeeded {
    /// Anyone.
    Open,
    /// The publish key or the admin key.
    Publish,
    /// The admin key.
    Admin,
}

/// Every endpoint of the admin listener and what it asks of a caller.
const ENDPOINTS: [(&str, KeyNeeded); 15] = [
    ("/healthz", KeyNeeded::Open),
    ("/api/publish", KeyNeeded::Publish),
    ("/api/publish_as", KeyNeeded::Publish),
    ("/api/history", KeyNeeded::Publish),
    ("/api/presence", KeyNeeded::Publish),
    ("/api/presence_stats", KeyNeeded::Publish),
    ("/stats", KeyNeeded::Admin),
    ("/metrics", KeyNeeded::Admin),
    ("/status", KeyNeeded::Admin),
    ("/status/events", KeyNeeded::Admin),
    ("/api/follow", KeyNeeded::Admin),
    ("/api/unfollow", KeyNeeded::Admin),
    ("/api/users", KeyNeeded::Admin),
    ("/api/followers", KeyNeeded::Admin),
    ("/api/following", KeyNeeded::Admin),
];

/// What the endpoint at `path` asks of a caller; `None` if there is none.
pub fn of(path: &str) -> Option<KeyNeeded> {
    ENDPOINTS
        .iter()
        .find(|(endpoint, _)| *endpoint == path)
        .map(|(_, access)| *access)
}

/// Why a request was refused.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum Refusal {
    /// No key, or one that is neither key (HTTP 401).
    #[error("missing or wrong API key")]
    Unauthorized,
    /// The publish key, on an endpoint only the admin key opens (HTTP 403).
    #[error("the publish key does not open this endpoint; it needs the admin key")]
    Forbidden,
}

impl Refusal {
    /// The code in the HTTP API's error body.
    pub fn code(self) -> &'static str {
        match self {
            Refusal::Unauthorized => "unauthorized",
            Refusal::Forbidden => "forbidden",
        }
    }
}

/// Whether a request with `headers` may reach an endpoint asking `access`.
/// Without an admin key everything is open (config allows that on loopback
/// only); a publish key is never configured without an admin key.
pub fn check(
    config: &Config,
    access: KeyNeeded,
    method: &Method,
    headers: &HeaderMap,
) -> Result<(), Refusal> {
    let Some(admin_key) = config.admin_key.as_deref() else {
        return Ok(());
    };
    if access == KeyNeeded::Open {
        return Ok(());
    }
    let safe = method == Method::GET || method == Method::HEAD;
    let given = given_key(headers, safe).ok_or(Refusal::Unauthorized)?;
    if constant_time_eq(&given, admin_key.as_bytes()) {
        return Ok(());
    }
    let publish = config
        .publish_key
        .as_deref()
        .is_some_and(|key| constant_time_eq(&given, key.as_bytes()));
    match (publish, access) {
        (true, KeyNeeded::Publish) => Ok(()),
        (true, _) => Err(Refusal::Forbidden),
        (false, _) => Err(Refusal::Unauthorized),
    }
}

/// The node's keys, as the connection cap (`super::conn`) asks whether a
/// request carries one.
pub struct Keys {
    admin: Option<String>,
    publish: Option<String>,
}

impl Keys {
    pub fn new(config: &Config) -> Keys {
        Keys {
            admin: config.admin_key.clone(),
            publish: config.publish_key.clone(),
        }
    }

    /// Whether a request carries the admin key or the publish key, in a
    /// form `check` would take for it (so Basic only on `GET` and `HEAD`),
    /// whatever endpoint it asks for. On a node without keys every request
    /// does: anyone who reaches it may use it all (loopback only).
    pub fn carried_by(&self, method: &Method, headers: &HeaderMap) -> bool {
        let Some(admin) = self.admin.as_deref() else {
            return true;
        };
        let safe = method == Method::GET || method == Method::HEAD;
        let Some(given) = given_key(headers, safe) else {
            return false;
        };
        constant_time_eq(&given, admin.as_bytes())
            | self
                .publish
                .as_deref()
                .is_some_and(|key| constant_time_eq(&given, key.as_bytes()))
    }
}

/// The key a request carries, in any of the accepted forms; Basic only if
/// `basic` allows it.
fn given_key(headers: &HeaderMap, basic: bool) -> Option<Vec<u8>> {
    if let Some(key) = headers.get(API_KEY_HEADER) {
        return Some(key.as_bytes().to_vec());
    }
    let authorization = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, credentials) = authorization.split_once(' ')?;
    // Schemes are case-insensitive (RFC 9110 §11.1).
    if scheme.eq_ignore_ascii_case("bearer") {
        Some(credentials.trim().as_bytes().to_vec())
    } else if basic && scheme.eq_ignore_ascii_case("basic") {
        // user:password (RFC 7617); the user name is not checked.
        let pair = base64::engine::general_purpose::STANDARD
            .decode(credentials.trim())
            .ok()?;
        let colon = pair.iter().position(|&b| b == b':')?;
        Some(pair[colon + 1..].to_vec())
    } else {
        None
    }
}

/// Compares without an early exit, so response timing does not reveal how
/// much of a guessed key was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn headers(name: &'static str, value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(name, HeaderValue::from_str(value).unwrap());
        headers
    }

    fn config(publish: Option<&str>, admin: Option<&str>) -> Config {
        Config {
            publish_key: publish.map(str::to_owned),
            admin_key: admin.map(str::to_owned),
            ..Config::default()
        }
    }

    #[test]
    fn a_key_is_carried_whatever_the_endpoint_and_basic_only_on_reads() {
        let keys = Keys::new(&config(Some("pk"), Some("ak")));
        let basic = |pair: &str| {
            let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
            headers("authorization", &format!("Basic {encoded}"))
        };
        assert!(keys.carried_by(&Method::POST, &headers("x-api-key", "pk")));
        assert!(keys.carried_by(&Method::GET, &headers("x-api-key", "ak")));
        assert!(keys.carried_by(&Method::GET, &basic("u:ak")));
        assert!(!keys.carried_by(&Method::POST, &basic("u:ak")));
        assert!(!keys.carried_by(&Method::GET, &headers("x-api-key", "nope")));
        assert!(!keys.carried_by(&Method::GET, &HeaderMap::new()));
        let open = Keys::new(&config(None, None));
        assert!(open.carried_by(&Method::GET, &HeaderMap::new()));
    }

    #[test]
    fn key_comparison() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
    }

    #[test]
    fn every_form_of_the_key_is_read() {
        let basic = |pair: &str| {
            let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
            headers("authorization", &format!("Basic {encoded}"))
        };
        for (h, want) in [
            (headers("x-api-key", "k1"), Some("k1")),
            (headers("authorization", "Bearer k2"), Some("k2")),
            (headers("authorization", "bearer  k3 "), Some("k3")),
            (basic("admin:k:4"), Some("k:4")),
            (basic(":k5"), Some("k5")),
            (basic("no-colon"), None),
            (headers("authorization", "Basic !!!"), None),
            (headers("authorization", "Digest k6"), None),
            (HeaderMap::new(), None),
        ] {
            assert_eq!(
                given_key(&h, true).as_deref(),
                want.map(str::as_bytes),
                "{h:?}"
            );
        }
    }

    #[test]
    fn basic_credentials_open_no_request_that_changes_anything() {
        let both = config(Some("pub"), Some("adm"));
        let encoded = base64::engine::general_purpose::STANDARD.encode("x:adm");
        let basic = headers("authorization", &format!("Basic {encoded}"));
        assert_eq!(check(&both, KeyNeeded::Admin, &Method::GET, &basic), Ok(()));
        for access in [KeyNeeded::Publish, KeyNeeded::Admin] {
            assert_eq!(
                check(&both, access, &Method::POST, &basic),
                Err(Refusal::Unauthorized),
                "{access:?}"
            );
        }
        let bearer = headers("authorization", "Bearer adm");
        assert_eq!(
            check(&both, KeyNeeded::Publish, &Method::POST, &bearer),
            Ok(())
        );
    }

    #[test]
    fn each_key_opens_what_it_should() {
        let both = config(Some("pub"), Some("adm"));
        let admin_only = config(None, Some("adm"));
        let open = config(None, None);
        let with = |key: &str| headers("x-api-key", key);
        let none = HeaderMap::new();
        use KeyNeeded::*;
        use Refusal::*;
        for (config, access, headers, want) in [
            (&both, Publish, with("pub"), Ok(())),
            (&both, Publish, with("adm"), Ok(())),
            (&both, Publish, with("nope"), Err(Unauthorized)),
            (&both, Publish, none.clone(), Err(Unauthorized)),
            (&both, Admin, with("adm"), Ok(())),
            (&both, Admin, with("pub"), Err(Forbidden)),
            (&both, Admin, with("nope"), Err(Unauthorized)),
            (&both, Admin, none.clone(), Err(Unauthorized)),
            (&both, Open, none.clone(), Ok(())),
            (&admin_only, Publish, with("adm"), Ok(())),
            (&admin_only, Publish, with("pub"), Err(Unauthorized)),
            (&admin_only, Admin, none.clone(), Err(Unauthorized)),
            (&open, Admin, none.clone(), Ok(())),
            (&open, Publish, with("anything"), Ok(())),
        ] {
            assert_eq!(
                check(config, access, &Method::POST, &headers),
                want,
                "{access:?} {headers:?}"
            );
        }
    }

    #[test]
    fn only_healthz_is_open() {
        assert_eq!(of("/healthz"), Some(KeyNeeded::Open));
        assert_eq!(of("/nope"), None);
        assert_eq!(of("/api/publish"), Some(KeyNeeded::Publish));
        assert_eq!(of("/api/history"), Some(KeyNeeded::Publish));
        assert_eq!(of("/status/events"), Some(KeyNeeded::Admin));
        assert_eq!(of("/api/follow"), Some(KeyNeeded::Admin));
    }
}
