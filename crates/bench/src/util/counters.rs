//! The counts every worker keeps and the coordinator adds up.
//!
//! One flat struct for every workload: a field a workload never touches
//! stays zero, which is cheaper to ship and simpler to sum than one struct
//! per group. Counters are cumulative; rates come from differences.

use serde::{Deserialize, Serialize};

/// Why a connection failed, as reported in the errors-by-kind table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// ECONNREFUSED: nothing listening, or the accept queue overflowed
    /// with tcp_abort_on_overflow.
    Refused,
    /// ECONNRESET / EPIPE: the server aborted the connection.
    Reset,
    /// Connect plus handshake did not finish within --connect-timeout.
    Timeout,
    /// EADDRNOTAVAIL / EADDRINUSE: out of source ports for the pair.
    NoPorts,
    /// EMFILE / ENFILE, or the worker's planned connection cap.
    NoFiles,
    /// The server answered the upgrade with something other than a valid
    /// 101, or an HTTP transport's request with other than its 200; or TLS
    /// failed (a `wss://` target).
    Handshake,
    /// A frame broke RFC 6455, or a message was too big.
    Protocol,
    /// The server closed (FIN or close frame) while we had not asked to.
    ServerClosed,
    /// Anything else.
    Other,
}

impl Failure {
    /// Every kind, in report order.
    pub const ALL: [Failure; 9] = [
        Failure::Refused,
        Failure::Reset,
        Failure::Timeout,
        Failure::NoPorts,
        Failure::NoFiles,
        Failure::Handshake,
        Failure::Protocol,
        Failure::ServerClosed,
        Failure::Other,
    ];

    /// Stable name, used as the JSON key.
    pub fn name(self) -> &'static str {
        match self {
            Failure::Refused => "refused",
            Failure::Reset => "reset",
            Failure::Timeout => "timeout",
            Failure::NoPorts => "no_ports",
            Failure::NoFiles => "no_files",
            Failure::Handshake => "handshake",
            Failure::Protocol => "protocol",
            Failure::ServerClosed => "server_closed",
            Failure::Other => "other",
        }
    }

    /// Classifies an I/O error from connect, read or write.
    pub fn of_io(e: &std::io::Error) -> Failure {
        match e.raw_os_error() {
            Some(libc::ECONNREFUSED) => Failure::Refused,
            Some(libc::ECONNRESET | libc::EPIPE | libc::ECONNABORTED) => Failure::Reset,
            Some(libc::ETIMEDOUT) => Failure::Timeout,
            Some(libc::EADDRNOTAVAIL | libc::EADDRINUSE) => Failure::NoPorts,
            Some(libc::EMFILE | libc::ENFILE) => Failure::NoFiles,
            _ => Failure::Other,
        }
    }

    fn slot(self) -> usize {
        Failure::ALL
            .iter()
            .position(|&f| f == self)
            .unwrap_or(Failure::ALL.len() - 1)
    }
}

/// Cumulative counts of one worker (or, summed, of the whole run).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// connect() calls made.
    pub attempts: u64,
    /// TCP connections established.
    pub connected: u64,
    /// Handshakes completed: WebSocket upgrades (101 validated), or HTTP
    /// transport requests answered 200.
    pub upgraded: u64,
    /// Subscriptions confirmed (or sent, when the profile has no ack).
    pub subscribed: u64,
    /// Connections that ended with a clean close handshake.
    pub closed: u64,
    /// Failures by kind, indexed like [`Failure::ALL`].
    pub failures: [u64; 9],
    /// Deliveries received that carried a timestamp.
    pub messages_in: u64,
    /// Keep-alives the server sent: WebSocket pings, Server-Sent Events
    /// comments, empty lines of an HTTP stream.
    pub heartbeats: u64,
    /// Other data frames received (acks, unknown replies).
    pub other_in: u64,
    /// Error replies received (the profile's error marker).
    pub server_errors: u64,
    /// Payload bytes received in data frames (inflated, when compressed).
    pub bytes_in: u64,
    /// Bytes read from sockets (after TLS, before inflating): what the
    /// wire carried to the bench.
    pub wire_bytes_in: u64,
    /// WebSocket upgrades whose server agreed to permessage-deflate.
    pub deflate_agreed: u64,
    /// Compressed messages inflated; the other compressed deliveries were
    /// byte-identical copies of one of these (`util::inflate_cache`).
    pub inflated: u64,
    /// Publish messages whose last byte the socket took (WebSocket frames
    /// or HTTP requests).
    pub published: u64,
    /// Publish events fired but never wholly written: their connection was
    /// lost, or the server had not read them when the worker ended.
    pub publish_dropped: u64,
    /// HTTP publish responses with a 2xx status.
    pub http_ok: u64,
    /// HTTP publish responses with any other status.
    pub http_errors: u64,
    /// Deliveries the server reported in HTTP publish responses.
    pub http_delivered: u64,
    /// Bytes written to sockets.
    pub bytes_out: u64,
    /// Churn: reconnects made (a subscriber's connection closed on purpose,
    /// and a new one opened to resubscribe with `since`).
    pub reconnects: u64,
    /// Churn: reconnects that fell due while their subscriber was still
    /// away or waiting for its answers, and were not made.
    pub reconnects_skipped: u64,
    /// Churn: reconnects whose new connection had every subject answered.
    pub reconnected: u64,
    /// Churn: resubscribes answered `recovered: true` (over long-poll: not
    /// reported unrecovered by the reconnect's first answer).
    pub recovered: u64,
    /// Churn: resubscribes answered `recovered: false` (or without it).
    pub unrecovered: u64,
    /// Churn: deliveries that were the replay of a recovery.
    pub replayed: u64,
    /// Churn: deliveries at or before an offset already received.
    pub duplicates: u64,
    /// Churn: deliveries past the next offset.
    pub gaps: u64,
    /// Churn: offsets skipped, by gaps and by failed recoveries.
    pub missed: u64,
    /// Churn: subscriber connections lost mid-run without the bench
    /// closing them (their node died), each subscriber then setting up
    /// again on the next node and resubscribing with `since`.
    pub failovers: u64,
    /// Churn: of those, subscribers back with every subject answered.
    pub failed_over: u64,
    /// Churn: positions a subscriber cannot continue from, where what it
    /// missed cannot be counted: another epoch, or a delivery of a subject
    /// it holds no position in.
    pub broken: u64,
    /// Social: sends answered `ok` with a position.
    pub sends_acked: u64,
    /// Social: sends answered with an error.
    pub sends_refused: u64,
    /// Social: the connections the node said each answered send reached,
    /// summed.
    pub reached: u64,
    /// Social: `subscribed` notices after set-up (a follow made during the
    /// run subscribes every connection of the follower).
    pub follow_notices: u64,
    /// Social: feeds a connection was subscribed to at connect that its
    /// user does not follow in the graph file (the node holds another graph).
    pub feeds_mismatched: u64,
}

impl Counters {
    /// Counts one failure.
    pub fn fail(&mut self, f: Failure) {
        self.failures[f.slot()] += 1;
    }

    /// Failures of one kind.
    pub fn failures_of(&self, f: Failure) -> u64 {
        self.failures[f.slot()]
    }

    /// All failures.
    pub fn failed(&self) -> u64 {
        self.failures.iter().sum()
    }

    /// Adds `o` into `self`.
    pub fn add(&mut self, o: &Counters) {
        self.attempts += o.attempts;
        self.connected += o.connected;
        self.upgraded += o.upgraded;
        self.subscribed += o.subscribed;
        self.closed += o.closed;
        for (a, b) in self.failures.iter_mut().zip(o.failures) {
            *a += b;
        }
        self.messages_in += o.messages_in;
        self.heartbeats += o.heartbeats;
        self.other_in += o.other_in;
        self.server_errors += o.server_errors;
        self.bytes_in += o.bytes_in;
        self.wire_bytes_in += o.wire_bytes_in;
        self.deflate_agreed += o.deflate_agreed;
        self.inflated += o.inflated;
        self.published += o.published;
        self.publish_dropped += o.publish_dropped;
        self.http_ok += o.http_ok;
        self.http_errors += o.http_errors;
        self.http_delivered += o.http_delivered;
        self.bytes_out += o.bytes_out;
        self.reconnects += o.reconnects;
        self.reconnects_skipped += o.reconnects_skipped;
        self.reconnected += o.reconnected;
        self.recovered += o.recovered;
        self.unrecovered += o.unrecovered;
        self.replayed += o.replayed;
        self.duplicates += o.duplicates;
        self.gaps += o.gaps;
        self.missed += o.missed;
        self.failovers += o.failovers;
        self.failed_over += o.failed_over;
        self.broken += o.broken;
        self.sends_acked += o.sends_acked;
        self.sends_refused += o.sends_refused;
        self.reached += o.reached;
        self.follow_notices += o.follow_notices;
        self.feeds_mismatched += o.feeds_mismatched;
    }

    /// Failures as (name, count) pairs, in report order.
    pub fn failure_table(&self) -> Vec<(&'static str, u64)> {
        Failure::ALL
            .iter()
            .map(|&f| (f.name(), self.failures_of(f)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_and_sums() {
        let refused = std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
        assert_eq!(Failure::of_io(&refused), Failure::Refused);
        let mut a = Counters::default();
        a.fail(Failure::Refused);
        a.messages_in = 3;
        let mut b = a.clone();
        b.fail(Failure::Timeout);
        b.add(&a);
        assert_eq!(b.failures_of(Failure::Refused), 2);
        assert_eq!(b.failed(), 3);
        assert_eq!(b.messages_in, 6);
    }

    /// `ALL` is kept by hand, and a kind missing from it would be counted
    /// as `other` (see `slot`). A kind added to the enum breaks the build
    /// of `every_variant!` below until it is named here, and this then
    /// fails until `ALL` names it too.
    #[test]
    fn all_names_every_failure() {
        let every = myriad_protocol::every_variant!(
            Failure: Refused,
            Reset,
            Timeout,
            NoPorts,
            NoFiles,
            Handshake,
            Protocol,
            ServerClosed,
            Other,
        );
        assert_eq!(every, Failure::ALL);
    }
}
