//! [`InflateCache`]: how the bench inflates compressed deliveries. A
//! message whose compressed bytes equal, byte for byte, one of the last few
//! it inflated is handed that message's text again; any other is inflated.
//!
//! Why: a node compresses each publication once
//! (`server_no_context_takeover`) and sends every compressing recipient the
//! same bytes. A real client inflates its own deliveries on its own CPU;
//! the bench plays thousands of clients on a few cores, and inflating every
//! copy (about 2.3 µs each on the 2-vCPU box) made it, not the node, the
//! limit of a saturating broadcast (docs/benchmarks.md, *permessage-deflate:
//! idle memory and broadcast*). What stays honest: a hit needs the whole
//! compressed payload to match (length, then every byte), so a message that
//! differs in any byte, a corrupt one included, is inflated and refused as
//! [`Inflater`] refuses it; and every delivery still reaches the workload
//! as text, which checks its sequence and reads its stamp per subscriber as
//! before.
//!
//! Bounded: at most [`CAPACITY`] messages of at most the inflate limit
//! each, the oldest replaced first. Found by a hash of the compressed bytes,
//! then compared whole. Pure: no I/O, no clock.

use std::collections::HashMap;
use std::hash::BuildHasher as _;

use foldhash::fast::RandomState;
use myriad_protocol::ws::deflate::{Inflate, Inflater};
use myriad_protocol::ws::FrameError;

/// Messages kept. A worker does not read its connections' deliveries in
/// publication order: it reads one connection's pending frames (about 50
/// per read in a saturating broadcast) before the next one's, and its
/// subscribers lag each other by seconds of publications (at 800/s, up to a
/// few thousand). Eight were measured to miss almost every copy (13.7 M
/// inflated of 13.7 M deliveries); 4,096 of 512-byte publications hold
/// about 4 MiB per bench worker.
pub const CAPACITY: usize = 4096;

/// One message inflated: the compressed payload it came from, its hash,
/// and its text.
struct Entry {
    hash: u64,
    compressed: Vec<u8>,
    inflated: Vec<u8>,
}

/// A worker's inflater with the last [`CAPACITY`] messages it inflated.
pub struct InflateCache {
    /// Inflates every message not kept; its stream exists after the first.
    inflater: Inflater,
    /// The messages kept, a ring: `next` is the oldest once it is full.
    entries: Vec<Entry>,
    /// The slot the next inflated message takes.
    next: usize,
    /// Messages kept at most.
    capacity: usize,
    /// A compressed message's hash to the slot that last kept one with it.
    index: HashMap<u64, usize, RandomState>,
    /// Hashes compressed messages for `index`.
    hasher: RandomState,
    /// Messages inflated (the rest of the calls that succeeded reused one).
    inflated: u64,
}

impl Default for InflateCache {
    fn default() -> Self {
        Self::with_capacity(CAPACITY)
    }
}

impl InflateCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// A cache keeping at most `capacity` messages (at least one).
    pub fn with_capacity(capacity: usize) -> Self {
        InflateCache {
            inflater: Inflater::new(),
            entries: Vec::new(),
            next: 0,
            capacity: capacity.max(1),
            index: HashMap::default(),
            hasher: RandomState::default(),
            inflated: 0,
        }
    }

    /// Messages inflated so far, for the counters: the compressed
    /// deliveries that were not copies of one kept.
    pub fn inflated(&self) -> u64 {
        self.inflated
    }

    /// Keeps `text`, inflated from `compressed` (whose hash is `hash`), in
    /// the oldest slot; returns the slot.
    fn keep(&mut self, hash: u64, compressed: &[u8], text: Vec<u8>) -> usize {
        let slot = self.next;
        self.next = (slot + 1) % self.capacity;
        if slot == self.entries.len() {
            self.entries.push(Entry {
                hash,
                compressed: compressed.to_vec(),
                inflated: text,
            });
        } else {
            let old = std::mem::replace(
                &mut self.entries[slot],
                Entry {
                    hash,
                    compressed: compressed.to_vec(),
                    inflated: text,
                },
            );
            if self.index.get(&old.hash) == Some(&slot) {
                self.index.remove(&old.hash);
            }
        }
        self.index.insert(hash, slot);
        slot
    }
}

impl Inflate for InflateCache {
    fn inflate(&mut self, payload: &[u8], limit: usize) -> Result<&[u8], FrameError> {
        let hash = self.hasher.hash_one(payload);
        let kept = self.index.get(&hash).copied();
        if let Some(slot) = kept.filter(|&i| self.entries[i].compressed == payload) {
            let inflated = &self.entries[slot].inflated;
            // Kept under whatever limit it was inflated with.
            if inflated.len() > limit {
                return Err(FrameError::InflatedTooBig { limit });
            }
            return Ok(inflated);
        }
        let text = self.inflater.inflate(payload, limit)?.to_vec();
        self.inflated += 1;
        let slot = self.keep(hash, payload, text);
        Ok(&self.entries[slot].inflated)
    }
}

#[cfg(test)]
mod tests {
    use myriad_protocol::ws::deflate::Deflater;

    use super::*;

    const LIMIT: usize = 1 << 16;

    fn compressed(text: &str) -> Vec<u8> {
        let mut out = Vec::new();
        Deflater::new(2)
            .compress(text.as_bytes(), &mut out)
            .expect("text that compresses");
        out
    }

    fn message(n: usize) -> String {
        format!(
            r#"{{"seq":{n},"data":"{}"}}"#,
            "the quick brown fox ".repeat(20)
        )
    }

    #[test]
    fn a_copy_is_inflated_once() {
        let mut cache = InflateCache::new();
        let frame = compressed(&message(1));
        for _ in 0..5 {
            let out = cache.inflate(&frame, LIMIT).expect("valid");
            assert_eq!(out, message(1).as_bytes());
        }
        assert_eq!(cache.inflated(), 1);
    }

    #[test]
    fn a_differing_message_is_inflated_and_its_own() {
        let mut cache = InflateCache::new();
        let (a, b) = (compressed(&message(1)), compressed(&message(2)));
        assert_eq!(cache.inflate(&a, LIMIT).unwrap(), message(1).as_bytes());
        assert_eq!(cache.inflate(&b, LIMIT).unwrap(), message(2).as_bytes());
        assert_eq!(cache.inflate(&a, LIMIT).unwrap(), message(1).as_bytes());
        assert_eq!(cache.inflated(), 2);
    }

    #[test]
    fn a_corrupt_copy_is_refused() {
        let mut cache = InflateCache::new();
        let good = compressed(&message(1));
        cache.inflate(&good, LIMIT).expect("valid");
        // The length of a kept message with one byte changed: answered as
        // an inflater alone answers it (refused, almost always), never
        // with the kept message.
        for at in [0, good.len() / 2, good.len() - 1] {
            let mut bad = good.clone();
            bad[at] ^= 0xff;
            let got = cache.inflate(&bad, LIMIT).map(<[u8]>::to_vec);
            assert_ne!(got, Ok(message(1).into_bytes()), "byte {at} changed");
            let alone = Inflater::new().inflate(&bad, LIMIT).map(<[u8]>::to_vec);
            assert_eq!(got, alone, "byte {at}: not what an inflater makes of it");
        }
        let mut garbage = vec![0xff; good.len()];
        garbage[0] = 0x07; // a reserved block type (BTYPE 11)
        assert_eq!(
            cache.inflate(&garbage, LIMIT),
            Err(FrameError::BadDeflateData)
        );
        // What was kept is still right.
        assert_eq!(cache.inflate(&good, LIMIT).unwrap(), message(1).as_bytes());
    }

    #[test]
    fn the_reader_takes_copies_and_refuses_a_corrupt_frame() {
        use myriad_protocol::ws::{
            write_frame_header, Message, MessageReader, OpCode, Read, ReadLimits, Role,
            COMPRESSED_BIT,
        };
        let frame = |payload: &[u8]| {
            let mut f = Vec::new();
            write_frame_header(&mut f, true, OpCode::Text, payload.len(), None);
            f[0] |= COMPRESSED_BIT;
            f.extend_from_slice(payload);
            f
        };
        let limits = ReadLimits {
            role: Role::Client,
            max_message: LIMIT,
        };
        let mut cache = InflateCache::new();
        let good = compressed(&message(1));
        for _ in 0..3 {
            let mut bytes = frame(&good);
            let mut reader = MessageReader::new();
            match reader.read_deflate(&mut bytes, &limits, Some(&mut cache)) {
                Ok(Read::Frame {
                    message: Some(Message::Text(t)),
                    ..
                }) => assert_eq!(t, message(1)),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(cache.inflated(), 1);
        let mut bad = frame(&good);
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        let mut reader = MessageReader::new();
        let got = reader.read_deflate(&mut bad, &limits, Some(&mut cache));
        assert!(got.is_err(), "{got:?}");
    }

    #[test]
    fn a_kept_message_over_a_smaller_limit_is_refused() {
        let mut cache = InflateCache::new();
        let frame = compressed(&message(1));
        cache.inflate(&frame, LIMIT).expect("valid");
        let small = message(1).len() - 1;
        assert_eq!(
            cache.inflate(&frame, small),
            Err(FrameError::InflatedTooBig { limit: small })
        );
    }

    #[test]
    fn the_oldest_is_replaced_and_the_cache_stays_bounded() {
        const CAPACITY: usize = 8;
        let mut cache = InflateCache::with_capacity(CAPACITY);
        let frames: Vec<_> = (0..CAPACITY + 1).map(|n| compressed(&message(n))).collect();
        for (n, f) in frames.iter().enumerate() {
            assert_eq!(cache.inflate(f, LIMIT).unwrap(), message(n).as_bytes());
        }
        assert_eq!(cache.entries.len(), CAPACITY);
        assert_eq!(cache.index.len(), CAPACITY);
        // The newest CAPACITY are kept; the first was replaced.
        for (n, f) in frames.iter().enumerate().skip(1) {
            assert_eq!(cache.inflate(f, LIMIT).unwrap(), message(n).as_bytes());
        }
        assert_eq!(cache.inflated(), CAPACITY as u64 + 1);
        assert_eq!(
            cache.inflate(&frames[0], LIMIT).unwrap(),
            message(0).as_bytes()
        );
        assert_eq!(cache.inflated(), CAPACITY as u64 + 2);
    }
}
