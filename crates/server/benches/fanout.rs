//! The encode-once fan-out path without sockets: a publish through the hub
//! (sequence, one frame encoding, mailbox hand-off) and a worker queueing the
//! shared frame for every local subscriber, as `Worker::take_deliveries` does.
//! What remains per recipient is a reference-count increment and a push.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use myriad_server::hub::{encode_delivery_frame, Hub, Wakeups};
use myriad_server::outbound::Outbound;
use myriad_server::registry::Registry;

const SUBSCRIBERS: u32 = 10_000;

fn payload() -> String {
    format!("\"{}\"", "x".repeat(510))
}

fn encode(c: &mut Criterion) {
    let data = payload();
    c.bench_function("fanout/encode_delivery_frame_512B", |b| {
        b.iter(|| encode_delivery_frame(black_box("/p/s12345"), black_box(42), &data))
    });
}

fn publish_to_10k(c: &mut Criterion) {
    let poll = mio::Poll::new().unwrap();
    let waker = mio::Waker::new(poll.registry(), mio::Token(0)).unwrap();
    let (hub, mut receivers) = Hub::new(vec![waker], usize::MAX);
    let rx = receivers.pop().unwrap();
    let subject: Arc<str> = Arc::from("broadcast");
    let mut registry = Registry::new();
    for id in 0..SUBSCRIBERS {
        registry.subscribe(&subject, id);
        hub.subscribe(&subject, 0, id == 0);
    }
    let mut queues: Vec<Outbound> = (0..SUBSCRIBERS).map(|_| Outbound::new()).collect();
    let data = payload();

    let mut group = c.benchmark_group("fanout");
    group.throughput(Throughput::Elements(u64::from(SUBSCRIBERS)));
    group.bench_function("publish_and_queue_512B_to_10k_subscribers", |b| {
        b.iter(|| {
            let mut wakeups = Wakeups::default();
            hub.publish("broadcast", &data, &mut wakeups);
            hub.wake(wakeups);
            let delivery = rx.try_recv().unwrap();
            hub.mailbox(0).taken(1);
            for &id in registry.subscribers(&delivery.subject) {
                queues[id as usize].push(delivery.frame.clone());
            }
            for q in &mut queues {
                q.discard_unstarted();
            }
        })
    });
    group.finish();
}

criterion_group!(benches, encode, publish_to_10k);
criterion_main!(benches);
