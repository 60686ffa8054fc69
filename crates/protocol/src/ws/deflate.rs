//! permessage-deflate (RFC 7692): the offer a client makes in its upgrade,
//! the server's answer, and the two codecs: [`Inflater`] for compressed
//! client messages, [`Deflater`] for whole messages the server sends.
//!
//! myriad always answers with `server_no_context_takeover` and
//! `client_no_context_takeover` (§7.1.1): each message is compressed on its
//! own, so no connection keeps a compression or decompression window while
//! idle, and one compressed frame can be shared by every recipient of a
//! publication. This module owns the bytes only: whether compression is on,
//! its level and threshold, and which frames are compressed are the
//! server's decisions. No I/O, no clock.
//!
//! Both codecs are flate2 on its zlib-rs backend. Inflating must stream, so
//! that a bomb is stopped as soon as its output passes the limit. For
//! compressing, libdeflate (whole-buffer) was measured too: at level 1 it
//! shrinks a 540-byte JSON publication as much as zlib-rs at level 2 in
//! about half the time, but it always ends a message with a final
//! (BFINAL) block, which RFC 7692 §7.2.3.3 allows but which leaves input
//! after the end of the stream once a client appends its `00 00 ff ff`;
//! a frame shared by every recipient must be one every client's inflater
//! takes, so it is zlib-rs's sync flush, its cost paid once per
//! publication per node, not per recipient (docs/benchmarks.md,
//! *permessage-deflate: which compressor*; `benches/deflate.rs`).

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::frame::FrameError;

/// The extension's registered name (RFC 7692 §7).
pub const EXTENSION: &str = "permessage-deflate";

/// What a sender removes from, and a receiver appends to, a compressed
/// message: the empty stored block a sync flush ends with (§7.2.1, §7.2.2).
const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// The largest LZ77 window RFC 7692 speaks of, in bits (§7.1.2).
pub const MAX_WINDOW_BITS: u8 = 15;

/// What the inflater keeps between messages at most: a larger output
/// buffer, grown for one large message, is given back afterwards.
const KEPT_OUTPUT: usize = 64 * 1024;

/// Why an offer was declined (§5: the server declines an offer it cannot
/// accept and goes on to the next; declining all leaves the connection
/// uncompressed, never refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decline {
    /// The header is not a list of `name; param=value` elements (RFC 6455
    /// §9.1 grammar): nothing in it can be trusted, so every offer in it
    /// is declined.
    Malformed,
    /// A parameter RFC 7692 does not define for an offer (§5).
    UnknownParameter,
    /// The same parameter twice in one offer (§5).
    RepeatedParameter,
    /// A parameter with a value it may not have: a window size outside
    /// 8-15 or with a leading zero (§7.1.2), a value on a flag (§7.1.1).
    InvalidValue,
}

impl Decline {
    /// Every reason, for metrics registration.
    pub const ALL: [Decline; 4] = [
        Decline::Malformed,
        Decline::UnknownParameter,
        Decline::RepeatedParameter,
        Decline::InvalidValue,
    ];

    /// A stable snake_case name, used as the metric label.
    pub const fn name(self) -> &'static str {
        match self {
            Decline::Malformed => "malformed",
            Decline::UnknownParameter => "unknown_parameter",
            Decline::RepeatedParameter => "repeated_parameter",
            Decline::InvalidValue => "invalid_value",
        }
    }
}

/// An accepted offer: what the response says and how the server may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreement {
    /// `server_max_window_bits` as offered, answered with the same value
    /// (§7.1.2.1). The server compresses with a full window, so below 15 it
    /// sends every message uncompressed, which §6 allows any message to be.
    pub server_max_window_bits: Option<u8>,
}

impl Agreement {
    /// Whether the server may send compressed messages (its window is not
    /// limited below the one it compresses with).
    pub fn server_compresses(&self) -> bool {
        self.server_max_window_bits
            .is_none_or(|bits| bits == MAX_WINDOW_BITS)
    }

    /// The `Sec-WebSocket-Extensions` value of the 101.
    pub fn response(&self) -> String {
        let mut out =
            format!("{EXTENSION}; server_no_context_takeover; client_no_context_takeover");
        if let Some(bits) = self.server_max_window_bits {
            out.push_str(&format!("; server_max_window_bits={bits}"));
        }
        out
    }
}

/// The outcome of reading a request's extension offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Negotiation {
    /// The first acceptable permessage-deflate offer, if any.
    pub agreed: Option<Agreement>,
    /// Why the first declined permessage-deflate offer was declined (for
    /// the metric), when one was.
    pub declined: Option<Decline>,
}

/// Reads every `Sec-WebSocket-Extensions` value of a request, in order
/// (several headers are one list, RFC 7230 §3.2.2), and accepts the first
/// valid permessage-deflate offer. Other extensions are ignored.
pub fn negotiate<'a>(headers: impl IntoIterator<Item = &'a str>) -> Negotiation {
    let mut negotiation = Negotiation::default();
    for header in headers {
        let Some(offers) = split_list(header) else {
            negotiation.declined.get_or_insert(Decline::Malformed);
            continue;
        };
        for offer in offers {
            let Some((name, params)) = offer.split_first() else {
                continue;
            };
            if !name.0.eq_ignore_ascii_case(EXTENSION) {
                continue;
            }
            match accept(params) {
                Ok(agreement) if negotiation.agreed.is_none() => {
                    negotiation.agreed = Some(agreement);
                }
                Ok(_) => {}
                Err(decline) => {
                    negotiation.declined.get_or_insert(decline);
                }
            }
        }
    }
    negotiation
}

/// One offer's parameters judged (§7.1).
fn accept(params: &[Param<'_>]) -> Result<Agreement, Decline> {
    let mut seen = [false; 4];
    let mut agreement = Agreement {
        server_max_window_bits: None,
    };
    for (name, value) in params {
        let (slot, value_rule) = match name.to_ascii_lowercase().as_str() {
            "server_no_context_takeover" => (0, ValueRule::None),
            "client_no_context_takeover" => (1, ValueRule::None),
            "server_max_window_bits" => (2, ValueRule::Required),
            "client_max_window_bits" => (3, ValueRule::Optional),
            _ => return Err(Decline::UnknownParameter),
        };
        if std::mem::replace(&mut seen[slot], true) {
            return Err(Decline::RepeatedParameter);
        }
        let bits = match (value_rule, value) {
            (ValueRule::None, None) | (ValueRule::Optional, None) => None,
            (ValueRule::Required | ValueRule::Optional, Some(v)) => {
                Some(window_bits(v).ok_or(Decline::InvalidValue)?)
            }
            _ => return Err(Decline::InvalidValue),
        };
        if slot == 2 {
            agreement.server_max_window_bits = bits;
        }
        // client_max_window_bits only says the client could take a limit;
        // the inflater takes any window up to 15, so none is set.
    }
    Ok(agreement)
}

/// Whether a parameter takes a value.
#[derive(Clone, Copy)]
enum ValueRule {
    None,
    Optional,
    Required,
}

/// A window size: a decimal 8-15 without leading zeros (§7.1.2.1).
fn window_bits(value: &str) -> Option<u8> {
    if value.starts_with('0') {
        return None;
    }
    value
        .parse::<u8>()
        .ok()
        .filter(|bits| (8..=15).contains(bits))
}

/// `name` and its value (unquoted), if it had one.
type Param<'a> = (&'a str, Option<&'a str>);

/// Splits an extension list into elements of `name; param[=value]...`,
/// each element's name first; `None` if it breaks the grammar (RFC 6455
/// §9.1: tokens, and values that are tokens or quoted tokens). Empty list
/// elements are skipped (RFC 7230 §7).
fn split_list(header: &str) -> Option<Vec<Vec<Param<'_>>>> {
    let mut elements = Vec::new();
    for element in split_outside_quotes(header, ',')? {
        if element.trim_matches([' ', '\t']).is_empty() {
            continue;
        }
        let mut parts = Vec::new();
        for (at, part) in split_outside_quotes(element, ';')?.into_iter().enumerate() {
            let part = part.trim_matches([' ', '\t']);
            let (name, value) = match part.split_once('=') {
                Some((name, value)) if at > 0 => (
                    name.trim_end_matches([' ', '\t']),
                    Some(unquote(value.trim_start_matches([' ', '\t']))?),
                ),
                Some(_) => return None,
                None => (part, None),
            };
            if !is_token(name) {
                return None;
            }
            parts.push((name, value));
        }
        elements.push(parts);
    }
    Some(elements)
}

/// `text` split at `separator` where it is not inside a quoted string;
/// `None` for an unterminated quote.
fn split_outside_quotes(text: &str, separator: char) -> Option<Vec<&str>> {
    let mut pieces = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (at, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == separator && !quoted => {
                pieces.push(&text[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    if quoted {
        return None;
    }
    pieces.push(&text[start..]);
    Some(pieces)
}

/// A parameter value: a token, or a quoted string whose content is a token
/// (RFC 6455 §9.1 requires that of quoted values). Escapes are not tokens,
/// so a quoted value with one is refused.
fn unquote(value: &str) -> Option<&str> {
    let inner = match value.strip_prefix('"') {
        Some(rest) => rest.strip_suffix('"')?,
        None => value,
    };
    is_token(inner).then_some(inner)
}

/// RFC 7230 §3.2.6 `token`.
fn is_token(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// What inflates one whole compressed message for
/// [`MessageReader::read_deflate`](super::MessageReader::read_deflate):
/// [`Inflater`] itself, or a caller's wrapper around one (the bench keeps
/// the last few messages it inflated, since a node sends every recipient
/// of a publication the same compressed bytes).
pub trait Inflate {
    /// The message `payload` (a whole compressed message, without its
    /// tail) inflates to, or why it cannot be: [`FrameError::BadDeflateData`],
    /// or [`FrameError::InflatedTooBig`] past `limit` bytes.
    fn inflate(&mut self, payload: &[u8], limit: usize) -> Result<&[u8], FrameError>;
}

impl Inflate for Inflater {
    fn inflate(&mut self, payload: &[u8], limit: usize) -> Result<&[u8], FrameError> {
        Inflater::inflate(self, payload, limit)
    }
}

/// Inflates compressed client messages, one at a time, each on its own
/// (`client_no_context_takeover`). One per worker: the stream is created on
/// first use and reset per message, so a connection holds nothing.
#[derive(Default)]
pub struct Inflater {
    /// The zlib-rs stream (about 40 KiB with its window); boxed, created
    /// on the first compressed message.
    stream: Option<Box<Decompress>>,
    /// The last message inflated; at most `limit` + 1 bytes are ever
    /// written to it.
    out: Vec<u8>,
}

impl std::fmt::Debug for Inflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflater")
            .field("active", &self.stream.is_some())
            .field("out", &self.out.capacity())
            .finish()
    }
}

impl Inflater {
    pub fn new() -> Self {
        Self::default()
    }

    /// Inflates one whole compressed message payload (§7.2.2: with the tail
    /// appended). Output stops as soon as it passes `limit`: the message is
    /// then refused with [`FrameError::InflatedTooBig`] after at most
    /// `limit` + 1 bytes were made, whatever the ratio of the input.
    pub fn inflate(&mut self, payload: &[u8], limit: usize) -> Result<&[u8], FrameError> {
        if self.out.capacity() > KEPT_OUTPUT.max(limit + 1) {
            self.out = Vec::new();
        }
        self.out.clear();
        let stream = self
            .stream
            .get_or_insert_with(|| Box::new(Decompress::new(false)));
        stream.reset(false);
        for mut input in [payload, &TAIL[..]] {
            loop {
                if self.out.len() == self.out.capacity() {
                    if self.out.len() > limit {
                        return Err(FrameError::InflatedTooBig { limit });
                    }
                    let room = (self.out.capacity() * 2).max(256).min(limit + 1);
                    self.out.reserve_exact(room - self.out.len());
                }
                let (before_in, before_out) = (stream.total_in(), self.out.len());
                let status = stream
                    .decompress_vec(input, &mut self.out, FlushDecompress::Sync)
                    .map_err(|_| FrameError::BadDeflateData)?;
                if self.out.len() > limit {
                    return Err(FrameError::InflatedTooBig { limit });
                }
                let used = (stream.total_in() - before_in) as usize;
                input = &input[used..];
                if status == Status::StreamEnd {
                    // A final block (§7.2.3.3 allows one): the message ends
                    // there; bytes after it would be a second stream.
                    return if TAIL.starts_with(input) || TAIL.ends_with(input) {
                        Ok(&self.out)
                    } else {
                        Err(FrameError::BadDeflateData)
                    };
                }
                let room_left = self.out.len() < self.out.capacity();
                if input.is_empty() && room_left {
                    break;
                }
                if used == 0 && self.out.len() == before_out && room_left {
                    // No progress with room to write: the data is broken.
                    return Err(FrameError::BadDeflateData);
                }
            }
        }
        Ok(&self.out)
    }
}

/// Compresses whole messages for sending (§7.2.1), each on its own
/// (`server_no_context_takeover`): one zlib-rs stream, reset per message,
/// ending each with a sync flush whose tail is removed, which is what
/// every permessage-deflate client expects to inflate.
pub struct Deflater {
    stream: Compress,
}

impl Deflater {
    /// A deflater at `level` (1-9, zlib's scale; 1 is fastest).
    pub fn new(level: u8) -> Self {
        Deflater {
            stream: Compress::new(Compression::new(u32::from(level.clamp(1, 9))), false),
        }
    }

    /// Appends the compressed form of `payload` to `out` and returns its
    /// length, or `None` (leaving `out` as it was) when it would not be
    /// smaller than `payload`: the message is then better sent as it is,
    /// and the work stops as soon as that is known.
    pub fn compress(&mut self, payload: &[u8], out: &mut Vec<u8>) -> Option<usize> {
        let start = out.len();
        // Room for the payload's length and the tail: needing more means
        // no gain, and zlib never writes past a vector's capacity.
        out.reserve_exact(payload.len() + TAIL.len());
        self.stream.reset();
        let mut input = payload;
        let done = loop {
            let before = self.stream.total_in();
            let status = self.stream.compress_vec(input, out, FlushCompress::Sync);
            input = &input[(self.stream.total_in() - before) as usize..];
            let full = out.len() == out.capacity();
            match status {
                // A sync flush is complete once input is used up with room
                // left over (zlib's rule for a flush that fits).
                Ok(_) if input.is_empty() && !full => break out.ends_with(&TAIL),
                Ok(_) if !full => continue,
                _ => break false,
            }
        };
        let len = out.len() - start;
        if !done || len - TAIL.len() >= payload.len() {
            out.truncate(start);
            return None;
        }
        out.truncate(out.len() - TAIL.len());
        Some(len - TAIL.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agreed(headers: &[&str]) -> Option<Agreement> {
        negotiate(headers.iter().copied()).agreed
    }

    fn declined(header: &str) -> Option<Decline> {
        let n = negotiate([header]);
        assert_eq!(n.agreed, None, "{header}");
        n.declined
    }

    #[test]
    fn accepts_the_first_valid_offer() {
        let plain = Agreement {
            server_max_window_bits: None,
        };
        assert_eq!(agreed(&["permessage-deflate"]), Some(plain));
        assert_eq!(
            agreed(&["permessage-deflate; client_max_window_bits"]),
            Some(plain)
        );
        assert_eq!(
            agreed(&["x-webkit-deflate-frame, permessage-deflate; server_max_window_bits=10"]),
            Some(Agreement {
                server_max_window_bits: Some(10)
            })
        );
        assert_eq!(
            agreed(&["permessage-deflate; server_max_window_bits=\"15\"; server_no_context_takeover; client_no_context_takeover; client_max_window_bits=9"]),
            Some(Agreement {
                server_max_window_bits: Some(15)
            })
        );
        // A bad first offer falls back to the next, in the next header too.
        assert_eq!(
            agreed(&["permessage-deflate; foo", "permessage-deflate"]),
            Some(plain)
        );
        assert_eq!(agreed(&["x-other"]), None);
        assert_eq!(agreed(&[]), None);
    }

    #[test]
    fn the_response_forbids_context_takeover_both_ways() {
        let a = agreed(&["permessage-deflate"]).unwrap();
        assert_eq!(
            a.response(),
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover"
        );
        assert!(a.server_compresses());
        let small = agreed(&["permessage-deflate; server_max_window_bits=9"]).unwrap();
        assert!(small.response().ends_with("; server_max_window_bits=9"));
        assert!(!small.server_compresses(), "sent uncompressed, never wider");
    }

    #[test]
    fn bad_offers_are_declined_with_their_reason() {
        use Decline::*;
        assert_eq!(declined("permessage-deflate; foo"), Some(UnknownParameter));
        assert_eq!(
            declined("permessage-deflate; server_no_context_takeover; server_no_context_takeover"),
            Some(RepeatedParameter)
        );
        for bad in ["7", "16", "08", "x", "", "1.5"] {
            assert_eq!(
                declined(&format!("permessage-deflate; server_max_window_bits={bad}")),
                Some(if bad.is_empty() {
                    Malformed
                } else {
                    InvalidValue
                }),
                "{bad}"
            );
        }
        assert_eq!(
            declined("permessage-deflate; server_max_window_bits"),
            Some(InvalidValue)
        );
        assert_eq!(
            declined("permessage-deflate; client_no_context_takeover=1"),
            Some(InvalidValue)
        );
        assert_eq!(
            declined("permessage-deflate; client_max_window_bits=\"\\1\""),
            Some(Malformed)
        );
        assert_eq!(declined("permessage-deflate; a=\"b"), Some(Malformed));
        assert_eq!(declined("permessage-deflate=1"), Some(Malformed));
        assert_eq!(declined("per message-deflate"), Some(Malformed));
    }

    #[test]
    fn compressed_messages_round_trip() {
        let text = br#"{"op":"msg","subject":"chat","data":"hello hello hello hello hello"}"#;
        let mut deflater = Deflater::new(1);
        let mut out = Vec::new();
        let len = deflater.compress(text, &mut out).unwrap();
        assert_eq!(len, out.len());
        let mut inflater = Inflater::new();
        assert_eq!(inflater.inflate(&out, 1000).unwrap(), text);
        // With the tail a sync flush leaves (what browsers send): the RFC's
        // own example, "Hello" (§7.2.3.1), minus its tail.
        let hello = [0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00];
        assert_eq!(inflater.inflate(&hello, 5).unwrap(), b"Hello");
        // Incompressible bytes are left as they are.
        let noise: Vec<u8> = (0..64u64)
            .map(|i| (i.wrapping_mul(2654435761) >> 7) as u8)
            .collect();
        assert_eq!(deflater.compress(&noise, &mut Vec::new()), None);
    }

    #[test]
    fn a_bomb_stops_at_the_limit() {
        let zeros = vec![0u8; 1 << 20];
        let mut bomb = Vec::new();
        Deflater::new(9).compress(&zeros, &mut bomb).unwrap();
        assert!(bomb.len() < 2048, "{}", bomb.len());
        let mut inflater = Inflater::new();
        assert_eq!(
            inflater.inflate(&bomb, 65_536),
            Err(FrameError::InflatedTooBig { limit: 65_536 })
        );
        assert!(
            inflater.out.capacity() <= 65_537,
            "{}",
            inflater.out.capacity()
        );
        // The same stream within the limit is fine, and the next message
        // starts afresh.
        assert_eq!(inflater.inflate(&bomb, 1 << 20).unwrap().len(), 1 << 20);
        assert_eq!(
            inflater.inflate(&[0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00], 5),
            Ok(&b"Hello"[..])
        );
    }

    #[test]
    fn invalid_data_is_refused() {
        let mut inflater = Inflater::new();
        // BTYPE 11 is reserved (RFC 1951 §3.2.3).
        assert_eq!(
            inflater.inflate(&[0xff, 0xff, 0xff], 100),
            Err(FrameError::BadDeflateData)
        );
        // A final block (what a client may end with, §7.2.3.3) is fine;
        // followed by more data it is not.
        let mut two = Vec::with_capacity(1024);
        Compress::new(Compression::new(6), false)
            .compress_vec(&[b'a'; 200], &mut two, FlushCompress::Finish)
            .unwrap();
        assert_eq!(inflater.inflate(&two, 1000).unwrap(), &[b'a'; 200][..]);
        two.extend_from_slice(b"junk");
        assert_eq!(
            inflater.inflate(&two, 1000),
            Err(FrameError::BadDeflateData)
        );
    }
}
