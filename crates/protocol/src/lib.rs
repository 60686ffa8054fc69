//! myriad's wire formats, as pure functions over bytes.
//!
//! Nothing in this crate performs I/O, spawns, sleeps or reads a clock: the
//! server and the bench both drive it with bytes they read themselves, so one
//! codec has two users and can be tested with literal byte vectors.
//!
//! Map of the crate, bytes up:
//! - [`ws`]: RFC 6455 framing (frame headers, masking, close payloads), the
//!   incremental UTF-8 check, and [`ws::MessageReader`], which turns a byte
//!   stream into whole messages and control frames.
//! - [`handshake`]: the HTTP/1.1 request every client connection opens with
//!   (parse it; validate and answer a WebSocket upgrade).
//! - [`close`]: the one registry of close reasons, with what each transport
//!   does for each.
//! - [`subject`]: subject syntax and limits.
//! - [`position`]: stream positions (epoch and offset) of publications.
//! - [`cursor`]: the positions of several subjects as one string, how the
//!   HTTP transports let a client resume.
//! - [`message`]: protocol v1, the JSON commands clients send and the frames
//!   the server sends back.

/// `[E::A, E::B, …]`: the variants named, in that order, and a build error
/// unless they are all of `E`'s. How a hand-kept `ALL` list is checked
/// complete, here and in the crates that keep one:
/// `assert_eq!(every_variant!(E: A, B), E::ALL)`. A variant added to `E`
/// breaks the build of that check until it is named there, and the check
/// then fails until `ALL` names it too. Only the array is built at run
/// time; the match is never called.
#[macro_export]
macro_rules! every_variant {
    ($enum:ident: $($variant:ident),* $(,)?) => {{
        fn _exhaustive(v: $enum) {
            match v {
                $($enum::$variant => {})*
            }
        }
        [$($enum::$variant),*]
    }};
}

pub mod close;
pub mod cursor;
pub mod handshake;
pub mod message;
pub mod position;
pub mod subject;
pub mod ws;
