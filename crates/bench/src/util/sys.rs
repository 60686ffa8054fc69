//! What the kernel says about us and the host: our own RSS and CPU time,
//! and the TCP listen-queue counters of /proc/net/netstat.

use serde::{Deserialize, Serialize};

/// Resident set size of this process, bytes (from /proc/self/statm).
pub fn rss_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page.max(0) as u64
}

/// CPU time (user + system) this process has used, seconds.
pub fn cpu_secs() -> f64 {
    let (user, system) = cpu_times();
    user + system
}

/// CPU time this process has used, (user, system) seconds. On loopback the
/// system part includes the receive processing of the packets it sends,
/// much of which is the server's side of TCP.
pub fn cpu_times() -> (f64, f64) {
    // SAFETY: getrusage writes only into the struct we pass.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (tv(usage.ru_utime), tv(usage.ru_stime))
}

/// The host's listen-queue counters (TcpExt in /proc/net/netstat).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenCounters {
    /// Times a full accept queue turned a completed handshake away.
    pub listen_overflows: u64,
    /// SYNs dropped at a listener, for any reason (includes overflows).
    pub listen_drops: u64,
}

impl ListenCounters {
    /// Reads the counters now; None if the file is unreadable.
    pub fn read() -> Option<ListenCounters> {
        parse_netstat(&std::fs::read_to_string("/proc/net/netstat").ok()?)
    }

    /// Increase from `earlier` to `self`.
    pub fn since(&self, earlier: &ListenCounters) -> ListenCounters {
        ListenCounters {
            listen_overflows: self
                .listen_overflows
                .saturating_sub(earlier.listen_overflows),
            listen_drops: self.listen_drops.saturating_sub(earlier.listen_drops),
        }
    }
}

/// Finds ListenOverflows and ListenDrops in the TcpExt header/value line pair.
fn parse_netstat(text: &str) -> Option<ListenCounters> {
    let mut lines = text.lines();
    while let Some(header) = lines.next() {
        let values = lines.next()?;
        if !header.starts_with("TcpExt:") {
            continue;
        }
        let names = header.split_whitespace().skip(1);
        let nums = values.split_whitespace().skip(1);
        let mut out = ListenCounters::default();
        for (name, value) in names.zip(nums) {
            let value = value.parse().ok()?;
            match name {
                "ListenOverflows" => out.listen_overflows = value,
                "ListenDrops" => out.listen_drops = value,
                _ => {}
            }
        }
        return Some(out);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tcpext() {
        let text = "TcpExt: SyncookiesSent ListenOverflows ListenDrops\nTcpExt: 1 7 9\nIpExt: A\nIpExt: 2\n";
        assert_eq!(
            parse_netstat(text),
            Some(ListenCounters {
                listen_overflows: 7,
                listen_drops: 9
            })
        );
        assert_eq!(parse_netstat("IpExt: A\nIpExt: 2\n"), None);
    }

    #[test]
    fn reads_own_usage() {
        assert!(rss_bytes() > 0);
        assert!(cpu_secs() >= 0.0);
    }
}
