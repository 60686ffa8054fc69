//! Subject patterns as seed 001 writes them, and the agreement between
//! worker processes and the coordinator about who subscribes to what.

use myriad_bench::util::pattern::{publish_subject, AssignMode, Assignment, Pattern, PublishOrder};
use myriad_bench::util::plan::split;

#[test]
fn seed_001_patterns() {
    let p: Pattern = "/p/s{1..1200000}/-".parse().unwrap();
    assert_eq!(p.len(), 1_200_000);
    assert_eq!(p.subject(0), "/p/s1/-");
    assert_eq!(p.subject(1_199_999), "/p/s1200000/-");
    assert_eq!(p.to_string(), "/p/s{1..1200000}/-");
    // Every subject is valid for myriad.
    for i in [0, 17, 1_199_999] {
        myriad_protocol::subject::validate(
            &p.subject(i),
            myriad_protocol::subject::DEFAULT_MAX_SUBJECT_LEN,
        )
        .unwrap();
    }
}

#[test]
fn processes_agree_with_the_coordinator() {
    // Workers compute subjects for their own slice of connection indices;
    // together they must produce exactly the coordinator's per-subject counts.
    for mode in [AssignMode::OneToOne, AssignMode::Random] {
        let a = Assignment {
            pattern: "/p/s{1..300}".parse().unwrap(),
            per_conn: 3,
            mode,
            seed: 11,
        };
        let mut counts = vec![0u32; 300];
        let mut subjects = Vec::new();
        for range in split(1_000, 4) {
            for conn in range {
                a.subjects_for(conn, &mut subjects);
                for &s in &subjects {
                    counts[s as usize] += 1;
                }
            }
        }
        assert_eq!(counts, a.subscriber_counts(1_000), "{mode:?}");
    }
}

#[test]
fn one_to_one_matches_seed_001() {
    let a = Assignment {
        pattern: "/p/s{1..1000}".parse().unwrap(),
        per_conn: 1,
        mode: AssignMode::OneToOne,
        seed: 1,
    };
    let mut s = Vec::new();
    a.subjects_for(0, &mut s);
    assert_eq!(a.pattern.subject(s[0]), "/p/s1");
    a.subjects_for(999, &mut s);
    assert_eq!(a.pattern.subject(s[0]), "/p/s1000");
}

#[test]
fn random_publishing_covers_the_subjects() {
    let mut seen = [false; 100];
    for n in 0..10_000 {
        seen[publish_subject(PublishOrder::Random, 5, n, 100) as usize] = true;
    }
    assert!(seen.iter().all(|&s| s));
}
