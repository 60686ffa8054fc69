//! A small blocking WebSocket client for `myriad sub` and `myriad pub`: the
//! 30-second demo, and a way to poke a node by hand. Built on the same
//! protocol crate as the server, with the client role (masked frames out,
//! unmasked frames in).

use std::io::{self, Read, Write};
use std::net::TcpStream;

use base64::Engine as _;
use myriad_protocol::handshake::{client_request, parse_switching_protocols, HandshakeError};
use myriad_protocol::ws::{
    encode_close, encode_frame, FrameError, Message, MessageReader, OpCode, Read as Frame,
    ReadLimits, Role,
};
use thiserror::Error;

/// Why the client stopped.
#[derive(Debug, Error)]
pub enum ClientError {
    #[error("URL must look like ws://HOST:PORT/PATH, got {0:?}")]
    BadUrl(String),
    #[error("connection failed: {0}")]
    Io(#[from] io::Error),
    #[error("handshake refused: {0}")]
    Handshake(#[from] HandshakeError),
    #[error("server broke the framing: {0}")]
    Frame(#[from] FrameError),
    #[error("server closed the connection (code {code}: {reason})")]
    Closed { code: u16, reason: String },
    #[error("server refused the request: {code}: {message}")]
    Refused { code: String, message: String },
    #[error("no node answered in {tries} tries; the last: {last}")]
    GaveUp { tries: u32, last: Box<ClientError> },
}

/// An open WebSocket connection.
pub struct Client {
    stream: TcpStream,
    reader: MessageReader,
    buf: Vec<u8>,
    /// Bytes at the front of `buf` that belong to the last returned frame.
    consumed: usize,
}

/// Splits `ws://host:port/path` into (host:port, path).
fn split_url(url: &str) -> Result<(&str, &str), ClientError> {
    let rest = url
        .strip_prefix("ws://")
        .ok_or_else(|| ClientError::BadUrl(url.to_owned()))?;
    Ok(match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/ws"),
    })
}

impl Client {
    pub fn connect(url: &str) -> Result<Client, ClientError> {
        let (authority, path) = split_url(url)?;
        let mut stream = TcpStream::connect(authority)?;
        stream.set_nodelay(true)?;
        let key = base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 16]>());
        stream.write_all(&client_request(authority, path, &key))?;
        let mut buf = Vec::with_capacity(4096);
        let mut chunk = [0u8; 4096];
        loop {
            let n = stream.read(&mut chunk)?;
            if n == 0 {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Some(head) = parse_switching_protocols(&buf, &key)? {
                buf.drain(..head);
                return Ok(Client {
                    stream,
                    reader: MessageReader::new(),
                    buf,
                    consumed: 0,
                });
            }
        }
    }

    /// Sends one text message.
    pub fn send_text(&mut self, text: &str) -> Result<(), ClientError> {
        let frame = encode_frame(OpCode::Text, text.as_bytes(), Some(rand::random()));
        self.stream.write_all(&frame)?;
        Ok(())
    }

    /// Starts the close handshake with 1000.
    pub fn close(&mut self) -> Result<(), ClientError> {
        self.stream
            .write_all(&encode_close(1000, "", Some(rand::random())))?;
        Ok(())
    }

    /// Waits for the next text message, answering pings on the way.
    pub fn next_text(&mut self) -> Result<String, ClientError> {
        let limits = ReadLimits {
            role: Role::Client,
            max_message: 64 << 20,
        };
        loop {
            self.buf.drain(..self.consumed);
            self.consumed = 0;
            let reply = match self.reader.read(&mut self.buf, &limits)? {
                Frame::Incomplete { .. } => {
                    let mut chunk = [0u8; 16 * 1024];
                    let n = self.stream.read(&mut chunk)?;
                    if n == 0 {
                        return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
                    }
                    self.buf.extend_from_slice(&chunk[..n]);
                    continue;
                }
                Frame::Frame { consumed, message } => {
                    self.consumed = consumed;
                    match message {
                        Some(Message::Text(text)) => return Ok(text.to_owned()),
                        Some(Message::Ping(payload)) => {
                            encode_frame(OpCode::Pong, payload, Some(rand::random()))
                        }
                        Some(Message::Close(status)) => {
                            let (code, reason) = status.unwrap_or((1005, ""));
                            return Err(ClientError::Closed {
                                code,
                                reason: reason.to_owned(),
                            });
                        }
                        Some(Message::Binary(_) | Message::Pong(_)) | None => continue,
                    }
                }
            };
            self.stream.write_all(&reply)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::split_url;

    #[test]
    fn urls() {
        assert_eq!(
            split_url("ws://127.0.0.1:8080/ws").unwrap(),
            ("127.0.0.1:8080", "/ws")
        );
        assert_eq!(split_url("ws://h:1").unwrap(), ("h:1", "/ws"));
        assert!(split_url("http://h:1/ws").is_err());
    }
}
