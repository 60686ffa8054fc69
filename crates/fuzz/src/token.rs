//! Connection tokens and their grants (`crates/server/src/auth/`): what a
//! client hands the node to say who it is and what it may do.
//!
//! Input: a mode byte, then text. Mode 0 hands the text to the verifier as
//! a token, as a hostile client would. Otherwise the text's lines are grant
//! patterns, and the lines after a line `--` publish grants; they are
//! resolved directly, then signed into a token with the node's key and
//! verified. Properties: verifying never panics and, on anything not
//! signed with the key, refuses; a signed token verifies to its user and
//! to the same grants as resolving its patterns directly, or is refused
//! for a bad grant exactly when resolving refuses; an exact grant matches
//! its own subject and a prefix grant every subject that extends it.

use std::sync::OnceLock;

use jsonwebtoken::{encode, EncodingKey, Header};
use myriad_server::auth::grants::{Grants, Pattern};
use myriad_server::auth::keys;
use myriad_server::auth::token::{unix_now, Expectations, TokenError, Verifier};
use serde_json::json;

const SECRET: &str = "fuzzing-secret-of-at-least-32-bytes";
const MAX_SUBJECT_LEN: usize = 128;

fn verifier() -> &'static Verifier {
    static VERIFIER: OnceLock<Verifier> = OnceLock::new();
    VERIFIER.get_or_init(|| {
        let keys = keys::load(Some(SECRET), &[], None).expect("the fuzzing key loads");
        let expect = Expectations {
            max_subject_len: MAX_SUBJECT_LEN,
            ..Expectations::default()
        };
        Verifier::new(keys, expect)
    })
}

pub fn check(data: &[u8]) {
    let Some((&mode, text)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(text);
    if mode == 0 {
        // Nothing a fuzzer makes up carries a signature by this key.
        assert!(verifier().verify(&text).is_err(), "an unsigned token passed");
        return;
    }
    let (subscribe, publish) = match text.split_once("\n--\n") {
        Some((s, p)) => (lines(s), lines(p)),
        None => (lines(&text), Vec::new()),
    };
    let user = u64::from(mode) * 1_000_003;
    let sub = user.to_string();
    for pattern in subscribe.iter().chain(&publish) {
        check_pattern(pattern, &sub);
    }
    let direct = Grants::parse(&subscribe, &publish, &sub, MAX_SUBJECT_LEN);
    let claims = json!({
        "sub": sub, "exp": unix_now() + 600, "subscribe": subscribe, "publish": publish,
    });
    let token = encode(&Header::default(), &claims, &EncodingKey::from_secret(SECRET.as_bytes()))
        .expect("HS256 signs anything");
    match (verifier().verify(&token), direct) {
        (Ok(verified), Ok(grants)) => {
            assert_eq!(verified.user.get(), user);
            assert_eq!(verified.access.grants, grants);
        }
        (Err(TokenError::Grant(e)), Err(direct)) => assert_eq!(e, direct),
        (verified, direct) => panic!("verified {verified:?}, resolved directly {direct:?}"),
    }
}

fn lines(text: &str) -> Vec<String> {
    text.lines().map(str::to_owned).collect()
}

/// A pattern that resolves matches what it names.
fn check_pattern(pattern: &str, sub: &str) {
    let Ok(resolved) = Pattern::parse(pattern, sub, MAX_SUBJECT_LEN) else {
        return;
    };
    let text = pattern.replace("{sub}", sub);
    match text.strip_suffix('*') {
        Some(prefix) => {
            for tail in ["", "x", ".y.z"] {
                assert!(resolved.matches(&format!("{prefix}{tail}")), "{pattern:?}");
            }
        }
        None => {
            assert!(resolved.matches(&text), "{pattern:?}");
            assert!(!resolved.matches(&format!("{text}x")), "exact widened: {pattern:?}");
        }
    }
}
