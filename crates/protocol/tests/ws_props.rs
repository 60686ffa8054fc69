//! Property tests for the framing layer: encode/parse roundtrips, message
//! reassembly under random fragmentation and chunking, and the incremental
//! UTF-8 validator against std.

mod common;

use common::{feed_in_chunks, push_frame, Owned, SERVER};
use myriad_protocol::ws::*;
use proptest::prelude::*;
use proptest::sample::Index;

fn any_opcode() -> impl Strategy<Value = OpCode> {
    prop::sample::select(OpCode::ALL.to_vec())
}

/// Lengths clustered around the 7/16/64-bit encoding boundaries.
fn any_len() -> impl Strategy<Value = usize> {
    prop_oneof![0usize..=130, 65_530usize..=65_540, 126usize..70_000,]
}

proptest! {
    #[test]
    fn encode_then_parse_roundtrips(
        opcode in any_opcode(),
        len in any_len(),
        mask in any::<Option<[u8; 4]>>(),
        seed in any::<u8>(),
    ) {
        let len = if opcode.is_control() { len % (MAX_CONTROL_PAYLOAD + 1) } else { len };
        let payload: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
        let mut frame = encode_frame(opcode, &payload, mask);

        let header = parse_frame_header(&frame).unwrap().unwrap();
        prop_assert!(header.fin);
        prop_assert_eq!(header.opcode, opcode);
        prop_assert_eq!(header.mask, mask);
        prop_assert_eq!(header.payload_len, len as u64);
        prop_assert_eq!(header.header_len + len, frame.len());
        prop_assert!(header.header_len <= MAX_HEADER_LEN);
        // Any strict prefix of the header is "need more", never an error.
        for end in 0..header.header_len {
            prop_assert_eq!(parse_frame_header(&frame[..end]), Ok(None));
        }

        let body = &mut frame[header.header_len..];
        if let Some(key) = header.mask {
            apply_mask(body, key);
        }
        prop_assert_eq!(&*body, &payload[..]);
    }

    #[test]
    fn non_final_data_headers_roundtrip(
        opcode in prop::sample::select(vec![OpCode::Continuation, OpCode::Text, OpCode::Binary]),
        len in any_len(),
        mask in any::<Option<[u8; 4]>>(),
    ) {
        let mut out = Vec::new();
        write_frame_header(&mut out, false, opcode, len, mask);
        let header = parse_frame_header(&out).unwrap().unwrap();
        prop_assert_eq!(
            header,
            FrameHeader { fin: false, opcode, mask, payload_len: len as u64, header_len: out.len() }
        );
    }

    #[test]
    fn apply_mask_is_bytewise_xor_and_an_involution(
        data in prop::collection::vec(any::<u8>(), 0..200),
        mask in any::<[u8; 4]>(),
    ) {
        let mut masked = data.clone();
        apply_mask(&mut masked, mask);
        for (i, (m, d)) in masked.iter().zip(&data).enumerate() {
            prop_assert_eq!(*m, d ^ mask[i % 4]);
        }
        apply_mask(&mut masked, mask);
        prop_assert_eq!(masked, data);
    }
}

/// One data message of the generated stream.
#[derive(Clone, Debug)]
enum Data {
    Text(String),
    Binary(Vec<u8>),
}

/// A message, how to cut it into fragments, and which gaps between
/// fragments get a ping.
#[derive(Clone, Debug)]
struct Plan {
    data: Data,
    cuts: Vec<Index>,
    pings: Vec<Option<Vec<u8>>>,
    masks: Vec<[u8; 4]>,
}

fn any_plan() -> impl Strategy<Value = Plan> {
    let data = prop_oneof![
        ".{0,40}".prop_map(Data::Text),
        prop::collection::vec(any::<u8>(), 0..300).prop_map(Data::Binary),
    ];
    (
        data,
        prop::collection::vec(any::<Index>(), 0..5),
        prop::collection::vec(
            prop::option::weighted(0.3, prop::collection::vec(any::<u8>(), 0..10)),
            0..5,
        ),
        prop::collection::vec(any::<[u8; 4]>(), 1..6),
    )
        .prop_map(|(data, cuts, pings, masks)| Plan {
            data,
            cuts,
            pings,
            masks,
        })
}

/// Encodes the plans as a client would (masked), returning the stream and
/// the messages a reader must produce from it.
fn encode_plans(plans: &[Plan]) -> (Vec<u8>, Vec<Owned>) {
    let mut stream = Vec::new();
    let mut expected = Vec::new();
    for plan in plans {
        let (bytes, opcode, whole) = match &plan.data {
            Data::Text(s) => (s.as_bytes(), OpCode::Text, Owned::Text(s.clone())),
            Data::Binary(b) => (&b[..], OpCode::Binary, Owned::Binary(b.clone())),
        };
        // Cut points anywhere, including inside a UTF-8 sequence, and
        // possibly repeated (empty fragments).
        let mut cuts: Vec<usize> = plan.cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
        cuts.sort_unstable();
        cuts.push(bytes.len());
        let mut start = 0;
        for (n, &end) in cuts.iter().enumerate() {
            let fin = n + 1 == cuts.len();
            let op = if n == 0 { opcode } else { OpCode::Continuation };
            let mask = plan.masks[n % plan.masks.len()];
            push_frame(&mut stream, fin, op, &bytes[start..end], Some(mask));
            start = end;
            if !fin {
                if let Some(Some(ping)) = plan.pings.get(n) {
                    push_frame(&mut stream, true, OpCode::Ping, ping, Some(mask));
                    expected.push(Owned::Ping(ping.clone()));
                }
            }
        }
        expected.push(whole);
    }
    (stream, expected)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn random_fragmentation_and_chunking_give_the_same_messages(
        plans in prop::collection::vec(any_plan(), 0..8),
        chunks in prop::collection::vec(1usize..64, 1..10),
    ) {
        let (stream, expected) = encode_plans(&plans);
        prop_assert_eq!(feed_in_chunks(&stream, &chunks, &SERVER), Ok(expected.clone()));
        prop_assert_eq!(feed_in_chunks(&stream, &[stream.len().max(1)], &SERVER), Ok(expected));
    }
}

/// Bytes that are often, but not always, UTF-8: random bytes, valid text,
/// text with a byte replaced, and runs of the bytes UTF-8 edge cases are
/// made of.
fn utf8ish() -> impl Strategy<Value = Vec<u8>> {
    let interesting = prop::sample::select(vec![
        0x00u8, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1,
        0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF,
    ]);
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..40),
        any::<String>().prop_map(String::into_bytes),
        (any::<String>(), any::<Index>(), any::<u8>()).prop_map(|(s, at, b)| {
            let mut v = s.into_bytes();
            if !v.is_empty() {
                let i = at.index(v.len());
                v[i] = b;
            }
            v
        }),
        prop::collection::vec(interesting, 0..24),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn utf8_validator_agrees_with_std(
        bytes in utf8ish(),
        cuts in prop::collection::vec(any::<Index>(), 0..6),
    ) {
        let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
        cuts.sort_unstable();
        cuts.push(bytes.len());

        let mut v = Utf8Validator::default();
        let mut start = 0;
        // Index one past the last byte fed when the validator failed.
        let mut failed_at = None;
        for &end in &cuts {
            if v.feed(&bytes[start..end]).is_err() {
                failed_at = Some(end);
                break;
            }
            start = end;
        }
        let verdict = failed_at.is_none() && v.finish().is_ok();

        let std_result = std::str::from_utf8(&bytes);
        prop_assert_eq!(verdict, std_result.is_ok());

        if let Err(e) = std_result {
            if let Some(len) = e.error_len() {
                // Fail fast: once the byte that proves the sequence
                // impossible has been fed (the one after the invalid prefix,
                // or its last byte for a lone bad byte), and no earlier than
                // the whole invalid prefix.
                let failed_at = failed_at.expect("an impossible sequence must fail in feed");
                let earliest = e.valid_up_to() + len;
                let proof = earliest.min(bytes.len() - 1);
                let latest = cuts.iter().copied().find(|&end| end > proof).unwrap();
                prop_assert!(failed_at >= earliest, "too early: {} < {}", failed_at, earliest);
                prop_assert!(failed_at <= latest, "too late: {} > {}", failed_at, latest);
            }
        }
    }
}
