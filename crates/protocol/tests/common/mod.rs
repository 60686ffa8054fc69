//! Helpers shared by the framing tests: owned copies of messages (so results
//! outlive the buffer they were read from) and drivers that feed a
//! `MessageReader` the way the server does.

#![allow(dead_code)] // each test binary uses a different subset

use myriad_protocol::ws::{
    apply_mask, write_frame_header, FrameError, Message, MessageReader, OpCode, Read, ReadLimits,
    Role,
};

pub const SERVER: ReadLimits = ReadLimits {
    role: Role::Server,
    max_message: 1 << 20,
};

pub const CLIENT: ReadLimits = ReadLimits {
    role: Role::Client,
    max_message: 1 << 20,
};

/// A [`Message`] that owns its payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owned {
    Text(String),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Close(Option<(u16, String)>),
}

impl From<Message<'_>> for Owned {
    fn from(m: Message<'_>) -> Self {
        match m {
            Message::Text(t) => Owned::Text(t.to_owned()),
            Message::Binary(b) => Owned::Binary(b.to_vec()),
            Message::Ping(b) => Owned::Ping(b.to_vec()),
            Message::Pong(b) => Owned::Pong(b.to_vec()),
            Message::Close(c) => Owned::Close(c.map(|(code, r)| (code, r.to_owned()))),
        }
    }
}

/// Appends one frame (any FIN, any opcode) with its payload masked by `mask`.
pub fn push_frame(
    out: &mut Vec<u8>,
    fin: bool,
    opcode: OpCode,
    payload: &[u8],
    mask: Option<[u8; 4]>,
) {
    write_frame_header(out, fin, opcode, payload.len(), mask);
    let start = out.len();
    out.extend_from_slice(payload);
    if let Some(key) = mask {
        apply_mask(&mut out[start..], key);
    }
}

/// A masked frame, as a client sends it.
pub fn client_frame(fin: bool, opcode: OpCode, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    push_frame(
        &mut out,
        fin,
        opcode,
        payload,
        Some([0x12, 0x34, 0x56, 0x78]),
    );
    out
}

/// What one `read` call produced, owned.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    Incomplete(Option<usize>),
    Frame(usize, Option<Owned>),
}

/// One `read` call over a copy of `bytes`.
pub fn read_once(
    reader: &mut MessageReader,
    bytes: &[u8],
    limits: &ReadLimits,
) -> Result<Step, FrameError> {
    let mut buf = bytes.to_vec();
    Ok(match reader.read(&mut buf, limits)? {
        Read::Incomplete { frame_len } => Step::Incomplete(frame_len),
        Read::Frame { consumed, message } => Step::Frame(consumed, message.map(Owned::from)),
    })
}

/// Feeds `bytes` to a fresh reader in chunks of the given sizes (cycled; a
/// size of 0 counts as 1), reading every complete frame after each chunk the
/// way a server's read loop does. Returns every message produced, or the
/// first error.
pub fn feed_in_chunks(
    bytes: &[u8],
    chunk_sizes: &[usize],
    limits: &ReadLimits,
) -> Result<Vec<Owned>, FrameError> {
    let mut reader = MessageReader::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut out = Vec::new();
    let mut pos = 0;
    let mut sizes = chunk_sizes.iter().cycle();
    while pos < bytes.len() {
        let size = sizes.next().copied().unwrap_or(1).max(1);
        let end = (pos + size).min(bytes.len());
        buf.extend_from_slice(&bytes[pos..end]);
        pos = end;
        loop {
            match reader.read(&mut buf, limits)? {
                Read::Incomplete { .. } => break,
                Read::Frame { consumed, message } => {
                    if let Some(m) = message {
                        out.push(Owned::from(m));
                    }
                    buf.drain(..consumed);
                }
            }
        }
    }
    assert!(buf.is_empty(), "bytes left over: {buf:?}");
    Ok(out)
}

/// Feeds everything at once.
pub fn read_all(bytes: &[u8], limits: &ReadLimits) -> Result<Vec<Owned>, FrameError> {
    feed_in_chunks(bytes, &[bytes.len()], limits)
}
