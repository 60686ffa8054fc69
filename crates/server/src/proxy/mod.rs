//! Synchronous proxies (issue 29, item 3): before a connection's
//! `connect`, `subscribe` or `publish`, the node asks the backend over HTTP
//! and obeys its verdict.
//!
//! This module owns the proxies' settings, the request body, the reading
//! of the answer (`answer.rs`, pure) and the one thread that makes the
//! calls: a tokio current-thread runtime, each call a task of its own (so a
//! slow backend holds only its own calls), each through the crate's one
//! backend client (`crate::backend`, on a connection kept alive in a pool
//! per URL) within `proxy_timeout`, signed like
//! the hooks when `hook_secret` is set. A verdict goes back to the worker
//! that asked through its mailbox (`hub::Event::Proxied`), the way engine
//! answers do: a worker never waits on a call. What the worker does
//! meanwhile (the command parked, stale verdicts dropped, the fail mode)
//! is `sessions/proxied.rs`'s.
//!
//! Calls in flight node-wide are bounded by `proxy_max_in_flight`: a call
//! past it is not made, and its command is refused with `proxy_busy`.

pub mod answer;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::backend::{self, Pool, Target};
use crate::hooks::sign::headers;
use crate::hub::{Event, Hub, Wakeups};
use crate::messages::proxy::{Proxied, ProxyKind, ProxyTicket, Verdict};
use crate::namespace::{Namespaces, ProxyPolicy};

/// What a call that got no verdict (a timeout, an error, a malformed
/// answer) lets its command do.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// The command goes on as if no proxy were set: subscribe and publish
    /// are allowed (the node's own checks already passed); connect checks
    /// its token with the node's own keys.
    Open,
    /// The command is refused with `proxy_unavailable`.
    Closed,
}

/// The proxies' settings, checked.
#[derive(Clone, Debug)]
pub struct ProxySettings {
    /// Per [`ProxyKind`] (connect, subscribe, publish), where its calls go.
    pub targets: [Option<Target>; 3],
    pub timeout: Duration,
    pub fail: FailMode,
    pub max_in_flight: usize,
    /// `proxy_max_answer_bytes`: a longer answer body is a failure.
    pub max_answer_bytes: usize,
    /// `hook_secret`, which signs every call when set.
    pub secret: Option<Vec<u8>>,
}

/// One call: what it is about, whom the verdict goes to, the body.
struct Call {
    kind: ProxyKind,
    ticket: ProxyTicket,
    body: Bytes,
}

/// The node's handle on the proxies' thread.
pub struct Proxy {
    calls: mpsc::UnboundedSender<Call>,
    /// Calls asked and not yet given a verdict; what `proxy_max_in_flight`
    /// bounds (so the channel, too, is bounded).
    in_flight: Arc<AtomicUsize>,
    max_in_flight: usize,
    asks: [bool; 3],
    /// Which subjects' subscribes and publishes are asked about.
    policies: Namespaces<ProxyPolicy>,
    fail: FailMode,
}

/// The call was not made: `proxy_max_in_flight` calls are out already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy;

fn index(kind: ProxyKind) -> usize {
    match kind {
        ProxyKind::Connect => 0,
        ProxyKind::Subscribe => 1,
        ProxyKind::Publish => 2,
    }
}

impl Proxy {
    /// Starts the proxies' thread; its verdicts go into `hub`'s mailboxes.
    pub fn start(
        settings: ProxySettings,
        policies: Namespaces<ProxyPolicy>,
        hub: Arc<Hub>,
    ) -> std::io::Result<Proxy> {
        let (calls, inbox) = mpsc::unbounded_channel();
        let in_flight = Arc::new(AtomicUsize::new(0));
        let asks = [0, 1, 2].map(|i| settings.targets[i].is_some());
        let fail = settings.fail;
        let max_in_flight = settings.max_in_flight;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let counter = Arc::clone(&in_flight);
        std::thread::Builder::new()
            .name("myriad-proxy".into())
            .spawn(move || runtime.block_on(run(Arc::new(settings), hub, inbox, counter)))?;
        Ok(Proxy {
            calls,
            in_flight,
            max_in_flight,
            asks,
            policies,
            fail,
        })
    }

    /// Whether a `connect` is asked about.
    pub fn asks_connect(&self) -> bool {
        self.asks[index(ProxyKind::Connect)]
    }

    /// Whether a subscribe to or a publish on `subject` is asked about: its
    /// URL is set and the subject's namespace does not switch it off.
    pub fn asks_about(&self, kind: ProxyKind, subject: &str) -> bool {
        if !self.asks[index(kind)] {
            return false;
        }
        let policy = self.policies.policy_for(subject);
        match kind {
            ProxyKind::Connect => true,
            ProxyKind::Subscribe => policy.subscribe,
            ProxyKind::Publish => policy.publish,
        }
    }

    pub fn fail(&self) -> FailMode {
        self.fail
    }

    /// Calls made and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Makes a `kind` call with `body`, its verdict to go to `ticket`'s
    /// worker, unless `proxy_max_in_flight` calls are out; never waits.
    pub fn ask(&self, kind: ProxyKind, ticket: ProxyTicket, body: Bytes) -> Result<(), Busy> {
        let taken = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_in_flight).then_some(n + 1)
            });
        if taken.is_err() {
            return Err(Busy);
        }
        if self.calls.send(Call { kind, ticket, body }).is_err() {
            // The thread is gone (it only ends with this handle); the
            // call is not made.
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(Busy);
        }
        Ok(())
    }
}

/// The thread's loop: each call a task, until the node drops its [`Proxy`].
async fn run(
    settings: Arc<ProxySettings>,
    hub: Arc<Hub>,
    mut inbox: mpsc::UnboundedReceiver<Call>,
    in_flight: Arc<AtomicUsize>,
) {
    // One pool of kept-alive connections per kind's target.
    let pools: Arc<[Pool; 3]> = Arc::default();
    while let Some(call) = inbox.recv().await {
        let settings = Arc::clone(&settings);
        let pools = Arc::clone(&pools);
        let hub = Arc::clone(&hub);
        let in_flight = Arc::clone(&in_flight);
        tokio::spawn(async move {
            let started = Instant::now();
            let pool = &pools[index(call.kind)];
            let verdict = verdict(&settings, pool, call.kind, call.body).await;
            if let Verdict::Failed(why) = &verdict {
                tracing::warn!(kind = call.kind.name(), %why, "proxy call failed");
            }
            let proxied = Proxied {
                ticket: call.ticket,
                kind: call.kind,
                verdict,
                latency: started.elapsed(),
            };
            // Given back before the verdict is queued, so whoever sees the
            // verdict's effect sees the call no longer out.
            in_flight.fetch_sub(1, Ordering::AcqRel);
            let mut wakeups = Wakeups::default();
            hub.send(
                call.ticket.worker,
                Event::Proxied(Box::new(proxied)),
                &mut wakeups,
            );
            hub.wake(wakeups);
        });
    }
}

/// Makes one call and reads its answer.
async fn verdict(settings: &ProxySettings, pool: &Pool, kind: ProxyKind, body: Bytes) -> Verdict {
    let Some(target) = &settings.targets[index(kind)] else {
        return Verdict::Failed("no URL for this kind".into());
    };
    let signed = settings
        .secret
        .as_deref()
        .map(|secret| headers(secret, &body));
    let signed = signed.as_ref().map_or(&[][..], |h| &h[..]);
    let (timeout, most) = (settings.timeout, settings.max_answer_bytes);
    match backend::post(target, Some(pool), signed, body, timeout, most).await {
        Ok(answer) if (200..300).contains(&answer.status) => answer::read(kind, &answer.body),
        Ok(answer) => Verdict::Failed(format!("status {}", answer.status)),
        Err(backend::PostError::TimedOut(_)) => Verdict::Timeout,
        Err(error) => Verdict::Failed(error.to_string()),
    }
}

/// The body of a call: `kind`, the connection's `user` (null when it acts
/// as nobody), and what the command carries: a subject, a publish's
/// `data` (raw JSON, as the client sent it), a connect's `token`.
pub fn request_body(
    kind: ProxyKind,
    user: Option<&str>,
    subject: Option<&str>,
    data: Option<&str>,
    token: Option<&str>,
) -> Bytes {
    let text = |s: &str| serde_json::to_string(s).expect("a string serializes");
    let mut out = format!(r#"{{"kind":"{}","user":"#, kind.name());
    out.push_str(&user.map_or("null".to_owned(), text));
    if let Some(subject) = subject {
        out.push_str(r#","subject":"#);
        out.push_str(&text(subject));
    }
    if let Some(data) = data {
        out.push_str(r#","data":"#);
        out.push_str(data);
    }
    if let Some(token) = token {
        out.push_str(r#","token":"#);
        out.push_str(&text(token));
    }
    out.push('}');
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_bodies_are_json() {
        let body = request_body(
            ProxyKind::Publish,
            Some("42"),
            Some("chat.\"1\""),
            Some(r#"{"a":[1]}"#),
            None,
        );
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"kind":"publish","user":"42","subject":"chat.\"1\"","data":{"a":[1]}})
        );
        let body = request_body(ProxyKind::Connect, None, None, None, Some("t"));
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"kind":"connect","user":null,"token":"t"})
        );
    }
}
