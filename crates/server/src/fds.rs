//! The node's open files, shared out. Every connection is a descriptor, and
//! so is much else; one limit (`RLIMIT_NOFILE`) covers them all, so a
//! listener that took descriptors freely would starve the other one: its
//! `accept` would fail with EMFILE, and its clients would wait unanswered.
//!
//! This module owns the split. The node's own descriptors, the admin
//! listener's connections (`admin_max_connections`) and room for the
//! refusals each listener answers past its cap are set aside first; client
//! connections get the rest, at most `max_connections`. It must not accept
//! or close anything: the workers and the admin listener keep to the shares
//! it gives.

use thiserror::Error;

/// Descriptors the node holds whatever its load: stdio, the data
/// directory's lock, SQLite's database, WAL, shared memory and temporary
/// files, the signal pipe, the admin runtime's epoll and eventfd, the admin
/// listener, and the `/proc` files `/stats` reads. A 2-worker node at rest
/// holds 21 in all, 15 of them these; the rest is slack.
const OWN: u64 = 32;

/// Per worker: its listener, its epoll and its waker's eventfd, one
/// client socket a worker may take past the ceiling in a race with the
/// other workers (the ceiling is checked, not reserved), and the socket
/// `accept` has just made while the ceiling is being checked.
const PER_WORKER: u64 = 5;

/// Client sockets a node may hold past `max_connections` only to refuse
/// them: 503 at the cap, 429 past `max_connections_per_ip` (each waits for
/// its request, up to `handshake_timeout`). Past this room an accepted
/// client socket is closed without an answer.
pub const CLIENT_REFUSALS: usize = 64;

/// The admin listener answers a connection past its cap and closes it at
/// once: one socket at a time.
const ADMIN_REFUSALS: u64 = 1;

/// Why the open-file limit cannot be shared out.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FdsError {
    #[error(
        "the open-file limit ({limit}) leaves no descriptor for client connections: \
         the node keeps {reserved} for itself, its {workers} workers and the admin \
         listener (admin_max_connections = {admin}); raise `ulimit -n` or lower \
         admin_max_connections"
    )]
    TooFew {
        limit: u64,
        reserved: u64,
        workers: usize,
        admin: usize,
    },
}

/// The descriptors kept from client connections: the node's own, the
/// admin listener's, and both listeners' refusals.
pub fn reserved(workers: usize, admin_max_connections: usize) -> u64 {
    let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    OWN.saturating_add(PER_WORKER.saturating_mul(count(workers)))
        .saturating_add(count(CLIENT_REFUSALS))
        .saturating_add(count(admin_max_connections))
        .saturating_add(ADMIN_REFUSALS)
}

/// How many client connections the node admits: `max_connections`,
/// lowered to what `open_files` leaves once everything else has its share.
pub fn client_cap(
    max_connections: usize,
    open_files: u64,
    workers: usize,
    admin_max_connections: usize,
) -> Result<usize, FdsError> {
    let reserved = reserved(workers, admin_max_connections);
    match open_files.checked_sub(reserved) {
        Some(left) if left > 0 => {
            Ok(max_connections.min(usize::try_from(left).unwrap_or(usize::MAX)))
        }
        _ => Err(FdsError::TooFew {
            limit: open_files,
            reserved,
            workers,
            admin: admin_max_connections,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Everything the node may hold at its worst, by the shares above.
    fn worst_case(cap: usize, workers: usize, admin: usize) -> u64 {
        let clients = cap + CLIENT_REFUSALS + 2 * workers;
        let own = OWN + 3 * workers as u64;
        own + clients as u64 + admin as u64 + ADMIN_REFUSALS
    }

    #[test]
    fn every_share_fits_the_limit() {
        for workers in [1, 2, 64] {
            for admin in [1, 128, 5_000] {
                let reserved = reserved(workers, admin);
                for limit in [reserved + 1, reserved + 7, 20_000, 1 << 20] {
                    let cap = client_cap(usize::MAX, limit, workers, admin).unwrap();
                    assert!(cap >= 1);
                    assert!(
                        worst_case(cap, workers, admin) <= limit,
                        "{workers} workers, admin {admin}, limit {limit}: cap {cap}"
                    );
                }
            }
        }
    }

    #[test]
    fn max_connections_wins_when_it_is_lower() {
        assert_eq!(client_cap(100, 20_000, 2, 128), Ok(100));
        // Counted by hand from the shares, not by `reserved`: 32 of the
        // node's own, 5 for each of 2 workers, 64 client refusals, 128
        // admin connections and 1 admin refusal keep 235 of 20,000.
        let cap = client_cap(1_000_000, 20_000, 2, 128).unwrap();
        assert_eq!(cap, 19_765);
    }

    #[test]
    fn a_limit_that_leaves_nothing_is_an_error() {
        let reserved = reserved(2, 128);
        for limit in [0, reserved - 1, reserved] {
            let err = client_cap(10, limit, 2, 128).unwrap_err();
            assert!(err.to_string().contains("admin_max_connections"), "{err}");
        }
    }
}
