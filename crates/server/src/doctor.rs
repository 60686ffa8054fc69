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
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

pub use myriad_host::{Host, Unit};
use serde::Serialize;

use crate::config::Config;
use crate::fds;
use crate::listener::{self, ListenOptions};

/// Kernel memory of one idle loopback connection, both ends (~4.1 KB the
/// server's socket, ~4.3 KB the client's), measured with a bare C program
/// on this kind of box (docs/limits.md, docs/benchmarks.md). Counted
/// whole because load tests put both ends on the node's host.
pub const KERNEL_BYTES_PER_CONNECTION: u64 = 8_400;

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

/// Binds `n` `SO_REUSEPORT` listeners (at most
/// [`SPREAD_PROBE_MOST_LISTENERS`]) on a loopback port the way the node
/// binds its own, connects [`SPREAD_PROBE_PER_LISTENER`] per listener, and
/// counts what each accepted. Everything is closed on return.
pub fn probe_spread(n: usize) -> io::Result<Vec<u64>> {
    let n = n.clamp(1, SPREAD_PROBE_MOST_LISTENERS);
    let count = SPREAD_PROBE_PER_LISTENER * n;
    let any: SocketAddr = ([127, 0, 0, 1], 0).into();
    let listeners = listener::bind_reuseport(
        any,
        n,
        ListenOptions {
            backlog: u32::try_from(count).unwrap_or(u32::MAX),
            send_buffer: 0,
        },
    )?;
    let addr = listeners[0].local_addr()?;
    let mut taken = vec![0u64; n];
    let drain = |taken: &mut [u64]| -> io::Result<()> {
        for (listener, taken) in listeners.iter().zip(taken.iter_mut()) {
            loop {
                match listener.accept() {
                    Ok(_) => *taken += 1,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    };
    // Accepted as they come, so a small somaxconn never stalls a connect
    // on a SYN retransmit.
    let mut clients = Vec::with_capacity(count);
    for i in 0..count {
        clients.push(TcpStream::connect(addr)?);
        if i % 16 == 15 {
            drain(&mut taken)?;
        }
    }
    // The last handshakes may still be on their way to an accept queue.
    let deadline = Instant::now() + Duration::from_secs(1);
    drain(&mut taken)?;
    while taken.iter().sum::<u64>() < count as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
        drain(&mut taken)?;
    }
    Ok(taken)
}

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
            queued_bytes: KERNEL_BYTES_PER_CONNECTION,
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

fn open_files(host: &Host, target: &Target, out: &mut Vec<Check>) {
    let need = target.files();
    let reserved = fds::reserved(target.workers, target.admin_max_connections);
    let how = match &host.unit {
        Some(unit) => format!(
            "systemctl edit {}: [Service] LimitNOFILE={need}, then restart it",
            unit.name
        ),
        None => format!(
            "ulimit -Hn {need} && ulimit -n {need} in the shell that starts the node \
             (under systemd: LimitNOFILE={need} in the unit's [Service])"
        ),
    };
    const WHY: &str = "every connection is a descriptor: past the limit accept fails (EMFILE) \
                       and the node answers 503 at its share of it";
    match host.open_files {
        None => out.push(unknown("open files", "getrlimit(RLIMIT_NOFILE)", WHY)),
        Some((soft, hard)) => {
            let nodes = target
                .connections
                .div_ceil(hard.saturating_sub(reserved).max(1));
            let fix = if nodes > 1 {
                format!("{how}; or run {nodes} nodes (ports or 127.0.0.x addresses of their own)")
            } else {
                how
            };
            out.push(Check {
                name: "open files",
                value: format!("soft {}, hard {}", thousands(soft), thousands(hard)),
                // The node raises its soft limit to the hard one itself.
                needs: format!(
                    "hard >= {} ({} connections + {} the node keeps)",
                    thousands(need),
                    thousands(target.connections),
                    reserved
                ),
                verdict: if hard >= need {
                    Verdict::Ok
                } else {
                    Verdict::Fail
                },
                why: WHY,
                fix,
            });
        }
    }
    unit_files(host, need, out);
    const WHY_NR: &str = "no process's open-file limit may pass it, whatever ulimit or systemd ask";
    match host.number("proc/sys/fs/nr_open") {
        None => out.push(unknown("fs.nr_open", "/proc/sys/fs/nr_open", WHY_NR)),
        Some(nr_open) => out.push(Check {
            name: "fs.nr_open",
            value: thousands(nr_open),
            needs: format!(">= {}", thousands(need)),
            verdict: if nr_open >= need {
                Verdict::Ok
            } else {
                Verdict::Fail
            },
            why: WHY_NR,
            fix: format!("sysctl -w fs.nr_open={need}"),
        }),
    }
    const WHY_MAX: &str =
        "every process's files share it: past it any open() on the box fails (ENFILE)";
    match host.number("proc/sys/fs/file-max") {
        None => out.push(unknown("fs.file-max", "/proc/sys/fs/file-max", WHY_MAX)),
        Some(file_max) => {
            let open = host.number("proc/sys/fs/file-nr").unwrap_or(0);
            // The box's files: this node's own share, and every file of
            // the deployment's connections and other processes here.
            let run = reserved
                .saturating_add(target.host.connection_files())
                .saturating_add(target.host.extra_files);
            let total = open.saturating_add(run);
            out.push(Check {
                name: "fs.file-max",
                value: format!("{} ({} open now)", thousands(file_max), thousands(open)),
                needs: format!(">= {}", thousands(total)),
                verdict: if file_max >= total {
                    Verdict::Ok
                } else {
                    Verdict::Fail
                },
                why: WHY_MAX,
                fix: format!("sysctl -w fs.file-max={}", total.saturating_mul(2)),
            });
        }
    }
}

/// The limit systemd gives the node's unit: what the node gets when it runs
/// there, whatever the shell that runs the doctor has.
fn unit_files(host: &Host, need: u64, out: &mut Vec<Check>) {
    const NAME: &str = "systemd LimitNOFILE";
    const WHY: &str = "a node run by systemd gets the unit's LimitNOFILE, not the shell's ulimit \
                       (systemd's default hard limit is 524,288, soft 1,024)";
    let Some(unit) = &host.unit else {
        out.push(Check {
            name: NAME,
            value: "not under systemd".into(),
            needs: format!(
                "LimitNOFILE >= {} in a unit that runs the node",
                thousands(need)
            ),
            verdict: Verdict::Ok,
            why: WHY,
            fix: format!(
                "myriad doctor --unit NAME checks a unit; in it: [Service] LimitNOFILE={need}"
            ),
        });
        return;
    };
    let Some((soft, hard)) = unit.open_files else {
        out.push(unknown(
            NAME,
            &format!("`systemctl show {}` (a loaded unit)", unit.name),
            WHY,
        ));
        return;
    };
    out.push(Check {
        name: NAME,
        value: format!(
            "{}: soft {}, hard {}",
            unit.name,
            thousands(soft),
            thousands(hard)
        ),
        // As with the process's limit, the node raises soft to hard.
        needs: format!("hard >= {}", thousands(need)),
        verdict: if hard >= need {
            Verdict::Ok
        } else {
            Verdict::Fail
        },
        why: WHY,
        fix: format!(
            "systemctl edit {}: [Service] LimitNOFILE={need}, then systemctl restart {}",
            unit.name, unit.name
        ),
    });
}

fn accept_path(host: &Host, target: &Target, out: &mut Vec<Check>) {
    let backlog = u64::from(target.backlog);
    // Both queues cut the node's backlog silently: a burst past them waits
    // for SYN retransmits (1 s, then 3 s) instead of being accepted.
    for (name, path, why) in [
        (
            "net.core.somaxconn",
            "proc/sys/net/core/somaxconn",
            "the kernel silently cuts each listener's backlog to it; a burst past it waits \
             for SYN retransmits (1 s, 3 s)",
        ),
        (
            "net.ipv4.tcp_max_syn_backlog",
            "proc/sys/net/ipv4/tcp_max_syn_backlog",
            "half-open connections per listener past it are dropped (or answered with syncookies)",
        ),
    ] {
        match host.number(path) {
            None => out.push(unknown(name, path, why)),
            Some(value) => out.push(Check {
                name,
                value: thousands(value),
                needs: format!(">= {} (backlog)", thousands(backlog)),
                verdict: if value >= backlog {
                    Verdict::Ok
                } else {
                    Verdict::Warn
                },
                why,
                fix: format!("sysctl -w {name}={backlog} (or lower the node's backlog to {value})"),
            }),
        }
    }
    const WHY_NETDEV: &str =
        "packets a core queues before the stack takes them; a loopback SYN burst lands here first";
    match host.number("proc/sys/net/core/netdev_max_backlog") {
        None => out.push(unknown(
            "net.core.netdev_max_backlog",
            "/proc/sys/net/core/netdev_max_backlog",
            WHY_NETDEV,
        )),
        Some(value) => out.push(Check {
            name: "net.core.netdev_max_backlog",
            value: thousands(value),
            needs: format!(">= {}", thousands(NETDEV_BACKLOG_DEFAULT)),
            verdict: if value >= NETDEV_BACKLOG_DEFAULT {
                Verdict::Ok
            } else {
                Verdict::Warn
            },
            why: WHY_NETDEV,
            fix: format!("sysctl -w net.core.netdev_max_backlog={NETDEV_BACKLOG_DEFAULT}"),
        }),
    }
    const WHY_COOKIES: &str =
        "with them a SYN flood past tcp_max_syn_backlog still lets real clients in";
    match host.number("proc/sys/net/ipv4/tcp_syncookies") {
        None => out.push(unknown(
            "net.ipv4.tcp_syncookies",
            "/proc/sys/net/ipv4/tcp_syncookies",
            WHY_COOKIES,
        )),
        Some(value) => out.push(Check {
            name: "net.ipv4.tcp_syncookies",
            value: value.to_string(),
            needs: "1".into(),
            verdict: if value >= 1 {
                Verdict::Ok
            } else {
                Verdict::Warn
            },
            why: WHY_COOKIES,
            fix: "sysctl -w net.ipv4.tcp_syncookies=1".into(),
        }),
    }
}

/// Whether the kernel shares a burst of connections across the workers'
/// `SO_REUSEPORT` listeners: it hashes each connection's addresses and
/// ports to one listener, and a worker holds what its listener accepted.
fn spread(host: &Host, target: &Target, out: &mut Vec<Check>) {
    const NAME: &str = "SO_REUSEPORT spread";
    const WHY: &str = "each worker accepts only from its own listener: a skewed spread leaves one \
                       worker holding most connections while the others idle";
    if target.workers <= 1 {
        out.push(Check {
            name: NAME,
            value: "1 worker, one listener".into(),
            needs: "nothing to spread".into(),
            verdict: Verdict::Ok,
            why: WHY,
            fix: "nothing to do".into(),
        });
        return;
    }
    let shares = match (host.spread)(target.workers) {
        Ok(shares) if !shares.is_empty() => shares,
        Ok(_) => Vec::new(),
        Err(e) => {
            out.push(Check {
                name: NAME,
                value: format!("probe failed: {e}"),
                needs: format!(
                    "{} loopback listeners on one port, connections spread across them",
                    target.workers
                ),
                verdict: Verdict::Warn,
                why: WHY,
                fix: "run where loopback sockets can be bound and connected (the node binds \
                      its listeners the same way)"
                    .into(),
            });
            return;
        }
    };
    let total: u64 = shares.iter().sum();
    let even = total / (shares.len().max(1) as u64);
    let least = shares.iter().copied().min().unwrap_or(0);
    let list = shares
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join("/");
    out.push(Check {
        name: NAME,
        value: format!(
            "{total} probe connections over {} listeners: {list}",
            shares.len()
        ),
        needs: format!(
            "every listener >= a quarter of an even share ({})",
            even / 4
        ),
        verdict: if total > 0 && least.saturating_mul(4) >= even {
            Verdict::Ok
        } else {
            Verdict::Warn
        },
        why: WHY,
        fix: "remove any SO_ATTACH_REUSEPORT_CBPF/EBPF program steering the port, or run \
              --workers 1"
            .into(),
    });
}

fn memory(host: &Host, target: &Target, out: &mut Vec<Check>) {
    let load = &target.host;
    let kernel = load.connections.saturating_mul(KERNEL_BYTES_PER_CONNECTION);
    const WHY_TCP_MEM: &str = "all TCP sockets on the box share it; past the pressure mark the \
                               kernel shrinks buffers, past the max it drops data on every connection";
    match host.numbers("proc/sys/net/ipv4/tcp_mem").as_deref() {
        Some(&[low, pressure, max]) => {
            let bytes = |pages: u64| pages.saturating_mul(host.page_size);
            // What sockets queue now counts against the same pages.
            let in_use = bytes(sockstat_tcp(host, "mem").unwrap_or(0));
            let queued = load.connections.saturating_mul(load.queued_bytes);
            let need = in_use.saturating_add(queued);
            let pages = need.div_ceil(host.page_size.max(1));
            let each = if load.queued_bytes == KERNEL_BYTES_PER_CONNECTION {
                "~8.4 KB per idle loopback pair".to_owned()
            } else {
                format!("{} queued", size(load.queued_bytes))
            };
            out.push(Check {
                name: "net.ipv4.tcp_mem",
                value: format!(
                    "pressure {}, max {}; {} in use",
                    size(bytes(pressure)),
                    size(bytes(max)),
                    size(in_use)
                ),
                needs: format!(
                    "max > {} ({} x {each})",
                    size(need),
                    thousands(load.connections)
                ),
                verdict: if need > bytes(max) {
                    Verdict::Fail
                } else if need > bytes(pressure) {
                    Verdict::Warn
                } else {
                    Verdict::Ok
                },
                why: WHY_TCP_MEM,
                // Pressure at 3/4 of the max, as the kernel's own defaults
                // keep them, with the max a quarter above the need; never
                // below what is set, so a warning's fix lowers nothing.
                fix: {
                    let top = (pages.saturating_mul(5) / 4).max(max);
                    format!(
                        "sysctl -w net.ipv4.tcp_mem='{} {} {}'",
                        low,
                        (top * 3 / 4).max(pressure),
                        top
                    )
                },
            });
        }
        _ => out.push(unknown(
            "net.ipv4.tcp_mem",
            "/proc/sys/net/ipv4/tcp_mem",
            WHY_TCP_MEM,
        )),
    }
    // A reader that stops reading pins its socket's send buffer: the
    // kernel doubles SO_SNDBUF for its bookkeeping; without one it
    // autotunes up to tcp_wmem's max.
    const WHY_WMEM: &str = "what one stalled reader pins in kernel memory; enough of them starve \
                            tcp_mem for every connection";
    let wmem = host.numbers("proc/sys/net/ipv4/tcp_wmem");
    let rmem = host.numbers("proc/sys/net/ipv4/tcp_rmem");
    let tcp_max = host
        .numbers("proc/sys/net/ipv4/tcp_mem")
        .and_then(|v| v.get(2).copied())
        .map(|p| p.saturating_mul(host.page_size));
    match (wmem.as_deref(), rmem.as_deref()) {
        (Some(&[_, _, wmax]), Some(&[_, _, rmax])) => {
            let pinned = if target.socket_send_buffer > 0 {
                target.socket_send_buffer.saturating_mul(2)
            } else {
                wmax
            };
            let starving = tcp_max.map(|m| m / pinned.max(1));
            out.push(Check {
                name: "tcp_wmem/tcp_rmem max",
                value: format!("wmem {}, rmem {}", size(wmax), size(rmax)),
                needs: format!(
                    "socket_send_buffer > 0: a stalled reader pins {}{}",
                    size(pinned),
                    starving
                        .map(|n| format!(", {} of them fill tcp_mem", thousands(n)))
                        .unwrap_or_default()
                ),
                verdict: if target.socket_send_buffer > 0 {
                    Verdict::Ok
                } else {
                    Verdict::Warn
                },
                why: WHY_WMEM,
                fix: "set socket_send_buffer = 65536 (the default), or \
                      sysctl -w net.ipv4.tcp_wmem='4096 16384 262144'"
                    .into(),
            });
        }
        _ => out.push(unknown(
            "tcp_wmem/tcp_rmem max",
            "/proc/sys/net/ipv4/tcp_wmem and tcp_rmem",
            WHY_WMEM,
        )),
    }
    const WHY_MEM: &str = "kernel sockets, connections and history must fit in RAM; past it the \
                           OOM killer ends the node";
    let field = if load.memory_available {
        "MemAvailable"
    } else {
        "MemTotal"
    };
    match host.meminfo(field) {
        None => out.push(unknown("memory", "/proc/meminfo", WHY_MEM)),
        Some(budget) => {
            let userland = load
                .connections
                .saturating_mul(USERLAND_BYTES_PER_CONNECTION);
            let need = kernel
                .saturating_add(userland)
                .saturating_add(target.history_max_bytes)
                .saturating_add(load.extra_memory);
            // Outbound queues hold handles to frames shared with history
            // and other queues, so their bound is shown, not added: every
            // queue full of distinct bytes is the worst case, not the rule.
            let outbound = load.connections.saturating_mul(target.max_outbound_bytes);
            let others = if load.extra_memory > 0 {
                format!(" + other processes {}", size(load.extra_memory))
            } else {
                String::new()
            };
            // Connections that fit: all but history grows with them (the
            // other processes' share too: a load generator's does).
            let growing = need.saturating_sub(target.history_max_bytes).max(1);
            let fit = u128::from(budget.saturating_sub(target.history_max_bytes))
                * u128::from(load.connections)
                / u128::from(growing);
            let fit = u64::try_from(fit).unwrap_or(u64::MAX);
            let room = if load.memory_available {
                format!("free memory ({} available now)", size(budget))
            } else {
                format!("a host with more than {} of RAM", size(need / 3 * 4))
            };
            out.push(Check {
                name: "memory",
                value: format!("{field} {}", size(budget)),
                needs: format!(
                    "> {} (kernel {} + node {} + history_max_bytes {}{others}; queues up to {} \
                     if every one is full)",
                    size(need),
                    size(kernel),
                    size(userland),
                    size(target.history_max_bytes),
                    size(outbound)
                ),
                verdict: if need > budget {
                    Verdict::Fail
                } else if need > budget / 4 * 3 {
                    Verdict::Warn
                } else {
                    Verdict::Ok
                },
                why: WHY_MEM,
                fix: format!(
                    "{room}, fewer connections per host (about {} fit), or a lower \
                     history_max_bytes",
                    thousands(fit)
                ),
            });
        }
    }
}

fn ports(host: &Host, target: &Target, out: &mut Vec<Check>) {
    const WHY_RANGE: &str = "clients on one host get this many ports per (source IP, node \
                             address, port); load tests need more source addresses past it";
    match host.port_range() {
        Some((low, high)) if target.host.loopback => {
            out.push(loopback_ports(target, low, high, WHY_RANGE));
        }
        Some((low, high)) => {
            let ports = high - low + 1;
            let sources = target.connections.div_ceil(ports);
            out.push(Check {
                name: "net.ipv4.ip_local_port_range",
                value: format!("{low}-{high} ({} ports)", thousands(ports)),
                needs: if sources <= 1 {
                    format!(
                        ">= {} ports from one client address",
                        thousands(target.connections)
                    )
                } else {
                    format!(
                        ">= {} ports, or clients from {sources} addresses (127.0.0.1-{sources})",
                        thousands(target.connections)
                    )
                },
                verdict: if sources <= 1 {
                    Verdict::Ok
                } else {
                    Verdict::Warn
                },
                why: WHY_RANGE,
                fix: format!(
                    "sysctl -w net.ipv4.ip_local_port_range='1024 65535', and spread load-test \
                     clients over {} source addresses",
                    target.connections.div_ceil(WIDEST_PORT_RANGE)
                ),
            });
        }
        _ => out.push(unknown(
            "net.ipv4.ip_local_port_range",
            "/proc/sys/net/ipv4/ip_local_port_range",
            WHY_RANGE,
        )),
    }
    const WHY_TW: &str =
        "a client host that reconnects fast keeps its ports in TIME_WAIT for 60 s \
                          unless it may reuse them";
    match host.number("proc/sys/net/ipv4/tcp_tw_reuse") {
        None => out.push(unknown(
            "net.ipv4.tcp_tw_reuse",
            "/proc/sys/net/ipv4/tcp_tw_reuse",
            WHY_TW,
        )),
        Some(value) => out.push(Check {
            name: "net.ipv4.tcp_tw_reuse",
            value: match value {
                2 => "2 (loopback only)".into(),
                v => v.to_string(),
            },
            needs: "1 or 2".into(),
            verdict: if value >= 1 {
                Verdict::Ok
            } else {
                Verdict::Warn
            },
            why: WHY_TW,
            fix: "sysctl -w net.ipv4.tcp_tw_reuse=1".into(),
        }),
    }
}

/// The port row when the clients run here: their ends take this host's
/// ephemeral ports, `target.connections` towards the node's address, and
/// connecting stays fast only while each (source, node address) pair is
/// at most 1/[`myriad_host::PORT_FILL`] full. Too few source addresses for
/// that fail: the clients could not all connect.
fn loopback_ports(target: &Target, low: u64, high: u64, why: &'static str) -> Check {
    let ports = high - low + 1;
    let needed = myriad_host::sources_needed(target.connections, ports);
    let sources = target.host.sources.max(1);
    let widened = myriad_host::sources_needed(target.connections, WIDEST_PORT_RANGE);
    let most = sources.saturating_mul(ports / myriad_host::PORT_FILL);
    Check {
        name: "net.ipv4.ip_local_port_range",
        value: format!("{low}-{high} ({} ports)", thousands(ports)),
        needs: format!(
            "{needed} source address(es) for {} connections to the node's address, each \
             pair at most 1/{} full; the clients have {sources}",
            thousands(target.connections),
            myriad_host::PORT_FILL
        ),
        verdict: if needed <= sources {
            Verdict::Ok
        } else {
            Verdict::Fail
        },
        why,
        fix: format!(
            "sysctl -w net.ipv4.ip_local_port_range='1024 65535' ({widened} source address(es) \
             then), or at most {} connections per node address",
            thousands(most)
        ),
    }
}

/// A field of the `TCP:` line of `/proc/net/sockstat` (`inuse`, `mem`).
fn sockstat_tcp(host: &Host, field: &str) -> Option<u64> {
    let text = host.read("proc/net/sockstat")?;
    let line = text.lines().find(|l| l.starts_with("TCP:"))?;
    let mut words = line.split_whitespace();
    words.find(|w| *w == field)?;
    words.next()?.parse().ok()
}

fn conntrack(host: &Host, target: &Target, out: &mut Vec<Check>) {
    const WHY: &str = "when connection tracking is loaded every connection takes an entry; past \
                       the max new ones are dropped silently";
    let Some(max) = host.number("proc/sys/net/netfilter/nf_conntrack_max") else {
        out.push(Check {
            name: "nf_conntrack",
            value: "not loaded".into(),
            needs: format!(
                "nothing (or max >= {} if loaded)",
                thousands(target.host.connections)
            ),
            verdict: Verdict::Ok,
            why: WHY,
            fix: "nothing to do".into(),
        });
        return;
    };
    let count = host
        .number("proc/sys/net/netfilter/nf_conntrack_count")
        .unwrap_or(0);
    // Loaded yet empty while TCP sockets are open: no rule asks for
    // tracking (loopback connections are not entered by default), so the
    // node's connections will not be tracked either.
    let tcp_open = sockstat_tcp(host, "inuse").unwrap_or(0);
    let need = count.saturating_add(target.host.connections);
    let fix = format!(
        "sysctl -w net.netfilter.nf_conntrack_max={}",
        need.saturating_mul(5) / 4
    );
    if count == 0 && tcp_open > 0 {
        out.push(Check {
            name: "nf_conntrack",
            value: format!(
                "max {}, nothing tracked with {} TCP sockets open",
                thousands(max),
                thousands(tcp_open)
            ),
            needs: format!("max >= {} once a rule tracks TCP", thousands(need)),
            verdict: Verdict::Ok,
            why: WHY,
            fix,
        });
        return;
    }
    out.push(Check {
        name: "nf_conntrack",
        value: format!("max {}, {} in use", thousands(max), thousands(count)),
        needs: format!("max >= {}", thousands(need)),
        verdict: if max >= need {
            Verdict::Ok
        } else {
            Verdict::Fail
        },
        why: WHY,
        fix,
    });
}

fn paging(host: &Host, out: &mut Vec<Check>) {
    const WHY_THP: &str =
        "with `always` the allocator's sparse pages become huge ones (RSS grows) \
                           and compaction stalls workers";
    let thp = host.read("sys/kernel/mm/transparent_hugepage/enabled");
    match thp.as_deref().and_then(selected) {
        None => out.push(unknown(
            "transparent huge pages",
            "/sys/kernel/mm/transparent_hugepage/enabled",
            WHY_THP,
        )),
        Some(mode) => out.push(Check {
            name: "transparent huge pages",
            value: mode.to_owned(),
            needs: "madvise or never".into(),
            verdict: if mode == "always" {
                Verdict::Warn
            } else {
                Verdict::Ok
            },
            why: WHY_THP,
            fix: "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled".into(),
        }),
    }
    const WHY_SWAP: &str = "a worker that touches a swapped-out page stalls every connection it \
                            holds";
    match host.meminfo("SwapTotal") {
        None => out.push(unknown("swap", "/proc/meminfo", WHY_SWAP)),
        Some(swap) => {
            let swappiness = host.number("proc/sys/vm/swappiness").unwrap_or(60);
            out.push(Check {
                name: "swap",
                value: if swap == 0 {
                    "none".into()
                } else {
                    format!("{}, vm.swappiness {swappiness}", size(swap))
                },
                needs: "none, or vm.swappiness <= 10".into(),
                verdict: if swap == 0 || swappiness <= 10 {
                    Verdict::Ok
                } else {
                    Verdict::Warn
                },
                why: WHY_SWAP,
                fix: "sysctl -w vm.swappiness=1 (or swapoff -a)".into(),
            });
        }
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
