//! Reading long-poll answers: one whole response at a time, its body a JSON
//! array of protocol v1 messages whose last element is the cursor for the
//! next poll, `{"op":"poll","since":"…"}` (docs/protocol.md, "Long-poll").
//!
//! An answer is taken whole (its `Content-Length` says when it is), then
//! split into its elements without copying them; reading each element is
//! the protocol crate's [`parse_server_message`].

use std::borrow::Cow;

use myriad_protocol::message::{parse_server_message, ServerMessage};
use serde_json::value::RawValue;
use thiserror::Error;

use super::{parse_head, HeadError, Receive};

/// One long-poll answer.
#[derive(Debug)]
pub struct Answer<'a> {
    /// Every element, oldest first, the closing cursor included.
    pub elements: Vec<&'a RawValue>,
    /// The cursor to poll from next.
    pub since: Cow<'a, str>,
}

/// Why an answer cannot be read.
#[derive(Debug, Error)]
pub enum PollError {
    /// The head is broken, not a 200, or gives no length.
    #[error(transparent)]
    Head(#[from] HeadError),
    /// A body longer than the limit.
    #[error("answer of {0} bytes")]
    TooLarge(usize),
    /// The body is not a JSON array.
    #[error("answer is not a JSON array: {0}")]
    Json(#[from] serde_json::Error),
    /// The array does not end with the cursor.
    #[error("answer does not end with {{\"op\":\"poll\",\"since\":…}}")]
    NoCursor,
}

/// The answer at the front of `buf` and the bytes it used, or None while it
/// is incomplete. Its body may not pass `max` bytes.
pub fn next_answer(buf: &[u8], max: usize) -> Result<Option<(usize, Answer<'_>)>, PollError> {
    let Some(head) = parse_head(buf)? else {
        return Ok(None);
    };
    head.expect(Receive::Poll)?;
    let len = head.content_length.unwrap_or_default();
    if len > max {
        return Err(PollError::TooLarge(len));
    }
    let Some(body) = buf.get(head.len..head.len + len) else {
        return Ok(None);
    };
    let elements: Vec<&RawValue> = serde_json::from_slice(body)?;
    let since = match elements.last().map(|e| parse_server_message(e.get())) {
        Some(Ok(ServerMessage::Poll { since })) => since,
        _ => return Err(PollError::NoCursor),
    };
    Ok(Some((head.len + len, Answer { elements, since })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::http::testing::same_at_every_split;

    fn answer(body: &str) -> String {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: keep-alive\r\n\r\n{body}",
            body.len()
        )
    }

    #[test]
    fn answers_come_whole_with_their_cursor() {
        let first = answer(
            "[{\"op\":\"msg\",\"subject\":\"a\",\"offset\":5,\"data\":[1,\"],\"]},\n {\"op\":\"poll\",\"since\":\"00000000000000ab:5\"}]",
        );
        let second = answer("[{\"op\":\"poll\",\"since\":\"00000000000000ab:5,\"}]");
        let stream = [first, second].concat();
        let units = same_at_every_split(stream.as_bytes(), |buf| {
            let (used, a) = next_answer(buf, 1 << 20).unwrap()?;
            let elements: Vec<String> = a.elements.iter().map(|e| e.get().to_owned()).collect();
            Some((used, (elements, a.since.into_owned())))
        });
        assert_eq!(units.len(), 2);
        assert_eq!(
            units[0].0,
            [
                "{\"op\":\"msg\",\"subject\":\"a\",\"offset\":5,\"data\":[1,\"],\"]}",
                "{\"op\":\"poll\",\"since\":\"00000000000000ab:5\"}"
            ]
        );
        assert_eq!(units[0].1, "00000000000000ab:5");
        assert_eq!(units[1].1, "00000000000000ab:5,", "two subjects");
    }

    #[test]
    fn what_is_not_an_answer() {
        let refused = "HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\n{}";
        assert!(matches!(
            next_answer(refused.as_bytes(), 64),
            Err(PollError::Head(HeadError::Status(400)))
        ));
        let chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(matches!(
            next_answer(chunked.as_bytes(), 64),
            Err(PollError::Head(HeadError::Framing(Receive::Poll)))
        ));
        assert!(matches!(
            next_answer(answer("{}").as_bytes(), 64),
            Err(PollError::Json(_))
        ));
        assert!(matches!(
            next_answer(answer("[{\"op\":\"msg\"}]").as_bytes(), 64),
            Err(PollError::NoCursor)
        ));
        assert!(matches!(
            next_answer(answer("[]").as_bytes(), 64),
            Err(PollError::NoCursor)
        ));
        assert!(matches!(
            next_answer(answer("[1,2,3]").as_bytes(), 4),
            Err(PollError::TooLarge(7))
        ));
    }
}
