//! The encode-once fan-out path without sockets: a publish through the
//! memory engine (position, history, one encoding, mailbox hand-off) and a
//! worker queueing the shared frame for every local subscriber, as
//! `Sessions::deliver` does through the worker's `Wire` (`worker/wire.rs`),
//! modelled here by the same calls on plain vectors (the core itself needs a
//! node's shared state). What remains per recipient is a
//! reference-count increment and a push. Measured with history off and on,
//! and per transport (what a recipient on each costs).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use myriad_protocol::position::{Epoch, Position};
use myriad_server::engine::{Attach, ConnRequest, Engine, MemoryEngine, Reply};
use myriad_server::history::HistoryPolicy;
use myriad_server::hub::{Event, Hub, Wakeups};
use myriad_server::namespace::{history_policy, Namespaces};
use myriad_server::outbound::Outbound;
use myriad_server::publication::Publication;
use myriad_server::registry::Registry;
use myriad_server::session::Session;
use myriad_server::transport::{self, TransportKind};

const SUBSCRIBERS: u32 = 10_000;

fn payload() -> String {
    format!("\"{}\"", "x".repeat(510))
}

fn encode(c: &mut Criterion) {
    let data = payload();
    let subject: Arc<str> = Arc::from("/p/s12345");
    c.bench_function("fanout/encode_publication_512B", |b| {
        b.iter(|| {
            Publication::new(
                Arc::clone(black_box(&subject)),
                Position::new(Epoch(7), black_box(42)),
                &data,
                0,
            )
        })
    });
}

fn publish_to_10k(c: &mut Criterion) {
    let mut group = c.benchmark_group("fanout");
    group.throughput(Throughput::Elements(u64::from(SUBSCRIBERS)));
    for (name, size) in [("history_off", 0), ("history_on", 100)] {
        let poll = mio::Poll::new().unwrap();
        let waker = mio::Waker::new(poll.registry(), mio::Token(0)).unwrap();
        let (hub, mut receivers) = Hub::new(vec![waker], usize::MAX);
        let rx = receivers.pop().unwrap();
        let policy = HistoryPolicy {
            size,
            ttl: Duration::ZERO,
        };
        let engine = MemoryEngine::new(
            Arc::clone(&hub),
            Namespaces::new(policy, &[], history_policy),
            64 << 20,
        );
        let subject: Arc<str> = Arc::from("broadcast");
        let mut registry = Registry::new();
        let mut wakeups = Wakeups::default();
        for id in 0..SUBSCRIBERS {
            let to = ConnRequest {
                worker: 0,
                conn: id,
                life: 0,
                request: None,
            };
            let attach = Attach {
                subject: Arc::clone(&subject),
                since: None,
                max_replay_bytes: 0,
                to,
                token: u64::from(id),
                can_wait: false,
                join: None,
            };
            engine.attach(attach, &mut wakeups);
            registry.subscribe(&subject, id);
        }
        hub.wake(wakeups);
        let attached = rx.try_iter().count();
        hub.mailbox(0).taken(attached);
        let mut queues: Vec<Outbound> = (0..SUBSCRIBERS).map(|_| Outbound::new()).collect();
        let data = payload();
        let publisher = ConnRequest {
            worker: 0,
            conn: u32::MAX,
            life: 0,
            request: None,
        };
        group.bench_function(
            format!("publish_and_queue_512B_to_10k_subscribers/{name}"),
            |b| {
                b.iter(|| {
                    let mut wakeups = Wakeups::default();
                    engine.publish("broadcast", &data, Reply::Conn(publisher), &mut wakeups);
                    hub.wake(wakeups);
                    let Ok(Event::Publication(publication)) = rx.try_recv() else {
                        panic!("a publication");
                    };
                    hub.mailbox(0).taken(1);
                    let frame = publication.ws_frame();
                    for &id in registry.subscribers(&publication.subject) {
                        queues[id as usize].push(frame.clone());
                    }
                    for q in &mut queues {
                        q.discard_unstarted();
                    }
                })
            },
        );
    }
    group.finish();
}

/// What each transport costs per recipient once the publication is made:
/// its form built once, then for every subscriber what `Sessions::deliver`
/// does (`transport::addressed`, then the wire's push). Sessions are laid
/// out as a worker's would be: each with its own subject and, for the
/// transports that keep one, its own cursor allocation.
fn queue_per_transport(c: &mut Criterion) {
    let mut group = c.benchmark_group("fanout");
    group.throughput(Throughput::Elements(u64::from(SUBSCRIBERS)));
    let subject: Arc<str> = Arc::from("broadcast");
    let publication = Publication::new(
        Arc::clone(&subject),
        Position::new(Epoch(7), 42),
        &payload(),
        0,
    );
    for kind in TransportKind::ALL {
        let mut sessions: Vec<Session> = (0..SUBSCRIBERS)
            .map(|_| {
                let mut session = Session::default();
                if kind.get().capabilities().keeps_cursor {
                    session.keep_cursor(&[None]);
                }
                session.subscriptions.push(Arc::clone(&subject));
                session
            })
            .collect();
        let config = myriad_server::Config::default();
        let mut queues: Vec<Outbound> = (0..SUBSCRIBERS).map(|_| Outbound::new()).collect();
        group.bench_function(
            format!("queue_512B_to_10k_subscribers/{}", kind.name()),
            |b| {
                b.iter(|| {
                    let form = kind.get().publication(black_box(&publication), &config);
                    for (session, queue) in sessions.iter_mut().zip(&mut queues) {
                        // One subject: nothing owed (its events carry it).
                        let (bytes, more, _owed) =
                            transport::addressed(kind, &form, &publication, session);
                        queue.push(bytes);
                        if let Some(more) = more {
                            queue.push(more);
                        }
                    }
                    for q in &mut queues {
                        q.discard_unstarted();
                    }
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, encode, publish_to_10k, queue_per_transport);
criterion_main!(benches);
