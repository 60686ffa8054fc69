//! Open client connections per source address, across every worker: the
//! count `max_connections_per_ip` is checked against.
//!
//! Connections from one address land on any worker (`SO_REUSEPORT`), so the
//! count is shared, sharded by address so that accepting workers rarely
//! meet on one lock. An address is keyed in 4 bytes, so that what a worker
//! keeps per connection while the limit is on stays small (8 bytes with
//! its state, see `worker::abuse`): an IPv4 address as itself, an IPv6 one
//! by its /64 prefix (what one host or site is
//! usually given, so one client cannot dodge the limit by cycling through
//! its own prefix), folded to 32 bits.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;
use std::sync::Mutex;

use foldhash::fast::{FixedState, RandomState};

const SHARDS: usize = 64;

/// The 4-byte key of a source address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerKey(u32);

impl PeerKey {
    pub fn of(ip: IpAddr) -> PeerKey {
        match ip {
            IpAddr::V4(v4) => PeerKey(u32::from(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => PeerKey(u32::from(v4)),
                None => {
                    let prefix = u64::from_be_bytes(v6.octets()[..8].try_into().unwrap());
                    let mut h = FixedState::with_seed(0x6d79_7269_6164).build_hasher();
                    h.write_u64(prefix);
                    PeerKey(h.finish() as u32)
                }
            },
        }
    }
}

/// Connections open per source address.
pub struct PeerCounts {
    shards: Box<[Mutex<HashMap<PeerKey, u32, RandomState>>]>,
}

impl Default for PeerCounts {
    fn default() -> Self {
        PeerCounts {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

impl PeerCounts {
    fn shard(&self, key: PeerKey) -> std::sync::MutexGuard<'_, HashMap<PeerKey, u32, RandomState>> {
        self.shards[key.0 as usize % SHARDS]
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
    }
}
