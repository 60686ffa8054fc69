//! The WebSocket frame reader and message reassembly, on any byte stream.
//!
//! Input: a byte of settings (role, `max_message`), a byte choosing how
//! the stream is cut into reads, then the stream. Properties: reading it
//! whole and reading it cut into chunks give the same frames, messages,
//! refusal and leftover; every read keeps the limits and borrows nothing
//! outside its frame (checked in [`crate::support::read_stream`]).

use myriad_protocol::ws::{ReadLimits, Role};

use crate::support::{chunks, read_stream};

/// The `max_message` values tried: around the control-frame limit, the
/// 16- and 64-bit length encodings, and the server's default.
const MAX_MESSAGE: [usize; 8] = [0, 16, 125, 126, 1_000, 65_535, 65_536, 1 << 20];

pub fn check(data: &[u8]) {
    let [settings, cut, stream @ ..] = data else {
        return;
    };
    let limits = ReadLimits {
        role: if settings & 1 == 0 {
            Role::Server
        } else {
            Role::Client
        },
        max_message: MAX_MESSAGE[usize::from(settings >> 1) % MAX_MESSAGE.len()],
    };
    let whole = read_stream([stream], &limits);
    let split = read_stream(chunks(stream, *cut), &limits);
    assert_eq!(whole, split, "the same stream read in other chunks");
}
