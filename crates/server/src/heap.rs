//! What the node's structures cost on the heap: the allocator's rounding
//! and the price of a named entry in a hash map, so that every budget and
//! every figure of `/stats` that counts memory counts it the same way.
//!
//! Estimates from sizes known at compile time, checked against the
//! process's resident memory by the memory test and the benchmarks (see
//! docs/architecture.md, *Memory*); leaf module, it touches nothing.

use std::mem::size_of;
use std::sync::Arc;

/// What the allocator hands out for a request of `bytes`: glibc's malloc
/// (the node's allocator) adds an 8-byte header, rounds to 16 and gives at
/// least 32; nothing for nothing.
pub fn allocation(bytes: usize) -> usize {
    if bytes == 0 {
        0
    } else {
        (bytes + 8).next_multiple_of(16).max(32)
    }
}

/// A subject's name as the node holds it, an `Arc<str>`: two counters,
/// then the bytes.
pub fn name_bytes(name: &str) -> usize {
    allocation(2 * size_of::<usize>() + name.len())
}

/// One entry of a `hashbrown` map from a subject's name to a `V`, named
/// `name`: its slot at the table's emptiest (one control byte each), and
/// its name. A table doubles when 7 of 8 slots are used, so just after it
/// grew only 7 of 16 are: counting every entry at that load keeps what a
/// budget admits within the budget whatever the table's moment (measured:
/// at the fullest load the node outgrew a 256 MiB budget by 62 MiB,
/// docs/benchmarks.md, *Subjects nobody subscribes to*).
pub fn named_entry_bytes<V>(name: &str) -> usize {
    (size_of::<(Arc<str>, V)>() + 1) * 16 / 7 + name_bytes(name)
}

/// An entry of a B-tree map or set: its key (and value), in nodes about
/// two-thirds full.
pub const fn btree_entry_bytes<K>() -> usize {
    size_of::<K>() * 3 / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_round_like_glibc() {
        assert_eq!(allocation(0), 0);
        assert_eq!(allocation(1), 32);
        assert_eq!(allocation(24), 32);
        assert_eq!(allocation(25), 48);
        assert_eq!(allocation(100), 112);
    }

    #[test]
    fn a_named_entry_pays_for_its_name() {
        let short = named_entry_bytes::<u64>("a");
        let long = named_entry_bytes::<u64>(&"a".repeat(100));
        assert_eq!(long - short, name_bytes(&"a".repeat(100)) - name_bytes("a"));
        assert!(short >= size_of::<(Arc<str>, u64)>() + 32);
    }
}
