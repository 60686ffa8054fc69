//! `myriad graph …` against the real binary: generate → load → stats, a
//! malformed file, the data directory's lock, and `kill -9` during a load.

use std::borrow::BorrowMut;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use myriad_graph::generate::Params;
use myriad_graph::DataDir;

fn myriad(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_myriad"));
    command.arg("graph").args(args);
    // The node's settings, which these commands also read.
    for setting in [
        "MYRIAD_DATA_DIR",
        "MYRIAD_GRAPH_CACHE_MB",
        "MYRIAD_MAX_FOLLOWING",
    ] {
        command.env_remove(setting);
    }
    command
}

/// Takes a `Command` or the `&mut Command` its builder methods answer.
fn run(mut command: impl BorrowMut<Command>) -> Output {
    command.borrow_mut().output().expect("run myriad graph")
}

/// Runs and expects success; answers stdout.
fn ok(mut command: impl BorrowMut<Command>) -> String {
    let out = run(command.borrow_mut());
    assert!(
        out.status.success(),
        "{:?}: {}\n{}",
        command.borrow_mut(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs and expects a refusal that says `reason` on stderr.
fn refused(mut command: impl BorrowMut<Command>, reason: &str) {
    let out = run(command.borrow_mut());
    assert!(
        !out.status.success(),
        "{:?} succeeded",
        command.borrow_mut()
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(reason), "{reason:?} not in {stderr}");
}

/// The number after `key: ` on its line of `text`.
fn field(text: &str, key: &str) -> u64 {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}: ")))
        .unwrap_or_else(|| panic!("no {key:?} in {text}"));
    line.split_whitespace().next().unwrap().parse().unwrap()
}

/// (users, edges) of the graph in `dir`, read by a fresh process.
fn totals(dir: &Path) -> (u64, u64) {
    let out = ok(myriad(&["stats", "--hubs", "0", "--data-dir", path(dir)]).arg("--cache-mb=1"));
    (field(&out, "users"), field(&out, "edges"))
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn generate(dir: &Path, users: u64, seed: u64) -> (PathBuf, u64) {
    let file = dir.join(format!("g{users}-{seed}.txt"));
    let users_text = users.to_string();
    let seed_text = seed.to_string();
    ok(myriad(&[
        "generate",
        "--users",
        &users_text,
        "--edges-per-node",
        "15",
        "--seed",
        &seed_text,
        "--out",
        path(&file),
    ]));
    let params = Params {
        users,
        edges_per_node: 15,
        seed,
    };
    (file, params.edge_count())
}

#[test]
fn generate_load_stats_and_probe_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let (file, edges) = generate(tmp.path(), 2_000, 9);
    let written = std::fs::read(&file).unwrap();
    let stdout = run(myriad(&[
        "generate",
        "--users",
        "2000",
        "--edges-per-node",
        "15",
        "--seed",
        "9",
    ]))
    .stdout;
    assert_eq!(stdout, written, "stdout and --out write the same bytes");
    assert!(
        written.starts_with(b"# myriad graph generate --users 2000 --edges-per-node 15 --seed 9")
    );

    let data = tmp.path().join("data");
    // The data directory also comes from MYRIAD_DATA_DIR.
    let loaded = ok(myriad(&["load", path(&file)]).env("MYRIAD_DATA_DIR", &data));
    assert_eq!(field(&loaded, "users added"), 2_000);
    assert_eq!(field(&loaded, "edges added"), edges);
    assert!(loaded.contains("database: "), "{loaded}");
    let again = ok(myriad(&["load", path(&file), "--data-dir", path(&data)]));
    assert_eq!(
        field(&again, "edges added"),
        0,
        "loading twice changes nothing"
    );
    assert_eq!(totals(&data), (2_000, edges));

    let stats = ok(myriad(&["stats", "--data-dir", path(&data)]));
    let hubs = stats
        .lines()
        .find_map(|l| l.strip_prefix("biggest hubs (followers): "))
        .unwrap();
    // "<id> (<followers>), …": the first is the biggest.
    let (hub, followers) = hubs.split(", ").next().unwrap().split_once(' ').unwrap();
    let followers: u64 = followers.trim_matches(['(', ')']).parse().unwrap();
    assert!(followers > 15 * 5, "a hub: {hubs}");
    let probe = ok(myriad(&[
        "probe",
        "--data-dir",
        path(&data),
        "--user",
        hub,
        "--runs",
        "3",
        "--page",
        "50",
    ]));
    assert!(
        probe.contains(&format!(
            "followers of user {hub}: {followers}, in pages of 50"
        )),
        "{probe}"
    );
    let p50 = probe
        .lines()
        .find_map(|l| l.strip_prefix("later reads (2): whole read p50 "))
        .unwrap_or_else(|| panic!("{probe}"));
    let p50: f64 = p50.split(' ').next().unwrap().parse().unwrap();
    assert!(p50 > 0.0, "a read takes some time: {probe}");
}

#[test]
fn a_malformed_file_names_its_line_and_loads_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let good = tmp.path().join("good.txt");
    std::fs::write(&good, "1 2\n3 2\n").unwrap();
    ok(myriad(&["load", path(&good), "--data-dir", path(&data)]));

    let bad = tmp.path().join("bad.txt");
    std::fs::write(&bad, "# header\n4 5\n6 7\n8 x\n9 10\n").unwrap();
    refused(
        myriad(&["load", path(&bad), "--data-dir", path(&data)]),
        "line 4: user id \"x\" is not a decimal integer",
    );
    assert_eq!(totals(&data), (3, 2), "nothing of the bad file");

    let self_follow = tmp.path().join("self.txt");
    std::fs::write(&self_follow, "4 5\n5 5\n").unwrap();
    refused(
        myriad(&["load", path(&self_follow), "--data-dir", path(&data)]),
        "line 2: user 5 follows itself",
    );
    assert_eq!(totals(&data), (3, 2));

    // Well formed, but past the following limit: refused whole too.
    let too_many = tmp.path().join("too_many.txt");
    std::fs::write(&too_many, "4 5\n4 6\n4 7\n8 9\n").unwrap();
    refused(
        myriad(&["load", path(&too_many), "--data-dir", path(&data)])
            .args(["--max-following", "2"]),
        "user 4 would follow more than 2 users",
    );
    assert_eq!(totals(&data), (3, 2));
}

#[test]
fn a_load_refuses_a_data_directory_in_use() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let file = tmp.path().join("g.txt");
    std::fs::write(&file, "1 2\n").unwrap();
    // What a running node holds.
    let held = DataDir::lock(&data).unwrap();
    refused(
        myriad(&["load", path(&file), "--data-dir", path(&data)]),
        "is in use by another process (pid ",
    );
    assert!(
        !data.join("graph.sqlite3").exists(),
        "the store not touched"
    );
    drop(held);
    ok(myriad(&["load", path(&file), "--data-dir", path(&data)]));
}

/// Starts a load and kills it with SIGKILL once its transaction has
/// written at least 1 MiB to the write-ahead log (so the kill lands inside
/// it). With a 1 MiB page cache the load spills to the WAL early.
fn kill_during_load(file: &Path, data: &Path) {
    let mut child = myriad(&[
        "load",
        path(file),
        "--data-dir",
        path(data),
        "--cache-mb",
        "1",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("; loading"), "{line}");
    let wal = data.join("graph.sqlite3-wal");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::metadata(&wal).map_or(0, |m| m.len()) < 1 << 20 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the load ended before its WAL reached 1 MiB"
        );
        assert!(Instant::now() < deadline, "the WAL never grew");
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn kill_9_during_a_load_leaves_all_of_it_or_none_and_keeps_what_was_there() {
    let tmp = tempfile::tempdir().unwrap();
    let (file, edges) = generate(tmp.path(), 100_000, 4);

    // Into an empty store (the bulk path that drops and rebuilds an index).
    let empty = tmp.path().join("empty");
    kill_during_load(&file, &empty);
    let after = totals(&empty);
    eprintln!("empty store after the kill: {after:?}");
    assert!(
        after == (0, 0) || after == (100_000, edges),
        "all or nothing, got {after:?}"
    );
    // The killed process's lock went with it; loading again completes.
    ok(myriad(&["load", path(&file), "--data-dir", path(&empty)]));
    assert_eq!(totals(&empty), (100_000, edges));

    // Into a store that already holds a graph (users the big one lacks).
    let held = tmp.path().join("held");
    let before_file = tmp.path().join("before.txt");
    std::fs::write(
        &before_file,
        "200001 200002\n200003 200002\n200002 200004\n",
    )
    .unwrap();
    ok(myriad(&[
        "load",
        path(&before_file),
        "--data-dir",
        path(&held),
    ]));
    kill_during_load(&file, &held);
    let after = totals(&held);
    eprintln!("store with a graph after the kill: {after:?}");
    assert!(
        after == (4, 3) || after == (100_004, edges + 3),
        "all or nothing, got {after:?}"
    );
    let out = ok(myriad(&[
        "probe",
        "--data-dir",
        path(&held),
        "--user",
        "200002",
        "--runs",
        "1",
    ]));
    assert!(out.contains("followers of user 200002: 2,"), "{out}");
}
