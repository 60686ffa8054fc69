//! The HTTP/1.1 request every client connection opens with: parse its head
//! ([`parse_request`], for every transport), validate it as a WebSocket
//! upgrade (RFC 6455 §4, [`RequestHead::upgrade`]), compute the accept key,
//! and write the 101 or error response; plus the client half used by the
//! bench and the built-in client.
//!
//! This module owns the bytes of the handshake only. It must not do I/O or
//! routing: which paths exist, which subprotocol to pick and whether an
//! `Origin` is allowed are the server's decisions, so the request is handed
//! back with those fields as found. Header parsing is httparse's; this file
//! adds the WebSocket rules on top.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use sha1::{Digest, Sha1};

/// The GUID appended to the client's key before hashing (RFC 6455 §1.3, §4.2.2).
pub const WEBSOCKET_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// The only protocol version RFC 6455 defines (§4.1, §11.6).
const WEBSOCKET_VERSION: &str = "13";

/// Header lines accepted in one request or response head; more is an
/// oversized head (431). Browsers send 10-20 on an upgrade, and proxies
/// and CDNs add their own (forwarding, tracing, client hints), so the
/// count leaves room for several layers of them; the byte cap of the head
/// (8 KiB on the client listener) is the bound that matters for memory.
/// The array lives on the stack for one parse: 100 × 32 bytes.
pub const MAX_HEADERS: usize = 100;

/// `Sec-WebSocket-Extensions` headers read from one request; browsers
/// send one.
pub const MAX_EXTENSION_HEADERS: usize = 4;

/// A valid upgrade request. Every field borrows from the request bytes.
#[derive(Debug)]
pub struct UpgradeRequest<'a> {
    /// The request target up to (not including) any `?`.
    pub path: &'a str,
    /// What follows the `?`, if there was one.
    pub query: Option<&'a str>,
    /// `Sec-WebSocket-Key`, checked to be base64 of 16 bytes (§4.2.1).
    pub key: &'a str,
    /// `Sec-WebSocket-Protocol` as sent (a comma list), if any. Only the
    /// first such header is kept: clients send the list in one.
    pub protocols: Option<&'a str>,
    /// `Origin`, if any; checking it is the server's policy (§10.2).
    pub origin: Option<&'a str>,
    /// Bytes of the request head, including the blank line. Anything after
    /// it is already WebSocket traffic.
    pub header_len: usize,
}

/// Why a handshake was refused. The server-side variants map to the HTTP
/// status in [`HandshakeError::status`]; the client-side ones come from
/// [`parse_switching_protocols`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HandshakeError {
    /// Not parseable as HTTP/1.x.
    #[error("malformed HTTP request")]
    Malformed,
    /// The head exceeded the byte limit or had too many headers.
    #[error("request head too large")]
    TooLarge,
    /// The method was not GET (§4.1).
    #[error("method not allowed: a WebSocket upgrade must be a GET")]
    MethodNotAllowed,
    /// HTTP/1.0 (or another version): the upgrade needs HTTP/1.1 (§4.1).
    #[error("HTTP/1.1 or later required")]
    HttpVersion,
    /// `Upgrade: websocket` or `Connection: upgrade` missing (§4.2.1).
    #[error("not a WebSocket upgrade: Upgrade: websocket and Connection: upgrade required")]
    NotUpgrade,
    /// No `Sec-WebSocket-Key` header (§4.2.1).
    #[error("missing Sec-WebSocket-Key header")]
    MissingKey,
    /// A key that is not base64 of 16 bytes, or more than one key (§4.2.1, §11.3.1).
    #[error("invalid Sec-WebSocket-Key header")]
    InvalidKey,
    /// `Sec-WebSocket-Version` missing or not 13 (§4.2.2, §4.4).
    #[error("unsupported WebSocket version: only 13 is supported")]
    UnsupportedVersion,
    /// No `Host` header (§4.1, RFC 7230 §5.4).
    #[error("missing Host header")]
    MissingHost,
    /// Client side: the server answered with another status than 101.
    #[error("server answered {0} instead of 101 Switching Protocols")]
    UnexpectedStatus(u16),
    /// Client side: the 101 had no `Sec-WebSocket-Accept` (§4.1).
    #[error("missing Sec-WebSocket-Accept header")]
    MissingAccept,
    /// Client side: `Sec-WebSocket-Accept` does not match our key (§4.1).
    #[error("Sec-WebSocket-Accept does not match the key sent")]
    AcceptMismatch,
    /// Client side: the server picked an extension we never offered (§4.1).
    #[error("server selected an extension that was not offered")]
    UnrequestedExtension,
    /// Client side: the server picked a subprotocol we never offered (§4.1).
    #[error("server selected a subprotocol that was not offered")]
    UnrequestedProtocol,
}

impl HandshakeError {
    /// The HTTP status the server answers with. Client-side errors are never
    /// sent; they report 502, the status a proxy would give a bad upstream.
    pub fn status(&self) -> u16 {
        match self {
            HandshakeError::Malformed
            | HandshakeError::HttpVersion
            | HandshakeError::MissingKey
            | HandshakeError::InvalidKey
            | HandshakeError::MissingHost => 400,
            HandshakeError::MethodNotAllowed => 405,
            HandshakeError::NotUpgrade | HandshakeError::UnsupportedVersion => 426,
            HandshakeError::TooLarge => 431,
            HandshakeError::UnexpectedStatus(_)
            | HandshakeError::MissingAccept
            | HandshakeError::AcceptMismatch
            | HandshakeError::UnrequestedExtension
            | HandshakeError::UnrequestedProtocol => 502,
        }
    }

    /// The full HTTP/1.1 response refusing the request: status, the headers
    /// the status requires, a one-line text body, and `Connection: close`.
    pub fn response(&self) -> Vec<u8> {
        let status = self.status();
        let body = format!("{self}\n");
        match status {
            // RFC 7231 §6.5.5: a 405 must list the allowed methods.
            405 => http_response(status, reason_phrase(status), &[("Allow", "GET")], &body),
            // RFC 7231 §6.5.15: a 426 must name the protocol to upgrade to, and
            // RFC 7230 §6.7 then requires `upgrade` in Connection. RFC 6455
            // §4.4: a refused version is answered with the versions we speak.
            426 => write_response(
                status,
                reason_phrase(status),
                "Upgrade, close",
                &[
                    ("Upgrade", "websocket"),
                    ("Sec-WebSocket-Version", WEBSOCKET_VERSION),
                ],
                &body,
            ),
            _ => http_response(status, reason_phrase(status), &[], &body),
        }
    }
}

/// The standard reason phrase of the statuses the client listener answers
/// with (this module's refusals and the HTTP transports').
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// Maps an httparse failure to the handshake error it amounts to.
fn parse_error(e: httparse::Error) -> HandshakeError {
    match e {
        httparse::Error::TooManyHeaders => HandshakeError::TooLarge,
        httparse::Error::Version => HandshakeError::HttpVersion,
        _ => HandshakeError::Malformed,
    }
}

/// A header value as text, without surrounding whitespace. The headers read
/// here are all ASCII by definition, so non-UTF-8 is malformed.
fn header_str(value: &[u8]) -> Result<&str, HandshakeError> {
    std::str::from_utf8(value)
        .map(|v| v.trim_matches([' ', '\t']))
        .map_err(|_| HandshakeError::Malformed)
}

/// Whether a comma-separated header value lists `token`, case-insensitively
/// (RFC 7230 §7: `Connection: keep-alive, Upgrade` is an upgrade).
fn has_token(value: &str, token: &str) -> bool {
    value
        .split(',')
        .any(|t| t.trim_matches([' ', '\t']).eq_ignore_ascii_case(token))
}

/// Whether `key` is the base64 encoding of 16 bytes (§4.2.1). A 16-byte
/// nonce always encodes to 24 characters ending in `==`.
fn is_valid_key(key: &str) -> bool {
    let mut nonce = [0u8; 18];
    key.len() == 24 && matches!(BASE64.decode_slice(key, &mut nonce), Ok(16))
}

/// The head of any request on the client listener, with the headers the
/// transports read. Every field borrows from the request bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestHead<'a> {
    pub method: &'a str,
    /// The request target up to (not including) any `?`.
    pub path: &'a str,
    /// What follows the `?`, if there was one.
    pub query: Option<&'a str>,
    /// The `Host` header (RFC 7230 §5.4 requires one).
    pub host: Option<&'a str>,
    /// `Upgrade` lists `websocket`.
    pub upgrade_websocket: bool,
    /// `Connection` lists `upgrade`.
    pub connection_upgrade: bool,
    /// `Connection` lists `close`: no further request follows this one.
    pub connection_close: bool,
    /// `Sec-WebSocket-Version` is 13.
    pub websocket_version_13: bool,
    /// `Sec-WebSocket-Key`: the last one sent (see `websocket_key_repeated`).
    pub websocket_key: Option<&'a str>,
    /// More than one `Sec-WebSocket-Key` was sent (§11.3.1 forbids it).
    pub websocket_key_repeated: bool,
    /// `Sec-WebSocket-Protocol` as sent (a comma list), first header only.
    pub protocols: Option<&'a str>,
    /// `Origin`, if any; checking it is the server's policy.
    pub origin: Option<&'a str>,
    /// `Sec-WebSocket-Extensions` values, in order: the first
    /// [`MAX_EXTENSION_HEADERS`] such headers (offers in further ones are
    /// not considered, which declining them allows: RFC 6455 §9.1).
    pub extensions: [Option<&'a str>; MAX_EXTENSION_HEADERS],
    /// The credentials of `Authorization: Bearer <credentials>`, if sent
    /// (the first such header; other schemes are not read).
    pub bearer: Option<&'a str>,
    /// `Last-Event-ID` (Server-Sent Events resumption), if any.
    pub last_event_id: Option<&'a str>,
    /// The request announces a body (`Content-Length` above 0 or any
    /// `Transfer-Encoding`); no endpoint on the client listener takes one.
    pub has_body: bool,
    /// `Content-Length` (RFC 9110 §8.6): `None` when absent or when a
    /// `Transfer-Encoding` decides the length instead (RFC 9112 §6.3);
    /// `u64::MAX`, a length no limit admits, when it is not one decimal
    /// number or is repeated with another value.
    pub content_length: Option<u64>,
    /// Bytes of the request head, including the blank line.
    pub header_len: usize,
}

/// Parses the head of an HTTP/1.1 request at the front of `buf`.
///
/// `Ok(None)` means the head is not complete yet. A head that is not
/// complete within `max_head_bytes`, or has more than [`MAX_HEADERS`] header
/// lines, is
/// `TooLarge`; a version other than 1.1 is `HttpVersion`. Which methods and
/// paths exist is the caller's business.
pub fn parse_request(
    buf: &[u8],
    max_head_bytes: usize,
) -> Result<Option<RequestHead<'_>>, HandshakeError> {
    let window = &buf[..buf.len().min(max_head_bytes)];
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let header_len = match req.parse(window).map_err(parse_error)? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial if buf.len() >= max_head_bytes => {
            return Err(HandshakeError::TooLarge)
        }
        httparse::Status::Partial => return Ok(None),
    };
    if req.version != Some(1) {
        return Err(HandshakeError::HttpVersion);
    }
    let target = req.path.ok_or(HandshakeError::Malformed)?;
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (target, None),
    };
    let mut head = RequestHead {
        method: req.method.ok_or(HandshakeError::Malformed)?,
        path,
        query,
        header_len,
        ..RequestHead::default()
    };
    let mut chunked = false;
    for header in req.headers.iter() {
        let name = header.name;
        if name.eq_ignore_ascii_case("host") {
            head.host = Some(header_str(header.value)?);
        } else if name.eq_ignore_ascii_case("upgrade") {
            head.upgrade_websocket |= has_token(header_str(header.value)?, "websocket");
        } else if name.eq_ignore_ascii_case("connection") {
            let value = header_str(header.value)?;
            head.connection_upgrade |= has_token(value, "upgrade");
            head.connection_close |= has_token(value, "close");
        } else if name.eq_ignore_ascii_case("sec-websocket-version") {
            head.websocket_version_13 = header_str(header.value)? == WEBSOCKET_VERSION;
        } else if name.eq_ignore_ascii_case("sec-websocket-key") {
            head.websocket_key_repeated |= head.websocket_key.is_some();
            head.websocket_key = Some(header_str(header.value)?);
        } else if name.eq_ignore_ascii_case("sec-websocket-protocol") {
            head.protocols = head.protocols.or(Some(header_str(header.value)?));
        } else if name.eq_ignore_ascii_case("origin") {
            head.origin = Some(header_str(header.value)?);
        } else if name.eq_ignore_ascii_case("sec-websocket-extensions") {
            let value = header_str(header.value)?;
            if let Some(free) = head.extensions.iter_mut().find(|e| e.is_none()) {
                *free = Some(value);
            }
        } else if name.eq_ignore_ascii_case("authorization") {
            let value = header_str(header.value)?;
            let bearer = value
                .split_once(' ')
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"));
            head.bearer = head
                .bearer
                .or(bearer.map(|(_, credentials)| credentials.trim()));
        } else if name.eq_ignore_ascii_case("last-event-id") {
            head.last_event_id = Some(header_str(header.value)?);
        } else if name.eq_ignore_ascii_case("content-length") {
            let value = header_str(header.value)?;
            head.has_body |= value != "0";
            // Two lengths that disagree leave none to trust.
            let length = value.parse::<u64>().ok();
            head.content_length = match head.content_length {
                Some(earlier) if length != Some(earlier) => Some(u64::MAX),
                _ => length.or(Some(u64::MAX)),
            };
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            head.has_body = true;
            chunked = true;
        }
    }
    if chunked {
        head.content_length = None;
    }
    Ok(Some(head))
}

impl<'a> RequestHead<'a> {
    /// The `Sec-WebSocket-Extensions` values sent, in order.
    pub fn extension_offers(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.extensions.iter().flatten().copied()
    }

    /// Validates this request as a WebSocket upgrade (§4.2.1). Checks run
    /// from the most general to the most specific, so a plain HTTP request
    /// to the endpoint is told 426 before anything about keys.
    pub fn upgrade(&self) -> Result<UpgradeRequest<'a>, HandshakeError> {
        if self.method != "GET" {
            return Err(HandshakeError::MethodNotAllowed);
        }
        if self.host.is_none() {
            return Err(HandshakeError::MissingHost);
        }
        if !(self.upgrade_websocket && self.connection_upgrade) {
            return Err(HandshakeError::NotUpgrade);
        }
        if !self.websocket_version_13 {
            return Err(HandshakeError::UnsupportedVersion);
        }
        if self.websocket_key_repeated {
            // §11.3.1: the key MUST NOT appear more than once.
            return Err(HandshakeError::InvalidKey);
        }
        let key = self.websocket_key.ok_or(HandshakeError::MissingKey)?;
        if !is_valid_key(key) {
            return Err(HandshakeError::InvalidKey);
        }
        Ok(UpgradeRequest {
            path: self.path,
            query: self.query,
            key,
            protocols: self.protocols,
            origin: self.origin,
            header_len: self.header_len,
        })
    }
}

/// Parses and validates a WebSocket upgrade request (§4.2.1):
/// [`parse_request`], then [`RequestHead::upgrade`].
pub fn parse_upgrade(
    buf: &[u8],
    max_head_bytes: usize,
) -> Result<Option<UpgradeRequest<'_>>, HandshakeError> {
    match parse_request(buf, max_head_bytes)? {
        None => Ok(None),
        Some(head) => head.upgrade().map(Some),
    }
}

/// The `Sec-WebSocket-Accept` value for a client key:
/// base64(SHA-1(key + GUID)) (§4.2.2 step 5.4).
pub fn accept_key(key: &str) -> String {
    let mut sha = Sha1::new();
    sha.update(key.as_bytes());
    sha.update(WEBSOCKET_GUID.as_bytes());
    BASE64.encode(sha.finalize())
}

/// The 101 response accepting an upgrade (§4.2.2 step 5), naming `protocol`
/// if the server selected one and the accepted `extensions` if any (the
/// `Sec-WebSocket-Extensions` value, e.g. `ws::deflate::Agreement::response`).
pub fn switching_protocols(key: &str, protocol: Option<&str>, extensions: Option<&str>) -> Vec<u8> {
    let mut out = String::with_capacity(160);
    out.push_str("HTTP/1.1 101 Switching Protocols\r\n");
    push_header(&mut out, "Upgrade", "websocket");
    push_header(&mut out, "Connection", "Upgrade");
    push_header(&mut out, "Sec-WebSocket-Accept", &accept_key(key));
    if let Some(protocol) = protocol {
        push_header(&mut out, "Sec-WebSocket-Protocol", protocol);
    }
    if let Some(extensions) = extensions {
        push_header(&mut out, "Sec-WebSocket-Extensions", extensions);
    }
    out.push_str("\r\n");
    out.into_bytes()
}

/// Any other plain HTTP response (used for 404 etc. by the server):
/// `Connection: close`, a `Content-Length`, and a text/plain content type
/// unless the body is empty or `extra_headers` names one.
pub fn http_response(
    status: u16,
    reason: &str,
    extra_headers: &[(&str, &str)],
    body: &str,
) -> Vec<u8> {
    write_response(status, reason, "close", extra_headers, body)
}

/// [`http_response`] with a chosen `Connection` value.
fn write_response(
    status: u16,
    reason: &str,
    connection: &str,
    extra_headers: &[(&str, &str)],
    body: &str,
) -> Vec<u8> {
    let mut out = String::with_capacity(128 + body.len());
    out.push_str("HTTP/1.1 ");
    out.push_str(&status.to_string());
    out.push(' ');
    out.push_str(reason);
    out.push_str("\r\n");
    for (name, value) in extra_headers {
        push_header(&mut out, name, value);
    }
    let has_type = extra_headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("content-type"));
    if !body.is_empty() && !has_type {
        push_header(&mut out, "Content-Type", "text/plain; charset=utf-8");
    }
    push_header(&mut out, "Content-Length", &body.len().to_string());
    push_header(&mut out, "Connection", connection);
    out.push_str("\r\n");
    out.push_str(body);
    out.into_bytes()
}

fn push_header(out: &mut String, name: &str, value: &str) {
    out.push_str(name);
    out.push_str(": ");
    out.push_str(value);
    out.push_str("\r\n");
}

/// Client side: the GET upgrade request (§4.1) for `path` on `host`, with
/// `key` as the nonce (base64 of 16 random bytes, chosen by the caller so
/// this stays free of randomness). No subprotocol or extension is offered.
pub fn client_request(host: &str, path: &str, key: &str) -> Vec<u8> {
    let mut out = String::with_capacity(160 + host.len() + path.len());
    out.push_str("GET ");
    out.push_str(path);
    out.push_str(" HTTP/1.1\r\n");
    push_header(&mut out, "Host", host);
    push_header(&mut out, "Upgrade", "websocket");
    push_header(&mut out, "Connection", "Upgrade");
    push_header(&mut out, "Sec-WebSocket-Key", key);
    push_header(&mut out, "Sec-WebSocket-Version", WEBSOCKET_VERSION);
    out.push_str("\r\n");
    out.into_bytes()
}

/// Client side: validates the server's answer to [`client_request`] (§4.1):
/// status 101, `Upgrade: websocket`, `Connection: upgrade`, the accept value
/// for `key`, and no extension or subprotocol (we offered none).
///
/// `Ok(None)` means the head is not complete yet; `Ok(Some(n))` gives the
/// head length, after which WebSocket frames may already follow.
pub fn parse_switching_protocols(buf: &[u8], key: &str) -> Result<Option<usize>, HandshakeError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut headers);
    let head_len = match res.parse(buf).map_err(parse_error)? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return Ok(None),
    };
    if res.version != Some(1) {
        return Err(HandshakeError::HttpVersion);
    }
    match res.code {
        Some(101) => {}
        other => return Err(HandshakeError::UnexpectedStatus(other.unwrap_or(0))),
    }

    let mut upgrade = false;
    let mut connection = false;
    let mut accept = None;
    for header in res.headers.iter() {
        let name = header.name;
        if name.eq_ignore_ascii_case("upgrade") {
            upgrade |= has_token(header_str(header.value)?, "websocket");
        } else if name.eq_ignore_ascii_case("connection") {
            connection |= has_token(header_str(header.value)?, "upgrade");
        } else if name.eq_ignore_ascii_case("sec-websocket-accept") {
            accept = Some(header_str(header.value)?);
        } else if name.eq_ignore_ascii_case("sec-websocket-extensions") {
            return Err(HandshakeError::UnrequestedExtension);
        } else if name.eq_ignore_ascii_case("sec-websocket-protocol") {
            return Err(HandshakeError::UnrequestedProtocol);
        }
    }
    if !(upgrade && connection) {
        return Err(HandshakeError::NotUpgrade);
    }
    match accept {
        None => Err(HandshakeError::MissingAccept),
        Some(accept) if accept != accept_key(key) => Err(HandshakeError::AcceptMismatch),
        Some(_) => Ok(Some(head_len)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_validation() {
        assert!(is_valid_key("dGhlIHNhbXBsZSBub25jZQ=="));
        assert!(!is_valid_key("dGhlIHNhbXBsZSBub25jZQ")); // unpadded
        assert!(!is_valid_key("dGhlIHNhbXBsZSBub25jZSE=")); // 17 bytes
        assert!(!is_valid_key("dGhlIHNhbXBsZSBub25j")); // 15 bytes
        assert!(!is_valid_key("!!!!!!!!!!!!!!!!!!!!!!=="));
    }

    #[test]
    fn token_lists() {
        assert!(has_token("keep-alive, Upgrade", "upgrade"));
        assert!(has_token("UPGRADE", "upgrade"));
        assert!(!has_token("upgrades", "upgrade"));
        assert!(!has_token("", "upgrade"));
    }

    #[test]
    fn content_length_is_read_once_and_only_when_it_decides() {
        let length = |headers: &str| {
            let text = format!("POST /cmd HTTP/1.1\r\nHost: x\r\n{headers}\r\n");
            let head = parse_request(text.as_bytes(), 8192).unwrap().unwrap();
            (head.content_length, head.has_body)
        };
        assert_eq!(length(""), (None, false));
        assert_eq!(length("Content-Length: 0\r\n"), (Some(0), false));
        assert_eq!(length("Content-Length: 42\r\n"), (Some(42), true));
        assert_eq!(
            length("Content-Length: 4\r\nContent-Length: 4\r\n"),
            (Some(4), true)
        );
        assert_eq!(
            length("Content-Length: 4\r\nContent-Length: 5\r\n"),
            (Some(u64::MAX), true)
        );
        assert_eq!(length("Content-Length: -1\r\n"), (Some(u64::MAX), true));
        assert_eq!(
            length("Content-Length: 4\r\nTransfer-Encoding: chunked\r\n"),
            (None, true)
        );
    }
}
