//! The instance task against a real `redis-server`: how it batches what
//! queued up into round trips, keeps the queue's bounds, and answers each
//! request with its own reply.
//!
//! Each test queues its requests *before* the task first runs, so what
//! one batch takes is fixed by the test, not by timing: the task finds
//! them all waiting when it wakes.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;
use myriad_testkit::RedisServer;
use tokio::sync::oneshot;

use super::{Instance, InstanceQueue, MAX_BATCH};
use crate::engine::redis::context::Context;
use crate::engine::redis::ops::{Op, PublishOp, ReadOp};
use crate::engine::redis::target::{self, Target};
use crate::engine::redis::RedisSettings;
use crate::engine::{
    Attach, ConnRequest, EngineError, HistoryPage, HistoryQuery, Published, Reply,
};
use crate::history::HistoryPolicy;
use crate::hub::{Event, Wakeups};
use crate::namespace::Namespaces;

/// Far beyond any round trip on loopback: only a lost answer fails a wait.
const ANSWERED_WITHIN: Duration = Duration::from_secs(30);

type Answer<T> = oneshot::Receiver<Result<T, EngineError>>;

/// One instance task over its own `redis-server`, with one worker's
/// mailbox.
struct Rig {
    ctx: Arc<Context>,
    queue: InstanceQueue,
    instance: Option<Instance>,
    mailbox: Receiver<Event>,
    runtime: tokio::runtime::Runtime,
    local: tokio::task::LocalSet,
    server: RedisServer,
    _polls: Vec<mio::Poll>,
}

impl Rig {
    /// `bounds` sets the queue's settings over the defaults of a test.
    fn new(bounds: impl FnOnce(RedisSettings) -> RedisSettings) -> Rig {
        let server = RedisServer::start();
        let settings = bounds(RedisSettings {
            tls: None,
            urls: vec![server.url()],
            sentinel: None,
            prefix: "t".to_owned(),
            timeout: Duration::from_secs(10),
            queue: 100_000,
            queue_bytes: 64 << 20,
            queue_high_water: 0,
            linger: Duration::ZERO,
            feed_backlog: 0,
            presence_lease: Duration::from_secs(15),
        });
        let (hub, mut mailboxes, polls) = crate::hub::test_hub(1, usize::MAX);
        let policy = HistoryPolicy {
            size: 10_000,
            ttl: Duration::ZERO,
        };
        let namespaces = Namespaces::new(policy, &[], crate::namespace::history_policy);
        let target = Target::Fixed {
            client: target::client(&server.url(), None).expect("a client"),
            shown: server.url(),
        };
        let ctx = Arc::new(Context::new(hub, namespaces, 64 << 20, settings, 1));
        let (mut instance, queue) = Instance::new(0, target, Arc::clone(&ctx));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(instance.connect()).expect("connects");
        Rig {
            ctx,
            queue,
            instance: Some(instance),
            mailbox: mailboxes.remove(0),
            runtime,
            local: tokio::task::LocalSet::new(),
            server,
            _polls: polls,
        }
    }

    fn send(&self, op: Op) {
        let mut wakeups = Wakeups::default();
        self.queue.send(op, &self.ctx, &mut wakeups);
        self.ctx.router.hub().wake(wakeups);
    }

    fn publish(&self, subject: &str, data: &str) -> Answer<Published> {
        let (tx, rx) = oneshot::channel();
        self.send(Op::Publish(PublishOp {
            subject: Arc::from(subject),
            data: Box::from(data),
            reply: Reply::Task(tx),
        }));
        rx
    }

    fn history(&self, subject: &str) -> Answer<HistoryPage> {
        let (tx, rx) = oneshot::channel();
        let query = HistoryQuery {
            subject: Arc::from(subject),
            since: None,
            limit: 100,
        };
        self.send(Op::Read(ReadOp::History {
            query,
            reply: Reply::Task(tx),
        }));
        rx
    }

    /// A subscriber on worker 0 joins `subject` and its attach is queued.
    fn attach(&self, subject: &str, token: u64) {
        let subject: Arc<str> = Arc::from(subject);
        let life = self.ctx.router.join(&subject, 0);
        let attach = Attach {
            subject,
            since: None,
            max_replay_bytes: usize::MAX,
            to: ConnRequest {
                worker: 0,
                conn: token as u32,
                life: 0,
                request: None,
            },
            token,
            can_wait: false,
            join: None,
        };
        self.send(Op::Read(ReadOp::Attach { attach, life }));
    }

    /// The subscriber of `subject` leaves, as the engine's detach does.
    fn leave(&self, subject: &str) {
        if self.ctx.router.leave(subject, 0, true) {
            self.queue.leave(subject);
        }
    }

    /// Runs the task (started on first use) until `until` is done.
    fn run<T>(&mut self, until: impl Future<Output = T>) -> T {
        if let Some(instance) = self.instance.take() {
            self.local.spawn_local(instance.run());
        }
        let until = async { tokio::time::timeout(ANSWERED_WITHIN, until).await };
        self.runtime
            .block_on(self.local.run_until(until))
            .expect("answered in time")
    }

    /// Runs the task until every one of `answers` has come.
    fn answers<T>(&mut self, answers: Vec<Answer<T>>) -> Vec<Result<T, EngineError>> {
        self.run(async {
            let mut out = Vec::with_capacity(answers.len());
            for answer in answers {
                out.push(answer.await.expect("answered"));
            }
            out
        })
    }

    /// Runs the task until the worker's mailbox holds `n` events, and
    /// takes them.
    fn events(&mut self, n: usize) -> Vec<Event> {
        let mailbox = self.mailbox.clone();
        self.run(async move {
            while mailbox.len() < n {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        self.mailbox.try_iter().collect()
    }

    fn round_trips(&self) -> u64 {
        self.ctx.round_trips.load(Ordering::Relaxed)
    }

    /// How many connections listen to `subject`'s channel on the server.
    fn listeners(&self, subject: &str) -> i64 {
        let mut conn = redis::Client::open(self.server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let (_, n): (String, i64) = redis::cmd("PUBSUB")
            .arg("SHARDNUMSUB")
            .arg(self.ctx.channel(subject))
            .query(&mut conn)
            .unwrap();
        n
    }
}

fn offsets(answers: Vec<Result<Published, EngineError>>) -> Vec<u64> {
    answers
        .into_iter()
        .map(|a| a.expect("published").position.expect("kept").offset)
        .collect()
}

#[test]
fn what_queued_meanwhile_goes_in_one_pipeline_in_queue_order() {
    let mut rig = Rig::new(|s| s);
    let mut a: Vec<Answer<Published>> = (1..=3).map(|i| rig.publish("a", &i.to_string())).collect();
    rig.attach("a", 1);
    let read = rig.history("a");
    let b = rig.publish("b", "1");
    a.push(rig.publish("a", "4"));
    assert_eq!(offsets(rig.answers(a)), [1, 2, 3, 4]);
    assert_eq!(offsets(rig.answers(vec![b])), [1]);
    let [Ok(page)] = &rig.answers(vec![read])[..] else {
        panic!("history read failed");
    };
    let read: Vec<u64> = page
        .publications
        .iter()
        .map(|p| p.position.offset)
        .collect();
    assert_eq!(read, [1, 2, 3], "read where it was queued");
    assert_eq!(rig.round_trips(), 1, "one pipeline of scripts");
    // The attach, between the third publish and the fourth, is taken at 3,
    // and the fourth comes live behind it on the channel it subscribed.
    let events = rig.events(2);
    let [Event::Attached(attached), Event::Publication(fourth)] = &events[..] else {
        panic!("attach answer then the fourth publication: {events:?}")
    };
    let attachment = attached.outcome.as_ref().expect("attached");
    assert_eq!((attached.token, attachment.position.offset), (1, 3));
    assert_eq!(fourth.position.offset, 4);
}

#[test]
fn a_batch_takes_at_most_max_batch_requests() {
    let mut rig = Rig::new(|s| s);
    let n = 2 * MAX_BATCH + 1;
    let answers: Vec<Answer<Published>> = (0..n).map(|_| rig.publish("a", "1")).collect();
    let expected: Vec<u64> = (1..=n as u64).collect();
    assert_eq!(offsets(rig.answers(answers)), expected);
    assert_eq!(rig.round_trips(), 3, "{MAX_BATCH}, {MAX_BATCH}, then 1");
}

#[test]
fn a_full_queue_refuses_at_once_and_an_answered_batch_makes_room_again() {
    // Room for two requests, and for 20 bytes of them.
    let mut rig = Rig::new(|s| RedisSettings {
        queue: 2,
        queue_bytes: 20,
        queue_high_water: 1,
        ..s
    });
    let first = rig.publish("a", "123456789");
    assert!(!rig.queue.congested(), "one waits: at the high-water mark");
    let heavy = rig.publish("a", "1234567890");
    let second = rig.publish("a", "12345678");
    let third = rig.publish("a", "1");
    assert!(rig.queue.congested(), "two wait: past the high-water mark");
    for (what, mut refused) in [("over the bytes", heavy), ("over the count", third)] {
        assert_eq!(
            refused.try_recv().expect("refused before the task runs"),
            Err(EngineError::RedisBusy),
            "{what}"
        );
    }
    assert_eq!(offsets(rig.answers(vec![first, second])), [1, 2]);
    assert_eq!(rig.queue.queued_bytes.load(Ordering::Acquire), 0);
    assert!(!rig.queue.congested());
    let again: Vec<Answer<Published>> = ["12345678", "12345678"]
        .iter()
        .map(|d| rig.publish("a", d))
        .collect();
    assert_eq!(offsets(rig.answers(again)), [3, 4], "both fit again");
}

#[test]
fn an_attach_whose_subscriber_left_is_dropped_and_subscribes_nothing() {
    let mut rig = Rig::new(|s| s);
    rig.attach("gone", 1);
    rig.leave("gone");
    rig.attach("kept", 2);
    let events = rig.events(1);
    let [Event::Attached(attached)] = &events[..] else {
        panic!("one answer: {events:?}")
    };
    assert_eq!(attached.token, 2);
    assert_eq!((rig.listeners("gone"), rig.listeners("kept")), (0, 1));
    // Nothing else comes for the one that left.
    let read = rig.history("gone");
    rig.answers(vec![read]);
    assert!(rig.mailbox.is_empty());
}

#[test]
fn a_subject_left_is_unsubscribed_before_the_next_scripts_run() {
    let mut rig = Rig::new(|s| s);
    rig.attach("a", 1);
    rig.events(1);
    assert_eq!(rig.listeners("a"), 1);
    rig.leave("a");
    // Queued behind the leave: when it runs, nobody here listens.
    let after = rig.publish("a", "1");
    assert_eq!(offsets(rig.answers(vec![after])), [1]);
    assert_eq!(rig.listeners("a"), 0);
    let events = rig.events(0);
    assert!(events.is_empty(), "no delivery after the leave: {events:?}");
}
