//! Loads an edge-list file into a Redis graph store, then reports how long
//! the load took, what Redis holds and how much memory it takes, and how
//! long reading a hub's followers takes over the network hop: the figures
//! of "Follow graph in Redis" in docs/benchmarks.md.
//!
//! ```sh
//! cargo run --release -p myriad-graph --example redis_load -- FILE REDIS_URL [PREFIX] [HUB]
//! ```
//!
//! It only wires the graph crate's own pieces together (the edge-list
//! reader, `RedisStore::load`), as `myriad graph load` does for SQLite.

use std::fs::File;
use std::io::BufReader;
use std::process::ExitCode;
use std::time::Instant;

use myriad_graph::edgelist::read_edges;
use myriad_graph::{RedisStore, Store, StoreOptions, UserId};

/// Whole reads of the hub's followers, for the percentiles.
const READS: usize = 101;
/// Followers per page, as the node reads them.
const PAGE: usize = 1_000;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("redis_load: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (file, url) = match (args.first(), args.get(1)) {
        (Some(file), Some(url)) => (file, url),
        _ => return Err("usage: redis_load FILE REDIS_URL [PREFIX] [HUB]".into()),
    };
    let prefix = args.get(2).map_or("myriad:graph:", String::as_str);
    let hub: u64 = match args.get(3) {
        Some(hub) => hub.parse().map_err(|e| format!("HUB: {e}"))?,
        None => 11,
    };
    let hub = UserId::new(hub).map_err(|e| e.to_string())?;

    let started = Instant::now();
    let input = File::open(file).map_err(|e| format!("{file}: {e}"))?;
    let edges =
        read_edges(BufReader::with_capacity(1 << 20, input)).map_err(|e| format!("{file}: {e}"))?;
    let read = started.elapsed();
    let count = edges.len();
    let mut store = RedisStore::open(std::slice::from_ref(url), prefix, StoreOptions::default())
        .map_err(|e| e.to_string())?;
    let loading = Instant::now();
    let added = store.load(Vec::new(), edges).map_err(|e| e.to_string())?;
    let load = loading.elapsed();
    let totals = store.totals().map_err(|e| e.to_string())?;
    println!("edges read: {count} in {:.1} s", read.as_secs_f64());
    println!("edges added: {added}");
    println!("load: {:.1} s", load.as_secs_f64());
    println!("totals: {} users, {} edges", totals.users, totals.edges);
    for line in memory(url)? {
        println!("{line}");
    }

    let mut times = Vec::with_capacity(READS);
    let mut followers = 0;
    for _ in 0..READS {
        let reading = Instant::now();
        followers = read_followers(&mut store, hub)?;
        times.push(reading.elapsed());
    }
    times.sort_unstable();
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    println!(
        "followers of {hub}: {followers} in pages of {PAGE}, {READS} reads: p50 {} µs, p99 {} µs",
        at(0.5).as_micros(),
        at(0.99).as_micros()
    );
    Ok(())
}

/// Reads every follower of `user`, page by page; answers how many.
fn read_followers(store: &mut RedisStore, user: UserId) -> Result<usize, String> {
    let mut after = None;
    let mut total = 0;
    loop {
        let page = store
            .followers(user, after, PAGE)
            .map_err(|e| e.to_string())?;
        total += page.len();
        if page.len() < PAGE {
            return Ok(total);
        }
        after = page.last().copied();
    }
}

/// Redis's own memory figures, from `INFO memory`.
fn memory(url: &str) -> Result<Vec<String>, String> {
    let mut con = redis::Client::open(url)
        .and_then(|client| client.get_connection())
        .map_err(|e| e.to_string())?;
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query(&mut con)
        .map_err(|e| e.to_string())?;
    Ok(info
        .lines()
        .filter(|line| {
            [
                "used_memory_human:",
                "used_memory_rss_human:",
                "used_memory_peak_human:",
            ]
            .iter()
            .any(|name| line.starts_with(name))
        })
        .map(str::to_owned)
        .collect())
}
