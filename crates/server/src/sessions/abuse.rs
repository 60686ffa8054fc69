//! Abuse limits on the client listener, none with a timer per connection:
//! connections per source address (counted at accept, across workers, and
//! refused with 429 when the request arrives), and three token buckets per
//! connection, for publishes, subscription changes and token checks
//! (`connect`, `refresh`), which the once-a-second sweep refills. Their
//! per-connection state lives in side tables indexed by slab slot, like
//! `Sessions::lives`, and exists only while its limit is on: a node without
//! limits pays nothing per connection. The address of each connection is
//! kept while either address limit is on: the connection count, or the
//! failed token checks (`crate::peers::TokenFailures`, shared).

use std::net::IpAddr;

use crate::config::Config;
use crate::peers::{PeerCounts, PeerKey};
use crate::registry::ConnId;

/// What a command spends tokens from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bucket {
    /// `publish` and `send`: one token each.
    Publish,
    /// Subscription changes: one token per subject subscribed or
    /// unsubscribed, so subscribe churn drains it as fast as subscribing.
    Subscribe,
    /// `connect` and `refresh`: one token each, checked or not. A token in
    /// the opening request is not charged: a refused one ends its
    /// connection, so it costs one check per connection, which the
    /// per-address bound on failures covers.
    Token,
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
    token: u32,
}

/// A slot's source address, and what its address count says.
#[derive(Debug, Clone, Copy)]
struct Peer {
    key: PeerKey,
    /// Counted in the connection count under `key`, uncounted when the
    /// connection goes; false when it was over the limit at accept (its
    /// request gets 429) or the count is off.
    counted: bool,
}

pub(crate) struct AbuseLimits {
    per_ip: u32,
    /// Whether `token_failures_per_ip` is on: connections keep their
    /// address for it.
    token_failures: bool,
    publish: Rate,
    subscribe: Rate,
    token: Rate,
    /// Per slab slot, while `per_ip` or `token_failures` is on.
    peers: Vec<Peer>,
    /// Per slab slot, while a rate is on.
    tokens: Vec<Tokens>,
}

impl AbuseLimits {
    pub(crate) fn new(config: &Config) -> AbuseLimits {
        AbuseLimits {
            per_ip: config.max_connections_per_ip,
            token_failures: config.token_failures_per_ip > 0,
            publish: Rate::new(config.client_publish_rate, config.client_publish_burst),
            subscribe: Rate::new(config.client_subscribe_rate, config.client_subscribe_burst),
            // Only a node with a token key checks tokens: elsewhere the
            // bucket would cost every connection 4 bytes for nothing.
            token: if config.token_keys_configured() {
                Rate::new(config.client_token_rate, config.client_token_burst)
            } else {
                Rate::new(0, 0)
            },
            peers: Vec::new(),
            tokens: Vec::new(),
        }
    }

    /// Sets up slot `id` for a connection just accepted from `ip`; false
    /// when its address is at its limit (the connection is then refused).
    pub(crate) fn admit(&mut self, id: ConnId, ip: IpAddr, counts: &PeerCounts) -> bool {
        let slot = id as usize;
        let mut admitted = true;
        if self.per_ip > 0 || self.token_failures {
            let key = PeerKey::of(ip);
            let counted = self.per_ip > 0 && counts.try_add(key, self.per_ip);
            admitted = self.per_ip == 0 || counted;
            let peer = Peer { key, counted };
            grow(&mut self.peers, slot, peer)[slot] = peer;
        }
        if self.publish.on() || self.subscribe.on() || self.token.on() {
            let full = Tokens {
                publish: self.publish.burst,
                subscribe: self.subscribe.burst,
                token: self.token.burst,
            };
            grow(&mut self.tokens, slot, full)[slot] = full;
        }
        admitted
    }

    /// Whether `id` came from an address that was at its limit.
    pub(crate) fn over_ip_limit(&self, id: ConnId) -> bool {
        self.per_ip > 0 && !self.peers[id as usize].counted
    }

    /// `id`'s source address, while a limit needs it.
    pub(crate) fn address(&self, id: ConnId) -> Option<PeerKey> {
        self.peers.get(id as usize).map(|p| p.key)
    }

    /// Uncounts `id`'s address as the connection goes.
    pub(crate) fn release(&mut self, id: ConnId, counts: &PeerCounts) {
        if let Some(peer) = self.peers.get(id as usize).filter(|p| p.counted) {
            counts.remove(peer.key);
        }
    }

    /// Spends `n` tokens of `id`'s `bucket`, all or none; false when there
    /// are not enough (the command is refused).
    pub(crate) fn take(&mut self, id: ConnId, bucket: Bucket, n: u32) -> bool {
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
    pub(crate) fn charge(&mut self, id: ConnId, bucket: Bucket, n: u32) {
        if let Some(tokens) = self.tokens_of(id, bucket) {
            *tokens = tokens.saturating_sub(n);
        }
    }

    fn tokens_of(&mut self, id: ConnId, bucket: Bucket) -> Option<&mut u32> {
        let tokens = self.tokens.get_mut(id as usize)?;
        match bucket {
            Bucket::Publish if self.publish.on() => Some(&mut tokens.publish),
            Bucket::Subscribe if self.subscribe.on() => Some(&mut tokens.subscribe),
            Bucket::Token if self.token.on() => Some(&mut tokens.token),
            _ => None,
        }
    }

    /// The sweep's second: every bucket gains its rate, up to its depth.
    /// Slots of closed connections are refilled too; `admit` resets them.
    pub(crate) fn refill(&mut self) {
        let (publish, subscribe, token) = (self.publish, self.subscribe, self.token);
        for tokens in &mut self.tokens {
            tokens.token = tokens
                .token
                .saturating_add(token.per_second)
                .min(token.burst);
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

    #[test]
    fn token_checks_have_their_bucket_and_failures_keep_the_address() {
        let mut l = AbuseLimits::new(&Config {
            token_failures_per_ip: 10,
            token_hmac_secret: Some("0123456789abcdef0123456789abcdef".into()),
            ..Config::default()
        });
        let ip: IpAddr = "10.0.0.3".parse().unwrap();
        assert!(l.admit(4, ip, &PeerCounts::default()));
        assert_eq!(l.address(4), Some(PeerKey::of(ip)));
        assert!(!l.over_ip_limit(4), "the connection count is off");
        let taken = (0..10).filter(|_| l.take(4, Bucket::Token, 1)).count();
        assert_eq!(taken, 5, "the default burst");
        l.refill();
        assert!(l.take(4, Bucket::Token, 1) && !l.take(4, Bucket::Token, 1));
        let mut off = limits(0, (0, 0), (0, 0));
        off.admit(0, ip, &PeerCounts::default());
        assert_eq!(off.address(0), None, "no address limit, no address kept");
        assert!(off.tokens.is_empty(), "no token key: no token bucket");
    }
}
