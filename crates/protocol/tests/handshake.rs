//! The opening handshake (RFC 6455 §4) with literal requests and responses.

use myriad_protocol::handshake::*;

const MAX: usize = 8192;
const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

/// The RFC 6455 §1.2 example request, with a query string added.
const RFC_REQUEST: &str = "GET /chat?room=1&x=2 HTTP/1.1\r\n\
Host: server.example.com\r\n\
Upgrade: websocket\r\n\
Connection: Upgrade\r\n\
Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
Origin: http://example.com\r\n\
Sec-WebSocket-Protocol: chat, superchat\r\n\
Sec-WebSocket-Version: 13\r\n\
\r\n";

/// A minimal valid request, minus the standard header starting with `skip`
/// (if not empty), plus `extra` header lines (each ending in CRLF).
fn request_without(skip: &str, extra: &str) -> String {
    let lines = [
        "Host: localhost:8080",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version: 13",
    ];
    let mut req = String::from("GET /ws HTTP/1.1\r\n");
    for line in lines {
        if skip.is_empty() || !line.starts_with(skip) {
            req.push_str(line);
            req.push_str("\r\n");
        }
    }
    req.push_str(extra);
    req.push_str("\r\n");
    req
}

fn parse_err(req: &str) -> HandshakeError {
    parse_upgrade(req.as_bytes(), MAX).unwrap_err()
}

/// Checks that `bytes` is a well-formed HTTP/1.1 response with `status`,
/// `Connection: close` and a Content-Length matching the body; returns the
/// headers as (lowercase name, value) pairs.
fn check_response(bytes: &[u8], status: u16) -> Vec<(String, String)> {
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut res = httparse::Response::new(&mut headers);
    let head = match res.parse(bytes).unwrap() {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => panic!("incomplete response"),
    };
    assert_eq!(res.version, Some(1));
    assert_eq!(res.code, Some(status));
    let headers: Vec<(String, String)> = res
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_ascii_lowercase(),
                String::from_utf8(h.value.to_vec()).unwrap(),
            )
        })
        .collect();
    let get = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let connection = get("connection").unwrap().to_ascii_lowercase();
    assert!(
        connection.split(',').any(|t| t.trim() == "close"),
        "{connection}"
    );
    let len: usize = get("content-length").unwrap().parse().unwrap();
    assert_eq!(bytes.len() - head, len);
    headers
}

#[test]
fn rfc_accept_key() {
    assert_eq!(accept_key(KEY), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    assert_eq!(WEBSOCKET_GUID, "258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
}

#[test]
fn valid_request() {
    let req = parse_upgrade(RFC_REQUEST.as_bytes(), MAX).unwrap().unwrap();
    assert_eq!(req.path, "/chat");
    assert_eq!(req.query, Some("room=1&x=2"));
    assert_eq!(req.key, KEY);
    assert_eq!(req.protocols, Some("chat, superchat"));
    assert_eq!(req.origin, Some("http://example.com"));
    assert_eq!(req.header_len, RFC_REQUEST.len());

    let minimal = request_without("", "");
    let req = parse_upgrade(minimal.as_bytes(), MAX).unwrap().unwrap();
    assert_eq!((req.path, req.query), ("/ws", None));
    assert_eq!((req.protocols, req.origin), (None, None));
}

#[test]
fn bytes_after_the_head_are_not_consumed() {
    let mut bytes = RFC_REQUEST.as_bytes().to_vec();
    bytes.extend_from_slice(&[0x81, 0x85, 1, 2, 3, 4]);
    let req = parse_upgrade(&bytes, MAX).unwrap().unwrap();
    assert_eq!(req.header_len, RFC_REQUEST.len());
}

#[test]
fn split_at_every_offset_is_incomplete_until_complete() {
    let bytes = RFC_REQUEST.as_bytes();
    for end in 0..bytes.len() {
        assert_eq!(
            parse_upgrade(&bytes[..end], MAX).map(|r| r.is_some()),
            Ok(false),
            "at {end}"
        );
    }
    assert!(parse_upgrade(bytes, MAX).unwrap().is_some());
}

#[test]
fn header_names_and_tokens_are_case_insensitive() {
    let req = "GET / HTTP/1.1\r\n\
host: a\r\n\
UPGRADE: WebSocket\r\n\
connection: keep-alive, UPGRADE\r\n\
SEC-WEBSOCKET-KEY: dGhlIHNhbXBsZSBub25jZQ==\r\n\
sec-websocket-version: 13\r\n\
ORIGIN: https://b\r\n\
\r\n";
    let parsed = parse_upgrade(req.as_bytes(), MAX).unwrap().unwrap();
    assert_eq!(parsed.key, KEY);
    assert_eq!(parsed.origin, Some("https://b"));
}

#[test]
fn connection_is_a_token_list() {
    for value in [
        "keep-alive, Upgrade",
        "Upgrade, keep-alive",
        "upgrade",
        "keep-alive,upgrade",
    ] {
        let req = request_without("Connection", &format!("Connection: {value}\r\n"));
        assert!(
            parse_upgrade(req.as_bytes(), MAX).unwrap().is_some(),
            "{value}"
        );
    }
    // Split over two Connection headers.
    let req = request_without(
        "Connection",
        "Connection: keep-alive\r\nConnection: Upgrade\r\n",
    );
    assert!(parse_upgrade(req.as_bytes(), MAX).unwrap().is_some());
    for value in ["keep-alive", "upgraded", "close"] {
        let req = request_without("Connection", &format!("Connection: {value}\r\n"));
        assert_eq!(parse_err(&req), HandshakeError::NotUpgrade, "{value}");
    }
}

#[test]
fn malformed() {
    for req in [
        "GET / HTTP/1.1\r\nNo colon here\r\n\r\n",
        "\x00\x01\x02 garbage\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: web\x01socket\r\n\r\n",
    ] {
        let err = parse_err(req);
        assert_eq!(err, HandshakeError::Malformed, "{req:?}");
        assert_eq!(err.status(), 400);
    }
}

#[test]
fn too_large() {
    // No end of head within the limit.
    let long = format!("GET /{} HTTP/1.1\r\n", "a".repeat(100));
    assert_eq!(
        parse_upgrade(long.as_bytes(), 64).unwrap_err(),
        HandshakeError::TooLarge
    );
    assert_eq!(
        parse_upgrade(&long.as_bytes()[..63], 64).map(|r| r.is_some()),
        Ok(false)
    );
    // A complete head that is longer than the limit.
    let err = parse_upgrade(RFC_REQUEST.as_bytes(), RFC_REQUEST.len() - 1).unwrap_err();
    assert_eq!(err, HandshakeError::TooLarge);
    assert!(parse_upgrade(RFC_REQUEST.as_bytes(), RFC_REQUEST.len())
        .unwrap()
        .is_some());
    // MAX_HEADERS lines are fine, one more is not, each line small: the
    // count decides, not the byte cap. (The five standard lines count.)
    let extra = |n: usize| -> String { (0..n).map(|i| format!("X-P{i}: v\r\n")).collect() };
    let fits = request_without("", &extra(MAX_HEADERS - 5));
    assert!(fits.len() < MAX, "{} bytes", fits.len());
    assert!(parse_upgrade(fits.as_bytes(), MAX).unwrap().is_some());
    let over = request_without("", &extra(MAX_HEADERS - 4));
    assert!(over.len() < MAX);
    let err = parse_err(&over);
    assert_eq!(err, HandshakeError::TooLarge);
    assert_eq!(err.status(), 431);
    check_response(&err.response(), 431);
}

#[test]
fn method_not_allowed() {
    let req = request_without("", "").replacen("GET", "POST", 1);
    let err = parse_err(&req);
    assert_eq!(err, HandshakeError::MethodNotAllowed);
    assert_eq!(err.status(), 405);
    let headers = check_response(&err.response(), 405);
    assert!(headers.contains(&("allow".to_owned(), "GET".to_owned())));
}

#[test]
fn http_version() {
    let req = request_without("", "").replacen("HTTP/1.1", "HTTP/1.0", 1);
    let err = parse_err(&req);
    assert_eq!(err, HandshakeError::HttpVersion);
    assert_eq!(err.status(), 400);
    let req = request_without("", "").replacen("HTTP/1.1", "HTTP/2.0", 1);
    assert_eq!(parse_err(&req), HandshakeError::HttpVersion);
}

#[test]
fn not_upgrade() {
    for (skip, extra) in [
        ("Upgrade", ""),
        ("Connection", ""),
        ("Upgrade", "Upgrade: h2c\r\n"),
        ("Connection", "Connection: keep-alive\r\n"),
    ] {
        let err = parse_err(&request_without(skip, extra));
        assert_eq!(err, HandshakeError::NotUpgrade, "{skip} {extra}");
        assert_eq!(err.status(), 426);
        let headers = check_response(&err.response(), 426);
        assert!(headers.contains(&("upgrade".to_owned(), "websocket".to_owned())));
    }
    // A plain browser GET.
    let plain = "GET /ws HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n";
    assert_eq!(parse_err(plain), HandshakeError::NotUpgrade);
}

#[test]
fn missing_key() {
    let err = parse_err(&request_without("Sec-WebSocket-Key", ""));
    assert_eq!(err, HandshakeError::MissingKey);
    assert_eq!(err.status(), 400);
    check_response(&err.response(), 400);
}

#[test]
fn invalid_key() {
    for key in [
        "",
        "dGhlIHNhbXBsZSBub25jZQ",       // no padding
        "dGhlIHNhbXBsZSBub25jZSE=",     // 17 bytes
        "dGhlIHNhbXBsZQ==",             // 10 bytes
        "dGhlIHNhbXBsZSBub25jZQ==dGhl", // trailing junk
        "dGhlIHNhbXBsZSBub25jZ@==",
    ] {
        let req = request_without(
            "Sec-WebSocket-Key",
            &format!("Sec-WebSocket-Key: {key}\r\n"),
        );
        let err = parse_err(&req);
        assert_eq!(err, HandshakeError::InvalidKey, "{key:?}");
        assert_eq!(err.status(), 400);
    }
    // Two keys (RFC 6455 §11.3.1).
    let req = request_without("", &format!("Sec-WebSocket-Key: {KEY}\r\n"));
    assert_eq!(parse_err(&req), HandshakeError::InvalidKey);
}

#[test]
fn unsupported_version() {
    for extra in [
        "",
        "Sec-WebSocket-Version: 8\r\n",
        "Sec-WebSocket-Version: 14\r\n",
    ] {
        let err = parse_err(&request_without("Sec-WebSocket-Version", extra));
        assert_eq!(err, HandshakeError::UnsupportedVersion, "{extra:?}");
        assert_eq!(err.status(), 426);
        let headers = check_response(&err.response(), 426);
        assert!(headers.contains(&("sec-websocket-version".to_owned(), "13".to_owned())));
    }
}

#[test]
fn missing_host() {
    let err = parse_err(&request_without("Host", ""));
    assert_eq!(err, HandshakeError::MissingHost);
    assert_eq!(err.status(), 400);
}

#[test]
fn error_responses_are_complete_http() {
    let all = [
        HandshakeError::Malformed,
        HandshakeError::TooLarge,
        HandshakeError::MethodNotAllowed,
        HandshakeError::HttpVersion,
        HandshakeError::NotUpgrade,
        HandshakeError::MissingKey,
        HandshakeError::InvalidKey,
        HandshakeError::UnsupportedVersion,
        HandshakeError::MissingHost,
    ];
    for err in all {
        let bytes = err.response();
        check_response(&bytes, err.status());
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.ends_with(&format!("{err}\n")), "{text}");
    }
}

#[test]
fn switching_protocols_response() {
    assert_eq!(
        switching_protocols(KEY, None, None),
        b"HTTP/1.1 101 Switching Protocols\r\n\
Upgrade: websocket\r\n\
Connection: Upgrade\r\n\
Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\
\r\n"
    );
    let with_protocol = String::from_utf8(switching_protocols(KEY, Some("chat"), None)).unwrap();
    assert!(with_protocol.contains("\r\nSec-WebSocket-Protocol: chat\r\n"));
    assert!(with_protocol.ends_with("\r\n\r\n"));
}

#[test]
fn plain_http_response() {
    let bytes = http_response(404, "Not Found", &[("X-Test", "1")], "no such path\n");
    let headers = check_response(&bytes, 404);
    assert!(headers.contains(&("x-test".to_owned(), "1".to_owned())));
    assert!(headers.contains(&(
        "content-type".to_owned(),
        "text/plain; charset=utf-8".to_owned()
    )));
    assert!(bytes.ends_with(b"\r\n\r\nno such path\n"));

    let json = http_response(200, "OK", &[("Content-Type", "application/json")], "{}");
    let headers = check_response(&json, 200);
    assert_eq!(
        headers.iter().filter(|(n, _)| n == "content-type").count(),
        1
    );

    let empty = http_response(204, "No Content", &[], "");
    let headers = check_response(&empty, 204);
    assert!(headers.contains(&("content-length".to_owned(), "0".to_owned())));
    assert!(!headers.iter().any(|(n, _)| n == "content-type"));
}

#[test]
fn client_request_is_accepted_by_the_server_side() {
    let bytes = client_request("example.com:80", "/ws?token=abc", KEY);
    let req = parse_upgrade(&bytes, MAX).unwrap().unwrap();
    assert_eq!(req.path, "/ws");
    assert_eq!(req.query, Some("token=abc"));
    assert_eq!(req.key, KEY);
    assert_eq!(req.header_len, bytes.len());
}

#[test]
fn client_accepts_a_valid_101() {
    let res = switching_protocols(KEY, None, None);
    for end in 0..res.len() {
        assert_eq!(
            parse_switching_protocols(&res[..end], KEY),
            Ok(None),
            "at {end}"
        );
    }
    assert_eq!(parse_switching_protocols(&res, KEY), Ok(Some(res.len())));
    // Frames may follow the head in the same read.
    let mut with_frame = res.clone();
    with_frame.extend_from_slice(&[0x81, 0x00]);
    assert_eq!(
        parse_switching_protocols(&with_frame, KEY),
        Ok(Some(res.len()))
    );
    // Case-insensitive names and tokens.
    let lower = "HTTP/1.1 101 Switching Protocols\r\nupgrade: WebSocket\r\nconnection: upgrade\r\nsec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";
    assert_eq!(
        parse_switching_protocols(lower.as_bytes(), KEY),
        Ok(Some(lower.len()))
    );
}

#[test]
fn client_rejects_bad_responses() {
    let other_key = "AQIDBAUGBwgJCgsMDQ4PEA==";
    assert_eq!(
        parse_switching_protocols(&switching_protocols(other_key, None, None), KEY),
        Err(HandshakeError::AcceptMismatch)
    );
    let refused = HandshakeError::NotUpgrade.response();
    assert_eq!(
        parse_switching_protocols(&refused, KEY),
        Err(HandshakeError::UnexpectedStatus(426))
    );
    let not_found = http_response(404, "Not Found", &[], "");
    assert_eq!(
        parse_switching_protocols(&not_found, KEY),
        Err(HandshakeError::UnexpectedStatus(404))
    );
    let no_accept =
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
    assert_eq!(
        parse_switching_protocols(no_accept.as_bytes(), KEY),
        Err(HandshakeError::MissingAccept)
    );
    let no_upgrade = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";
    assert_eq!(
        parse_switching_protocols(no_upgrade.as_bytes(), KEY),
        Err(HandshakeError::NotUpgrade)
    );
    let valid = String::from_utf8(switching_protocols(KEY, None, None)).unwrap();
    let with_ext = valid.replace(
        "\r\n\r\n",
        "\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n",
    );
    assert_eq!(
        parse_switching_protocols(with_ext.as_bytes(), KEY),
        Err(HandshakeError::UnrequestedExtension)
    );
    let with_proto = String::from_utf8(switching_protocols(KEY, Some("chat"), None)).unwrap();
    assert_eq!(
        parse_switching_protocols(with_proto.as_bytes(), KEY),
        Err(HandshakeError::UnrequestedProtocol)
    );
    assert_eq!(
        parse_switching_protocols(b"HTTP/1.1 abc\r\n\r\n", KEY),
        Err(HandshakeError::Malformed)
    );
}

#[test]
fn the_host_and_a_bearer_token_are_read() {
    let bearer = |extra: &str| {
        let req = request_without("", extra);
        let head = parse_request(req.as_bytes(), MAX).unwrap().unwrap();
        assert_eq!(head.host, Some("localhost:8080"));
        head.bearer.map(str::to_owned)
    };
    assert_eq!(bearer(""), None);
    assert_eq!(
        bearer("Authorization: Bearer a.b.c\r\n"),
        Some("a.b.c".into())
    );
    assert_eq!(
        bearer("authorization: bearer  a.b.c \r\n"),
        Some("a.b.c".into())
    );
    assert_eq!(bearer("Authorization: Basic dXNlcjpwdw==\r\n"), None);
    assert_eq!(
        bearer("Authorization: Bearer first\r\nAuthorization: Bearer second\r\n"),
        Some("first".into()),
        "the first one counts"
    );
}

#[test]
fn extension_offers_are_kept_in_order_and_answered() {
    let req = request_without(
        "",
        "Sec-WebSocket-Extensions: x-webkit-deflate-frame\r\n\
sec-websocket-extensions: permessage-deflate; client_max_window_bits\r\n",
    );
    let head = parse_request(req.as_bytes(), MAX).unwrap().unwrap();
    let offers: Vec<&str> = head.extension_offers().collect();
    assert_eq!(
        offers,
        [
            "x-webkit-deflate-frame",
            "permessage-deflate; client_max_window_bits"
        ]
    );
    let answer = myriad_protocol::ws::deflate::negotiate(head.extension_offers())
        .agreed
        .unwrap()
        .response();
    let res = String::from_utf8(switching_protocols(KEY, None, Some(&answer))).unwrap();
    assert!(res.contains(
        "\r\nSec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; \
client_no_context_takeover\r\n"
    ));
    let plain = request_without("", "");
    let plain = parse_request(plain.as_bytes(), MAX).unwrap().unwrap();
    assert_eq!(plain.extension_offers().count(), 0);
}
