//! The open-file rows: the process's own limits, a systemd unit's
//! `LimitNOFILE`, `fs.nr_open` and `fs.file-max` against the descriptors the
//! target holds.

use super::*;

pub(super) fn open_files(host: &Host, target: &Target, out: &mut Vec<Check>) {
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
pub(super) fn unit_files(host: &Host, need: u64, out: &mut Vec<Check>) {
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
