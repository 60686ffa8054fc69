//! Literal byte-vector tests for RFC 6455 framing: the §5.7 examples, every
//! header rule, fragmentation, UTF-8, close payloads, size limits and
//! byte-at-a-time input.

mod common;

use common::{client_frame, feed_in_chunks, push_frame, read_all, read_once, Owned, Step};
use common::{CLIENT, SERVER};
use myriad_protocol::close::CloseReason;
use myriad_protocol::ws::*;

const RFC_MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

fn text(s: &str) -> Owned {
    Owned::Text(s.to_owned())
}

// ---------------------------------------------------------------------------
// RFC 6455 §5.7 examples

#[test]
fn rfc_single_frame_unmasked_text() {
    let bytes = [0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f];
    assert_eq!(encode_frame(OpCode::Text, b"Hello", None), bytes);
    assert_eq!(
        parse_frame_header(&bytes),
        Ok(Some(FrameHeader {
            fin: true,
            opcode: OpCode::Text,
            mask: None,
            payload_len: 5,
            header_len: 2,
        }))
    );
    let mut reader = MessageReader::new();
    assert_eq!(
        read_once(&mut reader, &bytes, &CLIENT),
        Ok(Step::Frame(7, Some(text("Hello"))))
    );
}

#[test]
fn rfc_single_frame_masked_text() {
    let bytes = [
        0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58,
    ];
    assert_eq!(encode_frame(OpCode::Text, b"Hello", Some(RFC_MASK)), bytes);
    let header = parse_frame_header(&bytes).unwrap().unwrap();
    assert_eq!(header.mask, Some(RFC_MASK));
    assert_eq!(header.header_len, 6);

    // The payload is unmasked in place and borrowed from the caller's buffer.
    let mut buf = bytes.to_vec();
    let mut reader = MessageReader::new();
    let read = reader.read(&mut buf, &SERVER).unwrap();
    assert_eq!(
        read,
        Read::Frame {
            consumed: 11,
            message: Some(Message::Text("Hello")),
        }
    );
    assert_eq!(&buf[6..], b"Hello");
}

#[test]
fn rfc_fragmented_unmasked_text() {
    let first = [0x01, 0x03, 0x48, 0x65, 0x6c];
    let last = [0x80, 0x02, 0x6c, 0x6f];
    let mut reader = MessageReader::new();
    assert!(!reader.in_message());
    assert_eq!(
        read_once(&mut reader, &first, &CLIENT),
        Ok(Step::Frame(5, None))
    );
    assert!(reader.in_message());
    assert_eq!(
        read_once(&mut reader, &last, &CLIENT),
        Ok(Step::Frame(4, Some(text("Hello"))))
    );
    assert!(!reader.in_message());
    // The reader is reusable for the next message.
    assert_eq!(
        read_once(&mut reader, &[0x81, 0x01, b'x'], &CLIENT),
        Ok(Step::Frame(3, Some(text("x"))))
    );
}

#[test]
fn rfc_ping_and_masked_pong() {
    let ping = [0x89, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f];
    assert_eq!(encode_frame(OpCode::Ping, b"Hello", None), ping);
    assert_eq!(
        read_all(&ping, &CLIENT),
        Ok(vec![Owned::Ping(b"Hello".to_vec())])
    );

    let pong = [
        0x8a, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58,
    ];
    assert_eq!(encode_frame(OpCode::Pong, b"Hello", Some(RFC_MASK)), pong);
    assert_eq!(
        read_all(&pong, &SERVER),
        Ok(vec![Owned::Pong(b"Hello".to_vec())])
    );
}

#[test]
fn rfc_256_byte_binary_uses_16_bit_length() {
    let payload: Vec<u8> = (0..=255).collect();
    let frame = encode_frame(OpCode::Binary, &payload, None);
    assert_eq!(&frame[..4], &[0x82, 0x7E, 0x01, 0x00]);
    assert_eq!(frame.len(), 4 + 256);
    let header = parse_frame_header(&frame).unwrap().unwrap();
    assert_eq!((header.payload_len, header.header_len), (256, 4));
    assert_eq!(read_all(&frame, &CLIENT), Ok(vec![Owned::Binary(payload)]));
}

#[test]
fn rfc_64k_binary_uses_64_bit_length() {
    let payload: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    let frame = encode_frame(OpCode::Binary, &payload, None);
    assert_eq!(
        &frame[..10],
        &[0x82, 0x7F, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00]
    );
    assert_eq!(frame.len(), 10 + 65536);
    let header = parse_frame_header(&frame).unwrap().unwrap();
    assert_eq!((header.payload_len, header.header_len), (65536, 10));
    assert_eq!(read_all(&frame, &CLIENT), Ok(vec![Owned::Binary(payload)]));

    // Masked, as a client sends it: the header grows by the 4-byte key.
    let masked = encode_frame(
        OpCode::Binary,
        &(0..65535u32).map(|i| i as u8).collect::<Vec<_>>(),
        Some(RFC_MASK),
    );
    assert_eq!(
        &masked[..8],
        &[0x82, 0xFE, 0xFF, 0xFF, 0x37, 0xfa, 0x21, 0x3d]
    );
}

// ---------------------------------------------------------------------------
// Header rules

#[test]
fn header_needs_more_bytes_is_not_an_error() {
    assert_eq!(parse_frame_header(&[]), Ok(None));
    assert_eq!(parse_frame_header(&[0x81]), Ok(None));
    assert_eq!(parse_frame_header(&[0x82, 0x7E, 0x01]), Ok(None));
    assert_eq!(
        parse_frame_header(&[0x82, 0x7F, 0, 0, 0, 0, 0, 1]),
        Ok(None)
    );
    assert_eq!(parse_frame_header(&[0x82, 0x85, 1, 2, 3]), Ok(None));
    assert_eq!(
        parse_frame_header(&[0x82, 0x85, 1, 2, 3, 4])
            .unwrap()
            .unwrap()
            .header_len,
        6
    );
    assert_eq!(
        parse_frame_header(&[0x82, 0xFF, 0, 0, 0, 0, 0, 1, 0, 0, 9, 9, 9, 9])
            .unwrap()
            .unwrap()
            .header_len,
        MAX_HEADER_LEN
    );
}

#[test]
fn reserved_bits_rejected_from_the_first_byte() {
    for rsv in [0x40, 0x20, 0x10, 0x70] {
        let b0 = 0x81 | rsv;
        assert_eq!(parse_frame_header(&[b0]), Err(FrameError::ReservedBits));
        assert_eq!(
            parse_frame_header(&[b0, 0x00]),
            Err(FrameError::ReservedBits)
        );
        let mut reader = MessageReader::new();
        let err = read_once(&mut reader, &[b0, 0x80, 1, 2, 3, 4], &SERVER).unwrap_err();
        assert_eq!(err, FrameError::ReservedBits);
        assert_eq!(err.close_reason(), CloseReason::ProtocolError);
    }
}

#[test]
fn reserved_opcodes_rejected() {
    for op in (0x3..=0x7).chain(0xB..=0xF) {
        assert_eq!(
            parse_frame_header(&[0x80 | op, 0x00]),
            Err(FrameError::ReservedOpcode(op))
        );
        assert_eq!(
            parse_frame_header(&[0x80 | op]),
            Err(FrameError::ReservedOpcode(op))
        );
    }
}

#[test]
fn control_frame_too_long() {
    // 126 announced through the 16-bit extended length: an error once known.
    assert_eq!(parse_frame_header(&[0x89, 0x7E]), Ok(None));
    assert_eq!(
        parse_frame_header(&[0x89, 0x7E, 0x00, 0x7E]),
        Err(FrameError::ControlFrameTooLong(126))
    );
    for op in [0x88, 0x89, 0x8A] {
        assert_eq!(
            parse_frame_header(&[op, 0x7F, 0, 0, 0, 0, 0, 1, 0, 0]),
            Err(FrameError::ControlFrameTooLong(65536))
        );
    }
    // 125 is the maximum and fine.
    let ping = encode_frame(OpCode::Ping, &[7; MAX_CONTROL_PAYLOAD], None);
    assert_eq!(
        read_all(&ping, &CLIENT),
        Ok(vec![Owned::Ping(vec![7; MAX_CONTROL_PAYLOAD])])
    );
}

#[test]
fn fragmented_control_frame_rejected() {
    for op in [0x08, 0x09, 0x0A] {
        assert_eq!(
            parse_frame_header(&[op]),
            Err(FrameError::FragmentedControlFrame)
        );
        assert_eq!(
            parse_frame_header(&[op, 0x00]),
            Err(FrameError::FragmentedControlFrame)
        );
    }
}

#[test]
fn length_with_top_bit_rejected() {
    let header = [0x82, 0x7F, 0x80, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(parse_frame_header(&header), Err(FrameError::LengthTooLarge));
    // The largest legal length still parses (and is left to the size limit).
    let max = [0x82, 0x7F, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF];
    assert_eq!(
        parse_frame_header(&max).unwrap().unwrap().payload_len,
        u64::MAX >> 1
    );
}

#[test]
fn masking_rules_by_role() {
    let unmasked = encode_frame(OpCode::Text, b"Hello", None);
    let err = read_all(&unmasked, &SERVER).unwrap_err();
    assert_eq!(err, FrameError::UnmaskedFrame);
    assert_eq!(err.close_reason(), CloseReason::ProtocolError);
    // Control frames too.
    assert_eq!(
        read_all(&encode_frame(OpCode::Ping, b"", None), &SERVER),
        Err(FrameError::UnmaskedFrame)
    );

    let masked = encode_frame(OpCode::Text, b"Hello", Some(RFC_MASK));
    assert_eq!(read_all(&masked, &CLIENT), Err(FrameError::MaskedFrame));
}

// ---------------------------------------------------------------------------
// Fragmentation (§5.4)

#[test]
fn ping_interleaved_in_fragmented_text() {
    let mut stream = Vec::new();
    stream.extend(client_frame(false, OpCode::Text, b"Hel"));
    stream.extend(client_frame(true, OpCode::Ping, b"are you there"));
    stream.extend(client_frame(false, OpCode::Continuation, b"l"));
    stream.extend(client_frame(true, OpCode::Pong, b""));
    stream.extend(client_frame(true, OpCode::Continuation, b"o"));
    assert_eq!(
        read_all(&stream, &SERVER),
        Ok(vec![
            Owned::Ping(b"are you there".to_vec()),
            Owned::Pong(vec![]),
            text("Hello"),
        ])
    );

    // Step by step: the ping comes back at once, mid-message.
    let mut reader = MessageReader::new();
    let first = client_frame(false, OpCode::Text, b"Hel");
    assert_eq!(
        read_once(&mut reader, &first, &SERVER),
        Ok(Step::Frame(first.len(), None))
    );
    let ping = client_frame(true, OpCode::Ping, b"p");
    assert_eq!(
        read_once(&mut reader, &ping, &SERVER),
        Ok(Step::Frame(ping.len(), Some(Owned::Ping(b"p".to_vec()))))
    );
    assert!(reader.in_message());
}

#[test]
fn close_interleaved_in_fragmented_binary() {
    let mut stream = Vec::new();
    stream.extend(client_frame(false, OpCode::Binary, &[1, 2]));
    stream.extend(encode_close(1001, "bye", Some([9, 8, 7, 6])));
    assert_eq!(
        read_all(&stream, &SERVER),
        Ok(vec![Owned::Close(Some((1001, "bye".to_owned())))])
    );
}

#[test]
fn fragmented_binary_with_empty_fragments() {
    let mut stream = Vec::new();
    stream.extend(client_frame(false, OpCode::Binary, b""));
    stream.extend(client_frame(false, OpCode::Continuation, &[1, 2, 3]));
    stream.extend(client_frame(false, OpCode::Continuation, b""));
    stream.extend(client_frame(true, OpCode::Continuation, &[4]));
    assert_eq!(
        read_all(&stream, &SERVER),
        Ok(vec![Owned::Binary(vec![1, 2, 3, 4])])
    );
}

#[test]
fn continuation_without_start() {
    for fin in [true, false] {
        let frame = client_frame(fin, OpCode::Continuation, b"x");
        assert_eq!(
            read_all(&frame, &SERVER),
            Err(FrameError::UnexpectedContinuation)
        );
    }
    // Also after a message has completed.
    let mut stream = client_frame(false, OpCode::Text, b"a");
    stream.extend(client_frame(true, OpCode::Continuation, b"b"));
    stream.extend(client_frame(true, OpCode::Continuation, b"c"));
    assert_eq!(
        read_all(&stream, &SERVER),
        Err(FrameError::UnexpectedContinuation)
    );
}

#[test]
fn new_message_while_fragmented() {
    for (op, fin) in [
        (OpCode::Text, true),
        (OpCode::Text, false),
        (OpCode::Binary, true),
        (OpCode::Binary, false),
    ] {
        let mut stream = client_frame(false, OpCode::Text, b"a");
        stream.extend(client_frame(fin, op, b"b"));
        let err = read_all(&stream, &SERVER).unwrap_err();
        assert_eq!(err, FrameError::ExpectedContinuation);
        assert_eq!(err.close_reason(), CloseReason::ProtocolError);
    }
}

#[test]
fn sequencing_errors_come_from_the_header_alone() {
    // Only the header of the offending frame is present: no payload needed.
    let mut reader = MessageReader::new();
    let first = client_frame(false, OpCode::Binary, b"abc");
    assert_eq!(
        read_once(&mut reader, &first, &SERVER),
        Ok(Step::Frame(first.len(), None))
    );
    let second = client_frame(true, OpCode::Binary, &[0; 1000]);
    assert_eq!(
        read_once(&mut reader, &second[..8], &SERVER),
        Err(FrameError::ExpectedContinuation)
    );
}

// ---------------------------------------------------------------------------
// UTF-8 (§8.1)

#[test]
fn valid_utf8_in_one_frame() {
    for s in [
        "",
        "a",
        "é",
        "€",
        "𝄞",
        "κόσμε",
        "\u{10FFFF}",
        "\u{FFFF}",
        "\u{E000}",
    ] {
        let frame = client_frame(true, OpCode::Text, s.as_bytes());
        assert_eq!(read_all(&frame, &SERVER), Ok(vec![text(s)]), "{s:?}");
    }
}

const INVALID_UTF8: &[&[u8]] = &[
    &[0xC0, 0xAF],             // overlong '/'
    &[0xC1, 0xBF],             // overlong U+007F
    &[0xE0, 0x80, 0xAF],       // overlong '/' in 3 bytes
    &[0xE0, 0x9F, 0xBF],       // overlong U+07FF
    &[0xF0, 0x80, 0x80, 0xAF], // overlong '/' in 4 bytes
    &[0xF0, 0x8F, 0xBF, 0xBF], // overlong U+FFFF
    &[0xED, 0xA0, 0x80],       // U+D800, a surrogate
    &[0xED, 0xBF, 0xBF],       // U+DFFF, a surrogate
    &[0xF4, 0x90, 0x80, 0x80], // U+110000
    &[0xF5, 0x80, 0x80, 0x80], // lead byte beyond U+10FFFF
    &[0xFF],
    &[0xFE],
    &[0x80],       // lone continuation byte
    &[0xC2],       // truncated 2-byte sequence
    &[0xE2, 0x82], // truncated '€'
    &[0xF0, 0x9D, 0x84],
    &[0xC2, 0x41], // continuation replaced by ASCII
    // Autobahn 6.3.1: "κόσμε", a surrogate, "edited".
    &[
        0xCE, 0xBA, 0xE1, 0xBD, 0xB9, 0xCF, 0x83, 0xCE, 0xBC, 0xCE, 0xB5, 0xED, 0xA0, 0x80, 0x65,
        0x64, 0x69, 0x74, 0x65, 0x64,
    ],
];

#[test]
fn invalid_utf8_in_one_frame() {
    for bytes in INVALID_UTF8 {
        let frame = client_frame(true, OpCode::Text, bytes);
        let err = read_all(&frame, &SERVER).unwrap_err();
        assert_eq!(err, FrameError::InvalidUtf8, "{bytes:02x?}");
        assert_eq!(err.close_reason(), CloseReason::InvalidUtf8);
        // Binary messages carry any bytes.
        let frame = client_frame(true, OpCode::Binary, bytes);
        assert_eq!(
            read_all(&frame, &SERVER),
            Ok(vec![Owned::Binary(bytes.to_vec())])
        );
    }
}

#[test]
fn invalid_utf8_split_at_every_position() {
    for bytes in INVALID_UTF8 {
        for cut in 0..=bytes.len() {
            let mut stream = client_frame(false, OpCode::Text, &bytes[..cut]);
            stream.extend(client_frame(true, OpCode::Continuation, &bytes[cut..]));
            assert_eq!(
                read_all(&stream, &SERVER),
                Err(FrameError::InvalidUtf8),
                "{bytes:02x?} cut at {cut}"
            );
        }
    }
}

#[test]
fn utf8_sequence_split_across_fragments_at_every_position() {
    let s = "a\u{e9}\u{20ac}\u{1d11e}z\u{10FFFF}";
    let bytes = s.as_bytes();
    for i in 0..=bytes.len() {
        let mut stream = client_frame(false, OpCode::Text, &bytes[..i]);
        stream.extend(client_frame(true, OpCode::Continuation, &bytes[i..]));
        assert_eq!(read_all(&stream, &SERVER), Ok(vec![text(s)]), "cut {i}");
        for j in i..=bytes.len() {
            let mut stream = client_frame(false, OpCode::Text, &bytes[..i]);
            stream.extend(client_frame(false, OpCode::Continuation, &bytes[i..j]));
            stream.extend(client_frame(true, OpCode::Ping, b""));
            stream.extend(client_frame(true, OpCode::Continuation, &bytes[j..]));
            assert_eq!(
                read_all(&stream, &SERVER),
                Ok(vec![Owned::Ping(vec![]), text(s)]),
                "cuts {i} {j}"
            );
        }
    }
}

#[test]
fn invalid_utf8_detected_before_the_final_fragment() {
    // Autobahn 6.4.1-6.4.4: the error must come with the fragment that holds
    // the bad bytes, while the message is still open.
    let cases: &[&[u8]] = &[
        &[b'a', 0xF4, 0x90], // only the start of a code point > U+10FFFF
        &[0xED, 0xA0],       // only the start of a surrogate
        &[b'o', b'k', 0xFF],
        &[0xC0],
    ];
    for bad in cases {
        let mut reader = MessageReader::new();
        assert_eq!(
            read_once(
                &mut reader,
                &client_frame(false, OpCode::Text, bad),
                &SERVER
            ),
            Err(FrameError::InvalidUtf8),
            "{bad:02x?}"
        );
        // Same, with the bad bytes in a non-final continuation.
        let mut reader = MessageReader::new();
        let first = client_frame(false, OpCode::Text, "κόσμε".as_bytes());
        assert_eq!(
            read_once(&mut reader, &first, &SERVER),
            Ok(Step::Frame(first.len(), None))
        );
        assert_eq!(
            read_once(
                &mut reader,
                &client_frame(false, OpCode::Continuation, bad),
                &SERVER
            ),
            Err(FrameError::InvalidUtf8),
            "{bad:02x?}"
        );
    }
}

#[test]
fn utf8_truncated_at_end_of_message() {
    let mut reader = MessageReader::new();
    let first = client_frame(false, OpCode::Text, &[b'a', 0xE2, 0x82]);
    // A valid prefix is fine while the message is open...
    assert_eq!(
        read_once(&mut reader, &first, &SERVER),
        Ok(Step::Frame(first.len(), None))
    );
    // ...but not at its end.
    assert_eq!(
        read_once(
            &mut reader,
            &client_frame(true, OpCode::Continuation, b""),
            &SERVER
        ),
        Err(FrameError::InvalidUtf8)
    );
}

#[test]
fn utf8_validator_directly() {
    let mut v = Utf8Validator::default();
    for b in "𝄞".bytes() {
        v.feed(&[b]).unwrap();
    }
    v.finish().unwrap();
    let mut v = Utf8Validator::default();
    v.feed(&[0xF0, 0x9D]).unwrap();
    assert_eq!(v.finish(), Err(FrameError::InvalidUtf8));
    assert_eq!(v.feed(&[0x84, 0x9E, b'x']), Ok(()));
    assert_eq!(v.finish(), Ok(()));
}

// ---------------------------------------------------------------------------
// Close payloads (§5.5.1, §7.4)

#[test]
fn close_codes_valid() {
    for code in [
        1000u16, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 3000, 3999,
        4000, 4001, 4500, 4999,
    ] {
        let mut payload = code.to_be_bytes().to_vec();
        payload.extend_from_slice(b"reason");
        assert_eq!(
            parse_close_payload(&payload),
            Ok(Some((code, "reason"))),
            "{code}"
        );
        let frame = encode_close(code, "", Some(RFC_MASK));
        assert_eq!(
            read_all(&frame, &SERVER),
            Ok(vec![Owned::Close(Some((code, String::new())))])
        );
    }
}

#[test]
fn close_codes_invalid() {
    for code in [
        0u16, 1, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535,
    ] {
        let err = parse_close_payload(&code.to_be_bytes()).unwrap_err();
        assert_eq!(err, FrameError::InvalidCloseCode(code));
        assert_eq!(err.close_reason(), CloseReason::ProtocolError);
        let frame = encode_close(code, "x", Some(RFC_MASK));
        assert_eq!(
            read_all(&frame, &SERVER),
            Err(FrameError::InvalidCloseCode(code))
        );
    }
}

#[test]
fn close_payload_shapes() {
    assert_eq!(parse_close_payload(&[]), Ok(None));
    assert_eq!(
        read_all(&client_frame(true, OpCode::Close, &[]), &SERVER),
        Ok(vec![Owned::Close(None)])
    );
    assert_eq!(
        parse_close_payload(&[0x03]),
        Err(FrameError::ClosePayloadTooShort)
    );
    assert_eq!(
        read_all(&client_frame(true, OpCode::Close, &[0x03]), &SERVER),
        Err(FrameError::ClosePayloadTooShort)
    );
    // 1000 with an invalid UTF-8 reason (Autobahn 7.5.1).
    let err = parse_close_payload(&[0x03, 0xE8, b'a', 0xFF]).unwrap_err();
    assert_eq!(err, FrameError::InvalidUtf8);
    assert_eq!(err.close_reason(), CloseReason::InvalidUtf8);
    assert_eq!(
        read_all(
            &client_frame(true, OpCode::Close, &[0x03, 0xE8, 0xED, 0xA0, 0x80]),
            &SERVER
        ),
        Err(FrameError::InvalidUtf8)
    );
    assert_eq!(
        parse_close_payload(&[0x03, 0xE8, 0xCE, 0xBA]),
        Ok(Some((1000, "κ")))
    );
}

#[test]
fn encode_close_layout() {
    assert_eq!(
        encode_close(1000, "bye", None),
        [0x88, 0x05, 0x03, 0xE8, b'b', b'y', b'e']
    );
    let long = "x".repeat(500);
    let frame = encode_close(4500, &long, None);
    assert_eq!(frame.len(), 2 + MAX_CONTROL_PAYLOAD);
    assert_eq!(
        parse_close_payload(&frame[2..]),
        Ok(Some((4500, &long[..123])))
    );
    for reason in CloseReason::ALL {
        if matches!(reason.ws_code(), 1005 | 1006 | 1015) {
            // Local reports, never sent in a close frame (§7.4.1).
            continue;
        }
        let frame = encode_close(reason.ws_code(), reason.text(), Some(RFC_MASK));
        assert_eq!(
            read_all(&frame, &SERVER),
            Ok(vec![Owned::Close(Some((
                reason.ws_code(),
                reason.text().to_owned()
            )))])
        );
    }
}

// ---------------------------------------------------------------------------
// Size limit

#[test]
fn max_message_exceeded_by_a_single_header() {
    let limits = ReadLimits {
        role: Role::Server,
        max_message: 1024,
    };
    // A hostile 2^62-byte length fails on the header alone: nothing is
    // buffered or allocated for it.
    let header = [
        0x82, 0xFF, 0x40, 0, 0, 0, 0, 0, 0, 0, 0x01, 0x02, 0x03, 0x04,
    ];
    let mut reader = MessageReader::new();
    let err = read_once(&mut reader, &header, &limits).unwrap_err();
    assert_eq!(
        err,
        FrameError::MessageTooBig {
            size: 1 << 62,
            limit: 1024,
        }
    );
    assert_eq!(err.close_reason(), CloseReason::MessageTooBig);

    // Exactly at the limit is fine; one more byte is not.
    let ok = client_frame(true, OpCode::Binary, &[0; 1024]);
    assert_eq!(
        read_all(&ok, &limits),
        Ok(vec![Owned::Binary(vec![0; 1024])])
    );
    let over = client_frame(true, OpCode::Text, &[b'a'; 1025]);
    assert_eq!(
        read_once(&mut MessageReader::new(), &over[..8], &limits),
        Err(FrameError::MessageTooBig {
            size: 1025,
            limit: 1024,
        })
    );
}

#[test]
fn max_message_exceeded_by_accumulated_fragments() {
    let limits = ReadLimits {
        role: Role::Server,
        max_message: 10,
    };
    let mut reader = MessageReader::new();
    let first = client_frame(false, OpCode::Binary, &[1; 6]);
    assert_eq!(
        read_once(&mut reader, &first, &limits),
        Ok(Step::Frame(first.len(), None))
    );
    // Control frames do not count towards the message.
    let ping = client_frame(true, OpCode::Ping, &[0; 100]);
    assert!(read_once(&mut reader, &ping, &limits).is_ok());
    let second = client_frame(false, OpCode::Continuation, &[2; 4]);
    assert_eq!(
        read_once(&mut reader, &second, &limits),
        Ok(Step::Frame(second.len(), None))
    );
    // 6 + 4 + 1 > 10, refused from the header, before the payload arrives.
    let third = client_frame(true, OpCode::Continuation, &[3; 1]);
    assert_eq!(
        read_once(&mut reader, &third[..6], &limits),
        Err(FrameError::MessageTooBig {
            size: 11,
            limit: 10,
        })
    );

    // 6 + 4 + 0 fits.
    let mut stream = first.clone();
    stream.extend(second);
    stream.extend(client_frame(true, OpCode::Continuation, &[]));
    let mut expected = vec![1; 6];
    expected.extend([2; 4]);
    assert_eq!(
        read_all(&stream, &limits),
        Ok(vec![Owned::Binary(expected)])
    );
}

// ---------------------------------------------------------------------------
// Streaming

/// A stream with every frame shape: masked, 7/16/64-bit lengths, fragments,
/// interleaved control frames.
fn mixed_stream() -> (Vec<u8>, Vec<Owned>) {
    let big: Vec<u8> = (0..70_000u32).map(|i| (i * 7) as u8).collect();
    let mut s = Vec::new();
    s.extend(client_frame(true, OpCode::Text, b"Hello"));
    s.extend(client_frame(true, OpCode::Binary, &big[..300]));
    s.extend(client_frame(false, OpCode::Text, "κό".as_bytes()));
    s.extend(client_frame(true, OpCode::Ping, b"p"));
    s.extend(client_frame(true, OpCode::Continuation, "σμε".as_bytes()));
    s.extend(client_frame(true, OpCode::Binary, &big));
    s.extend(client_frame(true, OpCode::Text, b""));
    s.extend(encode_close(1000, "done", Some(RFC_MASK)));
    let expected = vec![
        text("Hello"),
        Owned::Binary(big[..300].to_vec()),
        Owned::Ping(b"p".to_vec()),
        text("κόσμε"),
        Owned::Binary(big.clone()),
        text(""),
        Owned::Close(Some((1000, "done".to_owned()))),
    ];
    (s, expected)
}

#[test]
fn byte_at_a_time_reports_incomplete_until_each_frame_is_whole() {
    let frame = client_frame(true, OpCode::Binary, &[5; 300]);
    let total = frame.len(); // 2 + 2 + 4 + 300
    let mut reader = MessageReader::new();
    for end in 0..total {
        let expect = if end < 8 { None } else { Some(total) };
        assert_eq!(
            read_once(&mut reader, &frame[..end], &SERVER),
            Ok(Step::Incomplete(expect)),
            "at {end}"
        );
    }
    assert_eq!(
        read_once(&mut reader, &frame, &SERVER),
        Ok(Step::Frame(total, Some(Owned::Binary(vec![5; 300]))))
    );
}

#[test]
fn byte_at_a_time_stream() {
    let (stream, expected) = mixed_stream();
    assert_eq!(feed_in_chunks(&stream, &[1], &SERVER), Ok(expected.clone()));
    assert_eq!(read_all(&stream, &SERVER), Ok(expected.clone()));
    assert_eq!(
        feed_in_chunks(&stream, &[3, 1, 7, 1000, 2], &SERVER),
        Ok(expected)
    );
}

#[test]
fn growing_buffer_one_byte_at_a_time() {
    // The caller keeps one buffer and appends; `read` must leave it
    // untouched until a whole frame is there (else the masked payload would
    // be unmasked twice).
    let frame = client_frame(true, OpCode::Text, b"in place");
    let mut reader = MessageReader::new();
    let mut buf = Vec::new();
    for (i, &b) in frame.iter().enumerate() {
        buf.push(b);
        let read = reader.read(&mut buf, &SERVER).unwrap();
        if i + 1 < frame.len() {
            assert!(matches!(read, Read::Incomplete { .. }), "at {i}");
        } else {
            assert_eq!(
                read,
                Read::Frame {
                    consumed: frame.len(),
                    message: Some(Message::Text("in place")),
                }
            );
        }
    }
}

#[test]
fn reads_one_frame_per_call() {
    let mut stream = client_frame(true, OpCode::Text, b"one");
    let first_len = stream.len();
    stream.extend(client_frame(true, OpCode::Text, b"two"));
    let mut reader = MessageReader::new();
    assert_eq!(
        read_once(&mut reader, &stream, &SERVER),
        Ok(Step::Frame(first_len, Some(text("one"))))
    );
}

#[test]
fn reader_is_eight_bytes() {
    #[cfg(target_pointer_width = "64")]
    assert_eq!(std::mem::size_of::<MessageReader>(), 8);
    assert_eq!(
        std::mem::size_of::<MessageReader>(),
        std::mem::size_of::<usize>()
    );
}

#[test]
fn client_role_reads_server_frames() {
    let mut s = Vec::new();
    push_frame(&mut s, true, OpCode::Text, b"hi", None);
    push_frame(&mut s, false, OpCode::Binary, b"a", None);
    push_frame(&mut s, true, OpCode::Continuation, b"b", None);
    assert_eq!(
        read_all(&s, &CLIENT),
        Ok(vec![text("hi"), Owned::Binary(b"ab".to_vec())])
    );
}
