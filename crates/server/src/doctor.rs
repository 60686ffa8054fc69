//! The host, judged against what a node is set up to hold: `myriad doctor`
//! prints it, and `serve` logs it at start (refusing to start on a failed
//! check with `strict_host_checks`).
//!
//! Each check reads one thing from the host (a sysctl, a process limit, a
//! line of `/proc/meminfo`), says what the target number of connections
//! needs of it, gives a verdict, one line on why it matters, and the exact
//! command that fixes it. The rows of what the whole box shares (files,
//! `tcp_mem`, memory, ports, conntrack) judge [`HostLoad`], everything the
//! deployment puts on this host, so a run of several nodes and their load
//! generators on one box (`scripts/scale.py`) asks the doctor rather than
//! keeping a copy of its checks. Every read goes through [`Host`] (the
//! `myriad-host` crate, which the bench plans with too), whose root, limits
//! and spread probe tests replace with a temporary tree and fakes. This
//! module must not change the host: it only reads and advises.

use std::io;

pub use myriad_host::{Host, Unit};
use serde::Serialize;

use crate::config::Config;
use crate::fds;

mod files;
mod memory;
mod network;

use files::open_files;
use memory::{memory, paging};
pub use network::probe_spread;
use network::{accept_path, conntrack, ports, spread};

/// Kernel memory of one idle loopback connection, both ends (~4.1 KB the
/// server's socket, ~4.3 KB the client's), measured with a bare C program
/// on this kind of box (docs/limits.md, docs/benchmarks.md). Counted
/// whole because load tests put both ends on the node's host.
pub const KERNEL_BYTES_PER_CONNECTION: u64 = 8_400;

/// TCP bytes one connection queues at the peak of a node alone, which
/// `tcp_mem` counts: a broadcast puts one small message in every socket at
/// once, and a small loopback skb's truesize is ~2.3 KB (docs/benchmarks.md,
/// "The million"). `tcp_mem` counts only queued data, never the sockets'
/// own kernel memory (`KERNEL_BYTES_PER_CONNECTION`, which the memory row
/// counts), so idle connections alone never fill it.
pub const QUEUED_BYTES_PER_CONNECTION: u64 = 2_304;

/// The node's resident memory per idle subscribed connection, rounded up
/// from the ~371-421 B measured (docs/benchmarks.md).
pub const USERLAND_BYTES_PER_CONNECTION: u64 = 512;

/// The kernel's default `netdev_max_backlog`: packets queued per core
/// before the network stack takes them, SYNs of a loopback burst included.
const NETDEV_BACKLOG_DEFAULT: u64 = 1_000;

/// Ports of the widest range the fixes advise, 1024-65535: the ports
/// below 1024 are for services.
const WIDEST_PORT_RANGE: u64 = 65_535 - 1_024 + 1;

/// Connections the `SO_REUSEPORT` probe makes per listener: with an even
/// hash a listener falls under a quarter of its share by chance about
/// eight standard deviations out at two workers.
const SPREAD_PROBE_PER_LISTENER: usize = 64;

/// Listeners the probe binds at most, however many workers are set: 4,096
/// short-lived loopback connections bound its cost.
const SPREAD_PROBE_MOST_LISTENERS: usize = 64;

/// This host with the node's own spread probe, under the systemd unit
/// `unit` (the one this process runs in when `None`).
pub fn real_host(unit: Option<&str>) -> Host {
    Host::real(unit, probe_spread)
}

/// What the node is set up to hold: the target and the settings that size
/// what it needs of the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Target {
    /// Client connections this node holds: its own rows (open files,
    /// `fs.nr_open`) and the ports towards its address judge it.
    pub connections: u64,
    pub workers: usize,
    pub admin_max_connections: usize,
    pub backlog: u32,
    pub socket_send_buffer: u64,
    pub max_outbound_bytes: u64,
    pub history_max_bytes: u64,
    /// What the whole host holds with it.
    pub host: HostLoad,
}

/// What the whole host holds for the deployment, which the rows of limits
/// the box shares judge (`fs.file-max`, `tcp_mem`, memory, the port range,
/// conntrack). [`HostLoad::alone`] is a node alone on its host, with its
/// clients elsewhere: what `serve` checks at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HostLoad {
    /// Client connections every node on this host holds in all.
    pub connections: u64,
    /// Whether those connections' clients run on this host too: each
    /// connection is then two files here, and its client end takes an
    /// ephemeral port of this host's.
    pub loopback: bool,
    /// Source addresses the clients here connect from (with `loopback`);
    /// each (source, node address) pair has its own ports.
    pub sources: u64,
    /// Files the deployment's other processes here keep besides their
    /// connections (other nodes' own share, load generators, Redis).
    pub extra_files: u64,
    /// Userland memory of the deployment's other processes here.
    pub extra_memory: u64,
    /// TCP bytes one connection queues at the peak, which `tcp_mem`
    /// counts. By default the kernel cost of an idle loopback pair
    /// ([`KERNEL_BYTES_PER_CONNECTION`]): an upper bound for idle
    /// connections, which queue next to nothing; a load test that knows
    /// its shape gives its own figure.
    pub queued_bytes: u64,
    /// Judge memory against what running processes leave now
    /// (`MemAvailable`) instead of `MemTotal`: for a run about to start
    /// beside them, not a host sized for the node.
    pub memory_available: bool,
}

impl HostLoad {
    /// A node holding `connections` alone on its host.
    pub const fn alone(connections: u64) -> HostLoad {
        HostLoad {
            connections,
            loopback: false,
            sources: 1,
            extra_files: 0,
            extra_memory: 0,
            queued_bytes: QUEUED_BYTES_PER_CONNECTION,
            memory_available: false,
        }
    }

    /// Files of the deployment's connections on this host: one per
    /// connection, two when the clients are here too.
    fn connection_files(&self) -> u64 {
        let ends = if self.loopback { 2 } else { 1 };
        self.connections.saturating_mul(ends)
    }
}

impl Target {
    /// `config`'s node holding `connections` (its `max_connections` when
    /// `None`).
    pub fn from_config(config: &Config, connections: Option<u64>) -> Target {
        let wide = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        let connections = connections.unwrap_or(wide(config.max_connections));
        Target {
            connections,
            workers: config.worker_count(),
            admin_max_connections: config.admin_max_connections,
            backlog: config.backlog,
            socket_send_buffer: wide(config.socket_send_buffer),
            max_outbound_bytes: wide(config.max_outbound_bytes),
            history_max_bytes: wide(config.history_max_bytes),
            host: HostLoad::alone(connections),
        }
    }

    /// Descriptors one process needs: the connections and the node's own
    /// share (see [`fds::reserved`]).
    fn files(&self) -> u64 {
        self.connections
            .saturating_add(fds::reserved(self.workers, self.admin_max_connections))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    Warn,
    Fail,
}

/// One check: what the host has, what the target needs, the verdict, why
/// it matters and the command that fixes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub value: String,
    pub needs: String,
    pub verdict: Verdict,
    pub why: &'static str,
    pub fix: String,
}

/// Every check for one target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub target: Target,
    pub checks: Vec<Check>,
}

impl Report {
    pub fn failed(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| c.verdict == Verdict::Fail)
    }

    /// The table `myriad doctor` prints: one row per check, then why and
    /// the fix under each check that is not ok.
    pub fn to_text(&self) -> String {
        let count = |v| self.checks.iter().filter(|c| c.verdict == v).count();
        let mut out = format!(
            "myriad doctor: this host for {} connections ({} workers): {} ok, {} warn, {} fail\n\n",
            thousands(self.target.connections),
            self.target.workers,
            count(Verdict::Ok),
            count(Verdict::Warn),
            count(Verdict::Fail),
        );
        let host = &self.target.host;
        if *host != HostLoad::alone(self.target.connections) {
            out.insert_str(
                out.len() - 1,
                &format!(
                    "the host holds {} connections in all{}\n",
                    thousands(host.connections),
                    if host.loopback {
                        ", their clients here too"
                    } else {
                        ""
                    }
                ),
            );
        }
        let width = |f: fn(&Check) -> usize, title: &str| {
            self.checks
                .iter()
                .map(f)
                .max()
                .unwrap_or(0)
                .max(title.len())
        };
        let name_w = width(|c| c.name.len(), "check");
        let value_w = width(|c| c.value.len(), "value");
        out.push_str(&format!(
            "{:<name_w$}  {:<7} {:<value_w$}  needs\n",
            "check", "verdict", "value"
        ));
        for c in &self.checks {
            let verdict = match c.verdict {
                Verdict::Ok => "ok",
                Verdict::Warn => "WARN",
                Verdict::Fail => "FAIL",
            };
            out.push_str(&format!(
                "{:<name_w$}  {verdict:<7} {:<value_w$}  {}\n",
                c.name, c.value, c.needs
            ));
        }
        for c in self.checks.iter().filter(|c| c.verdict != Verdict::Ok) {
            out.push_str(&format!(
                "\n{}:\n  why: {}\n  fix: {}\n",
                c.name, c.why, c.fix
            ));
        }
        out
    }
}

/// Runs every check of `host` against `target`.
pub fn examine(host: &Host, target: &Target) -> Report {
    let mut checks = Vec::new();
    open_files(host, target, &mut checks);
    accept_path(host, target, &mut checks);
    spread(host, target, &mut checks);
    memory(host, target, &mut checks);
    ports(host, target, &mut checks);
    conntrack(host, target, &mut checks);
    paging(host, &mut checks);
    Report {
        target: *target,
        checks,
    }
}

/// A check whose value could not be read: a warning, never silence.
fn unknown(name: &'static str, what: &str, why: &'static str) -> Check {
    Check {
        name,
        value: "unknown".into(),
        needs: format!("readable {what}"),
        verdict: Verdict::Warn,
        why,
        fix: format!("run where {what} is readable (not in a sandbox that hides /proc)"),
    }
}

/// The bracketed choice of a sysfs setting: "always [madvise] never".
fn selected(text: &str) -> Option<&str> {
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(&text[start..end])
}

/// 1234567 as "1,234,567".
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes in the largest binary unit that keeps a number >= 1.
fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// The checks at `serve`'s start: one warning per check that is not ok,
/// and the names of those that failed.
pub fn at_start(config: &Config) -> Vec<&'static str> {
    let report = examine(&real_host(None), &Target::from_config(config, None));
    for c in report.checks.iter().filter(|c| c.verdict != Verdict::Ok) {
        tracing::warn!(
            value = %c.value,
            needs = %c.needs,
            fix = %c.fix,
            "host check {} {}: {}",
            c.name,
            if c.verdict == Verdict::Fail {
                "failed"
            } else {
                "warns"
            },
            c.why
        );
    }
    report.failed().map(|c| c.name).collect()
}

#[cfg(test)]
mod tests;
