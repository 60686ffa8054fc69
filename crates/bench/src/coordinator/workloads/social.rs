//! `myriad bench social`, the coordinator side: users of a follow graph
//! send as themselves while follows and unfollows go on, and every (send,
//! connection) pair is judged.
//!
//! Reads the graph file (the one the node holds; `--load-graph` loads it
//! through the admin API first), draws the connected users, and gives each
//! worker process whole users with all their connections
//! (`worker/workloads/social.rs`). Once every connection has its feeds,
//! the workers send on one schedule, each the sends of its own users, and
//! a thread here makes `--follow-rate` follows and unfollows among the
//! connected users through the admin API, one request at a time, logging
//! when each was requested and answered. After the drain, the judge
//! (`util/judge.rs`) takes every worker's sends and receipts, the graph and
//! that log, and says for each pair whether it was delivered as owed, lost,
//! duplicated, unexpected, or in flight and not judged. Last, the edges the
//! run changed are put back as the file has them, so the node holds the
//! file's graph for the next run.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::coordinator::cli::{BenchCommand, SocialArgs};
use crate::coordinator::groups::{await_set_up, measurements, stop, Setup};
use crate::coordinator::monitor::Monitor;
use crate::coordinator::node_api::post_json;
use crate::measurements::{Group, Measurements, SocialReport};
use crate::schema::{Control, SocialDone, SocialTask, SocialUser, Task};
use crate::util::addr::Target;
use crate::util::clock::realtime_ns;
use crate::util::error::BenchError;
use crate::util::graph::{FollowGraph, SenderChoice, Senders};
use crate::util::histogram::{self, Micros};
use crate::util::judge::{EdgeChange, Judge, SendRecord};
use crate::util::pacing::Schedule;
use crate::util::plan;
use crate::util::stats::ServerFigures;
use crate::util::toggles::{Toggle, Toggler};

/// Edges per admin request: the node takes batches of up to 10,000.
const BATCH: usize = 10_000;

/// Seconds without a delivery after which the drain ends though the node
/// said more were handed out (workers report once a second).
const QUIET_SECS: f64 = 2.5;

/// How often the follow churn looks for changes falling due.
const CHURN_TICK: Duration = Duration::from_millis(10);

/// `myriad bench social`: set up every user's connections, send (and
/// follow and unfollow) for the duration, drain, judge, and put the graph
/// back.
pub fn run(cmd: &BenchCommand, args: &SocialArgs) -> Result<Measurements, BenchError> {
    let mut setup = Setup::new(cmd)?;
    if setup.profile.name != "myriad" {
        return Err(BenchError::Config(
            "social connects as users and sends as them, which only myriad's protocol has (--profile myriad)".into(),
        ));
    }
    let graph = read_graph(&args.graph)?;
    let n = args.users.unwrap_or(graph.users() as u64);
    if n == 0 || n > graph.users() as u64 {
        return Err(BenchError::Config(format!(
            "--users {n}: the graph has {} users",
            graph.users()
        )));
    }
    let admin = admin_api(cmd, args)?;
    let seed = cmd.global.seed;
    let per_user = args.connections_per_user.max(1);
    let chosen = graph.draw(n as usize, seed);
    let senders = match args.sender {
        SenderChoice::Uniform => Senders::uniform(n, seed),
        SenderChoice::Degree => {
            let weights: Vec<u64> = chosen
                .iter()
                .map(|&u| graph.followers(u).len() as u64)
                .collect();
            Senders::weighted(&weights, seed).ok_or_else(|| {
                BenchError::Config("--sender degree: no connected user has followers".into())
            })?
        }
    };
    let mut m = Monitor::new(&cmd.global);
    if let Some((target, headers)) = admin.as_ref().filter(|_| args.load_graph) {
        let t0 = Instant::now();
        let added = post_edges(target, headers, "/api/follow", graph.edge_ids())?;
        m.note(&format!(
            "loaded {} edges into the node ({added} new) in {:.1}s",
            graph.edges(),
            t0.elapsed().as_secs_f64()
        ));
    }
    let conns = n * u64::from(per_user);
    let users_per_process = (setup.per_process / u64::from(per_user)).max(1);
    let procs = cmd
        .global
        .processes
        .unwrap_or_else(|| n.div_ceil(users_per_process))
        .max(1);
    setup.plan_sources(cmd, &m, conns);
    let schedule = Schedule::constant(args.rate, args.duration.0);
    for (w, range) in plan::split(n, procs).into_iter().enumerate() {
        let users = chosen[range.start as usize..range.end as usize]
            .iter()
            .map(|&u| SocialUser {
                id: graph.id(u),
                follows: graph.following(u).iter().map(|&v| graph.id(v)).collect(),
            })
            .collect();
        let task = SocialTask {
            first_user: range.start,
            users,
            conns_per_user: per_user,
            in_flight: cmd.global.in_flight,
            connect_rate: args.connect_rate / procs as f64,
            sends: schedule.clone(),
            senders: senders.clone(),
            size: args.size,
        };
        let spec = setup.spec(cmd, w as u64, procs, Task::Social(task));
        m.spawn(&spec, Group::Subscribers)?;
    }
    await_set_up(&mut m, cmd, conns, 0.0)?;
    let mismatched = m.totals(Some(Group::Subscribers)).feeds_mismatched;
    if mismatched > 0 {
        m.note(&format!(
            "warning: {mismatched} feeds at connect that the graph file does not have: the node holds another graph (load it with `myriad graph load` or --load-graph)"
        ));
    }
    let toggler = Toggler::new(&graph, &chosen, seed);
    let edges_among_users = toggler.edges() as u64;
    m.note(&format!(
        "{n} users × {per_user} connection(s), {edges_among_users} edges among them; {:.0} sends/s ({}) and {:.0} follows+unfollows/s for {:.0}s",
        args.rate,
        sender_name(args.sender),
        args.follow_rate,
        args.duration.0
    ));
    let cpu_before = server_cpu(&m);
    m.send(Group::Subscribers, Control::Start);
    let t0 = m.elapsed();
    let stop_churn = Arc::new(AtomicBool::new(false));
    let churn = match &admin {
        Some((target, headers)) if args.follow_rate > 0.0 => {
            let (target, headers, flag) =
                (target.clone(), headers.clone(), Arc::clone(&stop_churn));
            let (rate, secs) = (args.follow_rate, args.duration.0);
            Some(std::thread::spawn(move || {
                follow_churn(&target, &headers, toggler, rate, secs, &flag)
            }))
        }
        _ => None,
    };
    m.wait_for(Some(args.duration.0), |_| false)?;
    if let Some(thread) = &churn {
        // Its last changes may be answered a little after the last send
        // fell due; those still due after the drain are not made.
        m.wait_for(Some(args.drain.0), |_| thread.is_finished())?;
    }
    stop_churn.store(true, Ordering::Relaxed);
    let log = match churn {
        Some(thread) => thread
            .join()
            .map_err(|_| BenchError::Config("the follow churn thread panicked".into()))?,
        None => FollowLog::new(),
    };
    let notices_owed = log.follows_answered() * u64::from(per_user);
    let fired = schedule.total_events();
    // Drained once every send is answered, every notice in, and as many
    // deliveries as the node said it handed out, or, since a send handed
    // to a connection whose unfollow was in flight may still be held back,
    // once deliveries have stopped coming.
    let mut last = (u64::MAX, 0.0);
    m.wait_for(Some(args.drain.0), |m| {
        let t = m.totals(Some(Group::Subscribers));
        let now = m.elapsed();
        if t.messages_in != last.0 {
            last = (t.messages_in, now);
        }
        let answered = t.published + t.publish_dropped >= fired
            && t.sends_acked + t.sends_refused >= t.published
            && t.follow_notices >= notices_owed;
        answered && (t.messages_in >= t.reached || now - last.1 >= QUIET_SECS)
    })?;
    let cpu_after = server_cpu(&m);
    let measured = m.elapsed() - t0;
    stop(&mut m, Group::Subscribers)?;
    m.finish_progress();
    let mut out = measurements(cmd, &setup, &m, measured)?;
    let done: Vec<&SocialDone> = m
        .workers
        .iter()
        .filter_map(|w| w.done.as_ref()?.social.as_ref())
        .collect();
    let sends: Vec<SendRecord> = done.iter().flat_map(|d| d.sends.iter().copied()).collect();
    let mut judge = Judge::new(&graph, &sends, &log.changes);
    for c in done.iter().flat_map(|d| &d.receipts) {
        let user = graph.id(chosen[(c.index / u64::from(per_user)) as usize]);
        judge.connection(user, &c.feeds);
    }
    if let Some((target, headers)) = admin.as_ref().filter(|_| !log.changes.is_empty()) {
        let put_back = restore(target, headers, &graph, &log.changes)?;
        m.note(&format!(
            "put {put_back} edges the run changed back as the graph file has them"
        ));
    }
    let t = m.totals(Some(Group::Subscribers));
    let cpu = cpu_before.zip(cpu_after).map(|(a, b)| (b - a).max(0.0));
    let per = |count: u64| cpu.filter(|_| count > 0).map(|s| s * 1e6 / count as f64);
    out.social = Some(SocialReport {
        graph_users: graph.users() as u64,
        graph_edges: graph.edges() as u64,
        users: n,
        connections_per_user: u64::from(per_user),
        edges_among_users,
        sender: sender_name(args.sender).to_owned(),
        rate: args.rate,
        sends: t.published,
        acked: t.sends_acked,
        refused: t.sends_refused,
        unanswered: done.iter().map(|d| d.unanswered).sum(),
        not_made: t.publish_dropped,
        reached: t.reached,
        tally: judge.tally,
        follow_rate: args.follow_rate,
        follows: log.changes.iter().filter(|c| c.follow).count() as u64,
        unfollows: log.changes.iter().filter(|c| !c.follow).count() as u64,
        follow_requests: log.requests,
        follow_requests_failed: log.failed,
        follow_latency: histogram::summary(&log.latency),
        follow_notices: t.follow_notices,
        follow_notices_expected: notices_owed,
        feeds_mismatched: t.feeds_mismatched,
        not_set_up: conns.saturating_sub(m.subscribed_at_setup.unwrap_or(0)),
        server_cpu_secs: cpu,
        server_cpu_us_per_send: per(t.sends_acked),
        server_cpu_us_per_delivery: per(t.messages_in),
    });
    Ok(out)
}

/// The graph file, read whole (a bad line names itself).
fn read_graph(path: &Path) -> Result<FollowGraph, BenchError> {
    let file = File::open(path)
        .map_err(|e| BenchError::Config(format!("--graph {}: {e}", path.display())))?;
    FollowGraph::read(BufReader::new(file))
        .map_err(|e| BenchError::Config(format!("--graph {}: {e}", path.display())))
}

/// The admin API and the header lines its requests carry, when the run
/// needs it (--load-graph, --follow-rate), or has it anyway (to put back
/// what it changed).
fn admin_api(
    cmd: &BenchCommand,
    args: &SocialArgs,
) -> Result<Option<(Target, String)>, BenchError> {
    let target = cmd.global.admin_urls.first().cloned();
    if target.is_none() && (args.load_graph || args.follow_rate > 0.0) {
        return Err(BenchError::Config(
            "--load-graph and --follow-rate use the node's admin API: give --admin-url".into(),
        ));
    }
    Ok(target.map(|t| (t, cmd.global.admin_headers())))
}

/// The CLI name of a sender choice.
fn sender_name(choice: SenderChoice) -> &'static str {
    match choice {
        SenderChoice::Uniform => "uniform",
        SenderChoice::Degree => "degree",
    }
}

/// The node's CPU seconds now (summed over nodes), with --admin-url.
fn server_cpu(m: &Monitor) -> Option<f64> {
    let answers = m.stats.as_ref()?.final_answers()?;
    Some(ServerFigures::total(&answers).cpu_seconds)
}

/// `{"edges":[[a,b],…]}`.
fn edges_body(edges: impl Iterator<Item = (u64, u64)>) -> String {
    let pairs: Vec<[u64; 2]> = edges.map(|(a, b)| [a, b]).collect();
    serde_json::json!({ "edges": pairs }).to_string()
}

/// POSTs `edges` to `path` in batches; returns the sum of the answers'
/// `added` (or `removed`). Any answer but 2xx ends the run.
fn post_edges(
    target: &Target,
    headers: &str,
    path: &str,
    edges: impl Iterator<Item = (u64, u64)>,
) -> Result<u64, BenchError> {
    let edges: Vec<(u64, u64)> = edges.collect();
    let mut changed = 0;
    for batch in edges.chunks(BATCH) {
        let body = edges_body(batch.iter().copied());
        let (status, answer) = post_json(target, path, headers, &body)?;
        if !(200..300).contains(&status) {
            return Err(BenchError::Config(format!(
                "POST {path}: {status} {answer}"
            )));
        }
        let count = |key: &str| answer.get(key).and_then(Value::as_u64);
        changed += count("added").or_else(|| count("removed")).unwrap_or(0);
    }
    Ok(changed)
}

/// Puts every edge `changes` touched back as `graph` has it; returns how
/// many edges that was.
fn restore(
    target: &Target,
    headers: &str,
    graph: &FollowGraph,
    changes: &[EdgeChange],
) -> Result<usize, BenchError> {
    let mut touched: Vec<(u64, u64)> = changes.iter().map(|c| (c.follower, c.followee)).collect();
    touched.sort_unstable();
    touched.dedup();
    let (keep, drop): (Vec<_>, Vec<_>) = touched.iter().partition(|&&(a, b)| graph.follows(a, b));
    post_edges(target, headers, "/api/follow", keep.into_iter())?;
    post_edges(target, headers, "/api/unfollow", drop.into_iter())?;
    Ok(touched.len())
}

/// What the follow churn did.
struct FollowLog {
    /// Every change requested, with its request and answer times.
    changes: Vec<EdgeChange>,
    /// Requests made.
    requests: u64,
    /// Requests not answered 2xx.
    failed: u64,
    /// From each request to its answer, µs.
    latency: Micros,
}

impl FollowLog {
    fn new() -> FollowLog {
        FollowLog {
            changes: Vec::new(),
            requests: 0,
            failed: 0,
            latency: histogram::new(),
        }
    }

    /// Follows the node acknowledged: each owes every connection of its
    /// follower a `subscribed` notice.
    fn follows_answered(&self) -> u64 {
        let answered = self
            .changes
            .iter()
            .filter(|c| c.follow && c.acked_ns.is_some());
        answered.count() as u64
    }

    /// Makes `picks`: the follows in one request, then the unfollows in
    /// another. Returns the changes whose request failed.
    fn apply(&mut self, target: &Target, headers: &str, picks: &[Toggle]) -> Vec<Toggle> {
        let mut failed = Vec::new();
        for (follow, path) in [(true, "/api/follow"), (false, "/api/unfollow")] {
            let group: Vec<Toggle> = picks
                .iter()
                .filter(|t| t.follow == follow)
                .copied()
                .collect();
            if group.is_empty() {
                continue;
            }
            let body = edges_body(group.iter().map(|t| (t.follower, t.followee)));
            let requested_ns = realtime_ns();
            let answer = post_json(target, path, headers, &body);
            let acked = realtime_ns();
            let ok = matches!(answer, Ok((200..=299, _)));
            self.requests += 1;
            histogram::record(&mut self.latency, acked.saturating_sub(requested_ns) / 1000);
            if !ok {
                self.failed += 1;
                failed.extend_from_slice(&group);
            }
            self.changes.extend(group.iter().map(|t| EdgeChange {
                follower: t.follower,
                followee: t.followee,
                follow,
                requested_ns,
                acked_ns: ok.then_some(acked),
            }));
        }
        failed
    }
}

/// Makes `rate` follow-or-unfollow changes a second for `secs` (or until
/// `stop`), open loop: what fell due since the last batch goes in the next,
/// one request at a time, so no edge ever has two changes in flight.
fn follow_churn(
    target: &Target,
    headers: &str,
    mut toggler: Toggler,
    rate: f64,
    secs: f64,
    stop: &AtomicBool,
) -> FollowLog {
    let mut log = FollowLog::new();
    let total = Schedule::constant(rate, secs).total_events();
    let start = Instant::now();
    let mut made = 0;
    while made < total && !stop.load(Ordering::Relaxed) {
        // Changes are due at 0, 1/rate, 2/rate, …
        let due = ((start.elapsed().as_secs_f64() * rate) as u64 + 1).min(total);
        if due <= made {
            std::thread::sleep(CHURN_TICK);
            continue;
        }
        let want = (due - made).min(BATCH as u64);
        made += want;
        let picks: Vec<Toggle> = (0..want).map_while(|_| toggler.pick()).collect();
        let failed = log.apply(target, headers, &picks);
        toggler.settle(&failed);
    }
    log
}
