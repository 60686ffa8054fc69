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
}
