//! The request signature: HMAC-SHA256 over `timestamp + "." + body`.
//!
//! docs/operations.md ("Receiving hooks") gives the same steps for a
//! receiver; the tests below pin the exact bytes signed.

use ring::hmac;

/// The header carrying the Unix time, in seconds, the request was signed.
pub const TIMESTAMP_HEADER: &str = "myriad-timestamp";
/// The header carrying `v1=` and the lowercase hex HMAC-SHA256.
pub const SIGNATURE_HEADER: &str = "myriad-signature";

/// The value of the signature header for `body` sent at `timestamp`:
/// `v1=` then the lowercase hex of HMAC-SHA256(secret, "<timestamp>.<body>").
pub fn sign(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(timestamp.to_string().as_bytes());
    ctx.update(b".");
    ctx.update(body);
    let tag = ctx.sign();
    let mut out = String::with_capacity(3 + 64);
    out.push_str("v1=");
    for byte in tag.as_ref() {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// The two headers that sign `body` now: the timestamp and the
/// signature, what every request to the backend carries when a secret is
/// set (hooks always, proxies with `hook_secret`).
pub fn headers(secret: &[u8], body: &[u8]) -> [(&'static str, String); 2] {
    let timestamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    [
        (TIMESTAMP_HEADER, timestamp.to_string()),
        (SIGNATURE_HEADER, sign(secret, timestamp, body)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The expected value was computed apart from this code, by Python's
    /// `hmac.new(secret, b"1700000000." + body, hashlib.sha256)`, as a
    /// receiver following the docs would.
    #[test]
    fn signs_timestamp_dot_body() {
        let secret = b"0123456789abcdef0123456789abcdef";
        let body = br#"{"events":[]}"#;
        assert_eq!(
            sign(secret, 1_700_000_000, body),
            "v1=df29826f9365a4c39eb569c867ae31fb39108dee0a0b3e4bcf09f11a0ba43081"
        );
    }

    #[test]
    fn another_timestamp_or_body_another_signature() {
        let secret = [7u8; 32];
        assert_ne!(sign(&secret, 1, b"x"), sign(&secret, 2, b"x"));
        assert_ne!(sign(&secret, 1, b"x"), sign(&secret, 1, b"y"));
    }
}
