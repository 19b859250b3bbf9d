//! The wire layer alone, one core: parse + ICRC-verify and emit of real rxe frames (a 62-byte
//! ACK and a 1082-byte SEND_FIRST from `tests/fixtures/rxe_rc_pingpong.pcap`), and the ICRC
//! over a 4096-byte payload.
//!
//! Run: `cargo bench --bench wire`.
use std::path::Path;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use xroce::capture::read_capture;
use xroce::wire::{icrc_ipv4, parse_frame_verified, Opcode};

fn frames() -> (Vec<u8>, Vec<u8>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rxe_rc_pingpong.pcap");
    let all = read_capture(path).expect("fixture");
    let find = |op: Opcode| {
        all.iter()
            .find(|f| parse_frame_verified(&f.data).map(|r| r.roce.bth.opcode) == Ok(op))
            .expect("frame")
            .data
            .clone()
    };
    (find(Opcode::RC_ACKNOWLEDGE), find(Opcode::RC_SEND_FIRST))
}

fn bench(c: &mut Criterion) {
    let (ack, send) = frames();
    let mut g = c.benchmark_group("wire");
    g.measurement_time(Duration::from_secs(3));
    for (name, bytes) in [("ack_62B", &ack), ("send_first_1082B", &send)] {
        g.throughput(Throughput::Elements(1));
        g.bench_function(format!("parse_verified/{name}"), |b| {
            b.iter(|| parse_frame_verified(std::hint::black_box(bytes)).unwrap())
        });
        let repr = parse_frame_verified(bytes).unwrap();
        let mut out = vec![0u8; bytes.len()];
        g.bench_function(format!("emit/{name}"), |b| {
            b.iter(|| repr.emit(std::hint::black_box(&mut out)).unwrap())
        });
    }
    let ip = [0x45u8; 20];
    let udp = vec![0x5au8; 8 + 12 + 4096];
    g.throughput(Throughput::Bytes(udp.len() as u64));
    g.bench_function("icrc/4KiB", |b| {
        b.iter(|| icrc_ipv4(&ip, std::hint::black_box(&udp)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
