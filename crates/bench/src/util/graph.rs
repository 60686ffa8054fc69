//! The follow graph as the `social` workload sees it: the edge-list file
//! the node loads, read once into an index, and the deterministic choices
//! made from it (which users connect, who sends).
//!
//! [`FollowGraph`] numbers the users appearing in the file densely (in id
//! order) and keeps, for each, whom it follows and who follows it, both
//! sorted, so "does a follow b" is a binary search and "the followers of
//! X" a slice. [`FollowGraph::draw`] picks the connected users from a seed;
//! [`Senders`] turns a number drawn for a send into its sender, uniformly or
//! by follower count.
//!
//! Pure: the caller opens the file; nothing here does I/O beyond reading
//! the `BufRead` it is handed, and the parsing is the graph crate's, the
//! same that `myriad graph load` uses.

use std::io::BufRead;

use myriad_graph::edgelist::{read_edges, EdgeListError};
use serde::{Deserialize, Serialize};

use crate::util::pattern::mix;

/// Who follows whom, over the users appearing in one edge list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowGraph {
    /// User ids, ascending: a user's position here is its number.
    ids: Vec<u64>,
    /// For user number u, `following_at[u]..following_at[u + 1]` in
    /// `following` (numbers, ascending).
    following_at: Vec<usize>,
    following: Vec<u32>,
    /// The same, for the users following u.
    followers_at: Vec<usize>,
    followers: Vec<u32>,
}

impl FollowGraph {
    /// Reads an edge-list file (the graph crate's format, its errors).
    pub fn read(input: impl BufRead) -> Result<FollowGraph, EdgeListError> {
        let edges = read_edges(input)?;
        Ok(FollowGraph::from_edges(
            edges.iter().map(|e| (e.follower.get(), e.followee.get())),
        ))
    }

    /// The graph of `(follower, followee)` pairs; a pair given twice is one
    /// edge, and the users are exactly those named.
    pub fn from_edges(edges: impl IntoIterator<Item = (u64, u64)>) -> FollowGraph {
        let mut pairs: Vec<(u64, u64)> = edges.into_iter().collect();
        pairs.sort_unstable();
        pairs.dedup();
        let mut ids: Vec<u64> = pairs.iter().flat_map(|&(a, b)| [a, b]).collect();
        ids.sort_unstable();
        ids.dedup();
        let number = |id: u64| ids.binary_search(&id).unwrap_or_default() as u32;
        let numbered: Vec<(u32, u32)> =
            pairs.iter().map(|&(a, b)| (number(a), number(b))).collect();
        let (following_at, following) = adjacency(ids.len(), numbered.iter().copied());
        let (followers_at, followers) = adjacency(ids.len(), numbered.iter().map(|&(a, b)| (b, a)));
        FollowGraph {
            ids,
            following_at,
            following,
            followers_at,
            followers,
        }
    }

    /// Users in the file.
    pub fn users(&self) -> usize {
        self.ids.len()
    }

    /// Edges in the file (each pair once).
    pub fn edges(&self) -> usize {
        self.following.len()
    }

    /// The id of user number `u`.
    pub fn id(&self, u: u32) -> u64 {
        self.ids[u as usize]
    }

    /// The number of user `id`, if the file names it.
    pub fn number(&self, id: u64) -> Option<u32> {
        self.ids.binary_search(&id).ok().map(|u| u as u32)
    }

    /// Whom user number `u` follows, ascending.
    pub fn following(&self, u: u32) -> &[u32] {
        &self.following[self.following_at[u as usize]..self.following_at[u as usize + 1]]
    }

    /// Who follows user number `u`, ascending.
    pub fn followers(&self, u: u32) -> &[u32] {
        &self.followers[self.followers_at[u as usize]..self.followers_at[u as usize + 1]]
    }

    /// Whether user `a` follows user `b` in the file (ids).
    pub fn follows(&self, a: u64, b: u64) -> bool {
        match (self.number(a), self.number(b)) {
            (Some(a), Some(b)) => self.following(a).binary_search(&b).is_ok(),
            _ => false,
        }
    }

    /// Every edge as `(follower, followee)` ids, in follower order.
    pub fn edge_ids(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        (0..self.ids.len() as u32).flat_map(move |u| {
            self.following(u)
                .iter()
                .map(move |&v| (self.id(u), self.id(v)))
        })
    }

    /// `n` distinct user numbers drawn with `seed` (all of them when `n` is
    /// at least the user count), ascending: the same for the same file,
    /// `n` and seed, in every process.
    pub fn draw(&self, n: usize, seed: u64) -> Vec<u32> {
        let mut all: Vec<u32> = (0..self.ids.len() as u32).collect();
        let n = n.min(all.len());
        // The first n steps of a Fisher-Yates shuffle.
        let mut state = mix(seed ^ 0x5EED_600D_F011_0035);
        for i in 0..n {
            state = mix(state);
            let j = i + (state % (all.len() - i) as u64) as usize;
            all.swap(i, j);
        }
        all.truncate(n);
        all.sort_unstable();
        all
    }
}

/// CSR adjacency of `n` nodes from `(from, to)` pairs: where each node's
/// list starts, and the lists (each ascending).
fn adjacency(n: usize, pairs: impl Iterator<Item = (u32, u32)> + Clone) -> (Vec<usize>, Vec<u32>) {
    let mut at = vec![0usize; n + 1];
    for (from, _) in pairs.clone() {
        at[from as usize + 1] += 1;
    }
    for i in 0..n {
        at[i + 1] += at[i];
    }
    let mut next = at.clone();
    let mut list = vec![0u32; at[n]];
    for (from, to) in pairs {
        list[next[from as usize]] = to;
        next[from as usize] += 1;
    }
    for u in 0..n {
        list[at[u]..at[u + 1]].sort_unstable();
    }
    (at, list)
}

/// How a send's sender is chosen among the connected users.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum SenderChoice {
    /// Every connected user alike.
    Uniform,
    /// In proportion to the user's followers in the file: hubs send more,
    /// and users nobody follows never send.
    Degree,
}

/// Who sends: a pure function of a send's number, so each worker process
/// fires exactly the sends of the users it holds and together they fire
/// the whole schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Senders {
    /// Connected users (slots `0..users`).
    pub users: u64,
    /// Running totals of the slots' weights; empty: uniform.
    pub cumulative: Vec<u64>,
    /// Seed of the draws.
    pub seed: u64,
}

impl Senders {
    /// Every one of `users` slots alike.
    pub fn uniform(users: u64, seed: u64) -> Senders {
        Senders {
            users,
            cumulative: Vec::new(),
            seed,
        }
    }

    /// Slot i weighing `weights[i]`; None when they are all zero.
    pub fn weighted(weights: &[u64], seed: u64) -> Option<Senders> {
        let cumulative: Vec<u64> = weights
            .iter()
            .scan(0u64, |sum, &w| {
                *sum += w;
                Some(*sum)
            })
            .collect();
        (cumulative.last().copied().unwrap_or(0) > 0).then_some(Senders {
            users: weights.len() as u64,
            cumulative,
            seed,
        })
    }

    /// The slot that sends send `n`.
    pub fn sender(&self, n: u64) -> u64 {
        let r = mix(self.seed ^ n.wrapping_mul(0xA076_1D64_78BD_642F));
        match self.cumulative.last() {
            None => r % self.users.max(1),
            Some(&total) => {
                let point = r % total;
                // The first slot whose running total passes the point.
                self.cumulative.partition_point(|&c| c <= point) as u64
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// 10 → 20, 10 → 30, 20 → 30, 30 → 10, 40 → 30, and 10 → 20 again.
    fn small() -> FollowGraph {
        FollowGraph::from_edges([(10, 20), (10, 30), (20, 30), (30, 10), (40, 30), (10, 20)])
    }

    #[test]
    fn the_index_answers_both_directions() {
        let g = small();
        assert_eq!((g.users(), g.edges()), (4, 5), "the repeated edge is one");
        assert_eq!(g.number(30), Some(2));
        assert_eq!(g.number(35), None);
        let ids = |list: &[u32]| list.iter().map(|&u| g.id(u)).collect::<Vec<_>>();
        assert_eq!(ids(g.following(0)), [20, 30]);
        assert_eq!(ids(g.followers(2)), [10, 20, 40]);
        assert_eq!(ids(g.followers(3)), Vec::<u64>::new(), "40 has none");
        assert!(g.follows(10, 30) && g.follows(30, 10));
        assert!(!g.follows(20, 10) && !g.follows(10, 99));
        let edges: Vec<_> = g.edge_ids().collect();
        assert_eq!(edges, [(10, 20), (10, 30), (20, 30), (30, 10), (40, 30)]);
    }

    #[test]
    fn the_file_format_is_the_graph_crates() {
        let g = FollowGraph::read(&b"# two\n1 2\n2\t1\n"[..]).unwrap();
        assert_eq!((g.users(), g.edges()), (2, 2));
        let bad = FollowGraph::read(&b"1 2\n3 3\n"[..]).unwrap_err();
        assert_eq!(bad.to_string(), "line 2: user 3 follows itself");
    }

    #[test]
    fn draws_repeat_and_differ_by_seed() {
        let g = FollowGraph::from_edges((0..100).map(|i| (i, (i + 1) % 100)));
        let a = g.draw(10, 7);
        assert_eq!(a, g.draw(10, 7));
        assert_ne!(a, g.draw(10, 8));
        assert_eq!(a.len(), 10);
        assert!(a.windows(2).all(|w| w[0] < w[1]), "ascending, distinct");
        assert_eq!(g.draw(500, 7), (0..100).collect::<Vec<u32>>(), "all");
    }

    #[test]
    fn weighted_senders_follow_the_weights() {
        // Slot 1 never sends; slot 2 sends three times as often as slot 0.
        let s = Senders::weighted(&[1, 0, 3], 5).unwrap();
        let mut counts = [0u32; 3];
        for n in 0..40_000 {
            counts[s.sender(n) as usize] += 1;
        }
        assert_eq!(counts[1], 0);
        let ratio = f64::from(counts[2]) / f64::from(counts[0]);
        assert!((2.8..3.2).contains(&ratio), "{counts:?}");
        assert_eq!(Senders::weighted(&[0, 0], 5), None);
        let u = Senders::uniform(4, 5);
        let mut seen = [false; 4];
        for n in 0..100 {
            seen[u.sender(n) as usize] = true;
        }
        assert_eq!(seen, [true; 4]);
    }

    proptest! {
        /// The index holds exactly the edges given, both ways round.
        #[test]
        fn the_index_is_the_edge_set(pairs in proptest::collection::vec((0u64..30, 0u64..30), 0..120)) {
            let pairs: Vec<(u64, u64)> = pairs.into_iter().filter(|(a, b)| a != b).collect();
            let g = FollowGraph::from_edges(pairs.clone());
            let mut set: Vec<(u64, u64)> = pairs.clone();
            set.sort_unstable();
            set.dedup();
            prop_assert_eq!(g.edge_ids().collect::<Vec<_>>(), set.clone());
            for a in 0..30 {
                for b in 0..30 {
                    prop_assert_eq!(g.follows(a, b), set.binary_search(&(a, b)).is_ok());
                }
            }
            let followers: usize = (0..g.users() as u32).map(|u| g.followers(u).len()).sum();
            prop_assert_eq!(followers, set.len());
        }
    }
}
