//! The HTTP request every client connection opens with, as the server
//! reads it: the head (`handshake::parse_request`), the WebSocket upgrade,
//! the query parsers a request reaches (`?user=` and `?token=`, and an
//! HTTP transport's subjects, cursor and token), and the `Origin` check.
//!
//! Input: a byte choosing the head limit (mostly the node's default
//! `max_request_head`; sometimes a small one, so short inputs reach "too
//! large"),
//! then the bytes a client sends. Properties: a head that parses lies
//! within the limit and the input, and every field borrows from it; the
//! head alone parses the same, and every shorter prefix is "not complete
//! yet", never an error (a worker parses a request split across reads
//! again from its start); an accepted upgrade's 101 satisfies the client
//! side's check; every refusal is a well-formed response with its status.

use myriad_protocol::handshake::{
    parse_request, parse_switching_protocols, switching_protocols, RequestHead,
};
use myriad_server::transport::http::check_origin;

use crate::stream_query::{check_refusal, check_stream_request, check_upgrade_query};
use crate::support::{assert_http_response, assert_within, default_config};

pub fn check(data: &[u8]) {
    let Some((&limit, buf)) = data.split_first() else {
        return;
    };
    let limit = match limit {
        0xF0.. => 16 * (usize::from(limit & 0x0F) + 1),
        _ => default_config().max_request_head,
    };
    match parse_request(buf, limit) {
        Ok(None) => assert!(buf.len() < limit, "incomplete past the limit"),
        Ok(Some(head)) => check_head(buf, limit, &head),
        Err(e) => assert_http_response(&e.response(), e.status()),
    }
}

fn check_head(buf: &[u8], limit: usize, head: &RequestHead<'_>) {
    assert!(head.header_len <= buf.len().min(limit));
    let bytes = &buf[..head.header_len];
    let fields = [
        Some(head.method),
        Some(head.path),
        head.query,
        head.websocket_key,
        head.protocols,
        head.origin,
        head.host,
        head.bearer,
        head.last_event_id,
    ];
    for field in fields.into_iter().flatten() {
        assert_within(bytes, field.as_bytes(), "a request field");
    }
    let again = parse_request(bytes, limit).expect("the head alone parses");
    assert_eq!(again.as_ref(), Some(head), "the head alone parses the same");
    for cut in cuts(head.header_len) {
        assert_eq!(
            parse_request(&buf[..cut], limit),
            Ok(None),
            "a prefix of {cut} bytes of a valid head"
        );
    }

    match head.upgrade() {
        Ok(upgrade) => {
            assert_eq!(
                (upgrade.path, upgrade.query, upgrade.header_len),
                (head.path, head.query, head.header_len)
            );
            let accept = switching_protocols(upgrade.key, None, None);
            assert_eq!(
                parse_switching_protocols(&accept, upgrade.key),
                Ok(Some(accept.len())),
                "our 101 passes a client's check"
            );
        }
        Err(e) => assert_http_response(&e.response(), e.status()),
    }
    check_upgrade_query(head.query);
    check_stream_request(head, default_config());
    if let Err(e) = check_origin(head, default_config()) {
        check_refusal(&e, default_config());
    }
}

/// Where to cut a head of `len` bytes: every point of a short head, and a
/// spread of points (both ends included) of a long one.
fn cuts(len: usize) -> Vec<usize> {
    if len <= 64 {
        return (0..len).collect();
    }
    let mut cuts: Vec<usize> = (0..32).map(|i| i * len / 32).collect();
    cuts.extend([1, len - 2, len - 1]);
    cuts
}
