//! Micro-benchmarks of the framing hot path: unmasking, header parsing, and
//! one `MessageReader::read` per frame as the server does it.
//!
//! Run with `cargo bench -p myriad-protocol --bench frame`.

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use myriad_protocol::ws::{
    apply_mask, encode_frame, parse_frame_header, MessageReader, OpCode, Read, ReadLimits, Role,
};

const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

fn mask(c: &mut Criterion) {
    let mut group = c.benchmark_group("apply_mask");
    for len in [16usize, 256, 4096, 65536] {
        let mut data = vec![0x5a; len];
        group.throughput(Throughput::Bytes(len as u64));
        group.bench_function(format!("{len}B"), |b| {
            b.iter(|| apply_mask(black_box(&mut data), black_box(MASK)))
        });
    }
    group.finish();
}

fn header(c: &mut Criterion) {
    let frame = encode_frame(OpCode::Text, &[b'x'; 300], Some(MASK));
    c.bench_function("parse_frame_header/masked_16bit", |b| {
        b.iter(|| parse_frame_header(black_box(&frame)))
    });
}

fn read(c: &mut Criterion) {
    let limits = ReadLimits {
        role: Role::Server,
        max_message: 1 << 20,
    };
    let mut group = c.benchmark_group("MessageReader::read");
    // A typical protocol v1 command and a larger publish.
    for len in [64usize, 1024, 16384] {
        let text = "a".repeat(len);
        let frame = encode_frame(OpCode::Text, text.as_bytes(), Some(MASK));
        let mut reader = MessageReader::new();
        group.throughput(Throughput::Bytes(len as u64));
        // Each read unmasks in place, so every iteration gets a fresh copy.
        group.bench_function(format!("text_{len}B"), |b| {
            b.iter_batched_ref(
                || frame.clone(),
                |buf| match reader.read(buf, &limits) {
                    Ok(Read::Frame { consumed, .. }) => consumed,
                    other => panic!("unexpected {other:?}"),
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, mask, header, read);
criterion_main!(benches);
