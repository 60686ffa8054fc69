//! `myriad graph …`: seed 004's follow graph, generated, bulk-loaded into a
//! node's data directory, and looked at.
//!
//! - `generate`: a deterministic Barabási–Albert edge list
//!   (`myriad_graph::generate`), to stdout or a file.
//! - `load`: reads a whole edge-list file, then loads it into the data
//!   directory's graph store in one atomic step; it takes the data
//!   directory's lock first, so it refuses while a node runs there. With
//!   `--redis-url`, into a cluster's graph in Redis instead (a bulk change,
//!   all or nothing too; nodes running on it read everything again), over
//!   TLS for `rediss://` with the nodes' `--redis-tls-*` files.
//! - `stats`: totals, file size and the biggest hubs (totals only in Redis).
//! - `probe`: how long reading a user's followers takes, page by page.
//!
//! This module only wires arguments to the graph crate and prints; the
//! graph's logic lives there.

use std::fs::File;
use std::io::{self, BufReader};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use hdrhistogram::Histogram;
use myriad_graph::edgelist::read_edges;
use myriad_graph::generate::{self, Params};
use myriad_graph::{
    redis_store, sqlite, DataDir, DataDirError, RedisStore, RedisTimeouts, SqliteStore, Store,
    StoreOptions, UserId,
};
use myriad_server::redis_tls::{RedisTls, RedisTlsFiles};

#[derive(Args)]
pub struct GraphArgs {
    #[command(subcommand)]
    command: GraphCommand,
}

#[derive(Subcommand)]
enum GraphCommand {
    /// Write a Barabási–Albert edge list (seed 004's dataset: --users
    /// 1000000 --edges-per-node 15).
    Generate(GenerateArgs),
    /// Load an edge-list file into the data directory, all of it or none.
    Load(LoadArgs),
    /// Totals, database size and the biggest hubs.
    Stats(StatsArgs),
    /// Time reading a user's followers, every page, several times.
    Probe(ProbeArgs),
}

#[derive(Args)]
struct GenerateArgs {
    #[arg(long)]
    users: u64,
    /// Users each new user follows (igraph's m).
    #[arg(long, default_value_t = 15)]
    edges_per_node: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write here instead of stdout.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Where the graph is, and how much page cache to read it with.
#[derive(Args)]
struct StoreArgs {
    /// The node's data directory (the graph is its graph.sqlite3).
    #[arg(long, env = "MYRIAD_DATA_DIR", default_value = "myriad-data")]
    data_dir: PathBuf,
    /// The store's page cache bound, MiB (the node's `graph_cache_mb`).
    #[arg(long, env = "MYRIAD_GRAPH_CACHE_MB", default_value_t = 64)]
    cache_mb: usize,
    /// The most users one user may follow; a load past it is refused
    /// whole (the node's `max_following`).
    #[arg(long, env = "MYRIAD_MAX_FOLLOWING", default_value_t = StoreOptions::default().max_following)]
    max_following: u64,
    /// The graph is in this Redis instead, shared by a cluster's nodes
    /// (their `graph_redis_url`, or first `redis_url`); no data directory.
    #[arg(long = "redis-url", env = "MYRIAD_GRAPH_REDIS_URL")]
    redis_url: Option<String>,
    /// The cluster's key prefix (the nodes' `redis_prefix`); the graph is
    /// under `<prefix>:g:`.
    #[arg(long, env = "MYRIAD_REDIS_PREFIX", default_value = "myriad")]
    redis_prefix: String,
    /// For a `rediss://` URL: PEM file of the authorities its certificate
    /// is checked against, instead of the system's roots (the nodes'
    /// `redis_tls_ca`).
    #[arg(long, env = "MYRIAD_REDIS_TLS_CA", requires = "redis_url")]
    redis_tls_ca: Option<PathBuf>,
    /// For a `rediss://` URL: PEM file of the certificate chain to show a
    /// Redis that asks for one, with --redis-tls-key.
    #[arg(long, env = "MYRIAD_REDIS_TLS_CERT", requires_all = ["redis_url", "redis_tls_key"])]
    redis_tls_cert: Option<PathBuf>,
    /// PEM file of the private key of --redis-tls-cert's first certificate.
    #[arg(long, env = "MYRIAD_REDIS_TLS_KEY", requires = "redis_tls_cert")]
    redis_tls_key: Option<PathBuf>,
}

impl StoreArgs {
    fn options(&self) -> StoreOptions {
        StoreOptions {
            cache_bytes: self.cache_mb << 20,
            max_following: self.max_following,
        }
    }

    /// The graph in Redis, when `--redis-url` says it is there.
    fn redis(&self) -> Result<Option<RedisStore>, String> {
        let Some(url) = &self.redis_url else {
            return Ok(None);
        };
        let prefix = redis_store::cluster_prefix(&self.redis_prefix);
        let files = RedisTlsFiles {
            ca: self.redis_tls_ca.clone(),
            cert: self.redis_tls_cert.clone(),
            key: self.redis_tls_key.clone(),
        };
        let tls = files.load().map_err(|e| e.to_string())?;
        let urls = std::slice::from_ref(url);
        let certificates = tls.as_ref().map(RedisTls::certificates);
        RedisStore::open_with(
            urls,
            &prefix,
            self.options(),
            RedisTimeouts::default(),
            certificates,
        )
        .map(Some)
        .map_err(|e| e.to_string())
    }

    /// Opens an existing graph, refusing to create one where there is none.
    fn open_existing(&self) -> Result<SqliteStore, String> {
        let file = self.data_dir.join(sqlite::FILE_NAME);
        if !file.is_file() {
            return Err(format!("no graph in {}", self.data_dir.display()));
        }
        SqliteStore::open(&file, self.options()).map_err(|e| e.to_string())
    }
}

#[derive(Args)]
struct LoadArgs {
    /// The edge list: `<follower> <followee>` per line, `#` comments.
    file: PathBuf,
    #[command(flatten)]
    store: StoreArgs,
}

#[derive(Args)]
struct StatsArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// How many of the biggest hubs to list (a scan of every edge).
    #[arg(long, default_value_t = 5)]
    hubs: usize,
}

#[derive(Args)]
struct ProbeArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Whose followers to read; the biggest hub when not given (finding
    /// it reads every edge, so give it when measuring a cold cache).
    #[arg(long)]
    user: Option<u64>,
    /// How many times to read them all.
    #[arg(long, default_value_t = 20)]
    runs: u32,
    /// Followers per page.
    #[arg(long, default_value_t = 1000)]
    page: usize,
}

/// Runs `myriad graph …`; the error is what to tell the user.
pub fn run(args: GraphArgs) -> Result<(), String> {
    match args.command {
        GraphCommand::Generate(a) => generate(a),
        GraphCommand::Load(a) => load(a),
        GraphCommand::Stats(a) => stats(a),
        GraphCommand::Probe(a) => probe(a),
    }
}

fn generate(args: GenerateArgs) -> Result<(), String> {
    let params = Params {
        users: args.users,
        edges_per_node: args.edges_per_node,
        seed: args.seed,
    };
    let started = Instant::now();
    let written = match &args.out {
        Some(path) => {
            let file = File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
            generate::write(&params, file)
        }
        None => generate::write(&params, io::stdout().lock()),
    }
    .map_err(|e| e.to_string())?;
    if let Some(path) = &args.out {
        println!(
            "generated {written} edges among {} users into {} in {:.1} s",
            params.users,
            path.display(),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

fn load(args: LoadArgs) -> Result<(), String> {
    let redis = args.store.redis()?;
    let dir = match redis {
        Some(_) => None,
        None => Some(DataDir::lock(&args.store.data_dir).map_err(|e| match e {
            DataDirError::InUse { .. } => {
                format!("{e}: stop the node that runs on it, then load")
            }
            DataDirError::Io { .. } => e.to_string(),
        })?),
    };
    let started = Instant::now();
    let file = File::open(&args.file).map_err(|e| format!("{}: {e}", args.file.display()))?;
    // Read whole first: a malformed file fails here, before the store is
    // touched.
    let edges = read_edges(BufReader::with_capacity(1 << 20, file))
        .map_err(|e| format!("{}: {e}", args.file.display()))?;
    let read = started.elapsed();
    eprintln!("read {} edges in {:.1} s; loading", edges.len(), secs(read));
    let mut store: Box<dyn Store> = match (redis, &dir) {
        (Some(redis), _) => Box::new(redis),
        (None, Some(dir)) => Box::new(
            SqliteStore::open(&dir.graph_file(), args.store.options())
                .map_err(|e| e.to_string())?,
        ),
        (None, None) => unreachable!("a data directory is locked without Redis"),
    };
    let users_before = store.totals().map_err(|e| e.to_string())?.users;
    let added = store.load(Vec::new(), edges).map_err(|e| e.to_string())?;
    let took = started.elapsed();
    let users_after = store.totals().map_err(|e| e.to_string())?.users;
    println!("users added: {}", users_after - users_before);
    println!("edges added: {added}");
    println!(
        "seconds: {:.1} (reading the file {:.1}, loading {:.1})",
        secs(took),
        secs(read),
        secs(took - read)
    );
    if let Some(dir) = &dir {
        print_sizes(&dir.graph_file());
    }
    print_memory();
    Ok(())
}

fn stats(args: StatsArgs) -> Result<(), String> {
    if let Some(mut store) = args.store.redis()? {
        let totals = store.totals().map_err(|e| e.to_string())?;
        println!("users: {}", totals.users);
        println!("edges: {}", totals.edges);
        if args.hubs > 0 {
            println!("biggest hubs: not listed for a graph in Redis");
        }
        return Ok(());
    }
    let mut store = args.store.open_existing()?;
    let totals = store.totals().map_err(|e| e.to_string())?;
    println!("users: {}", totals.users);
    println!("edges: {}", totals.edges);
    print_sizes(&args.store.data_dir.join(sqlite::FILE_NAME));
    if args.hubs > 0 {
        let hubs = store.biggest_hubs(args.hubs).map_err(|e| e.to_string())?;
        let listed: Vec<String> = hubs.iter().map(|(u, n)| format!("{u} ({n})")).collect();
        println!("biggest hubs (followers): {}", listed.join(", "));
    }
    print_memory();
    Ok(())
}

fn probe(args: ProbeArgs) -> Result<(), String> {
    let mut store = args.store.open_existing()?;
    let user = match args.user {
        Some(id) => UserId::new(id).map_err(|e| e.to_string())?,
        None => match store.biggest_hubs(1).map_err(|e| e.to_string())?.first() {
            Some(&(hub, _)) => hub,
            None => return Err("the graph has no edges".into()),
        },
    };
    // The first read is the one a cold cache shows in; the later ones
    // read what it left cached.
    let mut first = Timings::new();
    let mut later = Timings::new();
    let mut followers = 0usize;
    for run in 0..args.runs {
        let timings = if run == 0 { &mut first } else { &mut later };
        let mut after = None;
        followers = 0;
        let started = Instant::now();
        loop {
            let page_started = Instant::now();
            let page = store
                .followers(user, after, args.page)
                .map_err(|e| e.to_string())?;
            timings
                .pages
                .saturating_record(nanos(page_started.elapsed()));
            followers += page.len();
            match page.last() {
                Some(&last) if page.len() == args.page => after = Some(last),
                _ => break,
            }
        }
        timings.reads.saturating_record(nanos(started.elapsed()));
    }
    println!(
        "followers of user {user}: {followers}, in pages of {}",
        args.page
    );
    first.print("first read");
    if args.runs > 1 {
        later.print(&format!("later reads ({})", args.runs - 1));
    }
    print_memory();
    Ok(())
}

/// Latencies of whole reads and of their pages.
struct Timings {
    reads: Histogram<u64>,
    pages: Histogram<u64>,
}

impl Timings {
    fn new() -> Timings {
        // Nanoseconds, up to an hour; a longer read is recorded as an hour.
        let histogram =
            || Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds");
        Timings {
            reads: histogram(),
            pages: histogram(),
        }
    }

    fn print(&self, label: &str) {
        let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1e3;
        println!(
            "{label}: whole read p50 {:.1} µs, p99 {:.1} µs; \
             page p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
            us(&self.reads, 0.5),
            us(&self.reads, 0.99),
            us(&self.pages, 0.5),
            us(&self.pages, 0.99),
            self.pages.max() as f64 / 1e3
        );
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The graph file's size, and its write-ahead log's when there is one.
fn print_sizes(graph: &Path) {
    let size = |path: &Path| std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let mut wal = graph.as_os_str().to_owned();
    wal.push("-wal");
    println!(
        "database: {:.1} MiB (+ {:.1} MiB write-ahead log) in {}",
        size(graph) as f64 / 1048576.0,
        size(Path::new(&wal)) as f64 / 1048576.0,
        graph.display()
    );
}

/// This process's resident memory now and at its peak (Linux only).
fn print_memory() {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return;
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches(" kB").parse::<u64>().ok())
    };
    if let (Some(rss), Some(peak)) = (field("VmRSS:"), field("VmHWM:")) {
        println!(
            "rss: {:.1} MiB (peak {:.1} MiB)",
            rss as f64 / 1024.0,
            peak as f64 / 1024.0
        );
    }
}
