//! The engine in the Sentinel shape against real processes (a master, a
//! replica and three Sentinels, [`SentinelSetup`]): the conformance suite
//! unchanged, and failovers, including one that loses acknowledged writes,
//! after which no position handed out before may be recovered across.

use std::cell::Cell;
use std::time::{Duration, Instant};

use myriad_protocol::position::Position;
use myriad_testkit::SentinelSetup;

use super::tests::{harness, settings, ten_kept};
use super::{RedisSettings, SentinelSettings};
use crate::engine::conformance::{self, Harness};
use crate::engine::{EngineError, Published, Reply};
use crate::hub::Wakeups;
use crate::namespace::Namespaces;

/// Settings of an engine that finds its master through the Sentinels at
/// `sentinels`, under the tests' prefix.
fn behind(sentinels: Vec<String>, master: &str) -> RedisSettings {
    RedisSettings {
        urls: Vec::new(),
        sentinel: Some(SentinelSettings {
            sentinels,
            master: master.to_owned(),
        }),
        timeout: Duration::from_secs(5),
        ..settings(String::new())
    }
}

/// Engines behind `setup`'s Sentinels, each under a prefix no other engine
/// of the maker has (a new prefix is a Redis that lost everything, as the
/// suite's "restarted" engine expects). The maker owns the setup, so its
/// processes stop with the test.
fn through(setup: SentinelSetup) -> impl Fn(usize, Namespaces, usize) -> Harness {
    let made = Cell::new(0);
    move |workers, namespaces, max_bytes| {
        made.set(made.get() + 1);
        let settings = RedisSettings {
            prefix: format!("conformance{}", made.get()),
            ..behind(setup.sentinel_urls(), setup.name())
        };
        harness(settings, workers, namespaces, max_bytes)
    }
}

// The engine contract, clause by clause, each behind a master, a replica
// and three Sentinels of its own.
conformance::conformance_suite!(
    keeps_the_contract_behind_sentinels,
    through(SentinelSetup::start("conformance"))
);

/// A publish that may fail.
fn try_publish(h: &Harness, subject: &str, data: &str) -> Result<Published, EngineError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let mut wakeups = Wakeups::default();
    h.engine
        .publish(subject, data, Reply::Task(tx), &mut wakeups);
    h.hub.wake(wakeups);
    rx.blocking_recv().expect("answered")
}

/// The connection Redis's own commands go over, authenticated with
/// `password` when given.
fn admin(port: u16, password: Option<&str>) -> redis::Connection {
    let url = match password {
        Some(p) => format!("redis://:{p}@127.0.0.1:{port}"),
        None => format!("redis://127.0.0.1:{port}"),
    };
    redis::Client::open(url).unwrap().get_connection().unwrap()
}

#[test]
fn a_failover_that_lost_acknowledged_writes_hands_out_no_offset_again() {
    let mut setup = SentinelSetup::start("lossy");
    let h = harness(
        behind(setup.sentinel_urls(), setup.name()),
        1,
        ten_kept(),
        1 << 20,
    );
    // Every acknowledged publish: its data and position, in order.
    let mut acked: Vec<(String, Position)> = Vec::new();
    let publish = |h: &Harness, acked: &mut Vec<(String, Position)>, data: String| {
        let position = try_publish(h, "s", &data)?.position.expect("kept");
        acked.push((data, position));
        Ok::<(), EngineError>(())
    };
    for i in 0..3 {
        publish(&h, &mut acked, format!("kept{i}")).unwrap();
    }
    let mut master = admin(setup.master.port(), None);
    let copies: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query(&mut master)
        .unwrap();
    assert_eq!(copies, 1, "the replica has the first three");

    // Cut the replica off: it cannot come back without the password the
    // master now asks of new connections (the engine's and the Sentinels'
    // stay as they are).
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("cut")
        .query(&mut master)
        .unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(&mut master)
        .unwrap();
    let mut replica = admin(setup.replica.port(), None);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut replica)
            .unwrap();
        if info.contains("master_link_status:down") {
            break;
        }
        assert!(Instant::now() < deadline, "the replica kept its link");
        std::thread::sleep(Duration::from_millis(20));
    }
    for i in 0..3 {
        publish(&h, &mut acked, format!("lost{i}")).unwrap();
    }
    let before = acked.clone();

    // The master dies; the Sentinels promote the replica, which lacks the
    // last three. Publishes go on throughout, every 20 ms.
    let old = setup.master.port();
    let killed = Instant::now();
    setup.master.kill();
    let mut refused: u64 = 0;
    let mut back_after = None;
    let mut n = 0;
    while acked.len() < before.len() + 5 {
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "publishes never came back"
        );
        match publish(&h, &mut acked, format!("after{n}")) {
            Ok(()) => {
                back_after.get_or_insert(killed.elapsed());
            }
            Err(
                EngineError::RedisUnavailable | EngineError::RedisLost | EngineError::RedisTimeout,
            ) => {
                refused += 1;
            }
            Err(e) => panic!("a publish failed with {e:?}, not as Redis unavailable"),
        }
        n += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(setup.wait_for_failover_from(old), setup.replica.port());
    eprintln!(
        "publishes succeeded again {:?} after the kill, {refused} refused meanwhile",
        back_after.unwrap()
    );

    // No position was handed out twice, and within an epoch offsets only
    // grew.
    let mut seen = std::collections::HashSet::new();
    for (data, position) in &acked {
        assert!(
            seen.insert(*position),
            "{position:?} handed out again, for {data}"
        );
    }
    for pair in acked.windows(2) {
        let (a, b) = (pair[0].1, pair[1].1);
        if a.epoch == b.epoch {
            assert!(b.offset > a.offset, "{a:?} then {b:?}");
        }
    }
    let (_, last_before) = *before.last().unwrap();
    let (_, first_after) = acked[before.len()];
    assert_ne!(
        first_after.epoch, last_before.epoch,
        "the stream went on over lost writes"
    );

    // A client recovering from any position handed out before the failover
    // is told it missed publications; one from after it recovers.
    for (data, position) in &before {
        let page = h.history("s", Some(*position), 100);
        assert_eq!(page.recovered, Some(false), "recovering after {data}");
    }
    let (_, newest) = *acked.last().unwrap();
    let page = h.history("s", Some(acked[before.len()].1), 100);
    assert_eq!(page.recovered, Some(true));
    assert_eq!(page.position, newest);
    assert_eq!(page.publications.len(), 4);

    let stats = h.engine.stats();
    assert_eq!(stats.failovers, 1);
    assert!(stats.unavailable_ms > 0);
    assert!(stats.failures.unavailable + stats.failures.timeout >= refused);
}

/// Why the engine would not start with `settings`.
fn refused(settings: RedisSettings) -> String {
    let (hub, _mailboxes, _polls) = crate::hub::test_hub(1, 1_000);
    match super::RedisEngine::connect(hub, ten_kept(), 1 << 20, settings) {
        Ok(_) => panic!("started"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_start_the_sentinels_cannot_serve_fails_naming_the_setting() {
    let setup = SentinelSetup::start("named");
    let nobody = format!("redis://127.0.0.1:{}", myriad_testkit::free_port());
    let why = refused(behind(vec![nobody.clone()], "named"));
    assert!(
        why.starts_with("redis_sentinel: no Sentinel answered"),
        "{why}"
    );
    assert!(why.contains(&nobody), "{why}");
    let why = refused(behind(setup.sentinel_urls(), "unknown"));
    assert_eq!(
        why,
        "redis_sentinel_master: no Sentinel knows a master named \"unknown\""
    );
    let mixed = RedisSettings {
        urls: vec![setup.master.url()],
        ..behind(setup.sentinel_urls(), "named")
    };
    assert!(refused(mixed).contains("two shapes"));
    // The master asks for a password the settings do not give.
    let mut master = admin(setup.master.port(), None);
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("pw")
        .query(&mut master)
        .unwrap();
    let why = refused(behind(setup.sentinel_urls(), "named"));
    assert!(why.contains("redis_sentinel_master"), "{why}");
    assert!(why.contains("NOAUTH") || why.contains("auth"), "{why}");
    // With it, in URL form, the engine starts.
    let (hub, _mailboxes, _polls) = crate::hub::test_hub(1, 1_000);
    let settings = behind(setup.sentinel_urls(), "redis://:pw@named");
    assert!(super::RedisEngine::connect(hub, ten_kept(), 1 << 20, settings).is_ok());
}

#[test]
fn a_master_cut_off_with_its_connection_open_is_left_when_the_sentinels_switch() {
    let setup = SentinelSetup::start("cutoff");
    // Far longer than the failover takes: a publish sent to the stopped
    // master would wait this long, then fail as a timeout.
    let settings = RedisSettings {
        timeout: Duration::from_secs(60),
        ..behind(setup.sentinel_urls(), "cutoff")
    };
    let h = harness(settings, 1, ten_kept(), 1 << 20);
    let first = h.publish("s", "before").position.expect("kept");
    // The engine listens to the first Sentinel's announcements (Sentinel
    // has no PUBSUB command: its client list shows the subscription).
    let listening = || {
        setup.sentinels[0]
            .command(&["CLIENT", "LIST"])
            .is_ok_and(|clients| clients.contains(" sub=1 "))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !listening() {
        assert!(
            Instant::now() < deadline,
            "the engine never listened to the Sentinels"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Stopped, not killed: its connections stay open and silent.
    let old = setup.master.port();
    setup.master.pause();
    assert_eq!(setup.wait_for_failover_from(old), setup.replica.port());
    let deadline = Instant::now() + Duration::from_secs(30);
    let published = loop {
        match try_publish(&h, "s", "after") {
            Ok(published) => break published,
            Err(EngineError::RedisUnavailable | EngineError::RedisLost) => {}
            Err(e) => panic!("{e:?}: the engine held on to the stopped master"),
        }
        assert!(Instant::now() < deadline, "publishes never came back");
        std::thread::sleep(Duration::from_millis(50));
    };
    let stats = h.engine.stats();
    assert_eq!((stats.failures.timeout, stats.failovers), (0, 1));
    assert_ne!(published.position.expect("kept").epoch, first.epoch);
}

#[test]
fn a_master_demoted_under_the_connection_fails_publishes_as_unavailable_until_it_is_back() {
    let setup = SentinelSetup::start("demoted");
    let h = harness(
        behind(setup.sentinel_urls(), "demoted"),
        1,
        ten_kept(),
        1 << 20,
    );
    h.publish("s", "before");
    // The master becomes a replica by hand, with the node's connection
    // still open (Sentinel, reconfiguring, would close it): its scripts
    // now answer -READONLY.
    let replicaof = |server: &myriad_testkit::RedisServer, of: Option<u16>| {
        let mut con = admin(server.port(), None);
        let mut cmd = redis::cmd("REPLICAOF");
        match of {
            Some(port) => cmd.arg("127.0.0.1").arg(port),
            None => cmd.arg("NO").arg("ONE"),
        };
        let () = cmd.query(&mut con).unwrap();
    };
    replicaof(&setup.replica, None);
    replicaof(&setup.master, Some(setup.replica.port()));
    match try_publish(&h, "s", "while demoted") {
        Err(EngineError::RedisUnavailable) => {}
        other => panic!("{other:?}"),
    }
    // Asked again, the Sentinels still name it, and it is no master: the
    // node keeps refusing, as unavailable, never as a Redis error.
    for _ in 0..5 {
        let refused = try_publish(&h, "s", "while demoted");
        assert!(
            matches!(refused, Err(EngineError::RedisUnavailable)),
            "{refused:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Put back, it is found again.
    replicaof(&setup.master, None);
    replicaof(&setup.replica, Some(setup.master.port()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while try_publish(&h, "s", "after").is_err() {
        assert!(Instant::now() < deadline, "publishes never came back");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(h.engine.stats().failures.error, 0);
}
