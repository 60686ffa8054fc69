//! Per source address, across every worker: open client connections (the
//! count `max_connections_per_ip` is checked against) and failed token
//! checks ([`TokenFailures`], held to `token_failures_per_ip`).
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
use std::net::IpAddr;
use std::sync::MutexGuard;
use std::time::Instant;

use foldhash::fast::RandomState;

use crate::sharded::Sharded;

/// The 8-byte key of a source address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerKey(u64);

/// The top of an IPv4 address's key: a prefix in ff00::/8, IPv6
/// multicast, which is never the source of a connection, so no IPv6 /64
/// has an IPv4 address's key.
const IPV4_KEYS: u64 = 0xff00_0000_0000_0000;

impl PeerKey {
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
/// Sharded by a seeded hash of the key: a key's low bits are often alike
/// (the subnet bits of a site's /64s are mostly zero).
#[derive(Default)]
pub struct PeerCounts {
    shards: Sharded<HashMap<PeerKey, u32, RandomState>>,
}

impl PeerCounts {
    fn shard(&self, key: PeerKey) -> MutexGuard<'_, HashMap<PeerKey, u32, RandomState>> {
        // Nothing runs under this lock but arithmetic and the map.
        self.shards.lock(&key)
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
        self.shards.sum(HashMap::len)
    }
}

/// Addresses one shard of [`TokenFailures`] remembers: 64 Ki in all, 16
/// bytes each. An attacker with more addresses than that (IPv6 /64s are
/// cheap) is not remembered past them, and each of its checks is still
/// one signature check; forgetting instead of refusing keeps such a flood
/// from locking every other address out.
const FAILURE_ADDRESSES_PER_SHARD: usize = 1024;

/// Failed token checks per source address, across every worker: each
/// address has a token bucket `per_minute` deep that refills at
/// `per_minute` a minute; a failure spends a token, and an address with
/// none left has its tokens refused before any signature is checked.
///
/// The bucket is kept as one instant, when it will be full again (the
/// "theoretical arrival time" of GCRA), so a shared bucket needs neither a
/// timer nor a sweep: an address whose instant has passed holds a full
/// bucket and can be forgotten.
pub struct TokenFailures {
    /// Milliseconds one token takes to come back; 0 when the limit is off.
    interval: u64,
    /// How far ahead of now a full bucket's instant may run before the
    /// address is refused: a minute, less one interval.
    tolerance: u64,
    start: Instant,
    /// Per address, when its bucket is full again, in ms since `start`.
    /// Sharded as [`PeerCounts`] is and for its reasons.
    shards: Sharded<HashMap<PeerKey, u64, RandomState>>,
}

impl TokenFailures {
    /// A limit of `per_minute` failures a minute per address; 0 = off.
    pub fn new(per_minute: u32) -> TokenFailures {
        let interval = if per_minute == 0 {
            0
        } else {
            (60_000 / u64::from(per_minute)).max(1)
        };
        TokenFailures {
            interval,
            tolerance: 60_000u64.saturating_sub(interval),
            start: Instant::now(),
            shards: Sharded::default(),
        }
    }

    pub fn on(&self) -> bool {
        self.interval > 0
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn shard(&self, key: PeerKey) -> MutexGuard<'_, HashMap<PeerKey, u64, RandomState>> {
        // Nothing runs under this lock but arithmetic and the map.
        self.shards.lock(&key)
    }

    #[cfg(test)]
    fn shard_index(&self, key: PeerKey) -> usize {
        self.shards.index_of(&key)
    }

    /// Whether `key` may have a token checked now.
    pub fn allows(&self, key: PeerKey) -> bool {
        self.allows_at(key, self.now())
    }

    fn allows_at(&self, key: PeerKey, now: u64) -> bool {
        !self.on()
            || self
                .shard(key)
                .get(&key)
                .is_none_or(|full_at| full_at.saturating_sub(now) <= self.tolerance)
    }

    /// Spends one of `key`'s tokens: a check from it failed.
    pub fn failed(&self, key: PeerKey) {
        self.failed_at(key, self.now());
    }

    fn failed_at(&self, key: PeerKey, now: u64) {
        if !self.on() {
            return;
        }
        let mut shard = self.shard(key);
        if shard.len() >= FAILURE_ADDRESSES_PER_SHARD && !shard.contains_key(&key) {
            shard.retain(|_, full_at| *full_at > now);
            if shard.len() >= FAILURE_ADDRESSES_PER_SHARD {
                return;
            }
        }
        let full_at = shard.entry(key).or_insert(now);
        *full_at = (*full_at).max(now) + self.interval;
    }

    /// Addresses remembered, full buckets not yet forgotten included.
    pub fn addresses(&self) -> usize {
        self.shards.sum(HashMap::len)
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

    #[test]
    fn an_address_fails_a_minute_s_worth_at_once_then_one_per_interval() {
        let failures = TokenFailures::new(3);
        let a = PeerKey::of("10.0.0.1".parse().unwrap());
        let b = PeerKey::of("10.0.0.2".parse().unwrap());
        for _ in 0..3 {
            assert!(failures.allows_at(a, 0));
            failures.failed_at(a, 0);
        }
        assert!(!failures.allows_at(a, 0), "three failures spent the bucket");
        assert!(failures.allows_at(b, 0), "other addresses are apart");
        assert!(!failures.allows_at(a, 19_999));
        assert!(failures.allows_at(a, 20_000), "one token back after 20 s");
        failures.failed_at(a, 20_000);
        assert!(!failures.allows_at(a, 20_000));
        assert!(!TokenFailures::new(0).on());
        failures.failed_at(b, 0);
        assert_eq!(failures.addresses(), 2);
    }

    #[test]
    fn a_full_shard_forgets_addresses_whose_bucket_is_full_again() {
        let failures = TokenFailures::new(60);
        // Keys that all land in one shard.
        let one_shard: Vec<PeerKey> = (0u64..)
            .map(PeerKey)
            .filter(|&k| failures.shard_index(k) == 0)
            .take(FAILURE_ADDRESSES_PER_SHARD + 1)
            .collect();
        let key = |i: usize| one_shard[i.min(FAILURE_ADDRESSES_PER_SHARD)];
        for i in 0..FAILURE_ADDRESSES_PER_SHARD {
            failures.failed_at(key(i), 0);
        }
        failures.failed_at(key(5_000), 500);
        assert_eq!(
            failures.addresses(),
            FAILURE_ADDRESSES_PER_SHARD,
            "full: not remembered"
        );
        failures.failed_at(key(5_000), 1_001);
        assert_eq!(failures.addresses(), 1, "refilled buckets forgotten");
        assert!(failures.allows_at(key(0), 1_001));
    }
}
