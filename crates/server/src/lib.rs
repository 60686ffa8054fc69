//! The myriad node.
//!
//! Map of the crate, outside in:
//! - [`auth`]: connection tokens, their grants and each namespace's access
//!   policy: who may do what with a subject; [`reloadable`]: what SIGHUP
//!   reads again (token keys, TLS certificates) and swaps in whole.
//! - [`config`]: every setting, its default and its sources; [`namespace`]:
//!   per-prefix settings; [`span`]: the length of time settings are
//!   written in.
//! - [`listener`]: one `SO_REUSEPORT` client listener per worker; [`fds`]:
//!   how the open-file limit is shared between the listeners; [`peers`]:
//!   connections and failed token checks per source address; [`doctor`]:
//!   the host's limits against what the node is set up to hold.
//! - [`link`]: a connection's byte stream, plain TCP or TLS ([`tls`]: the
//!   certificates, the handshake by rustls, the record layer run after it).
//! - [`worker`]: the per-core event loops; each owns its connections
//!   ([`conn`], each with its pub/sub [`session`] and its [`transport`]),
//!   their outbound queues ([`outbound`]) and its local subject
//!   [`registry`]; [`shared`]: the node state every worker and the admin
//!   API hold.
//! - [`engine`]: the seam where publications get positions, history lives
//!   and subjects leave the node (memory, or Redis for a cluster; its TLS
//!   in [`redis_tls`]), under one written contract and one conformance
//!   suite.
//! - [`publication`]: the unit that flows, encoded once (and compressed
//!   once, for permessage-deflate: [`deflate`]); [`history`]: one
//!   subject's kept publications and the recovery rules.
//! - [`hub`]: the workers' mailboxes, and the `Route` an engine keeps per
//!   subject to hand each publication to every interested worker;
//!   [`messages`]: what the mailboxes carry.
//! - [`feeds`]: the follow graph wired into delivery: its keeper thread,
//!   presence, the known users.
//! - [`admin`]: the HTTP publish API, `/stats`, `/metrics`, `/healthz`,
//!   with its keys, connection cap and timeouts; [`status`]: the live
//!   status page it serves.
//! - [`metrics`] and [`process`]: what the node counts and how big it is;
//!   [`heap`]: what its structures cost, counted one way everywhere.
//! - [`sharded`]: state split over locks by key hash, with the one policy
//!   for a poisoned lock.
//! - [`hooks`]: lifecycle webhooks: events, settings, the signature, the
//!   queue, the node-wide counts and the delivery thread, which the
//!   sessions tell of users' connections through [`shared`]; [`backend`]:
//!   the one HTTP client to the application's backend, which the hooks and
//!   the [`proxy`] thread (synchronous connect, subscribe and publish
//!   proxies, answered through the workers' mailboxes) share.
//!
//! The modules stand in layers, none naming one above it
//! (docs/architecture.md, "Layers inside the server crate"; kept by
//! tests/layers.rs). [`serve`] wires these together and runs until
//! SIGTERM/SIGINT.

pub mod admin;
pub mod auth;
pub mod backend;
pub mod config;
pub mod conn;
pub mod deflate;
pub mod doctor;
pub mod engine;
pub mod fds;
pub mod feeds;
pub mod heap;
pub mod history;
pub mod hooks;
pub mod hub;
pub mod link;
pub mod listener;
pub mod messages;
pub mod metrics;
pub mod namespace;
pub mod outbound;
pub mod peers;
pub mod process;
pub mod proxy;
pub mod publication;
pub mod redis_tls;
pub mod registry;
pub mod reloadable;
pub mod session;
pub mod sessions;
pub mod sharded;
pub mod shared;
pub mod span;
pub mod status;
pub mod tls;
pub mod transport;
pub mod worker;

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use thiserror::Error;
use tracing::{error, info, warn};

pub use config::Config;

use crate::auth::Auth;
use crate::config::{EngineKind, GraphStoreKind};
use crate::engine::{Engine, MemoryEngine, RedisEngine};
use crate::feeds::{Feeds, Keeper};
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::redis_tls::RedisTls;
use crate::shared::Shared;
use crate::worker::Worker;
use myriad_graph::redis_store::sentinel::Sentinels;
use myriad_graph::redis_store::Reach;
use myriad_graph::{
    ChangeStream, DataDir, RedisStore, RedisTimeouts, SqliteStore, StoreError, StoreOptions,
};
use std::time::Duration;

/// Why the node could not start or stopped abnormally.
#[derive(Debug, Error)]
pub enum ServeError {
    #[error("cannot bind client listener {addr}: {source}")]
    BindClient {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot bind admin listener {addr}: {source}")]
    BindAdmin {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Hooks(#[from] hooks::deliver::StartError),
    #[error("cannot start the proxies' thread: {0}")]
    Proxy(std::io::Error),
    #[error("cannot set up the event loop: {0}")]
    Poll(std::io::Error),
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    #[error("worker {worker} failed: {source}")]
    Worker {
        worker: usize,
        source: std::io::Error,
    },
    #[error("worker {0} panicked")]
    WorkerPanicked(usize),
    #[error(transparent)]
    DataDir(#[from] myriad_graph::DataDirError),
    #[error("cannot open the follow graph: {0}")]
    Graph(#[from] myriad_graph::StoreError),
    #[error(transparent)]
    Tls(#[from] tls::CertError),
    #[error("cannot load the token keys: {0}")]
    TokenKeys(#[from] auth::keys::KeyError),
    #[error(transparent)]
    OpenFiles(#[from] fds::FdsError),
    #[error(
        "host checks failed: {}; strict_host_checks refuses to start (run `myriad doctor` for the fixes)",
        .0.join(", ")
    )]
    HostChecks(Vec<&'static str>),
    #[error("cannot start the Redis engine: {0}")]
    Redis(#[from] engine::RedisEngineError),
    #[error(transparent)]
    RedisTls(#[from] redis_tls::RedisTlsError),
}

/// Runs a node with `config` until SIGTERM or SIGINT, then shuts down
/// gracefully. Prints one JSON line on stdout once every listener is bound:
/// `{"event":"listening","ws":ADDR,"admin":ADDR}` (tests and scripts wait
/// for it to learn ephemeral ports).
pub fn serve(config: Config) -> Result<(), ServeError> {
    let workers = config.worker_count();
    // Before the limit is raised and anything is bound: the checks judge
    // the hard limit, and a refusal leaves nothing half started.
    let failed = doctor::at_start(&config);
    if config.strict_host_checks && !failed.is_empty() {
        return Err(ServeError::HostChecks(failed));
    }
    let auth = Auth::from_config(&config)?;
    let max_connections = admission_cap(&config)?;
    let tls = config
        .tls_files()
        .map(tls::Certificates::load)
        .transpose()?
        .map(Arc::new);
    let listen_options = listener::ListenOptions {
        backlog: config.backlog,
        send_buffer: config.socket_send_buffer,
    };
    let listeners =
        listener::bind_reuseport(config.listen, workers, listen_options).map_err(|source| {
            ServeError::BindClient {
                addr: config.listen,
                source,
            }
        })?;
    let ws_addr = listeners[0].local_addr().map_err(ServeError::Poll)?;
    let admin_listener = std::net::TcpListener::bind(config.admin_listen).map_err(|source| {
        ServeError::BindAdmin {
            addr: config.admin_listen,
            source,
        }
    })?;
    admin_listener
        .set_nonblocking(true)
        .map_err(ServeError::Poll)?;
    let admin_addr = admin_listener.local_addr().map_err(ServeError::Poll)?;

    let polls = (0..workers)
        .map(|_| mio::Poll::new())
        .collect::<Result<Vec<_>, _>>()
        .map_err(ServeError::Poll)?;
    let wakers = polls
        .iter()
        .map(|p| mio::Waker::new(p.registry(), worker::WAKER))
        .collect::<Result<Vec<_>, _>>()
        .map_err(ServeError::Poll)?;
    let (hub, mailboxes) = Hub::new(wakers, config.mailbox_high_water);
    let redis_tls = config.redis_tls_files().load()?;
    let feeds = open_feeds(&config, Arc::clone(&hub), redis_tls.as_ref())?;
    let metrics = Arc::new(Metrics::new(workers));
    // Both checked by `Config::validate`.
    let (hooks, lifecycle) = start_hooks(&config, &metrics)?;
    let proxy = match config.proxies().expect("proxy settings were checked") {
        None => None,
        Some(settings) => Some(
            proxy::Proxy::start(settings, config.proxy_policies(), Arc::clone(&hub))
                .map_err(ServeError::Proxy)?,
        ),
    };
    let shared = Arc::new(Shared {
        auth,
        presence: config.presence_policies(),
        peers: peers::PeerCounts::default(),
        token_failures: peers::TokenFailures::new(config.token_failures_per_ip),
        feeds,
        engine: open_engine(&config, Arc::clone(&hub), redis_tls)?,
        hub,
        metrics,
        connections: AtomicUsize::new(0),
        refusing: AtomicUsize::new(0),
        max_connections,
        shutting_down: AtomicBool::new(false),
        tls,
        config,
        baseline_rss_bytes: process::usage().rss_bytes,
        hooks,
        proxy,
        lifecycle,
    });

    let mut threads = Vec::with_capacity(workers);
    for (index, ((poll, listener), mailbox)) in
        polls.into_iter().zip(listeners).zip(mailboxes).enumerate()
    {
        let worker = Worker::new(index, poll, listener, mailbox, Arc::clone(&shared))
            .map_err(ServeError::Poll)?;
        let thread = std::thread::Builder::new()
            .name(format!("myriad-worker-{index}"))
            .spawn(move || worker.run())
            .map_err(ServeError::Poll)?;
        threads.push(thread);
    }

    let (stop_admin, admin_stopped) = tokio::sync::watch::channel(false);
    let admin_shared = Arc::clone(&shared);
    let admin = std::thread::Builder::new()
        .name("myriad-admin".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(admin::serve(admin_listener, admin_shared, admin_stopped))
        })
        .map_err(ServeError::Poll)?;

    spawn_signal_watcher(Arc::clone(&shared))?;

    let tls = shared.tls.is_some();
    info!(ws = %ws_addr, admin = %admin_addr, workers, tls, "myriad listening");
    let ready = serde_json::json!({"event": "listening", "ws": ws_addr.to_string(), "admin": admin_addr.to_string()});
    let mut stdout = std::io::stdout().lock();
    // A closed stdout (daemonized, piped to nothing) must not stop the node.
    let _ = writeln!(stdout, "{ready}").and_then(|()| stdout.flush());
    drop(stdout);

    let mut outcome = Ok(());
    for (index, thread) in threads.into_iter().enumerate() {
        match thread.join() {
            Ok(Ok(())) => {}
            Ok(Err(source)) => {
                error!(worker = index, error = %source, "worker failed");
                outcome = outcome.and(Err(ServeError::Worker {
                    worker: index,
                    source,
                }));
            }
            Err(_) => outcome = outcome.and(Err(ServeError::WorkerPanicked(index))),
        }
    }
    // Workers are done (shutdown, or a failure): the admin API answers
    // what it has in flight, then stops (see `admin::serve`).
    shared.shutting_down.store(true, Ordering::Release);
    // The receiver is gone only if the admin thread already ended.
    let _ = stop_admin.send(true);
    if let Ok(Err(e)) = admin.join() {
        error!(error = %e, "admin listener failed");
    }
    shared.feeds.stop();
    info!("myriad stopped");
    outcome
}

/// The hooks' delivery thread, when `hook_url` is set, and the lifecycle
/// stage in front of it, which waits out `hook_delay` against the tally
/// (so the delivery thread holds nothing): with the Redis engine the
/// cluster's, in the first instance (`engine::redis::lifecycle`); else, and
/// behind Sentinels or over TLS for now, the node's own memory tally
/// (operations.md, "Receiving hooks").
fn start_hooks(
    config: &Config,
    metrics: &Arc<Metrics>,
) -> Result<(Option<hooks::Hooks>, Option<hooks::cluster::Stage>), ServeError> {
    let Some(mut settings) = config.hooks().expect("hook settings were checked") else {
        return Ok((None, None));
    };
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    // The node names itself by its pid and start time, so event ids (and
    // the tally's generations) never repeat across its restarts.
    let node = format!("{}-{started}", std::process::id());
    let lease = Duration::from(config.presence_lease);
    let tally = open_tally(config, &node, lease, settings.delay);
    let stage_settings = hooks::cluster::StageSettings {
        delay: settings.delay,
        renew_every: lease / 3,
        capacity: settings.queue_bound,
    };
    settings.delay = Duration::ZERO;
    let delivered = {
        let metrics = Arc::clone(metrics);
        Box::new(move |latency| metrics.hook_delivered(latency))
    };
    let hooks = hooks::Hooks::start(settings, &node, delivered)?;
    let stage = hooks::cluster::Stage::start(tally, hooks.clone(), stage_settings)
        .map_err(|e| ServeError::Hooks(hooks::deliver::StartError::Thread(e)))?;
    Ok((Some(hooks), Some(stage)))
}

/// The lifecycle tally of node `node`: the cluster's in Redis, or this
/// node's own.
fn open_tally(
    config: &Config,
    node: &str,
    lease: Duration,
    delay: Duration,
) -> Box<dyn hooks::tally::Tally> {
    let shared_url = config
        .redis_urls
        .first()
        .filter(|url| config.engine == EngineKind::Redis && url.starts_with("redis://"));
    if let Some(url) = shared_url {
        let prefix = format!("{}:", config.redis_prefix);
        let timeout = Duration::from(config.redis_timeout);
        match engine::redis::lifecycle::RedisTally::new(url, &prefix, node, lease, delay, timeout) {
            Ok(tally) => return Box::new(tally),
            // Only a URL the engine's own connect refuses fails here, and
            // that stops the start right after.
            Err(error) => warn!(%error, "hooks are this node's own"),
        }
    } else if config.engine == EngineKind::Redis {
        warn!("hooks are this node's own: no shared tally behind Sentinels or over TLS yet");
    }
    let wall = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    };
    Box::new(hooks::tally::MemoryTally::new(node, lease, Arc::new(wall)))
}

/// The engine `config` asks for; the Redis engine connects to every
/// instance first, so an unreachable Redis stops the start with its error.
fn open_engine(
    config: &Config,
    hub: Arc<Hub>,
    redis_tls: Option<RedisTls>,
) -> Result<Arc<dyn Engine>, ServeError> {
    let namespaces = config.namespaces();
    let max_bytes = config.history_max_bytes;
    Ok(match config.engine {
        EngineKind::Memory => Arc::new(MemoryEngine::new(hub, namespaces, max_bytes)),
        EngineKind::Redis => {
            let settings = config.redis_settings(redis_tls);
            Arc::new(RedisEngine::connect(hub, namespaces, max_bytes, settings)?)
        }
    })
}

/// Opens the follow graph `config` asks for and starts its keeper. SQLite:
/// takes the data directory first (no other node or bulk load may use it
/// while this node runs). Redis: the graph under `<redis_prefix>:g:`,
/// shared with the cluster's other nodes, whose changes the keeper follows
/// through the store's announcements; an unreachable Redis stops the start.
fn open_feeds(
    config: &Config,
    hub: Arc<Hub>,
    redis_tls: Option<&RedisTls>,
) -> Result<Feeds, ServeError> {
    let options = StoreOptions {
        max_following: config.max_following,
        cache_bytes: config.graph_cache_mb << 20,
    };
    let max_following = config.max_following;
    Ok(match config.graph_store {
        GraphStoreKind::Sqlite => {
            let dir = DataDir::lock(&config.data_dir)?;
            let store = SqliteStore::open(&dir.graph_file(), options)?;
            Keeper::start(Some(dir), Box::new(store), None, hub, max_following)?
        }
        GraphStoreKind::Redis => {
            let urls: Vec<String> = config
                .graph_redis_url()
                .map(str::to_owned)
                .into_iter()
                .collect();
            let prefix = config.graph_redis_prefix();
            let timeout = Duration::from(config.redis_timeout);
            let timeouts = RedisTimeouts {
                connect: timeout,
                response: timeout,
                ..RedisTimeouts::default()
            };
            let tls = redis_tls.map(RedisTls::certificates);
            let (store, changes) = match config.redis_settings(None).sentinel {
                // Behind Sentinels, unless graph_redis_url names a Redis.
                Some(shape) if urls.is_empty() => {
                    let sentinels = Sentinels::new(&shape.sentinels, &shape.master, tls, timeout)
                        .map_err(|e| StoreError::Config(e.to_string()))?;
                    let reach = Reach::Sentinels(sentinels);
                    let store = RedisStore::open_at(reach.clone(), &prefix, options, timeouts)?;
                    (store, ChangeStream::at(reach, &prefix, timeouts))
                }
                _ => (
                    RedisStore::open_with(&urls, &prefix, options, timeouts, tls.clone())?,
                    ChangeStream::new(&urls, &prefix, timeouts, tls)?,
                ),
            };
            Keeper::start(None, Box::new(store), Some(changes), hub, max_following)?
        }
    })
}

/// How many client connections the node admits: `max_connections`,
/// lowered to the open-file limit's share for clients (see [`fds`]). Past
/// the cap a client is accepted and refused with a clear 503; past the
/// open-file limit it would only wait, unanswered, in the listen backlog
/// (accept fails with EMFILE).
fn admission_cap(config: &Config) -> Result<usize, ServeError> {
    let files = match process::raise_open_file_limit() {
        Ok(files) => files,
        Err(e) => {
            warn!(error = %e, "cannot read the open-file limit; admitting up to max_connections");
            return Ok(config.max_connections);
        }
    };
    let workers = config.worker_count();
    let admin = config.admin_max_connections;
    let cap = fds::client_cap(config.max_connections, files, workers, admin)?;
    if cap < config.max_connections {
        warn!(
            max_connections = config.max_connections,
            open_files = files,
            kept = fds::reserved(workers, admin),
            admitted = cap,
            "the open-file limit caps client connections below max_connections"
        );
    }
    Ok(cap)
}

/// SIGTERM or SIGINT starts graceful shutdown; a second one exits at once.
/// SIGHUP reloads the TLS certificate and key, and the token key files.
fn spawn_signal_watcher(shared: Arc<Shared>) -> Result<(), ServeError> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])
        .map_err(ServeError::Signals)?;
    std::thread::Builder::new()
        .name("myriad-signals".into())
        .spawn(move || {
            let mut stopping = false;
            for signal in signals.forever() {
                if signal == SIGHUP {
                    reload_certificates(&shared);
                    reload_token_keys(&shared);
                } else if stopping {
                    error!("second signal: exiting without waiting for clients");
                    std::process::exit(130);
                } else {
                    stopping = true;
                    info!(signal, "shutting down: closing clients with 1001");
                    shared.shutting_down.store(true, Ordering::Release);
                    shared.engine.shut_down();
                    shared.hub.wake_all();
                }
            }
        })
        .map_err(ServeError::Signals)?;
    Ok(())
}

/// Reads the TLS files again: new handshakes use them, connections already
/// open go on with the keys they have. Files that do not make a working
/// configuration leave the previous one in force, and are logged and counted.
fn reload_certificates(shared: &Shared) {
    let Some(certs) = &shared.tls else {
        info!("SIGHUP: no TLS certificate configured, nothing to reload");
        return;
    };
    match certs.reload() {
        Ok(()) => {
            shared.metrics.tls_reloaded();
            info!(cert = %certs.files().cert.display(), "TLS certificate reloaded");
        }
        Err(e) => {
            shared
                .metrics
                .error(metrics::ErrorKind::Tls(tls::TlsFailure::ReloadFailed));
            error!(error = %e, "TLS reload failed; the previous certificate stays in use");
        }
    }
}

/// Reads the token key files again, as [`reload_certificates`] does the
/// certificate: token checks from then on use the new keys, connections
/// already open keep what their token granted. Files that fail to load
/// leave the keys in force, and are logged and counted.
fn reload_token_keys(shared: &Shared) {
    match shared.auth.reload_keys() {
        Ok(auth::KeysReload::NoFiles) => {
            info!("SIGHUP: no token key file configured, nothing to reload");
        }
        Ok(auth::KeysReload::Reloaded) => {
            shared.metrics.token_keys_reloaded();
            let files: Vec<_> = shared.auth.key_files().map(|p| p.display()).collect();
            info!(files = ?files, "token keys reloaded");
        }
        Err(e) => {
            shared
                .metrics
                .error(metrics::ErrorKind::TokenKeysReloadFailed);
            error!(error = %e, "token key reload failed; the previous keys stay in use");
        }
    }
}
