//! [`ChangeStream`]: one subscription to a Redis store's change announcements
//! (the contract's clause 6), for a node to follow every other node's
//! writes in the store's order.
//!
//! It owns the subscribing connection and nothing else: what a node does
//! with what it hears, and how it catches up after a break, belong to the
//! node. A subscription in Redis loses whatever is published while it is
//! not in place (a Redis restart, a cut connection, a client Redis dropped
//! for an overfull output buffer), so [`ChangeStream::listen`] says when a
//! subscription is in place, and ends with an error when it breaks: a
//! change stream must take every change published before its `Subscribed` as
//! unheard.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::{RedisError, TlsCertificates};

use super::{client, Reach, RedisTimeouts, CHANGES};
use crate::announce::{Announcement, ParseError};
use crate::store::StoreError;

/// How often a change stream with nothing to hear checks `stop`, and pings
/// Redis to find out whether the subscription is still there.
const IDLE: Duration = Duration::from_millis(500);

/// The name the subscribing connection gives itself in Redis.
pub const CLIENT_NAME: &str = "myriad-graph-changes";

/// What a change stream hears, in order.
#[derive(Debug)]
pub enum Heard {
    /// The subscription is in place: every later change is heard.
    Subscribed,
    Change(Announcement),
    /// A message that does not read as an announcement: a change was
    /// published that cannot be told.
    Garbled(ParseError),
}

/// A store's announcements, heard over a connection of their own.
pub struct ChangeStream {
    reach: Reach,
    channel: String,
    timeouts: RedisTimeouts,
}

impl ChangeStream {
    /// The announcements of the store under `prefix` in the Redis at
    /// `urls` (one URL, and `tls`, as for [`super::RedisStore::open_with`]);
    /// connects only when it listens.
    pub fn new(
        urls: &[String],
        prefix: &str,
        timeouts: RedisTimeouts,
        tls: Option<TlsCertificates>,
    ) -> Result<ChangeStream, StoreError> {
        let reach = Reach::Client(client(urls, prefix, timeouts, tls)?);
        Ok(ChangeStream::at(reach, prefix, timeouts))
    }

    /// [`ChangeStream::new`] for a Redis reached as `reach`.
    pub fn at(reach: Reach, prefix: &str, timeouts: RedisTimeouts) -> ChangeStream {
        ChangeStream {
            reach,
            channel: format!("{prefix}{CHANGES}"),
            timeouts,
        }
    }

    /// Subscribes and tells `heard` of it, then of every announcement in
    /// order, until `stop` is set (then `Ok`) or the subscription fails:
    /// Redis could not be reached, or the connection broke or stopped
    /// answering (then the error; listen again, and take what was
    /// published meanwhile as unheard).
    pub fn listen(
        &self,
        stop: &AtomicBool,
        mut heard: impl FnMut(Heard),
    ) -> Result<(), StoreError> {
        let unreachable = |e: RedisError| StoreError::Unreachable(e.to_string());
        let mut con = self.reach.connect(self.timeouts).map_err(unreachable)?;
        let no_answer = |e: RedisError| StoreError::NoAnswer(e.to_string());
        // Named, so an operator (or a test) can tell it in CLIENT LIST.
        redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg(CLIENT_NAME)
            .query::<()>(&mut con)
            .map_err(no_answer)?;
        let mut subscription = con.as_pubsub();
        subscription.subscribe(&self.channel).map_err(no_answer)?;
        // Set once, and again only after a ping: not once per message.
        subscription
            .set_read_timeout(Some(IDLE))
            .map_err(no_answer)?;
        heard(Heard::Subscribed);
        while !stop.load(Ordering::Acquire) {
            match subscription.get_message() {
                Ok(message) => {
                    let text = String::from_utf8_lossy(message.get_payload_bytes());
                    heard(match Announcement::parse(&text) {
                        Ok(change) => Heard::Change(change),
                        Err(e) => Heard::Garbled(e),
                    });
                }
                Err(e) if e.is_timeout() => {
                    // Quiet: make sure Redis still holds the subscription
                    // (a stopped Redis answers nothing; a restarted one
                    // has forgotten it, and a ping shows the connection
                    // broken).
                    subscription
                        .set_read_timeout(Some(self.timeouts.response))
                        .map_err(no_answer)?;
                    subscription.ping::<redis::Value>().map_err(no_answer)?;
                    subscription
                        .set_read_timeout(Some(IDLE))
                        .map_err(no_answer)?;
                }
                Err(e) => return Err(no_answer(e)),
            }
        }
        Ok(())
    }
}
