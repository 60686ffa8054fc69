//! Namespaces: per-subject-prefix settings, the history policy and the
//! access policy.
//!
//! The config file lists namespaces as `[[namespace]]` tables with a
//! `prefix`; a subject takes the settings of the longest prefix it starts
//! with, and the node-wide defaults otherwise. One lookup, [`Namespaces`],
//! serves each kind of setting. The history policy is resolved when a
//! subject's stream is created (a scan of the prefixes); a subject that
//! keeps no history and has no subscriber has no stream, so each publish to
//! it resolves it again. The access policy is resolved per client command
//! by the worker (see `crate::auth`), and so is the presence policy, per
//! subscribe and unsubscribe.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::history::HistoryPolicy;
use crate::span::Span;

/// One `[[namespace]]` table of the config file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    pub history_ttl: Option<Span>,
    /// Whether connections without a token may subscribe (and publish or
    /// read history, as far as `publish` and `history` allow); the node's
    /// `anonymous` when unset.
    #[serde(default)]
    pub anonymous: Option<bool>,
    /// Whether clients may publish here at all (the HTTP API always may);
    /// the node's `client_publish` when unset.
    #[serde(default)]
    pub publish: Option<bool>,
    /// Whether clients may read history with the `history` command; the
    /// node's `client_history` when unset.
    #[serde(default)]
    pub history: Option<bool>,
    /// Whether a connection subscribed here is a member of the subject's
    /// presence (`presence`, `presence_stats`); off when unset.
    #[serde(default)]
    pub presence: Option<bool>,
    /// Members a presence subject may hold; the node's
    /// `presence_max_members` when unset.
    #[serde(default)]
    pub presence_max_members: Option<usize>,
    /// Whether the subscribers of a presence subject here are told of each
    /// join and leave; off when unset.
    #[serde(default)]
    pub join_leave: Option<bool>,
    /// Whether subscribes here are asked about first (`proxy_subscribe_url`);
    /// on wherever that URL is set, when unset.
    #[serde(default)]
    pub subscribe_proxy: Option<bool>,
    /// Whether client publishes here are asked about first
    /// (`proxy_publish_url`); on wherever that URL is set, when unset.
    #[serde(default)]
    pub publish_proxy: Option<bool>,
}

/// What clients may do in a namespace, before their token's grants are
/// looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessPolicy {
    pub anonymous: bool,
    pub publish: bool,
    pub history: bool,
}

/// Whether subscribers of a namespace's subjects are their members, and how
/// many a subject may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PresencePolicy {
    pub on: bool,
    pub max_members: usize,
    /// Join and leave events to subscribers (only where `on`).
    pub join_leave: bool,
}

/// Which commands on a namespace's subjects the backend is asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyPolicy {
    pub subscribe: bool,
    pub publish: bool,
}

/// A namespace, by its place in [`Namespaces`]; 0 is the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceId(u16);

/// Subject → one kind of per-namespace setting `P`, by longest matching
/// prefix.
#[derive(Debug, Clone)]
pub struct Namespaces<P = HistoryPolicy> {
    /// Longest prefix first, so the first match is the most specific.
    rules: Vec<(String, P)>,
    default: P,
}

impl<P: Copy> Namespaces<P> {
    /// The settings `resolve` makes of each namespace (given the node's
    /// `default`), under `default` for subjects outside every namespace.
    pub fn new(
        default: P,
        namespaces: &[Namespace],
        resolve: impl Fn(&Namespace, P) -> P,
    ) -> Namespaces<P> {
        let mut rules: Vec<(String, P)> = namespaces
            .iter()
            .map(|ns| (ns.prefix.clone(), resolve(ns, default)))
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

    /// The settings of a namespace.
    pub fn policy(&self, id: NamespaceId) -> P {
        match id.0 {
            0 => self.default,
            n => self.rules[usize::from(n) - 1].1,
        }
    }

    /// The settings that hold for `subject`.
    pub fn policy_for(&self, subject: &str) -> P {
        self.policy(self.id_of(subject))
    }
}

/// The history policy a namespace table makes, over the node's.
pub fn history_policy(ns: &Namespace, node: HistoryPolicy) -> HistoryPolicy {
    HistoryPolicy {
        size: ns.history_size.unwrap_or(node.size),
        ttl: ns.history_ttl.map_or(node.ttl, Duration::from),
    }
}

/// The access policy a namespace table makes, over the node's.
pub fn access_policy(ns: &Namespace, node: AccessPolicy) -> AccessPolicy {
    AccessPolicy {
        anonymous: ns.anonymous.unwrap_or(node.anonymous),
        publish: ns.publish.unwrap_or(node.publish),
        history: ns.history.unwrap_or(node.history),
    }
}

/// The presence policy a namespace table makes, over the node's.
pub fn presence_policy(ns: &Namespace, node: PresencePolicy) -> PresencePolicy {
    PresencePolicy {
        on: ns.presence.unwrap_or(node.on),
        max_members: ns.presence_max_members.unwrap_or(node.max_members),
        join_leave: ns.join_leave.unwrap_or(node.join_leave),
    }
}

/// The proxy policy a namespace table makes, over the node's.
pub fn proxy_policy(ns: &Namespace, node: ProxyPolicy) -> ProxyPolicy {
    ProxyPolicy {
        subscribe: ns.subscribe_proxy.unwrap_or(node.subscribe),
        publish: ns.publish_proxy.unwrap_or(node.publish),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_prefix_wins_and_unset_fields_inherit() {
        let default = HistoryPolicy {
            size: 10,
            ttl: Duration::from_secs(60),
        };
        let ns = |prefix: &str, size, ttl: Option<u64>| Namespace {
            prefix: prefix.to_owned(),
            history_size: size,
            history_ttl: ttl.map(|s| Span(Duration::from_secs(s))),
            ..Namespace::default()
        };
        let namespaces = Namespaces::new(
            default,
            &[
                ns("chat.", Some(100), Some(300)),
                ns("chat.vip.", None, Some(3600)),
                ns("ticks.", Some(0), None),
            ],
            history_policy,
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
