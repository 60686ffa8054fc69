//! Reading a Server-Sent Events body (HTML Living Standard, "Server-sent
//! events", §9.2.6 "Interpreting an event stream"): one block of lines at a
//! time, up to the blank line that dispatches it.
//!
//! A block is an event when it has `data` lines (joined by newlines, as
//! EventSource joins them), a comment block when it only has comment lines
//! (what servers send as heartbeats), and nothing worth telling otherwise
//! (`retry:`, an `id:` alone). Lines end with CRLF, LF or CR. Fields other
//! than `data`, `event` and `id` are read past. The `id` is handed out as
//! sent: the bench resumes from the positions it has seen itself.

use std::borrow::Cow;

use memchr::memchr2;

use super::{incomplete, TooLarge};

/// One block of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block<'a> {
    /// An event.
    Event(Event<'a>),
    /// Comment lines only: a heartbeat.
    Comment,
    /// No data and not only comments.
    Other,
}

/// A dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event<'a> {
    /// Its type (`event:`), if named.
    pub name: Option<&'a [u8]>,
    /// Its `id:`, if it has one.
    pub id: Option<&'a [u8]>,
    /// Its data lines, joined by `\n`: borrowed when there is one, the
    /// only kind myriad sends.
    pub data: Cow<'a, [u8]>,
}

/// The block at the front of `buf` and the bytes it used, or None while it
/// is incomplete. A block may not pass `max` bytes.
pub fn next_block(buf: &[u8], max: usize) -> Result<Option<(usize, Block<'_>)>, TooLarge> {
    let mut pos = 0;
    let (mut name, mut id, mut data) = (None, None, None::<Cow<'_, [u8]>>);
    let (mut comments, mut fields) = (false, false);
    loop {
        let Some(at) = memchr2(b'\n', b'\r', &buf[pos..]) else {
            return incomplete(buf, max);
        };
        let line = &buf[pos..pos + at];
        let end = pos + at;
        pos = match buf[end] {
            // A CR at the end of what has arrived may be the first half of
            // a CRLF.
            b'\r' if end + 1 == buf.len() => return incomplete(buf, max),
            b'\r' if buf[end + 1] == b'\n' => end + 2,
            _ => end + 1,
        };
        if line.is_empty() {
            let block = match data {
                Some(data) => Block::Event(Event { name, id, data }),
                None if comments && !fields => Block::Comment,
                None => Block::Other,
            };
            return Ok(Some((pos, block)));
        }
        if line[0] == b':' {
            comments = true;
            continue;
        }
        fields = true;
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                data = Some(match data {
                    None => Cow::Borrowed(value),
                    Some(before) => {
                        let mut joined = before.into_owned();
                        joined.push(b'\n');
                        joined.extend_from_slice(value);
                        Cow::Owned(joined)
                    }
                })
            }
            b"event" => name = Some(value),
            // An id holding NUL is ignored, as EventSource ignores it.
            b"id" if !value.contains(&0) => id = Some(value),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::http::testing::same_at_every_split;

    /// (name, id, data) of each event; "comment" and "other" for the rest.
    fn blocks(stream: &[u8]) -> Vec<String> {
        same_at_every_split(stream, |buf| {
            let (used, block) = next_block(buf, 1 << 20).unwrap()?;
            let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
            let shown = match block {
                Block::Event(e) => format!(
                    "{}|{}|{}",
                    e.name.map_or("-".into(), text),
                    e.id.map_or("-".into(), text),
                    text(&e.data)
                ),
                Block::Comment => "comment".into(),
                Block::Other => "other".into(),
            };
            Some((used, shown))
        })
    }

    #[test]
    fn what_myriad_sends() {
        let stream = b"retry: 2000\n\n\
            event: subscribed\ndata: {\"op\":\"subscribed\",\"subject\":\"a\"}\nid: 00000000000000ab:16\n\n\
            data: {\"op\":\"msg\",\"offset\":17}\nid: 00000000000000ab:17\n\n\
            : heartbeat\n\n\
            event: close\ndata: {\"op\":\"close\",\"code\":1001}\n\n";
        assert_eq!(
            blocks(stream),
            [
                "other",
                "subscribed|00000000000000ab:16|{\"op\":\"subscribed\",\"subject\":\"a\"}",
                "-|00000000000000ab:17|{\"op\":\"msg\",\"offset\":17}",
                "comment",
                "close|-|{\"op\":\"close\",\"code\":1001}",
            ]
        );
    }

    #[test]
    fn lines_join_and_end_every_way() {
        // A CRLF blank line after comments, then a lone LF one.
        let stream = b"data: one\r\ndata:two\rdata\n: note\nid\n\r\n\
            :a\r:b\r\n\r\n\
            \n\
            event:x\nfoo: bar\n\n";
        assert_eq!(
            blocks(stream),
            ["-||one\ntwo\n", "comment", "other", "other"]
        );
    }

    #[test]
    fn a_data_line_alone_borrows_and_nul_ids_are_ignored() {
        let (used, block) = next_block(b"data: x\nid: a\0b\n\nmore", 64)
            .unwrap()
            .unwrap();
        assert_eq!(used, 17);
        let Block::Event(e) = block else { panic!() };
        assert!(matches!(e.data, Cow::Borrowed(b"x")));
        assert_eq!(e.id, None);
    }

    #[test]
    fn an_open_block_is_bounded() {
        assert_eq!(next_block(b"data: 12345", 64), Ok(None));
        assert_eq!(next_block(b"data: 12345\r", 64), Ok(None), "CR may be CRLF");
        assert_eq!(next_block(b"data: 12345", 8), Err(TooLarge(8)));
    }
}
