//! `--html FILE`: a self-contained page (inline CSS and SVG, no scripts,
//! no fetches) with the run's charts over time and its summary tables.
//!
//! Charts are drawn here as SVG polylines: connections, rates, latency
//! percentiles (log scale, where spikes and the median both stay
//! readable) and resources of the bench and the server side by side.

use std::fmt::Write;
use std::path::Path;

use crate::report::Report;
use crate::util::error::BenchError;
use crate::util::fmt::{bytes, fmt_micros, thousands};
use crate::util::histogram::Summary;

/// Plot size, pixels.
const W: f64 = 880.0;
const H: f64 = 260.0;
/// Margins: left (axis labels), right, top (legend), bottom (time axis).
const ML: f64 = 70.0;
const MR: f64 = 20.0;
const MT: f64 = 30.0;
const MB: f64 = 30.0;

/// One line on a chart.
struct Series {
    name: &'static str,
    color: &'static str,
    points: Vec<(f64, f64)>,
}

/// Writes the page for `r` to `path`.
pub fn write(r: &Report, path: &Path) -> Result<(), BenchError> {
    std::fs::write(path, render(r))?;
    Ok(())
}

/// The page as text.
pub fn render(r: &Report) -> String {
    let mut o = String::new();
    let title = format!("{} {}", r.tool, r.workload);
    let _ = write!(
        o,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{}</title><style>{}</style></head><body>",
        esc(&title),
        CSS
    );
    let _ = write!(
        o,
        "<h1>{}</h1><p class=\"sub\">profile <b>{}</b> · {:.1} s (measured {:.1} s) · {} worker processes</p>",
        esc(&title),
        esc(&r.profile),
        r.duration_secs,
        r.measured_secs,
        r.bench.processes
    );
    o += &headline(r);
    let tl = &r.timeline;
    let pts = |f: &dyn Fn(&crate::measurements::Sample) -> Option<f64>| -> Vec<(f64, f64)> {
        tl.iter().filter_map(|s| Some((s.t, f(s)?))).collect()
    };
    o += &chart(
        "Connections",
        "",
        false,
        vec![
            Series {
                name: "bench open",
                color: "#2563eb",
                points: pts(&|s| Some(s.open as f64)),
            },
            Series {
                name: "in setup",
                color: "#f59e0b",
                points: pts(&|s| Some(s.in_setup as f64)),
            },
            Series {
                name: "server connections",
                color: "#10b981",
                points: pts(&|s| s.server.map(|p| p.connections as f64)),
            },
        ],
    );
    o += &chart(
        "Rates (per second)",
        "/s",
        false,
        vec![
            Series {
                name: "handshakes",
                color: "#2563eb",
                points: pts(&|s| Some(s.upgraded_per_s)),
            },
            Series {
                name: "messages received",
                color: "#10b981",
                points: pts(&|s| Some(s.messages_in_per_s)),
            },
            Series {
                name: "published",
                color: "#8b5cf6",
                points: pts(&|s| Some(s.published_per_s)),
            },
            Series {
                name: "reconnects",
                color: "#0891b2",
                points: pts(&|s| Some(s.reconnects_per_s)),
            },
            Series {
                name: "server messages out",
                color: "#f97316",
                points: pts(&|s| s.server.map(|p| p.messages_out_per_s)),
            },
            Series {
                name: "failures",
                color: "#dc2626",
                points: pts(&|s| Some(s.failures_per_s)),
            },
        ],
    );
    o += &chart(
        "Delivery latency per second (log scale)",
        "µs",
        true,
        vec![
            Series {
                name: "p50",
                color: "#10b981",
                points: pts(&|s| s.latency.map(|l| l.p50_us as f64)),
            },
            Series {
                name: "p90",
                color: "#2563eb",
                points: pts(&|s| s.latency.map(|l| l.p90_us as f64)),
            },
            Series {
                name: "p99",
                color: "#f59e0b",
                points: pts(&|s| s.latency.map(|l| l.p99_us as f64)),
            },
            Series {
                name: "max",
                color: "#dc2626",
                points: pts(&|s| s.latency.map(|l| l.max_us as f64)),
            },
        ],
    );
    o += &chart(
        "Memory (MiB)",
        "MiB",
        false,
        vec![
            Series {
                name: "bench RSS",
                color: "#2563eb",
                points: pts(&|s| Some(s.bench_rss_bytes as f64 / 1048576.0)),
            },
            Series {
                name: "server RSS",
                color: "#10b981",
                points: pts(&|s| s.server.map(|p| p.rss_bytes as f64 / 1048576.0)),
            },
        ],
    );
    o += &chart(
        "CPU (cores busy)",
        "",
        false,
        vec![
            Series {
                name: "bench",
                color: "#2563eb",
                points: pts(&|s| Some(s.bench_cpu_per_s)),
            },
            Series {
                name: "server",
                color: "#10b981",
                points: pts(&|s| s.server.map(|p| p.cpu_per_s)),
            },
        ],
    );
    o += &tables(r);
    let config = serde_json::to_string_pretty(&r.config).unwrap_or_default();
    let _ = writeln!(
        o,
        "<h2>Configuration</h2><pre>{}</pre></body></html>",
        esc(&config)
    );
    o
}

/// The figures a reader wants first, as big numbers.
fn headline(r: &Report) -> String {
    let mut cards: Vec<(String, String)> = Vec::new();
    // A rate of handshakes only means something when arrivals are the load.
    if !r.phases.is_empty() {
        cards.push((format!("{:.0}/s", r.handshakes_per_s), "handshakes".into()));
    }
    if r.totals.messages_in > 0 {
        cards.push((
            format!("{:.0}/s", r.messages_in_per_s),
            "messages received".into(),
        ));
    }
    if let Some(l) = &r.latency {
        cards.push((fmt_micros(l.p99_us as f64), "p99 delivery latency".into()));
    }
    if let Some(d) = &r.deliveries {
        let text = match d.expected {
            Some(e) => format!("{} / {}", thousands(d.received), thousands(e)),
            None => thousands(d.received),
        };
        cards.push((text, "deliveries received / expected".into()));
    }
    if let Some(c) = &r.churn {
        cards.push((thousands(c.reconnects), "reconnects".into()));
        cards.push((
            c.recovered_percent
                .map_or("-".into(), |p| format!("{p:.2} %")),
            "resubscribes recovered".into(),
        ));
        cards.push((
            format!("{} / {}", thousands(c.lost), thousands(c.duplicates)),
            "lost / duplicated".into(),
        ));
    }
    if let Some(so) = &r.social {
        cards.push((format!("{:.0}/s", r.published_per_s), "sends".into()));
        cards.push((
            format!(
                "{} / {} / {}",
                thousands(so.tally.lost),
                thousands(so.tally.duplicated),
                thousands(so.tally.unexpected)
            ),
            "lost / duplicated / unexpected".into(),
        ));
        if let Some(us) = so.server_cpu_us_per_send {
            cards.push((format!("{us:.1} µs"), "server CPU per send".into()));
        }
    }
    if let Some(per) = r.bench.rss_per_conn_bytes {
        cards.push((bytes(per), "bench RSS per connection".into()));
    }
    if let Some(per) = r.server.as_ref().and_then(|s| s.rss_added_per_connection) {
        cards.push((bytes(per), "server RSS added per connection".into()));
    }
    let mut o = String::from("<div class=\"cards\">");
    for (big, small) in cards {
        let _ = write!(
            o,
            "<div class=\"card\"><div class=\"big\">{}</div><div>{}</div></div>",
            esc(&big),
            esc(&small)
        );
    }
    o + "</div>"
}

/// Summary tables: latency, phases, failures, cost.
fn tables(r: &Report) -> String {
    let mut o = String::from("<h2>Latency</h2><table><tr><th></th>");
    for column in Summary::COLUMNS {
        let _ = write!(o, "<th>{column}</th>");
    }
    o += "</tr>";
    for (name, s) in r.latency_rows() {
        let _ = write!(o, "<tr><td>{name}</td>");
        for cell in s.cells() {
            let _ = write!(o, "<td>{cell}</td>");
        }
        o += "</tr>";
    }
    o += "</table>";
    if !r.phases.is_empty() {
        o += "<h2>Phases</h2><table><tr><th>phase</th><th>seconds</th><th>planned/s</th><th>achieved/s</th><th>upgrades</th></tr>";
        for p in &r.phases {
            let _ = write!(
                o,
                "<tr><td>{}</td><td>{:.1}</td><td>{:.0}</td><td>{:.0}</td><td>{}</td></tr>",
                esc(&p.name),
                p.secs,
                p.planned_per_s,
                p.achieved_per_s,
                thousands(p.upgrades)
            );
        }
        o += "</table>";
    }
    if let Some(c) = &r.churn {
        o += "<h2>Churn</h2><table>";
        count_rows(
            &mut o,
            &[
                ("subscriptions followed", c.subscriptions),
                ("reconnects", c.reconnects),
                ("reconnects skipped", c.reconnects_skipped),
                ("reconnects answered", c.reconnected),
                ("failovers (connections lost)", c.failovers),
                ("failovers answered", c.failed_over),
                ("recovered", c.recovered),
                ("not recovered", c.unrecovered),
                ("replayed", c.replayed),
                ("replay p50", c.replay.p50),
                ("replay p99", c.replay.p99),
                ("replay max", c.replay.max),
                ("lost", c.lost),
                ("short at the end", c.short_at_end),
                ("duplicates", c.duplicates),
                ("gaps", c.gaps),
                ("broken", c.broken),
            ],
        );
        o += "</table>";
    }
    if let Some(so) = &r.social {
        o += "<h2>Social</h2><table>";
        let t = &so.tally;
        count_rows(
            &mut o,
            &[
                ("users in the graph", so.graph_users),
                ("edges in the graph", so.graph_edges),
                ("connected users", so.users),
                ("connections per user", so.connections_per_user),
                ("edges among connected users", so.edges_among_users),
                ("sends fired", so.sends),
                ("sends answered ok", so.acked),
                ("sends refused", so.refused),
                ("sends never answered", so.unanswered),
                ("sends not made", so.not_made),
                ("connections reached (node's count)", so.reached),
                ("deliveries owed", t.expected),
                ("delivered", t.delivered),
                ("lost", t.lost),
                ("duplicated", t.duplicated),
                ("unexpected", t.unexpected),
                ("in flight, not judged", t.in_flight),
                ("in flight, delivered", t.in_flight_delivered),
                ("sends given a taken offset", t.clashes),
                ("follows", so.follows),
                ("unfollows", so.unfollows),
                ("follow requests", so.follow_requests),
                ("follow requests failed", so.follow_requests_failed),
                ("follow notices", so.follow_notices),
                ("follow notices owed", so.follow_notices_expected),
                ("feeds not in the graph file", so.feeds_mismatched),
                ("connections never set up", so.not_set_up),
            ],
        );
        if let Some(cpu) = so.server_cpu_secs {
            let per = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2} µs"));
            let _ = write!(
                o,
                "<tr><td>server CPU while sending</td><td>{cpu:.2} s</td></tr><tr><td>per send</td><td>{}</td></tr><tr><td>per delivery</td><td>{}</td></tr>",
                per(so.server_cpu_us_per_send),
                per(so.server_cpu_us_per_delivery)
            );
        }
        o += "</table>";
    }
    let t = &r.totals;
    o += "<h2>Counts</h2><table>";
    count_rows(
        &mut o,
        &[
            ("connect attempts", t.attempts),
            ("connected", t.connected),
            ("handshakes", t.upgraded),
            ("subscribed", t.subscribed),
            ("closed cleanly", t.closed),
            ("published", t.published),
            ("received", t.messages_in),
            ("server errors", t.server_errors),
            ("heartbeats", t.heartbeats),
        ],
    );
    for (name, v) in &r.failures {
        let _ = write!(
            o,
            "<tr><td>failed: {name}</td><td>{}</td></tr>",
            thousands(*v)
        );
    }
    if let Some(q) = &r.listen_queue {
        let _ = write!(
            o,
            "<tr><td>ListenOverflows (+)</td><td>{}</td></tr><tr><td>ListenDrops (+)</td><td>{}</td></tr>",
            q.listen_overflows, q.listen_drops
        );
    }
    o += "</table><h2>Cost</h2><table><tr><th></th><th>RSS peak</th><th>RSS added per connection</th><th>CPU s (user)</th><th>CPU / message</th></tr>";
    let b = &r.bench;
    let _ = write!(
        o,
        "<tr><td>bench ({} processes)</td><td>{}</td><td>{}</td><td>{:.2} ({:.2})</td><td>{}</td></tr>",
        b.processes,
        bytes(b.rss_peak_bytes as f64),
        b.rss_per_conn_bytes.map_or("-".into(), bytes),
        b.cpu_secs,
        b.cpu_user_secs,
        b.cpu_us_per_message_in
            .map_or("-".into(), |v| format!("{v:.2} µs received"))
    );
    if let Some(s) = &r.server {
        let _ = write!(
            o,
            "<tr><td>server ({} nodes)</td><td>{}</td><td>{}</td><td>{:.2}</td><td>{}</td></tr>",
            s.nodes,
            bytes(s.rss_peak_bytes as f64),
            s.rss_added_per_connection.map_or("-".into(), bytes),
            s.cpu_secs,
            s.cpu_us_per_message_out
                .map_or("-".into(), |v| format!("{v:.2} µs sent"))
        );
    }
    o + "</table>"
}

/// Table rows of named counts.
fn count_rows(o: &mut String, rows: &[(&str, u64)]) {
    for (name, v) in rows {
        let _ = write!(o, "<tr><td>{name}</td><td>{}</td></tr>", thousands(*v));
    }
}

/// One line chart as inline SVG; empty series are left out, and a chart
/// with none is not drawn.
fn chart(title: &str, unit: &str, log: bool, series: Vec<Series>) -> String {
    let series: Vec<Series> = series
        .into_iter()
        .filter(|s| s.points.iter().any(|p| p.1 > 0.0))
        .collect();
    if series.is_empty() {
        return String::new();
    }
    let all = || series.iter().flat_map(|s| s.points.iter());
    let t_max = all().map(|p| p.0).fold(1.0, f64::max);
    let y_max = all().map(|p| p.1).fold(0.0, f64::max);
    let ty = |v: f64| if log { v.max(1.0).log10() } else { v };
    let (lo, hi) = if log {
        (0.0, ty(y_max).ceil().max(1.0))
    } else {
        (0.0, nice(y_max))
    };
    let x = |t: f64| ML + (W - ML - MR) * t / t_max;
    let y = |v: f64| H - MB - (H - MT - MB) * (ty(v) - lo) / (hi - lo);
    let mut o = format!(
        "<h2>{}</h2><svg viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\" xmlns=\"http://www.w3.org/2000/svg\">",
        esc(title)
    );
    // Grid and y labels.
    let ticks: Vec<f64> = if log {
        (0..=hi as i32).map(|e| 10f64.powi(e)).collect()
    } else {
        (0..=4).map(|i| hi * f64::from(i) / 4.0).collect()
    };
    for v in ticks {
        let label = if unit == "µs" {
            fmt_micros(v)
        } else {
            short(v)
        };
        let _ = write!(
            o,
            "<line x1=\"{ML}\" x2=\"{}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" class=\"grid\"/><text x=\"{}\" y=\"{:.1}\" class=\"yl\">{}</text>",
            W - MR,
            ML - 6.0,
            y(v) + 4.0,
            esc(&label),
            yy = y(v)
        );
    }
    // Time axis.
    let step = nice(t_max / 8.0).max(1.0);
    let mut t = 0.0;
    while t <= t_max + 1e-9 {
        let _ = write!(
            o,
            "<text x=\"{:.1}\" y=\"{}\" class=\"xl\">{}s</text>",
            x(t),
            H - 10.0,
            short(t)
        );
        t += step;
    }
    // Lines and legend.
    let mut lx = ML;
    for s in &series {
        let path: Vec<String> = s
            .points
            .iter()
            .map(|&(t, v)| format!("{:.1},{:.1}", x(t), y(v)))
            .collect();
        let _ = write!(
            o,
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"><title>{}</title></polyline><rect x=\"{lx}\" y=\"8\" width=\"12\" height=\"12\" fill=\"{c}\"/><text x=\"{}\" y=\"18\" class=\"lg\">{}</text>",
            path.join(" "),
            esc(s.name),
            lx + 16.0,
            esc(s.name),
            c = s.color
        );
        lx += 30.0 + 7.0 * s.name.len() as f64;
    }
    o + "</svg>"
}

/// A round axis maximum ≥ v: 1, 2 or 5 times a power of ten.
fn nice(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|&c| c >= v)
        .unwrap_or(10.0 * p)
}

/// 1500 → "1.5k", 2000000 → "2M".
fn short(v: f64) -> String {
    let (v, s) = if v >= 1e6 {
        (v / 1e6, "M")
    } else if v >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let text = format!("{v:.1}");
    format!("{}{s}", text.trim_end_matches('0').trim_end_matches('.'))
}

/// Escapes text for HTML.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const CSS: &str = "body{font:14px/1.4 system-ui,sans-serif;max-width:920px;margin:2em auto;color:#111}h1{margin-bottom:0}.sub{color:#555}\
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:1em 0}.card{border:1px solid #ddd;border-radius:8px;padding:10px 16px}.big{font-size:24px;font-weight:600}\
table{border-collapse:collapse;margin:.5em 0}td,th{border-bottom:1px solid #eee;padding:3px 10px;text-align:right}td:first-child,th:first-child{text-align:left}\
svg{display:block;margin:.5em 0}.grid{stroke:#eee}.yl{font-size:11px;text-anchor:end;fill:#555}.xl{font-size:11px;text-anchor:middle;fill:#555}.lg{font-size:12px;fill:#333}\
pre{background:#f6f6f6;padding:1em;overflow:auto;font-size:12px}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_helpers() {
        assert_eq!(nice(0.0), 1.0);
        assert_eq!(nice(7.0), 10.0);
        assert_eq!(nice(1200.0), 2000.0);
        assert_eq!(short(1500.0), "1.5k");
        assert_eq!(short(2_000_000.0), "2M");
        assert_eq!(short(3.0), "3");
        assert_eq!(esc("<a&\"b\">"), "&lt;a&amp;&quot;b&quot;&gt;");
    }

    #[test]
    fn charts_skip_empty_series() {
        let s = Series {
            name: "x",
            color: "#000",
            points: vec![(0.0, 0.0)],
        };
        assert_eq!(chart("t", "", false, vec![s]), "");
        let s = Series {
            name: "x",
            color: "#000",
            points: vec![(0.0, 1.0), (1.0, 5.0)],
        };
        let svg = chart("t", "", false, vec![s]);
        assert!(svg.contains("<polyline") && svg.ends_with("</svg>"));
    }
}
