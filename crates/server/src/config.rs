//! Every setting of `myriad serve`, its default, and where it comes from.
//!
//! One struct serves as the command-line parser, the environment reader and
//! the TOML schema, so a setting cannot exist in one source and be missing in
//! another. Precedence, highest first: command-line flag, `MYRIAD_*`
//! environment variable, the TOML file named by `--config`, the built-in
//! default. docs/operations.md lists every setting.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::backend::Target;
use crate::engine::{RedisSettings, SentinelSettings};
use crate::history::HistoryPolicy;
use crate::hooks::settings::parse_events;
use crate::hooks::settings::MIN_SECRET_LEN;
use crate::hooks::{HookSettings, HookSettingsError};
use crate::namespace::{
    history_policy, presence_policy, proxy_policy, Namespace, Namespaces, PresencePolicy,
    ProxyPolicy,
};
use crate::proxy::{FailMode, ProxySettings};
use crate::redis_tls::{RedisTls, RedisTlsFiles};
use crate::span::Span;
use crate::tls::TlsFiles;

/// The variable of the one key the admin listener had before it had a
/// publish key and an admin key.
const RETIRED_API_KEY_ENV: &str = "MYRIAD_API_KEY";

/// The shortest key that may guard an admin listener reachable beyond this
/// host: short keys fall to guessing, which nothing on the listener slows.
const MIN_REMOTE_KEY: usize = 16;

/// The settings of one node.
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address of the client (WebSocket) listener; every worker binds it with SO_REUSEPORT.
    #[arg(long, env = "MYRIAD_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,

    /// Address of the admin/API listener (publish API, /stats, /metrics, /healthz, /status).
    #[arg(long, env = "MYRIAD_ADMIN_LISTEN", default_value = "127.0.0.1:8081")]
    pub admin_listen: SocketAddr,

    /// Worker threads, each with its own listener and event loop; 0 = one per core.
    #[arg(long, env = "MYRIAD_WORKERS", default_value_t = 0)]
    pub workers: usize,

    /// Path of the pub/sub WebSocket endpoint.
    #[arg(long, env = "MYRIAD_WS_PATH", default_value = "/ws")]
    pub ws_path: String,

    /// Path of the Server-Sent Events endpoint.
    #[arg(long, env = "MYRIAD_SSE_PATH", default_value = "/sse")]
    pub sse_path: String,

    /// Path of the HTTP streaming (chunked newline-delimited JSON) endpoint.
    #[arg(long, env = "MYRIAD_STREAM_PATH", default_value = "/stream")]
    pub stream_path: String,

    /// Path of the long-poll endpoint.
    #[arg(long, env = "MYRIAD_POLL_PATH", default_value = "/poll")]
    pub poll_path: String,

    /// Path of the command endpoint: `POST` one protocol v1 `publish`,
    /// `send` or `history`, answered with its reply (for clients on a
    /// one-way transport).
    #[arg(long, env = "MYRIAD_CMD_PATH", default_value = "/cmd")]
    pub cmd_path: String,

    /// Access-Control-Allow-Origin sent by the HTTP transports: "*", one
    /// origin, or "" for no CORS headers.
    #[arg(long, env = "MYRIAD_CORS_ORIGIN", default_value = "*")]
    pub cors_origin: String,

    /// Milliseconds an EventSource waits before reconnecting (the stream's `retry:`).
    #[arg(long, env = "MYRIAD_SSE_RETRY_MS", default_value_t = 2_000)]
    pub sse_retry_ms: u32,

    /// Seconds between heartbeats on SSE and HTTP streams; 0 = none.
    #[arg(long, env = "MYRIAD_STREAM_HEARTBEAT_INTERVAL", default_value_t = 15)]
    pub stream_heartbeat_interval: u32,

    /// Seconds a long-poll is held when nothing is published before it is
    /// answered with no messages.
    #[arg(long, env = "MYRIAD_POLL_TIMEOUT", default_value_t = 25)]
    pub poll_timeout: u32,

    /// Path of a WebSocket echo endpoint for conformance testing; off when unset.
    #[arg(long, env = "MYRIAD_ECHO_PATH")]
    pub echo_path: Option<String>,

    /// Key of the admin listener's message API (/api/publish,
    /// /api/publish_as, /api/history), for backends; the admin key opens it
    /// too. Needs admin_key. Sent as X-Api-Key, Authorization: Bearer, or
    /// as the password of Authorization: Basic.
    #[arg(long, env = "MYRIAD_PUBLISH_KEY")]
    pub publish_key: Option<String>,

    /// Key of everything on the admin listener but /healthz: /stats,
    /// /metrics, /status, the follow graph's API, and the message API. When
    /// unset the admin listener is open, which is allowed on loopback only.
    #[arg(long, env = "MYRIAD_ADMIN_KEY")]
    pub admin_key: Option<String>,

    /// Connections the admin listener holds at once; one more is answered
    /// 503 and closed. The node keeps this many descriptors out of
    /// max_connections, so neither listener can starve the other.
    #[arg(long, env = "MYRIAD_ADMIN_MAX_CONNECTIONS", default_value_t = 128)]
    pub admin_max_connections: usize,

    /// Of admin_max_connections, how many may be held by connections that
    /// have not yet sent a request carrying the admin or publish key. Past
    /// it, or at the cap, the oldest such connection not in the middle of
    /// a request is closed to make room for a new one, and an idle one is
    /// closed after admin_header_timeout rather than admin_idle_timeout:
    /// whoever reaches the port cannot hold every slot. At most
    /// admin_max_connections.
    #[arg(
        long,
        env = "MYRIAD_ADMIN_UNAUTHENTICATED_CONNECTIONS",
        default_value_t = 32
    )]
    pub admin_unauthenticated_connections: usize,

    /// Seconds an admin request may take from its first byte to the end of
    /// its head; then the connection is closed.
    #[arg(long, env = "MYRIAD_ADMIN_HEADER_TIMEOUT", default_value_t = 10)]
    pub admin_header_timeout: u32,

    /// Seconds an admin request may take to send its whole body (HTTP 408).
    #[arg(long, env = "MYRIAD_ADMIN_BODY_TIMEOUT", default_value_t = 30)]
    pub admin_body_timeout: u32,

    /// Seconds an admin connection may wait for its next request (after
    /// being accepted, or after a reply) before it is closed. A live
    /// /status/events stream is not waiting.
    #[arg(long, env = "MYRIAD_ADMIN_IDLE_TIMEOUT", default_value_t = 60)]
    pub admin_idle_timeout: u32,

    /// Largest opening request head (request line with the URL, headers,
    /// blank line) in bytes on the client listener; HTTP 431 beyond.
    #[arg(long, env = "MYRIAD_MAX_REQUEST_HEAD", default_value_t = 8192)]
    pub max_request_head: usize,

    /// PEM file of the client listener's certificate chain, its own
    /// certificate first. With tls_key set too, the client listener speaks
    /// only TLS 1.3 (wss://, https://). Both files are read again on SIGHUP.
    #[arg(long, env = "MYRIAD_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// PEM file of the private key of tls_cert's first certificate.
    #[arg(long, env = "MYRIAD_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

    /// Serve the admin listener over https too, with tls_cert and tls_key
    /// (reloaded with them on SIGHUP).
    #[arg(long, env = "MYRIAD_ADMIN_TLS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub admin_tls: bool,

    /// Maximum concurrent client connections on this node; more get HTTP 503.
    #[arg(long, env = "MYRIAD_MAX_CONNECTIONS", default_value_t = 1_000_000)]
    pub max_connections: usize,

    /// Maximum size of one WebSocket message in bytes; larger ones close with 1009.
    #[arg(long, env = "MYRIAD_MAX_MESSAGE_SIZE", default_value_t = 65_536)]
    pub max_message_size: usize,

    /// Negotiate permessage-deflate (RFC 7692) on WebSocket upgrades that
    /// offer it: publications are then compressed once per node and shared.
    #[arg(long, env = "MYRIAD_COMPRESSION", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub compression: bool,

    /// zlib level for compressed frames, 1 (fastest) to 9.
    #[arg(long, env = "MYRIAD_COMPRESSION_LEVEL", default_value_t = 2)]
    pub compression_level: u8,

    /// Messages shorter than this many bytes are sent uncompressed.
    #[arg(long, env = "MYRIAD_COMPRESSION_THRESHOLD", default_value_t = 256)]
    pub compression_threshold: usize,

    /// Maximum subscriptions one connection may hold.
    #[arg(long, env = "MYRIAD_MAX_SUBSCRIPTIONS", default_value_t = 1_024)]
    pub max_subscriptions: usize,

    /// Maximum subject length in bytes.
    #[arg(long, env = "MYRIAD_MAX_SUBJECT_LEN", default_value_t = 128)]
    pub max_subject_len: usize,

    /// Bytes of incomplete input (frames and requests split across reads,
    /// fragments of messages) one worker's connections may hold together;
    /// past it, the once-a-second sweep closes those that have held theirs
    /// longest (4005) until the rest fit. At least max_message_size.
    #[arg(long, env = "MYRIAD_MAX_PARTIAL_INPUT_BYTES", default_value_t = 64 << 20)]
    pub max_partial_input_bytes: usize,

    /// Bytes queued for one client before it is closed as a slow consumer (4001).
    #[arg(long, env = "MYRIAD_MAX_OUTBOUND_BYTES", default_value_t = 1_048_576)]
    pub max_outbound_bytes: usize,

    /// SO_SNDBUF for client sockets, capping the kernel memory a stalled reader
    /// can pin; 0 keeps the kernel's autotuning (up to tcp_wmem max, ~4 MB).
    #[arg(long, env = "MYRIAD_SOCKET_SEND_BUFFER", default_value_t = 65_536)]
    pub socket_send_buffer: usize,

    /// Deliveries waiting for one worker beyond which publishing pauses:
    /// workers stop reading publishing connections and the HTTP API waits.
    #[arg(long, env = "MYRIAD_MAILBOX_HIGH_WATER", default_value_t = 65_536)]
    pub mailbox_high_water: usize,

    /// Frames queued on one worker's connections beyond which it stops
    /// taking publications from its mailbox while its sockets are still
    /// draining, so that publishers wait (at mailbox_high_water) instead of
    /// readers that are slow but keeping up being cut as slow consumers.
    #[arg(
        long,
        env = "MYRIAD_WORKER_QUEUE_HIGH_WATER",
        default_value_t = 262_144
    )]
    pub worker_queue_high_water: usize,

    /// How long a worker past worker_queue_high_water waits for any of its
    /// sockets to take bytes before it takes from its mailbox anyway (and
    /// cuts the readers that stalled past max_outbound_bytes): longer
    /// spares readers that are starved of CPU for a moment, shorter frees
    /// the worker from stalled readers sooner.
    #[arg(long, env = "MYRIAD_WORKER_INTAKE_STALL", default_value = "100ms")]
    pub worker_intake_stall: Span,

    /// Listen backlog per worker listener (the kernel caps it at net.core.somaxconn).
    #[arg(long, env = "MYRIAD_BACKLOG", default_value_t = 4_096)]
    pub backlog: u32,

    /// Refuse to start when a host check fails (`myriad doctor`: open
    /// files, kernel memory, conntrack for max_connections); without it
    /// each failing or warning check is logged and the node starts.
    #[arg(long, env = "MYRIAD_STRICT_HOST_CHECKS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub strict_host_checks: bool,

    /// Seconds a connection may take to complete the WebSocket handshake.
    #[arg(long, env = "MYRIAD_HANDSHAKE_TIMEOUT", default_value_t = 10)]
    pub handshake_timeout: u32,

    /// Seconds a connection with no subscriptions may stay silent; 0 = never closed.
    #[arg(long, env = "MYRIAD_IDLE_TIMEOUT", default_value_t = 300)]
    pub idle_timeout: u32,

    /// Seconds of client silence after which the server has sent a ping (each
    /// connection's ping comes between half of it and all of it, fixed per
    /// connection, so connections set up together are not pinged together);
    /// 0 = no heartbeats.
    #[arg(long, env = "MYRIAD_HEARTBEAT_INTERVAL", default_value_t = 25)]
    pub heartbeat_interval: u32,

    /// Seconds the client has to answer a ping before it is closed (4002).
    #[arg(long, env = "MYRIAD_HEARTBEAT_TIMEOUT", default_value_t = 10)]
    pub heartbeat_timeout: u32,

    /// Seconds a WebSocket client may take to finish a message it began
    /// (from its first byte through its last fragment) before it is closed
    /// (4004); 0 = never. Raise it with max_message_size for slow links.
    #[arg(long, env = "MYRIAD_PARTIAL_MESSAGE_TIMEOUT", default_value_t = 10)]
    pub partial_message_timeout: u32,

    /// Seconds a closing connection may take to finish the close handshake.
    #[arg(long, env = "MYRIAD_CLOSE_TIMEOUT", default_value_t = 5)]
    pub close_timeout: u32,

    /// Seconds graceful shutdown waits for clients to take their close frames.
    #[arg(long, env = "MYRIAD_SHUTDOWN_TIMEOUT", default_value_t = 10)]
    pub shutdown_timeout: u32,

    /// Maximum body of an admin API request in bytes (HTTP 413 beyond).
    #[arg(long, env = "MYRIAD_MAX_HTTP_BODY", default_value_t = 1_048_576)]
    pub max_http_body: usize,

    /// Live `/status/events` streams the admin listener serves at once
    /// (each open status page holds one); more get HTTP 503. 0 turns them off.
    #[arg(long, env = "MYRIAD_MAX_STATUS_STREAMS", default_value_t = 16)]
    pub max_status_streams: usize,

    /// Publications kept per subject for recovery, unless a namespace says
    /// otherwise; 0 turns history off.
    #[arg(long, env = "MYRIAD_HISTORY_SIZE", default_value_t = 100)]
    pub history_size: usize,

    /// How long a publication is kept in history, e.g. "90s", "5m", "1h";
    /// "0s" keeps it until size or memory push it out.
    #[arg(long, env = "MYRIAD_HISTORY_TTL", default_value = "5m")]
    pub history_ttl: Span,

    /// Memory all history on the node may hold, in bytes; past it the
    /// oldest publications on the node are evicted first.
    #[arg(long, env = "MYRIAD_HISTORY_MAX_BYTES", default_value_t = 256 << 20)]
    pub history_max_bytes: usize,

    /// Members a presence subject may hold (a namespace may set its own):
    /// a subscribe past it is refused with `presence_full`.
    #[arg(long, env = "MYRIAD_PRESENCE_MAX_MEMBERS", default_value_t = 1000)]
    pub presence_max_members: usize,

    /// Bytes a token's `info` claim may take (as compact JSON): it is shown
    /// with each presence membership of the connection. A token with more
    /// is refused (`invalid_token`, counted as `token_info`).
    #[arg(long, env = "MYRIAD_PRESENCE_INFO_MAX_BYTES", default_value_t = 512)]
    pub presence_info_max_bytes: usize,

    /// With `engine = redis`: how long a node's presence members outlive
    /// its last lease renewal (renewed every third of it), so the bound
    /// within which a dead node's members vanish. 3s to 10m.
    #[arg(long, env = "MYRIAD_PRESENCE_LEASE", default_value = "15s")]
    pub presence_lease: Span,

    /// Directory of the node's persistent state (the follow graph), created
    /// if missing. One node at a time may use it.
    #[arg(long, env = "MYRIAD_DATA_DIR", default_value = "myriad-data")]
    pub data_dir: PathBuf,

    /// Memory the follow graph's page cache may take, in MiB.
    #[arg(long, env = "MYRIAD_GRAPH_CACHE_MB", default_value_t = 64)]
    pub graph_cache_mb: usize,

    /// Where positions, history and routing live: `memory` (this node
    /// alone) or `redis` (every node sharing the instances of `redis_url`).
    #[arg(long, env = "MYRIAD_ENGINE", value_enum, default_value_t = EngineKind::Memory)]
    pub engine: EngineKind,

    /// A Redis 7 instance of the cluster, `redis://[user:password@]host:port[/db]`
    /// (`rediss://` for TLS), for `engine = redis`. Repeatable, one per instance: subjects are spread
    /// over them in this order, so new ones are only ever appended.
    /// Comma-separated in the environment.
    #[arg(long = "redis-url", env = "MYRIAD_REDIS_URLS", value_delimiter = ',')]
    pub redis_urls: Vec<String>,

    /// A Sentinel of the Redis master the engine uses, instead of
    /// `redis_url` (the Sentinel shape): `redis[s]://[user:password@]host:port`,
    /// with the Sentinel's own credentials and TLS. Repeatable; asked in
    /// order. Comma-separated in the environment.
    #[arg(
        long = "redis-sentinel",
        env = "MYRIAD_REDIS_SENTINELS",
        value_delimiter = ','
    )]
    pub redis_sentinels: Vec<String>,

    /// The name the Sentinels know the master by, or
    /// `redis[s]://[user:password@]NAME[/db]` for the master's credentials,
    /// TLS and database.
    #[arg(long, env = "MYRIAD_REDIS_SENTINEL_MASTER")]
    pub redis_sentinel_master: Option<String>,

    /// PEM file of the certificate authorities a `rediss://` Redis's
    /// certificate is checked against, instead of the system's roots.
    #[arg(long, env = "MYRIAD_REDIS_TLS_CA")]
    pub redis_tls_ca: Option<PathBuf>,

    /// PEM file of the certificate chain the node shows a `rediss://`
    /// Redis that asks for one (`tls-auth-clients`); with redis_tls_key.
    #[arg(long, env = "MYRIAD_REDIS_TLS_CERT")]
    pub redis_tls_cert: Option<PathBuf>,

    /// PEM file of the private key of redis_tls_cert's first certificate.
    #[arg(long, env = "MYRIAD_REDIS_TLS_KEY")]
    pub redis_tls_key: Option<PathBuf>,

    /// Prefix of the cluster's keys and channels, so clusters can share a Redis.
    #[arg(long, env = "MYRIAD_REDIS_PREFIX", default_value = "myriad")]
    pub redis_prefix: String,

    /// How long the node waits for Redis to connect or to answer; past it
    /// the request fails (`redis_timeout`) and the node reconnects.
    #[arg(long, env = "MYRIAD_REDIS_TIMEOUT", default_value = "5s")]
    pub redis_timeout: Span,

    /// Requests that may wait for one Redis instance; past it requests are
    /// refused at once (`redis_busy`), so a stalled Redis cannot grow the node.
    #[arg(long, env = "MYRIAD_REDIS_QUEUE", default_value_t = 65_536)]
    pub redis_queue: usize,

    /// Requests waiting for one Redis instance past which publishing
    /// pauses, as at mailbox_high_water (workers stop reading, the HTTP
    /// API waits), so that publishers outrunning Redis wait instead of
    /// being refused at redis_queue; 0 = never (refusals only). Below
    /// redis_queue, which still bounds what arrives before the pause.
    #[arg(long, env = "MYRIAD_REDIS_QUEUE_HIGH_WATER", default_value_t = 0)]
    pub redis_queue_high_water: usize,

    /// Bytes of publications (data and subject) that may wait for one Redis
    /// instance; past it requests are refused at once (`redis_busy`), so a
    /// stalled Redis holds at most this much of the node's memory however
    /// large the messages. At least `max_message_size` and `max_http_body`.
    #[arg(long, env = "MYRIAD_REDIS_QUEUE_BYTES", default_value_t = 64 << 20)]
    pub redis_queue_bytes: usize,

    /// How long a request may wait for others to share its round trip to
    /// Redis (`0s`: it goes as soon as the previous round trip is back).
    /// Publishes spread thinly over many subjects then share a script call
    /// instead of waking Redis once each, at up to this much latency.
    #[arg(long, env = "MYRIAD_REDIS_LINGER", default_value = "0s")]
    pub redis_linger: Span,

    /// Attaches the node makes for users' graph feeds that may wait per
    /// Redis instance for room once redis_queue is full, instead of being
    /// refused (an error to the client, and the keeper asking again every
    /// 500 ms); past it they are refused too (`redis_busy`).
    #[arg(long, env = "MYRIAD_REDIS_FEED_BACKLOG", default_value_t = 262_144)]
    pub redis_feed_backlog: usize,

    /// Where lifecycle webhooks go, an `http://` or `https://` URL; unset,
    /// no hooks. Needs hook_secret.
    #[arg(long, env = "MYRIAD_HOOK_URL")]
    pub hook_url: Option<String>,

    /// The HMAC-SHA256 key that signs every hook request, at least 32 bytes.
    #[arg(long, env = "MYRIAD_HOOK_SECRET")]
    pub hook_secret: Option<String>,

    /// Which lifecycle events go out, comma-separated: occupied, vacated,
    /// online, offline, join, leave.
    #[arg(
        long,
        env = "MYRIAD_HOOK_EVENTS",
        default_value = "occupied,vacated,online,offline,join,leave"
    )]
    pub hook_events: String,

    /// How long vacated and offline are held; a return within it cancels
    /// both events.
    #[arg(long, env = "MYRIAD_HOOK_DELAY", default_value = "5s")]
    pub hook_delay: Span,

    /// How long the first ready event waits for others to share its request.
    #[arg(long, env = "MYRIAD_HOOK_BATCH_WINDOW", default_value = "100ms")]
    pub hook_batch_window: Span,

    /// The most events in one hook request.
    #[arg(long, env = "MYRIAD_HOOK_BATCH_SIZE", default_value_t = 100)]
    pub hook_batch_size: usize,

    /// The most hook events held or waiting; past it they are dropped and
    /// counted.
    #[arg(long, env = "MYRIAD_HOOK_QUEUE", default_value_t = 100_000)]
    pub hook_queue: usize,

    /// How many times a hook batch is sent again after a 5xx, 408, 429 or
    /// no answer before it is dropped and counted.
    #[arg(long, env = "MYRIAD_HOOK_RETRIES", default_value_t = 8)]
    pub hook_retries: u32,

    /// The first retry's wait, doubled each retry up to 30 s.
    #[arg(long, env = "MYRIAD_HOOK_BACKOFF", default_value = "500ms")]
    pub hook_backoff: Span,

    /// Where a `connect` command's token goes for the backend to judge, an
    /// `http://` URL; unset, the node checks it with its own keys.
    #[arg(long, env = "MYRIAD_PROXY_CONNECT_URL")]
    pub proxy_connect_url: Option<String>,

    /// Where every subscribe is asked about first, an `http://` URL (a
    /// namespace may switch it off with `subscribe_proxy = false`).
    #[arg(long, env = "MYRIAD_PROXY_SUBSCRIBE_URL")]
    pub proxy_subscribe_url: Option<String>,

    /// Where every client publish is asked about first, an `http://` URL
    /// (a namespace may switch it off with `publish_proxy = false`).
    #[arg(long, env = "MYRIAD_PROXY_PUBLISH_URL")]
    pub proxy_publish_url: Option<String>,

    /// How long a proxy call may take, connect to the answer's last byte.
    #[arg(long, env = "MYRIAD_PROXY_TIMEOUT", default_value = "1s")]
    pub proxy_timeout: Span,

    /// What a proxy call with no verdict (timeout, error, malformed answer)
    /// lets its command do: `closed` refuses it (`proxy_unavailable`),
    /// `open` lets it go on as if no proxy were set.
    #[arg(long, env = "MYRIAD_PROXY_FAIL", value_enum, default_value_t = FailMode::Closed)]
    pub proxy_fail: FailMode,

    /// Proxy calls out at once, node-wide; a command that would pass it
    /// is refused with `proxy_busy`.
    #[arg(long, env = "MYRIAD_PROXY_MAX_IN_FLIGHT", default_value_t = 10_000)]
    pub proxy_max_in_flight: usize,

    /// PEM certificate authorities an `https://` backend's certificate is
    /// checked against (hooks and proxies); without it, the system's
    /// trusted roots.
    #[arg(long, env = "MYRIAD_BACKEND_CA_FILE")]
    pub backend_ca_file: Option<PathBuf>,

    /// The largest proxy answer body read; a longer one is a failure
    /// (handled per proxy_fail).
    #[arg(long, env = "MYRIAD_PROXY_MAX_ANSWER_BYTES", default_value_t = 65_536)]
    pub proxy_max_answer_bytes: usize,

    /// Commands of one connection held behind one of its commands parked
    /// for a proxy verdict (they run in order once the verdicts come); one
    /// past it is refused with `too_many_held`. 0 holds none.
    #[arg(long, env = "MYRIAD_PROXY_MAX_HELD", default_value_t = 64)]
    pub proxy_max_held: usize,

    /// Where the follow graph lives: `sqlite` (a file in `data_dir`, this
    /// node's alone) or `redis` (one Redis the cluster's nodes share, keys
    /// under `<redis_prefix>:g:`; a follow through any node reaches the
    /// follower's connections on every node).
    #[arg(long, env = "MYRIAD_GRAPH_STORE", value_enum, default_value_t = GraphStoreKind::Sqlite)]
    pub graph_store: GraphStoreKind,

    /// The Redis of `graph_store = redis`, `redis://[user:password@]host:port[/db]`;
    /// the first `redis_url` when not given.
    #[arg(long, env = "MYRIAD_GRAPH_REDIS_URL")]
    pub graph_redis_url: Option<String>,

    /// The most users one user may follow; a follow past it is refused
    /// (HTTP 422, `following_limit`). Also bounds the feeds a connection is
    /// subscribed to when its user connects.
    #[arg(long, env = "MYRIAD_MAX_FOLLOWING", default_value_t = 5_000)]
    pub max_following: u64,

    /// Client connections one source address may hold open (IPv6: one
    /// /64, so a /48 holds 65,536 times as many); more get HTTP 429. 0 = no limit (the default: behind a proxy,
    /// every client has the proxy's address).
    #[arg(long, env = "MYRIAD_MAX_CONNECTIONS_PER_IP", default_value_t = 0)]
    pub max_connections_per_ip: u32,

    /// Publishes (and sends) a connection may make per second, on average;
    /// more are refused with `rate_limited`. 0 = no limit.
    #[arg(long, env = "MYRIAD_CLIENT_PUBLISH_RATE", default_value_t = 0)]
    pub client_publish_rate: u32,

    /// Publishes a connection may make at once before the rate applies;
    /// 0 = the same as the rate.
    #[arg(long, env = "MYRIAD_CLIENT_PUBLISH_BURST", default_value_t = 0)]
    pub client_publish_burst: u32,

    /// Subscription changes (each subject subscribed or unsubscribed) a
    /// connection may make per second, on average; subscribes past it are
    /// refused with `rate_limited`. Bounds subscribe churn too. 0 = no limit.
    #[arg(long, env = "MYRIAD_CLIENT_SUBSCRIBE_RATE", default_value_t = 0)]
    pub client_subscribe_rate: u32,

    /// Subscription changes a connection may make at once before the rate
    /// applies; 0 = the same as the rate.
    #[arg(long, env = "MYRIAD_CLIENT_SUBSCRIBE_BURST", default_value_t = 0)]
    pub client_subscribe_burst: u32,

    /// `connect` and `refresh` commands a connection may send per second,
    /// on average: each costs a signature check. More are refused with
    /// `rate_limited`, unchecked. 0 = no limit. An honest client sends one
    /// `connect` and a `refresh` every few minutes.
    #[arg(long, env = "MYRIAD_CLIENT_TOKEN_RATE", default_value_t = 1)]
    pub client_token_rate: u32,

    /// `connect` and `refresh` commands a connection may send at once
    /// before the rate applies; 0 = the same as the rate.
    #[arg(long, env = "MYRIAD_CLIENT_TOKEN_BURST", default_value_t = 5)]
    pub client_token_burst: u32,

    /// Failed token checks one source address (IPv6: one /64) may cause
    /// per minute, across workers and connections, wherever the token came
    /// (the opening request, `connect`, `refresh`); past them its tokens
    /// are refused with `rate_limited` (HTTP 429) before any signature
    /// check, until the minute's bucket refills. 0 = no limit (the
    /// default: behind a proxy every client has the proxy's address).
    #[arg(long, env = "MYRIAD_TOKEN_FAILURES_PER_IP", default_value_t = 0)]
    pub token_failures_per_ip: u32,

    /// Origins (`https://app.example`) whose pages may open connections
    /// (WebSocket and the HTTP transports); `*` allows all. Empty: every
    /// origin on a loopback listener, otherwise only the node's own (the
    /// request's Host). Repeatable; comma-separated in the environment.
    /// `--allowed-origin`, the flag's first name, stays an alias so that
    /// scripts written for it keep working.
    #[arg(
        long = "allowed-origins",
        alias = "allowed-origin",
        env = "MYRIAD_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    pub allowed_origins: Vec<String>,

    /// Secret that connection tokens may be signed with (HS256), at least
    /// 32 bytes. Any token key makes the node check tokens. Not a file, so
    /// not read again on SIGHUP.
    #[arg(long, env = "MYRIAD_TOKEN_HMAC_SECRET", hide_env_values = true)]
    pub token_hmac_secret: Option<String>,

    /// PEM file of a public key tokens may be signed for: RSA (RS256),
    /// P-256 (ES256) or Ed25519 (EdDSA). Repeatable; comma-separated in
    /// the environment. Read again on SIGHUP.
    #[arg(
        long = "token-public-key",
        env = "MYRIAD_TOKEN_PUBLIC_KEYS",
        value_delimiter = ','
    )]
    pub token_public_keys: Vec<PathBuf>,

    /// JWKS file (a JSON Web Key Set) of token keys, matched by `kid`.
    /// Read again on SIGHUP.
    #[arg(long, env = "MYRIAD_TOKEN_JWKS")]
    pub token_jwks: Option<PathBuf>,

    /// When set, a token must carry this audience (`aud`).
    #[arg(long, env = "MYRIAD_TOKEN_AUDIENCE")]
    pub token_audience: Option<String>,

    /// When set, a token must carry this issuer (`iss`).
    #[arg(long, env = "MYRIAD_TOKEN_ISSUER")]
    pub token_issuer: Option<String>,

    /// Seconds of clock skew allowed on a token's `exp` and `nbf`.
    #[arg(long, env = "MYRIAD_TOKEN_LEEWAY", default_value_t = 0)]
    pub token_leeway: u32,

    /// Whether connections without a token may subscribe and publish,
    /// outside namespaces that say otherwise. Default: true on a node that
    /// checks no tokens, false on one with a token key.
    #[arg(long, env = "MYRIAD_ANONYMOUS")]
    pub anonymous: Option<bool>,

    /// Whether clients may publish, outside namespaces that say otherwise
    /// (the HTTP API always may).
    #[arg(long, env = "MYRIAD_CLIENT_PUBLISH", default_value_t = true, action = clap::ArgAction::Set)]
    pub client_publish: bool,

    /// Whether clients may read history with the `history` command,
    /// outside namespaces that say otherwise.
    #[arg(long, env = "MYRIAD_CLIENT_HISTORY", default_value_t = true, action = clap::ArgAction::Set)]
    pub client_history: bool,

    /// Per-prefix settings (`[[namespace]]` tables, config file only).
    #[arg(skip)]
    pub namespace: Vec<Namespace>,

    /// Log filter (tracing EnvFilter syntax), e.g. "info" or "myriad_server=debug".
    #[arg(long, env = "MYRIAD_LOG", default_value = "info")]
    pub log: String,
}

impl Config {
    /// Whether any token key setting is given: the node checks tokens.
    pub fn token_keys_configured(&self) -> bool {
        self.token_hmac_secret.is_some()
            || !self.token_public_keys.is_empty()
            || self.token_jwks.is_some()
    }
}

impl Default for Config {
    fn default() -> Self {
        /// Parses an empty command line so the defaults live in one place: the attributes above.
        #[derive(Parser)]
        struct Defaults {
            #[command(flatten)]
            config: Config,
        }
        Defaults::parse_from(["myriad"]).config
    }
}

/// Why the configuration could not be assembled.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("invalid setting: {0}")]
    Invalid(String),
}

impl Config {
    /// Builds the effective configuration from parsed arguments and an
    /// optional TOML file: values that came from a flag or the environment
    /// win over the file, the file wins over built-in defaults.
    pub fn assemble(matches: &ArgMatches, file: Option<&Path>) -> Result<Config, ConfigError> {
        if std::env::var_os(RETIRED_API_KEY_ENV).is_some() {
            // Ignoring it would leave an API its operator meant to close open.
            return Err(ConfigError::Invalid(format!(
                "{RETIRED_API_KEY_ENV} is no longer read: set MYRIAD_ADMIN_KEY, and \
                 MYRIAD_PUBLISH_KEY for publishers (docs/operations.md)"
            )));
        }
        let from_args =
            Config::from_arg_matches(matches).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let config = match file {
            None => from_args,
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_owned(),
                    source,
                })?;
                let mut table: toml::Table =
                    toml::from_str(&text).map_err(|source| ConfigError::Parse {
                        path: path.to_owned(),
                        source,
                    })?;
                let args_table =
                    toml::Table::try_from(&from_args).expect("Config serializes to a table");
                for (key, value) in args_table {
                    // Settings that are not flags (`#[arg(skip)]`) come from
                    // the file only.
                    let explicit = matches.try_contains_id(&key).is_ok()
                        && !matches!(
                            matches.value_source(&key),
                            None | Some(ValueSource::DefaultValue)
                        );
                    if explicit || !table.contains_key(&key) {
                        table.insert(key, value);
                    }
                }
                Config::deserialize(table).map_err(|source| ConfigError::Parse {
                    path: path.to_owned(),
                    source,
                })?
            }
        };
        config.validate()?;
        Ok(config)
    }

    /// Rejects settings that cannot work together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let check = |ok: bool, what: &str| {
            if ok {
                Ok(())
            } else {
                Err(ConfigError::Invalid(what.to_owned()))
            }
        };
        check(self.workers <= 64, "workers must be at most 64")?;
        self.validate_admin()?;
        self.hooks()?;
        self.proxies()?;
        check(self.ws_path.starts_with('/'), "ws_path must start with '/'")?;
        check(
            self.tls_cert.is_some() == self.tls_key.is_some(),
            "tls_cert and tls_key go together: set both or neither",
        )?;
        check(
            !self.admin_tls || self.tls_cert.is_some(),
            "admin_tls needs tls_cert and tls_key",
        )?;
        self.validate_redis()?;
        if let Some(echo) = &self.echo_path {
            check(echo.starts_with('/'), "echo_path must start with '/'")?;
            check(echo != &self.ws_path, "echo_path must differ from ws_path")?;
        }
        check(
            (1024..=65_536).contains(&self.max_request_head),
            "max_request_head must be between 1024 and 65536",
        )?;
        check(
            self.max_message_size >= 125,
            "max_message_size must be at least 125",
        )?;
        check(
            (1..=9).contains(&self.compression_level),
            "compression_level must be between 1 and 9",
        )?;
        check(
            self.mailbox_high_water >= 1,
            "mailbox_high_water must be at least 1",
        )?;
        check(
            self.worker_queue_high_water >= 1,
            "worker_queue_high_water must be at least 1",
        )?;
        check(
            self.max_subject_len >= 1,
            "max_subject_len must be at least 1",
        )?;
        check(
            self.max_subscriptions >= 1,
            "max_subscriptions must be at least 1",
        )?;
        check(
            self.max_outbound_bytes >= self.max_message_size,
            "max_outbound_bytes must be at least max_message_size",
        )?;
        check(
            self.max_partial_input_bytes >= self.max_message_size,
            "max_partial_input_bytes must be at least max_message_size",
        )?;
        check(
            self.heartbeat_interval == 0 || self.heartbeat_timeout >= 1,
            "heartbeat_timeout must be at least 1 when heartbeats are on",
        )?;
        let ttl_ok = |ttl: Duration| ttl.is_zero() || ttl >= Duration::from_millis(1);
        check(
            ttl_ok(self.history_ttl.0)
                && self
                    .namespace
                    .iter()
                    .all(|ns| ns.history_ttl.is_none_or(|t| ttl_ok(t.0))),
            "a history_ttl must be 0s or at least 1ms",
        )?;
        check(
            self.namespace.len() < usize::from(u16::MAX),
            "at most 65,534 namespaces",
        )?;
        for ns in &self.namespace {
            check(
                !ns.prefix.is_empty(),
                "a namespace prefix must not be empty",
            )?;
            let twins = self.namespace.iter().filter(|o| o.prefix == ns.prefix);
            check(twins.count() == 1, "namespace prefixes must differ")?;
        }
        Ok(())
    }

    /// The hook settings, `None` without `hook_url`; refuses a bad one
    /// with a message naming the setting.
    pub fn hooks(&self) -> Result<Option<HookSettings>, ConfigError> {
        let invalid = |e: HookSettingsError| ConfigError::Invalid(e.to_string());
        let Some(url) = &self.hook_url else {
            return Ok(None);
        };
        let Some(secret) = &self.hook_secret else {
            return Err(ConfigError::Invalid(
                "hook_url needs hook_secret (at least 32 bytes)".into(),
            ));
        };
        let mut settings = HookSettings::new(url.clone(), secret.as_bytes());
        settings.ca = self.backend_ca_file.clone();
        settings.events = parse_events(&self.hook_events).map_err(invalid)?;
        settings.delay = self.hook_delay.0;
        settings.batch_window = self.hook_batch_window.0;
        settings.batch_size = self.hook_batch_size;
        settings.queue_bound = self.hook_queue;
        settings.retry_bound = self.hook_retries;
        settings.backoff = self.hook_backoff.0;
        settings.check().map_err(invalid)?;
        Ok(Some(settings))
    }

    /// The proxies' settings, `None` when no proxy URL is set; refuses a
    /// URL that is not `http://` naming its setting, a `hook_secret` too
    /// short to sign with, and a namespace switch with no URL behind it.
    pub fn proxies(&self) -> Result<Option<ProxySettings>, ConfigError> {
        let invalid = |what: String| ConfigError::Invalid(what);
        let urls = [
            ("proxy_connect_url", &self.proxy_connect_url),
            ("proxy_subscribe_url", &self.proxy_subscribe_url),
            ("proxy_publish_url", &self.proxy_publish_url),
        ];
        let mut targets: [Option<Target>; 3] = Default::default();
        for (i, (name, url)) in urls.into_iter().enumerate() {
            if let Some(url) = url {
                let target = Target::parse(url, self.backend_ca_file.as_deref())
                    .map_err(|e| invalid(format!("{name} {url:?}: {e}")))?;
                targets[i] = Some(target);
            }
        }
        for ns in &self.namespace {
            if ns.subscribe_proxy == Some(true) && targets[1].is_none() {
                return Err(invalid(format!(
                    "namespace {:?} has subscribe_proxy = true: it needs proxy_subscribe_url",
                    ns.prefix
                )));
            }
            if ns.publish_proxy == Some(true) && targets[2].is_none() {
                return Err(invalid(format!(
                    "namespace {:?} has publish_proxy = true: it needs proxy_publish_url",
                    ns.prefix
                )));
            }
        }
        if targets.iter().all(Option::is_none) {
            return Ok(None);
        }
        let secret = self.hook_secret.as_ref().map(|s| s.as_bytes().to_vec());
        if let Some(secret) = &secret {
            if secret.len() < MIN_SECRET_LEN {
                return Err(invalid(HookSettingsError::Secret(secret.len()).to_string()));
            }
        }
        if self.proxy_max_in_flight == 0 {
            return Err(invalid("proxy_max_in_flight must be at least 1".into()));
        }
        if self.proxy_max_answer_bytes < 64 {
            return Err(invalid("proxy_max_answer_bytes must be at least 64".into()));
        }
        if self.proxy_timeout.0.is_zero() {
            return Err(invalid("proxy_timeout must be more than 0s".into()));
        }
        Ok(Some(ProxySettings {
            targets,
            timeout: self.proxy_timeout.0,
            fail: self.proxy_fail,
            max_in_flight: self.proxy_max_in_flight,
            max_answer_bytes: self.proxy_max_answer_bytes,
            secret,
        }))
    }

    /// Which subjects' subscribes and publishes are asked about: all of
    /// them where the URL is set, but in the namespaces that switch it off.
    pub fn proxy_policies(&self) -> Namespaces<ProxyPolicy> {
        let node = ProxyPolicy {
            subscribe: self.proxy_subscribe_url.is_some(),
            publish: self.proxy_publish_url.is_some(),
        };
        Namespaces::new(node, &self.namespace, proxy_policy)
    }

    /// The admin listener's settings: keys that can work, a key wherever
    /// the listener is reachable beyond this host, and limits that are on.
    fn validate_admin(&self) -> Result<(), ConfigError> {
        let invalid = |what: String| Err(ConfigError::Invalid(what));
        if self.admin_key.as_deref() == Some("") || self.publish_key.as_deref() == Some("") {
            return invalid("admin_key and publish_key must not be empty".into());
        }
        if self.publish_key.is_some() && self.admin_key.is_none() {
            // Else the endpoints only the admin key may open would be open
            // to anyone, while a key is configured.
            return invalid("publish_key needs admin_key".into());
        }
        if self.publish_key.is_some() && self.publish_key == self.admin_key {
            return invalid("publish_key and admin_key must differ".into());
        }
        if self.admin_key.is_none() && !self.admin_listen.ip().to_canonical().is_loopback() {
            return invalid(format!(
                "admin_listen {} is reachable beyond this host: set admin_key \
                 (and publish_key for publishers), or listen on 127.0.0.1",
                self.admin_listen
            ));
        }
        let short = |key: &Option<String>| key.as_ref().is_some_and(|k| k.len() < MIN_REMOTE_KEY);
        if !self.admin_listen.ip().to_canonical().is_loopback()
            && (short(&self.admin_key) || short(&self.publish_key))
        {
            return invalid(format!(
                "admin_listen {} is reachable beyond this host: its keys must be at \
                 least {MIN_REMOTE_KEY} bytes",
                self.admin_listen
            ));
        }
        if self.admin_max_connections == 0 {
            return invalid("admin_max_connections must be at least 1".into());
        }
        if self.admin_unauthenticated_connections == 0 {
            // Every connection starts unauthenticated: none could stay.
            return invalid("admin_unauthenticated_connections must be at least 1".into());
        }
        if self.admin_header_timeout == 0
            || self.admin_body_timeout == 0
            || self.admin_idle_timeout == 0
        {
            return invalid(
                "admin_header_timeout, admin_body_timeout and admin_idle_timeout must be at least 1"
                    .into(),
            );
        }
        Ok(())
    }

    /// Which subjects keep presence: off outside the namespaces that turn
    /// it on.
    pub fn presence_policies(&self) -> Namespaces<PresencePolicy> {
        let node = PresencePolicy {
            on: false,
            max_members: self.presence_max_members,
            join_leave: false,
        };
        Namespaces::new(node, &self.namespace, presence_policy)
    }

    fn validate_redis(&self) -> Result<(), ConfigError> {
        let invalid = |what: String| Err(ConfigError::Invalid(what));
        let sentinel = !self.redis_sentinels.is_empty();
        if sentinel && !self.redis_urls.is_empty() {
            return invalid(
                "redis_url and redis_sentinel are two shapes of Redis (instances the node \
                 spreads subjects over, or one master found through Sentinels): give one or the other"
                    .into(),
            );
        }
        if sentinel != self.redis_sentinel_master.is_some() {
            return invalid(
                "redis_sentinel and redis_sentinel_master go together: the Sentinels, and \
                 the name of the master they watch"
                    .into(),
            );
        }
        if sentinel
            && self.engine == EngineKind::Memory
            && self.graph_store == GraphStoreKind::Sqlite
        {
            return invalid(
                "redis_sentinel is set but engine is memory: add --engine redis".into(),
            );
        }
        if let Some(settings) = &self.redis_settings(None).sentinel {
            if let Err(e) = myriad_graph::redis_store::sentinel::Sentinels::new(
                &settings.sentinels,
                &settings.master,
                None,
                self.redis_timeout.into(),
            ) {
                return invalid(e.to_string());
            }
        }
        if let Some(ns) = self.namespace.iter().find(|ns| {
            ns.join_leave == Some(true)
                && (ns.presence != Some(true) || self.engine == EngineKind::Redis)
        }) {
            return invalid(format!(
                "namespace {:?} has join_leave = true: it needs presence = true, and the memory \
                 engine (join/leave events over Redis are not built yet)",
                ns.prefix
            ));
        }
        let lease = Duration::from(self.presence_lease);
        if !(Duration::from_secs(3)..=Duration::from_secs(600)).contains(&lease) {
            return invalid(format!(
                "presence_lease ({}) must be from 3s to 10m: renewed every third of it, \
                 it bounds how long a dead node's members are listed",
                self.presence_lease
            ));
        }
        match self.engine {
            EngineKind::Redis if self.redis_urls.is_empty() && !sentinel => {
                return invalid(
                    "engine = redis needs at least one redis_url, or redis_sentinel".into(),
                );
            }
            EngineKind::Memory
                if !self.redis_urls.is_empty() && self.graph_store == GraphStoreKind::Sqlite =>
            {
                return invalid("redis_url is set but engine is memory: add --engine redis".into());
            }
            _ => {}
        }
        if self.graph_store == GraphStoreKind::Redis
            && self.graph_redis_url().is_none()
            && !sentinel
        {
            return invalid(
                "graph_store = redis needs graph_redis_url, a redis_url or redis_sentinel to keep \
                 the graph in"
                    .into(),
            );
        }
        if self.graph_store == GraphStoreKind::Sqlite && self.graph_redis_url.is_some() {
            return invalid(
                "graph_redis_url is set but graph_store is sqlite: add --graph-store redis".into(),
            );
        }
        for url in self.redis_urls.iter().chain(&self.graph_redis_url) {
            if let Err(e) = redis::IntoConnectionInfo::into_connection_info(url.as_str()) {
                return invalid(format!(
                    "redis_url {url:?}: {e} (expected redis[s]://[user:password@]host:port[/db])"
                ));
            }
        }
        // The URLs the node will connect to: the engine's shards, the
        // graph's Redis.
        let sentinel_master = self.redis_sentinel_master.iter().map(String::as_str);
        let engine_urls: Vec<&str> = match self.engine {
            EngineKind::Redis => (self.redis_urls.iter().chain(&self.redis_sentinels))
                .map(String::as_str)
                .chain(sentinel_master)
                .collect(),
            EngineKind::Memory => Vec::new(),
        };
        let graph_url = match self.graph_store {
            GraphStoreKind::Redis => self.graph_redis_url(),
            GraphStoreKind::Sqlite => None,
        };
        let tls_urls = engine_urls
            .into_iter()
            .chain(graph_url)
            .filter(|url| {
                redis::IntoConnectionInfo::into_connection_info(*url)
                    .is_ok_and(|info| matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }))
            })
            .count();
        if self.redis_tls_cert.is_some() != self.redis_tls_key.is_some() {
            return invalid(
                "redis_tls_cert and redis_tls_key go together: set both or neither".into(),
            );
        }
        if self.redis_tls_files() != RedisTlsFiles::default() && tls_urls == 0 {
            return invalid(
                "redis_tls_ca, redis_tls_cert and redis_tls_key are for rediss:// URLs, \
                 and the node connects to none (no redis_url of engine = redis, nor the \
                 Redis of graph_store = redis, is one)"
                    .into(),
            );
        }
        // Braces would change which part of a key Redis Cluster hashes
        // (engine/redis/keys.rs).
        let braced = |c: char| c.is_whitespace() || c == '{' || c == '}';
        if self.redis_prefix.is_empty() || self.redis_prefix.contains(braced) {
            return invalid("redis_prefix must be non-empty, without spaces or braces".into());
        }
        if self.redis_queue == 0 {
            return invalid("redis_queue must be at least 1".into());
        }
        // A publication arrives over WebSocket (max_message_size) or the
        // HTTP API (max_http_body); the largest must fit an empty queue.
        let largest = self.max_message_size.max(self.max_http_body);
        if self.redis_queue_bytes < largest {
            return invalid(format!(
                "redis_queue_bytes ({}) must be at least max_message_size and \
                 max_http_body ({largest}): the largest publication must fit an empty queue",
                self.redis_queue_bytes
            ));
        }
        if self.worker_intake_stall.0 < Duration::from_millis(1) {
            return invalid(format!(
                "worker_intake_stall ({}) must be at least 1ms",
                self.worker_intake_stall
            ));
        }
        if self.redis_queue_high_water >= self.redis_queue {
            return invalid(format!(
                "redis_queue_high_water ({}) must be below redis_queue ({}): past the queue's \
                 bound requests are refused before publishing could pause",
                self.redis_queue_high_water, self.redis_queue
            ));
        }
        if self.redis_linger.0 >= self.redis_timeout.0 {
            return invalid(format!(
                "redis_linger ({}) must be shorter than redis_timeout ({}): a request \
                 would wait longer to go than Redis is given to answer it",
                self.redis_linger, self.redis_timeout
            ));
        }
        Ok(())
    }

    /// The Redis the follow graph is kept in, with `graph_store = redis`.
    pub fn graph_redis_url(&self) -> Option<&str> {
        self.graph_redis_url
            .as_deref()
            .or(self.redis_urls.first().map(String::as_str))
    }

    /// The key prefix of the follow graph in Redis.
    pub fn graph_redis_prefix(&self) -> String {
        myriad_graph::redis_store::cluster_prefix(&self.redis_prefix)
    }

    /// The files of TLS towards Redis.
    pub fn redis_tls_files(&self) -> RedisTlsFiles {
        RedisTlsFiles {
            ca: self.redis_tls_ca.clone(),
            cert: self.redis_tls_cert.clone(),
            key: self.redis_tls_key.clone(),
        }
    }

    /// Where the Redis engine's instances are, from `redis_*`, reached
    /// with `tls` (read from [`Config::redis_tls_files`]).
    pub fn redis_settings(&self, tls: Option<RedisTls>) -> RedisSettings {
        RedisSettings {
            tls,
            urls: self.redis_urls.clone(),
            sentinel: self
                .redis_sentinel_master
                .as_ref()
                .map(|master| SentinelSettings {
                    sentinels: self.redis_sentinels.clone(),
                    master: master.clone(),
                }),
            prefix: self.redis_prefix.clone(),
            timeout: self.redis_timeout.into(),
            queue: self.redis_queue,
            queue_bytes: self.redis_queue_bytes,
            queue_high_water: self.redis_queue_high_water,
            linger: self.redis_linger.into(),
            feed_backlog: self.redis_feed_backlog,
            presence_lease: self.presence_lease.into(),
        }
    }

    /// The history policy of every subject, by namespace.
    pub fn namespaces(&self) -> Namespaces {
        let default = HistoryPolicy {
            size: self.history_size,
            ttl: self.history_ttl.into(),
        };
        Namespaces::new(default, &self.namespace, history_policy)
    }

    /// The certificate and key files, when the client listener speaks TLS.
    pub fn tls_files(&self) -> Option<TlsFiles> {
        Some(TlsFiles {
            cert: self.tls_cert.clone()?,
            key: self.tls_key.clone()?,
        })
    }

    /// The number of workers to start: the setting, or one per core.
    pub fn worker_count(&self) -> usize {
        if self.workers > 0 {
            self.workers
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get().min(64))
        }
    }
}

/// Which engine a node runs (see `crate::engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// This node is the whole world: positions and history in its memory.
    Memory,
    /// Nodes joined over Redis.
    Redis,
}

/// Where a node keeps the follow graph (see `myriad_graph`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GraphStoreKind {
    /// A SQLite file in the data directory: this node's alone.
    Sqlite,
    /// One Redis, shared by the cluster's nodes.
    Redis,
}

/// The clap command for `Config` alone, for tests and `--help` rendering.
pub fn command() -> clap::Command {
    #[derive(Parser)]
    struct Standalone {
        #[command(flatten)]
        config: Config,
    }
    Standalone::command()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn matches(args: &[&str]) -> ArgMatches {
        command().try_get_matches_from(args).unwrap()
    }

    #[test]
    fn defaults_validate() {
        let config = Config::default();
        config.validate().unwrap();
        assert_eq!(config.ws_path, "/ws");
        assert_eq!(config.echo_path, None);
    }

    #[test]
    fn flag_beats_file_and_file_beats_default() {
        let mut file = tempfile();
        writeln!(
            file.1,
            "workers = 3\nmax_subscriptions = 7\necho_path = \"/e\""
        )
        .unwrap();
        let m = matches(&["myriad", "--workers", "2"]);
        let config = Config::assemble(&m, Some(&file.0)).unwrap();
        assert_eq!(config.workers, 2, "flag wins");
        assert_eq!(config.max_subscriptions, 7, "file beats default");
        assert_eq!(config.echo_path.as_deref(), Some("/e"));
        assert_eq!(config.max_subject_len, 128, "default stays");
        std::fs::remove_file(&file.0).unwrap();
    }

    #[test]
    fn presence_is_per_namespace_and_its_lease_bounded() {
        let mut file = tempfile();
        writeln!(
            file.1,
            "presence_max_members = 50\n[[namespace]]\nprefix = \"room.\"\npresence = true\n\
             [[namespace]]\nprefix = \"room.big.\"\npresence = true\npresence_max_members = 900"
        )
        .unwrap();
        let config = Config::assemble(&matches(&["myriad"]), Some(&file.0)).unwrap();
        let presence = config.presence_policies();
        let policy = |s: &str| presence.policy_for(s);
        assert_eq!(
            (policy("room.1").on, policy("room.1").max_members),
            (true, 50)
        );
        assert_eq!(policy("room.big.1").max_members, 900);
        assert!(!policy("news").on, "off outside the namespaces");
        std::fs::remove_file(&file.0).unwrap();
        for (table, engine) in [
            ("presence = false\njoin_leave = true", "memory"),
            ("presence = true\njoin_leave = true", "redis"),
        ] {
            let mut file = tempfile();
            writeln!(file.1, "[[namespace]]\nprefix = \"live.\"\n{table}").unwrap();
            let args = [
                "myriad",
                "--engine",
                engine,
                "--redis-url",
                "redis://127.0.0.1:1",
                "--graph-store",
                "sqlite",
            ];
            let args = if engine == "memory" {
                &args[..1]
            } else {
                &args[..]
            };
            let why = Config::assemble(&matches(args), Some(&file.0))
                .unwrap_err()
                .to_string();
            assert!(why.contains("join_leave = true"), "{engine}: {why}");
            std::fs::remove_file(&file.0).unwrap();
        }
        let why = refusal(&["myriad", "--presence-lease", "2s"]);
        assert!(why.contains("presence_lease (2s)"), "{why}");
        assert!(assembled(&["myriad", "--presence-lease", "3s"]).is_ok());
    }

    #[test]
    fn proxy_settings_are_checked_naming_the_setting() {
        let url = "http://127.0.0.1:9/p";
        assert!(assembled(&["myriad"]).unwrap().proxies().unwrap().is_none());
        let config = assembled(&["myriad", "--proxy-publish-url", url]).unwrap();
        let settings = config.proxies().unwrap().unwrap();
        assert!(settings.targets[2].is_some() && settings.targets[1].is_none());
        assert_eq!(settings.fail, FailMode::Closed, "closed by default");
        assert!(settings.secret.is_none(), "unsigned without hook_secret");
        let policies = config.proxy_policies();
        assert!(policies.policy_for("any").publish);
        assert!(!policies.policy_for("any").subscribe);
        for (args, named) in [
            (
                vec![
                    "--proxy-subscribe-url",
                    "https://a/",
                    "--backend-ca-file",
                    "/nonexistent/ca.pem",
                ],
                "proxy_subscribe_url \"https://a/\": backend_ca_file",
            ),
            (vec!["--proxy-connect-url", "a/b"], "proxy_connect_url"),
            (
                vec!["--proxy-publish-url", url, "--hook-secret", "short"],
                "hook_secret is 5 bytes",
            ),
            (
                vec!["--proxy-publish-url", url, "--proxy-max-in-flight", "0"],
                "proxy_max_in_flight",
            ),
            (
                vec!["--proxy-publish-url", url, "--proxy-timeout", "0s"],
                "proxy_timeout",
            ),
            (
                vec!["--proxy-publish-url", url, "--proxy-max-answer-bytes", "10"],
                "proxy_max_answer_bytes",
            ),
        ] {
            let why = refusal(&[&["myriad"][..], &args].concat());
            assert!(why.contains(named), "{args:?}: {why}");
        }
    }

    #[test]
    fn namespaces_come_from_the_file() {
        let mut file = tempfile();
        writeln!(
            file.1,
            "history_size = 5\n[[namespace]]\nprefix = \"chat.\"\nhistory_size = 100\nhistory_ttl = \"5m\""
        )
        .unwrap();
        let config = Config::assemble(&matches(&["myriad"]), Some(&file.0)).unwrap();
        let namespaces = config.namespaces();
        assert_eq!(namespaces.policy(namespaces.id_of("chat.a")).size, 100);
        assert_eq!(
            namespaces.policy(namespaces.id_of("chat.a")).ttl,
            Duration::from_secs(300)
        );
        assert_eq!(namespaces.policy(namespaces.id_of("news")).size, 5);
        std::fs::remove_file(&file.0).unwrap();
        let ttl: Span = "1h 30m".parse().unwrap();
        assert_eq!(ttl.to_string().parse::<Span>().unwrap(), ttl);
        assert_eq!(
            Span(Duration::ZERO).to_string().parse::<Span>().unwrap().0,
            Duration::ZERO
        );
    }

    #[test]
    fn unknown_file_keys_are_errors() {
        let mut file = tempfile();
        writeln!(file.1, "wrokers = 3").unwrap();
        let err = Config::assemble(&matches(&["myriad"]), Some(&file.0)).unwrap_err();
        assert!(matches!(err, ConfigError::Parse { .. }), "{err}");
        std::fs::remove_file(&file.0).unwrap();
    }

    #[test]
    fn invalid_combinations_are_refused() {
        let m = matches(&["myriad", "--ws-path", "ws"]);
        assert!(Config::assemble(&m, None).is_err());
        let m = matches(&["myriad", "--echo-path", "/ws"]);
        assert!(Config::assemble(&m, None).is_err());
        let m = matches(&["myriad", "--tls-cert", "cert.pem"]);
        let error = Config::assemble(&m, None).unwrap_err();
        assert!(error.to_string().contains("tls_key"), "{error}");
        let m = matches(&["myriad", "--admin-tls"]);
        let error = Config::assemble(&m, None).unwrap_err();
        assert!(error.to_string().contains("admin_tls"), "{error}");
    }

    #[test]
    fn the_admin_listener_needs_a_key_beyond_loopback_and_keys_that_work() {
        let config = |listen: &str, publish: Option<&str>, admin: Option<&str>| Config {
            admin_listen: listen.parse().unwrap(),
            publish_key: publish.map(str::to_owned),
            admin_key: admin.map(str::to_owned),
            ..Config::default()
        };
        for open in [
            "127.0.0.1:8081",
            "127.0.0.2:1",
            "[::1]:8081",
            "[::ffff:127.0.0.1]:1",
        ] {
            config(open, None, None).validate().unwrap();
        }
        for reachable in [
            "0.0.0.0:8081",
            "[::]:8081",
            "10.0.0.1:8081",
            "[::ffff:10.0.0.1]:1",
        ] {
            let err = config(reachable, None, None).validate().unwrap_err();
            assert!(
                err.to_string().contains("set admin_key"),
                "{reachable}: {err}"
            );
            let (admin, publish) = ("an-admin-key-0123", "a-publish-key-012");
            config(reachable, None, Some(admin)).validate().unwrap();
            config(reachable, Some(publish), Some(admin))
                .validate()
                .unwrap();
            let short = config(reachable, None, Some("a")).validate().unwrap_err();
            assert!(short.to_string().contains("at least 16"), "{short}");
            assert!(config(reachable, Some("p"), Some(admin))
                .validate()
                .is_err());
        }
        for (publish, admin) in [
            (Some("p"), None),
            (Some("k"), Some("k")),
            (Some(""), Some("a")),
            (None, Some("")),
        ] {
            let refused = config("127.0.0.1:1", publish, admin).validate();
            assert!(refused.is_err(), "{publish:?} {admin:?}");
        }
        let no_cap = Config {
            admin_max_connections: 0,
            ..Config::default()
        };
        assert!(no_cap.validate().is_err());
        let no_timeout = Config {
            admin_idle_timeout: 0,
            ..Config::default()
        };
        assert!(no_timeout.validate().is_err());
    }

    /// The configuration the command line `args` makes.
    fn assembled(args: &[&str]) -> Result<Config, ConfigError> {
        Config::assemble(&matches(args), None)
    }

    /// Why the command line `args` makes no configuration.
    fn refusal(args: &[&str]) -> String {
        assembled(args).unwrap_err().to_string()
    }

    #[test]
    fn a_redis_prefix_with_a_brace_is_refused() {
        for prefix in ["a{b", "a}b", "{0}", "a b"] {
            let why = refusal(&["myriad", "--redis-prefix", prefix]);
            assert!(
                why.contains("redis_prefix must be non-empty"),
                "{prefix}: {why}"
            );
        }
        assert!(assembled(&["myriad", "--redis-prefix", "c1.x:y"]).is_ok());
    }

    #[test]
    fn the_intake_stall_is_a_duration_of_at_least_a_millisecond() {
        let why = refusal(&["myriad", "--worker-intake-stall", "0s"]);
        assert!(why.contains("worker_intake_stall (0s)"), "{why}");
        let stall = |args: &[&str]| Duration::from(assembled(args).unwrap().worker_intake_stall);
        let five = stall(&["myriad", "--worker-intake-stall", "5s"]);
        assert_eq!(five, Duration::from_secs(5));
        assert_eq!(stall(&["myriad"]), Duration::from_millis(100));
    }

    #[test]
    fn the_redis_queue_high_water_is_below_the_queue() {
        let queue = ["myriad", "--redis-queue", "8", "--redis-queue-high-water"];
        let why = refusal(&[&queue[..], &["8"]].concat());
        assert!(why.contains("redis_queue_high_water (8)"), "{why}");
        assert!(assembled(&[&queue[..], &["4"]].concat()).is_ok());
    }

    #[test]
    fn a_linger_is_shorter_than_the_redis_timeout() {
        let why = refusal(&["myriad", "--redis-linger", "5s"]);
        assert!(why.contains("redis_linger (5s)"), "{why}");
        assert!(assembled(&["myriad", "--redis-linger", "1ms"]).is_ok());
    }

    #[test]
    fn the_redis_queue_holds_at_least_the_largest_publication() {
        let check = |args: &[&str]| assembled(args).map(|_| ());
        let why = refusal(&["myriad", "--redis-queue-bytes", "65535"]);
        assert!(why.contains("redis_queue_bytes (65535)"), "{why}");
        assert!(
            why.contains("(1048576)"),
            "the HTTP body bound is the larger: {why}"
        );
        let small = ["--max-http-body", "4096", "--max-message-size", "4096"];
        let fits =
            |bytes: &str| check(&[&["myriad", "--redis-queue-bytes", bytes], &small[..]].concat());
        assert!(fits("4096").is_ok());
        assert!(fits("4095").is_err());
        assert!(check(&["myriad", "--redis-queue", "0"]).is_err());
    }

    #[test]
    fn the_sentinel_shape_is_refused_mixed_incomplete_or_malformed_by_name() {
        let sentinel = [
            "myriad",
            "--engine",
            "redis",
            "--redis-sentinel",
            "redis://127.0.0.1:26379",
        ];
        let with = |more: &[&str]| refusal(&[&sentinel[..], more].concat());
        let why = with(&[
            "--redis-sentinel-master",
            "m",
            "--redis-url",
            "redis://127.0.0.1:1",
        ]);
        assert!(
            why.contains("redis_url and redis_sentinel are two shapes"),
            "{why}"
        );
        let why = with(&[]);
        assert!(
            why.contains("redis_sentinel and redis_sentinel_master go together"),
            "{why}"
        );
        let why = with(&["--redis-sentinel-master", "redis://u:secret@a:b"]);
        assert!(
            why.starts_with("redis_sentinel_master")
                || why.contains("redis_sentinel_master \"redis://u:***@a:b\""),
            "{why}"
        );
        assert!(!why.contains("secret"), "{why}");
        let why = refusal(&[
            "myriad",
            "--redis-sentinel",
            "redis://h:1",
            "--redis-sentinel-master",
            "m",
        ]);
        assert!(why.contains("--engine redis"), "{why}");
        let config =
            assembled(&[&sentinel[..], &["--redis-sentinel-master", "m"]].concat()).unwrap();
        let settings = config.redis_settings(None);
        assert!(settings.urls.is_empty());
        let shape = settings.sentinel.expect("the Sentinel shape");
        assert_eq!((shape.sentinels.len(), shape.master.as_str()), (1, "m"));
    }

    #[test]
    fn the_graph_in_redis_needs_a_redis_and_defaults_to_the_first_redis_url() {
        let why = refusal(&["myriad", "--graph-store", "redis"]);
        assert!(
            why.contains("graph_redis_url, a redis_url or redis_sentinel"),
            "{why}"
        );
        let why = refusal(&["myriad", "--graph-redis-url", "redis://127.0.0.1:1"]);
        assert!(why.contains("--graph-store redis"), "{why}");
        let why = refusal(&[
            "myriad",
            "--graph-store",
            "redis",
            "--graph-redis-url",
            "http://x",
        ]);
        assert!(
            why.contains("graph_redis_url") || why.contains("redis_url"),
            "{why}"
        );
        let engine = Config::assemble(
            &matches(&[
                "myriad",
                "--engine",
                "redis",
                "--redis-url",
                "redis://127.0.0.1:1",
                "--redis-url",
                "redis://127.0.0.1:2",
                "--graph-store",
                "redis",
                "--redis-prefix",
                "c1",
            ]),
            None,
        )
        .unwrap();
        assert_eq!(engine.graph_redis_url(), Some("redis://127.0.0.1:1"));
        assert_eq!(engine.graph_redis_prefix(), "c1:g:");
        // One node with its graph in Redis and the memory engine.
        let alone = Config::assemble(
            &matches(&[
                "myriad",
                "--graph-store",
                "redis",
                "--redis-url",
                "redis://127.0.0.1:1",
            ]),
            None,
        )
        .unwrap();
        assert_eq!(alone.graph_redis_url(), Some("redis://127.0.0.1:1"));
        let mut file = tempfile();
        writeln!(
            file.1,
            "graph_store = \"redis\"\ngraph_redis_url = \"redis://127.0.0.1:3\""
        )
        .unwrap();
        let from_file = Config::assemble(&matches(&["myriad"]), Some(&file.0)).unwrap();
        assert_eq!(from_file.graph_store, GraphStoreKind::Redis);
        assert_eq!(from_file.graph_redis_url(), Some("redis://127.0.0.1:3"));
        std::fs::remove_file(&file.0).unwrap();
    }

    fn tempfile() -> (PathBuf, std::fs::File) {
        let path = std::env::temp_dir().join(format!(
            "myriad-config-{}-{:?}.toml",
            std::process::id(),
            std::thread::current().id()
        ));
        let file = std::fs::File::create(&path).unwrap();
        (path, file)
    }
}
