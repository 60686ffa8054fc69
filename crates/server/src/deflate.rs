//! permessage-deflate on the node: the one compressed frame a publication
//! shares, and the counts behind the compression metrics.
//!
//! The codec and the offer's grammar are the protocol crate's
//! (`myriad_protocol::ws::deflate`). This module compresses a publication's
//! frame for every recipient that negotiated it, on whichever worker needs
//! it first (`Publication::deflated_frame` keeps it), and counts what
//! compression did and what compressed input was refused. Which connection
//! gets which transport, and the settings it reads, are
//! `transport::ws::upgrade`'s. It names no other module of the crate and
//! must not keep anything per connection: the whole point is that a
//! compressing connection costs what any other does.
//!
//! Counts are process-wide atomics, not per-worker handles: compression
//! happens inside `Publication`, which has no metrics handle, and the
//! admin listener copies them into `Metrics` when it renders them
//! (`Metrics::mirror_deflate`).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use bytes::Bytes;
use myriad_protocol::ws::deflate::{Decline, Deflater, Negotiation};
use myriad_protocol::ws::{write_frame_header, FrameError, OpCode, COMPRESSED_BIT, MAX_HEADER_LEN};

/// What the node has counted of compression since it started.
#[derive(Debug, Default)]
pub struct DeflateCounts {
    /// Frames compressed (publications, once per node each).
    pub frames: AtomicU64,
    /// Payload bytes of those frames before compression.
    pub bytes_before: AtomicU64,
    /// Their payload bytes after.
    pub bytes_after: AtomicU64,
    /// Time spent compressing, in nanoseconds.
    pub nanos: AtomicU64,
    /// Frames that did not get smaller and were kept uncompressed.
    pub incompressible: AtomicU64,
    /// Upgrades that negotiated permessage-deflate.
    pub negotiated: AtomicU64,
    /// Offers declined, by [`Decline`] (in `Decline::ALL` order).
    pub declined: [AtomicU64; Decline::ALL.len()],
    /// Compressed input refused, by [`Refusal`] (in `Refusal::ALL` order).
    pub refused: [AtomicU64; Refusal::ALL.len()],
}

/// The node's counts.
pub static COUNTS: DeflateCounts = DeflateCounts {
    frames: AtomicU64::new(0),
    bytes_before: AtomicU64::new(0),
    bytes_after: AtomicU64::new(0),
    nanos: AtomicU64::new(0),
    incompressible: AtomicU64::new(0),
    negotiated: AtomicU64::new(0),
    declined: [const { AtomicU64::new(0) }; Decline::ALL.len()],
    refused: [const { AtomicU64::new(0) }; Refusal::ALL.len()],
};

/// Why compressed client input was refused; each closes the connection
/// with the reason its `FrameError` maps to (1009 for a bomb, 1002 else).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// It inflated past `max_message_size` (1009), refused as it passed.
    Bomb,
    /// Not valid DEFLATE data (1002).
    BadData,
    /// RSV1 on a control frame (1002).
    CompressedControl,
    /// RSV1 on a continuation frame (1002).
    CompressedContinuation,
}

impl Refusal {
    pub const ALL: [Refusal; 4] = [
        Refusal::Bomb,
        Refusal::BadData,
        Refusal::CompressedControl,
        Refusal::CompressedContinuation,
    ];

    /// The metric label.
    pub const fn name(self) -> &'static str {
        match self {
            Refusal::Bomb => "bomb",
            Refusal::BadData => "bad_data",
            Refusal::CompressedControl => "compressed_control_frame",
            Refusal::CompressedContinuation => "compressed_continuation",
        }
    }

    /// The refusal a frame error is, if it is about compression. RSV1 on a
    /// connection that did not negotiate is `ReservedBits`, counted with
    /// every other protocol error.
    pub fn of(error: &FrameError) -> Option<Refusal> {
        match error {
            FrameError::InflatedTooBig { .. } => Some(Refusal::Bomb),
            FrameError::BadDeflateData => Some(Refusal::BadData),
            FrameError::CompressedControlFrame => Some(Refusal::CompressedControl),
            FrameError::CompressedContinuation => Some(Refusal::CompressedContinuation),
            _ => None,
        }
    }
}

/// Counts `error` if it is a compression refusal.
pub fn count_refusal(error: &FrameError) {
    if let Some(refusal) = Refusal::of(error) {
        COUNTS.refused[refusal as usize].fetch_add(1, Relaxed);
    }
}

/// Counts an upgrade's negotiation: an agreement, or the reason an offer
/// was declined.
pub fn count_negotiation(negotiation: &Negotiation) {
    if let Some(decline) = negotiation.declined {
        COUNTS.declined[decline as usize].fetch_add(1, Relaxed);
    }
    if negotiation.agreed.is_some() {
        COUNTS.negotiated.fetch_add(1, Relaxed);
    }
}

thread_local! {
    /// This thread's deflater and its level: a zlib stream holds about
    /// 270 KiB of window and tables, so it is made once per worker (per
    /// thread that compresses), not per frame, and reset per frame.
    static DEFLATER: RefCell<Option<(u8, Deflater)>> = const { RefCell::new(None) };
}

/// A compressed text frame (FIN, RSV1) carrying `payload`, or `None` if
/// compressing did not make it smaller. Counted in [`COUNTS`].
pub fn text_frame(payload: &[u8], level: u8) -> Option<Bytes> {
    let started = Instant::now();
    let mut compressed = Vec::with_capacity(payload.len());
    let len = DEFLATER.with_borrow_mut(|slot| {
        let deflater = match slot {
            Some((at, deflater)) if *at == level => deflater,
            _ => &mut slot.insert((level, Deflater::new(level))).1,
        };
        deflater.compress(payload, &mut compressed)
    });
    let Some(len) = len else {
        COUNTS.incompressible.fetch_add(1, Relaxed);
        return None;
    };
    let mut frame = Vec::with_capacity(MAX_HEADER_LEN + len);
    write_frame_header(&mut frame, true, OpCode::Text, len, None);
    frame[0] |= COMPRESSED_BIT;
    frame.extend_from_slice(&compressed);
    let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    COUNTS.frames.fetch_add(1, Relaxed);
    COUNTS.bytes_before.fetch_add(payload.len() as u64, Relaxed);
    COUNTS.bytes_after.fetch_add(len as u64, Relaxed);
    COUNTS.nanos.fetch_add(nanos, Relaxed);
    Some(Bytes::from(frame))
}

#[cfg(test)]
mod tests {
    use super::*;
    use myriad_protocol::ws::deflate::Inflater;

    #[test]
    fn a_compressed_frame_has_rsv1_and_inflates_to_its_payload() {
        let payload = "{\"data\":\"".to_owned() + &"abc ".repeat(100) + "\"}";
        let frame = text_frame(payload.as_bytes(), 1).unwrap();
        assert_eq!(frame[0], 0x80 | 0x40 | 0x1, "FIN, RSV1, text");
        let (len, at) = match frame[1] {
            126 => (usize::from(u16::from_be_bytes([frame[2], frame[3]])), 4),
            n => (usize::from(n), 2),
        };
        assert_eq!(frame.len(), at + len);
        assert!(len < payload.len() / 4, "{len}");
        let mut inflater = Inflater::new();
        assert_eq!(
            inflater.inflate(&frame[at..], 1 << 20).unwrap(),
            payload.as_bytes()
        );
        assert_eq!(text_frame(b"x", 1), None, "not smaller");
    }
}
