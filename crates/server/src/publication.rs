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

use std::sync::Arc;

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
        }
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
}
