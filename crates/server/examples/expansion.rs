//! Measures the two ways "send as user X" could work in a cluster whose
//! follow graph is in Redis (issue 11: "measure the expansion strategy
//! again with a network hop in the path"), on the send path's Redis work:
//!
//! - **feeds** (what the node does): one run of the engine's own publish
//!   script for `@X`; Redis then hands it to the nodes subscribed to `@X`.
//! - **expand**: read X's followers from the graph in Redis, page by page,
//!   then run the same publish script once per follower, for that
//!   follower's own inbox subject (a node cannot know where a follower is
//!   connected without such a subject or a directory), pipelined.
//!
//! Both keep one publication of history per subject (the engine's script
//! with `history_size` 1), so neither pays for long histories. For each
//! user it prints, per send: the latency (one send at a time, p50 and p99)
//! and Redis's CPU time (`INFO cpu`, before and after), per run.
//!
//! ```sh
//! cargo run --release -p myriad-server --example expansion -- \
//!   redis://127.0.0.1:6479 soc:g: 11:20 500000:2000 --runs 5
//! ```
//! `USER:SENDS` pairs: whom to send as, and how many sends a run.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use myriad_server::engine::redis::{publish_call, PUBLISH_SCRIPT};
use redis::{Connection, Script};

/// Keys of this measurement's subjects, apart from any node's.
const PREFIX: &str = "expansion";
/// A send's data, the social workload's size.
static DATA: LazyLock<String> = LazyLock::new(|| "x".repeat(512));

/// One publish of the engine's own script call for `subject`: history
/// size 1, no age limit, a 256 MiB budget, a fixed fresh epoch.
fn publish(script: &Script, subject: &str) -> redis::Cmd {
    let publication = (subject, DATA.as_str(), 1, 0);
    publish_call(
        script,
        PREFIX,
        256 << 20,
        "00000000000000e1",
        "",
        [publication],
    )
}

/// Redis's own CPU time so far (user + system).
fn redis_cpu(con: &mut Connection) -> Duration {
    let info: String = redis::cmd("INFO").arg("cpu").query(con).unwrap();
    let field = |name: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    Duration::from_secs_f64(field("used_cpu_user:") + field("used_cpu_sys:"))
}

/// Every follower of `user`, in pages of 1,000, as the graph store reads them.
fn followers(con: &mut Connection, graph: &str, user: u64) -> Vec<u64> {
    let key = format!("{graph}followers:{user}");
    let mut all: Vec<u64> = Vec::new();
    loop {
        let min = all.last().map_or("-inf".to_owned(), |a| format!("({a}"));
        let page: Vec<u64> = redis::cmd("ZRANGE")
            .arg(&key)
            .arg(min)
            .arg("+inf")
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(1000)
            .query(con)
            .unwrap();
        let full = page.len() == 1000;
        all.extend(page);
        if !full {
            return all;
        }
    }
}

/// One send as `user` the expanding way: read, then a publish a follower.
fn expand(con: &mut Connection, script: &Script, graph: &str, user: u64) {
    let followers = followers(con, graph, user);
    let mut pipe = redis::pipe();
    for follower in &followers {
        pipe.add_command(publish(script, &format!("@inbox:{follower}")));
    }
    let _: Vec<redis::Value> = pipe.query(con).unwrap();
}

struct Run {
    p50: Duration,
    p99: Duration,
    cpu_per_send: Duration,
}

fn measure(con: &mut Connection, sends: u32, mut send: impl FnMut(&mut Connection)) -> Run {
    let mut took = Vec::with_capacity(sends as usize);
    let cpu = redis_cpu(con);
    for _ in 0..sends {
        let started = Instant::now();
        send(con);
        took.push(started.elapsed());
    }
    let cpu = redis_cpu(con).saturating_sub(cpu);
    took.sort();
    Run {
        p50: took[took.len() / 2],
        p99: took[(took.len() * 99 / 100).min(took.len() - 1)],
        cpu_per_send: cpu / sends,
    }
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: expansion REDIS_URL GRAPH_PREFIX USER:SENDS... [--runs N]";
    let (url, graph) = (args.first().expect(usage), args.get(1).expect(usage));
    let runs: usize = args
        .iter()
        .position(|a| a == "--runs")
        .map_or(5, |i| args[i + 1].parse().expect(usage));
    let users: Vec<(u64, u32)> = args[2..]
        .iter()
        .take_while(|a| *a != "--runs")
        .map(|a| {
            let (user, sends) = a.split_once(':').expect(usage);
            (user.parse().expect(usage), sends.parse().expect(usage))
        })
        .collect();
    let mut con = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let script = Script::new(PUBLISH_SCRIPT);
    let _: redis::Value = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(PUBLISH_SCRIPT)
        .query(&mut con)
        .unwrap();
    for (user, sends) in users {
        let count = followers(&mut con, graph, user).len();
        let subject = format!("@{user}");
        let (mut feeds, mut expanded) = (Vec::new(), Vec::new());
        for run in 0..runs {
            let a = measure(&mut con, sends, |con| {
                let _: redis::Value = publish(&script, &subject).query(con).unwrap();
            });
            let b = measure(&mut con, sends, |con| {
                expand(con, &script, graph, user);
            });
            println!(
                "user {user} ({count} followers) run {run}: feeds p50 {:?} p99 {:?} redis cpu/send {:?}; \
                 expand p50 {:?} p99 {:?} redis cpu/send {:?}",
                a.p50, a.p99, a.cpu_per_send, b.p50, b.p99, b.cpu_per_send
            );
            feeds.push(a);
            expanded.push(b);
        }
        let med = |runs: &[Run], f: fn(&Run) -> Duration| median(runs.iter().map(f).collect());
        println!(
            "user {user} ({count} followers), {sends} sends a run, medians of {runs}: \
             feeds p50 {:?} p99 {:?} redis cpu/send {:?} | expand p50 {:?} p99 {:?} redis cpu/send {:?}",
            med(&feeds, |r| r.p50),
            med(&feeds, |r| r.p99),
            med(&feeds, |r| r.cpu_per_send),
            med(&expanded, |r| r.p50),
            med(&expanded, |r| r.p99),
            med(&expanded, |r| r.cpu_per_send),
        );
    }
}
