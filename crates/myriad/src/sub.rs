//! `myriad sub`: a subscriber that survives blips and dead nodes.
//!
//! It prints every delivery as a JSON line on stdout and remembers the last
//! position of each subject. It is given one node URL or several (nodes of
//! one cluster). When its connection drops (the node was killed, the
//! connection was reset, or the node closed it with a code that invites a
//! reconnect) it tries the next URL, round robin: at once, then after a
//! pause of [`FIRST_BACKOFF`] doubling to [`MAX_BACKOFF`], and at most
//! `attempts` tries per outage before it gives up with the last error. An
//! outage ends when a node answers a subscribe. On each new connection it
//! resubscribes every subject with `since` set to the last position it
//! received, so the node replays what was missed and the output goes on
//! with no gap and no duplicate; it says on stderr whether each recovery
//! was complete, and after one that was not it carries on live. A close
//! whose reason says "do not reconnect unchanged" (the registry in
//! `myriad_protocol::close`, or any code in the 45xx range) ends it instead.

use std::collections::HashMap;
use std::time::Duration;

use myriad_protocol::close::{CloseReason, Reconnect};
use myriad_protocol::message::{
    encode_subscribe, encode_subscribe_since, parse_server_message, ServerMessage,
};
use myriad_protocol::position::Position;

use crate::client::{Client, ClientError};

/// Pause before the second try of an outage; doubled per try after it.
/// The first try goes at once: with several URLs it is another node.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Longest pause between tries.
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Whether a close with `code` says not to reconnect unchanged.
fn gives_up(code: u16) -> bool {
    let advice = CloseReason::from_ws_code(code).map(CloseReason::reconnect);
    code >= 4500 || advice == Some(Reconnect::NotUnchanged)
}

/// What a `subscribed` message means to whoever reads `sub`'s stderr:
/// the answer to a subscribe (ours carry an `id`), or, without one, the
/// node telling a live subscription that its stream broke
/// (docs/protocol.md, "A stream that broke").
fn answer_notice(
    subject: &str,
    position: Position,
    id: Option<u64>,
    recovered: Option<bool>,
) -> String {
    let offset = position.offset;
    match (id, recovered) {
        (None, _) => format!(
            "the stream of {subject} broke (its Redis lost it, or the node was cut off from Redis for longer than history covers): what was published meanwhile is lost; going on live from offset {offset} of epoch {}",
            position.epoch
        ),
        (Some(_), Some(true)) => format!("resumed {subject}: nothing lost"),
        (Some(_), Some(false)) => format!(
            "resumed {subject}: could NOT recover what was missed (history too short or a new epoch); going on live from offset {offset}"
        ),
        (Some(_), None) => format!("subscribed to {subject} at offset {offset}"),
    }
}

/// The pause before try `tries` of an outage (1 is its first try).
fn backoff(tries: u32) -> Duration {
    match tries {
        0 | 1 => Duration::ZERO,
        n => FIRST_BACKOFF
            .saturating_mul(1 << (n - 2).min(16))
            .min(MAX_BACKOFF),
    }
}

pub struct Subscriber {
    urls: Vec<String>,
    subjects: Vec<String>,
    /// Exit after this many deliveries (replays included).
    count: Option<u64>,
    /// Most tries per outage.
    attempts: u32,
    received: u64,
    /// Last position received per subject: a delivery's, or the answer's
    /// to a subscribe that did not resume (fresh, or not recovered).
    positions: HashMap<String, Position>,
    /// Tries made in the current outage; 0 once a node has answered.
    tries: u32,
}

/// How one connection ended.
enum Ended {
    /// `count` deliveries printed.
    Done,
    /// Lost; reconnect.
    Lost(ClientError),
}

impl Subscriber {
    pub fn new(
        urls: Vec<String>,
        subjects: Vec<String>,
        count: Option<u64>,
        attempts: u32,
    ) -> Subscriber {
        Subscriber {
            urls,
            subjects,
            count,
            attempts,
            received: 0,
            positions: HashMap::new(),
            tries: 0,
        }
    }

    /// Runs until `count` deliveries, a close that says not to reconnect,
    /// or an outage that outlasts its tries.
    pub fn run(&mut self) -> Result<(), ClientError> {
        let mut next = 0usize;
        loop {
            std::thread::sleep(backoff(self.tries + 1));
            let url = self.urls[next % self.urls.len()].clone();
            next += 1;
            self.tries += 1;
            let ended = match Client::connect(&url) {
                Ok(mut client) => self.serve(&mut client),
                Err(e) => Ended::Lost(e),
            };
            let e = match ended {
                Ended::Done => return Ok(()),
                Ended::Lost(ClientError::Closed { code, reason }) if gives_up(code) => {
                    return Err(ClientError::Closed { code, reason });
                }
                Ended::Lost(e) => e,
            };
            if self.tries >= self.attempts {
                return Err(ClientError::GaveUp {
                    tries: self.tries,
                    last: Box::new(e),
                });
            }
            let then = &self.urls[next % self.urls.len()];
            let pause = backoff(self.tries + 1);
            eprintln!("{url}: {e}; trying {then} in {pause:?}");
        }
    }

    /// Subscribes (resuming where known) and prints deliveries until the
    /// connection ends.
    fn serve(&mut self, client: &mut Client) -> Ended {
        if let Err(e) = self.resubscribe(client) {
            return Ended::Lost(e);
        }
        loop {
            let text = match client.next_text() {
                Ok(text) => text,
                Err(e) => return Ended::Lost(e),
            };
            match parse_server_message(&text) {
                Ok(ServerMessage::Delivery {
                    subject, position, ..
                }) => {
                    if let Some(last) = self.positions.get(subject.as_ref()) {
                        if last.epoch == position.epoch && position.offset != last.offset + 1 {
                            eprintln!(
                                "warning: {subject} went from offset {} to {}",
                                last.offset, position.offset
                            );
                        }
                    }
                    self.positions.insert(subject.into_owned(), position);
                    println!("{text}");
                    self.received += 1;
                    if self.count.is_some_and(|n| self.received >= n) {
                        // The count is reached; a failed goodbye changes nothing.
                        let _ = client.close();
                        return Ended::Done;
                    }
                }
                Ok(ServerMessage::Subscribed {
                    id,
                    subject,
                    position,
                    recovered,
                }) => {
                    // A node is serving us: the outage, if any, is over.
                    self.tries = 0;
                    eprintln!("{}", answer_notice(&subject, position, id, recovered));
                    // After a recovery the replay follows and moves the
                    // position on; the answer's is where the replay ends,
                    // so taking it now would lose the replay to a cut in
                    // its middle.
                    if recovered != Some(true) {
                        self.positions.insert(subject.into_owned(), position);
                    }
                }
                Ok(ServerMessage::Error { code, message, .. }) => {
                    eprintln!("error {code}: {message}");
                }
                _ => {}
            }
        }
    }

    fn resubscribe(&self, client: &mut Client) -> Result<(), ClientError> {
        let fresh: Vec<&str> = self
            .subjects
            .iter()
            .filter(|s| !self.positions.contains_key(*s))
            .map(String::as_str)
            .collect();
        if !fresh.is_empty() {
            client.send_text(&encode_subscribe(&fresh, Some(1)))?;
        }
        for subject in &self.subjects {
            if let Some(&since) = self.positions.get(subject) {
                client.send_text(&encode_subscribe_since(subject, since, Some(1)))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unasked_answer_says_the_stream_broke_not_that_a_resume_failed() {
        let at = Position::new(myriad_protocol::position::Epoch(255), 7);
        let unasked = answer_notice("s", at, None, Some(false));
        assert!(unasked.starts_with("the stream of s broke"), "{unasked}");
        assert!(
            unasked.ends_with("offset 7 of epoch 00000000000000ff"),
            "{unasked}"
        );
        let failed = answer_notice("s", at, Some(1), Some(false));
        assert!(
            failed.starts_with("resumed s: could NOT recover"),
            "{failed}"
        );
        assert_eq!(
            answer_notice("s", at, Some(1), Some(true)),
            "resumed s: nothing lost"
        );
        assert_eq!(
            answer_notice("s", at, Some(1), None),
            "subscribed to s at offset 7"
        );
    }

    #[test]
    fn closes_that_say_do_not_retry_end_it() {
        assert!(
            gives_up(1002),
            "protocol error: the same frames would fail again"
        );
        assert!(gives_up(1009));
        assert!(gives_up(4500));
        assert!(!gives_up(1001), "going away: another node or a restart");
        assert!(!gives_up(4001), "slow consumer: back off and resume");
        assert!(!gives_up(4002));
    }

    #[test]
    fn the_first_try_goes_at_once_then_pauses_double_to_the_cap() {
        let ms = |tries| backoff(tries).as_millis();
        assert_eq!(
            [ms(1), ms(2), ms(3), ms(4), ms(5), ms(6)],
            [0, 100, 200, 400, 800, 1600]
        );
        assert_eq!(ms(7), 2000);
        assert_eq!(ms(1000), 2000, "no overflow however long the outage");
    }
}
