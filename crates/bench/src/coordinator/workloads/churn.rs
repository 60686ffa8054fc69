//! `myriad bench churn`, the coordinator side: `run`'s shape (set up,
//! publish, drain) with subscribers that reconnect, then compares where
//! every subscription stopped with where its subject's stream ended: where
//! it joined plus what the publishers published to it. The churning
//! subscribers are `worker/workloads/churn.rs`.

use crate::coordinator::cli::{BenchCommand, ChurnArgs, Secs};
use crate::coordinator::groups::{
    expected_deliveries, measurements, publish_schedule, publish_to_subscribers, published_counts,
    ChurnPlan, Setup, SubscriberGroup, DEFAULT_RATE, MAX_REPLAY_SUBJECTS,
};
use crate::coordinator::monitor::Monitor;
use crate::measurements::{ChurnReport, Group, Measurements, Sizes};
use crate::schema::merge_histograms;
use crate::util::error::BenchError;

/// `myriad bench churn`: sets every subscriber up, then publishes for the
/// duration while they reconnect, waits for the deliveries and the last
/// reconnects, and checks every subscription.
pub fn run(cmd: &BenchCommand, args: &ChurnArgs) -> Result<Measurements, BenchError> {
    let mut setup = Setup::new(cmd)?;
    if setup.profile.name != "myriad" {
        return Err(BenchError::Config(
            "churn resubscribes with `since` and checks positions, which only myriad's protocol has (--profile myriad)".into(),
        ));
    }
    let seed = cmd.global.seed;
    let assignment = args.subs.assignment(seed);
    let subjects = assignment.pattern.len();
    if subjects > MAX_REPLAY_SUBJECTS {
        return Err(BenchError::Config(format!(
            "churn checks where every subject's stream ends: at most {MAX_REPLAY_SUBJECTS} subjects"
        )));
    }
    let mut m = Monitor::new(&cmd.global);
    // The last subscribers back from their time away still have their
    // replay to take after the last publish, and a poll that finds nothing
    // new is answered at the server's poll timeout.
    let mut publish = args.publish.clone();
    publish.drain = Secs(publish.drain.0 + args.offline.0 + args.subs.receive.first_answer_secs());
    let conns = args.subs.connections;
    let group = SubscriberGroup {
        conns,
        assignment: Some(assignment.clone()),
        broadcast_messages: None,
        connect_rate: args.subs.connect_rate,
        churn: Some(ChurnPlan {
            rate: args.reconnect_rate,
            secs: args.duration.0,
            offline: args.offline.0,
            close: args.close,
        }),
        receive: args.subs.receive.clone(),
    };
    let rate = publish.rate.unwrap_or(DEFAULT_RATE);
    let schedule = publish_schedule(&publish, DEFAULT_RATE, args.duration.0);
    let every = match args.reconnect_rate {
        r if r > 0.0 => format!("each subscriber every {:.1}s", conns as f64 / r),
        _ => "none".to_owned(),
    };
    m.note(&format!(
        "{conns} subscribers over {subjects} subjects; {:.0} reconnects/s ({every}) and {rate:.0} publishes/s for {:.0}s",
        args.reconnect_rate, args.duration.0
    ));
    let measured = publish_to_subscribers(&mut m, cmd, &mut setup, &group, &publish, schedule)?;
    let mut out = measurements(cmd, &setup, &m, measured)?;
    out.deliveries = Some(expected_deliveries(&m, &assignment, conns, &publish, seed));
    let published = published_counts(&m, &publish, seed, subjects)
        .per_subject
        .unwrap_or_default();
    out.churn = Some(churn_report(&m, args.reconnect_rate, &published)?);
    Ok(out)
}

/// The churn figures: the workers' counts, and every subscription's end
/// against its subject's (`published` per subject index).
fn churn_report(m: &Monitor, rate: f64, published: &[u64]) -> Result<ChurnReport, BenchError> {
    let t = m.totals(Some(Group::Subscribers));
    let (mut subscriptions, mut short) = (0, 0);
    for r in m
        .workers
        .iter()
        .filter_map(|w| w.done.as_ref()?.reached.as_ref())
        .flatten()
    {
        subscriptions += 1;
        let published = published.get(r.subject as usize).copied().unwrap_or(0);
        // None: its epoch changed, which `broken` has counted already.
        short += r.shortfall(published).unwrap_or(0);
    }
    let replay = merge_histograms(m.workers.iter().filter_map(|w| w.done.as_deref()))?
        .get("replay")
        .map_or_else(Sizes::default, Sizes::of);
    let resubscribes = t.recovered + t.unrecovered;
    Ok(ChurnReport {
        reconnect_rate: rate,
        subscriptions,
        reconnects: t.reconnects,
        reconnects_skipped: t.reconnects_skipped,
        reconnected: t.reconnected,
        failovers: t.failovers,
        failed_over: t.failed_over,
        recovered: t.recovered,
        unrecovered: t.unrecovered,
        recovered_percent: (resubscribes > 0)
            .then(|| t.recovered as f64 * 100.0 / resubscribes as f64),
        replayed: t.replayed,
        replay,
        duplicates: t.duplicates,
        gaps: t.gaps,
        lost: t.missed + short,
        short_at_end: short,
        broken: t.broken,
    })
}
