//! Which compressor makes a publication's shared permessage-deflate frame:
//! flate2 on zlib-rs (a stream reset per message, as
//! `server_no_context_takeover` needs; what `ws::deflate::Deflater` uses)
//! against libdeflate (whole buffer), at the levels worth choosing, on
//! the kind of message myriad fans out: a ~540-byte JSON publication
//! envelope of realistic text. Each compressor's size ratio is printed
//! once, beside criterion's times; docs/benchmarks.md has the figures.
//!
//! Run with `cargo bench -p myriad-protocol --bench deflate`.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use libdeflater::{CompressionLvl, Compressor};
use myriad_protocol::ws::deflate::{Deflater, Inflater};

/// A publication envelope with ids, names, a sentence and small numbers,
/// varied by `i` so no two are the same.
fn envelope(i: u64) -> Vec<u8> {
    format!(
        r#"{{"op":"msg","subject":"room.lobby.{}","epoch":"000000000000002a","offset":{},"data":{{"type":"chat.message","id":"msg_{:016x}","author":{{"id":"u_{}","name":"Ada Lovelace","avatar":"https://cdn.example.com/avatars/{}.png"}},"text":"Meeting moved to 3pm, the projector in room B is broken again so bring a laptop","sent_at":"2026-11-28T04:{:02}:{:02}Z","reactions":[{{"emoji":"thumbsup","count":{}}},{{"emoji":"eyes","count":2}}],"thread":null,"edited":false,"mentions":["u_1842","u_77"],"attachments":[],"client":{{"platform":"web","version":"4.12.0"}}}}}}"#,
        i % 97,
        i,
        i.wrapping_mul(2_654_435_761),
        i % 5000,
        i % 5000,
        i % 60,
        (i * 7) % 60,
        i % 13
    )
    .into_bytes()
}

/// Prints `name`'s size ratio over `messages`, then times it on them in
/// turn. `compress` returns the compressed length.
fn bench(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: String,
    messages: &[Vec<u8>],
    mut compress: impl FnMut(&[u8]) -> usize,
) {
    let total: usize = messages.iter().map(Vec::len).sum();
    let size: usize = messages.iter().map(|m| compress(m)).sum();
    println!("{name}: ratio {:.3}", size as f64 / total as f64);
    let mut i = 0;
    group.bench_function(name, |b| {
        b.iter(|| {
            i = (i + 1) % messages.len();
            compress(black_box(&messages[i]))
        })
    });
}

fn compress(c: &mut Criterion) {
    let messages: Vec<Vec<u8>> = (0..64).map(envelope).collect();
    let mut group = c.benchmark_group("deflate_540B_json");
    for level in [1i32, 6] {
        let mut compressor = Compressor::new(CompressionLvl::new(level).expect("1-12"));
        let mut out = vec![0; 4096];
        bench(&mut group, format!("libdeflate_{level}"), &messages, |m| {
            compressor.deflate_compress(m, &mut out).expect("fits")
        });
    }
    for level in [1u8, 2, 4, 6] {
        let mut deflater = Deflater::new(level);
        let mut out = Vec::with_capacity(4096);
        bench(&mut group, format!("zlib_rs_{level}"), &messages, |m| {
            out.clear();
            deflater.compress(m, &mut out).unwrap_or(m.len())
        });
    }
    group.finish();
}

fn inflate(c: &mut Criterion) {
    let message = envelope(7);
    let mut compressed = Vec::new();
    Deflater::new(1).compress(&message, &mut compressed);
    let mut inflater = Inflater::new();
    c.bench_function("inflate_540B_json", |b| {
        b.iter(|| {
            inflater
                .inflate(black_box(&compressed), 65_536)
                .map(<[u8]>::len)
        })
    });
}

criterion_group!(benches, compress, inflate);
criterion_main!(benches);
