//! This process's own resources: its use, read from /proc (what `/stats`
//! reports as RSS and CPU, so memory per connection can be checked against a
//! live node), and its open-file limit, which caps how many connections one
//! node can hold.

use serde::Serialize;

/// Resident set size and CPU time of the current process.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub rss_bytes: u64,
    pub cpu_seconds: f64,
}

impl Usage {
    /// Resident memory per open connection, or `None` with none open.
    pub fn rss_per_connection(&self, connections: u64) -> Option<f64> {
        (connections > 0).then(|| self.rss_bytes as f64 / connections as f64)
    }
}

/// What the node's structures hold, as they count it themselves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Held {
    /// Everything charged to `history_max_bytes`, against it.
    pub history_bytes: u64,
    pub history_max_bytes: u64,
    /// What the engine keeps for subjects with subscribers.
    pub subject_bytes: u64,
    /// Input not yet whole (`max_partial_input_bytes` per worker).
    pub partial_input_bytes: u64,
    /// Bytes queued for sockets, each queue within `max_outbound_bytes`:
    /// mostly handles to frames shared with history and other queues, so
    /// not memory of their own, and not taken out of `other_bytes`.
    pub outbound_bytes: u64,
}

/// Where the node's resident memory goes, by structure: what `/stats`
/// `memory` and the status page show.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Memory {
    pub rss_bytes: u64,
    #[serde(flatten)]
    pub held: Held,
    /// The rest: code, connections and their sessions, the allocator's
    /// free memory.
    pub other_bytes: u64,
    /// What the rest grew by since the node started, per open connection
    /// (`None` with none open): the cost of a connection, with history and
    /// the node's own start-up size taken out.
    pub per_connection: Option<f64>,
}

impl Memory {
    /// The breakdown of `rss_bytes` on a node that started at
    /// `baseline_rss_bytes` and holds `connections`.
    pub fn new(rss_bytes: u64, baseline_rss_bytes: u64, held: Held, connections: u64) -> Memory {
        let own = held.history_bytes + held.subject_bytes + held.partial_input_bytes;
        let other_bytes = rss_bytes.saturating_sub(own);
        let grown = other_bytes.saturating_sub(baseline_rss_bytes);
        Memory {
            rss_bytes,
            held,
            other_bytes,
            per_connection: (connections > 0).then(|| grown as f64 / connections as f64),
        }
    }
}

/// Reads the current usage; zeros where /proc is unavailable.
pub fn usage() -> Usage {
    Usage {
        rss_bytes: rss_bytes().unwrap_or(0),
        cpu_seconds: cpu_seconds().unwrap_or(0.0),
    }
}

fn rss_bytes() -> Option<u64> {
    // statm: size resident shared text lib data dt, in pages.
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields overall, i.e. the 12th and 13th after it.
    let after_name = &stat[stat.rfind(')')? + 2..];
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some((utime + stime) as f64 / ticks as f64)
}

/// Raises this process's soft open-file limit to its hard limit and returns
/// the limit in force. Every connection is a descriptor, so this is the
/// node's real connection ceiling; the hard limit is what an administrator
/// granted (`ulimit -Hn`, systemd `LimitNOFILE`), the soft one only a default.
pub fn raise_open_file_limit() -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit only reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit.rlim_cur = limit.rlim_max;
        }
    }
    Ok(limit.rlim_cur)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_something_plausible() {
        let u = super::usage();
        assert!(u.rss_bytes > 100_000, "{u:?}");
        assert!(u.cpu_seconds >= 0.0);
        assert_eq!(u.rss_per_connection(0), None);
        assert_eq!(u.rss_per_connection(2), Some(u.rss_bytes as f64 / 2.0));
    }

    #[test]
    fn the_open_file_limit_is_known_and_at_its_hard_value() {
        let limit = super::raise_open_file_limit().unwrap();
        assert!(limit >= 64, "{limit}");
        let mut now = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes only into the struct it is given.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut now) }, 0);
        assert_eq!(now.rlim_cur, limit);
    }
}
