//! Commands parked while the backend's proxy is asked about them
//! (`crate::proxy`), and what its verdict makes of them.
//!
//! A `connect`, `subscribe` or `publish` that a proxy URL covers has
//! passed the node's own checks (grants, limits, rates) when it is parked
//! here: one call per subject, its verdict back through the worker's
//! mailbox like an engine answer, so the worker goes on serving every
//! other connection meanwhile.
//!
//! A connection's commands take effect in the order it sent them: a
//! verdict that overtakes an earlier one waits at its place in the
//! connection's queue, and every command that arrives while one is parked
//! (a subscribe after a proxied `connect`, a publish after a proxied
//! subscribe, an unsubscribe) is held there as its text, unchecked, and
//! checked and run in its turn, as the connection is then (acting as the
//! user the `connect` admitted). Only a `ping`, which changes nothing,
//! and a command that does not parse, refused at once, go by; closing is
//! no command. At most `proxy_max_held` commands are held per
//! connection: one past it is refused with `too_many_held`. Parked
//! commands sit before held ones: a held command that parks when it runs
//! parks at the front, ahead of those held after it.
//!
//! The queue carries the connection's life, and closing drops it: a
//! verdict for a closed connection, or for the next one in its slab slot,
//! finds no command of its own and is dropped (it is counted all the
//! same). A posted command (`POST /cmd`) is a connection of its own, with
//! nothing parked before it, so it is never held.
//!
//! What no verdict (a timeout, an error, a malformed answer, an admission
//! whose user or grants break their grammar) does is `proxy_fail`'s: with
//! `closed` the command is refused with `proxy_unavailable`; with `open`
//! it goes on as if no proxy were set (a `connect` then checks its token
//! with the node's own keys).

use std::collections::VecDeque;

use foldhash::fast::RandomState;
use hashbrown::HashMap;
use myriad_graph::UserId;
use myriad_protocol::message::{parse_command, ErrorCode};
use myriad_protocol::position::Position;
use myriad_protocol::subject::is_feed;

use super::{Sessions, Wire};
use crate::auth::grants::Grants;
use crate::auth::Access;
use crate::messages::proxy::{Admitted, Proxied, ProxyKind, ProxyTicket, RefusalCode, Verdict};
use crate::metrics::ProxyOutcome;
use crate::proxy::{request_body, Busy, FailMode};
use crate::registry::ConnId;

/// Capacity kept after a burst drains; beyond it the table is freed.
const SHRINK_ABOVE: usize = 64;

/// A command waiting for its verdict, with what it needs to run after.
#[derive(Debug)]
enum Pending {
    Connect {
        request: Option<u64>,
        token: Box<str>,
    },
    Subscribe {
        request: Option<u64>,
        subject: Box<str>,
        since: Option<Position>,
    },
    Publish {
        request: Option<u64>,
        subject: Box<str>,
        data: Box<str>,
    },
}

#[derive(Debug)]
enum Item {
    /// Asked about: waits for its verdict.
    Parked {
        seq: u64,
        pending: Pending,
        /// The verdict, once it came, while an earlier command still waits.
        verdict: Option<Verdict>,
    },
    /// Arrived behind a parked command: its text, checked when it runs.
    Held(Box<str>),
}

/// One connection's parked commands, oldest first.
#[derive(Debug)]
struct Queue {
    life: u32,
    items: VecDeque<Item>,
}

/// Every connection's parked commands on one worker; empty on a worker
/// with no call out.
#[derive(Debug, Default)]
pub(super) struct Parked {
    by_conn: HashMap<ConnId, Queue, RandomState>,
    next_seq: u64,
}

impl Parked {
    /// Whether `id` has commands waiting: a command it sends now waits
    /// behind them.
    pub(super) fn waiting(&self, id: ConnId) -> bool {
        self.by_conn.contains_key(&id)
    }

    /// Commands of `id` held behind a parked one.
    fn held(&self, id: ConnId) -> usize {
        self.by_conn.get(&id).map_or(0, |q| {
            q.items
                .iter()
                .filter(|i| matches!(i, Item::Held(_)))
                .count()
        })
    }

    /// Connection `id` closed: its parked commands are dropped.
    pub(super) fn closed(&mut self, id: ConnId) {
        self.forget(id);
    }

    /// Drops `id`'s queue; once a burst has drained, gives its table's
    /// memory back (an idle worker holds no entries).
    fn forget(&mut self, id: ConnId) {
        if self.by_conn.remove(&id).is_some()
            && self.by_conn.is_empty()
            && self.by_conn.capacity() > SHRINK_ABOVE
        {
            self.by_conn.shrink_to(0);
        }
    }
}

impl Sessions {
    /// Whether the backend is asked about a `kind` command on `subject`.
    pub(super) fn asks_proxy(&self, kind: ProxyKind, subject: &str) -> bool {
        self.shared
            .proxy
            .as_ref()
            .is_some_and(|p| p.asks_about(kind, subject))
    }

    /// Parks a subscribe of `id` to `subject` when the backend is asked
    /// about it; false when it is not, and the caller subscribes.
    pub(super) fn proxy_subscribe(
        &mut self,
        id: ConnId,
        subject: &str,
        since: Option<Position>,
        request: Option<u64>,
        out: &mut impl Wire,
    ) -> bool {
        if !self.asks_proxy(ProxyKind::Subscribe, subject) {
            return false;
        }
        let pending = Pending::Subscribe {
            request,
            subject: subject.into(),
            since,
        };
        self.park(id, ProxyKind::Subscribe, pending, request, out);
        true
    }

    /// Parks a publish of `id` when the backend is asked about it; false
    /// when it is not, and the caller publishes.
    pub(super) fn proxy_publish(
        &mut self,
        id: ConnId,
        request: Option<u64>,
        subject: &str,
        data: &str,
        out: &mut impl Wire,
    ) -> bool {
        if !self.asks_proxy(ProxyKind::Publish, subject) {
            return false;
        }
        let pending = Pending::Publish {
            request,
            subject: subject.into(),
            data: data.into(),
        };
        self.park(id, ProxyKind::Publish, pending, request, out);
        true
    }

    /// Parks a `connect` when the backend judges them; false when the
    /// node checks the token itself.
    pub(super) fn proxy_connect(
        &mut self,
        id: ConnId,
        request: Option<u64>,
        token: &str,
        out: &mut impl Wire,
    ) -> bool {
        if !self.shared.proxy.as_ref().is_some_and(|p| p.asks_connect()) {
            return false;
        }
        let pending = Pending::Connect {
            request,
            token: token.into(),
        };
        self.park(id, ProxyKind::Connect, pending, request, out);
        true
    }

    /// Asks the backend about `pending` and parks it, or refuses it with
    /// `proxy_busy` when `proxy_max_in_flight` calls are out.
    fn park(
        &mut self,
        id: ConnId,
        kind: ProxyKind,
        pending: Pending,
        request: Option<u64>,
        out: &mut impl Wire,
    ) {
        let Some(proxy) = self.shared.proxy.as_ref() else {
            return;
        };
        let user = self.by_conn[id as usize]
            .identity
            .as_ref()
            .map(|i| i.user.to_string());
        let body = match &pending {
            Pending::Connect { token, .. } => request_body(kind, None, None, None, Some(token)),
            Pending::Subscribe { subject, .. } => {
                request_body(kind, user.as_deref(), Some(subject), None, None)
            }
            Pending::Publish { subject, data, .. } => {
                request_body(kind, user.as_deref(), Some(subject), Some(data), None)
            }
        };
        self.parked.next_seq += 1;
        let ticket = ProxyTicket {
            worker: self.worker,
            conn: id,
            life: self.lives[id as usize],
            seq: self.parked.next_seq,
        };
        if let Err(Busy) = proxy.ask(kind, ticket, body) {
            self.shared
                .metrics
                .proxy_call(kind.name(), ProxyOutcome::Busy, None);
            let detail = "proxy_max_in_flight proxy calls are out on this node";
            self.refuse(id, request, ErrorCode::ProxyBusy, detail, out);
            return;
        }
        let queue = self.parked.by_conn.entry(id).or_insert_with(|| Queue {
            life: ticket.life,
            items: VecDeque::new(),
        });
        queue.items.push_back(Item::Parked {
            seq: ticket.seq,
            pending,
            verdict: None,
        });
    }

    /// Holds `text`, a command of `id` that arrived while an earlier one is
    /// parked, to run in its turn; refuses it with `too_many_held` when
    /// `proxy_max_held` wait already.
    pub(super) fn hold(
        &mut self,
        id: ConnId,
        request: Option<u64>,
        text: &str,
        out: &mut impl Wire,
    ) {
        let most = self.shared.config.proxy_max_held;
        if self.parked.held(id) >= most {
            let detail =
                format!("{most} commands (proxy_max_held) already wait behind one asked about");
            return self.refuse(id, request, ErrorCode::TooManyHeld, &detail, out);
        }
        let Some(queue) = self.parked.by_conn.get_mut(&id) else {
            return;
        };
        queue.items.push_back(Item::Held(text.into()));
        self.shared.metrics.proxy_held();
    }

    /// The backend's verdict on a parked command: counted, then, if its
    /// connection is still the one that asked, the command runs (in its
    /// turn) or is refused.
    pub fn on_proxied(&mut self, proxied: Proxied, out: &mut impl Wire) {
        let Proxied {
            ticket,
            kind,
            verdict,
            latency,
        } = proxied;
        let verdict = match verdict {
            Verdict::Allow(Some(admitted)) => self.admission(admitted),
            other => other,
        };
        let outcome = match &verdict {
            Verdict::Allow(_) => ProxyOutcome::Allowed,
            Verdict::Refuse { .. } => ProxyOutcome::Refused,
            Verdict::Timeout => ProxyOutcome::Timeout,
            Verdict::Failed(_) => ProxyOutcome::Error,
        };
        self.shared
            .metrics
            .proxy_call(kind.name(), outcome, Some(latency));
        let id = ticket.conn;
        if self.lives.get(id as usize) != Some(&ticket.life) || out.open_transport(id).is_none() {
            return;
        }
        let Some(queue) = self.parked.by_conn.get_mut(&id) else {
            return;
        };
        if queue.life != ticket.life {
            return;
        }
        let parked = queue.items.iter_mut().find_map(|i| match i {
            Item::Parked { seq, verdict, .. } if *seq == ticket.seq => Some(verdict),
            _ => None,
        });
        let Some(slot) = parked else {
            return;
        };
        *slot = Some(verdict);
        self.run_decided(id, out);
    }

    /// A connect's admission, checked against the grammars a token's
    /// claims are held to; one that breaks them is no verdict.
    fn admission(&self, admitted: Admitted) -> Verdict {
        if let Err(e) = admitted.user.parse::<UserId>() {
            tracing::warn!(error = %e, "proxy connect answer: bad user");
            return Verdict::Failed(format!("malformed answer: user: {e}"));
        }
        let max = self.shared.config.max_subject_len;
        if let Err(e) = Grants::parse(&admitted.subscribe, &admitted.publish, &admitted.user, max) {
            tracing::warn!(error = %e, "proxy connect answer: bad grant");
            return Verdict::Failed(format!("malformed answer: {e}"));
        }
        Verdict::Allow(Some(admitted))
    }

    /// Runs `id`'s waiting commands from the oldest: each parked one once
    /// its verdict is in, each held one as a command read now would run.
    fn run_decided(&mut self, id: ConnId, out: &mut impl Wire) {
        loop {
            let Some(queue) = self.parked.by_conn.get_mut(&id) else {
                return;
            };
            let ready = match queue.items.front() {
                None => {
                    self.parked.forget(id);
                    return;
                }
                Some(Item::Parked { verdict: None, .. }) => return,
                Some(_) => queue.items.pop_front().expect("front just seen"),
            };
            match ready {
                Item::Parked {
                    pending,
                    verdict: Some(verdict),
                    ..
                } => self.decide(id, pending, verdict, out),
                Item::Parked { verdict: None, .. } => unreachable!("an undecided front stays"),
                Item::Held(text) => self.run_held(id, &text, out),
            }
            if out.open_transport(id).is_none() {
                return;
            }
        }
    }

    /// Runs held command `text` of `id` with nothing waiting before it: the
    /// commands held after it are set aside meanwhile, so what it parks
    /// goes ahead of them.
    fn run_held(&mut self, id: ConnId, text: &str, out: &mut impl Wire) {
        let Some(queue) = self.parked.by_conn.remove(&id) else {
            return;
        };
        let Queue { life, items: after } = queue;
        // Parsed before it was held; the limits are those of the node now.
        if let Ok(command) = parse_command(text, self.shared.config.max_subject_len) {
            // Read-side back-pressure is for the reading loop, as for a
            // verdict's publish.
            let _ = self.run_command(id, command, out);
        }
        if after.is_empty() || out.open_transport(id).is_none() {
            return;
        }
        self.parked
            .by_conn
            .entry(id)
            .or_insert_with(|| Queue {
                life,
                items: VecDeque::new(),
            })
            .items
            .extend(after);
    }

    /// What `verdict` makes of `pending`, `proxy_fail` deciding for no
    /// verdict.
    fn decide(&mut self, id: ConnId, pending: Pending, verdict: Verdict, out: &mut impl Wire) {
        let request = match &pending {
            Pending::Connect { request, .. }
            | Pending::Subscribe { request, .. }
            | Pending::Publish { request, .. } => *request,
        };
        let fail = self
            .shared
            .proxy
            .as_ref()
            .map_or(FailMode::Closed, |p| p.fail());
        let admitted = match verdict {
            Verdict::Allow(admitted) => admitted,
            Verdict::Refuse { code, reason } => {
                let code = match code {
                    RefusalCode::ProxyRefused => ErrorCode::ProxyRefused,
                    RefusalCode::Forbidden => ErrorCode::Forbidden,
                    RefusalCode::RateLimited => ErrorCode::RateLimited,
                };
                return self.refuse(id, request, code, &reason, out);
            }
            Verdict::Timeout | Verdict::Failed(_) if fail == FailMode::Closed => {
                let detail = "the backend's proxy gave no verdict (proxy_fail = closed)";
                return self.refuse(id, request, ErrorCode::ProxyUnavailable, detail, out);
            }
            Verdict::Timeout | Verdict::Failed(_) => None,
        };
        match pending {
            Pending::Connect { token, .. } => match admitted {
                Some(admitted) => self.connect_admitted(id, request, admitted, out),
                // Fail open: as if no proxy were set.
                None => self.connect_locally(id, request, &token, out),
            },
            Pending::Subscribe { subject, since, .. } => {
                if self.by_conn[id as usize].holds(&subject) {
                    return self.acknowledge(id, request, out);
                }
                self.add_subscription(id, &subject, since, request, out);
                if is_feed(&subject) {
                    self.by_conn[id as usize].feed_subscribed(&subject);
                }
            }
            Pending::Publish { subject, data, .. } => {
                // Read-side back-pressure is for the reading loop; a
                // verdict's publish goes as a command read now would.
                let _ = self.publish_for(id, request, &subject, &data);
            }
        }
    }

    /// Makes `id` act as the user the backend admitted, with its grants.
    fn connect_admitted(
        &mut self,
        id: ConnId,
        request: Option<u64>,
        admitted: Admitted,
        out: &mut impl Wire,
    ) {
        if self.by_conn[id as usize].identity.is_some() {
            let detail = "the connection already acts as a user";
            return self.refuse(id, request, ErrorCode::AlreadyConnected, detail, out);
        }
        let max = self.shared.config.max_subject_len;
        // Both checked by `admission` when the verdict came.
        let (Ok(user), Ok(grants)) = (
            admitted.user.parse::<UserId>(),
            Grants::parse(&admitted.subscribe, &admitted.publish, &admitted.user, max),
        ) else {
            return;
        };
        let access = Access {
            grants,
            expires: admitted.expires.unwrap_or(u64::MAX),
            info: None,
        };
        self.open_as_user(id, user, Some(access), out);
        self.acknowledge(id, request, out);
    }
}
