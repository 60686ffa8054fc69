//! The key layout against what a Redis Cluster enforces (keys.rs): the
//! conformance suite, unchanged, over one Redis in cluster mode serving
//! every slot, which refuses any script touching keys of more than one
//! slot. (Over two instances the suite's budget clauses would not hold:
//! each instance keeps its own budget, docs/operations.md.)

use myriad_testkit::RedisServer;

use super::tests::over;
use crate::engine::conformance;

// The engine contract, clause by clause, each over a one-node cluster of
// its own.
conformance::conformance_suite!(
    keeps_the_contract_within_slots,
    over(RedisServer::start_single_node_cluster())
);

/// The control: the node these tests run on refuses a script of ours
/// (one with a shebang, as lib.lua's first line) touching keys of another
/// slot than the one it declares, as the layout before partitions did (a
/// budget eviction touched other subjects' keys), so the suite above can
/// fail; without the shebang it would not.
#[test]
fn the_cluster_node_refuses_a_script_crossing_slots() {
    assert!(super::PUBLISH_SCRIPT.starts_with("#!lua\n"));
    let server = RedisServer::start_single_node_cluster();
    let run = |script: &str, key: &str| server.command(&["EVAL", script, "1", key]).unwrap();
    let crossing = "redis.call('SET', KEYS[1], 1); return redis.call('GET', 'p:s:{other}')";
    let refused = run(&format!("#!lua\n{crossing}"), "p:s:{one}");
    assert!(
        refused.contains("same slot"),
        "a crossing script ran: {refused}"
    );
    assert!(
        !run(crossing, "p:s:{one}").starts_with('-'),
        "compatibility mode"
    );
    let within = "#!lua\nredis.call('SET', KEYS[1], 1); return redis.call('GET', 'p:{0}:s:x')";
    assert_eq!(
        run(within, "p:{0}:totals"),
        "$-1",
        "within one slot: a missing key"
    );
}
