//! WebSocket frames encoded by the protocol crate and read back.
//!
//! The input is a plan: messages (text that may or may not be UTF-8,
//! binary, ping, pong, close), each data message cut into fragments with
//! pings between them, masked as a client must or not as a server must,
//! and a `max_message`. The plan is encoded with the crate's encoders and
//! read back in chunks; the reader must give back exactly the frames and
//! messages sent, and refuse at exactly the frame where the plan breaks a
//! rule (a message past `max_message`, text that cannot be UTF-8). Also:
//! any frame header reads back as written, and a close frame's reason is
//! cut at a character boundary within 125 bytes.

use arbitrary::{Result, Unstructured};
use myriad_protocol::ws::{
    apply_mask, encode_close, encode_frame, parse_close_payload, parse_frame_header,
    write_frame_header, FrameError, FrameHeader, OpCode, ReadLimits, Role, MAX_CONTROL_PAYLOAD,
};

use crate::support::{chunks, read_stream, Event, Step};

pub fn check(data: &[u8]) {
    let mut u = Unstructured::new(data);
    // Running out of input only ends the plan early; every prefix is a plan.
    let _ = headers_read_back(&mut u);
    let _ = close_reasons_are_cut_at_a_boundary(&mut u);
    let Ok((wire, expected, limits, cut)) = plan(&mut u) else {
        return;
    };
    let read = read_stream(chunks(&wire, cut), &limits);
    assert_eq!(read, expected, "what was sent, read back");
}

/// Any valid header, written, parses to the same fields.
fn headers_read_back(u: &mut Unstructured<'_>) -> Result<()> {
    let opcode = *u.choose(&OpCode::ALL)?;
    let mask: Option<[u8; 4]> = u.arbitrary()?;
    let (fin, len) = if opcode.is_control() {
        (true, u.int_in_range(0..=MAX_CONTROL_PAYLOAD)?)
    } else {
        // Any length the wire allows (63 bits), as usize holds it here.
        let len: u64 = u.arbitrary::<u64>()? >> 1;
        (u.arbitrary()?, usize::try_from(len).unwrap_or(usize::MAX >> 1))
    };
    let mut out = Vec::new();
    write_frame_header(&mut out, fin, opcode, len, mask);
    let header = parse_frame_header(&out).expect("a written header is valid");
    assert_eq!(
        header,
        Some(FrameHeader {
            fin,
            opcode,
            mask,
            payload_len: len as u64,
            header_len: out.len(),
        })
    );
    // Every shorter prefix is a header not yet whole.
    for cut in 0..out.len() {
        assert_eq!(parse_frame_header(&out[..cut]), Ok(None), "prefix of {cut}");
    }
    Ok(())
}

/// `encode_close` keeps the longest prefix of the reason that fits.
fn close_reasons_are_cut_at_a_boundary(u: &mut Unstructured<'_>) -> Result<()> {
    let code = 3000 + u.int_in_range(0..=1999)?;
    let reason: String = u.arbitrary()?;
    let frame = encode_close(code, &reason, None);
    let header = parse_frame_header(&frame).unwrap().expect("a whole header");
    let (sent_code, sent) = parse_close_payload(&frame[header.header_len..])
        .expect("a valid close payload")
        .expect("a status code");
    assert_eq!(sent_code, code);
    assert!(reason.starts_with(sent) && sent.len() <= MAX_CONTROL_PAYLOAD - 2);
    if let Some(next) = reason[sent.len()..].chars().next() {
        assert!(sent.len() + next.len_utf8() > MAX_CONTROL_PAYLOAD - 2, "cut too short");
    }
    Ok(())
}

/// Draws a plan; returns the bytes on the wire, the steps the reader must
/// take, the limits and how to cut the wire into reads.
fn plan(u: &mut Unstructured<'_>) -> Result<(Vec<u8>, Vec<Step>, ReadLimits, u8)> {
    let limits = ReadLimits {
        role: if u.arbitrary()? {
            Role::Server
        } else {
            Role::Client
        },
        max_message: u.int_in_range(0..=2048)?,
    };
    let cut = u.arbitrary()?;
    let mut sender = Sender {
        u,
        limits,
        wire: Vec::new(),
        steps: Vec::new(),
    };
    while !sender.u.is_empty() && sender.steps.len() < 64 {
        if sender.message()?.is_break() {
            return Ok((sender.wire, sender.steps, limits, cut));
        }
    }
    sender.steps.push(Step::End {
        pending: 0,
        in_message: false,
    });
    Ok((sender.wire, sender.steps, limits, cut))
}

/// Writes frames and, for each, the step the reader owes for it.
struct Sender<'u, 'd> {
    u: &'u mut Unstructured<'d>,
    limits: ReadLimits,
    wire: Vec<u8>,
    steps: Vec<Step>,
}

/// Whether the plan goes on, or ended at a frame the reader must refuse.
type Flow = std::ops::ControlFlow<()>;

impl Sender<'_, '_> {
    fn mask(&mut self) -> Result<Option<[u8; 4]>> {
        match self.limits.role {
            Role::Server => Ok(Some(self.u.arbitrary()?)),
            Role::Client => Ok(None),
        }
    }

    /// One whole frame from the crate's encoder.
    fn frame(&mut self, opcode: OpCode, payload: &[u8], event: Event) -> Result<()> {
        let frame = encode_frame(opcode, payload, self.mask()?);
        self.sent(frame, Some(event));
        Ok(())
    }

    fn sent(&mut self, frame: Vec<u8>, event: Option<Event>) {
        self.steps.push(Step::Frame {
            len: frame.len(),
            event,
        });
        self.wire.extend_from_slice(&frame);
    }

    fn message(&mut self) -> Result<Flow> {
        match self.u.int_in_range(0..=5)? {
            0 => {
                let text: String = self.u.arbitrary()?;
                self.data(true, text.into_bytes())
            }
            1 => {
                let bytes: Vec<u8> = self.u.arbitrary()?;
                self.data(true, bytes)
            }
            2 => {
                let bytes: Vec<u8> = self.u.arbitrary()?;
                self.data(false, bytes)
            }
            3 => {
                self.ping()?;
                Ok(Flow::Continue(()))
            }
            4 => {
                let payload = self.control_payload()?;
                self.frame(OpCode::Pong, &payload, Event::Pong(payload.clone()))?;
                Ok(Flow::Continue(()))
            }
            _ => {
                self.close()?;
                Ok(Flow::Continue(()))
            }
        }
    }

    fn control_payload(&mut self) -> Result<Vec<u8>> {
        let len = self.u.int_in_range(0..=MAX_CONTROL_PAYLOAD)?;
        Ok(self.u.bytes(len.min(self.u.len()))?.to_vec())
    }

    fn ping(&mut self) -> Result<()> {
        let payload = self.control_payload()?;
        self.frame(OpCode::Ping, &payload, Event::Ping(payload.clone()))
    }

    fn close(&mut self) -> Result<()> {
        if self.u.arbitrary()? {
            return self.frame(OpCode::Close, &[], Event::Close(None));
        }
        let code = 3000 + self.u.int_in_range(0..=1999)?;
        let mut reason: String = self.u.arbitrary()?;
        while reason.len() > MAX_CONTROL_PAYLOAD - 2 {
            reason.pop();
        }
        let frame = encode_close(code, &reason, self.mask()?);
        self.sent(frame, Some(Event::Close(Some((code, reason)))));
        Ok(())
    }

    /// A text or binary message in one or more fragments, with pings
    /// between them. The reader must refuse it at the first fragment that
    /// takes it past `max_message`, or whose text so far cannot be UTF-8.
    fn data(&mut self, text: bool, payload: Vec<u8>) -> Result<Flow> {
        let fragments = self.u.int_in_range(1..=4)?;
        let mut cuts: Vec<usize> = (1..fragments)
            .map(|_| self.u.int_in_range(0..=payload.len()))
            .collect::<Result<_>>()?;
        cuts.push(payload.len());
        cuts.sort_unstable();
        let mut start = 0;
        for (i, &end) in cuts.iter().enumerate() {
            let fin = i + 1 == cuts.len();
            let opcode = match (i, text) {
                (0, true) => OpCode::Text,
                (0, false) => OpCode::Binary,
                _ => OpCode::Continuation,
            };
            let mask = self.mask()?;
            let mut frame = Vec::new();
            write_frame_header(&mut frame, fin, opcode, end - start, mask);
            let header_len = frame.len();
            frame.extend_from_slice(&payload[start..end]);
            if let Some(key) = mask {
                apply_mask(&mut frame[header_len..], key);
            }
            let so_far = &payload[..end];
            if end > self.limits.max_message {
                self.wire.extend_from_slice(&frame);
                self.steps.push(Step::Failed(FrameError::MessageTooBig {
                    size: end as u64,
                    limit: self.limits.max_message,
                }));
                return Ok(Flow::Break(()));
            }
            let utf8_broken = text
                && match std::str::from_utf8(so_far) {
                    Ok(_) => false,
                    // Cut inside a character: fine until the last fragment.
                    Err(e) => fin || e.error_len().is_some(),
                };
            if utf8_broken {
                self.wire.extend_from_slice(&frame);
                self.steps.push(Step::Failed(FrameError::InvalidUtf8));
                return Ok(Flow::Break(()));
            }
            let event = fin.then(|| match text {
                true => Event::Text(String::from_utf8(payload.clone()).expect("checked")),
                false => Event::Binary(payload.clone()),
            });
            self.sent(frame, event);
            if !fin && self.u.ratio(1, 4)? {
                self.ping()?;
            }
            start = end;
        }
        Ok(Flow::Continue(()))
    }
}
