//! One TLS handshake, run by rustls (its unbuffered API) over the bytes the
//! worker reads, up to the moment its traffic keys can be handed to the
//! record layer (`super::record`).
//!
//! While it runs the handshake holds rustls' connection (about 1 KB), the
//! client's bytes rustls has not used yet and the server's bytes not yet
//! written; all of it is dropped when the handshake ends. What the client
//! sent behind its Finished (often its HTTP request, in the same packet) is
//! kept: rustls decrypts whole records itself, and a partial one is handed
//! on in [`Established::partial`] for the record layer to finish.
//!
//! Does no I/O: [`Handshake::advance`] takes bytes, and what is to be
//! written waits in [`Handshake::output`].

use std::sync::Arc;

use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError, InsufficientSizeError};
use rustls::ServerConfig;
use thiserror::Error;

use super::record::Records;

/// Client bytes a handshake may hold before it is refused. A ClientHello
/// with post-quantum key shares is about 2 KB; this leaves room for a
/// certificate-heavy client and a full record of application data behind
/// the Finished, and bounds what a client that never finishes can pin.
pub const MAX_INPUT: usize = 32 * 1024;

/// Why a handshake failed. Each ends the connection.
#[derive(Debug, Error)]
pub enum TlsHandshakeError {
    #[error("the client spoke plain HTTP to the TLS port")]
    PlainHttp,
    #[error(transparent)]
    Rustls(#[from] rustls::Error),
    #[error("the client's handshake passed {MAX_INPUT} bytes")]
    TooLarge,
    #[error("the client closed the connection during the handshake")]
    Closed,
    #[error("the handshake ended in a state this server does not allow ({0})")]
    Unexpected(&'static str),
    #[error("the negotiated cipher suite is not one the record layer runs")]
    Unsupported,
}

/// Whether the handshake is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// More input is needed (and [`Handshake::output`] may hold bytes to send).
    Pending,
    /// The keys are agreed: call [`Handshake::finish`].
    Ready,
}

/// A finished handshake: what the connection keeps.
pub struct Established {
    pub records: Records,
    /// Application data the client sent behind its Finished, decrypted.
    pub plaintext: Vec<u8>,
    /// The start of a record not yet complete.
    pub partial: Vec<u8>,
    /// Handshake bytes not yet written to the client.
    pub output: Vec<u8>,
}

/// A TLS handshake in progress.
pub struct Handshake {
    conn: UnbufferedServerConnection,
    /// Client bytes rustls has not used yet.
    input: Vec<u8>,
    /// Server bytes to write.
    output: Vec<u8>,
    /// Application data decrypted by rustls, waiting for the handshake's end.
    plaintext: Vec<u8>,
    /// Any client byte has arrived.
    fed: bool,
}

impl Handshake {
    pub fn new(config: Arc<ServerConfig>) -> Result<Box<Handshake>, rustls::Error> {
        Ok(Box::new(Handshake {
            conn: UnbufferedServerConnection::new(config)?,
            input: Vec::new(),
            output: Vec::new(),
            plaintext: Vec::new(),
            fed: false,
        }))
    }

    /// Bytes to send to the client; the caller drains what it wrote.
    pub fn output(&mut self) -> &mut Vec<u8> {
        &mut self.output
    }

    pub fn has_output(&self) -> bool {
        !self.output.is_empty()
    }

    /// Whether the client has sent anything yet.
    pub fn started(&self) -> bool {
        self.fed
    }

    /// Takes bytes read from the client and runs the handshake as far as
    /// they go. On failure [`Handshake::output`] may hold an alert for the
    /// client.
    pub fn advance(&mut self, fresh: &[u8]) -> Result<Progress, TlsHandshakeError> {
        // A TLS connection opens with a handshake record (type 22); an HTTP
        // request with its method's capital letters.
        if !self.fed && fresh.first().is_some_and(u8::is_ascii_uppercase) {
            return Err(TlsHandshakeError::PlainHttp);
        }
        self.fed |= !fresh.is_empty();
        if self.input.len() + fresh.len() > MAX_INPUT {
            return Err(TlsHandshakeError::TooLarge);
        }
        self.input.extend_from_slice(fresh);
        loop {
            match self.step() {
                Ok(None) => {}
                Ok(Some(progress)) => return Ok(progress),
                Err(e) => {
                    // rustls queued an alert for the client, behind what
                    // else it had to send: a refused ALPN protocol is found
                    // after the ServerHello, which goes first. Each step
                    // hands over one of them; the next after the last
                    // meets the error again.
                    while let Ok(None) = self.step() {}
                    return Err(e);
                }
            }
        }
    }

    /// One state of rustls' unbuffered connection; `Some` once the
    /// handshake waits for input or is done.
    fn step(&mut self) -> Result<Option<Progress>, TlsHandshakeError> {
        let status = self.conn.process_tls_records(&mut self.input);
        let mut discard = status.discard;
        let state = match status.state {
            Ok(state) => state,
            Err(e) => {
                // What rustls used is discarded before it is called again,
                // failed or not (its contract).
                self.input.drain(..discard);
                return Err(e.into());
            }
        };
        let progress = match state {
            ConnectionState::EncodeTlsData(mut data) => {
                let start = self.output.len();
                let mut room = 4096;
                loop {
                    self.output.resize(start + room, 0);
                    match data.encode(&mut self.output[start..]) {
                        Ok(written) => {
                            self.output.truncate(start + written);
                            break;
                        }
                        Err(EncodeError::InsufficientSize(InsufficientSizeError {
                            required_size,
                        })) => room = required_size,
                        Err(EncodeError::AlreadyEncoded) => {
                            self.output.truncate(start);
                            break;
                        }
                    }
                }
                None
            }
            // Written by the caller, in order, before anything else.
            ConnectionState::TransmitTlsData(data) => {
                data.done();
                None
            }
            ConnectionState::ReadTraffic(mut traffic) => {
                while let Some(record) = traffic.next_record() {
                    let record = record?;
                    discard += record.discard;
                    self.plaintext.extend_from_slice(record.payload);
                }
                None
            }
            ConnectionState::BlockedHandshake => Some(Progress::Pending),
            ConnectionState::WriteTraffic(_) => Some(Progress::Ready),
            ConnectionState::PeerClosed | ConnectionState::Closed => {
                return Err(TlsHandshakeError::Closed)
            }
            ConnectionState::ReadEarlyData(_) => {
                return Err(TlsHandshakeError::Unexpected("early data"))
            }
            _ => return Err(TlsHandshakeError::Unexpected("unknown state")),
        };
        self.input.drain(..discard);
        Ok(progress)
    }

    /// Takes the traffic keys from rustls; what the connection keeps of the
    /// handshake. Only after [`Progress::Ready`].
    pub fn finish(self: Box<Self>) -> Result<Established, TlsHandshakeError> {
        let Handshake {
            conn,
            input,
            output,
            plaintext,
            fed: _,
        } = *self;
        // rustls' KernelConnection is what key updates would need; it is
        // dropped here (904 bytes per connection, see `super::record`).
        let (secrets, _kernel) = conn.dangerous_into_kernel_connection()?;
        let records = Records::new(secrets).ok_or(TlsHandshakeError::Unsupported)?;
        Ok(Established {
            records,
            plaintext,
            partial: input,
            output,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::tls::testing::{self, client, input, output};

    fn fresh() -> (Box<Handshake>, Arc<rustls::ClientConfig>) {
        let (certs, config) = testing::pair(&[]);
        (Handshake::new(certs.current()).unwrap(), config)
    }

    #[test]
    fn plain_http_is_told_apart_from_tls() {
        let (mut handshake, _) = fresh();
        let refused = handshake.advance(b"GET /ws HTTP/1.1\r\n");
        assert!(
            matches!(refused, Err(TlsHandshakeError::PlainHttp)),
            "{refused:?}"
        );
        // The same letters later in a handshake are rustls' to judge.
        let (mut handshake, config) = fresh();
        let hello = output(&mut client(&config));
        assert_eq!(handshake.advance(&hello[..3]).unwrap(), Progress::Pending);
        assert_eq!(handshake.advance(&hello[3..]).unwrap(), Progress::Pending);
        assert!(handshake.has_output(), "the server's flight");
    }

    #[test]
    fn a_refused_handshake_leaves_an_alert_to_send() {
        let (mut handshake, _) = fresh();
        // A handshake record holding no ClientHello.
        let refused = handshake.advance(&[22, 3, 1, 0, 4, 1, 0, 0, 0]);
        assert!(
            matches!(refused, Err(TlsHandshakeError::Rustls(_))),
            "{refused:?}"
        );
        assert_eq!(handshake.output()[0], 21, "an alert record");

        // A client offering no protocol this server speaks over ALPN.
        let (certs, config) = testing::pair(&[]);
        let mut only_h2 = (*config).clone();
        only_h2.alpn_protocols = vec![b"h2".to_vec()];
        let mut handshake = Handshake::new(certs.current()).unwrap();
        let mut h2_client = client(&Arc::new(only_h2));
        let refused = handshake.advance(&output(&mut h2_client));
        assert!(
            matches!(
                refused,
                Err(TlsHandshakeError::Rustls(
                    rustls::Error::NoApplicationProtocol
                ))
            ),
            "{refused:?}"
        );
        // rustls finds it after its ServerHello: both go out, the alert
        // last, sealed with the handshake keys the ServerHello gave.
        assert_eq!(
            input(&mut h2_client, handshake.output()),
            Err(rustls::Error::AlertReceived(
                rustls::AlertDescription::NoApplicationProtocol
            ))
        );
    }

    #[test]
    fn a_handshake_cannot_hold_more_than_its_bound() {
        let (mut handshake, _) = fresh();
        // The header of a record that will never complete.
        assert_eq!(
            handshake.advance(&[22, 3, 1, 0x40, 0]).unwrap(),
            Progress::Pending
        );
        let filler = vec![0; MAX_INPUT];
        assert!(matches!(
            handshake.advance(&filler),
            Err(TlsHandshakeError::TooLarge)
        ));
    }
}
