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
//!
//! A publication history keeps is charged to the history budget, and so is
//! its compressed frame from when both are true, whichever came first:
//! it is kept ([`Publication::keep`], by `history`) and its frame is made
//! (on a worker, at any time). One atomic holds the two facts, so exactly
//! one side adds the frame's bytes to the budget ([`Publication::budget`])
//! and leaving history ([`Publication::leave`]) frees them exactly when
//! they were added.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
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
    /// [`KEPT`] and [`DEFLATED`]: the compressed frame's bytes are charged
    /// to `budget` while both are set.
    charge: AtomicU8,
    /// The history budget's count of bytes, for a publication a history
    /// may keep (the engine's, see [`Publication::charged_to`]); `None`
    /// for one no history keeps, which [`Publication::keep`] then leaves
    /// uncharged.
    budget: Option<Arc<AtomicUsize>>,
}

/// In [`Publication::charge`]: a history keeps it.
const KEPT: u8 = 1;
/// In [`Publication::charge`]: its compressed frame is made (and smaller).
const DEFLATED: u8 = 2;

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
            charge: AtomicU8::new(0),
            budget: None,
        }
    }

    /// This publication, to be kept by a history whose bytes `budget`
    /// counts: its compressed frame, if made while kept, is added there.
    pub fn charged_to(mut self, budget: Arc<AtomicUsize>) -> Self {
        self.budget = Some(budget);
        self
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
        let mut made = false;
        let deflated = self.deflated.get_or_init(|| {
            made = true;
            compress(self.envelope())
        });
        match deflated {
            Some(frame) => {
                if made {
                    self.made(frame.len());
                }
                frame
            }
            None => &self.frame,
        }
    }

    /// Records that the compressed frame (`len` bytes) now exists, and
    /// charges it to the budget if a history keeps this publication. The
    /// bytes are added before the fact is published and taken back if it
    /// was not kept, so the budget's count never dips below what it holds
    /// (an eviction that sees the frame subtracts it afterwards).
    fn made(&self, len: usize) {
        let Some(budget) = &self.budget else {
            self.charge.fetch_or(DEFLATED, Ordering::AcqRel);
            return;
        };
        budget.fetch_add(len, Ordering::Relaxed);
        if self.charge.fetch_or(DEFLATED, Ordering::AcqRel) & KEPT == 0 {
            budget.fetch_sub(len, Ordering::Relaxed);
        }
    }

    /// The bytes of the compressed frame, once made (0 before, or when it
    /// was not smaller than the plain one).
    pub fn deflated_len(&self) -> usize {
        self.deflated
            .get()
            .and_then(Option::as_ref)
            .map_or(0, Bytes::len)
    }

    /// A history keeps it from now on: returns the bytes of its compressed
    /// frame if already made, which the caller adds to the budget beside
    /// [`held_bytes`](Self::held_bytes) (0 when not made, or when no budget
    /// was given: then the frame is never charged).
    pub fn keep(&self) -> usize {
        if self.budget.is_none() {
            return 0;
        }
        let was = self.charge.fetch_or(KEPT, Ordering::AcqRel);
        debug_assert!(was & KEPT == 0, "kept by one history once");
        if was & DEFLATED != 0 {
            self.deflated_len()
        } else {
            0
        }
    }

    /// It leaves history: returns the bytes of its compressed frame if they
    /// were charged, which the caller takes off the budget.
    pub fn leave(&self) -> usize {
        let was = self.charge.fetch_and(!KEPT, Ordering::AcqRel);
        if was & (KEPT | DEFLATED) == KEPT | DEFLATED {
            self.deflated_len()
        } else {
            0
        }
    }

    /// The bytes of its compressed frame charged to the budget now (made
    /// and kept), for an audit of the budget.
    pub fn charged_deflated_bytes(&self) -> usize {
        if self.charge.load(Ordering::Acquire) & (KEPT | DEFLATED) == KEPT | DEFLATED {
            self.deflated_len()
        } else {
            0
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
    /// Not the compressed frame: history adds and later subtracts this
    /// figure, so it must not change once stored; the compressed frame,
    /// made later if ever, is charged on its own ([`keep`](Self::keep),
    /// [`leave`](Self::leave)).
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

    #[test]
    fn a_publication_stays_small() {
        // Paid per kept publication (docs/benchmarks.md, history memory).
        assert!(std::mem::size_of::<Publication>() <= 128);
    }

    #[test]
    fn the_compressed_frame_is_charged_while_kept_whichever_comes_first() {
        let frame = |_: &[u8]| Some(Bytes::from_static(b"1234567"));
        let budget = Arc::new(AtomicUsize::new(0));
        let charged = || budget.load(Ordering::Relaxed);
        let new = |offset| {
            Publication::new(Arc::from("s"), Position::new(Epoch(1), offset), "[1,2]", 0)
                .charged_to(Arc::clone(&budget))
        };
        // Kept, then made: the maker charges it; leaving frees it.
        let p = new(1);
        assert_eq!(p.keep(), 0);
        p.deflated_frame(0, frame);
        assert_eq!((charged(), p.charged_deflated_bytes()), (7, 7));
        assert_eq!(p.leave(), 7);
        budget.fetch_sub(7, Ordering::Relaxed);
        assert_eq!(p.charged_deflated_bytes(), 0);
        // Made, then kept: the keeper is told (and adds it itself).
        let p = new(2);
        p.deflated_frame(0, frame);
        assert_eq!(charged(), 0, "not kept: not charged");
        assert_eq!(p.keep(), 7);
        assert_eq!(p.leave(), 7);
        // Left before it was made: never charged.
        let p = new(3);
        p.keep();
        assert_eq!(p.leave(), 0);
        p.deflated_frame(0, frame);
        assert_eq!((charged(), p.leave()), (0, 0));
        // Without a budget nothing is charged at all.
        let p = Publication::new(Arc::from("s"), Position::new(Epoch(1), 4), "[1,2]", 0);
        assert_eq!(p.keep(), 0);
        p.deflated_frame(0, frame);
        assert_eq!((p.charged_deflated_bytes(), p.leave()), (0, 0));
    }
}
