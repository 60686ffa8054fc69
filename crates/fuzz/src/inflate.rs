//! permessage-deflate's inflate path (`ws::deflate`, and the reader that
//! calls it), on hostile compressed bytes.
//!
//! Input: a byte choosing the limit, then the payload of one compressed
//! message. Properties: inflating never makes more than the limit allows
//! (a bomb is refused, whatever its ratio); what inflates under a limit
//! inflates the same under a larger one, and what is refused as too big
//! under one is refused or longer than it under a larger one; the same
//! payload in a compressed frame, read by `MessageReader::read_deflate`
//! whole or fragmented, gives that message or that refusal; and the bytes
//! themselves, compressed by the server's deflater, inflate back to them.

use myriad_protocol::ws::deflate::{Deflater, Inflater};
use myriad_protocol::ws::{
    write_frame_header, FrameError, Message, MessageReader, OpCode, Read, ReadLimits, Role,
    COMPRESSED_BIT,
};

/// The limits tried: tiny, around a frame header's lengths, the default.
const LIMITS: [usize; 6] = [0, 1, 125, 1_000, 65_536, 1 << 20];

pub fn check(data: &[u8]) {
    let [settings, payload @ ..] = data else {
        return;
    };
    let limit = LIMITS[usize::from(*settings) % LIMITS.len()];
    let mut inflater = Inflater::new();
    let small = inflater.inflate(payload, limit).map(<[u8]>::to_vec);
    if let Ok(out) = &small {
        assert!(out.len() <= limit, "{} inflated past {limit}", out.len());
    }
    let big = Inflater::new().inflate(payload, 1 << 22).map(<[u8]>::to_vec);
    match (&small, &big) {
        (Ok(a), b) => assert_eq!(Ok(a), b.as_ref(), "a larger limit changed the output"),
        (Err(FrameError::InflatedTooBig { .. }), Ok(b)) => assert!(b.len() > limit),
        (Err(FrameError::InflatedTooBig { .. }), Err(e)) => {
            assert!(matches!(
                e,
                FrameError::InflatedTooBig { .. } | FrameError::BadDeflateData
            ))
        }
        (Err(a), Err(b)) => assert_eq!(a, b),
        (Err(a), Ok(b)) => panic!("refused with {a:?} under {limit}, {} bytes above", b.len()),
    }
    // One frame, then the same split in two fragments: the reader gives
    // the inflated message, or the inflater's refusal.
    let limits = ReadLimits {
        role: Role::Server,
        max_message: limit,
    };
    let whole = read(&[payload], &limits);
    let cut = usize::from(*settings) % (payload.len() + 1);
    let split = read(&[&payload[..cut], &payload[cut..]], &limits);
    if payload.len() <= limit {
        assert_eq!(whole, split, "fragmenting changed the message");
        let expected = small.and_then(|bytes| {
            std::str::from_utf8(&bytes)
                .map(str::to_owned)
                .map_err(|_| FrameError::InvalidUtf8)
        });
        assert_eq!(whole, expected);
    } else {
        // The compressed bytes alone pass the limit: refused on the wire.
        for outcome in [whole, split] {
            assert!(matches!(outcome, Err(FrameError::MessageTooBig { .. })));
        }
    }
    // The payload as plain bytes: compressed and inflated back.
    let mut compressed = Vec::new();
    if Deflater::new(1 + settings % 12).compress(payload, &mut compressed).is_some() {
        let back = Inflater::new().inflate(&compressed, payload.len()).map(<[u8]>::to_vec);
        assert_eq!(back.as_deref(), Ok(payload));
    }
}

/// A compressed text message sent in `fragments` (unmasked by a zero key),
/// read with an inflater: the text, or the refusal.
fn read(fragments: &[&[u8]], limits: &ReadLimits) -> Result<String, FrameError> {
    let mut reader = MessageReader::new();
    let mut inflater = Inflater::new();
    for (at, fragment) in fragments.iter().enumerate() {
        let last = at + 1 == fragments.len();
        let opcode = if at == 0 { OpCode::Text } else { OpCode::Continuation };
        let mut frame = Vec::new();
        write_frame_header(&mut frame, last, opcode, fragment.len(), Some([0; 4]));
        if at == 0 {
            frame[0] |= COMPRESSED_BIT;
        }
        frame.extend_from_slice(fragment);
        match reader.read_deflate(&mut frame, limits, Some(&mut inflater))? {
            Read::Frame {
                message: Some(Message::Text(text)),
                ..
            } => return Ok(text.to_owned()),
            Read::Frame { message: None, .. } if !last => {}
            other => panic!("{other:?}"),
        }
    }
    unreachable!("the last fragment ends the message")
}
