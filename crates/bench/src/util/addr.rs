//! Where connections go and where they come from.
//!
//! Targets are the server's WebSocket URLs (several listeners or nodes may
//! be given); sources are local 127.0.0.x addresses to connect from. The
//! kernel gives each (source IP, destination) pair its own ephemeral port
//! space (~28k ports), so 64k+ connections to one destination need several
//! source addresses, as seed 004 found. Connection `i` goes to target
//! `i mod T` from source `(i div T) mod S`, spreading every pair evenly.
//! A connection opened again (a churning subscriber's reconnect, or a
//! failover from a node that is gone) has moved `hop` targets on: it goes
//! to `(i + hop) mod T`, the next node round robin, from the same source.
//! With `--source-ports explicit` the bench also picks the source port
//! itself from 1024–65535, each worker process its own slice, for when
//! `IP_BIND_ADDRESS_NO_PORT` and the ephemeral range are not enough.

use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Why an address argument was rejected.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum AddrError {
    /// The URL did not start with the expected scheme.
    #[error("{url:?}: expected a {scheme}:// URL")]
    Scheme {
        /// The offending URL.
        url: String,
        /// The scheme that was expected.
        scheme: &'static str,
    },
    /// The host:port part did not resolve to an address.
    #[error("{0:?}: cannot resolve host:port")]
    Resolve(String),
    /// A `--local-addrs` item was not an IPv4 address or `a-b` range.
    #[error("{0:?}: expected IPv4 addresses or ranges like 127.0.0.1-127.0.0.20")]
    Source(String),
}

/// A server endpoint to load: resolved address, the Host header and path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// Resolved once, up front: the event loop never resolves names.
    pub addr: SocketAddr,
    /// `host:port` as given, for the Host header.
    pub host: String,
    /// Request path, `/` when the URL has none.
    pub path: String,
    /// Spoken over TLS (a `wss://` URL).
    #[serde(default)]
    pub tls: bool,
}

impl Target {
    /// Parses `scheme://host:port/path`, resolving the host now. For `ws`,
    /// `wss://` is taken too and makes a TLS target.
    pub fn parse(url: &str, scheme: &'static str) -> Result<Target, AddrError> {
        let after = |scheme: &str| url.strip_prefix(scheme)?.strip_prefix("://");
        let wrong_scheme = || AddrError::Scheme {
            url: url.to_owned(),
            scheme,
        };
        let (rest, tls) = match after(scheme) {
            Some(rest) => (rest, false),
            None if scheme == "ws" => (after("wss").ok_or_else(wrong_scheme)?, true),
            None => return Err(wrong_scheme()),
        };
        let (host, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        // Prefer IPv4: `localhost` may list ::1 first, and source
        // addresses are IPv4.
        let resolved: Vec<SocketAddr> = host
            .to_socket_addrs()
            .map(Iterator::collect)
            .unwrap_or_default();
        let addr = resolved
            .iter()
            .find(|a| a.is_ipv4())
            .or(resolved.first())
            .copied()
            .ok_or_else(|| AddrError::Resolve(host.to_owned()))?;
        Ok(Target {
            addr,
            host: host.to_owned(),
            path: path.to_owned(),
            tls,
        })
    }

    /// Whether the server runs on this host, so its kernel counters
    /// (/proc/net/netstat) are ours to read.
    pub fn is_local(&self) -> bool {
        self.addr.ip().is_loopback()
    }
}

/// A list of local IPv4 source addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sources(pub Vec<Ipv4Addr>);

impl FromStr for Sources {
    type Err = AddrError;

    /// `127.0.0.1-127.0.0.20`, `127.0.0.1,127.0.0.5`, or a mix of both.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || AddrError::Source(s.to_owned());
        let mut out = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            match item.split_once('-') {
                Some((a, b)) => {
                    let a: u32 = a.trim().parse::<Ipv4Addr>().map_err(|_| bad())?.into();
                    let b: u32 = b.trim().parse::<Ipv4Addr>().map_err(|_| bad())?.into();
                    if a > b || b - a >= 1 << 16 {
                        return Err(bad());
                    }
                    out.extend((a..=b).map(Ipv4Addr::from));
                }
                None => out.push(item.parse().map_err(|_| bad())?),
            }
        }
        if out.is_empty() {
            return Err(bad());
        }
        Ok(Sources(out))
    }
}

/// Most targets (`--url`s) a run may have: a bench connection keeps which
/// one it went to in two bytes.
pub const MAX_TARGETS: usize = 1 << 16;

/// Which target and source address connection `index` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// Index into the targets.
    pub target: usize,
    /// Index into the sources, None when no source addresses were given.
    pub source: Option<usize>,
}

/// Connection `index`'s route among `targets` targets and `sources`
/// sources, once it has moved `hop` targets on from its first.
pub fn route(index: u64, hop: u32, targets: usize, sources: usize) -> Route {
    let t = targets.max(1) as u64;
    Route {
        target: ((index + u64::from(hop)) % t) as usize,
        source: (sources > 0).then(|| ((index / t) % sources as u64) as usize),
    }
}

/// The lowest port `--source-ports explicit` hands out: below it are the
/// privileged ports.
pub const EXPLICIT_PORT_MIN: u16 = 1024;

/// How the source port of each connection is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum PortMode {
    /// The kernel picks (with IP_BIND_ADDRESS_NO_PORT when a source address
    /// is bound, so the port is chosen per destination at connect time).
    Auto,
    /// The bench picks from 1024–65535, a disjoint slice per worker process.
    Explicit,
}

/// One worker's slice of the explicit port range, and where it is in it
/// for each source address.
#[derive(Debug, Clone)]
pub struct PortCursor {
    first: u16,
    len: u32,
    next: Vec<u32>,
}

impl PortCursor {
    /// The slice of worker `worker` of `workers`, for `sources` addresses.
    pub fn new(worker: u64, workers: u64, sources: usize) -> PortCursor {
        let span = u64::from(u16::MAX - EXPLICIT_PORT_MIN) + 1;
        let slice = crate::util::plan::split(span, workers)[worker as usize].clone();
        PortCursor {
            first: EXPLICIT_PORT_MIN + slice.start as u16,
            len: (slice.end - slice.start) as u32,
            next: vec![0; sources.max(1)],
        }
    }

    /// The next port for source `source`, cycling through the slice. A port
    /// still in use towards the same destination fails at connect time and
    /// the caller moves on to the next one.
    pub fn next_port(&mut self, source: usize) -> u16 {
        let n = &mut self.next[source];
        let port = self.first + (*n % self.len.max(1)) as u16;
        *n = n.wrapping_add(1);
        port
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let t = Target::parse("ws://127.0.0.1:9000/ws", "ws").unwrap();
        assert_eq!(t.addr, "127.0.0.1:9000".parse().unwrap());
        assert_eq!(
            (t.host.as_str(), t.path.as_str()),
            ("127.0.0.1:9000", "/ws")
        );
        assert!(t.is_local());
        assert!(!t.tls);
        let t = Target::parse("wss://localhost:9000/ws", "ws").unwrap();
        assert!(t.tls);
        assert_eq!(t.host, "localhost:9000");
        let t = Target::parse("http://127.0.0.2:81", "http").unwrap();
        assert_eq!(t.path, "/");
        assert!(Target::parse("https://127.0.0.2:81", "http").is_err());
        assert!(matches!(
            Target::parse("http://127.0.0.1:1", "ws"),
            Err(AddrError::Scheme { .. })
        ));
    }

    #[test]
    fn parses_source_ranges() {
        let s: Sources = "127.0.0.1-127.0.0.20".parse().unwrap();
        assert_eq!(s.0.len(), 20);
        assert_eq!(s.0[19], Ipv4Addr::new(127, 0, 0, 20));
        let s: Sources = "127.0.0.9, 127.0.1.254-127.0.2.1".parse().unwrap();
        assert_eq!(s.0.len(), 5);
        assert_eq!(s.0[2], Ipv4Addr::new(127, 0, 1, 255));
        assert!("127.0.0.5-127.0.0.1".parse::<Sources>().is_err());
        assert!("nope".parse::<Sources>().is_err());
        assert!("".parse::<Sources>().is_err());
    }

    #[test]
    fn routes_spread_evenly_over_pairs() {
        // 2 targets × 3 sources: 600 connections, 100 per pair.
        let mut pairs = [[0u32; 3]; 2];
        for i in 0..600 {
            let r = route(i, 0, 2, 3);
            pairs[r.target][r.source.unwrap()] += 1;
        }
        assert!(pairs.iter().flatten().all(|&c| c == 100));
        assert_eq!(
            route(5, 0, 1, 0),
            Route {
                target: 0,
                source: None
            }
        );
    }

    #[test]
    fn a_connection_that_moves_on_goes_to_the_next_target_from_the_same_source() {
        let first = route(7, 0, 3, 2);
        let targets: Vec<usize> = (1..=3).map(|hop| route(7, hop, 3, 2).target).collect();
        assert_eq!(first.target, 1);
        assert_eq!(targets, [2, 0, 1], "round robin, back to the first");
        assert!((1..=3).all(|hop| route(7, hop, 3, 2).source == first.source));
        assert_eq!(route(7, u32::MAX, 1, 0).target, 0, "one target: stays");
    }

    #[test]
    fn explicit_ports_are_disjoint_per_worker() {
        let mut a = PortCursor::new(0, 2, 1);
        let mut b = PortCursor::new(1, 2, 1);
        let pa: Vec<u16> = (0..32256).map(|_| a.next_port(0)).collect();
        let pb: Vec<u16> = (0..32256).map(|_| b.next_port(0)).collect();
        assert_eq!(pa[0], 1024);
        assert_eq!(*pb.last().unwrap(), 65535);
        // Both slices are contiguous ranges, so disjoint means ordered.
        assert!(pa.iter().max() < pb.iter().min());
        // The slice wraps around.
        assert_eq!(a.next_port(0), 1024);
    }
}
