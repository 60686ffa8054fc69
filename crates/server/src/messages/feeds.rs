//! What the graph keeper sends a connection's worker: a change to its feed
//! subscriptions, and the acknowledgement a follow waits for.
//!
//! A [`FeedChange`] rides in a worker's mailbox (`crate::hub::Event`), so
//! it sits below the hub that carries it and the keeper (`crate::feeds`)
//! that makes it. It must not name the hub, the engine or the feeds.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use myriad_graph::UserId;
use tokio::sync::oneshot;

use super::engine::ConnRequest;

/// What a [`FeedChange`] does to a connection's graph feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Apply {
    /// Subscribe to these feeds too.
    Add,
    /// Drop these feeds.
    Drop,
    /// Hold exactly these feeds and the user's own, dropping the other
    /// graph feeds: the keeper read the user's whole list, at connect, on
    /// a retry after the engine refused a feed, or because it may have
    /// missed changes (see the keeper's module docs). The own feed is made
    /// at open, not by the keeper; a retry is what makes it again when the
    /// engine refused it.
    Replace,
}

/// A change to one connection's feed subscriptions, for its worker.
#[derive(Debug)]
pub struct FeedChange {
    pub to: ConnRequest,
    pub how: Apply,
    /// The users whose feeds to add, drop, or hold.
    pub feeds: Vec<UserId>,
    /// Held until the worker has applied the change (or dropped it: the
    /// connection is gone), which is what a follow's acknowledgement waits
    /// for; one per batch the change settles.
    pub acks: Vec<Ack>,
}

/// One outstanding application of a follow or unfollow batch; the batch is
/// settled when every `Ack` made for it has been dropped.
#[derive(Debug)]
pub struct Ack(Arc<Settling>);

#[derive(Debug)]
struct Settling {
    left: AtomicUsize,
    done: Mutex<Option<oneshot::Sender<()>>>,
}

impl Drop for Ack {
    fn drop(&mut self) {
        if self.0.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Some(done) = self.0.done.lock().expect("ack lock poisoned").take() {
                // The waiter may have given up; then nobody needs to hear.
                let _ = done.send(());
            }
        }
    }
}

/// Makes acks for one batch; `settled` fires once the last is dropped
/// (at once when none was made).
pub(crate) fn settling() -> (AckMaker, oneshot::Receiver<()>) {
    let (tx, rx) = oneshot::channel();
    let state = Arc::new(Settling {
        // The maker holds one count until it is finished.
        left: AtomicUsize::new(1),
        done: Mutex::new(Some(tx)),
    });
    (AckMaker(Ack(state)), rx)
}

/// Hands out [`Ack`]s for one batch; dropping it says no more will come.
#[derive(Debug)]
pub(crate) struct AckMaker(Ack);

impl AckMaker {
    pub(crate) fn ack(&self) -> Ack {
        self.0 .0.left.fetch_add(1, Ordering::AcqRel);
        Ack(Arc::clone(&self.0 .0))
    }
}
