//! [`MessageReader`]: turns the bytes of one connection into whole messages
//! and control frames. This is the server's hot path.
//!
//! The reader owns the rules that span frames (RFC 6455 §5.4 fragmentation,
//! §5.1 masking by role, the message size limit, UTF-8 across fragments) and
//! nothing else: it does not own the read buffer, does no I/O and never
//! answers pings or closes, it only reports them.
//!
//! Memory is the design constraint. A server holds up to a million mostly
//! idle connections, each with one reader, so the reader is a single
//! pointer-sized `Option<Box<_>>` that is `None` except while a fragmented
//! message is being reassembled. Unfragmented messages, the common case, are
//! unmasked in place in the caller's buffer and lent out from it with no copy.

use super::deflate::{Inflate, Inflater};
use super::frame::{
    apply_mask, parse_close_payload, parse_frame_header_deflate, FrameError, OpCode,
};
use super::utf8::Utf8Validator;

/// Which end of the connection we are; it decides the masking rule (§5.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Every incoming frame must be masked, or [`FrameError::UnmaskedFrame`].
    Server,
    /// No incoming frame may be masked, or [`FrameError::MaskedFrame`].
    Client,
}

/// What [`MessageReader::read`] enforces besides the RFC itself.
#[derive(Clone, Copy, Debug)]
pub struct ReadLimits {
    /// Which side we are.
    pub role: Role,
    /// Largest data message accepted, in payload bytes summed over all its
    /// fragments. Control frames are bounded by the RFC (125 bytes) instead.
    pub max_message: usize,
}

/// A complete message or control frame. Payloads are already unmasked and
/// borrow from the caller's buffer or, for a reassembled message, from the
/// reader.
#[derive(Debug, PartialEq, Eq)]
pub enum Message<'a> {
    /// A text message, checked to be UTF-8.
    Text(&'a str),
    /// A binary message.
    Binary(&'a [u8]),
    /// A ping; the caller owes a pong with the same payload (§5.5.2).
    Ping(&'a [u8]),
    /// A pong.
    Pong(&'a [u8]),
    /// A close frame with its validated code and reason, or `None` if it
    /// carried no payload (§5.5.1).
    Close(Option<(u16, &'a str)>),
}

/// The outcome of one [`MessageReader::read`] call.
#[derive(Debug, PartialEq, Eq)]
pub enum Read<'a> {
    /// Not a whole frame at the front of buf yet. `frame_len` is the total
    /// length of the frame (header+payload) once the header is known, so the
    /// caller can size its buffer.
    Incomplete {
        /// Header plus payload bytes, once the header has been parsed.
        frame_len: Option<usize>,
    },
    /// One frame consumed (`consumed` bytes from the front of buf).
    /// `message` is Some when it completed a message or was a control frame;
    /// None for a non-final data fragment that was absorbed into the reader's
    /// partial buffer.
    Frame {
        /// Bytes of buf this frame occupied; the caller must drop them
        /// before the next call, as their payload is now unmasked.
        consumed: usize,
        /// What the frame produced, if anything.
        message: Option<Message<'a>>,
    },
}

/// Per-connection reassembly state: a pointer, null when no fragmented
/// message is in progress.
#[derive(Debug, Default)]
pub struct MessageReader {
    partial: Option<Box<Partial>>,
}

/// A fragmented message being reassembled.
#[derive(Debug)]
struct Partial {
    /// The unmasked payload of every fragment so far.
    data: Vec<u8>,
    /// Text messages only: the UTF-8 state at the end of `data`.
    utf8: Utf8Validator,
    /// Text (true) or binary (false), from the first fragment's opcode.
    text: bool,
    /// The first fragment had RSV1 (permessage-deflate): `data` is
    /// compressed, and its text is checked once inflated.
    compressed: bool,
    /// The final fragment has arrived and the message was lent out by the
    /// last `read`; the next `read` frees this box. It cannot be freed
    /// earlier because the returned [`Message`] borrows `data`.
    complete: bool,
}

impl Partial {
    /// The finished message, borrowing `data`.
    fn message(&self) -> Result<Message<'_>, FrameError> {
        debug_assert!(!self.compressed, "inflated by the reader");
        if !self.text {
            return Ok(Message::Binary(&self.data));
        }
        // `finish` is the real check (the validator saw every byte); the
        // second pass through std is how safe code gets a `&str`, and only
        // fragmented text pays it.
        self.utf8.finish()?;
        let text = std::str::from_utf8(&self.data).map_err(|_| FrameError::InvalidUtf8)?;
        Ok(Message::Text(text))
    }
}

impl MessageReader {
    /// A reader with no message in progress.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads at most ONE frame from the front of buf, unmasking its payload
    /// IN PLACE in buf (zero copy for unfragmented messages: Text/Binary
    /// borrow from buf). Fragmented messages accumulate in the boxed partial
    /// (allocated only while a fragmented message is in progress); then the
    /// final Message borrows from the reader, and the box is freed by the
    /// next call, which a read loop makes anyway when it reads until
    /// `Incomplete`. Control frames may be interleaved inside a fragmented
    /// message (RFC 6455 §5.4) and are returned immediately.
    ///
    /// Everything that can be decided from the header is decided before the
    /// payload arrives: masking by role, fragment sequencing, and the size
    /// limit against the announced length plus the bytes already held, so a
    /// hostile 2^62-byte header fails at once with `MessageTooBig`. Text is
    /// UTF-8-checked per fragment (fail fast) and at the end; a close
    /// payload is checked with [`parse_close_payload`].
    ///
    /// buf is only modified when a whole frame is returned, so after
    /// `Incomplete` the caller may append to it and call again. After an
    /// error the connection must be failed: the reader's state is undefined.
    pub fn read<'a>(
        &'a mut self,
        buf: &'a mut [u8],
        limits: &ReadLimits,
    ) -> Result<Read<'a>, FrameError> {
        self.read_deflate(buf, limits, None::<&mut Inflater>)
    }

    /// [`MessageReader::read`] on a connection that negotiated
    /// permessage-deflate when `inflater` is given: a message whose first
    /// frame has RSV1 is inflated by it once whole (RFC 7692 §6.2), its
    /// inflated size held to `max_message` as it is made (a bomb fails
    /// with [`FrameError::InflatedTooBig`]) and its text checked then. The
    /// compressed bytes are held to `max_message` too. Without `inflater`
    /// RSV1 is [`FrameError::ReservedBits`], as in `read`.
    pub fn read_deflate<'a, I: Inflate>(
        &'a mut self,
        buf: &'a mut [u8],
        limits: &ReadLimits,
        inflater: Option<&'a mut I>,
    ) -> Result<Read<'a>, FrameError> {
        if self.partial.as_ref().is_some_and(|p| p.complete) {
            // The message lent out by the previous call is no longer borrowed.
            self.partial = None;
        }

        let Some((header, compressed)) = parse_frame_header_deflate(buf, inflater.is_some())?
        else {
            return Ok(Read::Incomplete { frame_len: None });
        };
        match (limits.role, header.mask) {
            (Role::Server, None) => return Err(FrameError::UnmaskedFrame),
            (Role::Client, Some(_)) => return Err(FrameError::MaskedFrame),
            _ => {}
        }
        let held = match (header.opcode, &self.partial) {
            (OpCode::Continuation, None) => return Err(FrameError::UnexpectedContinuation),
            (OpCode::Text | OpCode::Binary, Some(_)) => {
                return Err(FrameError::ExpectedContinuation)
            }
            (OpCode::Continuation, Some(partial)) => partial.data.len(),
            _ => 0,
        };
        let too_big = |size: u64| FrameError::MessageTooBig {
            size,
            limit: limits.max_message,
        };
        if !header.opcode.is_control() {
            let size = (held as u64).saturating_add(header.payload_len);
            if size > limits.max_message as u64 {
                return Err(too_big(size));
            }
        }
        // Only fails where usize is narrower than the 63-bit wire length and
        // max_message does not already rule the frame out.
        let frame_len = usize::try_from(header.payload_len)
            .ok()
            .and_then(|len| len.checked_add(header.header_len))
            .ok_or_else(|| too_big(header.payload_len))?;
        if buf.len() < frame_len {
            return Ok(Read::Incomplete {
                frame_len: Some(frame_len),
            });
        }

        let payload = &mut buf[header.header_len..frame_len];
        if let Some(key) = header.mask {
            apply_mask(payload, key);
        }
        let payload: &'a [u8] = payload;
        let inflate = |inflater: Option<&'a mut I>, text: bool, data: &'a [u8]| {
            let data = match inflater {
                Some(inflater) => inflater.inflate(data, limits.max_message)?,
                None => unreachable!("RSV1 is refused without an inflater"),
            };
            Ok::<_, FrameError>(if text {
                Message::Text(std::str::from_utf8(data).map_err(|_| FrameError::InvalidUtf8)?)
            } else {
                Message::Binary(data)
            })
        };
        let message = match header.opcode {
            OpCode::Text | OpCode::Binary if header.fin && compressed => {
                Some(inflate(inflater, header.opcode == OpCode::Text, payload)?)
            }
            OpCode::Ping => Some(Message::Ping(payload)),
            OpCode::Pong => Some(Message::Pong(payload)),
            OpCode::Close => Some(Message::Close(parse_close_payload(payload)?)),
            OpCode::Text if header.fin => Some(Message::Text(
                std::str::from_utf8(payload).map_err(|_| FrameError::InvalidUtf8)?,
            )),
            OpCode::Binary if header.fin => Some(Message::Binary(payload)),
            OpCode::Text | OpCode::Binary => {
                self.start_fragmented(header.opcode == OpCode::Text, compressed, payload)?;
                None
            }
            OpCode::Continuation => {
                let Some(partial) = self.partial.as_deref_mut() else {
                    return Err(FrameError::UnexpectedContinuation);
                };
                if partial.text && !partial.compressed {
                    partial.utf8.feed(payload)?;
                }
                let needed = partial.data.len() + payload.len();
                if needed > partial.data.capacity() {
                    // Doubling as `Vec` would, but never past the largest
                    // message allowed (`needed` is within it, see above):
                    // what a message in progress holds is bounded by it.
                    let target =
                        (partial.data.capacity() * 2).clamp(needed, limits.max_message.max(needed));
                    partial.data.reserve_exact(target - partial.data.len());
                }
                partial.data.extend_from_slice(payload);
                if header.fin {
                    partial.complete = true;
                    let partial: &'a Partial = partial;
                    Some(if partial.compressed {
                        inflate(inflater, partial.text, &partial.data)?
                    } else {
                        partial.message()?
                    })
                } else {
                    None
                }
            }
        };
        Ok(Read::Frame {
            consumed: frame_len,
            message,
        })
    }

    /// Frees the buffer of a reassembled message that the last `read` lent
    /// out, once the caller is done with it, so an idle connection keeps no
    /// buffer (otherwise the next `read` would free it).
    pub fn release(&mut self) {
        if self.partial.as_ref().is_some_and(|p| p.complete) {
            self.partial = None;
        }
    }

    /// true while a fragmented message is in progress.
    pub fn in_message(&self) -> bool {
        self.partial.as_ref().is_some_and(|p| !p.complete)
    }

    /// Bytes allocated for the message being reassembled (its buffer's
    /// capacity, at most `max_message`); 0 when none is. What a caller
    /// reports as memory held in partial input.
    pub fn held_bytes(&self) -> usize {
        self.partial.as_ref().map_or(0, |p| p.data.capacity())
    }

    /// Opens a fragmented message with its first (non-final) fragment.
    fn start_fragmented(
        &mut self,
        text: bool,
        compressed: bool,
        payload: &[u8],
    ) -> Result<(), FrameError> {
        let mut utf8 = Utf8Validator::new();
        if text && !compressed {
            // Checked before allocating: invalid text costs no box.
            utf8.feed(payload)?;
        }
        self.partial = Some(Box::new(Partial {
            data: payload.to_vec(),
            utf8,
            text,
            compressed,
            complete: false,
        }));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A masked client frame of `opcode` (with FIN as given) carrying `payload`.
    fn client_frame(opcode: u8, fin: bool, payload: &[u8]) -> Vec<u8> {
        let mut frame = vec![opcode | if fin { 0x80 } else { 0 }];
        match payload.len() {
            n @ 0..=125 => frame.push(0x80 | n as u8),
            n => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
        }
        // A zero mask leaves the payload as it is.
        frame.extend_from_slice(&[0; 4]);
        frame.extend_from_slice(payload);
        frame
    }

    #[test]
    fn a_message_in_progress_holds_at_most_the_message_limit() {
        let limits = ReadLimits {
            role: Role::Server,
            max_message: 1000,
        };
        let mut reader = MessageReader::new();
        assert_eq!(reader.held_bytes(), 0);
        let mut first = client_frame(0x1, false, &[b'a'; 300]);
        assert!(matches!(
            reader.read(&mut first, &limits),
            Ok(Read::Frame { message: None, .. })
        ));
        let mut held = 300;
        // Vec's own doubling would take 300 → 600 → 1200.
        for _ in 0..6 {
            let mut more = client_frame(0x0, false, &[b'b'; 100]);
            assert!(matches!(
                reader.read(&mut more, &limits),
                Ok(Read::Frame { message: None, .. })
            ));
            held += 100;
            assert!(reader.held_bytes() >= held);
            assert!(reader.held_bytes() <= 1000, "{}", reader.held_bytes());
        }
        let mut last = client_frame(0x0, true, &[b'c'; 100]);
        match reader.read(&mut last, &limits) {
            Ok(Read::Frame {
                message: Some(Message::Text(text)),
                ..
            }) => assert_eq!(text.len(), 1000),
            other => panic!("{other:?}"),
        }
        reader.release();
        assert_eq!(reader.held_bytes(), 0);
    }

    /// RFC 7692 §7.2.3.1: "Hello", compressed, without its tail.
    const HELLO: [u8; 7] = [0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00];
    const COMPRESSED: u8 = 0x40;

    fn deflated(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        super::super::deflate::Deflater::new(1)
            .compress(bytes, &mut out)
            .expect("compressible");
        out
    }

    fn read_one(
        reader: &mut MessageReader,
        mut frame: Vec<u8>,
        inflater: Option<&mut Inflater>,
        max_message: usize,
    ) -> Result<Option<Vec<u8>>, FrameError> {
        let limits = ReadLimits {
            role: Role::Server,
            max_message,
        };
        match reader.read_deflate(&mut frame, &limits, inflater)? {
            Read::Frame {
                message: Some(Message::Text(t)),
                ..
            } => Ok(Some(t.as_bytes().to_vec())),
            Read::Frame {
                message: Some(Message::Binary(b) | Message::Ping(b)),
                ..
            } => Ok(Some(b.to_vec())),
            Read::Frame { message: None, .. } => Ok(None),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn compressed_messages_are_inflated_whole_or_in_fragments() {
        let mut reader = MessageReader::new();
        let mut inflater = Inflater::new();
        let frame = client_frame(COMPRESSED | 0x1, true, &HELLO);
        assert_eq!(
            read_one(&mut reader, frame, Some(&mut inflater), 100),
            Ok(Some(b"Hello".to_vec()))
        );
        // Only the first fragment carries RSV1; a ping may come between.
        let first = client_frame(COMPRESSED | 0x2, false, &HELLO[..3]);
        assert_eq!(
            read_one(&mut reader, first, Some(&mut inflater), 100),
            Ok(None)
        );
        let ping = client_frame(0x9, true, b"p");
        assert_eq!(
            read_one(&mut reader, ping, Some(&mut inflater), 100),
            Ok(Some(b"p".to_vec()))
        );
        let last = client_frame(0x0, true, &HELLO[3..]);
        assert_eq!(
            read_one(&mut reader, last, Some(&mut inflater), 100),
            Ok(Some(b"Hello".to_vec()))
        );
        // Uncompressed messages still pass on a deflate connection.
        let plain = client_frame(0x1, true, b"plain");
        assert_eq!(
            read_one(&mut reader, plain, Some(&mut inflater), 100),
            Ok(Some(b"plain".to_vec()))
        );
    }

    #[test]
    fn compression_rules_are_enforced() {
        let mut inflater = Inflater::new();
        let compressed = || client_frame(COMPRESSED | 0x1, true, &HELLO);
        assert_eq!(
            read_one(&mut MessageReader::new(), compressed(), None, 100),
            Err(FrameError::ReservedBits),
            "RSV1 without negotiation"
        );
        assert_eq!(
            read_one(
                &mut MessageReader::new(),
                client_frame(COMPRESSED | 0x9, true, b""),
                Some(&mut inflater),
                100
            ),
            Err(FrameError::CompressedControlFrame)
        );
        let mut reader = MessageReader::new();
        let first = client_frame(0x1, false, b"a");
        assert_eq!(
            read_one(&mut reader, first, Some(&mut inflater), 100),
            Ok(None)
        );
        assert_eq!(
            read_one(
                &mut reader,
                client_frame(COMPRESSED, true, &HELLO),
                Some(&mut inflater),
                100
            ),
            Err(FrameError::CompressedContinuation)
        );
        let mut lone = |payload: &[u8]| {
            let frame = client_frame(COMPRESSED | 0x1, true, payload);
            read_one(&mut MessageReader::new(), frame, Some(&mut inflater), 100)
        };
        let bomb = deflated(&[b'a'; 200]);
        assert!(bomb.len() < 100);
        assert_eq!(
            lone(&bomb),
            Err(FrameError::InflatedTooBig { limit: 100 }),
            "the inflated size is what the limit holds"
        );
        assert_eq!(lone(&[0xff, 0xff]), Err(FrameError::BadDeflateData));
        // Text is checked once inflated: 0xff is never UTF-8.
        assert_eq!(lone(&deflated(&[0xff; 64])), Err(FrameError::InvalidUtf8));
    }

    #[test]
    fn reader_is_one_pointer() {
        assert_eq!(
            std::mem::size_of::<MessageReader>(),
            std::mem::size_of::<usize>()
        );
    }
}
