//! WebSocket (RFC 6455) as a transport: text frames out.
//!
//! A publication's buffer already holds its text frame (see
//! `publication.rs`), so sending it is a reference-count increment. With
//! permessage-deflate ([`WebSocketDeflate`]) it is the publication's one
//! compressed frame instead, made once per node; replies, pongs and closes
//! go uncompressed, which RFC 7692 §6 allows of any message. A client that
//! limited the server's window (`TransportKind::WebSocketInflateOnly`) is
//! sent everything uncompressed by plain [`WebSocket`]. Which of the three
//! an upgrade gets is [`upgrade`]'s choice, from its extension offers and
//! the `compression*` settings. The upgrade is answered by the worker's
//! `request` module and the read side (frames in, close handshake) lives in
//! its `read` module, which is where bytes from the socket are parsed.

use bytes::Bytes;
use myriad_protocol::close::CloseReason;
use myriad_protocol::ws::deflate::negotiate;
use myriad_protocol::ws::{encode_close, encode_frame, OpCode};

use super::{Capabilities, Heartbeat, Transport, TransportKind};
use crate::config::Config;
use crate::deflate;
use crate::publication::Publication;
use crate::session::Session;

/// The empty ping the heartbeat sends; one static frame for every connection.
static PING_FRAME: [u8; 2] = [0x89, 0x00];

pub struct WebSocket;

impl Transport for WebSocket {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            bidirectional: true,
            heartbeat: Heartbeat::Answered,
            keeps_cursor: false,
            answers_once: false,
        }
    }

    fn publication(&self, publication: &Publication, _config: &Config) -> Bytes {
        publication.ws_frame().clone()
    }

    fn reply(&self, json: &[u8], _session: &Session) -> Bytes {
        Bytes::from(encode_frame(OpCode::Text, json, None))
    }

    fn announces(&self, recovered: Option<bool>, feed: bool) -> bool {
        // Positions travel in every message; a recovery's outcome must be
        // told, and so must a feed (`@…`), which the server may have added
        // without being asked.
        recovered.is_some() || feed
    }

    fn heartbeat(&self) -> Bytes {
        Bytes::from_static(&PING_FRAME)
    }

    fn close(&self, reason: CloseReason) -> Option<Bytes> {
        // 1006 is never sent (RFC 6455 §7.4.1): those endings have no frame.
        (reason.ws_code() != 1006)
            .then(|| Bytes::from(encode_close(reason.ws_code(), reason.text(), None)))
    }
}

/// WebSocket with permessage-deflate negotiated: publications go in their
/// shared compressed frame, everything else as plain WebSocket sends it.
pub struct WebSocketDeflate;

impl Transport for WebSocketDeflate {
    fn capabilities(&self) -> Capabilities {
        WebSocket.capabilities()
    }

    fn publication(&self, publication: &Publication, config: &Config) -> Bytes {
        let level = config.compression_level;
        publication
            .deflated_frame(config.compression_threshold, |envelope| {
                deflate::text_frame(envelope, level)
            })
            .clone()
    }

    fn reply(&self, json: &[u8], session: &Session) -> Bytes {
        WebSocket.reply(json, session)
    }

    fn announces(&self, recovered: Option<bool>, feed: bool) -> bool {
        WebSocket.announces(recovered, feed)
    }

    fn heartbeat(&self) -> Bytes {
        WebSocket.heartbeat()
    }

    fn close(&self, reason: CloseReason) -> Option<Bytes> {
        WebSocket.close(reason)
    }
}

/// The transport of a WebSocket upgrade with these extension offers, and
/// the `Sec-WebSocket-Extensions` answer if one was accepted (RFC 7692
/// §5: an offer the server cannot take is declined, never refused).
pub fn upgrade<'a>(
    offers: impl IntoIterator<Item = &'a str>,
    config: &Config,
) -> (TransportKind, Option<String>) {
    if !config.compression {
        return (TransportKind::WebSocket, None);
    }
    let negotiation = negotiate(offers);
    deflate::count_negotiation(&negotiation);
    match negotiation.agreed {
        None => (TransportKind::WebSocket, None),
        Some(agreement) => {
            let kind = if agreement.server_compresses() {
                TransportKind::WebSocketDeflate
            } else {
                TransportKind::WebSocketInflateOnly
            };
            (kind, Some(agreement.response()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use myriad_protocol::position::{Epoch, Position};
    use std::sync::Arc;

    #[test]
    fn upgrades_get_the_transport_their_offer_allows() {
        let config = Config::default();
        let (kind, answer) = upgrade(["permessage-deflate"], &config);
        assert_eq!(kind, TransportKind::WebSocketDeflate);
        assert!(answer.unwrap().contains("client_no_context_takeover"));
        let (kind, answer) = upgrade(["permessage-deflate; server_max_window_bits=9"], &config);
        assert_eq!(kind, TransportKind::WebSocketInflateOnly);
        assert!(answer.unwrap().ends_with("server_max_window_bits=9"));
        assert_eq!(
            upgrade(["permessage-deflate; x=1"], &config),
            (TransportKind::WebSocket, None)
        );
        let off = Config {
            compression: false,
            ..Config::default()
        };
        assert_eq!(
            upgrade(["permessage-deflate"], &off),
            (TransportKind::WebSocket, None)
        );
    }

    #[test]
    fn deflate_shares_one_compressed_frame() {
        let config = Config::default();
        let text = "\"".to_owned() + &"compressible ".repeat(40) + "\"";
        let p = Publication::new(Arc::from("s"), Position::new(Epoch(1), 1), &text, 0);
        let a = WebSocketDeflate.publication(&p, &config);
        let b = WebSocketDeflate.publication(&p, &config);
        assert_eq!(a.as_ptr(), b.as_ptr(), "one compression per publication");
        assert_eq!(a[0], 0xC1, "FIN, RSV1, text");
        let off = Config {
            compression_threshold: 100_000,
            ..Config::default()
        };
        let q = Publication::new(Arc::from("s"), Position::new(Epoch(1), 2), &text, 0);
        let plain = WebSocketDeflate.publication(&q, &off);
        assert_eq!(plain.as_ptr(), q.ws_frame().as_ptr(), "below the threshold");
    }

    #[test]
    fn frames_on_the_wire() {
        let ws = WebSocket;
        assert_eq!(&ws.reply(b"{}", &Session::default())[..], b"\x81\x02{}");
        assert_eq!(&ws.heartbeat()[..], b"\x89\x00");
        let close = ws.close(CloseReason::SlowConsumer).unwrap();
        assert_eq!(&close[..4], b"\x88\x2a\x0f\xa1", "4001 and its reason");
        assert!(ws.close(CloseReason::Abnormal).is_none());
        let p = Publication::new(Arc::from("s"), Position::new(Epoch(1), 1), "1", 0);
        let a = ws.publication(&p, &Config::default());
        assert_eq!(a.as_ptr(), p.ws_frame().as_ptr(), "shared, not copied");
    }
}
