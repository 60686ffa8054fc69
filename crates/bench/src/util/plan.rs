//! How many worker processes a run needs, and what each one holds.
//!
//! Every process on this box may hold at most RLIMIT_NOFILE open files
//! (20,000 here, fixed), and each connection is one file. The plan keeps
//! every worker under its cap with headroom for its own pipes, epoll and
//! sockets in mid-close, and spreads connections (or a connection rate) over
//! as few processes as that allows, because on a 2-core box every extra
//! process is another scheduler competitor for the server under test.

use std::ops::Range;

/// Files a worker keeps for itself besides connections: stdio, the epoll
/// and waker fds, the /stats poller, plus slack for sockets the kernel has not
/// released yet after close.
pub const RESERVED_FDS: u64 = 100;

/// The open-file limit of this process after raising the soft limit to the
/// hard one (children inherit it). The limit is read as `myriad doctor`
/// reads it ([`myriad_host::open_files`]); raising it is the bench's own.
pub fn fd_cap() -> u64 {
    let Some((soft, hard)) = myriad_host::open_files() else {
        return 1024;
    };
    if soft >= hard {
        return soft;
    }
    let raised = libc::rlimit {
        rlim_cur: hard,
        rlim_max: hard,
    };
    // SAFETY: setrlimit only reads the struct we pass.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
        hard
    } else {
        soft
    }
}

/// Connections one worker may hold under an open-file cap of `cap`.
pub fn conns_per_process(cap: u64) -> u64 {
    cap.saturating_sub(RESERVED_FDS).max(1)
}

/// Processes needed for `conns` simultaneous connections, `per_process`
/// each (at least one process, even for zero connections).
pub fn processes_for(conns: u64, per_process: u64) -> u64 {
    conns.div_ceil(per_process.max(1)).max(1)
}

/// Splits `0..total` into `parts` contiguous ranges whose sizes differ by at
/// most one (the first `total % parts` get the extra one).
pub fn split(total: u64, parts: u64) -> Vec<Range<u64>> {
    let parts = parts.max(1);
    let (base, extra) = (total / parts, total % parts);
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let len = base + u64::from(i < extra);
            let r = start..start + len;
            start += len;
            r
        })
        .collect()
}

/// Peak simultaneous connections of a connect-rate run: arrivals at `peak_rate`
/// each living for at most `hold_max_secs` plus `setup_secs` to connect and
/// handshake. Little's law, taken at the peak.
pub fn connect_rate_concurrency(peak_rate: f64, hold_max_secs: f64, setup_secs: f64) -> u64 {
    (peak_rate * (hold_max_secs + setup_secs)).ceil() as u64
}

/// The kernel's ephemeral port range (`ip_local_port_range`), the ports one
/// (source IP, destination) pair can use when the kernel picks them.
/// Read where `myriad doctor` reads it; the kernel's default range when
/// it cannot be.
pub fn ephemeral_ports() -> u64 {
    myriad_host::Host::here()
        .port_range()
        .map_or(28_232, |(low, high)| high - low + 1)
}

/// Connections the kernel's ephemeral ports allow with `sources` source
/// addresses and `targets` destinations: each (source, destination) pair
/// has its own port space.
pub fn port_capacity(sources: u64, targets: u64, ports_per_pair: u64) -> u64 {
    sources.max(1) * targets.max(1) * ports_per_pair
}

/// How full the bench lets a (source, destination) pair's ports get, and
/// the source addresses that takes: the host crate's, which the doctor's
/// port row counts with too.
pub use myriad_host::{sources_needed, PORT_FILL};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_follow_the_cap() {
        let per = conns_per_process(20_000);
        assert_eq!(per, 19_900);
        assert_eq!(processes_for(0, per), 1);
        assert_eq!(processes_for(19_900, per), 1);
        assert_eq!(processes_for(19_901, per), 2);
        assert_eq!(processes_for(1_000_000, per), 51);
        assert_eq!(conns_per_process(50), 1, "a tiny cap still allows one");
    }

    #[test]
    fn split_is_even_and_complete() {
        let r = split(10, 3);
        assert_eq!(r, vec![0..4, 4..7, 7..10]);
        let r = split(2, 4);
        assert_eq!(
            r.iter().map(|r| r.end - r.start).collect::<Vec<_>>(),
            vec![1, 1, 0, 0]
        );
        assert_eq!(split(5, 0), vec![0..5]);
    }

    #[test]
    fn connect_rate_needs_room_for_the_hold() {
        // 20k/s held 1 s ± 5 % plus 0.25 s of setup: 26,000 open at the peak.
        assert_eq!(connect_rate_concurrency(20_000.0, 1.05, 0.25), 26_000);
        assert_eq!(processes_for(26_000, conns_per_process(20_000)), 2);
    }

    #[test]
    fn port_capacity_multiplies_pairs() {
        assert_eq!(port_capacity(20, 1, 28_232), 564_640);
        assert_eq!(port_capacity(0, 0, 10), 10);
    }
}
