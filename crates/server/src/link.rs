//! A client connection's byte stream: plain TCP, or TLS over it. The worker
//! reads plaintext from a [`Link`], hands it its outbound queue to write
//! and asks it to shut down, and never asks which kind it has.
//!
//! A TLS link first runs its handshake (`crate::tls::handshake`), writing
//! the server's side of it as reads bring the client's; then it keeps only
//! the record layer's keys (`crate::tls::record`) and, like the rest of the
//! connection, buffers that exist only while they hold bytes: the start of
//! a record that has not fully arrived, and sealed records the socket
//! would not take yet. Reads decrypt in place in the worker's scratch
//! buffer; writes seal a batch of queued frames into the worker's seal
//! buffer and send it with one `write`.
//!
//! Must not: know about requests, frames or sessions; hold a buffer while
//! idle.

use std::io::{self, Read, Write};
use std::net::Shutdown;

use mio::net::TcpStream;
use thiserror::Error;

use crate::outbound::{FlushReport, Flushed, Outbound};
use crate::tls::handshake::{Established, Handshake, Progress, TlsHandshakeError};
use crate::tls::record::{self, RecordError, Records, ALERT_RECORD, OVERHEAD};
use crate::tls::TlsFailure;

/// Bytes of a worker's seal buffer: a batch of records sealed per `write`.
/// Holds four full records, about what a socket takes in one call.
pub const SEAL_BYTES: usize = 4 * (record::MAX_PLAINTEXT + OVERHEAD);

/// What one read brought.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Input {
    /// Plaintext bytes now at the front of the buffer.
    pub plain: usize,
    /// Bytes the socket gave (0: nothing was waiting).
    pub wire: usize,
    /// The socket gave less than asked for: it is drained for now.
    pub drained: bool,
    /// The peer is done sending: EOF, or TLS close_notify.
    pub end: bool,
    /// This read completed a TLS handshake.
    pub established: bool,
}

/// Why a link failed. I/O errors are the socket's; the others are TLS's and
/// each is counted under [`LinkError::failure`].
#[derive(Debug, Error)]
pub enum LinkError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("TLS handshake: {0}")]
    Handshake(#[from] TlsHandshakeError),
    #[error("TLS: {0}")]
    Record(#[from] RecordError),
}

impl LinkError {
    /// How a TLS failure is counted; `None` for a socket error.
    pub fn failure(&self) -> Option<TlsFailure> {
        match self {
            LinkError::Io(_) => None,
            LinkError::Handshake(TlsHandshakeError::PlainHttp) => Some(TlsFailure::PlainHttp),
            LinkError::Handshake(_) => Some(TlsFailure::HandshakeFailed),
            LinkError::Record(RecordError::Alert(_)) => Some(TlsFailure::Alert),
            LinkError::Record(RecordError::KeyUpdate) => Some(TlsFailure::KeyUpdate),
            LinkError::Record(RecordError::KeysUsedUp) => Some(TlsFailure::KeysUsedUp),
            LinkError::Record(_) => Some(TlsFailure::BadRecord),
        }
    }
}

/// A connection's socket and, on a TLS listener, its TLS state, borrowed
/// from the connection for one call. The two are kept apart in `Conn`
/// rather than in one struct, whose padding would cost every connection
/// 8 bytes more (see `conn::tests::connection_state_is_compact`).
pub struct Link<'a> {
    socket: &'a mut TcpStream,
    tls: &'a mut Option<Box<Tls>>,
}

/// A connection's TLS state: its handshake, then its record layer.
pub struct Tls(Stage);

enum Stage {
    Handshaking(Box<Handshake>),
    Open(Open),
}

/// A TLS connection after its handshake. The buffers are boxed `Vec`s, as
/// in `Conn`: a null pointer (8 bytes, not a `Vec`'s 24) while empty,
/// which they are whenever the connection is idle.
#[allow(clippy::box_collection)]
struct Open {
    records: Records,
    /// The start of a record not yet complete.
    partial: Option<Box<Vec<u8>>>,
    /// Sealed records the socket has not taken yet.
    unsent: Option<Box<Vec<u8>>>,
}

impl Tls {
    /// See [`Link::has_unsent`].
    pub fn has_unsent(&self) -> bool {
        match &self.0 {
            Stage::Handshaking(handshake) => handshake.has_output(),
            Stage::Open(open) => open.unsent.is_some(),
        }
    }

    /// The state of a connection whose handshake has not started.
    pub fn handshaking(handshake: Box<Handshake>) -> Box<Tls> {
        Box::new(Tls(Stage::Handshaking(handshake)))
    }

    /// The state of a connection whose handshake just ended, and the
    /// plaintext the client sent behind its Finished.
    pub fn established(established: Established) -> (Box<Tls>, Vec<u8>) {
        let tls = Tls(Stage::Open(Open {
            records: established.records,
            partial: nonempty(established.partial),
            unsent: nonempty(established.output),
        }));
        (Box::new(tls), established.plaintext)
    }
}

impl<'a> Link<'a> {
    pub fn new(socket: &'a mut TcpStream, tls: &'a mut Option<Box<Tls>>) -> Link<'a> {
        Link { socket, tls }
    }

    /// Whether a TLS handshake is still running.
    pub fn is_handshaking(&self) -> bool {
        matches!(self.tls.as_deref(), Some(Tls(Stage::Handshaking(_))))
    }

    /// Whether bytes are waiting for the socket that the outbound queue
    /// no longer holds (handshake messages or sealed records).
    pub fn has_unsent(&self) -> bool {
        self.tls.as_deref().is_some_and(Tls::has_unsent)
    }

    /// Reads once into `buf` and leaves the plaintext at its front. Never
    /// returns `WouldBlock`: nothing waiting is `wire == 0`. On TLS, `buf`
    /// must hold a whole record ([`record::MAX_RECORD`]) and a handshake's
    /// input (`tls::handshake::MAX_INPUT`) with room to spare.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<Input, LinkError> {
        let Some(Tls(stage)) = self.tls.as_deref_mut() else {
            let n = read_some(self.socket, buf)?;
            return Ok(Input {
                plain: n.unwrap_or(0),
                wire: n.unwrap_or(0),
                drained: n.is_none_or(|n| n < buf.len()),
                end: n == Some(0),
                established: false,
            });
        };
        match stage {
            Stage::Handshaking(handshake) => {
                let Some(n) = read_some(self.socket, buf)? else {
                    return Ok(Input {
                        drained: true,
                        ..Input::default()
                    });
                };
                let mut input = Input {
                    wire: n,
                    drained: n < buf.len(),
                    end: n == 0,
                    ..Input::default()
                };
                if n == 0 {
                    // Gone mid-handshake: most often a client that did not
                    // trust the certificate and sent no alert.
                    if handshake.started() {
                        return Err(TlsHandshakeError::Closed.into());
                    }
                    return Ok(input);
                }
                let progress = handshake.advance(&buf[..n]);
                // The server's flight, or the alert of a failure.
                send_now(self.socket, handshake.output())?;
                if progress? == Progress::Pending {
                    return Ok(input);
                }
                let Some(Tls(Stage::Handshaking(handshake))) = self.tls.take().map(|tls| *tls)
                else {
                    unreachable!("handshaking above");
                };
                let (tls, plaintext) = Tls::established(handshake.finish()?);
                *self.tls = Some(tls);
                // The plaintext came from at most MAX_INPUT bytes read.
                buf[..plaintext.len()].copy_from_slice(&plaintext);
                input.plain = plaintext.len();
                input.established = true;
                Ok(input)
            }
            Stage::Open(open) => {
                let held = open.partial.as_ref().map_or(0, |p| p.len());
                if let Some(partial) = &open.partial {
                    buf[..held].copy_from_slice(partial);
                }
                let Some(n) = read_some(self.socket, &mut buf[held..])? else {
                    return Ok(Input {
                        drained: true,
                        ..Input::default()
                    });
                };
                let mut input = Input {
                    wire: n,
                    drained: n < buf.len() - held,
                    end: n == 0,
                    ..Input::default()
                };
                if n == 0 {
                    return Ok(input);
                }
                let opened = match open.records.open(&mut buf[..held + n]) {
                    Ok(opened) => opened,
                    Err(e) => {
                        if let Some(reply) = e.reply() {
                            alert(self.socket, &mut open.records, reply);
                        }
                        return Err(e.into());
                    }
                };
                let rest = &buf[opened.consumed..held + n];
                if opened.closed || rest.is_empty() {
                    open.partial = None;
                } else {
                    let partial = open.partial.get_or_insert_with(Box::default);
                    partial.clear();
                    partial.extend_from_slice(rest);
                }
                input.plain = opened.plain;
                input.end = opened.closed;
                Ok(input)
            }
        }
    }

    /// Writes what is waiting: on TLS, sealed records left from before,
    /// then `out` sealed in batches of [`SEAL_BYTES`] (`seal` is the
    /// worker's buffer for it). The report counts bytes on the wire.
    pub fn flush(
        &mut self,
        out: Option<&mut Outbound>,
        seal: &mut [u8],
    ) -> Result<FlushReport, LinkError> {
        let mut report = FlushReport {
            flushed: Flushed::All,
            bytes: 0,
            calls: 0,
        };
        let Some(Tls(stage)) = self.tls.as_deref_mut() else {
            return match out {
                Some(out) => Ok(out.flush_to(self.socket)?),
                None => Ok(report),
            };
        };
        let open = match stage {
            Stage::Handshaking(handshake) => {
                let output = handshake.output();
                if !output.is_empty() {
                    report.calls += 1;
                    report.bytes += send_now(self.socket, output)?;
                    if !output.is_empty() {
                        report.flushed = Flushed::Blocked;
                    }
                }
                return Ok(report);
            }
            Stage::Open(open) => open,
        };
        let mut out = out;
        loop {
            if let Some(unsent) = open.unsent.as_mut() {
                report.calls += 1;
                report.bytes += send_now(self.socket, unsent)?;
                if !unsent.is_empty() {
                    report.flushed = Flushed::Blocked;
                    return Ok(report);
                }
                open.unsent = None;
            }
            let Some(queue) = out.as_deref_mut().filter(|q| !q.is_empty()) else {
                return Ok(report);
            };
            let (taken, sealed) = open.records.seal(queue.chunks(), seal)?;
            queue.consume(taken);
            report.calls += 1;
            let written = write_some(self.socket, &seal[..sealed])?;
            report.bytes += written;
            if written < sealed {
                // Sealed records must go out as they are: keep the rest.
                open.unsent = Some(Box::new(seal[written..sealed].to_vec()));
            }
        }
    }

    /// Ends the write side once everything is out: TLS close_notify first
    /// (RFC 8446 §6.1), then the TCP shutdown.
    pub fn shutdown_write(&mut self) -> io::Result<()> {
        self.close_notify();
        self.socket.shutdown(Shutdown::Write)
    }

    /// Sends TLS close_notify if the socket takes it now; the connection is
    /// ending either way.
    pub fn close_notify(&mut self) {
        if let Some(Tls(Stage::Open(open))) = self.tls.as_deref_mut() {
            alert(self.socket, &mut open.records, record::alert::CLOSE_NOTIFY);
        }
    }

    /// Writes `bytes` as they are, if the socket takes them now: the answer
    /// to a client that spoke plain HTTP to the TLS port.
    pub fn refuse_in_plain(&mut self, bytes: &[u8]) {
        let _ = write_some(self.socket, bytes);
    }

    /// Whether the sending key neared its limit since the last call.
    pub fn keys_worn_out(&mut self) -> bool {
        match self.tls.as_deref_mut() {
            Some(Tls(Stage::Open(open))) => open.records.worn_out(),
            _ => false,
        }
    }
}

/// Seals and sends an alert if the socket takes it now.
fn alert(socket: &mut TcpStream, records: &mut Records, description: u8) {
    let mut out = [0; ALERT_RECORD];
    if let Ok(len) = records.seal_alert(description, &mut out) {
        let _ = write_some(socket, &out[..len]);
    }
}

/// One read: `None` when nothing is waiting, `Some(0)` at EOF.
fn read_some(socket: &mut TcpStream, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        match socket.read(buf) {
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Writes what the socket takes now; returns how much.
fn write_some(socket: &mut TcpStream, bytes: &[u8]) -> io::Result<usize> {
    let mut written = 0;
    while written < bytes.len() {
        match socket.write(&bytes[written..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(written)
}

/// Writes what the socket takes now from the front of `bytes` and drains it.
fn send_now(socket: &mut TcpStream, bytes: &mut Vec<u8>) -> io::Result<usize> {
    let written = write_some(socket, bytes)?;
    bytes.drain(..written);
    Ok(written)
}

#[allow(clippy::box_collection)] // see `Open`
fn nonempty(bytes: Vec<u8>) -> Option<Box<Vec<u8>>> {
    (!bytes.is_empty()).then(|| Box::new(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_tls_connection_holds_one_small_allocation() {
        // What a TLS connection adds to a plain one once its handshake is
        // done: this box and the `Conn`'s pointer to it. The target is
        // 2 KiB; rustls' own connection would be 3.3 KB or more (see
        // docs/benchmarks.md before growing this).
        let size = std::mem::size_of::<Tls>();
        assert!(size <= 136, "Tls is {size} bytes");
        assert_eq!(std::mem::size_of::<Option<Box<Tls>>>(), 8);
    }
}
