//! What several checks share: reading a WebSocket byte stream the way a
//! worker does (chunks appended to an inbound buffer, one frame at a time),
//! and the shape every HTTP response must have.

use std::sync::OnceLock;

use myriad_server::Config;
use serde_json::value::RawValue;

use myriad_protocol::ws::{
    FrameError, Message, MessageReader, Read, ReadLimits, MAX_CONTROL_PAYLOAD, MAX_HEADER_LEN,
};

/// A [`Message`], owned, so runs can be compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Text(String),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Close(Option<(u16, String)>),
}

/// What one call of [`MessageReader::read`] gave, or how the stream ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// A whole frame of `len` bytes; `event` when it ended a message or was
    /// a control frame.
    Frame { len: usize, event: Option<Event> },
    /// The reader refused the stream; nothing after it is read.
    Failed(FrameError),
    /// The input ran out: `pending` bytes of a frame not yet whole, and
    /// whether a fragmented message was still open.
    End { pending: usize, in_message: bool },
}

/// The node's default configuration, built once: `Config::default()`
/// runs clap, which costs more than any check.
pub fn default_config() -> &'static Config {
    static DEFAULT: OnceLock<Config> = OnceLock::new();
    DEFAULT.get_or_init(Config::default)
}

/// The default configuration with `max_subscriptions` from 1 to 16.
pub fn small_configs() -> &'static [Config] {
    static SMALL: OnceLock<Vec<Config>> = OnceLock::new();
    SMALL.get_or_init(|| {
        (1..=16)
            .map(|max_subscriptions| Config {
                max_subscriptions,
                ..default_config().clone()
            })
            .collect()
    })
}

/// Reads `chunks` as one connection's input, as a worker does: each chunk
/// lands behind what is still unread, frames are read off the front until
/// the reader says `Incomplete`, and a lent-out message is released before
/// the next read. Asserts what every read must keep on the way.
pub fn read_stream<'c>(
    chunks: impl IntoIterator<Item = &'c [u8]>,
    limits: &ReadLimits,
) -> Vec<Step> {
    let mut reader = MessageReader::new();
    let mut steps = Vec::new();
    // Everything received, untouched, to compare the unread rest against.
    let mut wire: Vec<u8> = Vec::new();
    let mut inbound: Vec<u8> = Vec::new();
    let mut taken = 0;
    for chunk in chunks {
        wire.extend_from_slice(chunk);
        inbound.extend_from_slice(chunk);
        let mut used = 0;
        loop {
            let buf = &mut inbound[used..];
            let len = buf.len();
            let range = buf.as_ptr_range();
            match reader.read(buf, limits) {
                Ok(Read::Incomplete { frame_len }) => {
                    if let Some(frame_len) = frame_len {
                        assert!(frame_len > len, "Incomplete with the whole frame at hand");
                        // The inbound buffer a worker keeps for one frame is
                        // bounded by the limits, whatever the header says.
                        let most = limits.max_message.max(MAX_CONTROL_PAYLOAD) + MAX_HEADER_LEN;
                        assert!(frame_len <= most, "frame of {frame_len} bytes allowed");
                    }
                    break;
                }
                Ok(Read::Frame { consumed, message }) => {
                    assert!(
                        0 < consumed && consumed <= len,
                        "consumed {consumed} of {len}"
                    );
                    let event = message.map(|m| owned(m, range, consumed, limits));
                    steps.push(Step::Frame {
                        len: consumed,
                        event,
                    });
                    used += consumed;
                    taken += consumed;
                }
                Err(e) => {
                    steps.push(Step::Failed(e));
                    return steps;
                }
            }
            reader.release();
        }
        inbound.drain(..used);
        // A read that returned no frame changed nothing: the unread input
        // is still exactly what arrived.
        assert_eq!(inbound, wire[taken..], "unread input was changed");
    }
    steps.push(Step::End {
        pending: inbound.len(),
        in_message: reader.in_message(),
    });
    steps
}

/// Copies a message out, checking its size against the limits and that a
/// payload lent from the input lies inside the frame it came in.
fn owned(
    message: Message<'_>,
    input: std::ops::Range<*const u8>,
    consumed: usize,
    limits: &ReadLimits,
) -> Event {
    let payload: &[u8] = match &message {
        Message::Text(text) => text.as_bytes(),
        Message::Binary(data) | Message::Ping(data) | Message::Pong(data) => data,
        Message::Close(close) => close.map_or(&[][..], |(_, reason)| reason.as_bytes()),
    };
    let ptr = payload.as_ptr();
    if !payload.is_empty() && input.contains(&ptr) {
        let end = input.start.wrapping_add(consumed);
        assert!(
            payload.as_ptr_range().end <= end,
            "payload runs past its frame"
        );
    }
    match message {
        Message::Text(text) => {
            assert!(text.len() <= limits.max_message, "text over max_message");
            Event::Text(text.to_owned())
        }
        Message::Binary(data) => {
            assert!(data.len() <= limits.max_message, "binary over max_message");
            Event::Binary(data.to_vec())
        }
        Message::Ping(data) => {
            assert!(data.len() <= MAX_CONTROL_PAYLOAD);
            Event::Ping(data.to_vec())
        }
        Message::Pong(data) => {
            assert!(data.len() <= MAX_CONTROL_PAYLOAD);
            Event::Pong(data.to_vec())
        }
        Message::Close(close) => {
            if let Some((_, reason)) = close {
                assert!(reason.len() <= MAX_CONTROL_PAYLOAD - 2);
            }
            Event::Close(close.map(|(code, reason)| (code, reason.to_owned())))
        }
    }
}

/// Splits `data` into chunks whose sizes follow `seed`: 0 gives one byte
/// at a time, others a repeating pattern of sizes from 1 to 64.
pub fn chunks(data: &[u8], seed: u8) -> Vec<&[u8]> {
    let mut state = u32::from(seed);
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let size = if seed == 0 {
            1
        } else {
            // A small LCG: varied sizes, the same for the same seed.
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            1 + (state >> 16) as usize % 64
        };
        let (chunk, tail) = rest.split_at(size.min(rest.len()));
        out.push(chunk);
        rest = tail;
    }
    out
}

/// Asserts that `inner` lies inside `outer` (a parser handed back a borrow
/// of its input, not of anything past it).
pub fn assert_within(outer: &[u8], inner: &[u8], what: &str) {
    let outer = outer.as_ptr_range();
    let inner = inner.as_ptr_range();
    assert!(
        outer.start <= inner.start && inner.end <= outer.end,
        "{what} lies outside the input"
    );
}

/// `data` is kept verbatim: a slice of the input, and JSON by itself.
pub fn assert_json_within(input: &[u8], data: &RawValue) {
    assert_within(input, data.get().as_bytes(), "data");
    let alone: &RawValue = serde_json::from_str(data.get()).expect("data is JSON");
    assert_eq!(alone.get(), data.get());
}

/// Asserts that `response` is one whole HTTP/1.1 response with `status`
/// whose `Content-Length` is exactly the body that follows the head.
pub fn assert_http_response(response: &[u8], status: u16) {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut parsed = httparse::Response::new(&mut headers);
    let head_len = match parsed.parse(response) {
        Ok(httparse::Status::Complete(n)) => n,
        other => panic!(
            "not an HTTP response ({other:?}): {:?}",
            String::from_utf8_lossy(response)
        ),
    };
    assert_eq!(parsed.version, Some(1));
    assert_eq!(parsed.code, Some(status));
    let length = parsed
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok())
        .and_then(|v| v.parse::<usize>().ok())
        .expect("a response with a Content-Length");
    assert_eq!(
        length,
        response.len() - head_len,
        "Content-Length is the body"
    );
}
