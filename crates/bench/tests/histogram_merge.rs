//! Histograms shipped from several worker processes merge EXACTLY: the
//! coordinator's percentiles equal those of one histogram that saw every
//! value. Exercised through the real worker message (JSON line, V2 +
//! base64), as a worker would send it.

use myriad_bench::schema::{Done, Msg};
use myriad_bench::util::counters::Counters;
use myriad_bench::util::histogram;

/// A worker's final report carrying `values` as its latency histogram.
fn done_line(values: &[u64]) -> String {
    let mut h = histogram::new();
    for &v in values {
        histogram::record(&mut h, v);
    }
    let done = Done {
        counters: Counters {
            messages_in: values.len() as u64,
            ..Counters::default()
        },
        histograms: vec![("latency".to_owned(), histogram::encode(&h))],
        phase_upgrades: Vec::new(),
        broadcast: None,
        published: None,
        received: None,
        sent: None,
        reached: None,
        social: None,
        rss_start: 0,
        rss_ready: 0,
        conns_ready: 0,
        cpu_ready: 0.0,
        cpu_end: 0.0,
        cpu_user_end: 0.0,
        rss_peak: 0,
    };
    serde_json::to_string(&Msg::Done(Box::new(done))).unwrap()
}

#[test]
fn merged_equals_single_histogram() {
    // Three "processes" with different latency populations, one with a
    // long tail only it sees.
    let a: Vec<u64> = (0..10_000).map(|i| 100 + i % 900).collect();
    let b: Vec<u64> = (0..5_000).map(|i| 2_000 + i * 3).collect();
    let c: Vec<u64> = vec![5_000_000, 7, 0, 123_456];

    let mut merged = histogram::new();
    let mut counters = Counters::default();
    for line in [done_line(&a), done_line(&b), done_line(&c)] {
        let Msg::Done(d) = serde_json::from_str::<Msg>(&line).unwrap() else {
            panic!("not done")
        };
        counters.add(&d.counters);
        histogram::merge_encoded(&mut merged, &d.histograms[0].1).unwrap();
    }

    let mut single = histogram::new();
    for &v in a.iter().chain(&b).chain(&c) {
        histogram::record(&mut single, v);
    }
    assert_eq!(merged, single, "every bucket count matches");
    assert_eq!(histogram::summary(&merged), histogram::summary(&single));
    assert_eq!(merged.len(), 15_004);
    assert_eq!(counters.messages_in, 15_004);
    assert_eq!(merged.max(), single.max());
    assert_eq!(
        merged.value_at_quantile(0.999),
        single.value_at_quantile(0.999)
    );
}

#[test]
fn empty_histograms_merge_to_nothing() {
    let mut merged = histogram::new();
    histogram::merge_encoded(&mut merged, &histogram::encode(&histogram::new())).unwrap();
    assert!(merged.is_empty());
    assert_eq!(histogram::summary(&merged).count, 0);
}
