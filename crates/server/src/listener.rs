//! Binding the client listeners: one `SO_REUSEPORT` socket per worker, so the
//! kernel spreads incoming connections across workers and no accept loop is
//! shared (the single-acceptor bottleneck of seed 000).
//!
//! Per-connection socket options (`TCP_NODELAY`, `SO_SNDBUF`) are set once on
//! each listener: Linux copies them into every socket it accepts, which saves
//! two `setsockopt` calls per connection on the accept path
//! (`tests::accepted_sockets_inherit_the_options` guards that).

use std::io;
use std::net::{SocketAddr, TcpListener};

use socket2::{Domain, Protocol, Socket, Type};

/// How the client listeners, and through them every accepted socket, are set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenOptions {
    /// Listen backlog per listener (the kernel caps it at `net.core.somaxconn`).
    pub backlog: u32,
    /// `SO_SNDBUF` for accepted sockets; 0 keeps the kernel's autotuning.
    pub send_buffer: usize,
}

/// Binds `count` listeners to `addr`. With port 0 the first bind picks the
/// port and the others join it, so all workers serve the same address.
pub fn bind_reuseport(
    addr: SocketAddr,
    count: usize,
    options: ListenOptions,
) -> io::Result<Vec<TcpListener>> {
    let first = bind_one(addr, options)?;
    let bound = first.local_addr()?;
    let mut listeners = vec![first];
    for _ in 1..count {
        listeners.push(bind_one(bound, options)?);
    }
    Ok(listeners)
}

fn bind_one(addr: SocketAddr, options: ListenOptions) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    // Deliveries are small and latency-bound: never hold them back for Nagle.
    socket.set_nodelay(true)?;
    if options.send_buffer > 0 {
        socket.set_send_buffer_size(options.send_buffer)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(i32::try_from(options.backlog).unwrap_or(i32::MAX))?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPTIONS: ListenOptions = ListenOptions {
        backlog: 128,
        send_buffer: 65_536,
    };

    #[test]
    fn every_listener_shares_the_ephemeral_port() {
        let listeners = bind_reuseport("127.0.0.1:0".parse().unwrap(), 3, OPTIONS).unwrap();
        let ports: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        assert!(ports[0] != 0);
        assert!(ports.iter().all(|&p| p == ports[0]), "{ports:?}");
    }

    #[test]
    fn accepted_sockets_inherit_the_options() {
        let listener = bind_reuseport("127.0.0.1:0".parse().unwrap(), 1, OPTIONS)
            .unwrap()
            .remove(0);
        listener.set_nonblocking(false).unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let accepted = socket2::SockRef::from(&accepted);
        assert!(accepted.nodelay().unwrap(), "TCP_NODELAY is inherited");
        // The kernel doubles the value it is given (socket(7)).
        assert_eq!(accepted.send_buffer_size().unwrap(), 2 * 65_536);
    }
}
