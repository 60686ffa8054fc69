//! Every check against a fake `/proc` and `/sys` tree: ok, warn, fail, and
//! the fix it gives. Nothing here reads or changes the real host.

use std::path::Path;

use super::*;

/// A host that fits `TARGET`: the tree each test then spoils in one place.
fn healthy() -> (tempfile::TempDir, Host) {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in [
        ("proc/sys/fs/nr_open", "1048576"),
        ("proc/sys/fs/file-max", "9223372036854775807"),
        ("proc/sys/fs/file-nr", "2000\t0\t9223372036854775807"),
        ("proc/sys/net/core/somaxconn", "4096"),
        ("proc/sys/net/ipv4/tcp_max_syn_backlog", "4096"),
        ("proc/sys/net/core/netdev_max_backlog", "1000"),
        ("proc/sys/net/ipv4/tcp_syncookies", "1"),
        // 2.36 GB max, as on the measured box.
        ("proc/sys/net/ipv4/tcp_mem", "287901\t383868\t575802"),
        ("proc/sys/net/ipv4/tcp_wmem", "4096\t16384\t4194304"),
        ("proc/sys/net/ipv4/tcp_rmem", "4096\t131072\t6291456"),
        ("proc/sys/net/ipv4/ip_local_port_range", "1024\t65535"),
        ("proc/sys/net/ipv4/tcp_tw_reuse", "2"),
        ("proc/sys/vm/swappiness", "60"),
        (
            "proc/meminfo",
            "MemTotal:       24000000 kB\nMemFree:  1000 kB\nSwapTotal:             0 kB\n",
        ),
        (
            "sys/kernel/mm/transparent_hugepage/enabled",
            "always [madvise] never",
        ),
        (
            "proc/self/cgroup",
            "0::/user.slice/user-0.slice/session-1.scope",
        ),
    ] {
        write(dir.path(), path, text);
    }
    let host = Host {
        root: dir.path().to_owned(),
        open_files: Some((1_024, 20_000)),
        page_size: 4096,
        unit: None,
        spread: even_spread,
    };
    (dir, host)
}

/// 64 connections to each listener, as an even hash comes close to.
fn even_spread(n: usize) -> std::io::Result<Vec<u64>> {
    Ok(vec![64; n])
}

/// Connection tracking loaded, with `max` entries and `count` in use.
fn conntrack_loaded(root: &Path, max: &str, count: &str) {
    write(root, "proc/sys/net/netfilter/nf_conntrack_max", max);
    write(root, "proc/sys/net/netfilter/nf_conntrack_count", count);
}

fn write(root: &Path, path: &str, text: &str) {
    let path = root.join(path);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

const TARGET: Target = Target {
    connections: 19_000,
    workers: 2,
    admin_max_connections: 128,
    backlog: 4_096,
    socket_send_buffer: 65_536,
    max_outbound_bytes: 1 << 20,
    history_max_bytes: 256 << 20,
    host: HostLoad::alone(19_000),
};

/// `TARGET` holding `connections`, alone on its host.
fn sized(connections: u64) -> Target {
    Target {
        connections,
        host: HostLoad::alone(connections),
        ..TARGET
    }
}

/// `TARGET` as one node of a run on this host holding `host` in all.
fn sharing(host: HostLoad) -> Target {
    Target { host, ..TARGET }
}

fn check(host: &Host, target: &Target, name: &str) -> Check {
    examine(host, target)
        .checks
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check {name}"))
}

#[test]
fn a_host_that_fits_passes_every_check() {
    let (_dir, host) = healthy();
    let report = examine(&host, &TARGET);
    let not_ok: Vec<_> = report
        .checks
        .iter()
        .filter(|c| c.verdict != Verdict::Ok)
        .collect();
    assert!(not_ok.is_empty(), "{not_ok:#?}");
    assert_eq!(report.failed().count(), 0);
    assert!(
        report.to_text().contains("17 ok, 0 warn, 0 fail"),
        "{}",
        report.to_text()
    );
}

#[test]
fn every_check_says_why_and_how() {
    let (_dir, host) = healthy();
    for c in examine(&host, &TARGET).checks {
        assert!(!c.value.is_empty() && !c.needs.is_empty(), "{c:?}");
        assert!(c.why.len() > 20, "{c:?}");
        assert!(!c.fix.is_empty(), "{c:?}");
    }
}

#[test]
fn open_files_fail_below_the_connections_and_the_nodes_share() {
    let (_dir, mut host) = healthy();
    let need = 19_000 + fds::reserved(2, 128);
    host.open_files = Some((1_024, need));
    assert_eq!(check(&host, &TARGET, "open files").verdict, Verdict::Ok);
    host.open_files = Some((1_024, need - 1));
    let c = check(&host, &TARGET, "open files");
    assert_eq!(c.verdict, Verdict::Fail);
    assert!(
        c.fix
            .starts_with(&format!("ulimit -Hn {need} && ulimit -n {need}")),
        "{}",
        c.fix
    );
    assert!(c.fix.contains("run 2 nodes"), "{}", c.fix);
    host.open_files = None;
    assert_eq!(check(&host, &TARGET, "open files").verdict, Verdict::Warn);
}

#[test]
fn open_files_name_the_systemd_unit_the_node_runs_in() {
    let (_dir, mut host) = healthy();
    host.unit = Some(Unit {
        name: "myriad.service".into(),
        open_files: Some((1_024, 524_288)),
    });
    host.open_files = Some((1_024, 4_096));
    let c = check(&host, &TARGET, "open files");
    assert_eq!(c.verdict, Verdict::Fail);
    let need = 19_000 + fds::reserved(2, 128);
    assert!(
        c.fix.starts_with(&format!(
            "systemctl edit myriad.service: [Service] LimitNOFILE={need}"
        )),
        "{}",
        c.fix
    );
}

#[test]
fn the_units_limit_is_judged_apart_from_the_shells() {
    let (_dir, mut host) = healthy();
    let need = 19_000 + fds::reserved(2, 128);
    let c = check(&host, &TARGET, "systemd LimitNOFILE");
    assert_eq!(
        (c.verdict, c.value.as_str()),
        (Verdict::Ok, "not under systemd")
    );
    assert!(c.fix.contains("--unit NAME"), "{}", c.fix);

    // The shell's limit passes; the unit's hard limit is short of it.
    host.unit = Some(Unit {
        name: "myriad.service".into(),
        open_files: Some((1_024, need - 1)),
    });
    let c = check(&host, &TARGET, "systemd LimitNOFILE");
    assert_eq!(c.verdict, Verdict::Fail);
    assert_eq!(
        c.value,
        format!("myriad.service: soft 1,024, hard {}", thousands(need - 1))
    );
    assert_eq!(
        c.fix,
        format!(
            "systemctl edit myriad.service: [Service] LimitNOFILE={need}, then systemctl \
             restart myriad.service"
        )
    );
    assert_eq!(check(&host, &TARGET, "open files").verdict, Verdict::Ok);

    host.unit = Some(Unit {
        name: "myriad.service".into(),
        open_files: Some((1_024, need)),
    });
    assert_eq!(
        check(&host, &TARGET, "systemd LimitNOFILE").verdict,
        Verdict::Ok
    );

    host.unit = Some(Unit {
        name: "gone.service".into(),
        open_files: None,
    });
    let c = check(&host, &TARGET, "systemd LimitNOFILE");
    assert_eq!((c.verdict, c.value.as_str()), (Verdict::Warn, "unknown"));
    assert!(
        c.needs.contains("systemctl show gone.service"),
        "{}",
        c.needs
    );
}

#[test]
fn a_skewed_or_failed_reuseport_spread_warns() {
    let (_dir, mut host) = healthy();
    let c = check(&host, &TARGET, "SO_REUSEPORT spread");
    assert_eq!(c.verdict, Verdict::Ok);
    assert_eq!(c.value, "128 probe connections over 2 listeners: 64/64");

    host.spread = |_| Ok(vec![113, 15]);
    let c = check(&host, &TARGET, "SO_REUSEPORT spread");
    assert_eq!(c.verdict, Verdict::Warn, "15 is under a quarter of 64");
    assert!(c.fix.contains("SO_ATTACH_REUSEPORT"), "{}", c.fix);
    host.spread = |_| Ok(vec![112, 16]);
    assert_eq!(
        check(&host, &TARGET, "SO_REUSEPORT spread").verdict,
        Verdict::Ok
    );

    host.spread = |_| Err(std::io::Error::from_raw_os_error(libc::EMFILE));
    let c = check(&host, &TARGET, "SO_REUSEPORT spread");
    assert_eq!(c.verdict, Verdict::Warn);
    assert!(c.value.starts_with("probe failed: "), "{}", c.value);

    // One worker has nothing to spread, and is not probed.
    host.spread = |_| panic!("probed one listener");
    let one = Target {
        workers: 1,
        ..TARGET
    };
    assert_eq!(
        check(&host, &one, "SO_REUSEPORT spread").verdict,
        Verdict::Ok
    );
}

#[test]
fn the_real_probe_accepts_every_connection_on_some_listener() {
    let shares = probe_spread(3).unwrap();
    assert_eq!(shares.len(), 3);
    assert_eq!(shares.iter().sum::<u64>(), 3 * 64, "{shares:?}");
    // The kernel hashes each connection's ports: 192 connections leave no
    // listener under 16 unless the spread is broken.
    assert!(shares.iter().all(|&n| n >= 16), "{shares:?}");
}

/// The cells of the table under "Tuning the host" in docs/operations.md
/// whose header starts with `header`, row by row, code quotes trimmed.
fn documented_table(header: &str) -> Vec<Vec<String>> {
    let doc = include_str!("../../../../docs/operations.md");
    let section = doc
        .split("\n## Tuning the host\n")
        .nth(1)
        .expect("operations.md has a Tuning the host section");
    let section = section.split("\n## ").next().unwrap();
    section
        .lines()
        .skip_while(|l| !l.starts_with(header))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.split('|')
                .map(|cell| cell.trim().trim_matches('`').to_owned())
                .collect()
        })
        .collect()
}

/// The rows of the table of checks, by name.
fn documented_checks() -> Vec<String> {
    documented_table("| check |")
        .into_iter()
        .map(|cells| cells[1].clone())
        .collect()
}

#[test]
fn the_operations_guide_documents_every_check_in_order() {
    let (_dir, host) = healthy();
    let names: Vec<String> = examine(&host, &TARGET)
        .checks
        .iter()
        .map(|c| c.name.to_owned())
        .collect();
    assert_eq!(documented_checks(), names);
    let doc = include_str!("../../../../docs/operations.md");
    let per_pair = format!("{:.1} KB", KERNEL_BYTES_PER_CONNECTION as f64 / 1000.0);
    let node = format!("{USERLAND_BYTES_PER_CONNECTION} B node");
    for figure in [per_pair, node] {
        assert!(doc.contains(&figure), "operations.md does not say {figure}");
    }
}

/// The (flag, default) rows of the table of the flags that describe the
/// whole host.
fn documented_host_flags() -> Vec<(String, String)> {
    documented_table("| flag | default |")
        .into_iter()
        .map(|cells| {
            let flag = cells[1].split(' ').next().unwrap().to_owned();
            (flag, cells[2].clone())
        })
        .collect()
}

#[test]
fn the_operations_guide_gives_each_host_flag_the_default_a_node_alone_has() {
    let alone = HostLoad::alone(19_000);
    let expected = [
        ("--host-connections", "N".to_owned()),
        ("--loopback", "off".to_owned()),
        ("--sources", alone.sources.to_string()),
        ("--extra-files", alone.extra_files.to_string()),
        ("--extra-memory", alone.extra_memory.to_string()),
        (
            "--queued-bytes",
            format!(
                "{} (one small message queued in every socket at once)",
                thousands(alone.queued_bytes)
            ),
        ),
        ("--memory-available", "off".to_owned()),
    ];
    assert!(!alone.loopback && !alone.memory_available);
    let documented = documented_host_flags();
    let expected: Vec<(String, String)> = expected
        .into_iter()
        .map(|(f, d)| (f.to_owned(), d))
        .collect();
    assert_eq!(documented, expected);
}

#[test]
fn nr_open_and_file_max_fail_below_what_the_node_adds() {
    let (dir, host) = healthy();
    write(dir.path(), "proc/sys/fs/nr_open", "10000");
    let c = check(&host, &TARGET, "fs.nr_open");
    assert_eq!(c.verdict, Verdict::Fail);
    let need = 19_000 + fds::reserved(2, 128);
    assert_eq!(c.fix, format!("sysctl -w fs.nr_open={need}"));

    write(dir.path(), "proc/sys/fs/file-max", "20000");
    let c = check(&host, &TARGET, "fs.file-max");
    assert_eq!(c.verdict, Verdict::Fail, "2,000 open + the node's need");
    assert_eq!(
        c.fix,
        format!("sysctl -w fs.file-max={}", (2_000 + need) * 2)
    );
}

#[test]
fn a_backlog_past_somaxconn_or_the_syn_backlog_warns() {
    let (dir, host) = healthy();
    write(dir.path(), "proc/sys/net/core/somaxconn", "128");
    write(dir.path(), "proc/sys/net/ipv4/tcp_max_syn_backlog", "512");
    let c = check(&host, &TARGET, "net.core.somaxconn");
    assert_eq!(c.verdict, Verdict::Warn);
    assert!(
        c.fix.starts_with("sysctl -w net.core.somaxconn=4096"),
        "{}",
        c.fix
    );
    let c = check(&host, &TARGET, "net.ipv4.tcp_max_syn_backlog");
    assert_eq!(c.verdict, Verdict::Warn);
    assert!(c
        .fix
        .starts_with("sysctl -w net.ipv4.tcp_max_syn_backlog=4096"));
    let small = Target {
        backlog: 128,
        ..TARGET
    };
    assert_eq!(
        check(&host, &small, "net.core.somaxconn").verdict,
        Verdict::Ok
    );
}

#[test]
fn a_short_netdev_queue_and_no_syncookies_warn() {
    let (dir, host) = healthy();
    write(dir.path(), "proc/sys/net/core/netdev_max_backlog", "300");
    write(dir.path(), "proc/sys/net/ipv4/tcp_syncookies", "0");
    let c = check(&host, &TARGET, "net.core.netdev_max_backlog");
    assert_eq!(c.verdict, Verdict::Warn);
    assert_eq!(c.fix, "sysctl -w net.core.netdev_max_backlog=1000");
    let c = check(&host, &TARGET, "net.ipv4.tcp_syncookies");
    assert_eq!(c.verdict, Verdict::Warn);
    assert_eq!(c.fix, "sysctl -w net.ipv4.tcp_syncookies=1");
}

#[test]
fn tcp_mem_warns_past_pressure_and_fails_past_its_max() {
    let (_dir, host) = healthy();
    // 383,868 pages of pressure: ~1.57 GB, ~682,000 connections with one
    // small message (2,304 B) queued in each; 575,802 pages of max: ~1.02 M.
    let at = |connections| check(&host, &sized(connections), "net.ipv4.tcp_mem");
    assert_eq!(at(600_000).verdict, Verdict::Ok);
    assert_eq!(at(800_000).verdict, Verdict::Warn);
    let c = at(2_000_000);
    assert_eq!(c.verdict, Verdict::Fail);
    assert_eq!(
        c.needs,
        "max > 4.3 GiB (2,000,000 x ~2.3 KB, one small message queued in every socket at once)"
    );
    // 4.6 GB is 1,125,000 pages; the max a quarter above it.
    assert_eq!(c.fix, "sysctl -w net.ipv4.tcp_mem='287901 1054687 1406250'");
}

#[test]
fn autotuned_send_buffers_warn_with_what_a_stalled_reader_pins() {
    let (_dir, host) = healthy();
    let c = check(&host, &TARGET, "tcp_wmem/tcp_rmem max");
    assert_eq!(c.verdict, Verdict::Ok);
    assert!(c.needs.contains("pins 128.0 KiB"), "{}", c.needs);
    let autotuned = Target {
        socket_send_buffer: 0,
        ..TARGET
    };
    let c = check(&host, &autotuned, "tcp_wmem/tcp_rmem max");
    assert_eq!(c.verdict, Verdict::Warn);
    // 2.36 GB of tcp_mem over 4 MiB each.
    assert!(c.needs.contains("pins 4.0 MiB, 562 of them"), "{}", c.needs);
    assert!(c.fix.contains("socket_send_buffer = 65536"));
}

#[test]
fn memory_counts_kernel_node_and_history_against_ram() {
    let (dir, host) = healthy();
    let at = |connections| check(&host, &sized(connections), "memory");
    assert_eq!(at(19_000).verdict, Verdict::Ok);
    // 24.6 GB: 2.2 million connections need ~19.9 GB, past three quarters.
    assert_eq!(at(2_200_000).verdict, Verdict::Warn);
    let c = at(3_000_000);
    assert_eq!(c.verdict, Verdict::Fail);
    assert!(c.fix.contains("history_max_bytes"));
    write(dir.path(), "proc/meminfo", "MemFree: 1 kB\n");
    assert_eq!(at(19_000).verdict, Verdict::Warn, "unreadable is a warning");
}

#[test]
fn a_narrow_port_range_warns_with_the_addresses_needed() {
    let (dir, host) = healthy();
    write(
        dir.path(),
        "proc/sys/net/ipv4/ip_local_port_range",
        "32768\t60999",
    );
    let c = check(&host, &TARGET, "net.ipv4.ip_local_port_range");
    assert_eq!(c.verdict, Verdict::Ok, "28,232 ports hold 19,000");
    let c = check(&host, &sized(100_000), "net.ipv4.ip_local_port_range");
    assert_eq!(c.verdict, Verdict::Warn);
    assert!(
        c.needs.contains("from 4 addresses (127.0.0.1-4)"),
        "{}",
        c.needs
    );
    assert!(c
        .fix
        .starts_with("sysctl -w net.ipv4.ip_local_port_range='1024 65535'"));
    write(dir.path(), "proc/sys/net/ipv4/tcp_tw_reuse", "0");
    let c = check(&host, &TARGET, "net.ipv4.tcp_tw_reuse");
    assert_eq!(c.verdict, Verdict::Warn);
    assert_eq!(c.fix, "sysctl -w net.ipv4.tcp_tw_reuse=1");
}

#[test]
fn conntrack_is_checked_only_when_loaded() {
    let (dir, host) = healthy();
    let c = check(&host, &TARGET, "nf_conntrack");
    assert_eq!((c.verdict, c.value.as_str()), (Verdict::Ok, "not loaded"));
    conntrack_loaded(dir.path(), "65536", "50000");
    let c = check(&host, &TARGET, "nf_conntrack");
    assert_eq!(c.verdict, Verdict::Fail, "50,000 + 19,000 > 65,536");
    assert_eq!(c.fix, "sysctl -w net.netfilter.nf_conntrack_max=86250");
}

#[test]
fn conntrack_loaded_but_tracking_nothing_passes() {
    let (dir, host) = healthy();
    conntrack_loaded(dir.path(), "65536", "0");
    write(
        dir.path(),
        "proc/net/sockstat",
        "sockets: used 46\nTCP: inuse 17 orphan 0 tw 56 alloc 17 mem 223\n",
    );
    let c = check(&host, &TARGET, "nf_conntrack");
    assert_eq!(c.verdict, Verdict::Ok, "{c:?}");
    assert!(
        c.value.contains("nothing tracked with 17 TCP sockets open"),
        "{}",
        c.value
    );
    assert_eq!(c.fix, "sysctl -w net.netfilter.nf_conntrack_max=23750");
    // Entries while sockets are open: rules track, and 19,000 will not fit.
    write(
        dir.path(),
        "proc/sys/net/netfilter/nf_conntrack_count",
        "50000",
    );
    assert_eq!(check(&host, &TARGET, "nf_conntrack").verdict, Verdict::Fail);
}

#[test]
fn huge_pages_always_and_eager_swap_warn() {
    let (dir, host) = healthy();
    write(
        dir.path(),
        "sys/kernel/mm/transparent_hugepage/enabled",
        "[always] madvise never",
    );
    let c = check(&host, &TARGET, "transparent huge pages");
    assert_eq!((c.verdict, c.value.as_str()), (Verdict::Warn, "always"));
    assert_eq!(
        c.fix,
        "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled"
    );
    write(
        dir.path(),
        "proc/meminfo",
        "MemTotal: 24000000 kB\nSwapTotal: 1048576 kB\n",
    );
    assert_eq!(check(&host, &TARGET, "swap").verdict, Verdict::Warn);
    write(dir.path(), "proc/sys/vm/swappiness", "1");
    assert_eq!(check(&host, &TARGET, "swap").verdict, Verdict::Ok);
}

#[test]
fn the_table_lists_every_check_and_explains_the_others() {
    let (dir, host) = healthy();
    write(dir.path(), "proc/sys/fs/nr_open", "10");
    let text = examine(&host, &TARGET).to_text();
    assert!(
        text.contains("19,000 connections (2 workers): 16 ok, 0 warn, 1 fail"),
        "{text}"
    );
    assert!(text.contains("\nfs.nr_open:\n  why: "), "{text}");
    assert!(text.contains("  fix: sysctl -w fs.nr_open="), "{text}");
    assert!(
        !text.contains("\nswap:\n"),
        "ok checks have no explanation: {text}"
    );
}

/// A million subscribers and their bench on this host, as the scale proof
/// plans them: 1,000,051 connections in all, 19,000 to this node.
fn million_here() -> HostLoad {
    HostLoad {
        connections: 1_000_051,
        loopback: true,
        ..HostLoad::alone(19_000)
    }
}

#[test]
fn file_max_counts_both_ends_and_the_other_processes_files() {
    let (dir, host) = healthy();
    write(dir.path(), "proc/sys/fs/file-max", "2000000");
    let run = HostLoad {
        extra_files: 30_000,
        ..million_here()
    };
    // 2,000 open + 235 the node keeps + 2 x 1,000,051 + 30,000.
    let c = check(&host, &sharing(run), "fs.file-max");
    assert_eq!(c.verdict, Verdict::Fail);
    assert_eq!(c.needs, ">= 2,032,337");
    assert_eq!(c.fix, "sysctl -w fs.file-max=4064674");
    // The clients elsewhere: one file a connection fits.
    let remote = HostLoad {
        loopback: false,
        ..run
    };
    assert_eq!(
        check(&host, &sharing(remote), "fs.file-max").verdict,
        Verdict::Ok
    );
    // The node's own limits stay the node's: 19,000 fit its hard limit.
    assert_eq!(
        check(&host, &sharing(run), "open files").verdict,
        Verdict::Ok
    );
}

#[test]
fn tcp_mem_counts_what_the_run_queues_and_what_is_queued_now() {
    let (dir, host) = healthy();
    write(
        dir.path(),
        "proc/net/sockstat",
        "sockets: used 46\nTCP: inuse 17 orphan 0 tw 56 alloc 17 mem 223\n",
    );
    let queueing = |queued_bytes| {
        let run = HostLoad {
            queued_bytes,
            ..million_here()
        };
        check(&host, &sharing(run), "net.ipv4.tcp_mem")
    };
    // c10m's 512 B a subscriber: 489 MiB, under the 1.5 GiB of pressure.
    let c = queueing(512);
    assert_eq!(c.verdict, Verdict::Ok);
    assert_eq!(c.value, "pressure 1.5 GiB, max 2.2 GiB; 892.0 KiB in use");
    assert_eq!(c.needs, "max > 489.2 MiB (1,000,051 x 512 B queued)");
    // A broadcast's 2,304 B: past pressure, under the max; the fix raises
    // pressure to 3/4 of a max a quarter above 2.1 GiB, and lowers nothing.
    let c = queueing(2_304);
    assert_eq!(c.verdict, Verdict::Warn);
    assert_eq!(c.fix, "sysctl -w net.ipv4.tcp_mem='287901 527580 703440'");
    // Just past pressure: a quarter above the need is under the max set.
    let c = queueing(1_700);
    assert_eq!(c.verdict, Verdict::Warn);
    assert_eq!(c.fix, "sysctl -w net.ipv4.tcp_mem='287901 431851 575802'");
    // Churn's 8 KiB: 2,000,325 pages with the 223 in use.
    let c = queueing(8_192);
    assert_eq!(c.verdict, Verdict::Fail);
    assert_eq!(c.fix, "sysctl -w net.ipv4.tcp_mem='287901 1875304 2500406'");
}

#[test]
fn memory_for_a_run_now_is_what_running_processes_leave() {
    let (dir, host) = healthy();
    write(
        dir.path(),
        "proc/meminfo",
        "MemTotal: 24000000 kB\nMemAvailable: 8000000 kB\nSwapTotal: 0 kB\n",
    );
    let run = HostLoad {
        extra_memory: 2 << 30,
        memory_available: true,
        ..million_here()
    };
    // 8.4 GB kernel + 0.5 GB node + 256 MiB history + 2 GiB of others.
    let c = check(&host, &sharing(run), "memory");
    assert_eq!(c.verdict, Verdict::Fail);
    assert_eq!(c.value, "MemAvailable 7.6 GiB");
    assert!(
        c.needs
            .starts_with("> 10.6 GiB (kernel 7.8 GiB + node 488.3 MiB + history_max_bytes 256.0 MiB + other processes 2.0 GiB;"),
        "{}",
        c.needs
    );
    assert_eq!(
        c.fix,
        "free memory (7.6 GiB available now), fewer connections per host (about 716,456 fit), \
         or a lower history_max_bytes"
    );
    // The same run against a host sized for it: 24 GB holds it.
    let sized_host = HostLoad {
        memory_available: false,
        ..run
    };
    let c = check(&host, &sharing(sized_host), "memory");
    assert_eq!(
        (c.verdict, c.value.as_str()),
        (Verdict::Ok, "MemTotal 22.9 GiB")
    );
    // Without MemAvailable the row cannot judge a run now.
    write(dir.path(), "proc/meminfo", "MemTotal: 24000000 kB\n");
    assert_eq!(check(&host, &sharing(run), "memory").verdict, Verdict::Warn);
}

#[test]
fn loopback_clients_need_source_addresses_for_their_ports() {
    let (dir, host) = healthy();
    write(
        dir.path(),
        "proc/sys/net/ipv4/ip_local_port_range",
        "32768\t60999",
    );
    // 19,000 to this node's address, a pair at most 7,058 full: 3 sources.
    let c = check(
        &host,
        &sharing(million_here()),
        "net.ipv4.ip_local_port_range",
    );
    assert_eq!(c.verdict, Verdict::Fail);
    assert_eq!(
        c.needs,
        "3 source address(es) for 19,000 connections to the node's address, each pair at \
         most 1/4 full; the clients have 1"
    );
    assert_eq!(
        c.fix,
        "sysctl -w net.ipv4.ip_local_port_range='1024 65535' (2 source address(es) then), or \
         at most 7,058 connections per node address"
    );
    let spread = HostLoad {
        sources: 254,
        ..million_here()
    };
    assert_eq!(
        check(&host, &sharing(spread), "net.ipv4.ip_local_port_range").verdict,
        Verdict::Ok
    );
}

#[test]
fn conntrack_counts_every_connection_on_the_host() {
    let (dir, host) = healthy();
    conntrack_loaded(dir.path(), "65536", "1000");
    assert_eq!(check(&host, &TARGET, "nf_conntrack").verdict, Verdict::Ok);
    let run = HostLoad {
        connections: 100_000,
        ..HostLoad::alone(19_000)
    };
    let c = check(&host, &sharing(run), "nf_conntrack");
    assert_eq!(c.verdict, Verdict::Fail, "1,000 + 100,000 > 65,536");
    assert_eq!(c.fix, "sysctl -w net.netfilter.nf_conntrack_max=126250");
}

#[test]
fn a_node_alone_is_what_serve_checks_and_the_table_names_a_shared_host() {
    let config = Config::default();
    let target = Target::from_config(&config, None);
    assert_eq!(target.host, HostLoad::alone(target.connections));
    let (_dir, host) = healthy();
    let alone = examine(&host, &TARGET).to_text();
    assert!(!alone.contains("the host holds"), "{alone}");
    let shared = examine(&host, &sharing(million_here())).to_text();
    assert!(
        shared.contains(
            "2 workers): 15 ok, 1 warn, 1 fail\nthe host holds 1,000,051 connections in all, \
             their clients here too\n\n"
        ),
        "{shared}"
    );
}

#[test]
fn numbers_read_the_way_people_write_them() {
    assert_eq!(thousands(0), "0");
    assert_eq!(thousands(999), "999");
    assert_eq!(thousands(1_000_000), "1,000,000");
    assert_eq!(size(512), "512 B");
    assert_eq!(size(8_400_000_000), "7.8 GiB");
    assert_eq!(selected("always madvise [never]"), Some("never"));
}
