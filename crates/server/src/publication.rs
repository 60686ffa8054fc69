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
//! This module only keeps it; how it is compressed is the caller's (the
//! WebSocket transport hands in `deflate::text_frame`), so that the unit
//! every layer passes around names no other module.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use myriad_protocol::message::{publication_len, write_publication};
use myriad_protocol::position::Position;
use myriad_protocol::ws::{write_frame_header, OpCode, MAX_HEADER_LEN};

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
    /// compressed one, made by `compress` (the envelope in, a whole frame
    /// or `None` out) on first use and kept, when the envelope is at least
    /// `threshold` bytes and `compress` made a frame; otherwise the
    /// uncompressed one (RFC 7692 §6 lets any message go uncompressed).
    /// Concurrent first uses wait for one compression.
    pub fn deflated_frame(
        &self,
        threshold: usize,
        compress: impl FnOnce(&[u8]) -> Option<Bytes>,
    ) -> &Bytes {
        if self.envelope().len() < threshold {
            return &self.frame;
        }
        self.deflated
            .get_or_init(|| compress(self.envelope()))
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
        // What `compress` returns is only kept here, so any bytes show it;
        // the real compressor is tested in `deflate`.
        let calls = std::cell::Cell::new(0);
        let compress = |envelope: &[u8]| {
            calls.set(calls.get() + 1);
            Some(Bytes::copy_from_slice(&envelope[..3]))
        };
        let small = Publication::new(Arc::from("s"), Position::new(Epoch(1), 1), "1", 0);
        let below = small.deflated_frame(small.envelope().len() + 1, compress);
        assert_eq!(below.as_ptr(), small.ws_frame().as_ptr());
        assert_eq!(calls.get(), 0, "below the threshold nothing is compressed");
        let p = Publication::new(Arc::from("s"), Position::new(Epoch(1), 1), "[1,2]", 0);
        let at = p.envelope().len();
        let first = p.deflated_frame(at, compress).clone();
        assert_eq!(&first[..], b"{\"o");
        let again = p.deflated_frame(at, compress);
        assert_eq!(again.as_ptr(), first.as_ptr(), "shared");
        assert_eq!(calls.get(), 1, "made once");
        let none = Publication::new(Arc::from("s"), Position::new(Epoch(1), 2), "[1,2]", 0);
        let kept = none.deflated_frame(0, |_| None);
        assert_eq!(kept.as_ptr(), none.ws_frame().as_ptr(), "not smaller");
    }
}
