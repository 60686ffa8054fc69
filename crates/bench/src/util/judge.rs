//! The `social` workload's verdict: for every send and every connection,
//! whether the connection had to receive it, and whether it did.
//!
//! The bench knows the graph, so it knows who must receive each send:
//! every connection of a user following the sender when the send was made,
//! and the sender's own connections, each exactly once. Follows and
//! unfollows made during the run ([`EdgeChange`]) move that line. A send
//! is an interval too, from just before its frame was queued to the read
//! of its `ok` ([`SendRecord`]); an edge change runs from just before its
//! request was written to the read of its answer. For one (send,
//! connection) pair, the edge from the connection's user to the sender:
//! - a change acknowledged before the send left decides the pair: the new
//!   state holds (the node promises that a follow acknowledged before a
//!   send reaches the follower in that send, and that an unfollow
//!   acknowledged stops later sends);
//! - a change requested after the send was acknowledged does not touch it:
//!   the send was fanned out under the old state;
//! - a change whose interval overlaps the send's may go either way: the
//!   pair is counted as in flight and not judged (delivering it twice is
//!   still a duplicate).
//!
//! Every pair judged "must" and not received is lost; judged "must not" and
//! received is unexpected; every offset received a second time is a
//! duplicate, and every offset received that no send got (another epoch, a
//! publication the bench did not make) is unexpected. The times are wall
//! clock nanoseconds taken in different processes of one host, and each
//! bound is taken on the safe side (before a write, after a read), so an
//! overlap is never missed.
//!
//! Pure: no I/O, no clock; tested with hand-made graphs and timelines, and
//! against a model server that applies each change and fans out each send
//! at one instant inside their intervals.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::util::graph::FollowGraph;
use crate::util::offsets::Received;

/// One answered send, as its sender's worker saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendRecord {
    /// The sending user: the send is a publication of its feed `@user`.
    pub user: u64,
    /// The feed's epoch in the `ok`.
    pub epoch: u64,
    /// The feed offset the `ok` gave the send.
    pub offset: u64,
    /// Wall clock just before the send's frame was queued, ns.
    pub sent_ns: u64,
    /// Wall clock when its `ok` was read, ns.
    pub acked_ns: u64,
}

/// What one connection received of one feed in one epoch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedReceipt {
    /// The feed's user (`@feed`).
    pub feed: u64,
    /// The epoch of the deliveries.
    pub epoch: u64,
    /// Their offsets.
    pub received: Received,
}

/// A follow or unfollow made through the admin API during the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeChange {
    /// Who follows (or stops following).
    pub follower: u64,
    /// Whom.
    pub followee: u64,
    /// A follow (true) or an unfollow.
    pub follow: bool,
    /// Wall clock just before its request was written, ns.
    pub requested_ns: u64,
    /// Wall clock when its answer was read; None when it never was (the
    /// request failed), which leaves the edge in flight from then on.
    pub acked_ns: Option<u64>,
}

/// What a connection owed one send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Exactly one delivery.
    Must,
    /// None.
    MustNot,
    /// Either: the edge changed while the send was in flight.
    InFlight,
}

/// The verdict over every (send, connection) pair of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// Pairs that had to deliver.
    pub expected: u64,
    /// Of those, delivered.
    pub delivered: u64,
    /// Of those, never delivered.
    pub lost: u64,
    /// Deliveries of an offset the connection had already received.
    pub duplicated: u64,
    /// Deliveries that should not have come: a send the connection's user
    /// did not follow, or an offset no send got.
    pub unexpected: u64,
    /// Pairs whose edge changed while the send was in flight: not judged.
    pub in_flight: u64,
    /// Of those, delivered.
    pub in_flight_delivered: u64,
    /// Sends answered with a position another send also got.
    pub clashes: u64,
}

impl Tally {
    /// What went wrong, one phrase each; empty when every pair judged got
    /// what it was owed.
    pub fn problems(&self) -> Vec<String> {
        [
            (self.lost, "deliveries lost"),
            (self.duplicated, "duplicated"),
            (self.unexpected, "unexpected"),
            (self.clashes, "sends given another send's offset"),
        ]
        .into_iter()
        .filter(|&(n, _)| n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect()
    }
}

/// One (follower, followee) pair over the run, as a send needs it.
struct Edge<'a> {
    /// The follower is the followee: its own feed, always owed.
    own: bool,
    /// Whether the graph file has the edge.
    at_start: bool,
    /// Its changes, in request order, none overlapping another.
    changes: &'a [EdgeChange],
}

impl Edge<'_> {
    /// What a connection of the follower owed send `s` of the followee.
    fn expect(&self, s: &SendRecord) -> Expect {
        if self.own {
            return Expect::Must;
        }
        let mut follows = self.at_start;
        for c in self.changes {
            let acked = c.acked_ns.unwrap_or(u64::MAX);
            if c.requested_ns <= s.acked_ns && acked >= s.sent_ns {
                return Expect::InFlight;
            }
            if acked < s.sent_ns {
                follows = c.follow;
            }
        }
        if follows {
            Expect::Must
        } else {
            Expect::MustNot
        }
    }
}

/// Judges connections one by one against the graph, the sends and the
/// edge changes of a run.
pub struct Judge<'g> {
    graph: &'g FollowGraph,
    /// Each sender's sends, by (epoch, offset).
    sends: HashMap<u64, Vec<SendRecord>>,
    /// Each changed edge's changes, in request order. Changes of one edge
    /// must not overlap one another (the bench makes one request at a time).
    changes: HashMap<(u64, u64), Vec<EdgeChange>>,
    /// Followees each follower's changes touched.
    changed: HashMap<u64, Vec<u64>>,
    /// The verdict so far.
    pub tally: Tally,
}

impl<'g> Judge<'g> {
    /// A judge of `sends` under `graph` and the run's `changes`.
    pub fn new(graph: &'g FollowGraph, sends: &[SendRecord], changes: &[EdgeChange]) -> Judge<'g> {
        let mut tally = Tally::default();
        let mut by_user: HashMap<u64, Vec<SendRecord>> = HashMap::new();
        for s in sends {
            by_user.entry(s.user).or_default().push(*s);
        }
        for list in by_user.values_mut() {
            list.sort_unstable_by_key(|s| (s.epoch, s.offset));
            let before = list.len();
            list.dedup_by_key(|s| (s.epoch, s.offset));
            tally.clashes += (before - list.len()) as u64;
        }
        let mut by_edge: HashMap<(u64, u64), Vec<EdgeChange>> = HashMap::new();
        let mut changed: HashMap<u64, Vec<u64>> = HashMap::new();
        for c in changes {
            let list = by_edge.entry((c.follower, c.followee)).or_default();
            if list.is_empty() {
                changed.entry(c.follower).or_default().push(c.followee);
            }
            list.push(*c);
        }
        for list in by_edge.values_mut() {
            list.sort_by_key(|c| c.requested_ns);
        }
        Judge {
            graph,
            sends: by_user,
            changes: by_edge,
            changed,
            tally,
        }
    }

    /// What a connection of `user` owed send `s`.
    pub fn expect(&self, user: u64, s: &SendRecord) -> Expect {
        self.edge(user, s.user).expect(s)
    }

    /// The edge from `user` to `feed`'s user over the run.
    fn edge(&self, user: u64, feed: u64) -> Edge<'_> {
        Edge {
            own: user == feed,
            at_start: self.graph.follows(user, feed),
            changes: self
                .changes
                .get(&(user, feed))
                .map_or(&[][..], Vec::as_slice),
        }
    }

    /// Judges one connection of `user` that received `feeds`: against every
    /// send of its own feed, of every user it followed at the start, of
    /// every edge of its user that changed, and of every feed it received.
    pub fn connection(&mut self, user: u64, feeds: &[FeedReceipt]) {
        let mut relevant: Vec<u64> = vec![user];
        if let Some(u) = self.graph.number(user) {
            relevant.extend(self.graph.following(u).iter().map(|&v| self.graph.id(v)));
        }
        relevant.extend(self.changed.get(&user).into_iter().flatten().copied());
        relevant.extend(feeds.iter().map(|f| f.feed));
        relevant.sort_unstable();
        relevant.dedup();
        for feed in relevant {
            self.feed(user, feed, feeds);
        }
    }

    /// Judges what a connection of `user` received of `feed`.
    fn feed(&mut self, user: u64, feed: u64, feeds: &[FeedReceipt]) {
        let receipts: Vec<&FeedReceipt> = feeds.iter().filter(|f| f.feed == feed).collect();
        let edge = self.edge(user, feed);
        let mut t = self.tally;
        let mut matched = 0;
        for s in self.sends.get(&feed).map_or(&[][..], Vec::as_slice) {
            let got = receipts
                .iter()
                .any(|r| r.epoch == s.epoch && r.received.contains(s.offset));
            matched += u64::from(got);
            match edge.expect(s) {
                Expect::Must if got => {
                    (t.expected, t.delivered) = (t.expected + 1, t.delivered + 1)
                }
                Expect::Must => (t.expected, t.lost) = (t.expected + 1, t.lost + 1),
                Expect::MustNot => t.unexpected += u64::from(got),
                Expect::InFlight => {
                    t.in_flight += 1;
                    t.in_flight_delivered += u64::from(got);
                }
            }
        }
        let received: u64 = receipts.iter().map(|r| r.received.len()).sum();
        t.unexpected += received - matched;
        t.duplicated += receipts.iter().map(|r| r.received.again).sum::<u64>();
        self.tally = t;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const E: u64 = 0xab;

    fn send(user: u64, offset: u64, sent_ns: u64, acked_ns: u64) -> SendRecord {
        SendRecord {
            user,
            epoch: E,
            offset,
            sent_ns,
            acked_ns,
        }
    }

    fn change(follower: u64, followee: u64, follow: bool, req: u64, ack: u64) -> EdgeChange {
        EdgeChange {
            follower,
            followee,
            follow,
            requested_ns: req,
            acked_ns: Some(ack),
        }
    }

    fn receipt(feed: u64, offsets: &[u64]) -> FeedReceipt {
        let mut received = Received::default();
        for &o in offsets {
            received.insert(o);
        }
        FeedReceipt {
            feed,
            epoch: E,
            received,
        }
    }

    /// 1 → 2, 3 → 2, 2 → 1 (1 follows 2, and so on).
    fn graph() -> FollowGraph {
        FollowGraph::from_edges([(1, 2), (3, 2), (2, 1)])
    }

    #[test]
    fn a_static_graph_owes_followers_and_the_sender() {
        let g = graph();
        let sends = [send(2, 1, 10, 20), send(2, 2, 30, 40), send(1, 1, 50, 60)];
        let mut j = Judge::new(&g, &sends, &[]);
        // User 1 follows 2: both of 2's sends, and its own.
        j.connection(1, &[receipt(2, &[1, 2]), receipt(1, &[1])]);
        // User 2 got its own sends, and 1's (it follows 1).
        j.connection(2, &[receipt(2, &[1, 2]), receipt(1, &[1])]);
        // User 3 follows 2 only.
        j.connection(3, &[receipt(2, &[1, 2])]);
        let t = j.tally;
        assert_eq!((t.expected, t.delivered), (3 + 3 + 2, 8));
        assert_eq!(
            (t.lost, t.duplicated, t.unexpected, t.in_flight),
            (0, 0, 0, 0)
        );
        assert!(t.problems().is_empty());
    }

    #[test]
    fn losses_repeats_strays_and_unknown_offsets_are_counted() {
        let g = graph();
        let sends = [send(2, 1, 10, 20), send(2, 2, 30, 40), send(1, 1, 50, 60)];
        let mut j = Judge::new(&g, &sends, &[]);
        // User 3 lost offset 2 of @2, got offset 1 twice, and got @1's
        // send although it does not follow 1.
        let mut twice = receipt(2, &[1]);
        twice.received.insert(1);
        j.connection(3, &[twice, receipt(1, &[1])]);
        // User 1 got an offset of @2 nobody sent, and @2 in another epoch.
        let mut other_epoch = receipt(2, &[2]);
        other_epoch.epoch = E + 1;
        j.connection(1, &[receipt(2, &[1, 2, 3]), other_epoch, receipt(1, &[1])]);
        let t = j.tally;
        assert_eq!((t.expected, t.delivered, t.lost), (5, 4, 1));
        assert_eq!((t.duplicated, t.unexpected), (1, 1 + 2));
        assert_eq!(
            t.problems(),
            ["1 deliveries lost", "1 duplicated", "3 unexpected"]
        );
    }

    #[test]
    fn a_change_decides_the_sends_after_its_answer_and_not_those_before_its_request() {
        let g = graph();
        // 3 follows 1 over [100, 200]; 1 → 2 is unfollowed over [300, 400].
        let changes = [change(3, 1, true, 100, 200), change(1, 2, false, 300, 400)];
        let j = Judge::new(&g, &[], &changes);
        let at = |sent, acked| send(1, 1, sent, acked);
        assert_eq!(j.expect(3, &at(10, 99)), Expect::MustNot, "answered before");
        assert_eq!(
            j.expect(3, &at(10, 100)),
            Expect::InFlight,
            "touches the request"
        );
        assert_eq!(j.expect(3, &at(150, 160)), Expect::InFlight, "inside");
        assert_eq!(
            j.expect(3, &at(190, 500)),
            Expect::InFlight,
            "overlaps the answer"
        );
        assert_eq!(
            j.expect(3, &at(200, 210)),
            Expect::InFlight,
            "left as it came"
        );
        assert_eq!(j.expect(3, &at(201, 210)), Expect::Must, "after the answer");
        let of2 = |sent, acked| send(2, 1, sent, acked);
        assert_eq!(j.expect(1, &of2(250, 299)), Expect::Must);
        assert_eq!(j.expect(1, &of2(250, 301)), Expect::InFlight);
        assert_eq!(j.expect(1, &of2(401, 402)), Expect::MustNot);
        assert_eq!(
            j.expect(3, &of2(401, 402)),
            Expect::Must,
            "other edges stay"
        );
        assert_eq!(j.expect(1, &send(1, 1, 150, 160)), Expect::Must, "own feed");
        let unanswered = EdgeChange {
            acked_ns: None,
            ..change(3, 1, false, 300, 0)
        };
        let j = Judge::new(&g, &[], &[changes[0], unanswered]);
        assert_eq!(j.expect(3, &at(250, 260)), Expect::Must);
        assert_eq!(
            j.expect(3, &at(10_000, 10_001)),
            Expect::InFlight,
            "forever"
        );
    }

    #[test]
    fn in_flight_pairs_are_counted_not_judged_and_a_followed_feed_is_owed() {
        let g = graph();
        // 3 follows 1 over [100, 200]; 1 sends during and after.
        let sends = [
            send(1, 1, 150, 160),
            send(1, 2, 300, 310),
            send(1, 3, 400, 410),
        ];
        let changes = [change(3, 1, true, 100, 200)];
        let mut j = Judge::new(&g, &sends, &changes);
        j.connection(3, &[receipt(1, &[2])]);
        let t = j.tally;
        assert_eq!((t.in_flight, t.in_flight_delivered), (1, 0));
        assert_eq!(
            (t.expected, t.delivered, t.lost),
            (2, 1, 1),
            "offset 3 lost"
        );
        let mut j = Judge::new(&g, &sends, &changes);
        j.connection(3, &[receipt(1, &[1, 2, 3])]);
        assert_eq!((j.tally.in_flight_delivered, j.tally.lost), (1, 0));
    }

    #[test]
    fn two_sends_with_one_offset_clash() {
        let g = graph();
        let j = Judge::new(&g, &[send(1, 5, 1, 2), send(1, 5, 3, 4)], &[]);
        assert_eq!(j.tally.clashes, 1);
    }

    /// A model run: users 0..U with one connection each, a graph (a ring,
    /// so every user is in it, plus random edges), edge changes one after
    /// another, and sends with random intervals.
    #[derive(Debug, Clone)]
    struct Run {
        users: u64,
        edges: Vec<(u64, u64)>,
        /// (follower, followee, requested, acknowledged, applied at).
        changes: Vec<(u64, u64, u64, u64, u64)>,
        /// (sender, sent, acknowledged, fanned out at).
        sends: Vec<(u64, u64, u64, u64)>,
    }

    fn run() -> impl Strategy<Value = Run> {
        (2u64..7).prop_flat_map(|users| {
            let pair = (0..users, 0..users).prop_filter("no self-follow", |(a, b)| a != b);
            let edges = proptest::collection::vec(pair.clone(), 0..12);
            // Changes back to back (gap, length), each applied at some
            // instant inside its interval.
            let changes = proptest::collection::vec((pair, 0u64..50, 1u64..50, 0u64..1000), 0..10);
            let sends =
                proptest::collection::vec((0..users, 0u64..600, 1u64..60, 0u64..1000), 0..25);
            (Just(users), edges, changes, sends).prop_map(|(users, edges, changes, sends)| {
                let mut t = 0;
                let changes = changes
                    .into_iter()
                    .map(|((a, b), gap, len, at)| {
                        let req = t + gap;
                        t = req + len;
                        (a, b, req, t, req + at % (len + 1))
                    })
                    .collect();
                let sends = sends
                    .into_iter()
                    .map(|(u, sent, len, at)| (u, sent, sent + len, sent + at % (len + 1)))
                    .collect();
                Run {
                    users,
                    edges,
                    changes,
                    sends,
                }
            })
        })
    }

    /// The run on a correct node.
    struct Observed {
        graph: FollowGraph,
        /// The changes as the bench logs them (each toggles its edge).
        changes: Vec<EdgeChange>,
        sends: Vec<SendRecord>,
        /// (user, send index) of every delivery.
        deliveries: Vec<(u64, usize)>,
    }

    /// A correct node: each change toggles its edge at its applied instant,
    /// and each send, fanned out at its instant, reaches whoever follows
    /// the sender then, and the sender; a feed's offsets follow the
    /// fan-out order.
    fn correct_node(r: &Run) -> Observed {
        let ring = (0..r.users).map(|u| (u, (u + 1) % r.users));
        let graph = FollowGraph::from_edges(r.edges.iter().copied().chain(ring));
        let mut now: std::collections::BTreeSet<(u64, u64)> = graph.edge_ids().collect();
        let changes: Vec<EdgeChange> = r
            .changes
            .iter()
            .map(|&(a, b, req, ack, _)| {
                let follow = now.insert((a, b)) || !now.remove(&(a, b));
                change(a, b, follow, req, ack)
            })
            .collect();
        let follows_at = |a: u64, b: u64, t: u64| {
            let mut f = graph.follows(a, b);
            for (c, &(.., at)) in changes.iter().zip(&r.changes) {
                if (c.follower, c.followee) == (a, b) && at <= t {
                    f = c.follow;
                }
            }
            f
        };
        let mut order: Vec<usize> = (0..r.sends.len()).collect();
        order.sort_by_key(|&i| (r.sends[i].3, i));
        let mut next = vec![1u64; r.users as usize];
        let mut sends = vec![send(0, 0, 0, 0); r.sends.len()];
        let mut deliveries = Vec::new();
        for i in order {
            let (sender, sent, acked, at) = r.sends[i];
            sends[i] = send(sender, next[sender as usize], sent, acked);
            next[sender as usize] += 1;
            for u in 0..r.users {
                if u == sender || follows_at(u, sender, at) {
                    deliveries.push((u, i));
                }
            }
        }
        Observed {
            graph,
            changes,
            sends,
            deliveries,
        }
    }

    /// Each user's receipts of `deliveries`.
    fn receipts(o: &Observed, users: u64, deliveries: &[(u64, usize)]) -> Vec<Vec<FeedReceipt>> {
        let mut out: Vec<Vec<FeedReceipt>> = vec![Vec::new(); users as usize];
        for &(u, i) in deliveries {
            let s = o.sends[i];
            let feeds = &mut out[u as usize];
            let at = match feeds.iter().position(|f| f.feed == s.user) {
                Some(at) => at,
                None => {
                    feeds.push(receipt(s.user, &[]));
                    feeds.len() - 1
                }
            };
            feeds[at].received.insert(s.offset);
        }
        out
    }

    fn judge(o: &Observed, users: u64, deliveries: &[(u64, usize)]) -> Tally {
        let mut j = Judge::new(&o.graph, &o.sends, &o.changes);
        for (u, feeds) in receipts(o, users, deliveries).iter().enumerate() {
            j.connection(u as u64, feeds);
        }
        j.tally
    }

    proptest! {
        /// A correct node passes: nothing lost, repeated or unexpected, and
        /// every delivery is either owed or in flight.
        #[test]
        fn a_correct_node_passes(r in run()) {
            let o = correct_node(&r);
            let t = judge(&o, r.users, &o.deliveries);
            prop_assert_eq!((t.lost, t.duplicated, t.unexpected, t.clashes), (0, 0, 0, 0));
            prop_assert_eq!(t.delivered, t.expected);
            prop_assert_eq!(t.delivered + t.in_flight_delivered, o.deliveries.len() as u64);
        }

        /// A node that drops, repeats and strays is caught exactly, where
        /// the edge never changed (so the pair is certainly judged).
        #[test]
        fn every_fault_on_a_judged_pair_is_counted(
            r in run(),
            faults in proptest::collection::vec((0u8..3, any::<prop::sample::Index>()), 0..8),
        ) {
            let o = correct_node(&r);
            let steady = |u: u64, sender: u64| {
                u == sender || !o.changes.iter().any(|c| (c.follower, c.followee) == (u, sender))
            };
            let mut deliveries = o.deliveries.clone();
            let (mut dropped, mut repeated, mut strays) = (0, 0, 0);
            for (kind, pick) in faults {
                match kind {
                    0 => {
                        // One the node owed, not repeated since.
                        let judged: Vec<usize> = (0..deliveries.len())
                            .filter(|&k| {
                                let d = deliveries[k];
                                steady(d.0, o.sends[d.1].user)
                                    && o.deliveries.contains(&d)
                                    && deliveries.iter().filter(|&&x| x == d).count() == 1
                            })
                            .collect();
                        if !judged.is_empty() {
                            deliveries.remove(judged[pick.index(judged.len())]);
                            dropped += 1;
                        }
                    }
                    1 if !deliveries.is_empty() => {
                        let d = deliveries[pick.index(deliveries.len())];
                        if deliveries.iter().filter(|&&x| x == d).count() == 1 {
                            deliveries.push(d);
                            repeated += 1;
                        }
                    }
                    2 => {
                        // A send to a user who never followed its sender.
                        let strangers: Vec<(u64, usize)> = (0..r.users)
                            .flat_map(|u| (0..o.sends.len()).map(move |i| (u, i)))
                            .filter(|&(u, i)| {
                                let sender = o.sends[i].user;
                                steady(u, sender) && u != sender && !o.graph.follows(u, sender)
                                    && !deliveries.contains(&(u, i))
                            })
                            .collect();
                        if !strangers.is_empty() {
                            deliveries.push(strangers[pick.index(strangers.len())]);
                            strays += 1;
                        }
                    }
                    _ => {}
                }
            }
            let t = judge(&o, r.users, &deliveries);
            prop_assert_eq!((t.lost, t.duplicated, t.unexpected), (dropped, repeated, strays));
        }
    }
}
