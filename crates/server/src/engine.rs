//! The engine seam: where a publish goes to be ordered and fanned out across
//! nodes.
//!
//! Workers and the admin API publish through an [`Engine`] and never touch the
//! transport between nodes. The contract every engine must keep (and the
//! conformance tests in this module check for the memory engine; a Redis
//! engine will run the same suite):
//! 1. `publish` returns only after the message has its sequence number and
//!    has been handed to every worker on this node holding a subscriber (a
//!    cluster engine: to every node); the workers to wake are added to the
//!    caller's [`Wakeups`], which the caller hands to `Hub::wake` once its
//!    batch of publishes is done.
//! 2. Sequence numbers of one subject increase by one per publish, in the
//!    order subscribers receive them.
//! 3. A subject with no subscribers anywhere drops the message and returns
//!    `seq: None`; its counter is not kept.
//! 4. `publish` never blocks on a slow subscriber.

use std::sync::Arc;

use thiserror::Error;

use crate::hub::{Hub, Published, Wakeups};

/// Why an engine could not take a publish.
#[derive(Debug, Error)]
pub enum EngineError {
    /// The engine is shutting down and takes no more messages.
    #[error("engine is shutting down")]
    ShuttingDown,
}

/// Orders publishes and fans them out to every node with subscribers.
pub trait Engine: Send + Sync + 'static {
    /// Publishes raw JSON `data` to `subject`; see the module contract.
    fn publish(
        &self,
        subject: &str,
        data: &str,
        wakeups: &mut Wakeups,
    ) -> Result<Published, EngineError>;

    /// True while the node cannot keep up with deliveries: callers that can
    /// wait (the HTTP API, connections sending publishes) should.
    fn congested(&self) -> bool;
}

/// The single-node engine: the local hub is the whole world.
pub struct MemoryEngine {
    hub: Arc<Hub>,
}

impl MemoryEngine {
    pub fn new(hub: Arc<Hub>) -> Self {
        MemoryEngine { hub }
    }
}

impl Engine for MemoryEngine {
    fn publish(
        &self,
        subject: &str,
        data: &str,
        wakeups: &mut Wakeups,
    ) -> Result<Published, EngineError> {
        Ok(self.hub.publish(subject, data, wakeups))
    }

    fn congested(&self) -> bool {
        self.hub.congested()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::Delivery;
    use crossbeam_channel::Receiver;
    use myriad_protocol::message::{parse_server_message, ServerMessage};

    /// One engine under test plus the worker queues behind it.
    struct Fixture {
        engine: Box<dyn Engine>,
        hub: Arc<Hub>,
        receivers: Vec<Receiver<Delivery>>,
        _polls: Vec<mio::Poll>,
    }

    fn memory(workers: usize) -> Fixture {
        let polls: Vec<mio::Poll> = (0..workers).map(|_| mio::Poll::new().unwrap()).collect();
        let wakers = polls
            .iter()
            .map(|p| mio::Waker::new(p.registry(), mio::Token(0)).unwrap())
            .collect();
        let (hub, receivers) = Hub::new(wakers, 65_536);
        Fixture {
            engine: Box::new(MemoryEngine::new(Arc::clone(&hub))),
            hub,
            receivers,
            _polls: polls,
        }
    }

    fn seqs(rx: &Receiver<Delivery>) -> Vec<u64> {
        rx.try_iter()
            .map(|d| {
                let text = std::str::from_utf8(&d.frame[2..]).unwrap();
                match parse_server_message(text).unwrap() {
                    ServerMessage::Delivery { seq, .. } => seq,
                    other => panic!("{other:?}"),
                }
            })
            .collect()
    }

    /// The contract, run against one engine.
    fn contract(f: Fixture) {
        let s: Arc<str> = Arc::from("contract/subject");
        f.hub.subscribe(&s, 0, true);
        f.hub.subscribe(&s, 1, true);
        let mut wakeups = Wakeups::default();
        for _ in 0..100 {
            f.engine.publish(&s, "{\"k\":1}", &mut wakeups).unwrap();
        }
        assert!(!wakeups.is_empty(), "clause 1: workers to wake are named");
        f.hub.wake(wakeups);
        let expected: Vec<u64> = (1..=100).collect();
        assert_eq!(seqs(&f.receivers[0]), expected, "clause 1 and 2, worker 0");
        assert_eq!(seqs(&f.receivers[1]), expected, "clause 1 and 2, worker 1");
        let mut wakeups = Wakeups::default();
        let none = f
            .engine
            .publish("contract/nobody", "1", &mut wakeups)
            .unwrap();
        assert_eq!(none.seq, None, "clause 3");
        assert!(wakeups.is_empty(), "nobody to wake");
        assert!(!f.engine.congested(), "nothing waits after draining");
    }

    #[test]
    fn memory_engine_keeps_the_contract() {
        contract(memory(2));
    }

    #[test]
    fn concurrent_publishers_keep_per_subject_order() {
        let f = memory(1);
        let s: Arc<str> = Arc::from("race");
        f.hub.subscribe(&s, 0, true);
        let engine: Arc<dyn Engine> = Arc::from(f.engine);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let engine = Arc::clone(&engine);
                let hub = Arc::clone(&f.hub);
                std::thread::spawn(move || {
                    let mut wakeups = Wakeups::default();
                    for _ in 0..500 {
                        engine.publish("race", "0", &mut wakeups).unwrap();
                    }
                    hub.wake(wakeups);
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(seqs(&f.receivers[0]), (1..=2000).collect::<Vec<u64>>());
    }
}
