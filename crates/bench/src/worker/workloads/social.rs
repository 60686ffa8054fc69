//! `myriad bench social`, the worker side: users of a follow graph, each
//! holding its connections (`?user=ID`), sending as themselves through one
//! of them and receiving the feeds they follow.
//!
//! On connect the node subscribes a connection to the feed `@X` of every
//! user X its user follows, and to its own; [`SocialDriver`] holds a
//! connection as set up once it has had a `subscribed` for each feed its
//! user follows in the graph file (one it does not follow is counted as a
//! mismatch: the node holds another graph). Set-up, retries and delivery
//! latency are the [`SubscribeDriver`]'s, which this wraps as churn does.
//!
//! Sends are open-loop on the run's one schedule: send n's sender is a pure
//! function of n ([`Senders`]), so each worker fires the sends of the users
//! it holds and together they fire every send once. A send is the
//! protocol's `send` command on one of the sender's connections, its data
//! stamped with its due time; its `ok` says where it landed in the sender's
//! feed and how many connections the node handed it to. The worker records
//! each answered send with the wall-clock interval it was in flight, and
//! per connection which offsets of which feed arrived ([`Received`]). It
//! judges nothing: the coordinator holds the graph, every worker's sends
//! and the follows and unfollows it made, and judges every (send,
//! connection) pair (`util/judge.rs`). The coordinator side is
//! `coordinator/workloads/social.rs`.

use myriad_protocol::message::{encode_send, parse_server_message, ServerMessage};
use myriad_protocol::position::Position;
use myriad_protocol::subject::FEED_PREFIX;

use crate::schema::{
    ConnReceipts, SocialDone, SocialTask, SocialUser, Spec, SubscribeTask, SubscribeTransport,
};
use crate::util::clock::{realtime_ns, Extent};
use crate::util::counters::Counters;
use crate::util::error::BenchError;
use crate::util::graph::Senders;
use crate::util::judge::{FeedReceipt, SendRecord};
use crate::util::offsets::Received;
use crate::util::pacing::Schedule;
use crate::util::pattern::mix;
use crate::util::payload::PayloadBuilder;
use crate::worker::client_conn::{Ending, Handler, Opening};
use crate::worker::driver::{Driver, DriverResult, MAX_BATCH};
use crate::worker::reactor::Reactor;
use crate::worker::subscriber::{OnSubscribers, SubscribeDriver};

/// Bytes queued on one connection beyond what its socket took, past which
/// a send due on it waits: a node that stops reading holds the schedule
/// back (its sends leave late, with their due stamps) instead of growing
/// this process.
const MAX_BACKLOG_BYTES: usize = 1 << 20;

/// The feed of a delivery whose subject is not a user's feed (`@ID`):
/// above every user id, so no send matches it and the judge counts it as
/// unexpected.
const NOT_A_FEED: u64 = u64::MAX;

/// One connection of a user.
#[derive(Debug, Default)]
struct UserConn {
    /// Its current socket, from the upgrade on; None before, and once lost.
    key: Option<usize>,
    /// Feeds still owed a `subscribed` before it is set up.
    awaiting: u32,
    /// What it received, by (feed, epoch) ascending.
    feeds: Vec<FeedReceipt>,
}

impl UserConn {
    /// Its entry for `feed` in `epoch`, made if new.
    fn feed(&mut self, feed: u64, epoch: u64) -> &mut FeedReceipt {
        let at = self
            .feeds
            .binary_search_by_key(&(feed, epoch), |f| (f.feed, f.epoch));
        let at = at.unwrap_or_else(|at| {
            let entry = FeedReceipt {
                feed,
                epoch,
                received: Received::default(),
            };
            self.feeds.insert(at, entry);
            at
        });
        &mut self.feeds[at]
    }

    /// Whether it has had anything of `feed`.
    fn has(&self, feed: u64) -> bool {
        let at = self.feeds.partition_point(|f| f.feed < feed);
        self.feeds.get(at).is_some_and(|f| f.feed == feed)
    }
}

/// A send fired, until it is answered.
#[derive(Debug, Clone, Copy)]
struct Pending {
    /// Its sender.
    user: u64,
    /// Wall clock just before its frame was queued, ns.
    sent_ns: u64,
    /// An `ok` or an error came.
    answered: bool,
}

/// What one server message was to the workload.
enum Heard {
    /// A publication of a feed, and whether it was a timed delivery.
    Delivery(bool),
    /// Anything else.
    Other,
}

/// The worker side of social.
pub struct SocialDriver {
    /// Sets connections up (and up again), times deliveries.
    inner: SubscribeDriver,
    /// Slot of its first user.
    first_user: u64,
    /// Global index of its first connection.
    first_conn: u64,
    /// Connections per user.
    per_user: u64,
    users: Vec<SocialUser>,
    /// Its connections: user i's j-th is `i × per_user + j`. While one is
    /// open but not yet subscribed to every feed, the worker is not ready
    /// (`SubscribeDriver::owe`), so no send precedes a subscription.
    conns: Vec<UserConn>,
    sends: Schedule,
    /// Sends in the schedule.
    events: u64,
    /// The next send of the schedule to look at.
    n: u64,
    senders: Senders,
    payload: PayloadBuilder,
    /// Sends fired, by request id − 1.
    pending: Vec<Pending>,
    /// Sends answered with a position.
    answered: Vec<SendRecord>,
    /// When the first and last send was fired.
    sent: Option<Extent>,
    /// Connections written to this tick, flushed once at its end.
    touched: Vec<usize>,
    /// Reused buffer for a send's data.
    data: String,
}

impl SocialDriver {
    /// A driver for `task` under `spec`.
    pub fn new(task: SocialTask, spec: &Spec) -> Result<SocialDriver, BenchError> {
        let per_user = u64::from(task.conns_per_user.max(1));
        let first_conn = task.first_user * per_user;
        let count = task.users.len() as u64 * per_user;
        let subscribe = SubscribeTask {
            first: first_conn,
            count,
            assignment: None,
            in_flight: task.in_flight,
            connect_rate: task.connect_rate,
            broadcast_messages: None,
            transport: SubscribeTransport::Ws,
        };
        Ok(SocialDriver {
            inner: SubscribeDriver::new(subscribe, spec)?,
            first_user: task.first_user,
            first_conn,
            per_user,
            conns: (0..count).map(|_| UserConn::default()).collect(),
            users: task.users,
            events: task.sends.total_events(),
            sends: task.sends,
            n: 0,
            senders: task.senders,
            payload: PayloadBuilder::new(task.size, spec.seed ^ spec.worker),
            pending: Vec::new(),
            answered: Vec::new(),
            sent: None,
            touched: Vec::new(),
            data: String::new(),
        })
    }

    /// The user of local connection `i`.
    fn user_of(&self, i: usize) -> &SocialUser {
        &self.users[i / self.per_user as usize]
    }

    /// Local connection `i` owes `feeds` more `subscribed` answers.
    fn owe(&mut self, i: usize, feeds: u32) {
        let before = std::mem::replace(&mut self.conns[i].awaiting, feeds);
        self.inner.owe(before, feeds);
    }

    /// Reads one server message on local connection `i`.
    fn hear(
        &mut self,
        i: usize,
        index: u32,
        data: &[u8],
        now_real: u64,
        c: &mut Counters,
    ) -> Heard {
        let Some(parsed) = std::str::from_utf8(data)
            .ok()
            .and_then(|text| parse_server_message(text).ok())
        else {
            return Heard::Other;
        };
        match parsed {
            ServerMessage::Delivery {
                subject, position, ..
            } => {
                self.conns[i]
                    .feed(feed_of(&subject), position.epoch.0)
                    .received
                    .insert(position.offset);
                Heard::Delivery(self.inner.on_message(index, data, now_real, c))
            }
            ServerMessage::Subscribed {
                id: None,
                subject,
                position,
                ..
            } => {
                self.subscribed(i, index, feed_of(&subject), position, c);
                Heard::Other
            }
            ServerMessage::Ok {
                id: Some(id),
                position: Some(at),
                reached,
            } => {
                self.acked(id, at, reached.unwrap_or(0), now_real, c);
                Heard::Other
            }
            ServerMessage::Error { id: Some(id), .. } => {
                if let Some(p) = self.pending_mut(id) {
                    p.answered = true;
                    c.sends_refused += 1;
                }
                Heard::Other
            }
            _ => Heard::Other,
        }
    }

    /// The node subscribed local connection `i` to `feed`: one of the
    /// feeds it is owed while it sets up, a follow made during the run
    /// after that.
    fn subscribed(&mut self, i: usize, index: u32, feed: u64, at: Position, c: &mut Counters) {
        let awaiting = self.conns[i].awaiting;
        if awaiting == 0 {
            c.follow_notices += 1;
            return;
        }
        let user = self.user_of(i);
        let owed = feed == user.id || user.follows.binary_search(&feed).is_ok();
        if !owed || self.conns[i].has(feed) {
            c.feeds_mismatched += 1;
            return;
        }
        self.conns[i].feed(feed, at.epoch.0);
        self.owe(i, awaiting - 1);
        if awaiting == 1 {
            c.subscribed += 1;
            self.inner.set_up(index);
        }
    }

    /// Send `id` was answered `ok` at `at`, reaching `reached` connections.
    fn acked(&mut self, id: u64, at: Position, reached: u64, now_real: u64, c: &mut Counters) {
        let Some(p) = self.pending_mut(id) else {
            return;
        };
        p.answered = true;
        let record = SendRecord {
            user: p.user,
            epoch: at.epoch.0,
            offset: at.offset,
            sent_ns: p.sent_ns,
            acked_ns: now_real,
        };
        self.answered.push(record);
        c.sends_acked += 1;
        c.reached += reached;
    }

    /// Send `id`, if it was fired and not answered yet.
    fn pending_mut(&mut self, id: u64) -> Option<&mut Pending> {
        let p = self
            .pending
            .get_mut(usize::try_from(id).ok()?.checked_sub(1)?)?;
        (!p.answered).then_some(p)
    }

    /// Fires the sends that are due and whose senders it holds, a batch at
    /// most. Returns when it next has one due.
    fn send_due(&mut self, reactor: &mut Reactor, start: u64, now: u64) -> Option<u64> {
        let mut next = None;
        for _ in 0..MAX_BATCH {
            if self.n >= self.events {
                break;
            }
            let due = start + self.sends.due(self.n).map_or(0, |d| d.as_nanos() as u64);
            if due > now {
                next = Some(due);
                break;
            }
            let slot = self.senders.sender(self.n);
            let ours = slot
                .checked_sub(self.first_user)
                .filter(|&u| u < self.users.len() as u64);
            if let Some(u) = ours {
                if !self.fire(reactor, u as usize, due) {
                    // Its connection's queue is full: the node is not
                    // reading. The send stays due; look again shortly.
                    next = Some(now + 1_000_000);
                    break;
                }
            }
            self.n += 1;
        }
        if self.n < self.events && next.is_none() {
            next = Some(now); // the batch ended with more due
        }
        for key in std::mem::take(&mut self.touched) {
            reactor.flush(key, self);
        }
        next
    }

    /// Fires send `self.n`, due at monotonic `due`, from local user `u` on
    /// one of its connections. False when that connection's queue is full.
    fn fire(&mut self, reactor: &mut Reactor, u: usize, due: u64) -> bool {
        let n = self.n;
        let j = mix(n ^ self.senders.seed) % self.per_user;
        let i = u * self.per_user as usize + j as usize;
        let Some(key) = self.conns[i].key else {
            // The connection is gone: the send cannot be made.
            reactor.cx.counters.publish_dropped += 1;
            return true;
        };
        if reactor.backlog(key) > MAX_BACKLOG_BYTES {
            return false;
        }
        let id = self.pending.len() as u64 + 1;
        self.data.clear();
        self.payload
            .write(reactor.origin().real_at(due), n, &mut self.data);
        let text = encode_send(&self.data, Some(id));
        let sent_ns = realtime_ns();
        reactor.queue_text(key, text.as_bytes());
        self.pending.push(Pending {
            user: self.users[u].id,
            sent_ns,
            answered: false,
        });
        Extent::extend(&mut self.sent, sent_ns);
        reactor.cx.counters.published += 1;
        self.touched.push(key);
        true
    }
}

/// The user whose feed `subject` is (`@ID`), or [`NOT_A_FEED`].
fn feed_of(subject: &str) -> u64 {
    subject
        .strip_prefix(FEED_PREFIX)
        .and_then(|id| id.parse::<u64>().ok())
        .filter(|&id| id != NOT_A_FEED)
        .unwrap_or(NOT_A_FEED)
}

impl Handler for SocialDriver {
    fn on_open(&mut self, key: usize, index: u32, _now_ns: u64, _out: &mut Opening) {
        let Some(i) = self.inner.local(index) else {
            return;
        };
        // Nothing to send: the node subscribes the connection itself.
        let feeds = self.user_of(i).follows.len() as u32 + 1;
        let conn = &mut self.conns[i];
        conn.key = Some(key);
        conn.feeds.clear();
        self.owe(i, feeds);
    }

    fn on_message(&mut self, index: u32, data: &[u8], now_real: u64, c: &mut Counters) -> bool {
        let Some(i) = self.inner.local(index) else {
            return false;
        };
        matches!(
            self.hear(i, index, data, now_real, c),
            Heard::Delivery(true)
        )
    }

    fn on_raw(&mut self, _: u32, _: &[u8], _: u64, _: &mut Counters) -> usize {
        0
    }

    fn on_closed(
        &mut self,
        key: usize,
        index: u32,
        ending: Ending,
        was_open: bool,
        counters: &mut Counters,
    ) {
        let Some(i) = self.inner.local(index) else {
            return;
        };
        if was_open && self.conns[i].key != Some(key) {
            return;
        }
        // A connection that ends before it is set up is set up again; one
        // lost after that is not (what it then misses is judged lost).
        let in_setup = !was_open || self.conns[i].awaiting > 0;
        self.conns[i].key = None;
        self.owe(i, 0);
        self.inner
            .on_closed(key, index, ending, !in_setup, counters);
    }

    fn user(&self, index: u32) -> Option<u64> {
        self.inner.local(index).map(|i| self.user_of(i).id)
    }
}

impl OnSubscribers for SocialDriver {
    fn base(&self) -> &SubscribeDriver {
        &self.inner
    }

    fn base_mut(&mut self) -> &mut SubscribeDriver {
        &mut self.inner
    }

    fn due(&mut self, reactor: &mut Reactor, start: u64, now: u64) -> Option<u64> {
        self.send_due(reactor, start, now)
    }

    fn paced(&self) -> bool {
        // Sends are stamped with their due time: lateness here would
        // become measured latency.
        true
    }

    fn report(self) -> DriverResult {
        let unanswered = self.pending.iter().filter(|p| !p.answered).count() as u64;
        let first = self.first_conn;
        let receipts = self
            .conns
            .into_iter()
            .enumerate()
            .map(|(i, c)| ConnReceipts {
                index: first + i as u64,
                feeds: c.feeds,
            })
            .collect();
        DriverResult {
            sent: self.sent,
            social: Some(SocialDone {
                sends: self.answered,
                unanswered,
                receipts,
            }),
            ..self.inner.finish()
        }
    }
}

#[cfg(test)]
mod tests {
    use myriad_protocol::message::{
        encode_error, encode_published, encode_subscribed, write_publication, ErrorCode,
    };
    use myriad_protocol::position::Epoch;

    use super::*;
    use crate::schema::Task;

    // What the node sends is written by the protocol crate's encoders, as
    // the node writes it, so a change of the protocol fails these tests.

    /// Offset `offset` of a feed; every feed here is in epoch 0xab.
    fn at(offset: u64) -> Position {
        Position::new(Epoch(0xab), offset)
    }

    /// A worker of users 7 (follows 3 and 9) and 9 (follows nobody), slots
    /// 2 and 3 of the run, two connections each: global connections 4–7.
    fn driver() -> SocialDriver {
        let task = SocialTask {
            first_user: 2,
            users: vec![
                SocialUser {
                    id: 7,
                    follows: vec![3, 9],
                },
                SocialUser {
                    id: 9,
                    follows: vec![],
                },
            ],
            conns_per_user: 2,
            in_flight: 10,
            connect_rate: 0.0,
            sends: Schedule::constant(10.0, 1.0),
            senders: Senders::uniform(4, 1),
            size: 100,
        };
        let spec = Spec::for_tests(Task::Social(task.clone()));
        SocialDriver::new(task, &spec).unwrap()
    }

    fn subscribed(feed: u64, offset: u64) -> String {
        encode_subscribed(None, &format!("@{feed}"), at(offset), None)
    }

    fn msg(feed: u64, offset: u64) -> String {
        let mut out = Vec::new();
        let data = r#"{"ts":1000,"n":1,"pad":"x"}"#;
        write_publication(&mut out, &format!("@{feed}"), at(offset), data);
        String::from_utf8(out).unwrap()
    }

    fn hear(d: &mut SocialDriver, c: &mut Counters, index: u32, text: &str) -> bool {
        d.on_message(index, text.as_bytes(), 2_000_000, c)
    }

    fn open(d: &mut SocialDriver, key: usize, index: u32) {
        d.on_open(key, index, 0, &mut Opening::default());
    }

    #[test]
    fn connections_act_as_their_users_and_set_up_on_their_feeds() {
        let mut d = driver();
        let mut c = Counters::default();
        assert_eq!([4, 5, 6, 7].map(|i| d.user(i)), [7, 7, 9, 9].map(Some));
        assert_eq!((d.user(3), d.user(8)), (None, None));
        open(&mut d, 1, 4);
        open(&mut d, 2, 6);
        assert_eq!(d.inner.unsettled(), 2);
        // User 7 is owed @3, @9 and @7; user 9 only @9.
        hear(&mut d, &mut c, 4, &subscribed(3, 10));
        hear(&mut d, &mut c, 4, &subscribed(9, 0));
        assert_eq!((d.inner.unsettled(), c.subscribed), (2, 0));
        hear(&mut d, &mut c, 4, &subscribed(7, 4));
        hear(&mut d, &mut c, 6, &subscribed(9, 0));
        assert_eq!(
            (d.inner.unsettled(), c.subscribed, c.feeds_mismatched),
            (0, 2, 0)
        );
        // After set-up, a `subscribed` is a follow made during the run.
        hear(&mut d, &mut c, 6, &subscribed(3, 12));
        assert_eq!((c.follow_notices, c.feeds_mismatched), (1, 0));
    }

    #[test]
    fn a_feed_the_file_does_not_have_is_a_mismatch() {
        let mut d = driver();
        let mut c = Counters::default();
        open(&mut d, 1, 4);
        // User 7 follows 3 and 9: @5 is not its, and @3 comes twice.
        for feed in [3, 3, 5, 9] {
            hear(&mut d, &mut c, 4, &subscribed(feed, 0));
        }
        assert_eq!((c.feeds_mismatched, c.subscribed), (2, 0));
        hear(&mut d, &mut c, 4, &subscribed(7, 0));
        assert_eq!((c.feeds_mismatched, c.subscribed), (2, 1));
    }

    #[test]
    fn deliveries_are_kept_per_feed_and_sends_by_their_answers() {
        let mut d = driver();
        let mut c = Counters::default();
        open(&mut d, 1, 6);
        hear(&mut d, &mut c, 6, &subscribed(9, 0));
        assert!(hear(&mut d, &mut c, 6, &msg(9, 1)), "a timed delivery");
        assert!(hear(&mut d, &mut c, 6, &msg(9, 2)));
        assert!(hear(&mut d, &mut c, 6, &msg(9, 2)));
        let stray = msg(9, 5).replace("@9", "/p/s1");
        assert!(hear(&mut d, &mut c, 6, &stray));
        // Two sends fired by user 9; the first answered ok, the second
        // refused, an unknown id and a repeated answer change nothing.
        for sent_ns in [100, 200] {
            d.pending.push(Pending {
                user: 9,
                sent_ns,
                answered: false,
            });
        }
        let ok = encode_published(1, Some(at(3)), 4);
        assert!(!hear(&mut d, &mut c, 6, &ok));
        assert!(!hear(&mut d, &mut c, 6, &ok), "answered already");
        let refused = encode_error(Some(2), ErrorCode::PublishFailed, "y");
        assert!(!hear(&mut d, &mut c, 6, &refused));
        let unknown = ok.replace("\"id\":1", "\"id\":9");
        assert!(!hear(&mut d, &mut c, 6, &unknown));
        assert_eq!((c.sends_acked, c.sends_refused, c.reached), (1, 1, 4));
        let done = d.finish().social.unwrap();
        assert_eq!(
            done.sends,
            [SendRecord {
                user: 9,
                epoch: 0xab,
                offset: 3,
                sent_ns: 100,
                acked_ns: 2_000_000,
            }]
        );
        assert_eq!(done.unanswered, 0);
        assert_eq!(done.receipts.len(), 4, "every connection, set up or not");
        let six = &done.receipts[2];
        assert_eq!(six.index, 6);
        let feeds: Vec<_> = six
            .feeds
            .iter()
            .map(|f| (f.feed, f.received.ranges().to_vec(), f.received.again))
            .collect();
        assert_eq!(feeds, [(9, vec![(1, 2)], 1), (NOT_A_FEED, vec![(5, 5)], 0)]);
    }

    #[test]
    fn a_connection_lost_in_set_up_is_owed_nothing_and_set_up_again() {
        let mut d = driver();
        let mut c = Counters::default();
        open(&mut d, 1, 4);
        hear(&mut d, &mut c, 4, &subscribed(3, 0));
        d.on_closed(1, 4, Ending::Clean, true, &mut c);
        assert_eq!((d.inner.unsettled(), d.conns[0].key), (0, None));
        open(&mut d, 2, 4);
        assert_eq!(d.inner.unsettled(), 1);
        assert!(d.conns[0].feeds.is_empty(), "starts afresh");
        // An old socket's end changes nothing.
        d.on_closed(1, 4, Ending::Clean, true, &mut c);
        assert_eq!((d.inner.unsettled(), d.conns[0].key), (1, Some(2)));
    }

    #[test]
    fn feeds_are_at_subjects() {
        assert_eq!(
            (feed_of("@12"), feed_of("@x"), feed_of("/p/1")),
            (12, NOT_A_FEED, NOT_A_FEED)
        );
    }
}
