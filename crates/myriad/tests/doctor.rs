//! `myriad doctor` and the host checks at `serve`'s start, run as the real
//! binary. The host is whatever runs the tests, so these assert what holds
//! anywhere: the document's shape, and the open-file check under a limit
//! the test lowers for the child alone (no sysctl is touched).

mod common;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// `command` with its open-file limit (soft and hard) at `open_files`.
fn with_open_files(mut command: Command, open_files: u64) -> Command {
    // SAFETY: setrlimit is async-signal-safe, and the closure touches
    // nothing else between fork and exec.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: open_files,
                rlim_max: open_files,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command
}

fn doctor(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_myriad"));
    command.arg("doctor").args(args);
    command
}

fn run(mut command: Command) -> Output {
    command.output().expect("run myriad doctor")
}

/// One worker: the node keeps 32 + 5 + 64 + 128 + 1 descriptors.
const RESERVED_ONE_WORKER: u64 = 230;

/// Fails unless `value` (at `at`) conforms to `schema`. It knows the JSON
/// Schema keywords docs/doctor.schema.json uses and panics on any other,
/// so the schema cannot grow a rule this test would silently skip.
fn conforms(value: &Value, schema: &Value, at: &str) {
    for (keyword, rule) in schema.as_object().unwrap() {
        match keyword.as_str() {
            "$schema" | "title" | "description" => {}
            "type" => {
                let fits = match rule.as_str().unwrap() {
                    "object" => value.is_object(),
                    "array" => value.is_array(),
                    "string" => value.is_string(),
                    "integer" => value.is_u64() || value.is_i64(),
                    "boolean" => value.is_boolean(),
                    other => panic!("{at}: type {other} unknown to this test"),
                };
                assert!(fits, "{at}: {value} is not {rule}");
            }
            "required" => {
                for key in rule.as_array().unwrap() {
                    let key = key.as_str().unwrap();
                    assert!(value.get(key).is_some(), "{at}: no {key}");
                }
            }
            "additionalProperties" => {
                assert_eq!(rule, false, "{at}: only `false` is checked");
                let known = schema["properties"].as_object().unwrap();
                for key in value.as_object().unwrap().keys() {
                    assert!(known.contains_key(key), "{at}: {key} is not in the schema");
                }
            }
            "properties" => {
                for (key, sub) in rule.as_object().unwrap() {
                    if let Some(v) = value.get(key) {
                        conforms(v, sub, &format!("{at}.{key}"));
                    }
                }
            }
            "items" => {
                for (i, item) in value.as_array().unwrap().iter().enumerate() {
                    conforms(item, rule, &format!("{at}[{i}]"));
                }
            }
            "enum" => assert!(
                rule.as_array().unwrap().contains(value),
                "{at}: {value} not in {rule}"
            ),
            "minLength" => assert!(
                value.as_str().unwrap().chars().count() as u64 >= rule.as_u64().unwrap(),
                "{at}: {value} shorter than {rule}"
            ),
            "minimum" => assert!(
                value.as_u64().unwrap() >= rule.as_u64().unwrap(),
                "{at}: {value} under {rule}"
            ),
            other => panic!("{at}: keyword {other} unknown to this test"),
        }
    }
}

#[test]
fn the_schema_check_refuses_a_document_that_drifts() {
    let schema: Value =
        serde_json::from_str(include_str!("../../../docs/doctor.schema.json")).unwrap();
    let row = serde_json::json!({"name": "swap", "value": "none", "needs": "none",
        "verdict": "ok", "why": "w", "fix": "f"});
    let host = serde_json::json!({"connections": 1, "loopback": false, "sources": 1,
        "extra_files": 0, "extra_memory": 0, "queued_bytes": 2304, "memory_available": false});
    let target = serde_json::json!({"connections": 1, "workers": 1, "admin_max_connections": 1,
        "backlog": 1, "socket_send_buffer": 0, "max_outbound_bytes": 1, "history_max_bytes": 1,
        "host": host});
    conforms(
        &serde_json::json!({"target": target, "checks": [row]}),
        &schema,
        "$",
    );
    for (key, bad) in [
        ("verdict", serde_json::json!("maybe")),
        ("name", serde_json::json!("a row the schema does not list")),
        ("extra", serde_json::json!("x")),
        ("fix", serde_json::json!("")),
    ] {
        let mut row = row.clone();
        row[key] = bad;
        let doc = serde_json::json!({"target": target, "checks": [row]});
        let refused = std::panic::catch_unwind(|| conforms(&doc, &schema, "$")).is_err();
        assert!(refused, "{key} drifted and passed");
    }
    for (key, bad) in [
        ("loopback", serde_json::json!(1)),
        ("sources", serde_json::json!(0)),
    ] {
        let mut target = target.clone();
        target["host"][key] = bad;
        let doc = serde_json::json!({"target": target, "checks": [row]});
        let refused = std::panic::catch_unwind(|| conforms(&doc, &schema, "$")).is_err();
        assert!(refused, "host.{key} drifted and passed");
    }
}

#[test]
fn the_json_document_has_every_check_with_its_fields() {
    let out = run(doctor(&["--json", "--connections", "10", "--workers", "1"]));
    let doc: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(doc["target"]["connections"], 10);
    assert_eq!(doc["target"]["workers"], 1);
    let checks = doc["checks"].as_array().unwrap();
    let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "open files",
            "systemd LimitNOFILE",
            "fs.nr_open",
            "fs.file-max",
            "net.core.somaxconn",
            "net.ipv4.tcp_max_syn_backlog",
            "net.core.netdev_max_backlog",
            "net.ipv4.tcp_syncookies",
            "SO_REUSEPORT spread",
            "net.ipv4.tcp_mem",
            "tcp_wmem/tcp_rmem max",
            "memory",
            "net.ipv4.ip_local_port_range",
            "net.ipv4.tcp_tw_reuse",
            "nf_conntrack",
            "transparent huge pages",
            "swap",
        ]
    );
    let schema: Value = serde_json::from_str(include_str!("../../../docs/doctor.schema.json"))
        .expect("docs/doctor.schema.json is JSON");
    conforms(&doc, &schema, "$");
    let failed = checks.iter().any(|c| c["verdict"] == "fail");
    assert_eq!(
        out.status.success(),
        !failed,
        "exit status follows the fails"
    );
}

#[test]
fn a_low_open_file_limit_fails_with_its_fix_and_exit_status() {
    let out = run(with_open_files(
        doctor(&["--connections", "1000", "--workers", "1"]),
        300,
    ));
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{text}");
    let row = text
        .lines()
        .find(|l| l.starts_with("open files "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        row.contains("FAIL") && row.contains("soft 300, hard 300"),
        "{row}"
    );
    let need = 1_000 + RESERVED_ONE_WORKER;
    assert!(text.contains(&format!("ulimit -Hn {need}")), "{text}");
}

#[test]
fn the_configured_max_connections_is_the_default_target() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("myriad.toml");
    std::fs::write(&file, "max_connections = 1234\nworkers = 1\n").unwrap();
    let out = run(doctor(&["--json", "--config", file.to_str().unwrap()]));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["target"]["connections"], 1234);
}

/// `myriad serve` with `extra` under a 300-descriptor limit and asks for
/// 1,000 connections; returns whether it came up, and its log.
fn serve_with_few_files(extra: &[&str]) -> (bool, String) {
    let mut command = with_open_files(common::serve_command(), 300);
    let data = tempfile::tempdir().unwrap();
    let mut child = command
        .args(["--workers", "1", "--max-connections", "1000", "--data-dir"])
        .arg(data.path())
        .args(extra)
        .env("MYRIAD_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start myriad");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let listening = line.contains("\"listening\"");
    if listening {
        child.kill().unwrap();
    }
    let status = child.wait().unwrap();
    assert_eq!(
        listening,
        status.code().is_none(),
        "killed only if it started"
    );
    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    (listening, log)
}

#[test]
fn serve_warns_of_a_failed_check_and_starts() {
    let (listening, log) = serve_with_few_files(&[]);
    assert!(listening, "{log}");
    let warning = log
        .lines()
        .find(|l| l.contains("host check open files failed"))
        .unwrap_or_else(|| panic!("no warning for open files in {log}"));
    assert!(warning.contains("WARN"), "{warning}");
}

#[test]
fn strict_host_checks_refuse_to_start_naming_the_checks() {
    let (listening, log) = serve_with_few_files(&["--strict-host-checks"]);
    assert!(!listening, "{log}");
    let error = log
        .lines()
        .find(|l| l.starts_with("myriad: host checks failed:"))
        .unwrap_or_else(|| panic!("no refusal in {log}"));
    assert!(error.contains("open files"), "{error}");
    assert!(error.contains("strict_host_checks"), "{error}");
}

#[test]
fn a_unit_systemd_cannot_show_warns_and_is_named() {
    let unit = "myriad-doctor-test-absent.service";
    let doc = small_node_json(&["--unit", unit]);
    let row = row(&doc, "systemd LimitNOFILE");
    // Without systemd, or with no such unit, systemd cannot say: a warning
    // naming the unit, never a silent pass.
    assert_eq!(row["verdict"], "warn", "{row}");
    assert_eq!(row["value"], "unknown", "{row}");
    assert!(row["needs"].as_str().unwrap().contains(unit), "{row}");
}

/// `myriad doctor --json` for a one-worker node of 10 connections, with
/// `extra` flags.
fn small_node_json(extra: &[&str]) -> Value {
    let mut args = vec!["--json", "--connections", "10", "--workers", "1"];
    args.extend_from_slice(extra);
    let out = run(doctor(&args));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// The row named `name` of a `--json` document.
fn row<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no row {name} in {doc}"))
}

#[test]
fn the_host_flags_reach_the_shared_rows_and_the_document() {
    let doc = small_node_json(&[
        "--host-connections",
        "1000",
        "--loopback",
        "--sources",
        "3",
        "--extra-files",
        "7",
        "--extra-memory",
        "1048576",
        "--queued-bytes",
        "512",
        "--memory-available",
    ]);
    let schema: Value =
        serde_json::from_str(include_str!("../../../docs/doctor.schema.json")).unwrap();
    conforms(&doc, &schema, "$");
    assert_eq!(
        doc["target"]["host"],
        serde_json::json!({"connections": 1000, "loopback": true, "sources": 3,
            "extra_files": 7, "extra_memory": 1048576, "queued_bytes": 512,
            "memory_available": true})
    );
    let needs = |name| row(&doc, name)["needs"].as_str().unwrap().to_owned();
    assert!(
        needs("net.ipv4.tcp_mem").contains("(1,000 x 512 B queued)"),
        "{doc}"
    );
    assert!(
        needs("net.ipv4.ip_local_port_range").ends_with("the clients have 3"),
        "{doc}"
    );
    assert!(needs("memory").contains("other processes 1.0 MiB"), "{doc}");
    assert!(
        row(&doc, "memory")["value"]
            .as_str()
            .unwrap()
            .starts_with("MemAvailable "),
        "{doc}"
    );
}

#[test]
fn clients_here_with_too_few_sources_fail_the_port_row() {
    // Ten million connections to one address need hundreds of sources
    // whatever the port range: the row fails, and so does the exit status.
    let out = run(doctor(&[
        "--json",
        "--connections",
        "10000000",
        "--workers",
        "1",
        "--loopback",
    ]));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ports = row(&doc, "net.ipv4.ip_local_port_range");
    assert_eq!(ports["verdict"], "fail", "{ports}");
    assert!(
        ports["fix"]
            .as_str()
            .unwrap()
            .starts_with("sysctl -w net.ipv4.ip_local_port_range='1024 65535' (621 source"),
        "{ports}"
    );
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn fewer_host_connections_than_the_nodes_own_are_refused() {
    let out = run(doctor(&[
        "--connections",
        "100",
        "--host-connections",
        "99",
        "--workers",
        "1",
    ]));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("--host-connections"), "{err}");
    // Source addresses are the clients' here: without --loopback there
    // are none to count.
    let out = run(doctor(&["--connections", "100", "--sources", "3"]));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("--loopback"), "{err}");
}
