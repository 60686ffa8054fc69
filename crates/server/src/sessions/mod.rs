//! A worker's subscription core: its connections' sessions and everything
//! that changes them, apart from sockets.
//!
//! [`Sessions`] owns, for one worker: each connection's [`Session`] (what
//! it holds, how far it got, who it is), the subject registry (who gets a
//! publication here), the subscriptions waiting for their attach answer,
//! the per-connection rate limits, and the tags that tell a connection
//! from a later one in the same slab slot. Protocol v1 commands, the
//! engine's answers, the keeper's feed changes and the fan-out of
//! publications all go through it.
//!
//! It never touches a socket, a buffer or a timer. What it has to say to a
//! connection goes through a [`Wire`], which the worker's I/O loop
//! implements over its slab (queueing, flush lists, long-poll answers) and
//! which tests implement over plain vectors: the unit tests below drive the
//! core against a model without a socket, and `tests/agreement.rs` drives
//! the same through the real binary. Presence and lifecycle hooks plug in
//! here, at [`Sessions::opened`], the subscription changes and
//! [`Sessions::closed`], without touching the loop.
//!
//! Submodules: `commands` (protocol v1 commands), `answers` (the engine's
//! answers and the subscription bookkeeping they drive), `auth` (a
//! connection's token: connect, refresh, permission checks), `feeds`
//! (connections acting as users), `presence` (joins, leaves and the
//! presence commands), `attaching` (subscriptions waiting for their attach
//! answer), `proxied` (commands parked while the backend's proxy is asked)
//! and `abuse` (connections per address, publish,
//! subscribe and token rates).

mod abuse;
mod answers;
mod attaching;
mod auth;
mod commands;
mod feeds;
mod presence;
mod proxied;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use bytes::Bytes;
use myriad_graph::UserId;
use myriad_protocol::position::Position;

pub(crate) use abuse::Bucket;
pub use auth::Credentials;

use crate::auth::Access;
use crate::engine::ConnRequest;
use crate::hooks::Signal;
use crate::hub::Wakeups;
use crate::metrics::WorkerMetrics;
use crate::publication::Publication;
use crate::registry::{ConnId, Registry};
use crate::session::{Identity, Session};
use crate::shared::Shared;
use crate::transport::{self, TransportKind};

/// What reading from a connection should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Keep going.
    Continue,
    /// Stop reading for now (publish back-pressure); resume later.
    Pause,
    /// The connection is closing or gone; stop touching it.
    Stop,
}

/// What the core needs of the connections' wire: which transport each
/// speaks, whether it is open, how much it has queued, and a way to queue
/// bytes. The worker implements it over its slab; it decides nothing the
/// core decides (what to send), and the core nothing it does (when and how
/// bytes reach a socket).
pub trait Wire {
    /// The transport connection `id` speaks.
    fn transport(&self, id: ConnId) -> TransportKind;
    /// The transport of `id` while it is open (messages may be queued),
    /// `None` once it is closing or gone.
    fn open_transport(&self, id: ConnId) -> Option<TransportKind>;
    /// Bytes queued for `id` and not yet written.
    fn pending_bytes(&self, id: ConnId) -> usize;
    /// Queues a protocol reply: a data message, and on the command
    /// transport the answer the held request waits for.
    fn reply(&mut self, id: ConnId, bytes: Bytes);
    /// Queues a data message (a replayed publication), counted in
    /// `messages_out`.
    fn message(&mut self, id: ConnId, bytes: Bytes);
    /// Queues bytes that are not a message (a cursor, an SSE id line).
    fn send(&mut self, id: ConnId, bytes: Bytes);
    /// Queues one live publication (and what its transport sends after
    /// it) for `id`, speaking `kind`: the fan-out's path.
    fn deliver(&mut self, id: ConnId, kind: TransportKind, bytes: Bytes, more: Option<Bytes>);
    /// Every subscription `id` was waiting for has its answer, `replayed`
    /// telling whether publications came with this one: a long-poll held
    /// for them may be answered.
    fn settled(&mut self, id: ConnId, replayed: bool);
}

/// A worker's subscription core (see the module header).
pub struct Sessions {
    /// The worker this is the core of: engine answers come back to it.
    worker: usize,
    shared: Arc<Shared>,
    metrics: WorkerMetrics,
    /// Per slab slot; a vacant slot holds an empty session (three words,
    /// nothing allocated).
    by_conn: Vec<Session>,
    /// Per slab slot, how many connections it has held: tags requests so an
    /// engine answer cannot reach a later connection in the same slot.
    lives: Vec<u32>,
    registry: Registry,
    /// Subscriptions waiting for the engine's attach answer.
    attaching: attaching::Attaching,
    /// Commands waiting for the backend proxy's verdict.
    parked: proxied::Parked,
    /// Per-address and per-connection rate limits.
    pub(crate) abuse: abuse::AbuseLimits,
    /// Workers this turn's engine requests handed work to, woken once the
    /// turn's reading is done (see [`Sessions::take_wakeups`]).
    wakeups: Wakeups,
    /// Sessions whose cursor moved this turn with no event carrying it:
    /// each is sent it once, at the turn's end (see `hand_out_cursors`).
    cursors_owed: Vec<ConnId>,
    /// Requests with an id handed to the engine (publishes, history
    /// reads) whose answers have not come back. Shutdown waits for all of
    /// them (a count, not a list per connection: it is on the hot path)
    /// before it says goodbye, for up to half of `shutdown_timeout`: a
    /// publish the engine has taken may already be in Redis, and its client
    /// must not be left to guess.
    answers_owed: usize,
}

impl Sessions {
    pub fn new(worker: usize, shared: Arc<Shared>) -> Sessions {
        Sessions {
            worker,
            metrics: shared.metrics.worker(worker),
            abuse: abuse::AbuseLimits::new(&shared.config),
            shared,
            by_conn: Vec::new(),
            lives: Vec::new(),
            registry: Registry::new(),
            attaching: attaching::Attaching::default(),
            parked: proxied::Parked::default(),
            wakeups: Wakeups::default(),
            cursors_owed: Vec::new(),
            answers_owed: 0,
        }
    }

    /// A connection took slot `id`: a new life, with an empty session.
    pub fn opened(&mut self, id: ConnId) {
        let slot = id as usize;
        if self.lives.len() <= slot {
            self.lives.resize(slot + 1, 0);
            self.by_conn.resize_with(slot + 1, Session::default);
        }
        self.lives[slot] = self.lives[slot].wrapping_add(1);
        self.by_conn[slot] = Session::default();
    }

    /// Connection `id` is gone: its subscriptions end, its address is
    /// uncounted, its user leaves the node's presence, and its session is
    /// freed.
    pub fn closed(&mut self, id: ConnId) {
        self.parked.closed(id);
        self.unsubscribe_all(id);
        self.abuse.release(id, &self.shared.peers);
        let session = std::mem::take(&mut self.by_conn[id as usize]);
        if let Some(identity) = &session.identity {
            let gone = self.request_of(id, None);
            self.shared.feeds.presence.remove(identity.user, &gone);
            if identity.online {
                let user = identity.user;
                self.shared.hook(|| Signal::Disconnected(user.to_string()));
            }
        }
    }

    /// Connection `id`'s session.
    pub fn session(&self, id: ConnId) -> &Session {
        &self.by_conn[id as usize]
    }

    /// Makes `id` act as `user` for its current request, with what its
    /// token allows, or as nobody: an HTTP transport's or a posted
    /// command's caller. No feeds, so the user is not made present.
    pub fn act_as(&mut self, id: ConnId, user: Option<UserId>, access: Option<Access>) {
        self.by_conn[id as usize].identity = user.map(|user| {
            Box::new(Identity {
                user,
                graph_feeds: 0,
                client_feeds: Vec::new(),
                access,
                online: false,
            })
        });
    }

    /// Makes `id`'s session keep a cursor for the subjects of its opening
    /// request, starting from `since` (see `Session::keep_cursor`).
    pub fn keep_cursor(&mut self, id: ConnId, since: &[Option<Position>]) {
        self.by_conn[id as usize].keep_cursor(since);
    }

    /// Whether a subscription of `id` still waits for its attach answer.
    pub fn attaching_any(&self, id: ConnId) -> bool {
        self.by_conn[id as usize]
            .subscriptions
            .iter()
            .any(|s| self.attaching.holds(s, id))
    }

    /// Requests with an id whose answers have not come back.
    pub fn answers_owed(&self) -> usize {
        self.answers_owed
    }

    /// The workers this turn's engine requests must wake, taken.
    pub fn take_wakeups(&mut self) -> Wakeups {
        std::mem::take(&mut self.wakeups)
    }

    /// The sweep's second: the rate limits' buckets refill.
    pub fn refill(&mut self) {
        self.abuse.refill();
    }

    /// Queues `publication` for every open local subscriber of its subject,
    /// each in its transport's form, made once here for every recipient.
    pub fn deliver(&mut self, publication: &Publication, out: &mut impl Wire) {
        let mut forms: [Option<Bytes>; TransportKind::COUNT] = Default::default();
        for &id in self.registry.subscribers(&publication.subject) {
            let Some(kind) = out.open_transport(id) else {
                continue;
            };
            // The session's transport kind decides the form: a
            // permessage-deflate connection gets the publication's one
            // compressed frame, shared by every worker (see `deflate`).
            let form = forms[kind.index()]
                .get_or_insert_with(|| kind.get().publication(publication, &self.shared.config));
            let session = &mut self.by_conn[id as usize];
            let (bytes, more, owed) = transport::addressed(kind, form, publication, session);
            if owed {
                self.cursors_owed.push(id);
            }
            out.deliver(id, kind, bytes, more);
        }
    }

    /// Sends each owed cursor, after everything this turn queued for its
    /// connection.
    pub fn hand_out_cursors(&mut self, out: &mut impl Wire) {
        // Taken and given back, so that its room serves every turn: a
        // burst on wide SSE streams lists each of them here.
        let mut owed = std::mem::take(&mut self.cursors_owed);
        for &id in &owed {
            let Some(session) = self.by_conn.get_mut(id as usize) else {
                continue;
            };
            // A slot reused since owes only what its new session owes.
            if !session.take_owed_cursor() {
                continue;
            }
            let Some(kind) = out.open_transport(id) else {
                continue;
            };
            if let Some(bytes) = kind.get().cursor(session) {
                out.send(id, bytes);
            }
        }
        owed.clear();
        self.cursors_owed = owed;
    }

    /// Where the engine answers a request of `id`.
    pub(crate) fn request_of(&self, conn: ConnId, request: Option<u64>) -> ConnRequest {
        ConnRequest {
            worker: self.worker,
            conn,
            life: self.lives[conn as usize],
            request,
        }
    }

    /// Whether `to` is still the connection that asked: open, and not a
    /// later connection in a reused slab slot.
    fn is_open_same_life(&self, to: &ConnRequest, out: &impl Wire) -> bool {
        self.lives.get(to.conn as usize) == Some(&to.life) && out.open_transport(to.conn).is_some()
    }

    /// Queues one protocol reply to `id`, in its transport's form.
    fn send_reply(&mut self, id: ConnId, json: &[u8], out: &mut impl Wire) {
        let kind = out.transport(id);
        let bytes = kind.get().reply(json, &self.by_conn[id as usize]);
        out.reply(id, bytes);
    }
}
