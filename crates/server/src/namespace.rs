//! Namespaces: per-subject-prefix settings, today the history policy.
//!
//! The config file lists namespaces as `[[namespace]]` tables with a
//! `prefix`; a subject takes the settings of the longest prefix it starts
//! with, and the node-wide defaults otherwise. Resolved when a subject's
//! stream is created (a scan of the prefixes); a subject that keeps no
//! history and has no subscriber has no stream, so each publish to it
//! resolves it again.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::Ttl;
use crate::history::HistoryPolicy;

/// One `[[namespace]]` table of the config file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Namespace {
    /// Subjects starting with this text belong to the namespace.
    pub prefix: String,
    /// Publications kept per subject; the node default when unset, 0 = none.
    #[serde(default)]
    pub history_size: Option<usize>,
    /// How long publications are kept, e.g. "5m"; the node default when
    /// unset, "0s" = no age limit.
    #[serde(default)]
    pub history_ttl: Option<Ttl>,
}

/// A namespace, by its place in [`Namespaces`]; 0 is the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceId(u16);

/// Subject → history policy, by longest matching prefix.
#[derive(Debug, Clone)]
pub struct Namespaces {
    /// Longest prefix first, so the first match is the most specific.
    rules: Vec<(String, HistoryPolicy)>,
    default: HistoryPolicy,
}

impl Namespaces {
    pub fn new(default: HistoryPolicy, namespaces: &[Namespace]) -> Namespaces {
        let mut rules: Vec<(String, HistoryPolicy)> = namespaces
            .iter()
            .map(|ns| {
                let policy = HistoryPolicy {
                    size: ns.history_size.unwrap_or(default.size),
                    ttl: ns.history_ttl.map_or(default.ttl, Duration::from),
                };
                (ns.prefix.clone(), policy)
            })
            .collect();
        rules.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
        Namespaces { rules, default }
    }

    /// Which namespace `subject` is in: two bytes a subject's state can
    /// keep instead of its whole policy.
    pub fn id_of(&self, subject: &str) -> NamespaceId {
        let found = self
            .rules
            .iter()
            .position(|(prefix, _)| subject.starts_with(prefix.as_str()));
        // Config validation keeps namespaces far below u16::MAX.
        NamespaceId(found.map_or(0, |i| i as u16 + 1))
    }

    /// The history policy of a namespace.
    pub fn policy(&self, id: NamespaceId) -> HistoryPolicy {
        match id.0 {
            0 => self.default,
            n => self.rules[usize::from(n) - 1].1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Namespaces {
        fn policy_for(&self, subject: &str) -> HistoryPolicy {
            self.policy(self.id_of(subject))
        }
    }

    #[test]
    fn the_longest_prefix_wins_and_unset_fields_inherit() {
        let default = HistoryPolicy {
            size: 10,
            ttl: Duration::from_secs(60),
        };
        let ns = |prefix: &str, size, ttl: Option<u64>| Namespace {
            prefix: prefix.to_owned(),
            history_size: size,
            history_ttl: ttl.map(|s| Ttl(Duration::from_secs(s))),
        };
        let namespaces = Namespaces::new(
            default,
            &[
                ns("chat.", Some(100), Some(300)),
                ns("chat.vip.", None, Some(3600)),
                ns("ticks.", Some(0), None),
            ],
        );
        assert_eq!(namespaces.policy_for("other"), default);
        assert_eq!(
            namespaces.policy_for("chat.room1"),
            HistoryPolicy {
                size: 100,
                ttl: Duration::from_secs(300)
            }
        );
        assert_eq!(
            namespaces.policy_for("chat.vip.1"),
            HistoryPolicy {
                size: 10,
                ttl: Duration::from_secs(3600)
            },
            "size inherits the node default, not the shorter prefix"
        );
        assert!(!namespaces.policy_for("ticks.eur").is_on());
    }
}
