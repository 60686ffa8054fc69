//! The cluster's tally of who is here: which nodes hold each user (a
//! connection acting as them) and each subject (a subscriber), so that
//! `online` and `occupied` go out once for the cluster, and `offline` and
//! `vacated` once, after the last node let go and the delay passed.
//!
//! # The contract
//! Every [`Tally`] keeps these; `tally::suite` checks them, and the memory
//! tally and the Redis one (`engine::redis::lifecycle`) run it unchanged.
//! A node calls the tally at its own transitions of a key (its first
//! holder of it, its last gone), so each node holds a key or not. A
//! generation is the node's id, `-`, and more: a node's let-go of a key is
//! `<node>-<call>`.
//! 1. **Up.** [`Tally::up`] records that this node holds `key`. It answers
//!    [`Up::First`] when no node held it and no let-go is pending: this
//!    node then sends `online`/`occupied`, and no other node does for the
//!    same return. With a let-go pending it answers [`Up::Returned`] and
//!    the pending let-go is cancelled: neither event goes out. Otherwise
//!    [`Up::Held`].
//! 2. **Down.** [`Tally::down`] records that this node no longer holds
//!    `key`. When no node holds it any more it starts a pending let-go and
//!    answers its generation, unique in the cluster; this node then owes a
//!    [`Tally::confirm`] after the delay.
//! 3. **Confirm.** [`Tally::confirm`] ends a pending let-go: true when
//!    that generation is still pending and no node holds the key (this
//!    node then sends `offline`/`vacated`); false when a return cancelled
//!    it, or a later let-go replaced it.
//! 4. **A call made again** (its reply lost: a timeout after the store
//!    made it) answers as it did the first time: `up` and `down` carry a
//!    call number, unique per node, and an `up` or `down` of the same
//!    number finds its own mark; a `confirm` made again answers true while
//!    nothing happened to the key since. A different call that finds the
//!    node holding the key, or not, is no change.
//! 5. **Leases.** [`Tally::renew`] keeps this node's lease for `lease`
//!    more, and removes every node whose lease ended from every key it
//!    held, starting a pending let-go for each key left with no holder and
//!    answering those with their generations: the renewing node owes
//!    their confirms. A pending let-go whose node died before its confirm
//!    is taken over the same way. A node that renews after it was taken
//!    for dead learns so ([`Renewed::lost`]). Among nodes renewing at
//!    once, one takes each dead node's key, never two. So a node killed without a word has its keys
//!    let go within one lease plus one renewal period (a third of a lease)
//!    plus the delay.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::event::Key;

/// What [`Tally::up`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Up {
    /// No node held the key and nothing was pending: send the event.
    First,
    /// A let-go was pending: cancelled, and nothing is sent.
    Returned,
    /// Another node holds it already.
    Held,
}

/// Why the tally could not answer (its store is away); the stage counts
/// it and makes the call again.
#[derive(Debug, thiserror::Error)]
#[error("the lifecycle tally failed: {0}")]
pub struct TallyError(pub String);

/// The cluster's tally; see the module contract. Called from one thread
/// (the lifecycle stage's), so a call may wait on a round trip.
pub trait Tally: Send {
    fn up(&mut self, key: &Key, call: u64) -> Result<Up, TallyError>;
    fn down(&mut self, key: &Key, call: u64) -> Result<Option<String>, TallyError>;
    fn confirm(&mut self, key: &Key, generation: &str) -> Result<bool, TallyError>;
    fn renew(&mut self) -> Result<Renewed, TallyError>;
}

/// What [`Tally::renew`] found.
#[derive(Debug, Default)]
pub struct Renewed {
    /// Keys of dead nodes now pending a let-go, with their generations:
    /// the renewing node owes their confirms.
    pub emptied: Vec<(Key, String)>,
    /// This node had no lease: it was taken for dead (its keys let go by
    /// another node), or the store lost it. It must hold again the keys
    /// it holds ([`Tally::up`] each).
    pub lost: bool,
}

/// A key as the tallies name it: `u:` or `s:` and the user or subject.
pub fn key_name(key: &Key) -> String {
    match key {
        Key::User(user) => format!("u:{user}"),
        Key::Subject(subject) => format!("s:{subject}"),
    }
}

/// The key a [`key_name`] names.
pub fn key_of(name: &str) -> Option<Key> {
    if let Some(user) = name.strip_prefix("u:") {
        Some(Key::User(user.to_owned()))
    } else {
        name.strip_prefix("s:")
            .map(|subject| Key::Subject(subject.to_owned()))
    }
}

/// The state every [`MemoryTally`] handle of one process shares.
#[derive(Debug, Default)]
struct World {
    /// Per key, the nodes holding it, each with the call that made it
    /// hold and what that call answered.
    held: HashMap<Key, BTreeMap<String, (u64, Up)>>,
    /// Per key, the generation its last confirm took, until the key is
    /// held or let go again.
    confirmed: HashMap<Key, String>,
    /// Per key with no holder, its pending let-go's generation and the
    /// node that owes its confirm.
    pending: HashMap<Key, (String, String)>,
    /// Per node, when its lease ends (ms on the tally's clock).
    leases: HashMap<String, u64>,
    /// Numbers the generations.
    next: u64,
}

/// The single-process tally: what one node needs without Redis, and the
/// model the Redis tally is checked against. Handles made with
/// [`MemoryTally::join`] share one world, as nodes share a Redis.
#[derive(Clone)]
pub struct MemoryTally {
    world: Arc<Mutex<World>>,
    node: String,
    lease: Duration,
    /// Milliseconds on the tally's clock: wall time, or a test's.
    clock: Arc<dyn Fn() -> u64 + Send + Sync>,
}

impl MemoryTally {
    pub fn new(
        node: &str,
        lease: Duration,
        clock: Arc<dyn Fn() -> u64 + Send + Sync>,
    ) -> MemoryTally {
        MemoryTally {
            world: Arc::default(),
            node: node.to_owned(),
            lease,
            clock,
        }
    }

    /// Another node's handle on the same world.
    pub fn join(&self, node: &str) -> MemoryTally {
        MemoryTally {
            node: node.to_owned(),
            ..self.clone()
        }
    }

    /// A generation for a key this node takes from a dead one: apart
    /// from its own calls' (`<node>-<call>`).
    fn sweep_generation(&self, world: &mut World) -> String {
        world.next += 1;
        format!("{}-s{}", self.node, world.next)
    }

    /// The world, its lock taken anyway if a holder panicked: its maps are
    /// each left whole by every step.
    fn world(&self) -> std::sync::MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl World {
    /// Starts a pending let-go of `key` under `generation`, whose confirm
    /// `owner` owes.
    fn let_go(&mut self, key: &Key, generation: String, owner: &str) -> String {
        self.confirmed.remove(key);
        let pending = (generation.clone(), owner.to_owned());
        self.pending.insert(key.clone(), pending);
        generation
    }
}

impl Tally for MemoryTally {
    fn up(&mut self, key: &Key, call: u64) -> Result<Up, TallyError> {
        let lease_end = (self.clock)() + self.lease.as_millis() as u64;
        let node = self.node.clone();
        let mut world = self.world();
        world.leases.entry(node.clone()).or_insert(lease_end);
        let holders = world.held.entry(key.clone()).or_default();
        if let Some(&(made, answer)) = holders.get(&node) {
            return Ok(if made == call { answer } else { Up::Held });
        }
        let first = holders.is_empty();
        let answer = if !first {
            Up::Held
        } else if world.pending.remove(key).is_some() {
            Up::Returned
        } else {
            Up::First
        };
        world.confirmed.remove(key);
        let holders = world.held.entry(key.clone()).or_default();
        holders.insert(node, (call, answer));
        Ok(answer)
    }

    fn down(&mut self, key: &Key, call: u64) -> Result<Option<String>, TallyError> {
        let generation = format!("{}-{call}", self.node);
        let mut world = self.world();
        let holding = world
            .held
            .get_mut(key)
            .and_then(|holders| holders.remove(&self.node).map(|_| holders.is_empty()));
        match holding {
            // Not holding it: a let-go this call made already stands.
            None => {
                let own = world
                    .pending
                    .get(key)
                    .is_some_and(|(g, _)| *g == generation);
                Ok(own.then_some(generation))
            }
            Some(false) => Ok(None),
            Some(true) => {
                world.held.remove(key);
                Ok(Some(world.let_go(key, generation, &self.node)))
            }
        }
    }

    fn confirm(&mut self, key: &Key, generation: &str) -> Result<bool, TallyError> {
        let mut world = self.world();
        if world.confirmed.get(key).map(String::as_str) == Some(generation) {
            return Ok(true);
        }
        if world.pending.get(key).map(|(g, _)| g.as_str()) != Some(generation) {
            return Ok(false);
        }
        world.pending.remove(key);
        world.confirmed.insert(key.clone(), generation.to_owned());
        Ok(true)
    }

    fn renew(&mut self) -> Result<Renewed, TallyError> {
        let now = (self.clock)();
        let mut world = self.world();
        let lost = world
            .leases
            .insert(self.node.clone(), now + self.lease.as_millis() as u64)
            .is_none();
        let dead: Vec<String> = world
            .leases
            .iter()
            .filter(|(_, &end)| end < now)
            .map(|(node, _)| node.clone())
            .collect();
        let mut emptied = Vec::new();
        for node in dead {
            world.leases.remove(&node);
            let keys: Vec<Key> = world
                .held
                .iter()
                .filter(|(_, holders)| holders.contains_key(&node))
                .map(|(key, _)| key.clone())
                .collect();
            for key in keys {
                let holders = world.held.get_mut(&key).expect("just seen");
                holders.remove(&node);
                if holders.is_empty() {
                    world.held.remove(&key);
                    let generation = self.sweep_generation(&mut world);
                    let generation = world.let_go(&key, generation, &self.node);
                    emptied.push((key, generation));
                }
            }
            // The dead node's own pending let-gos: taken over.
            let owed: Vec<Key> = world
                .pending
                .iter()
                .filter(|(_, (_, owner))| *owner == node)
                .map(|(key, _)| key.clone())
                .collect();
            for key in owed {
                let generation = self.sweep_generation(&mut world);
                let generation = world.let_go(&key, generation, &self.node);
                emptied.push((key, generation));
            }
        }
        Ok(Renewed { emptied, lost })
    }
}

#[cfg(test)]
pub(crate) mod suite;
