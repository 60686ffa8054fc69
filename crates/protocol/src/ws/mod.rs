//! RFC 6455 framing: the layer between raw bytes and whole WebSocket messages.
//!
//! This module owns the wire format only: frame headers and masking
//! ([`frame`]), the incremental UTF-8 check for text split across fragments
//! ([`utf8`]) and the per-connection [`MessageReader`] that reassembles
//! fragmented messages ([`reader`]). It must not do I/O, keep time, decide
//! policy (what to do with a ping, when to close) or know about protocol v1:
//! the caller reads the bytes, calls in, and acts on what comes back.
//!
//! No extension is ever negotiated (the handshake never answers
//! `Sec-WebSocket-Extensions`), so every RSV bit set on the wire is an error.

pub mod frame;
pub mod reader;
pub mod utf8;

pub use frame::*;
pub use reader::*;
pub use utf8::Utf8Validator;
