//! Grants: the subjects a token lets its connection subscribe to and
//! publish on.
//!
//! A token lists patterns. A pattern is an exact subject, or a prefix
//! marked by a trailing `*`: `chat.room1` is that subject alone,
//! `chat.room1.*` every subject under it and `*` every subject. The subject
//! alphabet reserves `*` (see `myriad_protocol::subject`), so a pattern
//! never confuses the two, and a grant of one subject never silently widens
//! to the subjects that start with it. `{sub}` stands for the token's
//! `sub`, so one signing policy gives every user a space of their own:
//! `user.{sub}.*`. Patterns are resolved once, when the token is verified;
//! a check is a scan of a token's few patterns, with no allocation.

use myriad_protocol::subject::{self, SubjectError};
use thiserror::Error;

/// What stands for the token's `sub` in a pattern.
const SUB_PLACEHOLDER: &str = "{sub}";

/// One resolved pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    /// The subject, or the prefix without its `*`.
    text: Box<str>,
    prefix: bool,
}

/// Why a token's grant was refused (the whole token is then refused).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum GrantError {
    #[error("a grant is empty")]
    Empty,
    #[error("grant {0:?}: `*` may only end a pattern")]
    Wildcard(String),
    #[error("grant {0:?}: unknown placeholder, only {{sub}} exists")]
    Placeholder(String),
    #[error("grant {pattern:?}: {error}")]
    Subject {
        pattern: String,
        error: SubjectError,
    },
}

impl Pattern {
    /// Resolves `pattern` for the token whose `sub` is `sub`. A pattern
    /// that could match no valid subject (bad bytes, longer than
    /// `max_subject_len`) is refused rather than kept as a dead grant.
    pub fn parse(pattern: &str, sub: &str, max_subject_len: usize) -> Result<Pattern, GrantError> {
        if pattern.is_empty() {
            return Err(GrantError::Empty);
        }
        let text = pattern.replace(SUB_PLACEHOLDER, sub);
        if text.contains(['{', '}']) {
            return Err(GrantError::Placeholder(clip(pattern)));
        }
        let (text, prefix) = match text.strip_suffix('*') {
            Some(head) => (head, true),
            None => (text.as_str(), false),
        };
        if text.contains('*') {
            return Err(GrantError::Wildcard(clip(pattern)));
        }
        // A prefix may be empty (`*`); its bytes must still be subject bytes.
        if !(prefix && text.is_empty()) {
            subject::validate(text, max_subject_len).map_err(|error| GrantError::Subject {
                pattern: clip(pattern),
                error,
            })?;
        }
        Ok(Pattern {
            text: text.into(),
            prefix,
        })
    }

    pub fn matches(&self, subject: &str) -> bool {
        if self.prefix {
            subject.starts_with(&*self.text)
        } else {
            subject == &*self.text
        }
    }
}

/// Keeps error messages short whatever a token carries.
fn clip(pattern: &str) -> String {
    pattern.chars().take(64).collect()
}

/// What a token grants: the subjects its connection may subscribe to (and
/// read the history of) and those it may publish on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Grants {
    subscribe: Box<[Pattern]>,
    publish: Box<[Pattern]>,
}

impl Grants {
    /// Resolves a token's two lists of patterns for its `sub`.
    pub fn parse(
        subscribe: &[String],
        publish: &[String],
        sub: &str,
        max_subject_len: usize,
    ) -> Result<Grants, GrantError> {
        let resolve = |list: &[String]| {
            list.iter()
                .map(|p| Pattern::parse(p, sub, max_subject_len))
                .collect::<Result<Box<[Pattern]>, GrantError>>()
        };
        Ok(Grants {
            subscribe: resolve(subscribe)?,
            publish: resolve(publish)?,
        })
    }

    pub fn may_subscribe(&self, subject: &str) -> bool {
        self.subscribe.iter().any(|p| p.matches(subject))
    }

    pub fn may_publish(&self, subject: &str) -> bool {
        self.publish.iter().any(|p| p.matches(subject))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn grants(subscribe: &[&str], publish: &[&str]) -> Grants {
        let owned = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Grants::parse(&owned(subscribe), &owned(publish), "42", 128).unwrap()
    }

    #[test]
    fn exact_subjects_prefixes_and_the_user_placeholder() {
        let g = grants(&["chat.room1", "news.*", "user.{sub}.*"], &["chat.room1"]);
        assert!(g.may_subscribe("chat.room1"));
        assert!(!g.may_subscribe("chat.room10"), "exact never widens");
        assert!(!g.may_subscribe("chat.room1.x"));
        assert!(g.may_subscribe("news.eu"));
        assert!(g.may_subscribe("news."));
        assert!(!g.may_subscribe("news"));
        assert!(g.may_subscribe("user.42.inbox"));
        assert!(!g.may_subscribe("user.43.inbox"));
        assert!(g.may_publish("chat.room1"));
        assert!(!g.may_publish("news.eu"), "subscribe grants do not publish");
        let all = grants(&["*"], &[]);
        assert!(all.may_subscribe("anything") && all.may_subscribe("@7"));
        assert!(!all.may_publish("anything"));
        assert!(!Grants::default().may_subscribe("a"));
    }

    #[test]
    fn malformed_patterns_are_refused() {
        let parse = |p: &str| Pattern::parse(p, "42", 16);
        assert_eq!(parse(""), Err(GrantError::Empty));
        assert_eq!(parse("a*b"), Err(GrantError::Wildcard("a*b".into())));
        assert_eq!(parse("**"), Err(GrantError::Wildcard("**".into())));
        assert_eq!(
            parse("u.{user}"),
            Err(GrantError::Placeholder("u.{user}".into()))
        );
        assert!(matches!(parse("a b"), Err(GrantError::Subject { .. })));
        assert!(matches!(
            parse("a-very-long-subject-name"),
            Err(GrantError::Subject { .. })
        ));
        // Substitution happens before the length check.
        assert!(Pattern::parse("{sub}", "123456789012345678", 16).is_err());
    }

    proptest! {
        /// A prefix pattern matches exactly the subjects that start with its
        /// text, an exact pattern exactly its subject.
        #[test]
        fn matching_is_prefix_or_equality(
            text in "[a-z.]{0,6}",
            subject in "[a-z.]{1,8}",
        ) {
            if let Ok(p) = Pattern::parse(&format!("{text}*"), "1", 128) {
                prop_assert_eq!(p.matches(&subject), subject.starts_with(&text));
            }
            if let Ok(p) = Pattern::parse(&text, "1", 128) {
                prop_assert_eq!(p.matches(&subject), subject == text);
            }
        }
    }
}
