//! A deterministic Barabási–Albert graph: seed 004's dataset, regenerated.
//!
//! Seed 004 made its friends file with
//! `igraph.Graph.Barabasi(1000000, 15, directed=False)`. This module grows
//! a graph of the same shape the way igraph's default (`psumtree`)
//! implementation does, so the file can be rebuilt anywhere from three
//! numbers:
//! - users are numbered `1..=users` in the order they join (igraph counts
//!   from 0; seed 004's file counts from 1);
//! - user `i` links to `min(m, i − 1)` **distinct** earlier users, each
//!   drawn with probability proportional to its degree + 1 (igraph's
//!   `power = 1`, `zero_appeal = 1`). The draws for one user are made
//!   without replacement, and degrees are updated only once the user's
//!   links are all drawn, both as igraph does; so there are no multi-edges
//!   and no self-loops;
//! - the degree is the total degree: igraph ignores `outpref` for an
//!   undirected graph and counts a user's own links too (its releases
//!   before 0.10 counted only the links a user received, which gives a
//!   heavier tail);
//! - each link is written `new old`: the newer user follows the older one,
//!   so early users become hubs with huge followings and every user
//!   follows at most `m`.
//!
//! The draws use integer weights in a Fenwick tree (a prefix-sum tree:
//! O(log n) to draw and to update) and `ChaCha8Rng`, whose stream is
//! defined by its algorithm rather than by the platform, so a seed gives
//! the same bytes on every machine. Edges are handed out as they are drawn;
//! the generator itself holds 16 bytes per user (a Fenwick tree of weights
//! and the weights).
//!
//! It must not touch a store: generating and loading are separate steps
//! joined by the edge-list file (`crate::edgelist`).

use std::io::{self, Write};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use thiserror::Error;

use crate::edgelist::write_edge;
use crate::user::{Edge, UserId};

/// The most users one graph may have: the generator holds 16 bytes per
/// user, so this bounds it to 1.6 GB.
pub const MAX_USERS: u64 = 100_000_000;

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Users, numbered `1..=users`.
    pub users: u64,
    /// Links each joining user makes (igraph's `m`).
    pub edges_per_node: u64,
    /// The random stream's seed.
    pub seed: u64,
}

/// Why a graph could not be generated.
#[derive(Debug, Error)]
pub enum GenerateError {
    #[error("{0} users is more than the generator's limit of {MAX_USERS}")]
    TooManyUsers(u64),
    #[error("writing the edge list: {0}")]
    Io(#[from] io::Error),
}

impl Params {
    /// The number of edges the graph will have: Σ min(m, i − 1) over users.
    pub fn edge_count(&self) -> u64 {
        let m = self.edges_per_node;
        let n = self.users;
        // Users 2..=m+1 link to every earlier user (1 + 2 + … + m links);
        // every later user makes m.
        let full = n.min(m.saturating_add(1));
        let ramp = full * full.saturating_sub(1) / 2;
        ramp + (n - full) * m
    }

    /// The header line written at the top of the file.
    pub fn header(&self) -> String {
        format!(
            "# myriad graph generate --users {} --edges-per-node {} --seed {} \
             (Barabási–Albert, degree + 1, {} edges)",
            self.users,
            self.edges_per_node,
            self.seed,
            self.edge_count()
        )
    }
}

/// Grows the graph, handing each edge to `emit` as it is drawn; answers
/// how many edges were emitted. Stops at the first error `emit` returns.
pub fn generate<E>(params: &Params, mut emit: impl FnMut(Edge) -> Result<(), E>) -> Result<u64, E>
where
    E: From<GenerateError>,
{
    if params.users > MAX_USERS {
        return Err(GenerateError::TooManyUsers(params.users).into());
    }
    let n = params.users as usize;
    let m = params.edges_per_node;
    let mut rng = ChaCha8Rng::seed_from_u64(params.seed);
    let mut weights = Fenwick::new(n);
    // This user's draws and their weights before the draw (a picked user
    // sits at weight 0 until the user's draws are done: no multi-edges).
    let mut picked: Vec<(usize, u64)> = Vec::with_capacity(m.min(n as u64) as usize);
    let mut emitted = 0u64;
    let user = |index: usize| UserId::new(index as u64 + 1).expect("users ≤ MAX_USERS");
    if n > 0 {
        // Any weight serves for the first user: the second links to it
        // whatever it is, and then it is set from the degree.
        weights.set(0, 1);
    }
    for i in 1..n {
        picked.clear();
        if m >= i as u64 {
            // As in igraph: too few users to choose from, so all of them.
            picked.extend((0..i).map(|to| (to, weights.get(to))));
        } else {
            for _ in 0..m {
                let to = weights.find(rng.gen_range(0..weights.total()));
                picked.push((to, weights.get(to)));
                weights.set(to, 0);
            }
        }
        for &(to, weight) in &picked {
            emit(Edge::new(user(i), user(to)))?;
            // Weight is degree + 1, and the degree just grew by one.
            weights.set(to, weight + 1);
        }
        emitted += picked.len() as u64;
        weights.set(i, picked.len() as u64 + 1);
    }
    Ok(emitted)
}

/// Writes the whole graph as an edge list (header line first) to `out`;
/// answers how many edges were written.
pub fn write(params: &Params, out: impl Write) -> Result<u64, GenerateError> {
    let mut out = io::BufWriter::with_capacity(1 << 20, out);
    writeln!(out, "{}", params.header())?;
    let edges = generate(params, |edge| {
        write_edge(&mut out, edge).map_err(GenerateError::Io)
    })?;
    out.flush()?;
    Ok(edges)
}

/// Integer weights with prefix sums (a Fenwick tree): set a weight, and
/// find the index a uniform draw below the total lands on, in O(log n).
struct Fenwick {
    /// 1-based partial sums: `tree[i]` covers `(i − lowbit(i), i]`.
    tree: Vec<u64>,
    /// The weights themselves, 0-based.
    weights: Vec<u64>,
    total: u64,
}

impl Fenwick {
    fn new(n: usize) -> Fenwick {
        Fenwick {
            tree: vec![0; n + 1],
            weights: vec![0; n],
            total: 0,
        }
    }

    fn get(&self, index: usize) -> u64 {
        self.weights[index]
    }

    fn total(&self) -> u64 {
        self.total
    }

    fn set(&mut self, index: usize, weight: u64) {
        let old = std::mem::replace(&mut self.weights[index], weight);
        // Wrapping arithmetic adds a negative delta as its two's complement.
        let delta = weight.wrapping_sub(old);
        self.total = self.total.wrapping_add(delta);
        let mut i = index + 1;
        while i < self.tree.len() {
            self.tree[i] = self.tree[i].wrapping_add(delta);
            i += i & i.wrapping_neg();
        }
    }

    /// The index whose weight covers `draw`: the smallest `i` with
    /// `weights[0..=i]` summing past `draw`. `draw` must be below the
    /// total, so the answer has a positive weight.
    fn find(&self, mut draw: u64) -> usize {
        debug_assert!(draw < self.total);
        let mut pos = 0;
        let mut step = (self.tree.len() - 1).checked_ilog2().map_or(0, |b| 1 << b);
        while step > 0 {
            let next = pos + step;
            if next < self.tree.len() && self.tree[next] <= draw {
                pos = next;
                draw -= self.tree[next];
            }
            step >>= 1;
        }
        pos
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use proptest::prelude::*;

    use super::*;

    fn edges(users: u64, edges_per_node: u64, seed: u64) -> Vec<(u64, u64)> {
        let params = Params {
            users,
            edges_per_node,
            seed,
        };
        let mut all = Vec::new();
        let count = generate(&params, |e| {
            all.push((e.follower.get(), e.followee.get()));
            Ok::<_, GenerateError>(())
        })
        .unwrap();
        assert_eq!(count, all.len() as u64);
        all
    }

    fn bytes(users: u64, edges_per_node: u64, seed: u64) -> Vec<u8> {
        let params = Params {
            users,
            edges_per_node,
            seed,
        };
        let mut out = Vec::new();
        write(&params, &mut out).unwrap();
        out
    }

    #[test]
    fn the_sum_tree_finds_the_index_a_draw_lands_on() {
        let mut tree = Fenwick::new(5);
        for (i, w) in [3, 0, 1, 4, 2].into_iter().enumerate() {
            tree.set(i, w);
        }
        assert_eq!(tree.total(), 10);
        let landed: Vec<usize> = (0..10).map(|d| tree.find(d)).collect();
        assert_eq!(landed, [0, 0, 0, 2, 3, 3, 3, 3, 4, 4]);
        tree.set(3, 0);
        tree.set(1, 2);
        let landed: Vec<usize> = (0..tree.total()).map(|d| tree.find(d)).collect();
        assert_eq!(landed, [0, 0, 0, 1, 1, 2, 4, 4]);
    }

    #[test]
    fn the_first_users_link_to_everyone_before_them() {
        let all = edges(5, 3, 1);
        let first: Vec<(u64, u64)> = all.iter().copied().filter(|e| e.0 <= 4).collect();
        assert_eq!(
            first,
            [(2, 1), (3, 1), (3, 2), (4, 1), (4, 2), (4, 3)],
            "user i links to all i − 1 earlier users while i − 1 ≤ m"
        );
        assert_eq!(all.iter().filter(|e| e.0 == 5).count(), 3);
        assert!(edges(0, 3, 1).is_empty());
        assert!(edges(1, 3, 1).is_empty());
        assert!(edges(100, 0, 1).is_empty());
    }

    #[test]
    fn a_seed_gives_the_same_bytes_and_another_seed_others() {
        let a = bytes(3_000, 4, 42);
        assert_eq!(a, bytes(3_000, 4, 42));
        assert_ne!(a, bytes(3_000, 4, 43));
        assert!(a.starts_with(b"# myriad graph generate --users 3000 --edges-per-node 4 --seed 42"));
    }

    /// The bytes for one seed are pinned: a change of the algorithm, of the
    /// random stream or of the file format shows up here (FNV-1a of the
    /// whole file).
    #[test]
    fn the_output_for_a_seed_is_pinned() {
        let fnv = bytes(2_000, 5, 7)
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
            });
        assert_eq!(fnv, PINNED_FNV, "{fnv:#x}");
    }
    const PINNED_FNV: u64 = 0xb69e_3643_bb4f_f9d3;

    #[test]
    fn the_tail_is_heavy_and_the_oldest_users_are_the_hubs() {
        let n = 20_000;
        let all = edges(n, 15, 2024);
        let mut followers: HashMap<u64, u64> = HashMap::new();
        for &(_, followee) in &all {
            *followers.entry(followee).or_default() += 1;
        }
        let mean = all.len() as f64 / n as f64;
        let (&hub, &most) = followers.iter().max_by_key(|(_, &c)| c).unwrap();
        assert!(
            most as f64 > 50.0 * mean,
            "max in-degree {most} vs mean {mean}"
        );
        assert!(hub <= 100, "the biggest hub is an early user, not {hub}");
        // Most users have a handful of followers.
        let median = {
            let mut counts: Vec<u64> = (1..=n)
                .map(|u| followers.get(&u).copied().unwrap_or(0))
                .collect();
            counts.sort_unstable();
            counts[counts.len() / 2]
        };
        assert!(median < 15, "median in-degree {median}");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        #[test]
        fn every_graph_is_simple_and_has_the_promised_size(
            users in 0u64..400,
            m in 0u64..20,
            seed in any::<u64>(),
        ) {
            let all = edges(users, m, seed);
            let expected: u64 = (1..=users).map(|i| m.min(i - 1)).sum();
            prop_assert_eq!(all.len() as u64, expected);
            prop_assert_eq!(Params { users, edges_per_node: m, seed }.edge_count(), expected);
            let mut seen = HashSet::new();
            for &(new, old) in &all {
                prop_assert!(old < new, "{} → {}: the newer user follows the older", new, old);
                prop_assert!(new <= users);
                prop_assert!(old >= 1);
                prop_assert!(seen.insert((new, old)), "duplicate {} → {}", new, old);
            }
            for i in 1..=users {
                let follows = all.iter().filter(|e| e.0 == i).count() as u64;
                prop_assert_eq!(follows, m.min(i - 1));
            }
        }
    }

    #[test]
    fn too_many_users_is_refused_before_any_work() {
        let params = Params {
            users: MAX_USERS + 1,
            edges_per_node: 1,
            seed: 0,
        };
        assert!(matches!(
            write(&params, io::sink()),
            Err(GenerateError::TooManyUsers(_))
        ));
    }
}
