//! The publication: the unit every layer passes around once a publish has a
//! position.
//!
//! A publication is `{subject, position, data}`, encoded once into the
//! protocol v1 envelope (`{"op":"msg",…,"data":…}`). The one allocation
//! holds the envelope with a WebSocket frame header in front of it, so that
//! WebSocket recipients, history and every other transport share the same
//! bytes: the WebSocket transport sends the whole buffer, the others frame
//! the envelope (or the data) in their own way without copying it. History
//! and live fan-out hold the same `Arc<Publication>`, so a stored message is
//! paid for once.
//!
//! Beside it, made the first time a permessage-deflate recipient needs it
//! (on whichever worker), the compressed frame: one per node, shared like
//! the uncompressed one by every such recipient and by history replays.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use myriad_protocol::message::{publication_len, write_publication};
use myriad_protocol::position::Position;
use myriad_protocol::ws::{write_frame_header, OpCode, MAX_HEADER_LEN};

use crate::config::Config;
use crate::deflate;

/// One published message with its place in its subject's stream.
#[derive(Debug)]
pub struct Publication {
    pub subject: Arc<str>,
    pub position: Position,
    /// When it was published, in milliseconds on the engine's clock; history
    /// expires it by this.
    pub published_ms: u64,
    /// The WebSocket text frame carrying the envelope: header, then envelope.
    frame: Bytes,
    /// Length of the frame header at the front of `frame`.
    header_len: u8,
    /// The compressed text frame (RFC 7692), made once; `None` inside when
    /// compressing did not make the envelope smaller.
    deflated: OnceLock<Option<Bytes>>,
}

impl Publication {
    /// Encodes `data` (raw JSON) at `position` of `subject`.
    pub fn new(subject: Arc<str>, position: Position, data: &str, published_ms: u64) -> Self {
        let len = publication_len(&subject, position.offset, data);
        let mut frame = Vec::with_capacity(MAX_HEADER_LEN + len);
        write_frame_header(&mut frame, true, OpCode::Text, len, None);
        let header_len = frame.len() as u8;
        write_publication(&mut frame, &subject, position, data);
        Publication {
            subject,
            position,
            published_ms,
            frame: Bytes::from(frame),
            header_len,
            deflated: OnceLock::new(),
        }
    }

    /// The frame a recipient that negotiated permessage-deflate gets: the
    /// compressed one, made on first use and kept, when the envelope is at
    /// least `compression_threshold` bytes and compressing shrinks it;
    /// otherwise the uncompressed one (RFC 7692 §6 lets any message go
    /// uncompressed). Concurrent first uses wait for one compression.
    pub fn deflated_frame(&self, config: &Config) -> &Bytes {
        if self.envelope().len() < config.compression_threshold {
            return &self.frame;
        }
        self.deflated
            .get_or_init(|| deflate::text_frame(self.envelope(), config.compression_level))
            .as_ref()
            .unwrap_or(&self.frame)
    }

    /// The complete WebSocket text frame, shared by every WebSocket recipient.
    pub fn ws_frame(&self) -> &Bytes {
        &self.frame
    }

    /// The protocol v1 envelope, without any transport framing.
    pub fn envelope(&self) -> &[u8] {
        &self.frame[usize::from(self.header_len)..]
    }

    /// Bytes this publication keeps alive while history holds it: the
    /// encoded buffer plus this struct inside its `Arc` (two counters).
    /// Not the compressed frame: history adds and later subtracts this
    /// figure, so it must not change once stored, and the compressed frame
    /// is made later, if ever, and is kept only when smaller than `frame`,
    /// so it at most doubles what history's byte figures say.
    pub fn held_bytes(&self) -> usize {
        self.frame.len() + std::mem::size_of::<Publication>() + 2 * std::mem::size_of::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use myriad_protocol::position::Epoch;

    #[test]
    fn one_buffer_holds_frame_envelope_and_data() {
        let p = Publication::new(Arc::from("s"), Position::new(Epoch(1), 7), "\"x\"", 0);
        let envelope =
            br#"{"op":"msg","subject":"s","epoch":"0000000000000001","offset":7,"data":"x"}"#;
        assert_eq!(p.envelope(), envelope);
        assert_eq!(p.ws_frame()[0], 0x81, "FIN + text");
        assert_eq!(p.ws_frame()[1] as usize, envelope.len());
        assert_eq!(p.ws_frame().len(), 2 + envelope.len());
        let big = "\"".to_owned() + &"a".repeat(600) + "\"";
        let p = Publication::new(Arc::from("s"), Position::new(Epoch(1), 7), &big, 0);
        assert!(p.envelope().ends_with(format!("{big}}}").as_bytes()));
        assert_eq!(p.ws_frame()[1], 126, "16-bit length");
        assert_eq!(p.envelope().len() + 4, p.ws_frame().len());
    }

    #[test]
    fn the_compressed_frame_is_made_once_and_only_above_the_threshold() {
        let config = Config::default();
        let small = Publication::new(Arc::from("s"), Position::new(Epoch(1), 1), "1", 0);
        assert_eq!(
            small.deflated_frame(&config).as_ptr(),
            small.ws_frame().as_ptr()
        );
        let text = "\"".to_owned() + &"hello world ".repeat(50) + "\"";
        let p = Publication::new(Arc::from("s"), Position::new(Epoch(1), 1), &text, 0);
        let first = p.deflated_frame(&config).clone();
        assert_eq!(first[0] & 0x40, 0x40, "RSV1");
        assert!(first.len() < p.ws_frame().len() / 4);
        assert_eq!(p.deflated_frame(&config).as_ptr(), first.as_ptr(), "shared");
    }
}
