//! A connection's pub/sub session: what it is subscribed to and who it is,
//! apart from the transport that carries it.
//!
//! The worker keeps one per connection in its slab, so it is sized like the
//! connection: one subject inline, and the identity behind one pointer that
//! is null for anonymous connections. Authentication will fill the identity
//! (see docs/architecture.md, "Session and transport"); nothing sets it yet.

use std::sync::Arc;

use smallvec::SmallVec;

/// Who a connection acts as, once authentication says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The user id (a token's `sub`).
    pub user: Box<str>,
}

/// A connection's subscriptions and identity.
#[derive(Debug, Default)]
pub struct Session {
    /// Subjects held (attached or attaching), sharing their names with the
    /// registry and the hub.
    pub subscriptions: SmallVec<[Arc<str>; 1]>,
    /// Set by authentication; `None` for anonymous connections.
    pub identity: Option<Box<Identity>>,
}

impl Session {
    pub fn holds(&self, subject: &str) -> bool {
        self.subscriptions.iter().any(|s| &**s == subject)
    }

    /// Drops `subject`; returns the name it held, if it held it.
    pub fn remove(&mut self, subject: &str) -> Option<Arc<str>> {
        let i = self.subscriptions.iter().position(|s| &**s == subject)?;
        Some(self.subscriptions.swap_remove(i))
    }

    /// Replaces the held name equal to `name` with `name` itself, so that
    /// one allocation of a subject serves every holder.
    pub fn adopt_name(&mut self, name: &Arc<str>) {
        if let Some(held) = self.subscriptions.iter_mut().find(|s| ***s == **name) {
            *held = Arc::clone(name);
        }
    }
}
