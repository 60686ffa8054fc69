//! RFC 6455 framing: the layer between raw bytes and whole WebSocket messages.
//!
//! This module owns the wire format only: frame headers and masking
//! ([`frame`]), the incremental UTF-8 check for text split across fragments
//! ([`utf8`]) and the per-connection [`MessageReader`] that reassembles
//! fragmented messages ([`reader`]). It must not do I/O, keep time, decide
//! policy (what to do with a ping, when to close) or know about protocol v1:
//! the caller reads the bytes, calls in, and acts on what comes back.
//!
//! The one extension is permessage-deflate ([`deflate`], RFC 7692): on a
//! connection that negotiated it RSV1 marks a compressed message, which
//! [`MessageReader::read_deflate`] inflates; every other RSV bit, and RSV1
//! elsewhere, is an error.

pub mod deflate;
pub mod frame;
pub mod reader;
pub mod utf8;

pub use frame::*;
pub use reader::*;
pub use utf8::Utf8Validator;
