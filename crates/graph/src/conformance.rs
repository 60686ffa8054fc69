//! The Store conformance suite: the contract of [`crate::store`], clause
//! by clause, as tests any store runs unchanged.
//!
//! A store's test module calls [`conformance_suite!`](crate::conformance_suite)
//! with an expression that makes an empty store; the macro expands to one
//! `#[test]` per clause plus a property test against a model.

use std::collections::BTreeSet;

use proptest::prelude::*;

use crate::announce::Snapshot;
use crate::store::{Counts, Store, StoreError, StoreOptions, Totals};
use crate::user::{Edge, UserId};

/// Options every store under test is opened with: a small following limit,
/// so clause 3 can be reached.
pub const OPTIONS: StoreOptions = StoreOptions {
    max_following: 20,
    cache_bytes: 1 << 20,
};

/// Expands to the whole suite for the store made by `$make`.
#[macro_export]
macro_rules! conformance_suite {
    ($name:ident, $make:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::conformance as c;

            #[test]
            fn an_empty_store_knows_nobody() {
                c::an_empty_store_knows_nobody(&mut $make);
            }
            #[test]
            fn following_makes_both_ends_known_and_is_idempotent() {
                c::following_makes_both_ends_known_and_is_idempotent(&mut $make);
            }
            #[test]
            fn unfollowing_removes_the_edge_and_keeps_the_users() {
                c::unfollowing_removes_the_edge_and_keeps_the_users(&mut $make);
            }
            #[test]
            fn a_self_follow_refuses_the_whole_batch() {
                c::a_self_follow_refuses_the_whole_batch(&mut $make);
            }
            #[test]
            fn the_following_limit_refuses_the_whole_batch() {
                c::the_following_limit_refuses_the_whole_batch(&mut $make);
            }
            #[test]
            fn reads_page_in_ascending_id_order() {
                c::reads_page_in_ascending_id_order(&mut $make);
            }
            #[test]
            fn added_users_are_known_without_edges() {
                c::added_users_are_known_without_edges(&mut $make);
            }
            #[test]
            fn a_load_is_one_atomic_batch() {
                c::a_load_is_one_atomic_batch(&mut $make);
            }
            #[test]
            fn whole_lists_read_alone_or_together_agree() {
                c::whole_lists_read_alone_or_together_agree(&mut $make);
            }
            #[test]
            fn follows_and_unfollows_agree_with_a_model() {
                c::follows_and_unfollows_agree_with_a_model(|| $make);
            }
        }
    };
}

fn user(id: u64) -> UserId {
    UserId::new(id).unwrap()
}

fn edge(follower: u64, followee: u64) -> Edge {
    Edge::new(user(follower), user(followee))
}

fn all_followers(store: &mut dyn Store, of: u64) -> Vec<u64> {
    read_all(|after| store.followers(user(of), after, 7))
}

fn all_following(store: &mut dyn Store, of: u64) -> Vec<u64> {
    read_all(|after| store.following(user(of), after, 7))
}

/// Reads every page of a paged read, checking each page's order and size.
fn read_all(mut page: impl FnMut(Option<UserId>) -> Result<Vec<UserId>, StoreError>) -> Vec<u64> {
    let mut all: Vec<u64> = Vec::new();
    let mut after = None;
    loop {
        let got = page(after).unwrap();
        assert!(got.len() <= 7, "a page is at most its limit");
        assert!(
            got.windows(2).all(|w| w[0] < w[1]),
            "a page is ascending: {got:?}"
        );
        if let (Some(last), Some(first)) = (all.last(), got.first()) {
            assert!(*last < first.get(), "pages continue after `after`");
        }
        all.extend(got.iter().map(|u| u.get()));
        match got.last() {
            Some(&last) if got.len() == 7 => after = Some(last),
            _ => return all,
        }
    }
}

pub fn an_empty_store_knows_nobody(store: &mut dyn Store) {
    assert_eq!(store.totals().unwrap(), Totals::default());
    assert!(!store.contains(user(1)).unwrap());
    assert!(store.followers(user(1), None, 10).unwrap().is_empty());
    assert!(store.following(user(1), None, 10).unwrap().is_empty());
    assert_eq!(store.counts(user(1)).unwrap(), Counts::default());
    assert!(store.users(None, 10).unwrap().is_empty());
}

pub fn following_makes_both_ends_known_and_is_idempotent(store: &mut dyn Store) {
    assert_eq!(store.follow(&[edge(1, 2), edge(3, 2)]).unwrap(), 2);
    assert_eq!(store.follow(&[edge(1, 2), edge(1, 3)]).unwrap(), 1);
    assert_eq!(store.follow(&[edge(1, 2), edge(1, 2)]).unwrap(), 0);
    for id in [1, 2, 3] {
        assert!(store.contains(user(id)).unwrap(), "user {id}");
    }
    assert!(!store.contains(user(4)).unwrap());
    assert_eq!(all_followers(store, 2), vec![1, 3]);
    assert_eq!(all_following(store, 1), vec![2, 3]);
    assert_eq!(
        store.counts(user(1)).unwrap(),
        Counts {
            followers: 0,
            following: 2
        }
    );
    assert_eq!(store.totals().unwrap(), Totals { users: 3, edges: 3 });
}

pub fn unfollowing_removes_the_edge_and_keeps_the_users(store: &mut dyn Store) {
    store.follow(&[edge(1, 2), edge(3, 2)]).unwrap();
    assert_eq!(store.unfollow(&[edge(1, 2), edge(2, 1)]).unwrap(), 1);
    assert_eq!(store.unfollow(&[edge(1, 2)]).unwrap(), 0);
    assert_eq!(all_followers(store, 2), vec![3]);
    assert!(all_following(store, 1).is_empty());
    assert!(store.contains(user(1)).unwrap());
    assert_eq!(store.totals().unwrap(), Totals { users: 3, edges: 1 });
}

pub fn a_self_follow_refuses_the_whole_batch(store: &mut dyn Store) {
    let refused = store.follow(&[edge(1, 2), edge(5, 5), edge(3, 4)]);
    assert!(
        matches!(refused, Err(StoreError::SelfFollow { index: 1, user }) if user.get() == 5),
        "{refused:?}"
    );
    assert_eq!(store.totals().unwrap(), Totals::default());
    assert!(!store.contains(user(1)).unwrap());
}

pub fn the_following_limit_refuses_the_whole_batch(store: &mut dyn Store) {
    let limit = OPTIONS.max_following;
    let up_to_limit: Vec<Edge> = (0..limit).map(|i| edge(1_000, i)).collect();
    assert_eq!(store.follow(&up_to_limit).unwrap(), limit);
    let refused = store.follow(&[edge(5_000, 5_001), edge(1_000, limit)]);
    assert!(
        matches!(refused, Err(StoreError::FollowingLimit { user, limit: l }) if user.get() == 1_000 && l == limit),
        "{refused:?}"
    );
    assert!(
        !store.contains(user(5_000)).unwrap(),
        "nothing of the batch"
    );
    assert_eq!(store.counts(user(1_000)).unwrap().following, limit);
    // Following again what is already followed does not count twice.
    assert_eq!(store.follow(&up_to_limit).unwrap(), 0);
    // Room made by an unfollow can be used.
    store.unfollow(&[edge(1_000, 0)]).unwrap();
    assert_eq!(store.follow(&[edge(1_000, limit)]).unwrap(), 1);
}

pub fn reads_page_in_ascending_id_order(store: &mut dyn Store) {
    // Inserted in a scrambled order, so order cannot come from insertion.
    let followers: Vec<u64> = (1..=50).map(|i| (i * 37) % 101 + 200).collect();
    let edges: Vec<Edge> = followers.iter().map(|&f| edge(f, 9)).collect();
    store.follow(&edges).unwrap();
    let mut expected = followers.clone();
    expected.sort_unstable();
    assert_eq!(all_followers(store, 9), expected);
    let mut users = expected.clone();
    users.push(9);
    users.sort_unstable();
    assert_eq!(read_all(|after| store.users(after, 7)), users);
    let hub: Vec<Edge> = (0..15).map(|i| edge(9, 1_000 - i * 3)).collect();
    store.follow(&hub).unwrap();
    let mut expected: Vec<u64> = (0..15).map(|i| 1_000 - i * 3).collect();
    expected.sort_unstable();
    assert_eq!(all_following(store, 9), expected);
    assert_eq!(
        store
            .followers(user(9), Some(user(expected[0])), 0)
            .unwrap(),
        vec![],
        "a zero limit reads nothing"
    );
}

pub fn whole_lists_read_alone_or_together_agree(store: &mut dyn Store) {
    store
        .follow(&[edge(1, 4), edge(1, 2), edge(1, 3), edge(5, 6)])
        .unwrap();
    store.add_users(&[user(7)]).unwrap();
    let ids = |s: &Snapshot| s.users.iter().map(|u| u.get()).collect::<Vec<_>>();
    let alone = store.following_all(user(1), 100).unwrap();
    assert_eq!(ids(&alone), vec![2, 3, 4]);
    assert_eq!(ids(&store.following_all(user(1), 2).unwrap()), vec![2, 3]);
    // A user twice, one without edges, one unknown: each in its place.
    let asked = [user(1), user(7), user(5), user(1), user(8)];
    let together = store.following_each(&asked, 100).unwrap();
    let lists: Vec<Vec<u64>> = together.iter().map(ids).collect();
    assert_eq!(
        lists,
        vec![vec![2, 3, 4], vec![], vec![6], vec![2, 3, 4], vec![]]
    );
    let last = store.last_change().unwrap();
    assert_eq!(alone.change, last);
    assert!(
        together.iter().all(|s| s.change == last),
        "clause 6: {together:?}"
    );
    let limited = store.following_each(&[user(1), user(5)], 1).unwrap();
    assert_eq!(
        limited.iter().map(ids).collect::<Vec<_>>(),
        vec![vec![2], vec![6]]
    );
    assert_eq!(store.following_each(&[], 100).unwrap(), vec![]);
}

pub fn added_users_are_known_without_edges(store: &mut dyn Store) {
    assert_eq!(store.add_users(&[user(4), user(5), user(4)]).unwrap(), 2);
    assert_eq!(store.add_users(&[user(5)]).unwrap(), 0);
    assert!(store.contains(user(4)).unwrap());
    assert_eq!(store.totals().unwrap(), Totals { users: 2, edges: 0 });
}

pub fn a_load_is_one_atomic_batch(store: &mut dyn Store) {
    let refused = store.load(vec![user(40)], vec![edge(1, 2), edge(3, 3)]);
    assert!(matches!(
        refused,
        Err(StoreError::SelfFollow { index: 1, .. })
    ));
    assert_eq!(store.totals().unwrap(), Totals::default());
    let edges = vec![edge(1, 2), edge(3, 2), edge(1, 2)];
    assert_eq!(store.load(vec![user(40)], edges).unwrap(), 2);
    // A load refused inside the store (over the following limit, on top of
    // what it holds) leaves nothing of itself either: not its users, not
    // its edges that were within the limit.
    let before = store.totals().unwrap();
    let over: Vec<Edge> = (0..=OPTIONS.max_following)
        .map(|i| edge(1, 1_000 + i))
        .chain([edge(41, 2)])
        .collect();
    let refused = store.load(vec![user(42)], over);
    assert!(
        matches!(refused, Err(StoreError::FollowingLimit { user, .. }) if user.get() == 1),
        "{refused:?}"
    );
    assert_eq!(store.totals().unwrap(), before);
    for absent in [41, 42, 1_000] {
        assert!(!store.contains(user(absent)).unwrap(), "user {absent}");
    }
    assert!(store.contains(user(40)).unwrap());
    assert_eq!(all_followers(store, 2), vec![1, 3]);
    assert_eq!(store.totals().unwrap(), Totals { users: 4, edges: 2 });
}

#[derive(Debug, Clone)]
enum Op {
    Follow(Vec<(u64, u64)>),
    Unfollow(Vec<(u64, u64)>),
    AddUsers(Vec<u64>),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let pairs = || proptest::collection::vec((0u64..6, 0u64..6), 0..5);
    let op = prop_oneof![
        3 => pairs().prop_map(Op::Follow),
        2 => pairs().prop_map(Op::Unfollow),
        1 => proptest::collection::vec(0u64..8, 0..3).prop_map(Op::AddUsers),
    ];
    proptest::collection::vec(op, 1..30)
}

/// The contract's reference model: a set of edges and a set of users.
#[derive(Default)]
struct Model {
    edges: BTreeSet<(u64, u64)>,
    users: BTreeSet<u64>,
}

impl Model {
    /// What the store must answer, applying the batch only when accepted.
    fn apply(&mut self, op: &Op) -> Result<u64, ()> {
        match op {
            Op::Follow(pairs) => {
                if pairs.iter().any(|(a, b)| a == b) {
                    return Err(());
                }
                let mut next = self.edges.clone();
                let added = pairs.iter().filter(|&&p| next.insert(p)).count() as u64;
                let over = pairs.iter().any(|(a, _)| {
                    next.iter().filter(|(f, _)| f == a).count() as u64 > OPTIONS.max_following
                });
                if over {
                    return Err(());
                }
                self.edges = next;
                self.users.extend(pairs.iter().flat_map(|&(a, b)| [a, b]));
                Ok(added)
            }
            Op::Unfollow(pairs) => Ok(pairs.iter().filter(|p| self.edges.remove(p)).count() as u64),
            Op::AddUsers(ids) => Ok(ids.iter().filter(|&&u| self.users.insert(u)).count() as u64),
        }
    }
}

pub fn follows_and_unfollows_agree_with_a_model<S: Store>(make: impl Fn() -> S) {
    let config = ProptestConfig {
        cases: 64,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in ops())| {
        let mut store = make();
        let mut model = Model::default();
        for op in &ops {
            let expected = model.apply(op);
            let to_edges = |pairs: &[(u64, u64)]| -> Vec<Edge> {
                pairs.iter().map(|&(a, b)| edge(a, b)).collect()
            };
            let got = match op {
                Op::Follow(pairs) => store.follow(&to_edges(pairs)),
                Op::Unfollow(pairs) => store.unfollow(&to_edges(pairs)),
                Op::AddUsers(ids) => store.add_users(&ids.iter().map(|&u| user(u)).collect::<Vec<_>>()),
            };
            prop_assert_eq!(got.ok(), expected.ok(), "{:?}", op);
        }
        for id in 0..8 {
            let followers: Vec<u64> = model.edges.iter().filter(|e| e.1 == id).map(|e| e.0).collect();
            let following: Vec<u64> = model.edges.iter().filter(|e| e.0 == id).map(|e| e.1).collect();
            prop_assert_eq!(all_followers(&mut store, id), followers.clone());
            prop_assert_eq!(all_following(&mut store, id), following.clone());
            prop_assert_eq!(store.contains(user(id)).unwrap(), model.users.contains(&id));
            prop_assert_eq!(
                store.counts(user(id)).unwrap(),
                Counts { followers: followers.len() as u64, following: following.len() as u64 }
            );
        }
        prop_assert_eq!(
            store.totals().unwrap(),
            Totals { users: model.users.len() as u64, edges: model.edges.len() as u64 }
        );
    });
}
