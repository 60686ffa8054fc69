//! Multi-process planning within the open-file cap: how many worker
//! processes for N connections, and what each one holds.

use myriad_bench::util::plan::{
    connect_rate_concurrency, conns_per_process, processes_for, split, RESERVED_FDS,
};

#[test]
fn a_million_connections_under_a_20k_cap() {
    let per = conns_per_process(20_000);
    assert_eq!(per, 20_000 - RESERVED_FDS);
    let procs = processes_for(1_000_000, per);
    assert_eq!(procs, 51, "docs/limits.md: 1M needs at least 51 processes");
    let ranges = split(1_000_000, procs);
    assert_eq!(ranges.len(), 51);
    assert_eq!(ranges[0].start, 0);
    assert_eq!(ranges.last().unwrap().end, 1_000_000);
    for pair in ranges.windows(2) {
        assert_eq!(pair[0].end, pair[1].start, "contiguous, no gap or overlap");
    }
    for r in &ranges {
        let held = r.end - r.start;
        assert!(held <= per, "every process stays under its cap");
        // Each process's own fds: its connections plus the reserve.
        assert!(held + RESERVED_FDS <= 20_000);
    }
}

#[test]
fn small_runs_use_one_process() {
    let per = conns_per_process(20_000);
    assert_eq!(processes_for(10, per), 1);
    assert_eq!(processes_for(per, per), 1);
    assert_eq!(processes_for(per + 1, per), 2);
}

#[test]
fn the_cap_this_process_sees_is_respected() {
    let cap = myriad_bench::util::plan::fd_cap();
    assert!(cap > RESERVED_FDS);
    let per = conns_per_process(cap);
    let procs = processes_for(3 * per + 1, per);
    assert_eq!(procs, 4);
    assert!(split(3 * per + 1, procs)
        .iter()
        .all(|r| r.end - r.start <= per));
}

#[test]
fn connect_rate_plans_for_its_peak_concurrency() {
    // Seed 000 at this box's scale: 20k/s, 1 s ± 5 % hold.
    let open = connect_rate_concurrency(20_000.0, 1.05, 0.25);
    assert_eq!(processes_for(open, conns_per_process(20_000)), 2);
    // A slow rate fits one process.
    assert_eq!(
        processes_for(
            connect_rate_concurrency(1_000.0, 1.05, 0.25),
            conns_per_process(20_000)
        ),
        1
    );
}
