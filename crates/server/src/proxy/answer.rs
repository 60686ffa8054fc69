//! The backend's answer body, read into a [`Verdict`]: pure, so every
//! shape a backend may send is tested without a socket.
//!
//! The documented fields are `allow` (required), `code` and `reason` (a
//! refusal), and for a connect `user`, `subscribe`, `publish` and
//! `expires`. Any other field is ignored: it cannot widen what the answer
//! grants (there is no admin field to set; a connect's grants are only
//! the two lists, each pattern checked against the token grammar by the
//! sessions). A documented field of the wrong type makes the whole answer
//! malformed, a failure handled per `proxy_fail`.

use serde::Deserialize;

use crate::messages::proxy::{Admitted, ProxyKind, RefusalCode, Verdict};

/// The longest `reason` passed on to the client, in characters.
pub const MAX_REASON_CHARS: usize = 200;

#[derive(Deserialize)]
struct Body {
    allow: bool,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    subscribe: Vec<String>,
    #[serde(default)]
    publish: Vec<String>,
    #[serde(default)]
    expires: Option<u64>,
}

/// What a 2xx answer with `body` to a `kind` call says.
pub fn read(kind: ProxyKind, body: &[u8]) -> Verdict {
    let body: Body = match serde_json::from_slice(body) {
        Ok(body) => body,
        Err(e) => return Verdict::Failed(format!("malformed answer: {e}")),
    };
    if !body.allow {
        let code = match body.code.as_deref() {
            Some("forbidden") => RefusalCode::Forbidden,
            Some("rate_limited") => RefusalCode::RateLimited,
            _ => RefusalCode::ProxyRefused,
        };
        let reason = body
            .reason
            .unwrap_or_else(|| "refused by the backend".to_owned())
            .chars()
            .take(MAX_REASON_CHARS)
            .collect();
        return Verdict::Refuse { code, reason };
    }
    if kind != ProxyKind::Connect {
        return Verdict::Allow(None);
    }
    let Some(user) = body.user else {
        return Verdict::Failed("malformed answer: a connect allowed without a user".into());
    };
    Verdict::Allow(Some(Admitted {
        user,
        subscribe: body.subscribe,
        publish: body.publish,
        expires: body.expires,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_and_refuse() {
        assert_eq!(
            read(ProxyKind::Subscribe, br#"{"allow":true}"#),
            Verdict::Allow(None)
        );
        assert_eq!(
            read(
                ProxyKind::Publish,
                br#"{"allow":false,"code":"forbidden","reason":"no"}"#
            ),
            Verdict::Refuse {
                code: RefusalCode::Forbidden,
                reason: "no".into()
            }
        );
    }

    #[test]
    fn an_unknown_code_is_proxy_refused_and_the_reason_clipped() {
        let long = "x".repeat(500);
        let body = format!(r#"{{"allow":false,"code":"admin","reason":"{long}"}}"#);
        let Verdict::Refuse { code, reason } = read(ProxyKind::Subscribe, body.as_bytes()) else {
            panic!("a refusal");
        };
        assert_eq!(code, RefusalCode::ProxyRefused);
        assert_eq!(reason.len(), MAX_REASON_CHARS);
    }

    #[test]
    fn malformed_answers_are_failures() {
        for body in [
            &b"not json"[..],
            b"{}",
            br#"{"allow":"yes"}"#,
            br#"{"allow":true,"subscribe":"chat.*"}"#,
            b"[true]",
        ] {
            assert!(
                matches!(read(ProxyKind::Connect, body), Verdict::Failed(_)),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        assert!(matches!(
            read(ProxyKind::Connect, br#"{"allow":true}"#),
            Verdict::Failed(_)
        ));
    }

    #[test]
    fn unknown_fields_grant_nothing() {
        let body = br#"{"allow":true,"user":"7","admin":true,"history":["*"],"subscribe":["a.*"]}"#;
        assert_eq!(
            read(ProxyKind::Connect, body),
            Verdict::Allow(Some(Admitted {
                user: "7".into(),
                subscribe: vec!["a.*".into()],
                publish: vec![],
                expires: None,
            }))
        );
        // A subscribe or publish answer grants nothing beyond the one command.
        assert_eq!(read(ProxyKind::Subscribe, body), Verdict::Allow(None));
    }
}
