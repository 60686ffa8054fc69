//! The memory rows: `tcp_mem`, the socket buffers one stalled reader can
//! pin, the host's memory against what the target holds, transparent huge
//! pages and swap.

use super::network::sockstat_tcp;
use super::*;

pub(super) fn memory(host: &Host, target: &Target, out: &mut Vec<Check>) {
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
            let each = if load.queued_bytes == QUEUED_BYTES_PER_CONNECTION {
                "~2.3 KB, one small message queued in every socket at once".to_owned()
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

pub(super) fn paging(host: &Host, out: &mut Vec<Check>) {
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
