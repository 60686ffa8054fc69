//! The registry of close reasons: every reason myriad ends a client
//! connection, whatever the transport, and what each transport does with it.
//!
//! A reason maps to a WebSocket close code ([`CloseReason::ws_code`]), to
//! what an HTTP transport does ([`CloseReason::http`]: a status before the
//! response starts, or the end of a stream in progress), and to whether a
//! client should reconnect unchanged ([`CloseReason::reconnect`]). WebSocket
//! codes below 4000 are RFC 6455 §7.4.1 codes; myriad's own use the private
//! range (§7.4.2) and their hundreds digit repeats the reconnect advice:
//! `40xx` "reconnect with back-off", `45xx` "do not reconnect unchanged".
//! docs/protocol.md mirrors this table; the server's metrics and logs use
//! [`CloseReason::name`].

/// Why a connection ended. One variant per cause, so logs, metrics and the
/// close frame all name the same thing. A few causes end a connection before
/// or without a close frame; they report 1006, which RFC 6455 §7.4.1 reserves
/// for exactly that and which is never sent on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CloseReason {
    /// The peer asked to close, or the server finished an exchange normally.
    Normal,
    /// The server is shutting down (RFC 6455 1001).
    GoingAway,
    /// The peer broke RFC 6455 framing rules (1002).
    ProtocolError,
    /// A frame type this endpoint does not accept, e.g. binary on the JSON endpoint (1003).
    UnsupportedData,
    /// A text message or close reason was not valid UTF-8 (1007).
    InvalidUtf8,
    /// A message exceeded the configured maximum size (1009).
    MessageTooBig,
    /// The client did not read fast enough and its outbound queue passed the limit.
    SlowConsumer,
    /// The client did not answer the server's ping in time.
    HeartbeatTimeout,
    /// The client held a connection with no subscriptions and sent nothing for too long.
    IdleTimeout,
    /// The client began a message (a frame, or the first fragment of a
    /// fragmented one) and did not finish it in time: its bytes or
    /// fragments came too slowly, holding the server's memory meanwhile.
    PartialMessageTimeout,
    /// The worker's connections held more incomplete input than its
    /// budget, and this one had held its input the longest.
    PartialInputBudget,
    /// The connection dropped without a close frame (reset, EOF, or the
    /// close handshake timed out). Reported as 1006, never sent.
    Abnormal,
    /// The upgrade request did not complete within the handshake timeout.
    /// Reported as 1006, never sent: no WebSocket existed yet.
    HandshakeTimeout,
    /// The upgrade request was refused with an HTTP error status.
    /// Reported as 1006, never sent: no WebSocket existed yet.
    HandshakeRejected,
    /// The connection's token expired without a `refresh` (4501): the
    /// client needs a new token before it reconnects.
    TokenExpired,
    /// The client closed before it sent a whole request: a port or health
    /// check that connects and leaves, or a client that gave up mid-request.
    /// Reported as 1006, never sent: no WebSocket existed yet.
    NoRequest,
}

impl CloseReason {
    /// Every reason, for metrics registration and documentation tables.
    pub const ALL: [CloseReason; 16] = [
        CloseReason::Normal,
        CloseReason::GoingAway,
        CloseReason::ProtocolError,
        CloseReason::UnsupportedData,
        CloseReason::InvalidUtf8,
        CloseReason::MessageTooBig,
        CloseReason::SlowConsumer,
        CloseReason::HeartbeatTimeout,
        CloseReason::IdleTimeout,
        CloseReason::PartialMessageTimeout,
        CloseReason::PartialInputBudget,
        CloseReason::Abnormal,
        CloseReason::HandshakeTimeout,
        CloseReason::HandshakeRejected,
        CloseReason::TokenExpired,
        CloseReason::NoRequest,
    ];

    /// The WebSocket close code (1006 for endings without a close frame).
    pub const fn ws_code(self) -> u16 {
        match self {
            CloseReason::Normal => 1000,
            CloseReason::GoingAway => 1001,
            CloseReason::ProtocolError => 1002,
            CloseReason::UnsupportedData => 1003,
            CloseReason::InvalidUtf8 => 1007,
            CloseReason::MessageTooBig => 1009,
            CloseReason::SlowConsumer => 4001,
            CloseReason::HeartbeatTimeout => 4002,
            CloseReason::IdleTimeout => 4003,
            CloseReason::PartialMessageTimeout => 4004,
            CloseReason::PartialInputBudget => 4005,
            CloseReason::TokenExpired => 4501,
            CloseReason::Abnormal
            | CloseReason::HandshakeTimeout
            | CloseReason::HandshakeRejected
            | CloseReason::NoRequest => 1006,
        }
    }

    /// A stable snake_case name, used as the metric label and in logs.
    pub const fn name(self) -> &'static str {
        match self {
            CloseReason::Normal => "normal",
            CloseReason::GoingAway => "going_away",
            CloseReason::ProtocolError => "protocol_error",
            CloseReason::UnsupportedData => "unsupported_data",
            CloseReason::InvalidUtf8 => "invalid_utf8",
            CloseReason::MessageTooBig => "message_too_big",
            CloseReason::SlowConsumer => "slow_consumer",
            CloseReason::HeartbeatTimeout => "heartbeat_timeout",
            CloseReason::IdleTimeout => "idle_timeout",
            CloseReason::PartialMessageTimeout => "partial_message_timeout",
            CloseReason::PartialInputBudget => "partial_input_budget",
            CloseReason::Abnormal => "abnormal",
            CloseReason::HandshakeTimeout => "handshake_timeout",
            CloseReason::HandshakeRejected => "handshake_rejected",
            CloseReason::TokenExpired => "token_expired",
            CloseReason::NoRequest => "no_request",
        }
    }

    /// The human-readable reason sent in the close frame (kept short: a close
    /// payload is at most 125 bytes).
    pub const fn text(self) -> &'static str {
        match self {
            CloseReason::Normal => "",
            CloseReason::GoingAway => "server shutting down",
            CloseReason::ProtocolError => "protocol error",
            CloseReason::UnsupportedData => "unsupported data",
            CloseReason::InvalidUtf8 => "invalid utf-8",
            CloseReason::MessageTooBig => "message too big",
            CloseReason::SlowConsumer => "slow consumer: outbound queue over limit",
            CloseReason::HeartbeatTimeout => "heartbeat timeout",
            CloseReason::IdleTimeout => "idle timeout",
            CloseReason::PartialMessageTimeout => "partial message timeout",
            CloseReason::PartialInputBudget => "partial input over budget",
            CloseReason::Abnormal => "abnormal closure",
            CloseReason::HandshakeTimeout => "handshake timeout",
            CloseReason::HandshakeRejected => "handshake rejected",
            CloseReason::TokenExpired => "token expired",
            CloseReason::NoRequest => "no request",
        }
    }

    /// The reason a received WebSocket close code stands for, when it is one
    /// of ours (1006 is never sent, so it names none).
    pub fn from_ws_code(code: u16) -> Option<CloseReason> {
        (code != 1006)
            .then(|| CloseReason::ALL.into_iter().find(|r| r.ws_code() == code))
            .flatten()
    }

    /// What an HTTP transport (Server-Sent Events, streaming, long-poll)
    /// does for this reason.
    pub const fn http(self) -> HttpEnding {
        match self {
            CloseReason::ProtocolError | CloseReason::InvalidUtf8 => HttpEnding::Status(400),
            CloseReason::UnsupportedData => HttpEnding::Status(415),
            CloseReason::MessageTooBig => HttpEnding::Status(413),
            CloseReason::HandshakeTimeout => HttpEnding::Status(408),
            // The generic answer; a refused request carries its own status
            // (404, 426, 431, 503…) from the handshake code.
            CloseReason::HandshakeRejected => HttpEnding::Status(400),
            CloseReason::Normal
            | CloseReason::GoingAway
            | CloseReason::SlowConsumer
            | CloseReason::IdleTimeout
            | CloseReason::TokenExpired => HttpEnding::EndStream,
            // Partial messages are WebSocket's alone: after its request an
            // HTTP transport reads nothing it would keep.
            CloseReason::HeartbeatTimeout
            | CloseReason::PartialMessageTimeout
            | CloseReason::PartialInputBudget
            | CloseReason::Abnormal
            | CloseReason::NoRequest => HttpEnding::Drop,
        }
    }

    /// Whether a client may reconnect as it was. A client that broke the
    /// protocol or sent what the server refuses would only be refused again.
    pub const fn reconnect(self) -> Reconnect {
        match self {
            CloseReason::ProtocolError
            | CloseReason::UnsupportedData
            | CloseReason::InvalidUtf8
            | CloseReason::MessageTooBig
            | CloseReason::HandshakeRejected
            | CloseReason::TokenExpired => Reconnect::NotUnchanged,
            CloseReason::Normal
            | CloseReason::GoingAway
            | CloseReason::SlowConsumer
            | CloseReason::HeartbeatTimeout
            | CloseReason::IdleTimeout
            | CloseReason::PartialMessageTimeout
            | CloseReason::PartialInputBudget
            | CloseReason::Abnormal
            | CloseReason::HandshakeTimeout
            | CloseReason::NoRequest => Reconnect::WithBackoff,
        }
    }
}

/// What an HTTP transport does when the server ends a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpEnding {
    /// The response has not started: answer with this status.
    Status(u16),
    /// A stream is in progress: send a last event naming the reason, then
    /// end the response cleanly.
    EndStream,
    /// Nothing useful can be sent (the peer is gone or not reading): close.
    Drop,
}

/// A client's advice after a close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reconnect {
    /// Reconnect, with back-off.
    WithBackoff,
    /// Reconnecting without changing something would be refused again.
    NotUnchanged,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ALL` is kept by hand; metrics, `/stats` and the close-code
    /// table read it. A variant added to the enum
    /// breaks the build of `every_variant!` below until it is named here, and
    /// then this fails until `ALL` names it too.
    #[test]
    fn all_names_every_close_reason() {
        let every = crate::every_variant!(
            CloseReason:
            Normal,
            GoingAway,
            ProtocolError,
            UnsupportedData,
            InvalidUtf8,
            MessageTooBig,
            SlowConsumer,
            HeartbeatTimeout,
            IdleTimeout,
            PartialMessageTimeout,
            PartialInputBudget,
            Abnormal,
            HandshakeTimeout,
            HandshakeRejected,
            TokenExpired,
            NoRequest
        );
        assert_eq!(every, CloseReason::ALL);
    }

    #[test]
    fn codes_are_unique_and_reasons_fit_a_control_frame() {
        let mut codes: Vec<u16> = CloseReason::ALL
            .iter()
            .map(|r| r.ws_code())
            .filter(|&c| c != 1006)
            .collect();
        let sent = codes.len();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), sent);
        for r in CloseReason::ALL {
            assert!(r.text().len() + 2 <= 125, "{r:?}");
        }
    }

    #[test]
    fn a_sent_code_names_its_reason() {
        for r in CloseReason::ALL {
            let back = CloseReason::from_ws_code(r.ws_code());
            if r.ws_code() == 1006 {
                assert_eq!(back, None);
            } else {
                assert_eq!(back, Some(r));
            }
        }
        assert_eq!(CloseReason::from_ws_code(4999), None);
    }

    #[test]
    fn private_codes_carry_the_reconnect_advice_in_their_range() {
        for r in CloseReason::ALL {
            let code = r.ws_code();
            if code >= 4000 {
                let by_range = if code < 4500 {
                    Reconnect::WithBackoff
                } else {
                    Reconnect::NotUnchanged
                };
                assert_eq!(r.reconnect(), by_range, "{r:?}");
            } else {
                assert!(code < 1004 || (1006..=1011).contains(&code), "{r:?}");
            }
        }
    }

    #[test]
    fn http_statuses_are_client_errors_and_refusals_say_do_not_retry() {
        for r in CloseReason::ALL {
            match r.http() {
                HttpEnding::Status(status) => {
                    assert!((400..500).contains(&status), "{r:?}");
                    assert_eq!(
                        r.reconnect(),
                        match r {
                            CloseReason::HandshakeTimeout => Reconnect::WithBackoff,
                            _ => Reconnect::NotUnchanged,
                        },
                        "{r:?}"
                    );
                }
                HttpEnding::EndStream | HttpEnding::Drop => {}
            }
        }
        assert_eq!(CloseReason::SlowConsumer.http(), HttpEnding::EndStream);
    }
}
