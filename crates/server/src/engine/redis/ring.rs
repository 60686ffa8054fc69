//! Which Redis holds a subject: a consistent hash of the subject over the
//! configured instances, the same on every node.
//!
//! Jump consistent hashing (Lamping and Veach, 2014) over a fixed 64-bit
//! FNV-1a hash of the subject's bytes. Every node computes the same instance
//! without talking to the others, and appending an instance to the list
//! moves only about 1/(n+1) of the subjects, all of them to the new one;
//! the rest keep their Redis, their positions and their history. (A
//! moved subject starts a new epoch on its new Redis: its clients recover
//! with `recovered: false`. docs/operations.md says how to add an instance.)
//! The hash must never change between versions: nodes of two versions in
//! one cluster must agree, so it is written out here rather than taken
//! from a hasher whose output may change.

/// The instance of `subject` among `instances` instances.
pub fn instance_of(subject: &str, instances: usize) -> usize {
    debug_assert!(instances > 0);
    jump(fnv1a(subject.as_bytes()), instances as i64) as usize
}

/// 64-bit FNV-1a.
fn fnv1a(bytes: &[u8]) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET_BASIS, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(PRIME)
    })
}

/// Jump consistent hash: a bucket in `0..buckets` for `key`.
fn jump(mut key: u64, buckets: i64) -> i64 {
    let (mut b, mut j) = (-1i64, 0i64);
    while j < buckets {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_hash_is_fixed() {
        // FNV-1a's published test vectors: nodes of every version agree.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(instance_of("anything", 1), 0);
    }

    #[test]
    fn subjects_spread_evenly() {
        let mut counts = [0usize; 4];
        for i in 0..40_000 {
            counts[instance_of(&format!("user.{i}"), 4)] += 1;
        }
        for count in counts {
            assert!((9_000..11_000).contains(&count), "{counts:?}");
        }
    }

    proptest! {
        /// Adding an instance moves a subject only onto the new instance.
        #[test]
        fn adding_an_instance_moves_subjects_only_to_it(subject in ".{0,40}", instances in 1usize..32) {
            let before = instance_of(&subject, instances);
            let after = instance_of(&subject, instances + 1);
            prop_assert!(before < instances);
            prop_assert!(after == before || after == instances);
        }
    }

    #[test]
    fn adding_an_instance_moves_about_its_share() {
        let moved = (0..30_000)
            .filter(|i| {
                let s = format!("s{i}");
                instance_of(&s, 5) != instance_of(&s, 6)
            })
            .count();
        // 1/6 of 30,000 is 5,000.
        assert!((4_000..6_000).contains(&moved), "{moved}");
    }
}
