//! The node-wide counts that turn what the workers and the hub report
//! (a user's connection opened or closed; a subject's first local
//! subscriber attached or its last detached, which nothing reports yet)
//! into lifecycle events: a user's first connection on the node is
//! `online`, its last gone `offline`; a subject attached is `occupied`,
//! detached `vacated`.
//!
//! One `Lifecycle` is kept by the delivery task alone and fed by messages,
//! so the workers take no lock for it. Node-wide only: a user with
//! connections on two nodes is online on each, and a killed node says
//! nothing; the cluster's view needs presence leases (issue 29, item 1).

use std::collections::HashMap;

use super::event::{Event, EventKind};

/// What a worker or the hub reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signal {
    /// A connection now acts as `user`.
    Connected(String),
    /// A connection that acted as `user` is gone.
    Disconnected(String),
    /// The subject's first subscriber on the node.
    Attached(String),
    /// The subject's last subscriber on the node is gone.
    Detached(String),
}

/// See the module header.
#[derive(Debug)]
pub struct Lifecycle {
    node: String,
    /// Open connections per user on this node; a user at zero is removed.
    connections: HashMap<String, u64>,
    /// Numbers the events, so `node-<n>` is unique per node's life.
    next_id: u64,
}

impl Lifecycle {
    pub fn new(node: impl Into<String>) -> Lifecycle {
        Lifecycle {
            node: node.into(),
            connections: HashMap::new(),
            next_id: 0,
        }
    }

    /// The event `signal` makes, at `time` (ms since the epoch), if any.
    pub fn apply(&mut self, signal: Signal, time: u64) -> Option<Event> {
        let (kind, subject, user) = match signal {
            Signal::Connected(user) => {
                let count = self.connections.entry(user.clone()).or_insert(0);
                *count += 1;
                if *count > 1 {
                    return None;
                }
                (EventKind::Online, None, Some(user))
            }
            Signal::Disconnected(user) => {
                let count = self.connections.get_mut(&user)?;
                *count -= 1;
                if *count > 0 {
                    return None;
                }
                self.connections.remove(&user);
                (EventKind::Offline, None, Some(user))
            }
            // Nothing sends these yet (operations.md: occupied and vacated
            // are not delivered); a sender must report a subject's first
            // and last subscriber on the node once each, as each is an event.
            Signal::Attached(subject) => (EventKind::Occupied, Some(subject), None),
            Signal::Detached(subject) => (EventKind::Vacated, Some(subject), None),
        };
        self.next_id += 1;
        Some(Event {
            id: format!("{}-{}", self.node, self.next_id),
            kind,
            time,
            subject,
            user,
            node: self.node.clone(),
        })
    }

    /// Users with a connection on the node.
    pub fn users_online(&self) -> usize {
        self.connections.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(life: &mut Lifecycle, signals: Vec<Signal>) -> Vec<Option<EventKind>> {
        signals
            .into_iter()
            .map(|s| life.apply(s, 0).map(|e| e.kind))
            .collect()
    }

    #[test]
    fn online_at_the_first_connection_offline_after_the_last() {
        let mut life = Lifecycle::new("n1");
        let ann = || "ann".to_owned();
        let seen = kinds(
            &mut life,
            vec![
                Signal::Connected(ann()),
                Signal::Connected(ann()),
                Signal::Disconnected(ann()),
                Signal::Disconnected(ann()),
                Signal::Connected(ann()),
            ],
        );
        use EventKind::{Offline, Online};
        assert_eq!(
            seen,
            [Some(Online), None, None, Some(Offline), Some(Online)]
        );
        assert_eq!(life.users_online(), 1);
    }

    #[test]
    fn a_disconnect_never_seen_connected_makes_nothing() {
        let mut life = Lifecycle::new("n1");
        assert_eq!(life.apply(Signal::Disconnected("bob".into()), 0), None);
        assert_eq!(life.users_online(), 0);
    }

    #[test]
    fn subjects_occupied_and_vacated_with_ids_unique_per_node() {
        let mut life = Lifecycle::new("n1");
        let a = life.apply(Signal::Attached("room".into()), 5).unwrap();
        let b = life.apply(Signal::Detached("room".into()), 6).unwrap();
        assert_eq!((a.kind, b.kind), (EventKind::Occupied, EventKind::Vacated));
        assert_eq!((a.id.as_str(), b.id.as_str()), ("n1-1", "n1-2"));
        assert_eq!(
            (b.subject.as_deref(), b.time, b.node.as_str()),
            (Some("room"), 6, "n1")
        );
    }
}
