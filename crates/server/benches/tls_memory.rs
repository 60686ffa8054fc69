//! What one idle TLS connection costs in userland, for each way a server
//! can hold it after the handshake, and what the record layer's AEAD key
//! costs to prepare. docs/benchmarks.md ("TLS: memory per idle connection")
//! records the figures and the choice they led to.
//!
//! Each form is measured in a child process of its own: N server-side
//! connections are brought through a TLS 1.3 handshake with an in-memory
//! rustls client, take one request and send a response and one message
//! (what a subscribed WebSocket has done before it goes idle), and are
//! kept while every client is dropped. Reported per connection: the
//! struct, the heap it still holds (exact, from a counting allocator) and
//! the RSS the process grew by (which adds malloc's own overhead).
//!
//! Run with `cargo bench -p myriad-server --bench tls_memory`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::io::{Read, Write};
use std::process::Command;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use myriad_server::link::Tls;
use myriad_server::tls::handshake::{Handshake, Progress};
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::crypto::ring as provider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::ConnectionState;
use rustls::{
    ClientConfig, ClientConnection, ServerConfig, ServerConnection, SupportedCipherSuite,
};

/// Counts live heap bytes and allocations, so a form's heap is exact.
struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
static LIVE_ALLOCS: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; the
// counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        LIVE_ALLOCS.fetch_add(1, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        LIVE_ALLOCS.fetch_sub(1, Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Idle connections held per measurement.
const CONNECTIONS: usize = 10_000;

const REQUEST: &[u8] = b"GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n\
Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
const RESPONSE: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
Connection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";
const MESSAGE: &[u8] = &[b'x'; 100];

/// The ways to hold a connection after its handshake.
const FORMS: [(&str, &str); 5] = [
    ("buffered", "rustls ServerConnection (buffered API)"),
    ("unbuffered", "rustls UnbufferedServerConnection"),
    (
        "kernel",
        "extracted secrets + rustls KernelConnection (key updates)",
    ),
    ("secrets", "extracted secrets only (own record layer)"),
    (
        "myriad",
        "myriad: the TLS state a connection keeps (`link::Tls`, boxed)",
    ),
];

const SUITES: [(&str, SupportedCipherSuite); 3] = [
    (
        "AES-128-GCM",
        provider::cipher_suite::TLS13_AES_128_GCM_SHA256,
    ),
    (
        "AES-256-GCM",
        provider::cipher_suite::TLS13_AES_256_GCM_SHA384,
    ),
    (
        "CHACHA20-POLY1305",
        provider::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    ),
];

struct Pki {
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
}

fn pki(suite: SupportedCipherSuite) -> Pki {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert: CertificateDer<'static> = certified.cert.der().clone();
    let key = PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der());
    let mut only_suite = provider::default_provider();
    only_suite.cipher_suites = vec![suite];
    let mut server = ServerConfig::builder_with_provider(Arc::new(only_suite))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], PrivateKeyDer::Pkcs8(key))
        .unwrap();
    // As the node runs it: no session tickets, secrets may be extracted.
    server.send_tls13_tickets = 0;
    server.enable_secret_extraction = true;
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let mut client = ClientConfig::builder_with_provider(Arc::new(provider::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    Pki {
        server: Arc::new(server),
        client: Arc::new(client),
    }
}

fn client(pki: &Pki) -> ClientConnection {
    ClientConnection::new(Arc::clone(&pki.client), "localhost".try_into().unwrap()).unwrap()
}

/// Everything the client wants to send.
fn client_output(client: &mut ClientConnection) -> Vec<u8> {
    let mut out = Vec::new();
    while client.wants_write() {
        client.write_tls(&mut out).unwrap();
    }
    out
}

/// Hands `data` to the client; returns the plaintext it got.
fn client_input(client: &mut ClientConnection, mut data: &[u8]) -> Vec<u8> {
    while !data.is_empty() {
        client.read_tls(&mut data).unwrap();
        client.process_new_packets().unwrap();
    }
    let mut plain = Vec::new();
    // WouldBlock once the plaintext is all read.
    let _ = client.reader().read_to_end(&mut plain);
    plain
}

fn buffered(pki: &Pki) -> ServerConnection {
    let mut server = ServerConnection::new(Arc::clone(&pki.server)).unwrap();
    let mut client = client(pki);
    let feed = |server: &mut ServerConnection, mut data: &[u8]| {
        while !data.is_empty() {
            server.read_tls(&mut data).unwrap();
            server.process_new_packets().unwrap();
        }
    };
    let drain = |server: &mut ServerConnection| {
        let mut out = Vec::new();
        while server.wants_write() {
            server.write_tls(&mut out).unwrap();
        }
        out
    };
    while client.is_handshaking() || client.wants_write() {
        feed(&mut server, &client_output(&mut client));
        client_input(&mut client, &drain(&mut server));
    }
    client.writer().write_all(REQUEST).unwrap();
    feed(&mut server, &client_output(&mut client));
    let mut request = Vec::new();
    let _ = server.reader().read_to_end(&mut request);
    assert_eq!(request, REQUEST);
    server.writer().write_all(RESPONSE).unwrap();
    server.writer().write_all(MESSAGE).unwrap();
    let got = client_input(&mut client, &drain(&mut server));
    assert_eq!(got.len(), RESPONSE.len() + MESSAGE.len());
    server
}

/// Runs an unbuffered server over `incoming` until it needs more input or
/// may write application data; returns (bytes to send, plaintext, ready).
fn drive(server: &mut UnbufferedServerConnection, incoming: &mut Vec<u8>) -> (Vec<u8>, Vec<u8>) {
    let mut out = vec![0; 16 * 1024];
    let mut used = 0;
    let mut plain = Vec::new();
    loop {
        let status = server.process_tls_records(incoming);
        let discard = status.discard;
        let mut done = false;
        match status.state.unwrap() {
            ConnectionState::EncodeTlsData(mut data) => {
                used += data.encode(&mut out[used..]).unwrap()
            }
            ConnectionState::TransmitTlsData(data) => data.done(),
            ConnectionState::BlockedHandshake | ConnectionState::WriteTraffic(_) => done = true,
            ConnectionState::ReadTraffic(mut traffic) => {
                while let Some(record) = traffic.next_record() {
                    plain.extend_from_slice(record.unwrap().payload);
                }
            }
            other => panic!("unexpected {other:?}"),
        }
        incoming.drain(..discard);
        if done {
            out.truncate(used);
            return (out, plain);
        }
    }
}

fn unbuffered_handshake(pki: &Pki) -> (UnbufferedServerConnection, ClientConnection) {
    let mut server = UnbufferedServerConnection::new(Arc::clone(&pki.server)).unwrap();
    let mut client = client(pki);
    let mut incoming = Vec::new();
    while client.is_handshaking() || client.wants_write() {
        incoming.extend(client_output(&mut client));
        let (out, _) = drive(&mut server, &mut incoming);
        client_input(&mut client, &out);
    }
    (server, client)
}

fn unbuffered(pki: &Pki) -> UnbufferedServerConnection {
    let (mut server, mut client) = unbuffered_handshake(pki);
    client.writer().write_all(REQUEST).unwrap();
    let mut incoming = client_output(&mut client);
    let (_, request) = drive(&mut server, &mut incoming);
    assert_eq!(request, REQUEST);
    let mut out = vec![0; 4096];
    let status = server.process_tls_records(&mut []);
    let ConnectionState::WriteTraffic(mut traffic) = status.state.unwrap() else {
        panic!("a handshaken connection may write");
    };
    let mut used = traffic.encrypt(RESPONSE, &mut out).unwrap();
    used += traffic.encrypt(MESSAGE, &mut out[used..]).unwrap();
    let got = client_input(&mut client, &out[..used]);
    assert_eq!(got.len(), RESPONSE.len() + MESSAGE.len());
    server
}

/// What the node keeps: its own handshake driver, then the boxed TLS state
/// a `Conn` points to (the pointer itself is counted as the struct).
fn myriad(pki: &Pki) -> Box<Tls> {
    let mut handshake = Handshake::new(Arc::clone(&pki.server)).unwrap();
    let mut client = client(pki);
    client.writer().write_all(REQUEST).unwrap();
    loop {
        let progress = handshake.advance(&client_output(&mut client)).unwrap();
        let flight = std::mem::take(handshake.output());
        client_input(&mut client, &flight);
        if progress == Progress::Ready {
            break;
        }
    }
    let (tls, request) = Tls::established(handshake.finish().unwrap());
    assert_eq!(request, REQUEST);
    tls
}

fn kernel(
    pki: &Pki,
) -> (
    rustls::ExtractedSecrets,
    rustls::kernel::KernelConnection<rustls::server::ServerConnectionData>,
) {
    let (server, _client) = unbuffered_handshake(pki);
    server.dangerous_into_kernel_connection().unwrap()
}

/// Holds [`CONNECTIONS`] of what `make` builds; prints one row.
fn hold<T>(label: &str, pki: &Pki, make: fn(&Pki) -> T) {
    drop(make(pki)); // warm up: lazily built statics are not per connection
    let mut kept = Vec::with_capacity(CONNECTIONS);
    let rss_before = rss_bytes();
    let bytes_before = LIVE_BYTES.load(Ordering::Relaxed);
    let allocs_before = LIVE_ALLOCS.load(Ordering::Relaxed);
    for _ in 0..CONNECTIONS {
        kept.push(make(pki));
    }
    let per = |after: isize, before: isize| (after - before) as f64 / CONNECTIONS as f64;
    let heap = per(LIVE_BYTES.load(Ordering::Relaxed), bytes_before);
    let allocs = per(LIVE_ALLOCS.load(Ordering::Relaxed), allocs_before);
    let rss = per(rss_bytes() as isize, rss_before as isize);
    let size = std::mem::size_of::<T>();
    println!(
        "| {label} | {size} | {heap:.0} ({allocs:.0} allocations) | {:.0} | {rss:.0} |",
        size as f64 + heap
    );
    black_box(kept);
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Measures one (form, suite) in this process.
fn child(form: &str, suite: &str) {
    let (_, cipher) = SUITES.iter().find(|(name, _)| *name == suite).unwrap();
    let label = FORMS.iter().find(|(name, _)| *name == form).unwrap().1;
    let label = format!("{label}, {suite}");
    let pki = pki(*cipher);
    match form {
        "buffered" => hold(&label, &pki, buffered),
        "unbuffered" => hold(&label, &pki, unbuffered),
        "kernel" => hold(&label, &pki, kernel),
        "secrets" => hold(&label, &pki, |pki| kernel(pki).0),
        "myriad" => hold(&label, &pki, myriad),
        _ => unreachable!(),
    }
}

/// What preparing each AEAD's key costs next to sealing one small and
/// one full record with it: the price of deriving the key per flush
/// instead of keeping it.
fn key_costs() {
    println!("\n| AEAD | prepared key (bytes) | prepare a key (ns) | seal 100 B (ns) | seal 16 KiB (ns) |");
    println!("|---|---|---|---|---|");
    for (name, algorithm) in [
        ("AES-128-GCM", &aead::AES_128_GCM),
        ("AES-256-GCM", &aead::AES_256_GCM),
        ("CHACHA20-POLY1305", &aead::CHACHA20_POLY1305),
    ] {
        let secret = vec![7u8; algorithm.key_len()];
        let prepare = time_per(200_000, |_| {
            black_box(LessSafeKey::new(
                UnboundKey::new(algorithm, &secret).unwrap(),
            ));
        });
        let key = LessSafeKey::new(UnboundKey::new(algorithm, &secret).unwrap());
        let seal = |size: usize, rounds: u64| {
            let mut record = vec![1u8; size];
            time_per(rounds, |i| {
                let mut nonce = [0u8; 12];
                nonce[4..].copy_from_slice(&i.to_be_bytes());
                let aad = Aad::from([23, 3, 3, 0, 0]);
                let nonce = Nonce::assume_unique_for_key(nonce);
                let tag = key.seal_in_place_separate_tag(nonce, aad, &mut record);
                black_box(tag.unwrap().as_ref()[0]);
            })
        };
        println!(
            "| {name} | {} | {:.0} | {:.0} | {:.0} |",
            std::mem::size_of::<LessSafeKey>(),
            prepare,
            seal(100, 200_000),
            seal(16 * 1024, 5_000)
        );
    }
}

/// Median of 5 runs of `rounds` calls, in nanoseconds per call.
fn time_per(rounds: u64, mut f: impl FnMut(u64)) -> f64 {
    let mut runs: Vec<f64> = (0..5)
        .map(|_| {
            let start = Instant::now();
            for i in 0..rounds {
                f(i);
            }
            start.elapsed().as_nanos() as f64 / rounds as f64
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[2]
}

fn main() {
    if let (Ok(form), Ok(suite)) = (
        std::env::var("TLS_MEMORY_FORM"),
        std::env::var("TLS_MEMORY_SUITE"),
    ) {
        child(&form, &suite);
        return;
    }
    println!("{CONNECTIONS} idle server connections per row, each measured in its own process.\n");
    println!("| form | struct (bytes) | heap (bytes) | struct + heap | RSS added (bytes) |");
    println!("|---|---|---|---|---|");
    let me = std::env::current_exe().unwrap();
    for (form, _) in FORMS {
        for (suite, _) in SUITES {
            let out = Command::new(&me)
                .env("TLS_MEMORY_FORM", form)
                .env("TLS_MEMORY_SUITE", suite)
                .output()
                .unwrap();
            assert!(out.status.success(), "{form} {suite}: {out:?}");
            print!("{}", String::from_utf8_lossy(&out.stdout));
        }
    }
    key_costs();
}
