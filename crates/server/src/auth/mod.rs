//! Who may do what: connection tokens, their grants, and the access policy
//! of each namespace.
//!
//! A node with no token key configured checks no tokens: every connection
//! is anonymous and the namespaces' policy alone decides (by default,
//! everything is allowed, as on a development node). With keys, a client
//! presents a JWT (see [`token`]) in the request's `Authorization` header,
//! a `token` query parameter, or a `connect` command, and may swap in a
//! new one with `refresh` before it expires. What a connection may do with
//! a subject is decided in one place, [`Auth::check`], for every transport:
//! the namespace's policy first (may clients publish there at all, may
//! they read history), then the token's grants, or, without a token,
//! whether the namespace lets anonymous connections in. A namespace open
//! to anonymous connections is open to every connection.
//!
//! The worker keeps a connection's [`Access`] in its session identity and
//! closes it when the token expires, in its once-a-second sweep.
//!
//! SIGHUP reads the key files again ([`Auth::reload_keys`]): new token
//! checks use the new keys, connections already open keep the access
//! their token gave them until it expires.

pub mod grants;
pub mod keys;
pub mod token;

use std::sync::Arc;

use thiserror::Error;

pub use token::{Access, TokenError, TokenLimit, Verified};

use crate::config::Config;
use crate::namespace::{access_policy, AccessPolicy, Namespaces};
use crate::reloadable::Reloadable;
use keys::{KeyError, KeySources};
use token::{Expectations, Verifier};

/// What a client asks to do with a subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Subscribe, on any transport (recovery included).
    Subscribe,
    Publish,
    /// `send`, to the user's own feed: the namespace's `publish` applies,
    /// grants do not (a user may always speak in its own feed).
    Send,
    /// The `history` command.
    History,
}

impl Action {
    fn verb(self) -> &'static str {
        match self {
            Action::Subscribe => "subscribing to",
            Action::Publish | Action::Send => "publishing to",
            Action::History => "reading the history of",
        }
    }
}

/// Why an action was refused; the client gets `forbidden` with this text.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Forbidden {
    #[error("clients may not publish to {0:?}: its namespace says so")]
    NoClientPublish(String),
    #[error("clients may not read the history of {0:?}: its namespace says so")]
    NoClientHistory(String),
    #[error("{verb} {subject:?} needs a token")]
    NeedsToken { verb: &'static str, subject: String },
    #[error("the token does not grant {verb} {subject:?}")]
    NotGranted { verb: &'static str, subject: String },
    /// A URL-opened stream (SSE, HTTP streaming, long-poll) cannot wait
    /// for a subscribe proxy's verdict yet.
    #[error(
        "subscribing to {0:?} is asked of the backend's proxy: subscribe over a WebSocket or \
         a posted command"
    )]
    Proxied(String),
}

/// What a SIGHUP did to the token keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeysReload {
    /// No key comes from a file: nothing to read again.
    NoFiles,
    /// The files were read and their keys are in force.
    Reloaded,
}

/// The node's token verifier and access policy.
pub struct Auth {
    /// `None` when no key is configured: tokens are not checked. Whether
    /// the node checks tokens is decided once, at start (the anonymous
    /// default follows from it); a reload changes only the keys.
    verifier: Option<Reloadable<Verifier>>,
    sources: KeySources,
    expect: Expectations,
    policies: Namespaces<AccessPolicy>,
}

impl Auth {
    /// Loads the keys `config` names and resolves each namespace's policy.
    pub fn from_config(config: &Config) -> Result<Auth, KeyError> {
        let sources = KeySources {
            hmac_secret: config.token_hmac_secret.clone(),
            pem_files: config.token_public_keys.clone(),
            jwks_file: config.token_jwks.clone(),
        };
        let keys = sources.load()?;
        let expect = Expectations {
            audience: config.token_audience.clone(),
            issuer: config.token_issuer.clone(),
            leeway: u64::from(config.token_leeway),
            max_subject_len: config.max_subject_len,
            max_info_bytes: config.presence_info_max_bytes,
        };
        let verifier = (!keys.is_empty())
            .then(|| Reloadable::new(Arc::new(Verifier::new(keys, expect.clone()))));
        let node = AccessPolicy {
            anonymous: config.anonymous.unwrap_or(verifier.is_none()),
            publish: config.client_publish,
            history: config.client_history,
        };
        let policies = Namespaces::new(node, &config.namespace, access_policy);
        Ok(Auth {
            verifier,
            sources,
            expect,
            policies,
        })
    }

    /// Whether this node checks tokens (some key is configured).
    pub fn checks_tokens(&self) -> bool {
        self.verifier.is_some()
    }

    /// Verifies `token` with the keys in force. A read lock per check, not
    /// a per-worker view: the signature check it precedes costs far more.
    pub fn verify(&self, token: &str) -> Result<Verified, TokenError> {
        self.verifier
            .as_ref()
            .ok_or(TokenError::Disabled)?
            .current()
            .verify(token)
    }

    /// Reads the key files again (SIGHUP). On success every token check
    /// from then on uses the new keys; on failure, or if the files hold no
    /// key at all, the keys in force stay. The HMAC secret, a setting's
    /// value rather than a file, stays as it was read at start.
    pub fn reload_keys(&self) -> Result<KeysReload, KeyError> {
        let Some(verifier) = &self.verifier else {
            return Ok(KeysReload::NoFiles);
        };
        if !self.sources.has_files() {
            return Ok(KeysReload::NoFiles);
        }
        let keys = self.sources.load()?;
        if keys.is_empty() {
            return Err(KeyError::NoKeys);
        }
        verifier.replace(Arc::new(Verifier::new(keys, self.expect.clone())));
        Ok(KeysReload::Reloaded)
    }

    /// The files token keys are read from.
    pub fn key_files(&self) -> impl Iterator<Item = &std::path::Path> {
        self.sources.files()
    }

    /// Whether a connection holding `access` (`None`: no token) may do
    /// `action` with `subject`.
    pub fn check(
        &self,
        action: Action,
        subject: &str,
        access: Option<&Access>,
    ) -> Result<(), Forbidden> {
        let policy = self.policies.policy_for(subject);
        match action {
            Action::Publish | Action::Send if !policy.publish => {
                return Err(Forbidden::NoClientPublish(clip(subject)))
            }
            Action::History if !policy.history => {
                return Err(Forbidden::NoClientHistory(clip(subject)))
            }
            _ => {}
        }
        if policy.anonymous || action == Action::Send {
            return Ok(());
        }
        let verb = action.verb();
        let Some(access) = access else {
            return Err(Forbidden::NeedsToken {
                verb,
                subject: clip(subject),
            });
        };
        let granted = match action {
            Action::Subscribe | Action::History => access.grants.may_subscribe(subject),
            Action::Publish | Action::Send => access.grants.may_publish(subject),
        };
        if granted {
            Ok(())
        } else {
            Err(Forbidden::NotGranted {
                verb,
                subject: clip(subject),
            })
        }
    }
}

/// The first 64 characters of client text quoted in an error, so a refusal
/// stays short whatever the client sent.
pub fn clip(text: &str) -> String {
    text.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::Namespace;
    use grants::Grants;

    fn auth(anonymous: Option<bool>, namespaces: Vec<Namespace>) -> Auth {
        let config = Config {
            token_hmac_secret: Some("0123456789abcdef0123456789abcdef".into()),
            anonymous,
            namespace: namespaces,
            ..Config::default()
        };
        Auth::from_config(&config).unwrap()
    }

    fn access(subscribe: &[&str], publish: &[&str]) -> Access {
        let owned = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Access {
            grants: Grants::parse(&owned(subscribe), &owned(publish), "7", 128).unwrap(),
            expires: u64::MAX,
            info: None,
        }
    }

    #[test]
    fn without_keys_everything_is_open_unless_a_namespace_closes_it() {
        let config = Config {
            namespace: vec![Namespace {
                prefix: "feed.".into(),
                publish: Some(false),
                history: Some(false),
                ..Namespace::default()
            }],
            ..Config::default()
        };
        let auth = Auth::from_config(&config).unwrap();
        assert!(!auth.checks_tokens());
        assert_eq!(auth.verify("x"), Err(TokenError::Disabled));
        for action in [Action::Subscribe, Action::Publish, Action::History] {
            assert_eq!(auth.check(action, "a", None), Ok(()));
        }
        assert_eq!(auth.check(Action::Subscribe, "feed.1", None), Ok(()));
        assert!(matches!(
            auth.check(Action::Publish, "feed.1", None),
            Err(Forbidden::NoClientPublish(_))
        ));
        assert!(matches!(
            auth.check(Action::History, "feed.1", None),
            Err(Forbidden::NoClientHistory(_))
        ));
    }

    #[test]
    fn with_keys_grants_decide_and_open_namespaces_let_anyone_in() {
        let open = Namespace {
            prefix: "public.".into(),
            anonymous: Some(true),
            ..Namespace::default()
        };
        let node = auth(None, vec![open]);
        let a = access(&["chat.*"], &["chat.room1"]);
        assert_eq!(node.check(Action::Subscribe, "chat.x", Some(&a)), Ok(()));
        assert_eq!(node.check(Action::History, "chat.x", Some(&a)), Ok(()));
        assert_eq!(node.check(Action::Publish, "chat.room1", Some(&a)), Ok(()));
        assert!(matches!(
            node.check(Action::Publish, "chat.x", Some(&a)),
            Err(Forbidden::NotGranted { .. })
        ));
        assert!(matches!(
            node.check(Action::Subscribe, "chat.x", None),
            Err(Forbidden::NeedsToken { .. })
        ));
        assert_eq!(node.check(Action::Subscribe, "public.news", None), Ok(()));
        assert_eq!(node.check(Action::Publish, "public.news", Some(&a)), Ok(()));
        // The node-wide setting can open everything to anonymous clients.
        let open_node = auth(Some(true), Vec::new());
        assert_eq!(open_node.check(Action::Publish, "x", None), Ok(()));
    }

    #[test]
    fn a_key_reload_swaps_whole_sets_and_keeps_the_last_good_one() {
        use jsonwebtoken::{encode, EncodingKey, Header};
        let dir = tempfile::tempdir().unwrap();
        let jwks = dir.path().join("keys.jwks");
        let set = |secret: &[u8]| {
            let k =
                base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, secret);
            serde_json::json!({"keys": [{"kty": "oct", "k": k}]}).to_string()
        };
        let (a, b) = (
            b"key-a-of-at-least-thirty-two-bytes!!",
            b"key-b-of-at-least-thirty-two-bytes!!",
        );
        let claims = serde_json::json!({"sub": "1", "exp": token::unix_now() + 60});
        let token = |secret: &[u8]| {
            encode(
                &Header::default(),
                &claims,
                &EncodingKey::from_secret(secret),
            )
            .unwrap()
        };
        std::fs::write(&jwks, set(a)).unwrap();
        let node = Auth::from_config(&Config {
            token_jwks: Some(jwks.clone()),
            ..Config::default()
        })
        .unwrap();
        assert!(node.verify(&token(a)).is_ok());
        assert_eq!(node.verify(&token(b)), Err(TokenError::Signature));

        std::fs::write(&jwks, set(b)).unwrap();
        assert_eq!(node.reload_keys().unwrap(), KeysReload::Reloaded);
        assert!(node.verify(&token(b)).is_ok());
        assert_eq!(node.verify(&token(a)), Err(TokenError::Signature));

        // An empty set would refuse every token; a broken one is unreadable.
        std::fs::write(&jwks, r#"{"keys": []}"#).unwrap();
        assert!(matches!(node.reload_keys(), Err(KeyError::NoKeys)));
        std::fs::write(&jwks, "{").unwrap();
        assert!(matches!(node.reload_keys(), Err(KeyError::Jwks { .. })));
        assert!(node.verify(&token(b)).is_ok(), "the last good keys stay");

        // A secret given as a setting has no file to read again.
        assert_eq!(
            auth(None, vec![]).reload_keys().unwrap(),
            KeysReload::NoFiles
        );
    }

    #[test]
    fn send_needs_no_grant_but_obeys_the_namespace() {
        let closed = Namespace {
            prefix: "@".into(),
            publish: Some(false),
            ..Namespace::default()
        };
        let a = access(&[], &[]);
        assert_eq!(
            auth(None, vec![]).check(Action::Send, "@7", Some(&a)),
            Ok(())
        );
        assert!(matches!(
            auth(None, vec![closed]).check(Action::Send, "@7", Some(&a)),
            Err(Forbidden::NoClientPublish(_))
        ));
    }
}
