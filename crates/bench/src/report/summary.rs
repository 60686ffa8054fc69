//! The terminal summary printed at the end of every run.

use std::fmt::Write;

use crate::measurements::SocialReport;
use crate::report::Report;
use crate::util::fmt::{bytes, fmt_micros, thousands};
use crate::util::histogram::Summary;

/// The summary table as text.
pub fn render(r: &Report) -> String {
    let mut o = String::new();
    let t = &r.totals;
    // Writing to a String cannot fail; the results are ignored throughout.
    let _ = writeln!(
        o,
        "\n{} {} — profile {} — {:.1}s (measured {:.1}s), {} worker processes",
        r.tool, r.workload, r.profile, r.duration_secs, r.measured_secs, r.bench.processes
    );
    let _ = writeln!(
        o,
        "connections  attempts {}  connected {}  handshakes {}{}  subscribed {}  closed {}  failed {}",
        thousands(t.attempts),
        thousands(t.connected),
        thousands(t.upgraded),
        // A rate of handshakes only means something when arrivals are the load.
        if r.phases.is_empty() { String::new() } else { format!(" ({:.0}/s)", r.handshakes_per_s) },
        thousands(t.subscribed),
        thousands(t.closed),
        thousands(t.failed())
    );
    if t.published > 0 || t.messages_in > 0 || t.heartbeats > 0 {
        let _ = writeln!(
            o,
            "messages     published {} ({:.0}/s)  received {} ({:.0}/s)  server errors {}  heartbeats {}",
            thousands(t.published),
            r.published_per_s,
            thousands(t.messages_in),
            r.messages_in_per_s,
            thousands(t.server_errors),
            thousands(t.heartbeats)
        );
    }
    if let Some(d) = &r.deliveries {
        let verdict = match d.expected {
            Some(e) if e == d.received => "all delivered".to_owned(),
            Some(e) if d.received < e => format!("MISSING {}", thousands(e - d.received)),
            Some(e) => format!("{} MORE than expected", thousands(d.received - e)),
            None => "expected unknown".to_owned(),
        };
        let exact = if d.exact {
            ""
        } else {
            " (inexact: a publisher connection was lost)"
        };
        let _ = writeln!(
            o,
            "deliveries   expected {}  received {}  {verdict}{exact}",
            d.expected.map_or("-".to_owned(), thousands),
            thousands(d.received)
        );
    }
    if t.http_ok + t.http_errors > 0 {
        let _ = writeln!(
            o,
            "http         2xx {}  other {}  server-reported deliveries {}",
            thousands(t.http_ok),
            thousands(t.http_errors),
            thousands(t.http_delivered)
        );
    }
    let rows = r.latency_rows();
    if !rows.is_empty() {
        let _ = write!(o, "latency      {:>13}", Summary::COLUMNS[0]);
        for column in &Summary::COLUMNS[1..] {
            let _ = write!(o, " {column:>9}");
        }
        let _ = writeln!(o);
        for (name, s) in rows {
            let [count, rest @ ..] = s.cells();
            let _ = write!(o, "  {name:<14}{count:>9}");
            for cell in rest {
                let _ = write!(o, " {cell:>9}");
            }
            let _ = writeln!(o);
        }
    }
    if let Some(b) = &r.broadcast {
        let _ = writeln!(
            o,
            "broadcast    {} messages × {} subscribers: {} complete; until the last subscriber p50 {} p99 {} max {}; {:.0} deliveries/s",
            thousands(b.messages),
            thousands(b.subscribers),
            thousands(b.complete),
            fmt_micros(b.until_last.p50_us as f64),
            fmt_micros(b.until_last.p99_us as f64),
            fmt_micros(b.until_last.max_us as f64),
            b.deliveries_per_s
        );
    }
    if let Some(c) = &r.churn {
        let _ = writeln!(
            o,
            "churn        reconnects {} ({:.0}/s asked, {} skipped)  answered {}  failovers {} (answered {})  recovered {} ({})  unrecovered {}",
            thousands(c.reconnects),
            c.reconnect_rate,
            thousands(c.reconnects_skipped),
            thousands(c.reconnected),
            thousands(c.failovers),
            thousands(c.failed_over),
            thousands(c.recovered),
            c.recovered_percent
                .map_or("-".to_owned(), |p| format!("{p:.2} %")),
            thousands(c.unrecovered)
        );
        let _ = writeln!(
            o,
            "continuity   {} subscriptions: lost {} ({} short at the end)  duplicates {}  gaps {}  broken {}  replayed {} (per recovery p50 {} p99 {} max {})",
            thousands(c.subscriptions),
            thousands(c.lost),
            thousands(c.short_at_end),
            thousands(c.duplicates),
            thousands(c.gaps),
            thousands(c.broken),
            thousands(c.replayed),
            c.replay.p50,
            c.replay.p99,
            c.replay.max
        );
        let problems = c.problems();
        let verdict = if problems.is_empty() {
            "every subscriber got every message of its subjects once, in order".to_owned()
        } else {
            format!("FAILED: {}", problems.join(", "))
        };
        let _ = writeln!(o, "verdict      {verdict}");
    }
    if let Some(so) = &r.social {
        social(&mut o, r, so);
    }
    for p in &r.phases {
        let _ = writeln!(
            o,
            "phase        {:<10} {:>6.1}s  planned {:>8.0}/s  achieved {:>8.0}/s  ({} upgrades)",
            p.name,
            p.secs,
            p.planned_per_s,
            p.achieved_per_s,
            thousands(p.upgrades)
        );
    }
    if t.failed() > 0 {
        let kinds: Vec<String> = r
            .failures
            .iter()
            .filter(|(_, &c)| c > 0)
            .map(|(k, c)| format!("{k} {}", thousands(*c)))
            .collect();
        let _ = writeln!(o, "errors       {}", kinds.join(", "));
    }
    if let Some(q) = &r.listen_queue {
        let _ = writeln!(
            o,
            "listen queue overflows +{}  drops +{} (host-wide, /proc/net/netstat)",
            q.listen_overflows, q.listen_drops
        );
    }
    let b = &r.bench;
    let _ = write!(
        o,
        "bench        rss peak {}  cpu {:.2}s ({:.2}s user)",
        bytes(b.rss_peak_bytes as f64),
        b.cpu_secs,
        b.cpu_user_secs
    );
    if let Some(per) = b.rss_per_conn_bytes {
        let _ = write!(o, "  {} per idle connection", bytes(per));
    }
    if let Some(us) = b.cpu_us_per_message_in {
        let _ = write!(o, "  {us:.2}µs cpu per message received");
    }
    let _ = writeln!(o);
    if let Some(s) = &r.server {
        let _ = write!(
            o,
            "server       {} node(s)  rss peak {}  cpu {:.2}s",
            s.nodes,
            bytes(s.rss_peak_bytes as f64),
            s.cpu_secs
        );
        if let (Some(all), Some(added)) = (s.rss_per_connection, s.rss_added_per_connection) {
            let _ = write!(
                o,
                "  at {} connections: {} rss per connection ({} added by each)",
                thousands(s.peak_connections),
                bytes(all),
                bytes(added)
            );
        }
        if let Some(us) = s.cpu_us_per_message_out {
            let _ = write!(o, "  {us:.2}µs cpu per message sent");
        }
        if let Some(m) = s.messages_per_write {
            let _ = write!(o, "  {m:.2} messages per write");
        }
        let _ = writeln!(o);
    }
    o
}

/// The social workload's lines: the graph, the sends, the follow churn, the
/// verdict on every (send, connection) pair, and what the node spent.
fn social(o: &mut String, r: &Report, so: &SocialReport) {
    let _ = writeln!(
        o,
        "social       {} users × {} connection(s) from a graph of {} users and {} edges ({} among them); senders {}",
        thousands(so.users),
        so.connections_per_user,
        thousands(so.graph_users),
        thousands(so.graph_edges),
        thousands(so.edges_among_users),
        so.sender
    );
    let sends = named(&[
        ("answered", so.acked),
        ("refused", so.refused),
        ("unanswered", so.unanswered),
        ("not made", so.not_made),
    ]);
    let _ = writeln!(
        o,
        "sends        fired {} ({:.0}/s, {:.0}/s asked)  {sends}  reached {} (node's count)",
        thousands(so.sends),
        r.published_per_s,
        so.rate,
        thousands(so.reached)
    );
    let t = &so.tally;
    let judged = named(&[
        ("lost", t.lost),
        ("duplicated", t.duplicated),
        ("unexpected", t.unexpected),
        ("in flight, not judged", t.in_flight),
    ]);
    let _ = writeln!(
        o,
        "deliveries   owed {}  delivered {} ({:.0}/s)  {judged} ({} delivered)",
        thousands(t.expected),
        thousands(t.delivered),
        r.messages_in_per_s,
        thousands(t.in_flight_delivered)
    );
    if so.follow_requests > 0 {
        let l = &so.follow_latency;
        let _ = writeln!(
            o,
            "follows      {} follows, {} unfollows ({:.0}/s asked) in {} requests ({} failed), answered p50 {} p99 {} max {}; notices {} of {}",
            thousands(so.follows),
            thousands(so.unfollows),
            so.follow_rate,
            thousands(so.follow_requests),
            thousands(so.follow_requests_failed),
            fmt_micros(l.p50_us as f64),
            fmt_micros(l.p99_us as f64),
            fmt_micros(l.max_us as f64),
            thousands(so.follow_notices),
            thousands(so.follow_notices_expected)
        );
    }
    if let Some(cpu) = so.server_cpu_secs {
        let per = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}µs"));
        let follows = if so.follow_requests > 0 {
            " (follows and unfollows included)"
        } else {
            ""
        };
        let _ = writeln!(
            o,
            "server cpu   {cpu:.2}s while sending{follows}: {} per send, {} per delivery",
            per(so.server_cpu_us_per_send),
            per(so.server_cpu_us_per_delivery)
        );
    }
    let problems = so.problems();
    let verdict = if problems.is_empty() {
        "every connection got every send it was owed exactly once, and nothing else".to_owned()
    } else {
        format!("FAILED: {}", problems.join(", "))
    };
    let _ = writeln!(o, "verdict      {verdict}");
}

/// `name N  name N …`.
fn named(counts: &[(&str, u64)]) -> String {
    let cells: Vec<String> = counts
        .iter()
        .map(|(name, n)| format!("{name} {}", thousands(*n)))
        .collect();
    cells.join("  ")
}
