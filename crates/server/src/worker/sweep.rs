//! The worker's clock and its once-a-second sweep over the slab: request,
//! heartbeat, idle, partial-message, long-poll, token and close timeouts,
//! the budget for input held incomplete, and the gauges summed on the way.
//! No connection has a timer of its own; this pass is every timer.

use myriad_protocol::close::CloseReason;
use std::time::Instant;
use tracing::debug;

use super::Worker;
use crate::conn::{flags, Phase};
use crate::metrics::ErrorKind;
use crate::registry::ConnId;
use crate::tls::TlsFailure;
use crate::transport::Heartbeat;

/// Seconds since the worker started, as stored in connection timestamps.
/// Starts at 1 so that 0 can mean "never".
///
/// A reading is the whole second it falls in, so the clock may show up to
/// one second more between two readings than really passed: a timeout is
/// due only once *more* than its length shows ([`passed`]). That holds only
/// if a stamp is never older than the moment it stands for, so every stamp
/// that starts a timeout is a fresh [`Clock::tick`], taken at or after its
/// event (the read that brought a message, the move into a phase, the write
/// of a ping), never the reading from the start of the loop turn, which a
/// long turn leaves behind. A stale reading is safe only for deciding.
pub(super) struct Clock {
    pub start: Instant,
    pub now: u32,
}

impl Clock {
    pub(super) fn new() -> Clock {
        Clock {
            start: Instant::now(),
            now: 1,
        }
    }

    pub(super) fn tick(&mut self) -> u32 {
        self.now = 1 + self.start.elapsed().as_secs() as u32;
        self.now
    }
}

/// Whether a timeout of `seconds` has passed since `stamp`, on the clock
/// reading `now`: never early, and due within one second after (the sweep
/// looks at every whole second).
pub(super) fn passed(now: u32, stamp: u32, seconds: u32) -> bool {
    now.saturating_sub(stamp) > seconds
}

/// Seconds of silence after which connection `id` is pinged (or, on a
/// one-way stream, sent its next heartbeat): between half of `interval`
/// and all of it, fixed per connection. Connections set up
/// in the same second would otherwise be pinged in the same sweep, and
/// after each answer again together, for as long as they live: a node that
/// took 100,000 connections in a few seconds wrote 100,000 pings in one
/// second every interval, and delivery waited behind them (scale.py's
/// medium runs, docs/benchmarks.md). Spread this way the pings of a burst
/// of connections fall over half an interval instead.
fn ping_after(interval: u32, id: ConnId) -> u32 {
    let spread = interval / 2;
    // Fibonacci hashing: neighbouring slab ids land far apart.
    let mixed = (u64::from(id).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32;
    interval - mixed % (spread + 1)
}

/// What the once-a-second sweep found due on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    /// The request did not complete in time (HTTP 408, counted).
    RequestTimeout,
    /// A kept-alive connection sent no next request in time.
    EndKeptAlive,
    /// A closing connection did not finish in time.
    Drop,
    /// A long-poll reached `poll_timeout`: answer with what it has.
    Answer,
    Close(CloseReason),
}

impl Worker {
    /// The once-a-second pass over every connection: request, heartbeat,
    /// idle, partial-message, long-poll and close timeouts, and the gauge
    /// of input held incomplete.
    pub(super) fn sweep(&mut self, now: u32) {
        debug_assert_eq!(
            self.queued_frames,
            self.conns
                .iter()
                .map(|(_, c)| c.outbound.as_ref().map_or(0, |out| out.len()))
                .sum::<usize>(),
            "queued frames drifted from the queues"
        );
        let config = &self.shared.config;
        let (request_timeout, idle) = (config.handshake_timeout, config.idle_timeout);
        let (interval, answer) = (config.heartbeat_interval, config.heartbeat_timeout);
        let (one_way, poll_timeout) = (config.stream_heartbeat_interval, config.poll_timeout);
        let (close_timeout, partial_timeout) =
            (config.close_timeout, config.partial_message_timeout);
        // Tokens expire on the wall clock, the same one their `exp` is on.
        let unix_now = crate::auth::token::unix_now();
        let mut due = Vec::new();
        let mut to_ping = Vec::new();
        // Summed here rather than kept up to date on every read: the read
        // path stays as it was, and the gauge is at most a second old.
        let (mut partial_bytes, mut outbound_bytes) = (0, 0);
        self.sessions.refill();
        for (id, conn) in self.conns.iter_mut() {
            let session = self.sessions.session(id as ConnId);
            partial_bytes += conn.partial_bytes();
            outbound_bytes += conn.pending_bytes();
            let request_due = passed(now, conn.since, request_timeout);
            let verdict = match conn.phase {
                // Between long-polls, a quiet kept-alive connection just ends.
                Phase::Request
                    if request_due
                        && conn.inbound.is_none()
                        && conn.has_flag(flags::KEEP_ALIVE) =>
                {
                    Some(Due::EndKeptAlive)
                }
                Phase::Request if request_due => Some(Due::RequestTimeout),
                Phase::Closing | Phase::Draining if passed(now, conn.since, close_timeout) => {
                    Some(Due::Drop)
                }
                Phase::PubSub | Phase::Echo => {
                    let can = conn.transport.get().capabilities();
                    let unanswered = can.heartbeat == Heartbeat::Answered
                        && interval > 0
                        && conn.ping_sent != 0
                        && passed(now, conn.ping_sent, answer);
                    // A connection that cannot send commands will never
                    // subscribe to anything: without subscriptions it is
                    // idle at once.
                    let idle_due = idle > 0
                        && session.subscriptions.is_empty()
                        && !conn.has_flag(flags::HELD)
                        && (!can.bidirectional || passed(now, conn.last_message, idle));
                    let expired = session
                        .access()
                        .is_some_and(|access| access.expires <= unix_now);
                    // A message begun and not finished: its bytes come too
                    // slowly to be honest traffic, and what they hold is
                    // ours. Unless the node is what holds its reading back.
                    let stalled = partial_timeout > 0
                        && !conn.has_flag(flags::READ_DEFERRED)
                        && conn
                            .inbound
                            .as_ref()
                            .is_some_and(|i| passed(now, i.since, partial_timeout));
                    if expired {
                        Some(Due::Close(CloseReason::TokenExpired))
                    } else if unanswered {
                        Some(Due::Close(CloseReason::HeartbeatTimeout))
                    } else if stalled {
                        Some(Due::Close(CloseReason::PartialMessageTimeout))
                    } else if can.answers_once && passed(now, conn.since, poll_timeout) {
                        Some(Due::Answer)
                    } else if idle_due {
                        Some(Due::Close(CloseReason::IdleTimeout))
                    } else {
                        let ping = match can.heartbeat {
                            Heartbeat::Answered => {
                                interval > 0
                                    && conn.ping_sent == 0
                                    && passed(
                                        now,
                                        conn.last_heard,
                                        ping_after(interval, id as ConnId),
                                    )
                            }
                            Heartbeat::OneWay => {
                                one_way > 0
                                    && passed(
                                        now,
                                        conn.ping_sent,
                                        ping_after(one_way, id as ConnId),
                                    )
                            }
                            Heartbeat::None => false,
                        };
                        if ping {
                            to_ping.push(id as ConnId);
                        }
                        None
                    }
                }
                _ => None,
            };
            if let Some(verdict) = verdict {
                due.push((id as ConnId, verdict));
            }
        }
        for id in std::mem::take(&mut self.worn_out) {
            if self
                .conns
                .get(id as usize)
                .is_some_and(|c| c.phase.is_open())
            {
                self.shared
                    .metrics
                    .error(ErrorKind::Tls(TlsFailure::KeysUsedUp));
                due.push((id, Due::Close(CloseReason::GoingAway)));
            }
        }
        for &id in &to_ping {
            // Written at once rather than with the turn's flush, so that a
            // round of heartbeats to every connection never holds a queue
            // for each of them at the same time (an RSS step that stays).
            let heartbeat = self.conns[id as usize].transport.get().heartbeat();
            self.send(id, heartbeat);
            self.flush(id);
        }
        // Stamped once they are all written (see `Clock`).
        let sent = self.clock.tick();
        for id in to_ping {
            if let Some(conn) = self.conns.get_mut(id as usize) {
                conn.ping_sent = sent;
            }
        }
        for (id, verdict) in due {
            match verdict {
                Due::RequestTimeout => {
                    let kind = if self.conns[id as usize].link().is_handshaking() {
                        ErrorKind::Tls(TlsFailure::HandshakeTimeout)
                    } else {
                        ErrorKind::Handshake(408)
                    };
                    self.shared.metrics.error(kind);
                    self.decide_close(id, CloseReason::HandshakeTimeout);
                    self.drop_at_deadline(id);
                }
                Due::EndKeptAlive => {
                    self.decide_close(id, CloseReason::Normal);
                    self.drop_at_deadline(id);
                }
                Due::Drop => self.drop_at_deadline(id),
                Due::Answer => self.answer_now(id, true),
                Due::Close(
                    reason @ (CloseReason::HeartbeatTimeout | CloseReason::PartialMessageTimeout),
                ) => {
                    // The peer is not answering, or cannot before the frame
                    // it is trickling ends: send the close frame if the
                    // socket takes it, but do not wait for a reply.
                    self.close(id, reason);
                    self.flush(id);
                    self.drop_at_deadline(id);
                }
                Due::Close(reason) => self.close(id, reason),
            }
        }
        let held = self.enforce_partial_budget(partial_bytes);
        let gauge = |bytes: usize| i64::try_from(bytes).unwrap_or(i64::MAX);
        self.metrics.partial_input_bytes.set(gauge(held));
        // As of the sweep: queues drain between sweeps, and a queue is
        // bounded by max_outbound_bytes whatever this says.
        self.metrics.outbound_bytes.set(gauge(outbound_bytes));
    }

    /// Past `max_partial_input_bytes`, closes the open connections that have
    /// held their incomplete input longest (the largest first among equals)
    /// until the rest fit; returns what is held then. The oldest go first:
    /// an honest client's large message is whole within moments, a hostile
    /// one's is held as long as it can be. A second pass over the slab,
    /// made only when the sweep found the worker over its budget (`held`).
    fn enforce_partial_budget(&mut self, held: usize) -> usize {
        let budget = self.shared.config.max_partial_input_bytes;
        if held <= budget {
            return held;
        }
        // Counted again: the sweep's closes may have freed some.
        let mut total = 0;
        let mut holders = Vec::new();
        for (id, conn) in &self.conns {
            let bytes = conn.partial_bytes();
            total += bytes;
            if let Some(inbound) = conn.inbound.as_ref().filter(|_| conn.phase.is_open()) {
                holders.push((inbound.since, std::cmp::Reverse(bytes), id as ConnId));
            }
        }
        holders.sort_unstable();
        for (_, std::cmp::Reverse(bytes), id) in holders {
            if total <= budget {
                break;
            }
            debug!(
                worker = self.index,
                conn = id,
                bytes,
                "partial input over budget"
            );
            // As at a heartbeat timeout: the peer may be mid-frame and
            // unable to answer, and the point is to free its memory now.
            self.close(id, CloseReason::PartialInputBudget);
            self.flush(id);
            self.drop_at_deadline(id);
            total -= bytes;
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pings_of_neighbouring_connections_spread_over_half_an_interval() {
        let interval = 25;
        let waits: Vec<u32> = (0..1_000).map(|id| ping_after(interval, id)).collect();
        assert!(waits.iter().all(|w| (13..=25).contains(w)), "{waits:?}");
        // Every second of the spread is used, none by much more than its share.
        let mut per_second = [0usize; 26];
        for &w in &waits {
            per_second[w as usize] += 1;
        }
        for (second, &n) in per_second.iter().enumerate().skip(13) {
            assert!((40..=110).contains(&n), "second {second}: {n}");
        }
        assert_eq!(ping_after(1, 7), 1, "too short to spread");
        assert_eq!(ping_after(0, 7), 0);
    }
}
