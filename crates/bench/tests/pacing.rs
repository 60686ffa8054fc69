//! Open-loop pacing: the schedule math that decides when every event is
//! due, independent of when (or whether) earlier events were sent.

use myriad_bench::util::pacing::{Schedule, Share};

#[test]
fn shares_rebuild_the_global_schedule() {
    // Three processes firing their shares together fire exactly the global
    // schedule: every event once, at its global due time.
    let s = Schedule::ramp(3_000.0, 2.0, 3.0, 2.0);
    let total = s.total_events();
    let mut merged = Vec::new();
    for offset in 0..3 {
        let share = Share { offset, stride: 3 };
        let mut k = 0;
        while share.event(k) < total {
            merged.push((s.due_secs(share.event(k)).unwrap(), share.event(k)));
            k += 1;
        }
    }
    merged.sort_by(|a, b| a.partial_cmp(b).unwrap());
    assert_eq!(merged.len() as u64, total);
    for (i, &(_, n)) in merged.iter().enumerate() {
        assert_eq!(n, i as u64, "events in due order are 0, 1, 2, …");
    }
}

#[test]
fn achieved_rate_per_phase_matches_the_plan() {
    let s = Schedule::ramp(1_000.0, 4.0, 6.0, 4.0);
    let due: Vec<f64> = (0..s.total_events())
        .map(|n| s.due_secs(n).unwrap())
        .collect();
    let count = |from: f64, to: f64| due.iter().filter(|&&t| t >= from && t < to).count();
    // Ramps average half the peak; the sustain phase runs at the peak.
    assert_eq!(count(0.0, 4.0), 2_000);
    assert_eq!(count(4.0, 10.0), 6_000);
    assert_eq!(count(10.0, 14.0), 2_000);
    // Within the sustain phase, any second holds 1,000 events.
    assert_eq!(count(5.0, 6.0), 1_000);
    // The ramp rises linearly: the second half of ramp-up holds 3× the first.
    assert_eq!(count(2.0, 4.0), 3 * count(0.0, 2.0));
}

#[test]
fn a_late_sender_owes_every_event_due_so_far() {
    // The number of events due by time t is fixed by the schedule: a sender
    // that stalled for 0.5 s owes all of them at once (stamped with their
    // due times), not a smaller, silently reduced number.
    let s = Schedule::constant(10_000.0, 1.0);
    let owed_after_stall = (0..s.total_events())
        .take_while(|&n| s.due_secs(n).unwrap() <= 0.5)
        .count();
    assert_eq!(owed_after_stall, 5_001);
    assert!((s.due_secs(5_000).unwrap() - 0.5).abs() < 1e-12);
}

#[test]
fn zero_length_phases_are_skipped() {
    let s = Schedule::ramp(100.0, 0.0, 2.0, 0.0);
    assert_eq!(s.phases.len(), 1);
    assert_eq!(s.total_events(), 200);
    assert_eq!(s.due_secs(200), None);
}
