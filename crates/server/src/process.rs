//! This process's own resource use, read from /proc: what `/stats` reports as
//! RSS and CPU, so memory per connection can be checked against a live node.

/// Resident set size and CPU time of the current process.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub rss_bytes: u64,
    pub cpu_seconds: f64,
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

#[cfg(test)]
mod tests {
    #[test]
    fn reads_something_plausible() {
        let u = super::usage();
        assert!(u.rss_bytes > 100_000, "{u:?}");
        assert!(u.cpu_seconds >= 0.0);
    }
}
