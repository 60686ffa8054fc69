//! Source-address rotation: spreading connections over source addresses
//! (and targets) so one host passes the ~28k ports per (source,
//! destination) pair, as seed 004 had to, plus explicit port slices.

use std::collections::HashMap;

use myriad_bench::util::addr::{route, PortCursor, Sources};
use myriad_bench::util::plan::port_capacity;

#[test]
fn a_hundred_thousand_over_twenty_sources() {
    let sources: Sources = "127.0.0.1-127.0.0.20".parse().unwrap();
    let n = 100_000u64;
    let mut per_source: HashMap<usize, u64> = HashMap::new();
    for i in 0..n {
        *per_source
            .entry(route(i, 0, 1, sources.0.len()).source.unwrap())
            .or_default() += 1;
    }
    assert_eq!(per_source.len(), 20);
    assert!(per_source.values().all(|&c| c == 5_000), "even spread");
    assert!(n <= port_capacity(20, 1, 28_232));
}

#[test]
fn several_targets_multiply_the_pairs() {
    // 3 listeners × 4 sources: 12 pairs, each used equally, and consecutive
    // connections alternate targets first.
    let mut pairs: HashMap<(usize, usize), u64> = HashMap::new();
    for i in 0..1_200 {
        let r = route(i, 0, 3, 4);
        *pairs.entry((r.target, r.source.unwrap())).or_default() += 1;
    }
    assert_eq!(pairs.len(), 12);
    assert!(pairs.values().all(|&c| c == 100));
    assert_eq!(
        (
            route(0, 0, 3, 4).target,
            route(1, 0, 3, 4).target,
            route(2, 0, 3, 4).target
        ),
        (0, 1, 2)
    );
}

#[test]
fn explicit_ports_cycle_per_source_within_the_worker_slice() {
    // Worker 1 of 3: its own third of 1024..=65535, cycled independently per source.
    let mut c = PortCursor::new(1, 3, 2);
    let first = c.next_port(0);
    assert_eq!(
        c.next_port(1),
        first,
        "each source starts at the slice start"
    );
    assert_eq!(c.next_port(0), first + 1);
    let slice_len = (65_536 - 1_024) / 3;
    for _ in 0..slice_len - 2 {
        c.next_port(0);
    }
    assert_eq!(c.next_port(0), first, "wraps after the slice");
    let w0 = PortCursor::new(0, 3, 1).next_port(0);
    let w2 = PortCursor::new(2, 3, 1).next_port(0);
    assert!(w0 < first && first < w2);
}
