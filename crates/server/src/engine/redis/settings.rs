//! [`RedisSettings`]: where the Redis engine's instances are and how it
//! uses them. A leaf below the engine and its tasks, which all read it; it
//! names only the TLS settings it carries.

use std::time::Duration;

use crate::redis_tls::RedisTls;

/// Where the Redis engine's instances are and how to use them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSettings {
    /// What `rediss://` instances are checked with and shown.
    pub tls: Option<RedisTls>,
    /// One URL per instance (`redis://host:port[/db]`); subjects are spread
    /// over them in this order, so only ever append to the list. Empty in
    /// the Sentinel shape.
    pub urls: Vec<String>,
    /// The Sentinel shape instead of `urls`: one instance, the master the
    /// Sentinels name.
    pub sentinel: Option<SentinelSettings>,
    /// Prefix of every key and channel, so clusters can share a Redis.
    pub prefix: String,
    /// Connect and reply timeout.
    pub timeout: Duration,
    /// Requests waiting for one instance; past it requests are refused.
    pub queue: usize,
    /// Bytes of subjects and data waiting for one instance; past it
    /// requests are refused.
    pub queue_bytes: usize,
    /// Requests waiting for one instance past which publishing pauses, as
    /// it does when a worker's mailbox is full ([`Engine::congested`](crate::engine::Engine::congested)),
    /// instead of running into `queue`'s refusals; 0 = never.
    pub queue_high_water: usize,
    /// How long a request may wait for others to share its round trip.
    pub linger: Duration,
    /// Attaches that can wait ([`Attach::can_wait`](crate::engine::Attach::can_wait)) held per instance for
    /// room past a full `queue`; past it they are refused too.
    pub feed_backlog: usize,
    /// How long a node's presence members outlive its last renewal: a
    /// dead node's members are gone within it. Renewed every third.
    pub presence_lease: Duration,
}

/// Where the master of the Sentinel shape is found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelSettings {
    /// The Sentinels, `redis[s]://[user:password@]host:port` each.
    pub sentinels: Vec<String>,
    /// The master's name, or `redis[s]://[user:password@]NAME[/db]`.
    pub master: String,
}
