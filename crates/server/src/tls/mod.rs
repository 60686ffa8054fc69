//! TLS on the client listener (wss://, https://), in three parts:
//! [`certs`] turns the certificate and key files into the configuration
//! every handshake starts from, and replaces it on SIGHUP; [`handshake`]
//! runs one handshake with rustls; [`record`] is the TLS 1.3 record layer
//! the worker runs itself once the handshake has handed over its secrets.
//!
//! Why the split: a live rustls connection holds 3.3 KB while idle (7.4 KB
//! in its buffered form), past the 2 KiB per idle connection this node
//! allows; the secrets and sequence numbers a record layer needs are 128
//! bytes. docs/benchmarks.md ("TLS: memory per idle connection") has the
//! measurement (`benches/tls_memory.rs`). kTLS, the kernel doing the same,
//! is not built into this machine's kernel.
//!
//! `crate::link` puts all of it behind the connection's socket I/O, so the
//! worker reads and writes plaintext either way. This module does no I/O.

pub mod certs;
pub mod handshake;
pub mod record;

pub use certs::{read_chain, read_key, Acceptor, CertError, Certificates, TlsFiles};
pub use handshake::{Established, Handshake, TlsHandshakeError};
pub use record::{RecordError, Records};

/// Every way TLS refuses or ends a connection, or fails a reload; each is
/// counted in `myriad_errors_total` under [`TlsFailure::label`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TlsFailure {
    /// A client spoke plain HTTP to the TLS port (answered 400 `tls_required`).
    PlainHttp,
    /// rustls refused the handshake: no common version, cipher suite or
    /// ALPN protocol, a malformed or oversized message, a bad Finished.
    HandshakeFailed,
    /// The handshake did not complete within `handshake_timeout`.
    HandshakeTimeout,
    /// A record after the handshake failed to decrypt or broke TLS 1.3's
    /// rules (RFC 8446 §5).
    BadRecord,
    /// The client sent a fatal alert.
    Alert,
    /// The client sent a KeyUpdate, which this server does not implement.
    KeyUpdate,
    /// The server's sending key neared its cipher's confidentiality limit:
    /// the connection was closed so that the client reconnects with new keys.
    KeysUsedUp,
    /// A SIGHUP reload could not use the files; the previous certificate stays.
    ReloadFailed,
}

impl TlsFailure {
    pub const ALL: [TlsFailure; 8] = [
        TlsFailure::PlainHttp,
        TlsFailure::HandshakeFailed,
        TlsFailure::HandshakeTimeout,
        TlsFailure::BadRecord,
        TlsFailure::Alert,
        TlsFailure::KeyUpdate,
        TlsFailure::KeysUsedUp,
        TlsFailure::ReloadFailed,
    ];

    pub const fn label(self) -> &'static str {
        match self {
            TlsFailure::PlainHttp => "tls_plain_http",
            TlsFailure::HandshakeFailed => "tls_handshake_failed",
            TlsFailure::HandshakeTimeout => "tls_handshake_timeout",
            TlsFailure::BadRecord => "tls_bad_record",
            TlsFailure::Alert => "tls_alert",
            TlsFailure::KeyUpdate => "tls_key_update",
            TlsFailure::KeysUsedUp => "tls_keys_used_up",
            TlsFailure::ReloadFailed => "tls_reload_failed",
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! An in-memory rustls client and a generated certificate, for the
    //! tests of the handshake and the record layer.

    use std::io::Read;
    use std::path::Path;
    use std::sync::Arc;

    use rustls::crypto::ring as provider;
    use rustls::pki_types::CertificateDer;
    use rustls::{ClientConfig, ClientConnection, SupportedCipherSuite};

    use super::handshake::{Established, Handshake, Progress};
    use super::{Certificates, TlsFiles};

    /// A self-signed certificate for `localhost`, written as PEM files into
    /// `dir`; returns the files and the certificate.
    pub fn certificate(dir: &Path) -> (TlsFiles, CertificateDer<'static>) {
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let files = TlsFiles {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
        };
        std::fs::write(&files.cert, certified.cert.pem()).unwrap();
        std::fs::write(&files.key, certified.signing_key.serialize_pem()).unwrap();
        (files, certified.cert.der().clone())
    }

    /// The node's certificates from fresh files, and a client trusting them
    /// that offers only `suites` (all of ring's TLS 1.3 suites when empty).
    pub fn pair(suites: &[SupportedCipherSuite]) -> (Arc<Certificates>, Arc<ClientConfig>) {
        let dir = tempfile::tempdir().unwrap();
        let (files, cert) = certificate(dir.path());
        let certs = Arc::new(Certificates::load(files).unwrap());
        (certs, client_config(cert, suites))
    }

    pub fn client_config(
        cert: CertificateDer<'static>,
        suites: &[SupportedCipherSuite],
    ) -> Arc<ClientConfig> {
        let mut provider = provider::default_provider();
        if !suites.is_empty() {
            provider.cipher_suites = suites.to_vec();
        }
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert).unwrap();
        let mut config = ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }

    pub fn client(config: &Arc<ClientConfig>) -> ClientConnection {
        ClientConnection::new(Arc::clone(config), "localhost".try_into().unwrap()).unwrap()
    }

    /// Everything the client has to send.
    pub fn output(client: &mut ClientConnection) -> Vec<u8> {
        let mut out = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut out).unwrap();
        }
        out
    }

    /// Hands `data` to the client; returns the plaintext it yields.
    pub fn input(client: &mut ClientConnection, mut data: &[u8]) -> Result<Vec<u8>, rustls::Error> {
        let mut plain = Vec::new();
        while !data.is_empty() {
            client.read_tls(&mut data).unwrap();
            client.process_new_packets()?;
            // Ends with WouldBlock once the plaintext is read, or at close_notify.
            let _ = client.reader().read_to_end(&mut plain);
        }
        Ok(plain)
    }

    /// Runs a handshake between [`Handshake`] and `client`; returns what the
    /// server keeps.
    pub fn handshake(certs: &Certificates, client: &mut ClientConnection) -> Established {
        let mut handshake = Handshake::new(certs.current()).unwrap();
        loop {
            let progress = handshake.advance(&output(client)).unwrap();
            let flight = std::mem::take(handshake.output());
            input(client, &flight).unwrap();
            if progress == Progress::Ready {
                return handshake.finish().unwrap();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ALL` is kept by hand; the error metric's labels read it. A variant added to the enum
    /// breaks the build of `every_variant!` below until it is named here, and
    /// then this fails until `ALL` names it too.
    #[test]
    fn all_names_every_tls_failure() {
        let every = myriad_protocol::every_variant!(
            TlsFailure:
            PlainHttp,
            HandshakeFailed,
            HandshakeTimeout,
            BadRecord,
            Alert,
            KeyUpdate,
            KeysUsedUp,
            ReloadFailed
        );
        assert_eq!(every, TlsFailure::ALL);
    }
}
