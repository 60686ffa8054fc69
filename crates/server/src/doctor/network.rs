//! The network rows: the accept path's queues, the listeners'
//! `SO_REUSEPORT` spread (and the loopback probe that measures it), the
//! ephemeral port range and conntrack.

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::*;
use crate::listener::{self, ListenOptions};

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

pub(super) fn accept_path(host: &Host, target: &Target, out: &mut Vec<Check>) {
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
pub(super) fn spread(host: &Host, target: &Target, out: &mut Vec<Check>) {
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

pub(super) fn ports(host: &Host, target: &Target, out: &mut Vec<Check>) {
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
pub(super) fn loopback_ports(target: &Target, low: u64, high: u64, why: &'static str) -> Check {
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
pub(super) fn sockstat_tcp(host: &Host, field: &str) -> Option<u64> {
    let text = host.read("proc/net/sockstat")?;
    let line = text.lines().find(|l| l.starts_with("TCP:"))?;
    let mut words = line.split_whitespace();
    words.find(|w| *w == field)?;
    words.next()?.parse().ok()
}

pub(super) fn conntrack(host: &Host, target: &Target, out: &mut Vec<Check>) {
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
