//! Binding the client listeners: one `SO_REUSEPORT` socket per worker, so the
//! kernel spreads incoming connections across workers and no accept loop is
//! shared (the single-acceptor bottleneck of seed 000).

use std::io;
use std::net::{SocketAddr, TcpListener};

use socket2::{Domain, Protocol, Socket, Type};

/// Binds `count` listeners to `addr`. With port 0 the first bind picks the
/// port and the others join it, so all workers serve the same address.
pub fn bind_reuseport(
    addr: SocketAddr,
    count: usize,
    backlog: u32,
) -> io::Result<Vec<TcpListener>> {
    let first = bind_one(addr, backlog)?;
    let bound = first.local_addr()?;
    let mut listeners = vec![first];
    for _ in 1..count {
        listeners.push(bind_one(bound, backlog)?);
    }
    Ok(listeners)
}

fn bind_one(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(i32::try_from(backlog).unwrap_or(i32::MAX))?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listener_shares_the_ephemeral_port() {
        let listeners = bind_reuseport("127.0.0.1:0".parse().unwrap(), 3, 128).unwrap();
        let ports: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        assert!(ports[0] != 0);
        assert!(ports.iter().all(|&p| p == ports[0]), "{ports:?}");
    }
}
