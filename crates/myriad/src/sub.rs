//! `myriad sub`: a subscriber that survives blips.
//!
//! It prints every delivery as a JSON line on stdout and remembers the last
//! position of each subject. When the connection drops it reconnects with
//! exponential back-off (to the next URL, when several are given) and
//! resubscribes each subject with `since` set to that position, so the
//! node replays what was missed; it says on stderr whether each recovery
//! was complete. A close whose reason says "do not reconnect unchanged"
//! (the registry in `myriad_protocol::close`, or any code in the 45xx
//! range) ends it instead.

use std::collections::HashMap;
use std::time::Duration;

use myriad_protocol::close::{CloseReason, Reconnect};
use myriad_protocol::message::{
    encode_subscribe, encode_subscribe_since, parse_server_message, ServerMessage,
};
use myriad_protocol::position::Position;

use crate::client::{Client, ClientError};

/// First pause before reconnecting; doubled per failed attempt.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Longest pause between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Whether a close with `code` says not to reconnect unchanged.
fn gives_up(code: u16) -> bool {
    let advice = CloseReason::from_ws_code(code).map(CloseReason::reconnect);
    code >= 4500 || advice == Some(Reconnect::NotUnchanged)
}

pub struct Subscriber {
    urls: Vec<String>,
    subjects: Vec<String>,
    /// Exit after this many deliveries (replays included).
    count: Option<u64>,
    received: u64,
    /// Last position seen per subject (delivery or subscribe reply).
    positions: HashMap<String, Position>,
}

/// How one connection ended.
enum Ended {
    /// `count` deliveries printed.
    Done,
    /// Lost; reconnect.
    Lost(ClientError),
}

impl Subscriber {
    pub fn new(urls: Vec<String>, subjects: Vec<String>, count: Option<u64>) -> Subscriber {
        Subscriber {
            urls,
            subjects,
            count,
            received: 0,
            positions: HashMap::new(),
        }
    }

    /// Runs until `count` deliveries, or a close that says not to reconnect.
    pub fn run(&mut self) -> Result<(), ClientError> {
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 0usize;
        loop {
            let url = &self.urls[attempt % self.urls.len()];
            attempt += 1;
            let ended = match Client::connect(url) {
                Ok(mut client) => {
                    backoff = FIRST_BACKOFF;
                    self.serve(&mut client)
                }
                Err(e) => Ended::Lost(e),
            };
            match ended {
                Ended::Done => return Ok(()),
                Ended::Lost(ClientError::Closed { code, reason }) if gives_up(code) => {
                    return Err(ClientError::Closed { code, reason });
                }
                Ended::Lost(e) if self.positions.is_empty() && attempt >= self.urls.len() * 3 => {
                    // Never got going: a wrong URL, not a blip.
                    return Err(e);
                }
                Ended::Lost(e) => {
                    eprintln!("connection lost ({e}); reconnecting in {backoff:?}");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
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
                                "warning: {subject} jumped from offset {} to {}",
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
                    subject,
                    position,
                    recovered,
                    ..
                }) => {
                    match recovered {
                        Some(true) => eprintln!("resumed {subject}: nothing lost"),
                        Some(false) => eprintln!(
                            "resumed {subject}: could NOT recover what was missed (history too short or a new epoch); now at offset {}",
                            position.offset
                        ),
                        None => eprintln!("subscribed to {subject} at offset {}", position.offset),
                    }
                    // Replayed deliveries follow and advance it further.
                    self.positions.insert(subject.into_owned(), position);
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
    use super::gives_up;

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
}
