//! Subject registry benchmarks, named by scenario: one subject with many
//! subscribers (broadcast), many subjects with one subscriber each (the
//! MigratoryData shape), and churn (connections coming and going).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use myriad_server::registry::Registry;

fn one_subject_many_subscribers(c: &mut Criterion) {
    let mut registry = Registry::new();
    let subject: Arc<str> = Arc::from("broadcast");
    for id in 0..10_000 {
        registry.subscribe(&subject, id);
    }
    c.bench_function("registry/one_subject_10k_subscribers/iterate", |b| {
        b.iter(|| {
            let mut sum = 0u64;
            for &id in registry.subscribers(black_box("broadcast")) {
                sum += u64::from(id);
            }
            sum
        })
    });
}

fn many_subjects_one_each(c: &mut Criterion) {
    let names: Vec<Arc<str>> = (0..100_000)
        .map(|i| Arc::from(format!("/p/s{i}")))
        .collect();
    c.bench_function("registry/many_subjects_one_each/subscribe_100k", |b| {
        b.iter_batched(
            Registry::new,
            |mut registry| {
                for (id, name) in names.iter().enumerate() {
                    registry.subscribe(name, id as u32);
                }
                registry
            },
            BatchSize::LargeInput,
        )
    });
    let mut registry = Registry::new();
    for (id, name) in names.iter().enumerate() {
        registry.subscribe(name, id as u32);
    }
    c.bench_function("registry/many_subjects_one_each/lookup", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 7919) % names.len();
            registry.subscribers(&names[i]).len()
        })
    });
}

fn churn(c: &mut Criterion) {
    let subject: Arc<str> = Arc::from("busy");
    let mut registry = Registry::new();
    for id in 0..1_000 {
        registry.subscribe(&subject, id);
    }
    c.bench_function("registry/churn/subscribe_unsubscribe_in_1k", |b| {
        let mut id = 1_000u32;
        b.iter(|| {
            registry.subscribe(&subject, id);
            registry.unsubscribe("busy", id - 1_000);
            id += 1;
        })
    });
}

criterion_group!(
    benches,
    one_subject_many_subscribers,
    many_subjects_one_each,
    churn
);
criterion_main!(benches);
