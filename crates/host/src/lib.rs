//! What this machine allows, read in one place for every part of myriad
//! that plans against it: the node's doctor (`myriad doctor`, the checks at
//! `serve`'s start) and the bench's process and source-address plan.
//!
//! [`Host`] reads `/proc` and `/sys` under one root, so tests point it at a
//! temporary tree, and carries the process's open-file limit, the systemd
//! unit's, and how to probe the listeners' spread. This crate only reads:
//! it never changes a limit or a setting, and it knows nothing of nodes or
//! verdicts (the doctor judges what it reads). Besides the readings it keeps
//! one fact of the kernel's that both users plan with: how full a source
//! address's ports may get before `connect()` slows ([`PORT_FILL`]).

use std::io;
use std::path::PathBuf;
use std::process::Command;

/// Connections each of `n` `SO_REUSEPORT` listeners accepted from one
/// burst: the node's listeners are the server's to bind, so the server
/// supplies the probe.
pub type Spread = fn(n: usize) -> io::Result<Vec<u64>>;

/// Where the host is read: `/proc` and `/sys` under `root`, the process's
/// open-file limits, the systemd unit's, and the spread probe. The real
/// host is [`Host::real`]; tests build one over a temporary directory.
#[derive(Debug, Clone)]
pub struct Host {
    /// `/` on the real host; `proc/...` and `sys/...` are read under it.
    pub root: PathBuf,
    /// (soft, hard) `RLIMIT_NOFILE`, `None` if it cannot be read.
    pub open_files: Option<(u64, u64)>,
    /// The unit `tcp_mem` counts in.
    pub page_size: u64,
    /// The systemd service that runs (or will run) the node, if any.
    pub unit: Option<Unit>,
    /// See [`Spread`].
    pub spread: Spread,
}

impl Host {
    /// This process on this machine, with no unit and no spread probe:
    /// what a reader of sysctls and limits needs (the bench's plan).
    pub fn here() -> Host {
        Host {
            root: PathBuf::from("/"),
            open_files: open_files(),
            page_size: page_size(),
            unit: None,
            spread: |_| Err(io::Error::from(io::ErrorKind::Unsupported)),
        }
    }

    /// This process on this machine under the systemd unit `unit` (the one
    /// this process runs in when `None`), probing its spread with `spread`.
    pub fn real(unit: Option<&str>, spread: Spread) -> Host {
        let here = Host::here();
        let name = unit
            .map(str::to_owned)
            .or_else(|| unit_of(&here.read("proc/self/cgroup")?));
        Host {
            unit: name.as_deref().map(Unit::query),
            spread,
            ..here
        }
    }

    /// The text of `path` (relative, e.g. `proc/sys/fs/nr_open`), trimmed.
    pub fn read(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(self.root.join(path))
            .ok()
            .map(|s| s.trim().to_owned())
    }

    /// The whitespace-separated numbers of `path`.
    pub fn numbers(&self, path: &str) -> Option<Vec<u64>> {
        self.read(path)?
            .split_whitespace()
            .map(|n| n.parse().ok())
            .collect()
    }

    /// The first number of `path`.
    pub fn number(&self, path: &str) -> Option<u64> {
        self.numbers(path)?.first().copied()
    }

    /// A `/proc/meminfo` field, in bytes.
    pub fn meminfo(&self, field: &str) -> Option<u64> {
        let text = self.read("proc/meminfo")?;
        let line = text.lines().find(|l| l.starts_with(&format!("{field}:")))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    /// The ephemeral ports (`net.ipv4.ip_local_port_range`, inclusive) the
    /// kernel picks from per (source address, destination) pair.
    pub fn port_range(&self) -> Option<(u64, u64)> {
        match self
            .numbers("proc/sys/net/ipv4/ip_local_port_range")?
            .as_slice()
        {
            &[low, high] if high >= low => Some((low, high)),
            _ => None,
        }
    }
}

/// The kernel's port search in `connect()` scans for a free port, and slows
/// sharply as a (source address, destination) pair's ports fill up, so a
/// client host keeps each pair at most 1/`PORT_FILL` full: the bench's
/// source plan and the doctor's port row both count with it.
pub const PORT_FILL: u64 = 4;

/// Source addresses `per_destination` connections to one destination
/// need so that no pair's `ports_per_pair` ports fill past 1/[`PORT_FILL`]:
/// at least one.
pub fn sources_needed(per_destination: u64, ports_per_pair: u64) -> u64 {
    per_destination
        .div_ceil((ports_per_pair / PORT_FILL).max(1))
        .max(1)
}

/// (soft, hard) `RLIMIT_NOFILE` of this process.
pub fn open_files() -> Option<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only into the struct it is given.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    ok.then_some((limit.rlim_cur, limit.rlim_max))
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page).unwrap_or(4096)
}

/// A systemd service and the open-file limit it gives its processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    pub name: String,
    /// (soft, hard) `LimitNOFILE`, `None` when systemd could not say.
    pub open_files: Option<(u64, u64)>,
}

impl Unit {
    /// `name`'s limits as systemd reports them (`systemctl show`).
    pub fn query(name: &str) -> Unit {
        let shown = Command::new("systemctl")
            .args([
                "show",
                name,
                "--property=LoadState",
                "--property=LimitNOFILE",
                "--property=LimitNOFILESoft",
            ])
            .output()
            .ok()
            .filter(|out| out.status.success())
            .and_then(|out| String::from_utf8(out.stdout).ok());
        Unit {
            name: name.to_owned(),
            open_files: shown.as_deref().and_then(unit_open_files),
        }
    }
}

/// (soft, hard) from `systemctl show`'s `LimitNOFILESoft=` and
/// `LimitNOFILE=` lines; `None` for a unit systemd does not know.
fn unit_open_files(shown: &str) -> Option<(u64, u64)> {
    let field = |key: &str| {
        shown
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::trim)
    };
    if field("LoadState") == Some("not-found") {
        return None;
    }
    let limit = |key: &str| match field(key)? {
        "infinity" => Some(u64::MAX),
        n => n.parse().ok(),
    };
    let hard = limit("LimitNOFILE")?;
    Some((limit("LimitNOFILESoft").unwrap_or(hard), hard))
}

/// The systemd service a process runs in, from its `/proc/PID/cgroup`.
fn unit_of(cgroup: &str) -> Option<String> {
    cgroup
        .lines()
        .flat_map(|l| l.rsplit(':').next().unwrap_or("").split('/'))
        .rfind(|part| part.ends_with(".service"))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_over(files: &[(&str, &str)]) -> (tempfile::TempDir, Host) {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let host = Host {
            root: dir.path().to_owned(),
            ..Host::here()
        };
        (dir, host)
    }

    #[test]
    fn sysctls_and_meminfo_read_as_the_kernel_writes_them() {
        let (_dir, host) = host_over(&[
            ("proc/sys/net/ipv4/tcp_mem", "287901\t383868\t575802\n"),
            (
                "proc/meminfo",
                "MemTotal:       24000000 kB\nSwapTotal: 0 kB\n",
            ),
            ("proc/sys/net/ipv4/ip_local_port_range", "32768\t60999\n"),
        ]);
        assert_eq!(
            host.numbers("proc/sys/net/ipv4/tcp_mem"),
            Some(vec![287_901, 383_868, 575_802])
        );
        assert_eq!(host.number("proc/sys/net/ipv4/tcp_mem"), Some(287_901));
        assert_eq!(host.meminfo("MemTotal"), Some(24_000_000 * 1024));
        assert_eq!(host.meminfo("SwapTotal"), Some(0));
        assert_eq!(host.meminfo("Slab"), None);
        assert_eq!(host.port_range(), Some((32_768, 60_999)));
        assert_eq!(host.number("proc/sys/fs/nr_open"), None);
    }

    #[test]
    fn a_backwards_or_torn_port_range_is_unreadable() {
        for text in ["60999 32768", "1024", "a b"] {
            let (_dir, host) = host_over(&[("proc/sys/net/ipv4/ip_local_port_range", text)]);
            assert_eq!(host.port_range(), None, "{text}");
        }
    }

    #[test]
    fn systemctl_show_and_the_cgroup_read_as_systemd_writes_them() {
        assert_eq!(
            unit_open_files("LoadState=loaded\nLimitNOFILE=524288\nLimitNOFILESoft=1024\n"),
            Some((1_024, 524_288))
        );
        assert_eq!(
            unit_open_files("LimitNOFILE=infinity\nLimitNOFILESoft=infinity\n"),
            Some((u64::MAX, u64::MAX))
        );
        assert_eq!(
            unit_open_files("LoadState=not-found\nLimitNOFILE=524288\nLimitNOFILESoft=1024\n"),
            None
        );
        assert_eq!(unit_open_files(""), None);
        assert_eq!(
            unit_of("0::/system.slice/myriad.service\n").as_deref(),
            Some("myriad.service")
        );
        assert_eq!(
            unit_of("12:pids:/system.slice/myriad.service\n1:name=systemd:/user.slice\n")
                .as_deref(),
            Some("myriad.service")
        );
        assert_eq!(
            unit_of("0::/user.slice/user-0.slice/session-1.scope\n"),
            None
        );
    }

    #[test]
    fn sources_keep_ports_a_quarter_full() {
        assert_eq!(sources_needed(0, 28_232), 1);
        assert_eq!(sources_needed(7_058, 28_232), 1);
        assert_eq!(sources_needed(7_059, 28_232), 2);
        assert_eq!(sources_needed(32_500, 28_232), 5);
        assert_eq!(sources_needed(1_000_000, 28_232), 142);
        assert_eq!(sources_needed(10, 0), 10, "no ports: one a source");
    }

    #[test]
    fn this_process_has_an_open_file_limit() {
        let (soft, hard) = open_files().unwrap();
        assert!(soft <= hard && soft > 0, "{soft} {hard}");
        assert_eq!(Host::here().open_files, Some((soft, hard)));
    }
}
