//! The TLS 1.3 record layer (RFC 8446 §5), run by the worker once rustls
//! has finished a handshake and handed over the traffic keys.
//!
//! This is here, rather than rustls' own record layer, for memory alone:
//! an idle rustls connection holds 3,273 bytes in its smallest form (the
//! unbuffered API: a 1,080-byte struct and two prepared AEAD keys of 560
//! bytes each), past the node's 2 KiB per idle TLS connection; [`Records`]
//! is 120 bytes. docs/benchmarks.md ("TLS: memory per idle connection")
//! has the measurement. The AEAD is ring's, the provider rustls runs on.
//!
//! Keys are kept as secrets and prepared for each batch of records sealed
//! or opened (100–250 ns, about what sealing one small record costs), not
//! kept prepared (544 bytes each).
//!
//! Left out on purpose, each refused rather than half done: TLS 1.2 (the
//! handshake refuses it); KeyUpdate (a client's ends the connection:
//! answering it needs rustls' `KernelConnection`, 904 bytes more per
//! connection, for a message browsers do not send); and the server's own
//! key update, so AES-GCM's confidentiality limit is tracked instead
//! ([`Records::worn_out`]) and the worker closes the connection before it.
//! Session tickets are never sent, so nothing else can follow a handshake.
//!
//! Pure: no I/O, no allocation.

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey, NONCE_LEN};
use rustls::{ConnectionTrafficSecrets, ExtractedSecrets};
use thiserror::Error;
use zeroize::Zeroize;

/// The record header: content type, legacy version, length (§5.1).
const HEADER_LEN: usize = 5;
/// Every TLS 1.3 AEAD's tag.
const TAG_LEN: usize = 16;
/// Largest plaintext in one record (§5.1).
pub const MAX_PLAINTEXT: usize = 1 << 14;
/// Largest record a peer may send: the plaintext, its content type and
/// padding, up to 256 bytes of expansion in all (§5.2).
pub const MAX_RECORD: usize = HEADER_LEN + MAX_PLAINTEXT + 256;
/// What a sealed record adds to its plaintext: header, content type, tag.
pub const OVERHEAD: usize = HEADER_LEN + 1 + TAG_LEN;
/// Bytes an alert record takes (two bytes of alert).
pub const ALERT_RECORD: usize = OVERHEAD + 2;

/// Content types (§5.1, §B.1).
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;
/// The legacy record version every TLS 1.3 record carries (§5.1).
const LEGACY_VERSION: [u8; 2] = [3, 3];
/// Handshake message type of KeyUpdate (§4.6.3).
const KEY_UPDATE: u8 = 24;

/// Alert descriptions (§6).
pub mod alert {
    pub const CLOSE_NOTIFY: u8 = 0;
    pub const UNEXPECTED_MESSAGE: u8 = 10;
    pub const BAD_RECORD_MAC: u8 = 20;
    pub const RECORD_OVERFLOW: u8 = 22;
    pub const DECODE_ERROR: u8 = 50;
    pub const USER_CANCELED: u8 = 90;
}

/// Records sealed before the limit at which [`Records::worn_out`] says so:
/// room for the worker's once-a-second sweep to close the connection
/// cleanly before sealing would be refused.
const WEAR_MARGIN: u64 = 1 << 20;

/// Why a record could not be sealed or opened. Each ends the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum RecordError {
    #[error("a record failed to decrypt (bad_record_mac)")]
    BadRecordMac,
    #[error("a record was longer than TLS 1.3 allows (record_overflow)")]
    RecordOverflow,
    #[error("a malformed record (decode_error)")]
    Decode,
    #[error("a record TLS 1.3 does not allow after the handshake (unexpected_message)")]
    Unexpected,
    #[error("the client sent alert {0}")]
    Alert(u8),
    #[error("the client sent a KeyUpdate, which this server does not implement")]
    KeyUpdate,
    #[error("the sending key reached its cipher's confidentiality limit")]
    KeysUsedUp,
}

impl RecordError {
    /// The alert to send before closing, if any. A KeyUpdate is answered
    /// with a clean close_notify: the client did nothing wrong.
    pub fn reply(self) -> Option<u8> {
        match self {
            RecordError::BadRecordMac => Some(alert::BAD_RECORD_MAC),
            RecordError::RecordOverflow => Some(alert::RECORD_OVERFLOW),
            RecordError::Decode => Some(alert::DECODE_ERROR),
            RecordError::Unexpected => Some(alert::UNEXPECTED_MESSAGE),
            RecordError::KeyUpdate => Some(alert::CLOSE_NOTIFY),
            RecordError::Alert(_) | RecordError::KeysUsedUp => None,
        }
    }
}

/// The AEADs of TLS 1.3's cipher suites that ring provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cipher {
    Aes128Gcm,
    Aes256Gcm,
    Chacha20Poly1305,
}

impl Cipher {
    fn algorithm(self) -> &'static aead::Algorithm {
        match self {
            Cipher::Aes128Gcm => &aead::AES_128_GCM,
            Cipher::Aes256Gcm => &aead::AES_256_GCM,
            Cipher::Chacha20Poly1305 => &aead::CHACHA20_POLY1305,
        }
    }

    /// Records one key may seal: rustls' figure for TLS 1.3 AES-GCM (from
    /// RFC 8446 §5.5's 2^24.5 full-size records); ChaCha20-Poly1305 has no
    /// practical limit.
    fn confidentiality_limit(self) -> u64 {
        match self {
            Cipher::Aes128Gcm | Cipher::Aes256Gcm => 1 << 24,
            Cipher::Chacha20Poly1305 => u64::MAX,
        }
    }
}

/// One direction's traffic key: the secret, not the prepared key.
struct TrafficKey {
    /// The first `algorithm().key_len()` bytes are used.
    key: [u8; 32],
    iv: [u8; NONCE_LEN],
    /// Records sealed or opened with this key so far.
    seq: u64,
}

impl TrafficKey {
    fn new(seq: u64, key: &[u8], iv: &[u8]) -> Option<TrafficKey> {
        let mut traffic = TrafficKey {
            key: [0; 32],
            iv: iv.try_into().ok()?,
            seq,
        };
        traffic.key.get_mut(..key.len())?.copy_from_slice(key);
        Some(traffic)
    }

    fn prepare(&self, cipher: Cipher) -> LessSafeKey {
        let algorithm = cipher.algorithm();
        let key = UnboundKey::new(algorithm, &self.key[..algorithm.key_len()])
            .expect("the key length follows the cipher");
        LessSafeKey::new(key)
    }

    /// The per-record nonce: the IV XOR the sequence number (§5.3).
    fn nonce(&self) -> Nonce {
        let mut nonce = self.iv;
        for (byte, seq) in nonce[NONCE_LEN - 8..]
            .iter_mut()
            .zip(self.seq.to_be_bytes())
        {
            *byte ^= seq;
        }
        Nonce::assume_unique_for_key(nonce)
    }
}

impl Drop for TrafficKey {
    fn drop(&mut self) {
        self.key.zeroize();
        self.iv.zeroize();
    }
}

/// What [`Records::open`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// Application data now at the front of the buffer.
    pub plain: usize,
    /// Bytes of whole records used up; what follows is a partial record.
    pub consumed: usize,
    /// The client sent close_notify: nothing after it is read.
    pub closed: bool,
}

/// A connection's record protection, both ways.
pub struct Records {
    cipher: Cipher,
    /// Set once `tx` is within [`WEAR_MARGIN`] of its limit; taken by
    /// [`Records::worn_out`].
    worn: bool,
    tx: TrafficKey,
    rx: TrafficKey,
}

impl Records {
    /// The record layer for what a TLS 1.3 handshake negotiated; `None` for
    /// a cipher ring's TLS 1.3 suites do not have.
    pub fn new(secrets: ExtractedSecrets) -> Option<Records> {
        let (tx_seq, tx) = secrets.tx;
        let (rx_seq, rx) = secrets.rx;
        let (cipher, tx) = traffic_key(tx_seq, &tx)?;
        let (rx_cipher, rx) = traffic_key(rx_seq, &rx)?;
        (cipher == rx_cipher).then_some(Records {
            cipher,
            worn: false,
            tx,
            rx,
        })
    }

    pub fn cipher(&self) -> Cipher {
        self.cipher
    }

    /// Seals the bytes of `chunks`, in order, into as many records as fit
    /// in `out`, each up to [`MAX_PLAINTEXT`]; returns the plaintext bytes
    /// taken and the bytes of records written. Sealed records must all be
    /// sent: their sequence numbers are spent.
    pub fn seal<'a>(
        &mut self,
        chunks: impl IntoIterator<Item = &'a [u8]>,
        out: &mut [u8],
    ) -> Result<(usize, usize), RecordError> {
        let key = self.tx.prepare(self.cipher);
        let mut chunks = chunks.into_iter();
        let mut current: &[u8] = &[];
        let (mut taken, mut used) = (0, 0);
        while out.len() - used > OVERHEAD {
            let room = (out.len() - used - OVERHEAD).min(MAX_PLAINTEXT);
            let body = &mut out[used + HEADER_LEN..];
            let mut filled = 0;
            while filled < room {
                if current.is_empty() {
                    match chunks.next() {
                        Some(chunk) => current = chunk,
                        None => break,
                    }
                    continue;
                }
                let n = current.len().min(room - filled);
                body[filled..filled + n].copy_from_slice(&current[..n]);
                current = &current[n..];
                filled += n;
            }
            if filled == 0 {
                break;
            }
            if let Err(e) = self.seal_record(&key, APPLICATION_DATA, filled, &mut out[used..]) {
                if used == 0 {
                    return Err(e);
                }
                break; // send what is sealed; the next call reports it
            }
            taken += filled;
            used += filled + OVERHEAD;
        }
        Ok((taken, used))
    }

    /// Seals an alert (close_notify is a warning, anything else fatal) into
    /// `out`; returns its length.
    pub fn seal_alert(
        &mut self,
        description: u8,
        out: &mut [u8; ALERT_RECORD],
    ) -> Result<usize, RecordError> {
        let level = if description == alert::CLOSE_NOTIFY {
            1
        } else {
            2
        };
        out[HEADER_LEN..HEADER_LEN + 2].copy_from_slice(&[level, description]);
        let key = self.tx.prepare(self.cipher);
        self.seal_record(&key, ALERT, 2, out)?;
        Ok(ALERT_RECORD)
    }

    /// Seals the `len` plaintext bytes already in `out[HEADER_LEN..]` into
    /// one record of `content_type`.
    fn seal_record(
        &mut self,
        key: &LessSafeKey,
        content_type: u8,
        len: usize,
        out: &mut [u8],
    ) -> Result<(), RecordError> {
        let limit = self.cipher.confidentiality_limit();
        if self.tx.seq >= limit {
            return Err(RecordError::KeysUsedUp);
        }
        let wire_len = u16::try_from(len + 1 + TAG_LEN).expect("records are at most 16 KiB");
        let header = [
            APPLICATION_DATA,
            LEGACY_VERSION[0],
            LEGACY_VERSION[1],
            (wire_len >> 8) as u8,
            wire_len as u8,
        ];
        out[..HEADER_LEN].copy_from_slice(&header);
        let inner_end = HEADER_LEN + len + 1;
        out[inner_end - 1] = content_type;
        let tag = key
            .seal_in_place_separate_tag(
                self.tx.nonce(),
                Aad::from(header),
                &mut out[HEADER_LEN..inner_end],
            )
            .map_err(|_| RecordError::KeysUsedUp)?;
        out[inner_end..inner_end + TAG_LEN].copy_from_slice(tag.as_ref());
        self.tx.seq += 1;
        if self.tx.seq >= limit.saturating_sub(WEAR_MARGIN) {
            self.worn = true;
        }
        Ok(())
    }

    /// Opens, in place, every whole record at the front of `buf` and moves
    /// their application data to its front. What follows the whole records
    /// (a partial one) is left where it is for the caller to keep.
    pub fn open(&mut self, buf: &mut [u8]) -> Result<Opened, RecordError> {
        let mut key = None;
        let (mut at, mut plain) = (0, 0);
        while buf.len() - at >= HEADER_LEN {
            let header: [u8; HEADER_LEN] = buf[at..at + HEADER_LEN].try_into().expect("5 bytes");
            // After the handshake every record is protected (§5.2); an
            // unprotected change_cipher_spec is allowed only before the
            // client's Finished (§5).
            if header[0] != APPLICATION_DATA {
                return Err(RecordError::Unexpected);
            }
            let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
            if len > MAX_RECORD - HEADER_LEN {
                return Err(RecordError::RecordOverflow);
            }
            if buf.len() - at < HEADER_LEN + len {
                break;
            }
            if len < TAG_LEN + 1 {
                return Err(RecordError::Decode);
            }
            let key = key.get_or_insert_with(|| self.rx.prepare(self.cipher));
            let body = &mut buf[at + HEADER_LEN..at + HEADER_LEN + len];
            let inner = key
                .open_in_place(self.rx.nonce(), Aad::from(header), body)
                .map_err(|_| RecordError::BadRecordMac)?;
            self.rx.seq += 1;
            // The content type is the last non-zero byte; zeros after it are
            // padding (§5.4).
            let type_at = inner
                .iter()
                .rposition(|&b| b != 0)
                .ok_or(RecordError::Unexpected)?;
            let content_type = inner[type_at];
            if type_at > MAX_PLAINTEXT {
                return Err(RecordError::RecordOverflow);
            }
            match content_type {
                APPLICATION_DATA => {
                    let start = at + HEADER_LEN;
                    buf.copy_within(start..start + type_at, plain);
                    plain += type_at;
                }
                ALERT => match inner[..type_at] {
                    [_, alert::CLOSE_NOTIFY] => {
                        return Ok(Opened {
                            plain,
                            consumed: at + HEADER_LEN + len,
                            closed: true,
                        });
                    }
                    // Followed by close_notify; nothing to do meanwhile (§6.1).
                    [_, alert::USER_CANCELED] => {}
                    [_, description] => return Err(RecordError::Alert(description)),
                    _ => return Err(RecordError::Decode),
                },
                HANDSHAKE if inner.first() == Some(&KEY_UPDATE) => {
                    return Err(RecordError::KeyUpdate)
                }
                _ => return Err(RecordError::Unexpected),
            }
            at += HEADER_LEN + len;
        }
        Ok(Opened {
            plain,
            consumed: at,
            closed: false,
        })
    }

    /// Whether the sending key neared its limit since the last call: the
    /// connection should close, so that its client reconnects with new keys.
    pub fn worn_out(&mut self) -> bool {
        std::mem::take(&mut self.worn)
    }
}

fn traffic_key(seq: u64, secrets: &ConnectionTrafficSecrets) -> Option<(Cipher, TrafficKey)> {
    let (cipher, key, iv) = match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (Cipher::Aes128Gcm, key, iv),
        ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (Cipher::Aes256Gcm, key, iv),
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
            (Cipher::Chacha20Poly1305, key, iv)
        }
        _ => return None,
    };
    let traffic = TrafficKey::new(seq, key.as_ref(), iv.as_ref())?;
    (key.as_ref().len() == cipher.algorithm().key_len()).then_some((cipher, traffic))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use rustls::crypto::ring::cipher_suite;

    use super::*;
    use crate::tls::testing::{self, client, handshake, input, output};

    const REQUEST: &[u8] = b"GET /ws HTTP/1.1\r\nHost: localhost\r\n\r\n";

    /// A handshake for one suite: the server's records, with what the
    /// client sent behind its Finished, and the client.
    fn open(suite: rustls::SupportedCipherSuite) -> (Records, Vec<u8>, rustls::ClientConnection) {
        let (certs, config) = testing::pair(&[suite]);
        let mut client = client(&config);
        client.writer().write_all(REQUEST).unwrap();
        let established = handshake(&certs, &mut client);
        assert!(
            established.output.is_empty(),
            "no tickets, nothing after Finished"
        );
        assert!(established.partial.is_empty());
        let mut records = established.records;
        // Whatever the client sent is read by the record layer from here.
        let mut rest = output(&mut client);
        let opened = records.open(&mut rest).unwrap();
        let mut plaintext = established.plaintext;
        plaintext.extend_from_slice(&rest[..opened.plain]);
        (records, plaintext, client)
    }

    /// Seals `chunks` into as many batches as needed, as a link does.
    fn seal_all(records: &mut Records, chunks: &[&[u8]], batch: usize) -> Vec<u8> {
        let total: usize = chunks.iter().map(|c| c.len()).sum();
        let mut wire = Vec::new();
        let mut taken = 0;
        while taken < total {
            let mut skip = taken;
            let rest = chunks.iter().filter_map(|chunk| {
                let from = skip.min(chunk.len());
                skip -= from;
                (from < chunk.len()).then(|| &chunk[from..])
            });
            let mut out = vec![0; batch];
            let (t, used) = records.seal(rest, &mut out).unwrap();
            assert!(t > 0, "progress");
            taken += t;
            wire.extend_from_slice(&out[..used]);
        }
        wire
    }

    #[test]
    fn both_ways_with_every_cipher_suite() {
        for (suite, cipher) in [
            (cipher_suite::TLS13_AES_128_GCM_SHA256, Cipher::Aes128Gcm),
            (cipher_suite::TLS13_AES_256_GCM_SHA384, Cipher::Aes256Gcm),
            (
                cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
                Cipher::Chacha20Poly1305,
            ),
        ] {
            let (mut records, request, mut client) = open(suite);
            assert_eq!(records.cipher(), cipher);
            assert_eq!(request, REQUEST, "the request sent behind Finished");
            let wire = seal_all(&mut records, &[b"HTTP/1.1 101 ", b"Switching", b""], 4096);
            assert_eq!(
                wire.len(),
                b"HTTP/1.1 101 Switching".len() + OVERHEAD,
                "one record"
            );
            assert_eq!(
                input(&mut client, &wire).unwrap(),
                b"HTTP/1.1 101 Switching"
            );
            client.writer().write_all(b"a frame").unwrap();
            let mut sent = output(&mut client);
            let opened = records.open(&mut sent).unwrap();
            assert_eq!(&sent[..opened.plain], b"a frame");
            assert_eq!((opened.consumed, opened.closed), (sent.len(), false));
        }
    }

    #[test]
    fn large_output_is_cut_into_full_records_and_read_whole() {
        let (mut records, _, mut client) = open(cipher_suite::TLS13_AES_128_GCM_SHA256);
        let big: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let chunks: Vec<&[u8]> = big.chunks(777).collect();
        let wire = seal_all(&mut records, &chunks, 40_000);
        let records_sent = big.len().div_ceil(MAX_PLAINTEXT) + 3; // batch ends cut records short
        assert!(
            wire.len() <= big.len() + records_sent * OVERHEAD,
            "{}",
            wire.len()
        );
        assert_eq!(input(&mut client, &wire).unwrap(), big);
    }

    #[test]
    fn records_split_anywhere_open_to_the_same_bytes() {
        let (mut records, _, mut client) = open(cipher_suite::TLS13_CHACHA20_POLY1305_SHA256);
        let messages: Vec<Vec<u8>> = (0..5)
            .map(|i| vec![b'a' + i; 10 + 300 * i as usize])
            .collect();
        for message in &messages {
            client.writer().write_all(message).unwrap();
        }
        let wire = output(&mut client);
        let expected = messages.concat();
        // Every split point, the partial record carried as a link does; the
        // record layer's sequence numbers must line up on each try, so each
        // try opens a copy taken before the first.
        let seq = records.rx.seq;
        for split in 0..wire.len() {
            records.rx.seq = seq;
            let mut got = Vec::new();
            let mut carried = Vec::new();
            for piece in [&wire[..split], &wire[split..]] {
                let mut buf = [carried.as_slice(), piece].concat();
                let opened = records.open(&mut buf).unwrap();
                got.extend_from_slice(&buf[..opened.plain]);
                carried = buf[opened.consumed..].to_vec();
            }
            assert!(carried.is_empty(), "split {split}");
            assert_eq!(got, expected, "split {split}");
        }
    }

    #[test]
    fn close_notify_ends_reading_and_a_key_update_is_refused() {
        let (mut records, _, mut client) = open(cipher_suite::TLS13_AES_256_GCM_SHA384);
        client.writer().write_all(b"last words").unwrap();
        client.send_close_notify();
        let mut wire = output(&mut client);
        let opened = records.open(&mut wire).unwrap();
        assert_eq!(&wire[..opened.plain], b"last words");
        assert!(opened.closed);

        let (mut records, _, mut client) = open(cipher_suite::TLS13_AES_256_GCM_SHA384);
        client.refresh_traffic_keys().unwrap();
        let mut wire = output(&mut client);
        assert_eq!(records.open(&mut wire), Err(RecordError::KeyUpdate));
        // The answer is a clean close the client reads as one.
        let mut alert = [0; ALERT_RECORD];
        let len = records.seal_alert(alert::CLOSE_NOTIFY, &mut alert).unwrap();
        assert_eq!(input(&mut client, &alert[..len]).unwrap(), b"");
        assert!(client.process_new_packets().unwrap().peer_has_closed());
    }

    #[test]
    fn tampered_or_malformed_records_are_refused() {
        let (mut records, _, mut client) = open(cipher_suite::TLS13_AES_128_GCM_SHA256);
        client.writer().write_all(b"payload").unwrap();
        let mut wire = output(&mut client);
        let last = wire.len() - 1;
        wire[last] ^= 1;
        assert_eq!(records.open(&mut wire), Err(RecordError::BadRecordMac));

        let mut plaintext_alert = [21, 3, 3, 0, 2, 2, 40];
        assert_eq!(
            records.open(&mut plaintext_alert),
            Err(RecordError::Unexpected)
        );
        let mut oversized = [23, 3, 3, 0x41, 0x01];
        assert_eq!(
            records.open(&mut oversized),
            Err(RecordError::RecordOverflow)
        );
        let mut short = [23, 3, 3, 0, 3, 0, 0, 0];
        assert_eq!(records.open(&mut short), Err(RecordError::Decode));
        let mut incomplete = [23, 3, 3, 0, 40, 1, 2];
        let opened = records.open(&mut incomplete).unwrap();
        assert_eq!(
            (opened.plain, opened.consumed),
            (0, 0),
            "waits for the rest"
        );
    }

    #[test]
    fn the_sending_key_wears_out_before_its_limit() {
        let (mut records, _, _) = open(cipher_suite::TLS13_AES_128_GCM_SHA256);
        let limit = Cipher::Aes128Gcm.confidentiality_limit();
        records.tx.seq = limit - WEAR_MARGIN - 2;
        let mut out = [0; 64];
        records.seal([&b"x"[..]], &mut out).unwrap();
        assert!(!records.worn_out(), "one record before the margin");
        records.seal([&b"x"[..]], &mut out).unwrap();
        assert!(records.worn_out(), "at the margin");
        assert!(!records.worn_out(), "said once");
        records.tx.seq = limit - 1;
        // Room and input for two records, one record left: the first is
        // sealed, the second refused on the next call.
        let mut out = vec![0; 2 * (OVERHEAD + MAX_PLAINTEXT)];
        let input = vec![7u8; 2 * MAX_PLAINTEXT];
        let (taken, used) = records.seal([&input[..]], &mut out).unwrap();
        assert_eq!((taken, used), (MAX_PLAINTEXT, MAX_PLAINTEXT + OVERHEAD));
        assert_eq!(
            records.seal([&b"x"[..]], &mut out),
            Err(RecordError::KeysUsedUp)
        );
        assert_eq!(Cipher::Chacha20Poly1305.confidentiality_limit(), u64::MAX);
    }
}
