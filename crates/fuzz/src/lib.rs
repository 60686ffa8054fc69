//! The checks behind myriad's fuzz targets, one module per target, and the
//! registry of targets ([`TARGETS`]).
//!
//! A check takes any bytes, feeds them to the real parser, and asserts the
//! properties that parser promises: what parses encodes back to the same
//! value, a reader split at any point reads the same, limits hold, and
//! nothing borrowed lies outside the input. A failed property is a panic,
//! which libFuzzer reports as a crash.
//!
//! Two users run the same checks: the libFuzzer binary in `fuzz/` (nightly,
//! `scripts/fuzz.sh`, outside the workspace), and `tests/corpus.rs`, which
//! replays every kept corpus input and fixed crash on stable, as part of
//! `cargo test --workspace`. Nothing here may depend on libFuzzer.
//!
//! Adding a target is one file here with `pub fn check(data: &[u8])`, and
//! its name in the [`targets!`] list below; its corpus folder
//! `fuzz/corpus/<name>/` is grown by `scripts/fuzz.sh <seconds> <name>`.

mod support;

/// One fuzz target: `name` is its corpus folder and what
/// `MYRIAD_FUZZ_TARGET` names to the libFuzzer binary.
#[derive(Clone, Copy)]
pub struct Target {
    pub name: &'static str,
    pub check: fn(&[u8]),
}

/// Declares each target's module and lists it in [`TARGETS`].
macro_rules! targets {
    ($($name:ident),* $(,)?) => {
        $(pub mod $name;)*

        /// Every fuzz target, in the order `scripts/fuzz.sh` runs them.
        pub const TARGETS: &[Target] = &[$(Target {
            name: stringify!($name),
            check: $name::check,
        }),*];
    };
}

targets! {
    ws_read,
    ws_roundtrip,
    http_request,
    message,
    admin_body,
    stream_query,
    token,
    inflate,
}

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().copied().find(|t| t.name == name)
}
