//! Abuse limits on the client listener, none with a timer per connection:
//! connections per source address (counted at accept, across workers, and
//! refused with 429 when the request arrives), and two token buckets per
//! connection, one for publishes and one for subscription changes, which
//! the once-a-second sweep refills. Their per-connection state lives in
//! side tables indexed by slab slot, like `Worker::lives`, and exists only
//! while its limit is on: a node without limits pays nothing per
//! connection.

use std::net::IpAddr;

use crate::config::Config;
use crate::peers::{PeerCounts, PeerKey};
use crate::registry::ConnId;

/// What a command spends tokens from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bucket {
    /// `publish` and `send`: one token each.
    Publish,
    /// Subscription changes: one token per subject subscribed or
    /// unsubscribed, so subscribe churn drains it as fast as subscribing.
    Subscribe,
}

/// A token bucket's refill rate per second and its depth; off at rate 0.
#[derive(Debug, Clone, Copy)]
struct Rate {
    per_second: u32,
    burst: u32,
}

impl Rate {
    fn new(per_second: u32, burst: u32) -> Rate {
        let burst = if burst == 0 { per_second } else { burst };
        Rate { per_second, burst }
    }

    fn on(self) -> bool {
        self.per_second > 0
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Tokens {
    publish: u32,
    subscribe: u32,
}

pub(super) struct AbuseLimits {
    per_ip: u32,
    publish: Rate,
    subscribe: Rate,
    /// Per slab slot, while `per_ip` is on: the key its connection is
    /// counted under (uncounted when it goes), or [`PeerKey::REFUSED`] when
    /// it was over the limit at accept and not counted (its request gets
    /// 429). A key rather than an enum keeps a slot at 8 bytes.
    peers: Vec<PeerKey>,
    /// Per slab slot, while a rate is on.
    tokens: Vec<Tokens>,
}

impl AbuseLimits {
    pub(super) fn new(config: &Config) -> AbuseLimits {
        AbuseLimits {
            per_ip: config.max_connections_per_ip,
            publish: Rate::new(config.client_publish_rate, config.client_publish_burst),
            subscribe: Rate::new(config.client_subscribe_rate, config.client_subscribe_burst),
            peers: Vec::new(),
            tokens: Vec::new(),
        }
    }

    /// Sets up slot `id` for a connection just accepted from `ip`; false
    /// when its address is at its limit (the connection is then refused).
    pub(super) fn admit(&mut self, id: ConnId, ip: IpAddr, counts: &PeerCounts) -> bool {
        let slot = id as usize;
        let mut admitted = true;
        if self.per_ip > 0 {
            let key = PeerKey::of(ip);
            admitted = counts.try_add(key, self.per_ip);
            let peer = if admitted { key } else { PeerKey::REFUSED };
            grow(&mut self.peers, slot, PeerKey::REFUSED)[slot] = peer;
        }
        if self.publish.on() || self.subscribe.on() {
            let full = Tokens {
                publish: self.publish.burst,
                subscribe: self.subscribe.burst,
            };
            grow(&mut self.tokens, slot, full)[slot] = full;
        }
        admitted
    }

    /// Whether `id` came from an address that was at its limit.
    pub(super) fn over_ip_limit(&self, id: ConnId) -> bool {
        self.per_ip > 0 && self.peers[id as usize] == PeerKey::REFUSED
    }

    /// Uncounts `id`'s address as the connection goes.
    pub(super) fn release(&mut self, id: ConnId, counts: &PeerCounts) {
        match self.peers.get(id as usize) {
            Some(&key) if key != PeerKey::REFUSED => counts.remove(key),
            _ => {}
        }
    }

    /// Spends `n` tokens of `id`'s `bucket`, all or none; false when there
    /// are not enough (the command is refused).
    pub(super) fn take(&mut self, id: ConnId, bucket: Bucket, n: u32) -> bool {
        let Some(tokens) = self.tokens_of(id, bucket) else {
            return true;
        };
        if *tokens < n {
            return false;
        }
        *tokens -= n;
        true
    }

    /// Spends up to `n` tokens and never refuses: for unsubscribing, which a
    /// client must always be able to do, but which is half of a churn.
    pub(super) fn charge(&mut self, id: ConnId, bucket: Bucket, n: u32) {
        if let Some(tokens) = self.tokens_of(id, bucket) {
            *tokens = tokens.saturating_sub(n);
        }
    }

    fn tokens_of(&mut self, id: ConnId, bucket: Bucket) -> Option<&mut u32> {
        let tokens = self.tokens.get_mut(id as usize)?;
        match bucket {
            Bucket::Publish if self.publish.on() => Some(&mut tokens.publish),
            Bucket::Subscribe if self.subscribe.on() => Some(&mut tokens.subscribe),
            _ => None,
        }
    }

    /// The sweep's second: every bucket gains its rate, up to its depth.
    /// Slots of closed connections are refilled too; `admit` resets them.
    pub(super) fn refill(&mut self) {
        let (publish, subscribe) = (self.publish, self.subscribe);
        for tokens in &mut self.tokens {
            tokens.publish = tokens
                .publish
                .saturating_add(publish.per_second)
                .min(publish.burst);
            tokens.subscribe = tokens
                .subscribe
                .saturating_add(subscribe.per_second)
                .min(subscribe.burst);
        }
    }
}

fn grow<T: Copy>(table: &mut Vec<T>, slot: usize, fill: T) -> &mut Vec<T> {
    if table.len() <= slot {
        table.resize(slot + 1, fill);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(per_ip: u32, publish: (u32, u32), subscribe: (u32, u32)) -> AbuseLimits {
        AbuseLimits::new(&Config {
            max_connections_per_ip: per_ip,
            client_publish_rate: publish.0,
            client_publish_burst: publish.1,
            client_subscribe_rate: subscribe.0,
            client_subscribe_burst: subscribe.1,
            ..Config::default()
        })
    }

    #[test]
    fn buckets_spend_all_or_nothing_and_refill_each_second_to_their_depth() {
        let mut l = limits(0, (2, 5), (0, 0));
        l.admit(3, "10.0.0.1".parse().unwrap(), &PeerCounts::default());
        assert!(l.take(3, Bucket::Publish, 4));
        assert!(!l.take(3, Bucket::Publish, 2), "one left");
        assert!(l.take(3, Bucket::Publish, 1));
        assert!(l.take(3, Bucket::Subscribe, 1_000), "subscribe rate is off");
        l.refill();
        assert!(l.take(3, Bucket::Publish, 2) && !l.take(3, Bucket::Publish, 1));
        for _ in 0..10 {
            l.refill();
        }
        assert!(
            l.take(3, Bucket::Publish, 5),
            "refilled to the burst, no more"
        );
        assert!(!l.take(3, Bucket::Publish, 1));
    }

    #[test]
    fn unsubscribing_is_never_refused_but_drains_the_subscribe_bucket() {
        let mut l = limits(0, (0, 0), (3, 0));
        l.admit(0, "10.0.0.1".parse().unwrap(), &PeerCounts::default());
        l.charge(0, Bucket::Subscribe, 10);
        assert!(!l.take(0, Bucket::Subscribe, 1));
        l.refill();
        assert!(l.take(0, Bucket::Subscribe, 3));
    }

    #[test]
    fn the_address_limit_refuses_the_excess_and_frees_places_on_release() {
        let counts = PeerCounts::default();
        let mut l = limits(2, (0, 0), (0, 0));
        let ip: IpAddr = "10.0.0.9".parse().unwrap();
        let admitted: Vec<bool> = (0..3).map(|id| l.admit(id, ip, &counts)).collect();
        assert_eq!(admitted, [true, true, false]);
        assert!(!l.over_ip_limit(0) && !l.over_ip_limit(1) && l.over_ip_limit(2));
        l.release(2, &counts); // refused: was never counted
        l.release(0, &counts);
        l.admit(0, ip, &counts);
        assert!(!l.over_ip_limit(0));
        assert!(limits(0, (0, 0), (0, 0)).tokens.is_empty());
    }
}
