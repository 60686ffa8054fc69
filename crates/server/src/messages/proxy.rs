//! What the proxies' thread sends a worker: the backend's verdict on one
//! connection's connect, subscribe or publish (see `crate::proxy`).
//!
//! A leaf like the engine's answers: it names only the connection-id type.

use std::time::Duration;

use crate::registry::ConnId;

/// Which command a proxy call is about; the label of its metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProxyKind {
    Connect,
    Subscribe,
    Publish,
}

impl ProxyKind {
    pub const ALL: [ProxyKind; 3] = [ProxyKind::Connect, ProxyKind::Subscribe, ProxyKind::Publish];

    /// The request's `kind` field and the metrics' `kind` label.
    pub const fn name(self) -> &'static str {
        match self {
            ProxyKind::Connect => "connect",
            ProxyKind::Subscribe => "subscribe",
            ProxyKind::Publish => "publish",
        }
    }
}

/// Which parked command of which connection a call answers: slots are
/// reused, so the life tells a closed connection's late answer from its
/// successor's, and the number the command among its connection's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyTicket {
    pub worker: usize,
    pub conn: ConnId,
    pub life: u32,
    pub seq: u64,
}

/// What a `connect` answer lets the connection act as: checked only for
/// shape here; the user's id and the grants' patterns are checked against
/// their grammar by the sessions, which refuse the answer if they fail.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Admitted {
    pub user: String,
    pub subscribe: Vec<String>,
    pub publish: Vec<String>,
    /// Unix second the connection is closed at (4501), as a token's `exp`.
    pub expires: Option<u64>,
}

/// The backend's verdict, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Go on; a connect's answer says as whom.
    Allow(Option<Admitted>),
    /// Refused: the client gets the (documented) code the backend picked
    /// and its reason.
    Refuse { code: RefusalCode, reason: String },
    /// No answer within `proxy_timeout`.
    Timeout,
    /// No usable answer: unreachable, a non-2xx status, a body that is not
    /// the documented JSON (the text says which).
    Failed(String),
}

/// The codes a backend may refuse with; any other asks for
/// `proxy_refused`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalCode {
    ProxyRefused,
    Forbidden,
    RateLimited,
}

/// A verdict on its way to the worker that parked the command.
#[derive(Debug)]
pub struct Proxied {
    pub ticket: ProxyTicket,
    pub kind: ProxyKind,
    pub verdict: Verdict,
    /// From the call's start to its verdict, on the proxies' thread.
    pub latency: Duration,
}
