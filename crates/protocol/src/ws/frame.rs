//! One WebSocket frame on the wire (RFC 6455 §5): header parse and encode,
//! masking, close payloads, and [`FrameError`], the one error type of the
//! framing layer.
//!
//! Everything here works on a single frame and keeps no state between calls;
//! message reassembly and the masking rules that depend on which side we are
//! live in [`super::reader`]. Nothing here allocates except the `encode_*`
//! helpers, which return a fresh buffer by design.

use crate::close::CloseReason;

/// The longest possible frame header: 2 fixed bytes, an 8-byte extended
/// length and a 4-byte masking key (RFC 6455 §5.2).
pub const MAX_HEADER_LEN: usize = 14;

/// Control frames carry at most 125 payload bytes, so their length always
/// fits the 7-bit field (RFC 6455 §5.5).
pub const MAX_CONTROL_PAYLOAD: usize = 125;

/// The frame opcodes RFC 6455 §5.2 defines. The reserved values
/// (0x3-0x7 and 0xB-0xF) have no variant: they are rejected at parse time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpCode {
    /// 0x0: a further fragment of the message in progress (§5.4).
    Continuation,
    /// 0x1: the first (or only) frame of a UTF-8 text message.
    Text,
    /// 0x2: the first (or only) frame of a binary message.
    Binary,
    /// 0x8: connection close (§5.5.1).
    Close,
    /// 0x9: ping (§5.5.2).
    Ping,
    /// 0xA: pong (§5.5.3).
    Pong,
}

impl OpCode {
    /// Every opcode, data then control.
    pub const ALL: [OpCode; 6] = [
        OpCode::Continuation,
        OpCode::Text,
        OpCode::Binary,
        OpCode::Close,
        OpCode::Ping,
        OpCode::Pong,
    ];

    /// Control opcodes have the high bit of the nibble set (§5.5). They may
    /// not be fragmented and may appear between fragments of a data message.
    pub fn is_control(self) -> bool {
        self.as_u8() & 0x8 != 0
    }

    /// The opcode for a 4-bit value, or `None` for a reserved one.
    pub fn from_u8(b: u8) -> Option<OpCode> {
        match b {
            0x0 => Some(OpCode::Continuation),
            0x1 => Some(OpCode::Text),
            0x2 => Some(OpCode::Binary),
            0x8 => Some(OpCode::Close),
            0x9 => Some(OpCode::Ping),
            0xA => Some(OpCode::Pong),
            _ => None,
        }
    }

    /// The 4-bit wire value.
    pub fn as_u8(self) -> u8 {
        match self {
            OpCode::Continuation => 0x0,
            OpCode::Text => 0x1,
            OpCode::Binary => 0x2,
            OpCode::Close => 0x8,
            OpCode::Ping => 0x9,
            OpCode::Pong => 0xA,
        }
    }
}

/// A parsed and validated frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// FIN: this is the last frame of its message.
    pub fin: bool,
    /// What the payload is.
    pub opcode: OpCode,
    /// The masking key, present iff the MASK bit was set.
    pub mask: Option<[u8; 4]>,
    /// The payload length as sent; at most 2^63 - 1 (§5.2).
    pub payload_len: u64,
    /// Bytes of header before the payload: 2 to [`MAX_HEADER_LEN`].
    pub header_len: usize,
}

/// Why a frame, or the message it belongs to, was refused. One variant per
/// cause; [`FrameError::close_reason`] maps each to the close code to send.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// An RSV bit was set, but no extension was negotiated (§5.2): RSV2
    /// or RSV3 always, RSV1 without permessage-deflate.
    #[error("reserved bits set without a negotiated extension")]
    ReservedBits,
    /// RSV1 ("compressed") on a control frame (RFC 7692 §6.1).
    #[error("compressed control frame")]
    CompressedControlFrame,
    /// RSV1 on a continuation frame: only a message's first frame carries
    /// it (RFC 7692 §6.1).
    #[error("compressed bit on a continuation frame")]
    CompressedContinuation,
    /// A compressed message whose payload is not valid DEFLATE data
    /// (RFC 7692 §7.2.2: the connection is failed).
    #[error("invalid deflate data")]
    BadDeflateData,
    /// A compressed message that inflates past the limit: refused as soon
    /// as the inflated bytes pass it, never inflated further.
    #[error("compressed message inflates past the limit of {limit}")]
    InflatedTooBig {
        /// The configured maximum.
        limit: usize,
    },
    /// An opcode RFC 6455 reserves for future use (§5.2).
    #[error("reserved opcode {0:#x}")]
    ReservedOpcode(u8),
    /// A control frame without FIN: control frames cannot be fragmented (§5.5).
    #[error("fragmented control frame")]
    FragmentedControlFrame,
    /// A control frame longer than 125 bytes (§5.5).
    #[error("control frame payload of {0} bytes exceeds 125")]
    ControlFrameTooLong(u64),
    /// A 64-bit length with its most significant bit set (§5.2).
    #[error("payload length has its most significant bit set")]
    LengthTooLarge,
    /// A client sent an unmasked frame; servers must refuse it (§5.1).
    #[error("unmasked frame from client")]
    UnmaskedFrame,
    /// A server sent a masked frame; clients must refuse it (§5.1).
    #[error("masked frame from server")]
    MaskedFrame,
    /// A continuation frame arrived with no fragmented message in progress (§5.4).
    #[error("continuation frame without a message in progress")]
    UnexpectedContinuation,
    /// A new text or binary frame arrived while a fragmented message was
    /// still in progress (§5.4).
    #[error("new data frame while a fragmented message is in progress")]
    ExpectedContinuation,
    /// The message (so far, or as announced by a header) exceeds the limit.
    #[error("message of {size} bytes exceeds the limit of {limit}")]
    MessageTooBig {
        /// Bytes the message would have once this frame is added.
        size: u64,
        /// The configured maximum.
        limit: usize,
    },
    /// A text message or close reason that is not valid UTF-8 (§8.1).
    #[error("invalid UTF-8")]
    InvalidUtf8,
    /// A close code that may not be sent on the wire (§7.4).
    #[error("invalid close code {0}")]
    InvalidCloseCode(u16),
    /// A close payload of one byte: a code needs two (§5.5.1).
    #[error("close payload of 1 byte is too short for a status code")]
    ClosePayloadTooShort,
}

impl FrameError {
    /// The close code to answer this error with (§7.4.1).
    pub fn close_reason(&self) -> CloseReason {
        match self {
            FrameError::InvalidUtf8 => CloseReason::InvalidUtf8,
            FrameError::MessageTooBig { .. } | FrameError::InflatedTooBig { .. } => {
                CloseReason::MessageTooBig
            }
            FrameError::ReservedBits
            | FrameError::CompressedControlFrame
            | FrameError::CompressedContinuation
            | FrameError::BadDeflateData
            | FrameError::ReservedOpcode(_)
            | FrameError::FragmentedControlFrame
            | FrameError::ControlFrameTooLong(_)
            | FrameError::LengthTooLarge
            | FrameError::UnmaskedFrame
            | FrameError::MaskedFrame
            | FrameError::UnexpectedContinuation
            | FrameError::ExpectedContinuation
            | FrameError::InvalidCloseCode(_)
            | FrameError::ClosePayloadTooShort => CloseReason::ProtocolError,
        }
    }
}

// Bits of the first two header bytes (§5.2).
const FIN_BIT: u8 = 0x80;
const RSV_BITS: u8 = 0x70;
/// RSV1, which permessage-deflate names "Per-Message Compressed" (RFC 7692 §6).
pub const COMPRESSED_BIT: u8 = 0x40;
const OPCODE_BITS: u8 = 0x0F;
const MASK_BIT: u8 = 0x80;
const LEN_BITS: u8 = 0x7F;
/// 7-bit length values that announce a 16-bit or 64-bit extended length.
const LEN_16: u8 = 126;
const LEN_64: u8 = 127;

/// Parses the frame header at the front of `buf`.
///
/// `Ok(None)` means `buf` does not hold the whole header yet; that is the
/// normal state of a stream, not an error. Errors that the first byte alone
/// proves (reserved bits, reserved opcode, fragmented control frame) are
/// reported as soon as that byte is present, so a broken peer is cut off
/// without waiting for more input.
///
/// Validates: RSV1-3 are 0 (see [`parse_frame_header_deflate`] for a
/// connection with permessage-deflate), the opcode is
/// not reserved, control frames have FIN and at most 125 bytes, and a 64-bit
/// length has its top bit clear. Whether the frame must be masked depends on
/// the role and is checked by the reader. Non-minimal length encodings are
/// accepted: §5.2's "minimal number of bytes" binds the sender, and refusing
/// them would protect nothing.
pub fn parse_frame_header(buf: &[u8]) -> Result<Option<FrameHeader>, FrameError> {
    Ok(parse_frame_header_deflate(buf, false)?.map(|(header, _)| header))
}

/// [`parse_frame_header`] on a connection that may have negotiated
/// permessage-deflate (`deflate`): RSV1 is then allowed on the first frame
/// of a data message and reported as the second value ("compressed"), and
/// refused on control and continuation frames (RFC 7692 §6.1). RSV2 and
/// RSV3 are always refused.
pub fn parse_frame_header_deflate(
    buf: &[u8],
    deflate: bool,
) -> Result<Option<(FrameHeader, bool)>, FrameError> {
    let Some(&b0) = buf.first() else {
        return Ok(None);
    };
    let compressed = b0 & COMPRESSED_BIT != 0;
    if b0 & RSV_BITS & !COMPRESSED_BIT != 0 || (compressed && !deflate) {
        return Err(FrameError::ReservedBits);
    }
    let raw_opcode = b0 & OPCODE_BITS;
    let opcode = OpCode::from_u8(raw_opcode).ok_or(FrameError::ReservedOpcode(raw_opcode))?;
    let fin = b0 & FIN_BIT != 0;
    if opcode.is_control() && !fin {
        return Err(FrameError::FragmentedControlFrame);
    }
    if compressed && opcode.is_control() {
        return Err(FrameError::CompressedControlFrame);
    }
    if compressed && opcode == OpCode::Continuation {
        return Err(FrameError::CompressedContinuation);
    }

    let Some(&b1) = buf.get(1) else {
        return Ok(None);
    };
    let masked = b1 & MASK_BIT != 0;
    let (payload_len, mut header_len) = match b1 & LEN_BITS {
        LEN_16 => match buf.get(2..4) {
            Some(b) => (u64::from(u16::from_be_bytes([b[0], b[1]])), 4),
            None => return Ok(None),
        },
        LEN_64 => match buf.get(2..10) {
            Some(b) => {
                let mut be = [0u8; 8];
                be.copy_from_slice(b);
                let len = u64::from_be_bytes(be);
                if len >> 63 != 0 {
                    return Err(FrameError::LengthTooLarge);
                }
                (len, 10)
            }
            None => return Ok(None),
        },
        short => (u64::from(short), 2),
    };
    // Checked once the full length is known, so the error names the real
    // length whatever the chunking of the input.
    if opcode.is_control() && payload_len > MAX_CONTROL_PAYLOAD as u64 {
        return Err(FrameError::ControlFrameTooLong(payload_len));
    }

    let mask = if masked {
        let Some(key) = buf.get(header_len..header_len + 4) else {
            return Ok(None);
        };
        header_len += 4;
        Some([key[0], key[1], key[2], key[3]])
    } else {
        None
    };

    Ok(Some((
        FrameHeader {
            fin,
            opcode,
            mask,
            payload_len,
            header_len,
        },
        compressed,
    )))
}

/// XORs `data` with the masking key in place (§5.3). Masking and unmasking
/// are the same operation.
///
/// `data[0]` is taken to be payload byte 0, i.e. the key is applied from its
/// first byte. The bulk runs eight bytes per step on a `u64`: every 8-byte
/// chunk starts at an offset divisible by 4, so one doubled key lines up with
/// every chunk, and the loop is simple enough for the compiler to vectorise.
pub fn apply_mask(data: &mut [u8], mask: [u8; 4]) {
    let [m0, m1, m2, m3] = mask;
    // Native byte order on both sides: the key is laid out in memory exactly
    // as the bytes it covers, whatever the platform's endianness.
    let wide = u64::from_ne_bytes([m0, m1, m2, m3, m0, m1, m2, m3]);
    let mut chunks = data.chunks_exact_mut(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        chunk.copy_from_slice(&(u64::from_ne_bytes(word) ^ wide).to_ne_bytes());
    }
    // The tail also starts at a multiple of 8, hence of 4: key index = i % 4.
    for (i, byte) in chunks.into_remainder().iter_mut().enumerate() {
        *byte ^= mask[i & 3];
    }
}

/// Appends a frame header to `out`, using the shortest length encoding
/// (§5.2). RSV bits are always 0.
pub fn write_frame_header(
    out: &mut Vec<u8>,
    fin: bool,
    opcode: OpCode,
    payload_len: usize,
    mask: Option<[u8; 4]>,
) {
    let b0 = if fin { FIN_BIT } else { 0 } | opcode.as_u8();
    let mask_bit = if mask.is_some() { MASK_BIT } else { 0 };
    out.push(b0);
    if payload_len < usize::from(LEN_16) {
        // Fits the 7-bit field: the cast cannot truncate.
        out.push(mask_bit | payload_len as u8);
    } else if let Ok(len) = u16::try_from(payload_len) {
        out.push(mask_bit | LEN_16);
        out.extend_from_slice(&len.to_be_bytes());
    } else {
        out.push(mask_bit | LEN_64);
        out.extend_from_slice(&(payload_len as u64).to_be_bytes());
    }
    if let Some(key) = mask {
        out.extend_from_slice(&key);
    }
}

/// Encodes one whole, final (FIN) frame. With `Some(mask)` the payload copy
/// is masked, as a client must do (§5.3); the caller's `payload` is not
/// touched.
pub fn encode_frame(opcode: OpCode, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAX_HEADER_LEN + payload.len());
    write_frame_header(&mut out, true, opcode, payload.len(), mask);
    let start = out.len();
    out.extend_from_slice(payload);
    if let Some(key) = mask {
        apply_mask(&mut out[start..], key);
    }
    out
}

/// Encodes a close frame carrying `code` and `reason` (§5.5.1). The reason is
/// cut at the last character boundary that keeps the payload within 125
/// bytes, so the frame is always valid UTF-8 and a valid control frame.
/// The code is sent as given: choosing a sendable one is the caller's job.
pub fn encode_close(code: u16, reason: &str, mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut cut = reason.len().min(MAX_CONTROL_PAYLOAD - 2);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut payload = [0u8; MAX_CONTROL_PAYLOAD];
    payload[..2].copy_from_slice(&code.to_be_bytes());
    payload[2..2 + cut].copy_from_slice(&reason.as_bytes()[..cut]);
    encode_frame(OpCode::Close, &payload[..2 + cut], mask)
}

/// Whether a peer may send `code` in a close frame (§7.4.1, §7.4.2, and the
/// IANA registry RFC 6455 §11.7 set up).
///
/// - 1000-1003 and 1007-1011 are RFC 6455 codes; 1012-1014 were registered
///   with IANA afterwards (service restart, try again later, bad gateway).
/// - 1004 is reserved, and 1005, 1006 and 1015 are "MUST NOT be set as a
///   status code in a Close control frame" (§7.4.1): they only exist as
///   local reports.
/// - Anything else below 3000 is reserved for future RFCs (§7.4.2), so a
///   peer using one is speaking a protocol we do not know.
/// - 3000-4999 are for libraries, frameworks and applications (§7.4.2).
///
/// This matches Autobahn cases 7.7.x (valid) and 7.9.x (invalid).
fn is_valid_close_code(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

/// Parses and validates a close frame's payload (§5.5.1, §7.4).
///
/// An empty payload means "no status code" and gives `Ok(None)`; otherwise
/// the first two bytes are the code (big-endian) and the rest a UTF-8 reason.
pub fn parse_close_payload(payload: &[u8]) -> Result<Option<(u16, &str)>, FrameError> {
    match payload {
        [] => Ok(None),
        [_] => Err(FrameError::ClosePayloadTooShort),
        _ if payload.len() > MAX_CONTROL_PAYLOAD => {
            Err(FrameError::ControlFrameTooLong(payload.len() as u64))
        }
        [hi, lo, reason @ ..] => {
            let code = u16::from_be_bytes([*hi, *lo]);
            if !is_valid_close_code(code) {
                return Err(FrameError::InvalidCloseCode(code));
            }
            let reason = std::str::from_utf8(reason).map_err(|_| FrameError::InvalidUtf8)?;
            Ok(Some((code, reason)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcode_roundtrip_and_control_bit() {
        for b in 0..16u8 {
            match OpCode::from_u8(b) {
                Some(op) => {
                    assert_eq!(op.as_u8(), b);
                    assert_eq!(op.is_control(), b >= 8);
                }
                None => assert!(matches!(b, 3..=7 | 11..=15)),
            }
        }
        let known: Vec<OpCode> = (0..16).filter_map(OpCode::from_u8).collect();
        assert_eq!(known, OpCode::ALL);
    }

    #[test]
    fn apply_mask_matches_bytewise_definition_at_every_length() {
        let key = [0x37, 0xfa, 0x21, 0x3d];
        for len in 0..40 {
            let data: Vec<u8> = (0..len as u8).collect();
            let mut fast = data.clone();
            apply_mask(&mut fast, key);
            let slow: Vec<u8> = data
                .iter()
                .enumerate()
                .map(|(i, b)| b ^ key[i % 4])
                .collect();
            assert_eq!(fast, slow, "len {len}");
        }
    }

    #[test]
    fn header_lengths_use_minimal_encoding() {
        for (len, header) in [(0, 2), (125, 2), (126, 4), (65535, 4), (65536, 10)] {
            let mut out = Vec::new();
            write_frame_header(&mut out, true, OpCode::Binary, len, None);
            assert_eq!(out.len(), header, "len {len}");
            let mut masked = Vec::new();
            write_frame_header(&mut masked, true, OpCode::Binary, len, Some([1, 2, 3, 4]));
            assert_eq!(masked.len(), header + 4, "len {len}");
        }
    }

    #[test]
    fn close_reason_mapping() {
        assert_eq!(
            FrameError::InvalidUtf8.close_reason(),
            CloseReason::InvalidUtf8
        );
        assert_eq!(
            FrameError::MessageTooBig { size: 2, limit: 1 }.close_reason(),
            CloseReason::MessageTooBig
        );
        assert_eq!(
            FrameError::ReservedBits.close_reason(),
            CloseReason::ProtocolError
        );
    }

    #[test]
    fn encode_close_truncates_on_char_boundary() {
        // 62 two-byte characters = 124 bytes; only 123 fit after the code.
        let reason = "é".repeat(62);
        let frame = encode_close(1000, &reason, None);
        assert_eq!(frame[1] as usize, 2 + 122);
        let parsed = parse_close_payload(&frame[2..]).unwrap().unwrap();
        assert_eq!(parsed, (1000, &reason[..122]));
    }
}
