//! The engine alone: two engines joined in memory (no link model, no copies besides the
//! frame buffer each side owns), one core. Reports packets/s for 64-byte SENDs and Gbit/s of
//! payload for 4 KiB RDMA WRITEs at path MTU 4096.
//!
//! Run: `cargo bench --bench engine`.
#[path = "../tests/common/pair.rs"]
mod pair;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pair::{Pair, PairOptions};
use xroce::engine::*;

/// Move every frame between the two engines until both are quiet.
fn pump(p: &mut Pair, now: Instant, a_buf: &mut [u8], b_buf: &mut [u8]) {
    loop {
        let mut moved = false;
        while let Some(n) = p.net.engines[0].poll_transmit(now, a_buf) {
            p.net.engines[1].handle_frame(now, &a_buf[..n]);
            moved = true;
        }
        while let Some(n) = p.net.engines[1].poll_transmit(now, b_buf) {
            p.net.engines[0].handle_frame(now, &b_buf[..n]);
            moved = true;
        }
        if !moved {
            break;
        }
    }
}

fn run_batch(
    p: &mut Pair,
    op: WrOp,
    len: u32,
    batch: u64,
    bufs: &mut (Vec<u8>, Vec<u8>),
    wcs: &mut [Wc],
) {
    let qa = p.qa;
    // The borrowing post calls: no Vec per WR (tests/no_alloc.rs checks the whole path).
    let s = [p.sge_a(0, len)];
    let is_send = matches!(op, WrOp::Send);
    if is_send {
        let qb = p.qb;
        let sge = [p.sge_b(0, 4096)];
        for i in 0..batch {
            p.net.engines[1].post_recv_sges(qb, i, &sge).unwrap();
        }
    }
    for i in 0..batch {
        // Signal every 16th WR (as perftest does with its CQ moderation).
        let flags = if i % 16 == 15 || i + 1 == batch {
            SendFlags::SIGNALED
        } else {
            SendFlags::default()
        };
        p.net.engines[0]
            .post_send_ref(
                qa,
                &SendWrRef {
                    wr_id: i,
                    op,
                    sg_list: &s,
                    flags,
                    ud: None,
                },
            )
            .unwrap();
    }
    pump(p, Instant::ZERO, &mut bufs.0, &mut bufs.1);
    let cq_a = p.cq_a;
    while p.net.engines[0].poll_cq(cq_a, wcs).unwrap() > 0 {}
    let cq_b = p.cq_b;
    while p.net.engines[1].poll_cq(cq_b, wcs).unwrap() > 0 {}
}

fn bench(c: &mut Criterion) {
    const BATCH: u64 = 128;
    let mut wcs = vec![Wc::EMPTY; 256];
    let mut bufs = (vec![0u8; MAX_FRAME_LEN], vec![0u8; MAX_FRAME_LEN]);

    let mut g = c.benchmark_group("engine");
    g.measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements(BATCH));
    let mut p = Pair::new(PairOptions {
        depth: 1024,
        ..PairOptions::default()
    });
    g.bench_function("send_64B_packets", |b| {
        b.iter(|| run_batch(&mut p, WrOp::Send, 64, BATCH, &mut bufs, &mut wcs))
    });

    g.throughput(Throughput::Bytes(BATCH * 4096));
    let mut p = Pair::new(PairOptions {
        depth: 1024,
        mtu: Mtu::Mtu4096,
        ..PairOptions::default()
    });
    let op = WrOp::Write {
        remote_addr: p.mr_b.addr,
        rkey: p.mr_b.rkey,
    };
    g.bench_function("write_4KiB_bytes", |b| {
        b.iter(|| run_batch(&mut p, op, 4096, BATCH, &mut bufs, &mut wcs))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
