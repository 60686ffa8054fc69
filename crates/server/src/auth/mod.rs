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

pub mod grants;
pub mod keys;
pub mod token;

use thiserror::Error;

pub use token::{Access, TokenError, Verified};

use crate::config::Config;
use crate::namespace::{access_policy, AccessPolicy, Namespaces};
use keys::KeyError;
use token::{Expectations, Verifier};

/// What a client asks to do with a subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Subscribe, on any transport (recovery included).
    Subscribe,
    Publish,
    /// The `history` command.
    History,
}

impl Action {
    fn verb(self) -> &'static str {
        match self {
            Action::Subscribe => "subscribing to",
            Action::Publish => "publishing to",
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
}

/// The node's token verifier and access policy.
pub struct Auth {
    /// `None` when no key is configured: tokens are not checked.
    verifier: Option<Verifier>,
    policies: Namespaces<AccessPolicy>,
}

impl Auth {
    /// Loads the keys `config` names and resolves each namespace's policy.
    pub fn from_config(config: &Config) -> Result<Auth, KeyError> {
        let keys = keys::load(
            config.token_hmac_secret.as_deref(),
            &config.token_public_keys,
            config.token_jwks.as_deref(),
        )?;
        let verifier = (!keys.is_empty()).then(|| {
            let expect = Expectations {
                audience: config.token_audience.clone(),
                issuer: config.token_issuer.clone(),
                leeway: u64::from(config.token_leeway),
                max_subject_len: config.max_subject_len,
            };
            Verifier::new(keys, expect)
        });
        let node = AccessPolicy {
            anonymous: config.anonymous.unwrap_or(verifier.is_none()),
            publish: config.client_publish,
            history: config.client_history,
        };
        let policies = Namespaces::new(node, &config.namespace, access_policy);
        Ok(Auth { verifier, policies })
    }

    /// Whether this node checks tokens (some key is configured).
    pub fn checks_tokens(&self) -> bool {
        self.verifier.is_some()
    }

    pub fn verify(&self, token: &str) -> Result<Verified, TokenError> {
        self.verifier
            .as_ref()
            .ok_or(TokenError::Disabled)?
            .verify(token)
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
            Action::Publish if !policy.publish => {
                return Err(Forbidden::NoClientPublish(clip(subject)))
            }
            Action::History if !policy.history => {
                return Err(Forbidden::NoClientHistory(clip(subject)))
            }
            _ => {}
        }
        if policy.anonymous {
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
            Action::Publish => access.grants.may_publish(subject),
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

fn clip(subject: &str) -> String {
    subject.chars().take(64).collect()
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
        let auth = auth(None, vec![open]);
        let a = access(&["chat.*"], &["chat.room1"]);
        assert_eq!(auth.check(Action::Subscribe, "chat.x", Some(&a)), Ok(()));
        assert_eq!(auth.check(Action::History, "chat.x", Some(&a)), Ok(()));
        assert_eq!(auth.check(Action::Publish, "chat.room1", Some(&a)), Ok(()));
        assert!(matches!(
            auth.check(Action::Publish, "chat.x", Some(&a)),
            Err(Forbidden::NotGranted { .. })
        ));
        assert!(matches!(
            auth.check(Action::Subscribe, "chat.x", None),
            Err(Forbidden::NeedsToken { .. })
        ));
        assert_eq!(auth.check(Action::Subscribe, "public.news", None), Ok(()));
        assert_eq!(auth.check(Action::Publish, "public.news", Some(&a)), Ok(()));
        // The node-wide setting can open everything to anonymous clients.
        let open_node = auth_with_anonymous();
        assert_eq!(open_node.check(Action::Publish, "x", None), Ok(()));
    }

    fn auth_with_anonymous() -> Auth {
        auth(Some(true), Vec::new())
    }
}
