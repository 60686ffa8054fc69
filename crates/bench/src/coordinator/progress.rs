//! Live progress: an indicatif line on a terminal, plain lines (every 5 s
//! by default, like seed 001's Benchsub) when not.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

use crate::coordinator::cli::ProgressMode;
use crate::measurements::Sample;
use crate::util::counters::Counters;
use crate::util::fmt::{fmt_micros, thousands};

/// Where progress goes.
pub struct Progress {
    bar: Option<ProgressBar>,
    plain: bool,
    every: f64,
    next_line: f64,
}

impl Progress {
    /// Progress in `mode`, plain lines every `every` seconds.
    pub fn new(mode: ProgressMode, every: f64) -> Progress {
        let tty = std::io::stderr().is_terminal();
        let live = mode == ProgressMode::Auto && tty;
        let bar = live.then(|| {
            let bar = ProgressBar::new_spinner();
            if let Ok(style) = ProgressStyle::with_template("{spinner} {msg}") {
                bar.set_style(style);
            }
            bar
        });
        Progress {
            bar,
            plain: mode == ProgressMode::Plain || (mode == ProgressMode::Auto && !tty),
            every: every.max(0.1),
            next_line: every,
        }
    }

    /// Shows the latest sample, with the run's counts so far.
    pub fn update(&mut self, s: &Sample, totals: &Counters) {
        let line = line(s, totals);
        if let Some(bar) = &self.bar {
            bar.set_message(line);
            bar.tick();
        } else if self.plain && s.t >= self.next_line {
            self.next_line = s.t + self.every;
            eprintln!("{line}");
        }
    }

    /// A one-off note (phase changes).
    pub fn note(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None if self.plain => eprintln!("{text}"),
            None => {}
        }
    }

    /// Removes the live line before the summary prints.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// `uptime 25s | open 10,000 (0 in setup) | msgs 7,089,699 at 20,905/s | p50 1.20ms p99 3.40ms max 12.00ms | errors 0`:
/// seed 001's Benchsub fields, each shown once the run has something to say,
/// and churn's reconnects and continuity counts while there are any.
fn line(s: &Sample, totals: &Counters) -> String {
    let messages_total = totals.messages_in;
    let mut out = format!(
        "uptime {:>4.0}s | open {} ({} in setup)",
        s.t,
        thousands(s.open),
        thousands(s.in_setup)
    );
    if s.upgraded_per_s > 0.0 {
        out += &format!(" | {} handshakes/s", thousands(s.upgraded_per_s as u64));
    }
    if messages_total > 0 {
        out += &format!(
            " | msgs {} at {}/s",
            thousands(messages_total),
            thousands(s.messages_in_per_s as u64)
        );
    }
    if s.published_per_s > 0.0 {
        out += &format!(" | published {}/s", thousands(s.published_per_s as u64));
    }
    if totals.reconnects > 0 {
        out += &format!(
            " | reconnects {} at {}/s, recovered {} unrecovered {} | missed {} dup {}",
            thousands(totals.reconnects),
            thousands(s.reconnects_per_s as u64),
            thousands(totals.recovered),
            thousands(totals.unrecovered),
            thousands(totals.missed),
            thousands(totals.duplicates)
        );
    }
    if let Some(l) = &s.latency {
        out += &format!(
            " | p50 {} p99 {} max {}",
            fmt_micros(l.p50_us as f64),
            fmt_micros(l.p99_us as f64),
            fmt_micros(l.max_us as f64)
        );
    }
    out + &format!(" | errors {}", thousands(s.failures))
}
