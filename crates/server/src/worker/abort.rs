//! Ending a connection whose time is up: the close timeout (after a
//! slow-consumer cut, a refusal or any close the peer never finished), a
//! request or keep-alive timeout, a heartbeat or partial-message timeout,
//! the shutdown timeout.
//!
//! A socket closed while it still holds data it could not send does not go
//! away with its descriptor: the kernel keeps it, and its send buffer, to
//! deliver that data, for as long as the peer answers its probes with a
//! zero window (issue 10 saw 141 KB per stalled reader pinned past 125 s,
//! beyond every limit of the node). At a deadline nothing more will come of
//! that data, so such a socket is aborted instead (`SO_LINGER` 0: the
//! kernel frees it at once and sends a reset). A socket whose data is all
//! sent gets the ordinary close (FIN): what is still in flight reaches a
//! live peer, and a dead peer's socket is bounded by the kernel's own
//! retransmission limit (`tcp_orphan_retries`), not by the peer.
//!
//! This module must not end connections that are not past a deadline: a
//! close frame answering the peer's, or the last bytes of a long-poll
//! answer, may still be waiting for the window when the connection ends,
//! and a reset would throw them away.

use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

use mio::net::TcpStream;
use tracing::debug;

use super::Worker;
use crate::registry::ConnId;

impl Worker {
    /// Drops `id` at one of its deadlines, aborting the socket if data for
    /// the peer is still waiting, in our queue or in the kernel's.
    pub(super) fn drop_at_deadline(&mut self, id: ConnId) {
        let Some(conn) = self.conns.get(id as usize) else {
            return;
        };
        // Should the ioctl fail, the kernel's queue is unknown: abort, as
        // nothing says the socket would not stay.
        let unsent =
            conn.has_unsent() || unsent_bytes(&conn.socket).map_or(true, |bytes| bytes > 0);
        if unsent {
            match socket2::SockRef::from(&conn.socket).set_linger(Some(Duration::ZERO)) {
                Ok(()) => self.shared.metrics.socket_aborted(),
                Err(e) => debug!(worker = self.index, conn = id, error = %e, "SO_LINGER failed"),
            }
        }
        self.drop_conn(id);
    }
}

/// Bytes in the kernel's send queue not sent yet (`SIOCOUTQNSD`, tcp(7)):
/// beyond the peer's window, or held by congestion control. A FIN that
/// `shutdown` queued behind them counts one.
fn unsent_bytes(socket: &TcpStream) -> io::Result<usize> {
    let mut bytes: libc::c_int = 0;
    // SAFETY: SIOCOUTQNSD writes one int through the pointer, which points
    // at a live local; the descriptor is owned by `socket`.
    let result = unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCOUTQNSD, &mut bytes) };
    if result == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(bytes).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    /// A connected pair: the accepted end as mio's stream, and the client.
    fn pair() -> (TcpStream, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        (TcpStream::from_std(server), client)
    }

    #[test]
    fn unsent_bytes_are_what_the_peer_has_no_room_for() {
        let (mut server, mut client) = pair();
        assert_eq!(unsent_bytes(&server).unwrap(), 0);
        // Far more than the client's receive window while it does not read.
        let chunk = vec![7u8; 64 * 1024];
        let mut written = 0;
        for _ in 0..64 {
            match server.write(&chunk) {
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(unsent_bytes(&server).unwrap() > 0);
        // Once the client has read it all, all of it was sent.
        let mut sink = vec![0u8; written];
        client.read_exact(&mut sink).unwrap();
        assert_eq!(unsent_bytes(&server).unwrap(), 0);
    }
}
