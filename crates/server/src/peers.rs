//! Open client connections per source address, across every worker: the
//! count `max_connections_per_ip` is checked against.
//!
//! Connections from one address land on any worker (`SO_REUSEPORT`), so the
//! count is shared, sharded by address so that accepting workers rarely
//! meet on one lock. An address is keyed in 8 bytes, which is all a worker
//! keeps per connection while the limit is on (see `worker::abuse`): an
//! IPv6 address by its whole /64 prefix (what one host or site is usually
//! given, so one client cannot dodge the limit by cycling through its own
//! prefix), an IPv4 address as itself, placed where no source address can
//! be, so no two addresses share a key. A holder of a shorter prefix holds
//! many /64s, each with its own count: a /56 is 256 of them, a /48 65,536,
//! so up to that many times the limit; `max_connections` is what bounds
//! them (docs/operations.md).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Mutex;

use foldhash::fast::RandomState;

const SHARDS: usize = 64;

/// The 8-byte key of a source address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerKey(u64);

/// The top of an IPv4 address's key: a prefix in ff00::/8, IPv6
/// multicast, which is never the source of a connection, so no IPv6 /64
/// has an IPv4 address's key.
const IPV4_KEYS: u64 = 0xff00_0000_0000_0000;

impl PeerKey {
    /// Not an address: a slot refused at accept. Multicast too, and outside
    /// the IPv4 keys (which leave bits 32-55 clear).
    pub const REFUSED: PeerKey = PeerKey(u64::MAX);

    pub fn of(ip: IpAddr) -> PeerKey {
        let v4 = |v4| PeerKey(IPV4_KEYS | u64::from(u32::from(v4)));
        match ip {
            IpAddr::V4(addr) => v4(addr),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(addr) => v4(addr),
                None => PeerKey((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

/// Connections open per source address.
pub struct PeerCounts {
    shards: Box<[Mutex<HashMap<PeerKey, u32, RandomState>>]>,
    /// Picks a key's shard. Hashed, because a key's low bits are often
    /// alike (the subnet bits of a site's /64s are mostly zero), and
    /// seeded per process so that nobody can aim many at one lock.
    spread: RandomState,
}

impl Default for PeerCounts {
    fn default() -> Self {
        PeerCounts {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            spread: RandomState::default(),
        }
    }
}

impl PeerCounts {
    fn shard(&self, key: PeerKey) -> std::sync::MutexGuard<'_, HashMap<PeerKey, u32, RandomState>> {
        self.shards[self.spread.hash_one(key) as usize % SHARDS]
            .lock()
            .expect("peer count lock poisoned")
    }

    /// Counts a connection from `key` if that keeps the address within
    /// `limit`; returns whether it did.
    pub fn try_add(&self, key: PeerKey, limit: u32) -> bool {
        let mut shard = self.shard(key);
        let count = shard.entry(key).or_insert(0);
        if *count >= limit {
            return false;
        }
        *count += 1;
        true
    }

    /// Uncounts a connection [`try_add`](Self::try_add) counted.
    pub fn remove(&self, key: PeerKey) {
        let mut shard = self.shard(key);
        if let Some(count) = shard.get_mut(&key) {
            *count -= 1;
            if *count == 0 {
                shard.remove(&key);
            }
        }
    }

    /// Addresses with at least one connection counted.
    pub fn addresses(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().expect("peer count lock poisoned").len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_counted_up_to_its_limit_and_forgotten_at_zero() {
        let counts = PeerCounts::default();
        let a = PeerKey::of("10.0.0.1".parse().unwrap());
        let b = PeerKey::of("10.0.0.2".parse().unwrap());
        assert!(counts.try_add(a, 2) && counts.try_add(a, 2));
        assert!(!counts.try_add(a, 2), "the third is over the limit");
        assert!(counts.try_add(b, 2));
        assert_eq!(counts.addresses(), 2);
        counts.remove(a);
        assert!(counts.try_add(a, 2), "a closed connection frees its place");
        counts.remove(a);
        counts.remove(a);
        counts.remove(b);
        assert_eq!(counts.addresses(), 0);
    }

    #[test]
    fn ipv6_hosts_of_one_prefix_share_a_key_and_mapped_v4_is_v4() {
        let key = |s: &str| PeerKey::of(s.parse().unwrap());
        assert_eq!(key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff::9"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_eq!(key("::ffff:10.0.0.1"), key("10.0.0.1"));
        // An IPv4 address and the /64 whose bits it would be apart.
        assert_ne!(key("10.0.0.1"), key("::a00:1:0:0:0"));
        assert_ne!(key("::1"), key("0.0.0.0"));
        assert_ne!(key("255.255.255.255"), PeerKey::REFUSED);
    }

    #[test]
    fn distinct_64s_never_share_a_count() {
        // These two /64s had one key when a /64 was folded into 32 bits
        // with a fixed seed: each held the other's places.
        let (a, b) = ("2001:db8:0:260e::1", "2001:db8:1:1d4::1");
        let (a, b) = (
            PeerKey::of(a.parse().unwrap()),
            PeerKey::of(b.parse().unwrap()),
        );
        assert_ne!(a, b);
        let counts = PeerCounts::default();
        assert!(counts.try_add(a, 1));
        assert!(counts.try_add(b, 1), "b's place is its own");
        assert!(!counts.try_add(a, 1) && !counts.try_add(b, 1));
        assert_eq!(counts.addresses(), 2);
        assert_eq!(std::mem::size_of::<PeerKey>(), 8, "a worker's slot");
    }
}
