//! xroce's own work per half round trip: a busy-polling ping-pong through the whole verbs
//! path (post, progress round, engine, CQ) over the in-memory driver, so no kernel is in it.
//! Two threads, one per device, each spinning on its CQ as `send_lat` does: post the SEND
//! (signaled), wait for its completion, wait for the peer's SEND, repost the receive.
//! RC and UC side by side: UC has no ACK, so the difference is what the ACK costs both ends.
//! On a two-core machine the two spinning threads fill it.
//!
//! Run: `cargo bench --bench verbs_pingpong [-- ITERATIONS]` (default 200000).
use std::time::{Duration, Instant};

#[path = "../tests/common/sides.rs"]
mod sides;

use sides::{connect, connect_uc, device_pair, side, uc_side, Side};
use xroce::verbs::*;

const SIZE: u32 = 64;
const WAIT: Duration = Duration::from_secs(10);
/// Where in a side's region the SEND is read from, and the receive written to.
const SEND_AT: usize = 0;
const RECV_AT: usize = 4096;

/// Completions seen and not yet waited for, by kind: one poll can return the SEND's
/// completion and the next message's together.
#[derive(Default)]
struct Seen {
    sends: u32,
    recvs: u32,
}

/// Spins on the CQ until a completion of `opcode` has arrived.
fn wait_for(cq: &Cq, wcs: &mut [Wc], seen: &mut Seen, opcode: WcOpcode) {
    let start = Instant::now();
    loop {
        let count = match opcode {
            WcOpcode::Recv => &mut seen.recvs,
            _ => &mut seen.sends,
        };
        if *count > 0 {
            *count -= 1;
            return;
        }
        let n = cq.poll(wcs).unwrap();
        for wc in &wcs[..n] {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            match wc.opcode {
                WcOpcode::Recv => seen.recvs += 1,
                _ => seen.sends += 1,
            }
        }
        assert!(
            start.elapsed() < WAIT,
            "no {opcode:?} completion in {WAIT:?}"
        );
    }
}

/// One side's loop; the client sends first. Returns each round trip's length (client).
fn run(s: &Side, client: bool, iters: usize) -> Vec<Duration> {
    let mut wcs = [Wc::EMPTY; 16];
    let mut seen = Seen::default();
    let send_sge = [s.mr.sge(SEND_AT, SIZE).unwrap()];
    let recv_sge = [s.mr.sge(RECV_AT, SIZE).unwrap()];
    let send = SendWrRef {
        wr_id: 1,
        op: WrOp::Send,
        sg_list: &send_sge,
        flags: SendFlags::SIGNALED,
        ud: None,
    };
    let post_recv = || s.qp.post_recv_chain(|post| post(2, &recv_sge)).unwrap();
    let mut rtts = Vec::with_capacity(if client { iters } else { 0 });
    for _ in 0..iters {
        let t0 = Instant::now();
        if !client {
            wait_for(&s.cq, &mut wcs, &mut seen, WcOpcode::Recv);
            post_recv();
        }
        s.qp.post_send_chain(|post| post(&send, None)).unwrap();
        wait_for(&s.cq, &mut wcs, &mut seen, WcOpcode::Send);
        if client {
            wait_for(&s.cq, &mut wcs, &mut seen, WcOpcode::Recv);
            post_recv();
            rtts.push(t0.elapsed());
        }
    }
    rtts
}

fn measure(uc: bool, iters: usize) -> (f64, f64) {
    let (da, db, _link) = device_pair(ProgressMode::default());
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let (a, b) = if uc {
        let (a, b) = (uc_side(&da, &pa), uc_side(&db, &pb));
        connect_uc(&a, &b);
        (a, b)
    } else {
        let (a, b) = (side(&da, &pa), side(&db, &pb));
        connect(&a, &b);
        (a, b)
    };
    let post_recv = |s: &Side| {
        let sge = [s.mr.sge(RECV_AT, SIZE).unwrap()];
        s.qp.post_recv_chain(|post| post(2, &sge)).unwrap();
    };
    post_recv(&a);
    post_recv(&b);
    let mut rtts = std::thread::scope(|scope| {
        let server = scope.spawn(|| run(&b, false, iters));
        let rtts = run(&a, true, iters);
        server.join().unwrap();
        rtts
    });
    rtts.sort();
    let half_us = |d: Duration| d.as_secs_f64() * 1e6 / 2.0;
    (
        half_us(rtts[rtts.len() / 2]),
        half_us(rtts[rtts.len() * 99 / 100]),
    )
}

fn main() {
    let iters = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(200_000);
    println!("verbs ping-pong over the in-memory driver, {SIZE} B, {iters} round trips, busy poll");
    println!("{:<4} {:>14} {:>14}", "", "median half", "p99 half");
    for (name, uc) in [("RC", false), ("UC", true), ("RC", false), ("UC", true)] {
        let (median, p99) = measure(uc, iters);
        println!("{name:<4} {median:>11.3} us {p99:>11.3} us");
    }
}
