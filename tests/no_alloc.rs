//! The per-packet path does not allocate: after a warm-up, a pair of engines runs
//! steady-state 64-byte SENDs (receives reposted) and 4 KiB RDMA WRITEs — post, transmit,
//! receive, ACK, completion — under a counting global allocator, and not one allocation
//! happens on the thread doing it.
#[path = "common/pair.rs"]
mod pair;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use pair::{Pair, PairOptions};
use xroce::engine::*;

/// Counts allocations (and reallocations) made by the thread that set `COUNTING`, so other
/// test threads do not disturb the count.
struct CountingAllocator;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn note_allocation() {
    // try_with: the thread-locals may be gone while a thread exits.
    let _ = COUNTING.try_with(|c| {
        if c.get() {
            let _ = ALLOCATIONS.try_with(|a| a.set(a.get() + 1));
        }
    });
}

// Safety: every call is forwarded to the system allocator unchanged.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // Safety: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // Safety: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        // Safety: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // Safety: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Allocations made on this thread while `f` runs.
fn allocations_during(f: impl FnOnce()) -> u64 {
    ALLOCATIONS.with(|a| a.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCATIONS.with(|a| a.get())
}

const BATCH: u64 = 128;

struct Run {
    pair: Pair,
    bufs: (Vec<u8>, Vec<u8>),
    wcs: Vec<Wc>,
    completions: u64,
    /// The clock: it moves on every frame, so timers are re-armed as in a real run.
    now: Instant,
}

impl Run {
    fn new(mtu: Mtu) -> Run {
        let wc = Wc::EMPTY;
        Run {
            pair: Pair::new(PairOptions {
                depth: 1024,
                mtu,
                ..PairOptions::default()
            }),
            bufs: (vec![0; MAX_FRAME_LEN], vec![0; MAX_FRAME_LEN]),
            wcs: vec![wc; 256],
            completions: 0,
            now: Instant::ZERO,
        }
    }

    /// One batch of `op` WRs of `len` bytes (receives posted first for SENDs), every frame
    /// moved until both engines are quiet, both CQs drained.
    fn batch(&mut self, op: WrOp, len: u32) {
        let p = &mut self.pair;
        let (qa, qb) = (p.qa, p.qb);
        let send_sge = [p.sge_a(0, len)];
        let recv_sge = [p.sge_b(0, 4096)];
        if matches!(op, WrOp::Send) {
            for i in 0..BATCH {
                p.net.engines[1].post_recv_sges(qb, i, &recv_sge).unwrap();
            }
        }
        for i in 0..BATCH {
            let flags = if i % 16 == 15 || i + 1 == BATCH {
                SendFlags::SIGNALED
            } else {
                SendFlags::default()
            };
            let wr = SendWrRef {
                wr_id: i,
                op,
                sg_list: &send_sge,
                flags,
                ud: None,
            };
            p.net.engines[0].post_send_ref(qa, &wr).unwrap();
        }
        let (a_buf, b_buf) = (&mut self.bufs.0, &mut self.bufs.1);
        let now = &mut self.now;
        let tick = std::time::Duration::from_nanos(100);
        loop {
            let mut moved = false;
            while let Some(n) = p.net.engines[0].poll_transmit(*now, a_buf) {
                *now += tick;
                p.net.engines[1].handle_frame(*now, &a_buf[..n]);
                moved = true;
            }
            while let Some(n) = p.net.engines[1].poll_transmit(*now, b_buf) {
                *now += tick;
                p.net.engines[0].handle_frame(*now, &b_buf[..n]);
                moved = true;
            }
            if !moved {
                break;
            }
        }
        for (e, cq) in [(0, p.cq_a), (1, p.cq_b)] {
            loop {
                let n = p.net.engines[e].poll_cq(cq, &mut self.wcs).unwrap();
                if n == 0 {
                    break;
                }
                assert!(self.wcs[..n].iter().all(|w| w.status == WcStatus::Success));
                self.completions += n as u64;
            }
        }
    }
}

fn assert_steady_state_does_not_allocate(mtu: Mtu, op: impl Fn(&Pair) -> WrOp, len: u32) {
    let mut run = Run::new(mtu);
    let op = op(&run.pair);
    // Warm-up: queues, CQs and scratch buffers grow to their working size.
    for _ in 0..8 {
        run.batch(op, len);
    }
    let before = (
        run.completions,
        run.pair.net.engines[0].counters().sent_pkts,
    );
    let allocations = allocations_during(|| {
        for _ in 0..50 {
            run.batch(op, len);
        }
    });
    let completions = run.completions - before.0;
    let packets = run.pair.net.engines[0].counters().sent_pkts - before.1;
    // The run did the work: 50 batches of 128 messages, 8 signaled per batch at A plus
    // (SEND) 128 receive completions per batch at B.
    let expected = 50 * (8 + if matches!(op, WrOp::Send) { 128 } else { 0 });
    assert_eq!(completions, expected, "every completion arrived");
    assert!(packets >= 50 * 128, "{packets} request packets");
    assert_eq!(
        allocations,
        0,
        "{allocations} allocations for {} messages ({packets} packets)",
        50 * BATCH
    );
}

#[test]
fn steady_state_64_byte_sends_do_not_allocate() {
    assert_steady_state_does_not_allocate(Mtu::Mtu1024, |_| WrOp::Send, 64);
}

#[test]
fn steady_state_4k_writes_do_not_allocate() {
    assert_steady_state_does_not_allocate(
        Mtu::Mtu4096,
        |p| WrOp::Write {
            remote_addr: p.mr_b.addr,
            rkey: p.mr_b.rkey,
        },
        4096,
    );
}

#[test]
fn the_counter_sees_an_allocation() {
    // The instrument itself: a Vec made while counting is counted.
    let n = allocations_during(|| drop(std::hint::black_box(vec![1u8; 10])));
    assert_eq!(n, 1);
}
