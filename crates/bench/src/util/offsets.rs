//! Which offsets of one stream a connection received, and how many came
//! again: the receiving side of the `social` workload's exact check.
//!
//! A feed's offsets arrive in order, so a connection that follows a user
//! the whole run holds one range; following, unfollowing and following
//! again leaves a few. [`Received`] keeps them as sorted, disjoint,
//! inclusive ranges, so a worker ships a few numbers per (connection,
//! feed) instead of one per delivery, and counts every offset that came a
//! second time. Whether an offset should have come at all is the judge's
//! question (`judge.rs`), not this module's.
//!
//! Pure: no I/O, no clock.

use serde::{Deserialize, Serialize};

/// The offsets of one stream (one epoch) a connection received.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Received {
    /// Sorted, disjoint, non-adjacent inclusive ranges `[first, last]`.
    ranges: Vec<(u64, u64)>,
    /// Deliveries of an offset already received.
    pub again: u64,
}

impl Received {
    /// Takes one delivery at `offset`; false when it had come before.
    pub fn insert(&mut self, offset: u64) -> bool {
        // In order, the common case: extend or start the last range.
        match self.ranges.last_mut() {
            None => {
                self.ranges.push((offset, offset));
                return true;
            }
            Some(last) if offset == last.1 + 1 => {
                last.1 = offset;
                return true;
            }
            Some(last) if offset > last.1 + 1 => {
                self.ranges.push((offset, offset));
                return true;
            }
            Some(_) => {}
        }
        // Behind the last offset: a repeat, or one that came late.
        let i = self.ranges.partition_point(|&(_, last)| last < offset);
        if self.ranges[i].0 <= offset {
            self.again += 1;
            return false;
        }
        let joins_left = i > 0 && self.ranges[i - 1].1 + 1 == offset;
        let joins_right = self.ranges[i].0 == offset + 1;
        match (joins_left, joins_right) {
            (true, true) => {
                self.ranges[i - 1].1 = self.ranges[i].1;
                self.ranges.remove(i);
            }
            (true, false) => self.ranges[i - 1].1 = offset,
            (false, true) => self.ranges[i].0 = offset,
            (false, false) => self.ranges.insert(i, (offset, offset)),
        }
        true
    }

    /// Whether `offset` was received.
    pub fn contains(&self, offset: u64) -> bool {
        let i = self.ranges.partition_point(|&(_, last)| last < offset);
        self.ranges
            .get(i)
            .is_some_and(|&(first, _)| first <= offset)
    }

    /// Distinct offsets received.
    pub fn len(&self) -> u64 {
        self.ranges.iter().map(|&(a, b)| b - a + 1).sum()
    }

    /// Whether nothing was received.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The ranges, ascending.
    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn in_order_offsets_stay_one_range() {
        let mut r = Received::default();
        assert!(r.is_empty());
        for o in 5..=9 {
            assert!(r.insert(o));
        }
        assert_eq!(r.ranges(), [(5, 9)]);
        assert!(!r.insert(7), "again");
        assert_eq!((r.len(), r.again), (5, 1));
        assert!(r.contains(5) && r.contains(9) && !r.contains(4) && !r.contains(10));
    }

    #[test]
    fn holes_late_arrivals_and_joins() {
        let mut r = Received::default();
        for o in [1, 2, 6, 7, 10] {
            r.insert(o);
        }
        assert_eq!(r.ranges(), [(1, 2), (6, 7), (10, 10)]);
        assert!(r.insert(4), "late, alone");
        assert!(r.insert(3), "joins both sides");
        assert_eq!(r.ranges(), [(1, 4), (6, 7), (10, 10)]);
        assert!(r.insert(5));
        assert!(r.insert(9), "joins the right");
        assert!(r.insert(8));
        assert_eq!(r.ranges(), [(1, 10)]);
        assert!(!r.insert(1) && !r.insert(10));
        assert_eq!((r.len(), r.again), (10, 2));
    }

    proptest! {
        /// Against a set: the same offsets, the same repeats, and ranges
        /// that stay sorted, disjoint and apart.
        #[test]
        fn it_is_a_set_of_offsets(offsets in proptest::collection::vec(0u64..60, 0..200)) {
            let mut r = Received::default();
            let mut model = BTreeSet::new();
            let mut again = 0;
            for o in offsets {
                let new = model.insert(o);
                again += u64::from(!new);
                prop_assert_eq!(r.insert(o), new);
            }
            prop_assert_eq!(r.len(), model.len() as u64);
            for o in 0..61 {
                prop_assert_eq!(r.contains(o), model.contains(&o));
            }
            prop_assert!(r.ranges().windows(2).all(|w| w[0].1 + 1 < w[1].0));
            prop_assert!(r.ranges().iter().all(|&(a, b)| a <= b));
            prop_assert_eq!(r.again, again);
        }
    }
}
