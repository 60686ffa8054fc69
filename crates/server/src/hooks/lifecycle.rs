//! The node-wide counts that turn what the workers report (a user's
//! connection opened or closed; a subject's first subscriber on a worker,
//! attaching or live, and its last gone there) into lifecycle events: a
//! user's first connection on the node is `online`, its last gone
//! `offline`; a subject's first worker is `occupied`, its last gone
//! `vacated`.
//!
//! One `Lifecycle` is kept by the lifecycle stage (`cluster.rs`), which
//! asks the cluster's tally about each of these node-wide transitions,
//! and one by the delivery task, which then only sees `Signal::Cluster`
//! and makes each into its event. Fed by messages, so the workers take no
//! lock for it. Each count ignores a decrement it never saw the increment
//! of, so a lost `Connected` or `Attached` (a full channel) cannot make a
//! second `offline` or `vacated`.

use std::collections::HashMap;

use super::event::{Event, EventKind, Key};

/// What a worker reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signal {
    /// A connection now acts as `user`.
    Connected(String),
    /// A connection that acted as `user` is gone.
    Disconnected(String),
    /// The subject's first subscriber on a worker (attaching or live);
    /// sent with the worker's first `Engine::attach` of it.
    Attached(String),
    /// The subject's last subscriber on a worker is gone; sent with the
    /// `Engine::detach` whose `last_local` is true.
    Detached(String),
    /// An event the cluster's tally decided (the lifecycle stage,
    /// `cluster.rs`): made as it is, counted nowhere here.
    Cluster(EventKind, Key),
}

/// See the module header.
#[derive(Debug)]
pub struct Lifecycle {
    node: String,
    /// Open connections per user on this node; a user at zero is removed.
    connections: HashMap<String, u64>,
    /// Workers holding each subject; a subject at zero is removed.
    subjects: HashMap<String, u64>,
    /// Numbers the events, so `node-<n>` is unique per node's life.
    next_id: u64,
}

impl Lifecycle {
    pub fn new(node: impl Into<String>) -> Lifecycle {
        Lifecycle {
            node: node.into(),
            connections: HashMap::new(),
            subjects: HashMap::new(),
            next_id: 0,
        }
    }

    /// The event `signal` makes, at `time` (ms since the epoch), if any.
    pub fn apply(&mut self, signal: Signal, time: u64) -> Option<Event> {
        let (kind, subject, user) = match signal {
            Signal::Connected(user) => {
                if !up(&mut self.connections, &user) {
                    return None;
                }
                (EventKind::Online, None, Some(user))
            }
            Signal::Disconnected(user) => {
                if !down(&mut self.connections, &user) {
                    return None;
                }
                (EventKind::Offline, None, Some(user))
            }
            Signal::Attached(subject) => {
                if !up(&mut self.subjects, &subject) {
                    return None;
                }
                (EventKind::Occupied, Some(subject), None)
            }
            Signal::Detached(subject) => {
                if !down(&mut self.subjects, &subject) {
                    return None;
                }
                (EventKind::Vacated, Some(subject), None)
            }
            Signal::Cluster(kind, Key::Subject(subject)) => (kind, Some(subject), None),
            Signal::Cluster(kind, Key::User(user)) => (kind, None, Some(user)),
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

    /// Subjects with a subscriber on the node.
    pub fn subjects_occupied(&self) -> usize {
        self.subjects.len()
    }

    /// Every user with a connection and subject with a subscriber on the
    /// node.
    pub fn held(&self) -> Vec<Key> {
        let users = self.connections.keys().cloned().map(Key::User);
        let subjects = self.subjects.keys().cloned().map(Key::Subject);
        users.chain(subjects).collect()
    }
}

/// One more of `key`; true when it is the first.
fn up(counts: &mut HashMap<String, u64>, key: &str) -> bool {
    match counts.get_mut(key) {
        Some(count) => {
            *count += 1;
            false
        }
        None => {
            counts.insert(key.to_owned(), 1);
            true
        }
    }
}

/// One fewer of `key`; true when it was the last. A key never counted up
/// is no change.
fn down(counts: &mut HashMap<String, u64>, key: &str) -> bool {
    let Some(count) = counts.get_mut(key) else {
        return false;
    };
    *count -= 1;
    if *count > 0 {
        return false;
    }
    counts.remove(key);
    true
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
        // A second worker's first subscriber, then its last: no event.
        assert_eq!(life.apply(Signal::Attached("room".into()), 5), None);
        assert_eq!(life.apply(Signal::Detached("room".into()), 5), None);
        assert_eq!(life.subjects_occupied(), 1);
        let b = life.apply(Signal::Detached("room".into()), 6).unwrap();
        assert_eq!((a.kind, b.kind), (EventKind::Occupied, EventKind::Vacated));
        assert_eq!((a.id.as_str(), b.id.as_str()), ("n1-1", "n1-2"));
        assert_eq!(
            (b.subject.as_deref(), b.time, b.node.as_str()),
            (Some("room"), 6, "n1")
        );
        assert_eq!(life.apply(Signal::Detached("room".into()), 7), None);
        assert_eq!(life.subjects_occupied(), 0);
    }
}
