//! A connection's outbound queue: shared frames waiting for the socket.
//!
//! A queued frame is a `Bytes` handle to the one encoding of a publish that
//! every recipient shares, so queueing costs a reference-count increment, not
//! a copy. Flushing gathers up to [`MAX_IOVECS`] queued frames into each
//! `writev`, which is what lets a saturated broadcast cost one system call
//! per socket per 64 frames instead of one per message (docs/limits.md:
//! write calls, not bytes, bound fan-out). The queue only exists while it holds data: the
//! connection keeps it behind an `Option<Box<_>>` and drops it when drained,
//! so an idle connection has no outbound buffer at all.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};

use bytes::Bytes;

/// Frames gathered into one `writev` call at most (below Linux's IOV_MAX of 1024;
/// 64 already covers ~32 KiB of typical deliveries, more than a socket takes at once).
const MAX_IOVECS: usize = 64;

/// Whether a flush emptied the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flushed {
    /// Everything queued was written.
    All,
    /// The socket is full; wait for it to become writable.
    Blocked,
}

/// What one flush did, for the byte and write-call counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushReport {
    pub flushed: Flushed,
    pub bytes: usize,
    pub calls: usize,
}

/// Frames queued for one socket.
#[derive(Debug, Default)]
pub struct Outbound {
    frames: VecDeque<Bytes>,
    /// Bytes of `frames[0]` already written by an earlier partial write.
    head_written: usize,
    /// Unwritten bytes across all frames, checked against the slow-consumer limit.
    pending: usize,
}

impl Outbound {
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues a frame behind everything already queued.
    pub fn push(&mut self, frame: Bytes) {
        self.pending += frame.len();
        self.frames.push_back(frame);
    }

    /// Queues a frame in front of everything queued. Only for a queue that
    /// has not started writing (a long-poll's head, decided last).
    pub fn push_front(&mut self, frame: Bytes) {
        debug_assert_eq!(self.head_written, 0, "the front frame is partly written");
        self.pending += frame.len();
        self.frames.push_front(frame);
    }

    /// Unwritten bytes.
    pub fn pending_bytes(&self) -> usize {
        self.pending
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Frames queued (each a shared handle).
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// Drops every frame not yet started (a connection being cut as a slow
    /// consumer). A frame already partly written stays: cutting it would
    /// corrupt the framing of whatever is sent next, such as the close frame.
    pub fn discard_unstarted(&mut self) {
        let keep = usize::from(self.head_written > 0);
        self.frames.truncate(keep);
        self.pending = self
            .frames
            .front()
            .map_or(0, |head| head.len() - self.head_written);
    }

    /// Writes as much as the socket takes, gathering up to [`MAX_IOVECS`]
    /// frames per call.
    pub fn flush_to<W: Write>(&mut self, socket: &mut W) -> io::Result<FlushReport> {
        let mut report = FlushReport {
            flushed: Flushed::All,
            bytes: 0,
            calls: 0,
        };
        while !self.frames.is_empty() {
            let mut slices = [IoSlice::new(&[]); MAX_IOVECS];
            let mut count = 0;
            for (i, frame) in self.frames.iter().take(MAX_IOVECS).enumerate() {
                let start = if i == 0 { self.head_written } else { 0 };
                slices[i] = IoSlice::new(&frame[start..]);
                count += 1;
            }
            report.calls += 1;
            let written = match socket.write_vectored(&slices[..count]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    report.flushed = Flushed::Blocked;
                    return Ok(report);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            report.bytes += written;
            self.consume(written);
        }
        Ok(report)
    }

    /// The unwritten bytes, in order, frame by frame (what a TLS link
    /// seals instead of writing them).
    pub fn chunks(&self) -> impl Iterator<Item = &[u8]> {
        self.frames.iter().enumerate().map(|(i, frame)| {
            if i == 0 {
                &frame[self.head_written..]
            } else {
                &frame[..]
            }
        })
    }

    /// Advances past `written` bytes, releasing frames that are fully sent
    /// (an empty frame is, whatever `written` is).
    pub fn consume(&mut self, mut written: usize) {
        self.pending -= written;
        while let Some(head) = self.frames.front() {
            let head_left = head.len() - self.head_written;
            if written < head_left {
                self.head_written += written;
                return;
            }
            written -= head_left;
            self.frames.pop_front();
            self.head_written = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket that takes at most `limit` bytes per call, then blocks after `budget`.
    struct Trickle {
        taken: Vec<u8>,
        limit: usize,
        budget: usize,
        calls: usize,
    }

    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.write_vectored(&[IoSlice::new(buf)])
        }
        fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            self.calls += 1;
            if self.budget == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(self.limit - n).min(self.budget);
                self.taken.extend_from_slice(&b[..take]);
                n += take;
                self.budget -= take;
                if n == self.limit || self.budget == 0 {
                    break;
                }
            }
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn queue(frames: &[&'static [u8]]) -> Outbound {
        let mut q = Outbound::new();
        for f in frames {
            q.push(Bytes::from_static(f));
        }
        q
    }

    #[test]
    fn one_call_takes_everything_when_the_socket_can() {
        let mut q = queue(&[b"ab", b"cde", b"f"]);
        let mut s = Trickle {
            taken: vec![],
            limit: 1 << 20,
            budget: 1 << 20,
            calls: 0,
        };
        let report = q.flush_to(&mut s).unwrap();
        assert_eq!(
            report,
            FlushReport {
                flushed: Flushed::All,
                bytes: 6,
                calls: 1
            }
        );
        assert_eq!(s.taken, b"abcdef");
        assert_eq!(s.calls, 1, "coalesced into one writev");
        assert_eq!(q.pending_bytes(), 0);
        assert!(q.is_empty());
    }

    #[test]
    fn partial_writes_resume_mid_frame() {
        let mut q = queue(&[b"hello", b"world"]);
        let mut s = Trickle {
            taken: vec![],
            limit: 3,
            budget: 7,
            calls: 0,
        };
        assert_eq!(q.flush_to(&mut s).unwrap().flushed, Flushed::Blocked);
        assert_eq!(s.taken, b"hellowo");
        assert_eq!(q.pending_bytes(), 3);
        s.budget = 100;
        assert_eq!(q.flush_to(&mut s).unwrap().flushed, Flushed::All);
        assert_eq!(s.taken, b"helloworld");
    }

    #[test]
    fn discarding_keeps_a_partly_written_frame_whole() {
        let mut q = queue(&[b"hello", b"world", b"again"]);
        let mut s = Trickle {
            taken: vec![],
            limit: 2,
            budget: 2,
            calls: 0,
        };
        q.flush_to(&mut s).unwrap();
        q.discard_unstarted();
        assert_eq!(q.pending_bytes(), 3);
        q.push(Bytes::from_static(b"!"));
        s.budget = 100;
        q.flush_to(&mut s).unwrap();
        assert_eq!(s.taken, b"hello!");
        let mut q = queue(&[b"ab", b"cd"]);
        q.discard_unstarted();
        assert!(q.is_empty());
        assert_eq!(q.pending_bytes(), 0);
    }

    #[test]
    fn consuming_releases_whole_frames_and_empty_ones() {
        let mut q = queue(&[b"abc", b"", b"de"]);
        let chunks: Vec<&[u8]> = q.chunks().collect();
        assert_eq!(chunks, [&b"abc"[..], b"", b"de"]);
        q.consume(3);
        assert_eq!(q.len(), 1, "the empty frame went with the one before it");
        q.consume(1);
        assert_eq!(q.chunks().collect::<Vec<_>>(), [&b"e"[..]]);
        assert_eq!(q.pending_bytes(), 1);
    }

    #[test]
    fn more_frames_than_iovecs_still_all_go_out() {
        let mut q = Outbound::new();
        for i in 0..(MAX_IOVECS * 3 + 5) {
            q.push(Bytes::from(vec![i as u8; 3]));
        }
        let mut s = Trickle {
            taken: vec![],
            limit: 1 << 20,
            budget: 1 << 20,
            calls: 0,
        };
        let report = q.flush_to(&mut s).unwrap();
        assert_eq!(report.flushed, Flushed::All);
        assert_eq!(s.taken.len(), (MAX_IOVECS * 3 + 5) * 3);
        assert_eq!((s.calls, report.calls), (4, 4));
    }
}
