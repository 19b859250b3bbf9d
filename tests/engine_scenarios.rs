//! Deterministic scenario tests of the RC/UD transport: each test provokes one behaviour
//! with an exact frame filter on the simulated link and checks completions, memory and
//! counters.
#[path = "common/pair.rs"]
mod pair;

use std::cell::RefCell;
use std::net::IpAddr;
use std::rc::Rc;
use std::time::Duration;

use pair::{drain, Pair, PairOptions};
use xroce::engine::*;
use xroce::sim::{FrameInfo, Verdict};
use xroce::wire::{self, Opcode, Syndrome};

const SEC: Duration = Duration::from_secs(1);

fn opcode_of(f: &FrameInfo<'_>) -> Option<Opcode> {
    f.packet().map(|p| p.bth.opcode)
}

/// Drop the n-th (1-based) frame for which `pred` holds; count matches in `seen`.
fn drop_nth(
    n: u32,
    pred: impl Fn(&FrameInfo<'_>) -> bool + 'static,
) -> impl FnMut(&FrameInfo<'_>) -> Verdict {
    let mut count = 0;
    move |f| {
        if pred(f) {
            count += 1;
            if count == n {
                return Verdict::Drop;
            }
        }
        Verdict::Pass
    }
}

fn fill(p: &mut Pair, a_side: bool, offset: u64, len: usize, seed: u8) -> Vec<u8> {
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    let (lkey, addr) = if a_side {
        (p.mr_a.lkey, p.mr_a.addr)
    } else {
        (p.mr_b.lkey, p.mr_b.addr)
    };
    let e = if a_side { p.a() } else { p.b() };
    e.mr_write(lkey, addr + offset, &data).unwrap();
    data
}

fn read_mem(p: &mut Pair, a_side: bool, offset: u64, len: usize) -> Vec<u8> {
    let (lkey, addr) = if a_side {
        (p.mr_a.lkey, p.mr_a.addr)
    } else {
        (p.mr_b.lkey, p.mr_b.addr)
    };
    let e = if a_side { p.a() } else { p.b() };
    e.mr_to_vec(lkey, addr + offset, len).unwrap()
}

fn statuses(wcs: &[Wc]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

fn write_op(p: &Pair, off: u64) -> WrOp {
    WrOp::Write {
        remote_addr: p.mr_b.addr + off,
        rkey: p.mr_b.rkey,
    }
}

fn read_op(p: &Pair, off: u64) -> WrOp {
    WrOp::Read {
        remote_addr: p.mr_b.addr + off,
        rkey: p.mr_b.rkey,
    }
}

#[test]
fn basic_send_write_read_atomics() {
    let mut p = Pair::new(PairOptions::default());
    let data = fill(&mut p, true, 0, 3000, 1);
    p.post_recv_b(7, 0, 4096);
    let s = p.sge_a(0, 3000);
    p.post_a(1, WrOp::SendWithImm { imm: 0xABCD }, vec![s]);
    let wop = write_op(&p, 8192);
    p.post_a(2, wop, vec![s]);
    let rdata = fill(&mut p, false, 20000, 2500, 9);
    let rop = read_op(&p, 20000);
    let s2 = p.sge_a(40000, 2500);
    p.post_a(3, rop, vec![s2]);
    let s3 = p.sge_a(50000, 8);
    let va = p.mr_b.addr + 60000;
    let rkey = p.mr_b.rkey;
    p.post_a(
        4,
        WrOp::FetchAdd {
            remote_addr: va,
            rkey,
            add: 5,
        },
        vec![s3],
    );
    p.post_a(
        5,
        WrOp::CompareSwap {
            remote_addr: va,
            rkey,
            compare: 5,
            swap: 77,
        },
        vec![s3],
    );
    let wcs = p.run_for_completions(5, SEC);
    assert_eq!(
        statuses(&wcs),
        (1..=5).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    assert_eq!(wcs[2].opcode, WcOpcode::RdmaRead);
    let cq_b = p.cq_b;
    let recv = drain(p.b(), cq_b);
    assert_eq!(recv.len(), 1);
    assert_eq!(recv[0].wr_id, 7);
    assert_eq!(recv[0].byte_len, 3000);
    assert_eq!(recv[0].imm_data, Some(0xABCD));
    assert_eq!(read_mem(&mut p, false, 0, 3000), data);
    assert_eq!(read_mem(&mut p, false, 8192, 3000), data);
    assert_eq!(read_mem(&mut p, true, 40000, 2500), rdata);
    // CAS saw 5 (after FADD) and swapped in 77; its result (orig 5) overwrote FADD's (0).
    assert_eq!(read_mem(&mut p, true, 50000, 8), 5u64.to_ne_bytes());
    assert_eq!(read_mem(&mut p, false, 60000, 8), 77u64.to_ne_bytes());
    assert_eq!(p.a().counters().retransmitted_packets, 0);
}

#[test]
fn implied_nak_by_later_ack() {
    let mut p = Pair::new(PairOptions::default());
    let rdata = fill(&mut p, false, 0, 500, 3);
    let rop = read_op(&p, 0);
    let s = p.sge_a(0, 500);
    p.post_a(1, rop, vec![s]);
    let wop = write_op(&p, 4096);
    let s2 = p.sge_a(8192, 100);
    p.post_a(2, wop, vec![s2]);
    // Lose the READ response: the ACK of the later WRITE implies it was lost.
    p.net.set_filter(drop_nth(1, |f| {
        opcode_of(f) == Some(Opcode::RC_RDMA_READ_RESPONSE_ONLY)
    }));
    let wcs = p.run_for_completions(2, SEC);
    assert_eq!(
        statuses(&wcs),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(read_mem(&mut p, true, 0, 500), rdata);
    let c = p.a().counters().clone();
    assert!(c.completer_retry_err >= 1, "{c:?}");
    assert_eq!(
        c.local_ack_timeout_err, 0,
        "recovered without waiting for the timer"
    );
    assert!(p.b().counters().duplicate_request >= 1);
}

#[test]
fn psn_sequence_nak_and_resend() {
    let mut p = Pair::new(PairOptions::default());
    for i in 0..3 {
        p.post_recv_b(i, i * 4096, 4096);
    }
    let data = fill(&mut p, true, 0, 3000, 5);
    for i in 0..3 {
        let s = p.sge_a(0, 3000);
        p.post_a(i, WrOp::Send, vec![s]);
    }
    // Lose the first packet of the second SEND (the 4th request packet).
    p.net.set_filter(drop_nth(4, |f| f.from == 0));
    let wcs = p.run_for_completions(3, SEC);
    assert_eq!(
        statuses(&wcs),
        (0..3).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    let a = p.a().counters().clone();
    let b = p.b().counters().clone();
    assert_eq!(a.rcvd_seq_err, 1, "exactly one sequence NAK for the gap");
    assert_eq!(a.local_ack_timeout_err, 0);
    assert!(a.retransmitted_packets >= 1);
    assert!(b.out_of_seq_request >= 1);
    let cq_b = p.cq_b;
    let recv = drain(p.b(), cq_b);
    assert_eq!(recv.len(), 3);
    for i in 0..3 {
        assert_eq!(read_mem(&mut p, false, i * 4096, 3000), data);
    }
}

#[test]
fn one_sequence_nak_per_gap() {
    let mut p = Pair::new(PairOptions::default());
    let wop = write_op(&p, 0);
    let s = p.sge_a(0, 10 * 1024);
    p.post_a(1, wop, vec![s]);
    // Lose the 2nd packet of a 10-packet WRITE: 8 later packets arrive out of sequence.
    p.net.set_filter(drop_nth(2, |f| f.from == 0));
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::Success)]);
    let b = p.b().counters().clone();
    assert_eq!(b.out_of_seq_request, 8);
    assert_eq!(b.drops.out_of_seq_silent, 7, "one NAK, then silence");
    assert_eq!(p.a().counters().rcvd_seq_err, 1);
}

#[test]
fn local_ack_timeout_recovers() {
    let opts = PairOptions {
        timeout: 12, // 16.8 ms
        ..PairOptions::default()
    };
    let mut p = Pair::new(opts);
    let wop = write_op(&p, 0);
    let s = p.sge_a(0, 64);
    p.post_a(1, wop, vec![s]);
    p.net.set_filter(drop_nth(1, |f| f.from == 1));
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::Success)]);
    assert_eq!(p.a().counters().local_ack_timeout_err, 1);
    assert_eq!(p.b().counters().duplicate_request, 1);
    let t = timers::local_ack_timeout(12).unwrap();
    assert!(
        p.net.now() >= Instant::ZERO + t,
        "completed only after the timer: {:?}",
        p.net.now()
    );
    assert!(p.net.now() < Instant::ZERO + t * 2);
}

/// A pair whose B never answers (every frame from B dropped), with two 64-byte WRITEs posted
/// on A: what a requester does when the peer has gone.
fn unanswered_writes(retry_cnt: u8) -> (Pair, Vec<Wc>) {
    let mut p = Pair::new(PairOptions {
        retry_cnt,
        ..PairOptions::default()
    });
    p.net.set_filter(|f| {
        if f.from == 1 {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    let wop = write_op(&p, 0);
    let s = p.sge_a(0, 64);
    p.post_a(1, wop, vec![s]);
    p.post_a(2, wop, vec![s]);
    let wcs = p.run_for_completions(2, SEC * 60);
    (p, wcs)
}

#[test]
fn local_ack_timeout_exhaustion() {
    let (mut p, wcs) = unanswered_writes(2);
    assert_eq!(
        statuses(&wcs),
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    let c = p.a().counters().clone();
    assert_eq!(c.local_ack_timeout_err, 3, "retry_cnt 2 = three timeouts");
    assert_eq!(c.retry_exceeded_err, 1);
    // Two packets, sent once and retried twice.
    assert_eq!(c.sent_pkts, 6);
    let qa = p.qa;
    assert_eq!(p.a().query_qp(qa).unwrap().0.qp_state, QpState::Err);
    assert!(matches!(p.a().poll_event(), Some(Event::QpFatal(q)) if q == qa));
}

/// retry_cnt 7 is seven retries (IBTA Vol. 1 9.7), not "forever" as rxe makes it
/// (docs/interop.md, observed with `rxe_blackout_retry_cnt_7`): eight sends, then RETRY_EXC_ERR.
#[test]
fn retry_cnt_7_is_finite() {
    let (mut p, wcs) = unanswered_writes(7);
    assert_eq!(
        statuses(&wcs),
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    let c = p.a().counters().clone();
    assert_eq!(c.local_ack_timeout_err, 8, "retry_cnt 7 = eight timeouts");
    // Two packets, sent once and retried seven times.
    assert_eq!(c.sent_pkts, 16);
}

#[test]
fn rnr_retry_limit_not_reached() {
    let mut p = Pair::new(PairOptions {
        rnr_retry: 3,
        min_rnr_timer: 2, // 20 us
        ..PairOptions::default()
    });
    let s = p.sge_a(0, 100);
    p.post_a(1, WrOp::Send, vec![s]);
    // Run until the first RNR NAK, then post the receive.
    let rnr_seen = Rc::new(RefCell::new(0));
    let seen = rnr_seen.clone();
    p.net.set_filter(move |f| {
        if let Some(pk) = f.packet() {
            if matches!(pk.aeth.map(|a| a.syndrome), Some(Syndrome::RnrNak { .. })) {
                *seen.borrow_mut() += 1;
            }
        }
        Verdict::Pass
    });
    let deadline = p.net.now() + SEC;
    let s2 = rnr_seen.clone();
    p.net.run_until(deadline, move |_| *s2.borrow() >= 2);
    p.post_recv_b(9, 0, 4096);
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::Success)]);
    assert_eq!(*rnr_seen.borrow(), 2);
    assert_eq!(p.a().counters().rcvd_rnr_err, 2);
    assert_eq!(p.b().counters().send_rnr_err, 2);
    // Each retry waited the RNR timer (20 us) at least.
    assert!(p.net.now() >= Instant::ZERO + Duration::from_micros(40));
}

#[test]
fn rnr_retry_limit_reached() {
    let mut p = Pair::new(PairOptions {
        rnr_retry: 2,
        ..PairOptions::default()
    });
    let s = p.sge_a(0, 100);
    p.post_a(1, WrOp::Send, vec![s]);
    p.post_a(2, WrOp::Send, vec![s]);
    let wcs = p.run_for_completions(2, SEC);
    assert_eq!(
        statuses(&wcs),
        vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    let c = p.a().counters().clone();
    assert_eq!(c.rcvd_rnr_err, 3, "first RNR NAK plus rnr_retry=2 retries");
    assert_eq!(c.retry_rnr_exceeded_err, 1);
}

#[test]
fn rnr_nak_carries_min_rnr_timer() {
    let mut p = Pair::new(PairOptions {
        rnr_retry: 0,
        min_rnr_timer: 14,
        ..PairOptions::default()
    });
    let timers_seen = Rc::new(RefCell::new(Vec::new()));
    let t = timers_seen.clone();
    p.net.set_filter(move |f| {
        if let Some(Syndrome::RnrNak { timer }) =
            f.packet().and_then(|p| p.aeth).map(|a| a.syndrome)
        {
            t.borrow_mut().push(timer);
        }
        Verdict::Pass
    });
    let s = p.sge_a(0, 10);
    p.post_a(1, WrOp::Send, vec![s]);
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::RnrRetryExcErr)]);
    assert_eq!(*timers_seen.borrow(), vec![14]);
}

/// Build a frame from B to A's QP as B would, with a chosen opcode/PSN/AETH.
fn forged_ack(p: &mut Pair, psn: u32, syndrome: Syndrome) -> Vec<u8> {
    use wire::*;
    let qa = p.qa;
    let frame = FrameRepr {
        eth: EthRepr {
            dst: xroce::sim::workload::MAC_A,
            src: xroce::sim::workload::MAC_B,
            vlan: None,
        },
        ip: IpRepr::V4 {
            src: xroce::sim::workload::IP_B,
            dst: xroce::sim::workload::IP_A,
            tos: 0,
            ttl: 64,
            ident: 1,
            dont_fragment: true,
        },
        udp_src_port: 0xC000,
        roce: PacketRepr {
            bth: BthRepr {
                opcode: Opcode::RC_ACKNOWLEDGE,
                solicited: false,
                migreq: false,
                pad_count: 0,
                tver: 0,
                pkey: 0xFFFF,
                fecn: false,
                becn: false,
                dest_qp: qa,
                ack_req: false,
                psn: Psn::new(psn),
            },
            reth: None,
            aeth: Some(AethRepr { syndrome, msn: 0 }),
            atomic_eth: None,
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
            deth: None,
            payload: &[],
        },
    };
    let mut buf = vec![0u8; frame.buffer_len()];
    let n = frame.emit(&mut buf).unwrap();
    buf.truncate(n);
    buf
}

#[test]
fn ghost_ack_is_dropped() {
    let mut p = Pair::new(PairOptions::default());
    // Nothing outstanding: any ACK is a ghost.
    let f = forged_ack(&mut p, 100, Syndrome::Ack { credit: 0x1F });
    p.a().handle_frame(Instant::ZERO, &f);
    assert_eq!(p.a().counters().drops.ghost_ack, 1);
    // One WRITE outstanding (PSN 100); an ACK for PSN 150 is beyond anything sent.
    let wop = write_op(&p, 0);
    let s = p.sge_a(0, 64);
    p.post_a(1, wop, vec![s]);
    let mut buf = vec![0; MAX_FRAME_LEN];
    let n = p.a().poll_transmit(Instant::ZERO, &mut buf).unwrap();
    let ghost = forged_ack(&mut p, 150, Syndrome::Ack { credit: 0x1F });
    p.a().handle_frame(Instant::ZERO, &ghost);
    assert_eq!(p.a().counters().drops.ghost_ack, 2);
    let cq = p.cq_a;
    assert!(drain(p.a(), cq).is_empty(), "a ghost ACK completes nothing");
    // The real exchange still works.
    p.b().handle_frame(Instant::ZERO, &buf[..n]);
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::Success)]);
}

#[test]
fn duplicate_ack_is_ignored() {
    let mut p = Pair::new(PairOptions::default());
    let wop = write_op(&p, 0);
    let s = p.sge_a(0, 64);
    p.post_a(1, wop, vec![s]);
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(wcs.len(), 1);
    let old = forged_ack(&mut p, 100, Syndrome::Ack { credit: 0x1F });
    p.a().handle_frame(Instant::ZERO, &old);
    assert_eq!(
        p.a().counters().drops.duplicate_ack,
        1,
        "PSN 100 was acknowledged already"
    );
    assert_eq!(p.a().counters().drops.ghost_ack, 0);
}

#[test]
fn rkey_violation_naks_and_leaves_memory_untouched() {
    let mut p = Pair::new(PairOptions::default());
    let before = read_mem(&mut p, false, 0, 256);
    fill(&mut p, true, 0, 256, 7);
    let rkey = p.mr_b.rkey ^ 0x100;
    let remote_addr = p.mr_b.addr;
    let s = p.sge_a(0, 256);
    p.post_a(1, WrOp::Write { remote_addr, rkey }, vec![s]);
    p.post_a(2, write_op(&p, 0), vec![s]);
    p.post_recv_b(5, 4096, 100);
    let wcs = p.run_for_completions(2, SEC);
    assert_eq!(
        statuses(&wcs),
        vec![(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(read_mem(&mut p, false, 0, 256), before, "memory untouched");
    let qb = p.qb;
    assert_eq!(p.b().query_qp(qb).unwrap().0.qp_state, QpState::Err);
    // B's posted receive was flushed.
    let cq_b = p.cq_b;
    let recv = drain(p.b(), cq_b);
    assert_eq!(statuses(&recv), vec![(5, WcStatus::WrFlushErr)]);
}

#[test]
fn out_of_bounds_and_access_flags_are_remote_access_errors() {
    // Beyond the MR's end.
    let mut p = Pair::new(PairOptions::default());
    let s = p.sge_a(0, 64);
    let op = write_op(&p, (1 << 20) - 32);
    p.post_a(1, op, vec![s]);
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::RemAccessErr)]);
    // An MR without REMOTE_READ.
    let mut p = Pair::new(PairOptions::default());
    let pd = p.mr_b.pd;
    let ro = p.b().reg_mr(pd, 4096, Access::LOCAL_WRITE).unwrap();
    let s = p.sge_a(0, 64);
    p.post_a(
        1,
        WrOp::Read {
            remote_addr: ro.addr,
            rkey: ro.rkey,
        },
        vec![s],
    );
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::RemAccessErr)]);
    // A misaligned atomic is an invalid request, not an access error:
    // engine_peer_values::misaligned_atomic_is_an_invalid_request.
}

#[test]
fn send_larger_than_receive_buffer() {
    let mut p = Pair::new(PairOptions::default());
    p.post_recv_b(3, 0, 100);
    let s = p.sge_a(0, 200);
    p.post_a(1, WrOp::Send, vec![s]);
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::RemInvReqErr)]);
    let cq_b = p.cq_b;
    let recv = drain(p.b(), cq_b);
    assert_eq!(statuses(&recv), vec![(3, WcStatus::LocLenErr)]);
}

#[test]
fn duplicate_read_is_replayed() {
    let mut p = Pair::new(PairOptions::default());
    let rdata = fill(&mut p, false, 0, 800, 11);
    let op = read_op(&p, 0);
    let s = p.sge_a(0, 800);
    p.post_a(1, op, vec![s]);
    // The only response is lost: the timer resends the READ, B replays it from its saved
    // resource without executing anything new.
    p.net.set_filter(drop_nth(1, |f| f.from == 1));
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::Success)]);
    assert_eq!(read_mem(&mut p, true, 0, 800), rdata);
    assert_eq!(p.a().counters().local_ack_timeout_err, 1);
    assert_eq!(p.b().counters().duplicate_request, 1);
}

#[test]
fn read_partially_lost_restarts_at_missing_packet() {
    let mut p = Pair::new(PairOptions::default());
    let rdata = fill(&mut p, false, 0, 5000, 13);
    let op = read_op(&p, 0);
    let s = p.sge_a(0, 5000);
    p.post_a(1, op, vec![s]);
    let requests = Rc::new(RefCell::new(Vec::new()));
    let r = requests.clone();
    let mut responses = 0;
    p.net.set_filter(move |f| {
        let Some(pk) = f.packet() else {
            return Verdict::Pass;
        };
        if pk.bth.opcode == Opcode::RC_RDMA_READ_REQUEST {
            let reth = pk.reth.unwrap();
            r.borrow_mut()
                .push((pk.bth.psn.value(), reth.va, reth.dma_len));
        }
        if f.from == 1 {
            responses += 1;
            if responses == 3 {
                return Verdict::Drop; // the 3rd of 5 response packets
            }
        }
        Verdict::Pass
    });
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::Success)]);
    assert_eq!(read_mem(&mut p, true, 0, 5000), rdata);
    let reqs = requests.borrow().clone();
    let base = p.mr_b.addr;
    assert_eq!(reqs[0], (100, base, 5000));
    // The retry asks for the rest only, from the missing packet's PSN and offset.
    assert_eq!(reqs[1], (102, base + 2048, 5000 - 2048));
    assert_eq!(reqs.len(), 2);
}

#[test]
fn duplicate_atomic_returns_saved_result() {
    let mut p = Pair::new(PairOptions::default());
    let (va, rkey) = (p.mr_b.addr + 64, p.mr_b.rkey);
    let lkey = p.mr_b.lkey;
    p.b().mr_write(lkey, va, &40u64.to_ne_bytes()).unwrap();
    let s = p.sge_a(0, 8);
    p.post_a(
        1,
        WrOp::FetchAdd {
            remote_addr: va,
            rkey,
            add: 2,
        },
        vec![s],
    );
    // Lose the atomic ACK: the retried FETCH_ADD must not add twice.
    p.net.set_filter(drop_nth(1, |f| {
        opcode_of(f) == Some(Opcode::RC_ATOMIC_ACKNOWLEDGE)
    }));
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::Success)]);
    assert_eq!(read_mem(&mut p, true, 0, 8), 40u64.to_ne_bytes());
    assert_eq!(
        read_mem(&mut p, false, 64, 8),
        42u64.to_ne_bytes(),
        "executed once"
    );
    assert_eq!(p.b().counters().duplicate_request, 1);
}

#[test]
fn psn_wrap_past_2_pow_24() {
    let mut p = Pair::new(PairOptions {
        psn_a: (1 << 24) - 3,
        psn_b: (1 << 24) - 1,
        mtu: Mtu::Mtu256,
        ..PairOptions::default()
    });
    let data = fill(&mut p, true, 0, 2000, 17);
    let op = write_op(&p, 0);
    let s = p.sge_a(0, 2000);
    p.post_a(1, op, vec![s]); // 8 packets across the wrap
    let rdata = fill(&mut p, false, 10000, 1500, 19);
    let op = read_op(&p, 10000);
    let s = p.sge_a(10000, 1500);
    p.post_a(2, op, vec![s]);
    // Lose a packet right after the wrap, too.
    p.net.set_filter(drop_nth(4, |f| f.from == 0));
    let wcs = p.run_for_completions(2, SEC);
    assert_eq!(
        statuses(&wcs),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(read_mem(&mut p, false, 0, 2000), data);
    assert_eq!(read_mem(&mut p, true, 10000, 1500), rdata);
    let qa = p.qa;
    // 8 WRITE packets + 6 READ PSNs from 2^24-3 wrap to 11.
    assert_eq!(p.a().query_qp(qa).unwrap().0.sq_psn, 11);
    assert_eq!(p.a().counters().rcvd_seq_err, 1);
}

/// From now on, the positions (counted from 0) of A's packets that ask for an ACK.
fn record_ackreqs(p: &mut Pair) -> Rc<RefCell<Vec<usize>>> {
    let ackreqs = Rc::new(RefCell::new(Vec::new()));
    let a = ackreqs.clone();
    let mut k = 0;
    p.net.set_filter(move |f| {
        if f.from == 0 {
            if let Some(pk) = f.packet() {
                if pk.bth.ack_req {
                    a.borrow_mut().push(k);
                }
                k += 1;
            }
        }
        Verdict::Pass
    });
    ackreqs
}

#[test]
fn one_ack_completes_many() {
    let mut p = Pair::new(PairOptions::default());
    let s = p.sge_a(0, 64);
    for i in 0..10 {
        let op = write_op(&p, i * 64);
        p.post_a(i, op, vec![s]);
    }
    // Ten WRITEs queued at once: each is followed by the next, so only the last asks for
    // an ACK, and B's one ACK completes all ten.
    let (ackreqs, acks) = (Rc::new(RefCell::new(Vec::new())), Rc::new(RefCell::new(0)));
    let (a, n) = (ackreqs.clone(), acks.clone());
    p.net.set_filter(move |f| {
        if let Some(pk) = f.packet() {
            if f.from == 0 {
                a.borrow_mut().push(pk.bth.ack_req);
            } else {
                *n.borrow_mut() += 1;
            }
        }
        Verdict::Pass
    });
    let wcs = p.run_for_completions(10, SEC);
    assert_eq!(
        statuses(&wcs),
        (0..10).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    let mut expected = vec![false; 10];
    expected[9] = true;
    assert_eq!(*ackreqs.borrow(), expected);
    assert_eq!(*acks.borrow(), 1);
    assert_eq!(p.a().counters().retransmitted_packets, 0);
    assert_eq!(p.a().counters().local_ack_timeout_err, 0);
}

#[test]
fn followed_messages_still_ask_every_16_packets() {
    let mut p = Pair::new(PairOptions {
        depth: 64,
        ..PairOptions::default()
    });
    let s = p.sge_a(0, 64);
    for i in 0..40 {
        let op = write_op(&p, i * 64);
        p.post_a(i, op, vec![s]);
    }
    let ackreqs = record_ackreqs(&mut p);
    let wcs = p.run_for_completions(40, SEC);
    assert_eq!(wcs.len(), 40);
    // The 16th and 32nd packets ask although another message follows; the 40th is last.
    assert_eq!(*ackreqs.borrow(), vec![15, 31, 39]);
}

#[test]
fn ack_req_every_64_packets_and_on_last() {
    let mut p = Pair::new(PairOptions {
        mtu: Mtu::Mtu256,
        ..PairOptions::default()
    });
    let ackreqs = record_ackreqs(&mut p);
    let op = write_op(&p, 0);
    let s = p.sge_a(0, 100 * 256);
    p.post_a(1, op, vec![s]);
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::Success)]);
    assert_eq!(*ackreqs.borrow(), vec![63, 99]);
}

#[test]
fn window_of_128_unacked_psns() {
    let mut p = Pair::new(PairOptions {
        mtu: Mtu::Mtu256,
        ..PairOptions::default()
    });
    let op = write_op(&p, 0);
    let s = p.sge_a(0, 300 * 256);
    p.post_a(1, op, vec![s]);
    // Without any ACK, A may send 128 packets and no more.
    let mut buf = vec![0; MAX_FRAME_LEN];
    let mut sent = 0;
    while p.a().poll_transmit(Instant::ZERO, &mut buf).is_some() {
        sent += 1;
    }
    assert_eq!(sent, 128);
}

#[test]
fn max_rd_atomic_limits_outstanding_reads() {
    let mut p = Pair::new(PairOptions {
        max_rd_atomic: 2,
        ..PairOptions::default()
    });
    for i in 0..5 {
        let op = read_op(&p, i * 100);
        let s = p.sge_a(i * 100, 100);
        p.post_a(i, op, vec![s]);
    }
    let mut buf = vec![0; MAX_FRAME_LEN];
    let mut sent = 0;
    while p.a().poll_transmit(Instant::ZERO, &mut buf).is_some() {
        sent += 1;
    }
    assert_eq!(sent, 2, "max_rd_atomic 2");
    let wcs = p.run_for_completions(5, SEC);
    assert_eq!(wcs.len(), 5);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
}

#[test]
fn fence_waits_for_earlier_reads() {
    let mut p = Pair::new(PairOptions::default());
    let op = read_op(&p, 0);
    let s = p.sge_a(0, 100);
    p.post_a(1, op, vec![s]);
    let qa = p.qa;
    let wop = write_op(&p, 4096);
    p.a()
        .post_send(
            qa,
            &SendWr {
                wr_id: 2,
                op: wop,
                sg_list: vec![s],
                flags: SendFlags::SIGNALED | SendFlags::FENCE,
                ud: None,
            },
        )
        .unwrap();
    let mut buf = vec![0; MAX_FRAME_LEN];
    let mut sent = 0;
    while p.a().poll_transmit(Instant::ZERO, &mut buf).is_some() {
        sent += 1;
    }
    assert_eq!(sent, 1, "the fenced WRITE waits for the READ");
    let wcs = p.run_for_completions(2, SEC);
    assert_eq!(
        statuses(&wcs),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
}

#[test]
fn flush_on_error() {
    let mut p = Pair::new(PairOptions::default());
    // Hold every frame so nothing completes, then force the QP to ERR.
    p.net.set_filter(|_| Verdict::Drop);
    let s = p.sge_a(0, 64);
    for i in 0..4 {
        let op = write_op(&p, 0);
        p.post_a(i, op, vec![s]);
    }
    p.run_idle(Duration::from_micros(100));
    let qa = p.qa;
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    p.a().modify_qp(qa, &attr, QpAttrMask::STATE).unwrap();
    let cq = p.cq_a;
    let wcs = drain(p.a(), cq);
    assert_eq!(
        statuses(&wcs),
        (0..4)
            .map(|i| (i, WcStatus::WrFlushErr))
            .collect::<Vec<_>>()
    );
    // Posting in ERR completes at once with a flush error.
    let op = write_op(&p, 0);
    p.post_a(9, op, vec![s]);
    let wcs = drain(p.a(), cq);
    assert_eq!(statuses(&wcs), vec![(9, WcStatus::WrFlushErr)]);
    // And nothing is sent any more.
    let mut buf = vec![0; MAX_FRAME_LEN];
    assert!(p
        .a()
        .poll_transmit(Instant::ZERO + Duration::from_secs(1), &mut buf)
        .is_none());
}

#[test]
fn unsignaled_wrs_complete_silently_in_order() {
    let mut p = Pair::new(PairOptions::default());
    let qa = p.qa;
    let s = p.sge_a(0, 64);
    for i in 0..3 {
        let op = write_op(&p, 0);
        p.a()
            .post_send(
                qa,
                &SendWr {
                    wr_id: i,
                    op,
                    sg_list: vec![s],
                    flags: SendFlags::default(),
                    ud: None,
                },
            )
            .unwrap();
    }
    let op = write_op(&p, 0);
    p.post_a(3, op, vec![s]);
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(statuses(&wcs), vec![(3, WcStatus::Success)]);
    assert_eq!(p.a().send_queue_len(qa).unwrap(), 0);
}

#[test]
fn send_with_invalidate_revokes_the_rkey() {
    let mut p = Pair::new(PairOptions::default());
    let pd = p.mr_b.pd;
    let target = p.b().reg_mr(pd, 4096, Access::ALL).unwrap();
    p.post_recv_b(1, 0, 100);
    let s = p.sge_a(0, 10);
    p.post_a(1, WrOp::SendWithInv { rkey: target.rkey }, vec![s]);
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::Success)]);
    let cq_b = p.cq_b;
    let recv = drain(p.b(), cq_b);
    assert_eq!(recv[0].invalidated_rkey, Some(target.rkey));
    p.post_a(
        2,
        WrOp::Write {
            remote_addr: target.addr,
            rkey: target.rkey,
        },
        vec![s],
    );
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(statuses(&wcs), vec![(2, WcStatus::RemAccessErr)]);
}

#[test]
fn write_with_imm_consumes_a_receive() {
    let mut p = Pair::new(PairOptions::default());
    let data = fill(&mut p, true, 0, 2500, 23);
    p.post_recv_b(4, 0, 0);
    let (remote_addr, rkey) = (p.mr_b.addr + 8192, p.mr_b.rkey);
    let s = p.sge_a(0, 2500);
    p.post_a(
        1,
        WrOp::WriteWithImm {
            remote_addr,
            rkey,
            imm: 0x1234,
        },
        vec![s],
    );
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::Success)]);
    let cq_b = p.cq_b;
    let recv = drain(p.b(), cq_b);
    assert_eq!(recv.len(), 1);
    assert_eq!(recv[0].opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(recv[0].imm_data, Some(0x1234));
    assert_eq!(recv[0].byte_len, 2500);
    assert_eq!(read_mem(&mut p, false, 8192, 2500), data);
}

#[test]
fn udp_source_port_follows_rxe_rule() {
    let mut p = Pair::new(PairOptions::default());
    let op = write_op(&p, 0);
    let s = p.sge_a(0, 8);
    p.post_a(1, op, vec![s]);
    let mut buf = vec![0; MAX_FRAME_LEN];
    let n = p.a().poll_transmit(Instant::ZERO, &mut buf).unwrap();
    let f = wire::parse_frame_verified(&buf[..n]).unwrap();
    assert_eq!(f.udp_src_port, wire::rxe_udp_source_port(p.qa, p.qb));
    assert!(f.udp_src_port >= 0xC000);
    // fold20(0x11 * 0x11) = 0x121 -> 0xC121.
    assert_eq!(wire::rxe_udp_source_port(0x11, 0x11), 0xC121);
}

#[test]
fn ud_send_with_grh_and_qkey_checks() {
    use xroce::sim::workload::{IP_A, IP_B, MAC_A, MAC_B};
    let mut a = Engine::new(EngineConfig::new(MAC_A, IpAddr::V4(IP_A)));
    let mut b = Engine::new(EngineConfig::new(MAC_B, IpAddr::V4(IP_B)));
    let mk = |e: &mut Engine, qkey: u32| {
        let pd = e.alloc_pd();
        let cq = e.create_cq(64).unwrap();
        let qp = e
            .create_qp(QpInit {
                qp_type: QpType::Ud,
                pd,
                send_cq: cq,
                recv_cq: cq,
                caps: QpCaps::default(),
                sq_sig_all: true,
                srq: None,
            })
            .unwrap();
        let mut attr = QpAttr {
            qp_state: QpState::Init,
            qkey,
            ..QpAttr::default()
        };
        use QpAttrMask as M;
        e.modify_qp(qp, &attr, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)
            .unwrap();
        attr.qp_state = QpState::Rtr;
        e.modify_qp(qp, &attr, M::STATE).unwrap();
        attr.qp_state = QpState::Rts;
        attr.sq_psn = 7;
        e.modify_qp(qp, &attr, M::STATE | M::SQ_PSN).unwrap();
        let mr = e.reg_mr(pd, 8192, Access::LOCAL_WRITE).unwrap();
        (cq, qp, mr)
    };
    let (cq_a, qa, mr_a) = mk(&mut a, 0x1111_1111);
    let (cq_b, qb, mr_b) = mk(&mut b, 0x2222_2222);
    a.mr_write(mr_a.lkey, mr_a.addr, b"hello, datagram")
        .unwrap();
    b.post_recv(
        qb,
        &RecvWr {
            wr_id: 1,
            sg_list: vec![Sge {
                addr: mr_b.addr,
                length: 4096,
                lkey: mr_b.lkey,
            }],
        },
    )
    .unwrap();
    let dest = |qkey| UdDest {
        av: AddressVector::new(MAC_B, IpAddr::V4(IP_B)),
        remote_qpn: qb,
        remote_qkey: qkey,
    };
    let send = |a: &mut Engine, id, qkey| {
        a.post_send(
            qa,
            &SendWr {
                wr_id: id,
                op: WrOp::Send,
                sg_list: vec![Sge {
                    addr: mr_a.addr,
                    length: 15,
                    lkey: mr_a.lkey,
                }],
                flags: SendFlags::SIGNALED,
                ud: Some(dest(qkey)),
            },
        )
        .unwrap();
    };
    let mut buf = vec![0; MAX_FRAME_LEN];
    // Wrong Q_Key: dropped and counted.
    send(&mut a, 1, 0x3333_3333);
    let n = a.poll_transmit(Instant::ZERO, &mut buf).unwrap();
    b.handle_frame(Instant::ZERO, &buf[..n]);
    assert_eq!(b.counters().drops.bad_qkey, 1);
    // Right Q_Key.
    send(&mut a, 2, 0x2222_2222);
    let n = a.poll_transmit(Instant::ZERO, &mut buf).unwrap();
    b.handle_frame(Instant::ZERO, &buf[..n]);
    let wcs = drain(&mut b, cq_b);
    assert_eq!(wcs.len(), 1);
    let wc = wcs[0];
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(wc.byte_len, 40 + 15, "GRH space + payload");
    assert!(wc.grh_present);
    assert_eq!(wc.src_qp, qa);
    assert_eq!(wc.sender_ip, Some(IpAddr::V4(IP_A)));
    assert_eq!(wc.sender_mac, Some(MAC_A));
    assert_eq!(
        b.mr_to_vec(mr_b.lkey, mr_b.addr + 40, 15).unwrap(),
        b"hello, datagram"
    );
    // The IPv4 header sits in the last 20 bytes of the GRH: version/IHL byte 0x45.
    assert_eq!(b.mr_to_vec(mr_b.lkey, mr_b.addr + 20, 1).unwrap(), [0x45]);
    // Sender completions: both sends completed when sent.
    assert_eq!(drain(&mut a, cq_a).len(), 2);
    // No receive WQE left: the next datagram is dropped and counted.
    send(&mut a, 3, 0x2222_2222);
    let n = a.poll_transmit(Instant::ZERO, &mut buf).unwrap();
    b.handle_frame(Instant::ZERO, &buf[..n]);
    assert_eq!(b.counters().drops.ud_no_recv_wqe, 1);
}

#[test]
fn misaddressed_and_corrupted_frames_are_counted_drops() {
    let mut p = Pair::new(PairOptions::default());
    let op = write_op(&p, 0);
    let s = p.sge_a(0, 64);
    p.post_a(1, op, vec![s]);
    let mut buf = vec![0; MAX_FRAME_LEN];
    let n = p.a().poll_transmit(Instant::ZERO, &mut buf).unwrap();
    let frame = buf[..n].to_vec();
    // Corrupt one payload byte: ICRC.
    let mut bad = frame.clone();
    bad[n - 10] ^= 0x40;
    p.b().handle_frame(Instant::ZERO, &bad);
    assert_eq!(p.b().counters().drops.bad_icrc, 1);
    // Truncated.
    p.b().handle_frame(Instant::ZERO, &frame[..30]);
    assert_eq!(p.b().counters().drops.malformed, 1);
    // Delivered to A itself: A's address is not the destination.
    p.a().handle_frame(Instant::ZERO, &frame);
    assert_eq!(p.a().counters().drops.bad_dest_addr, 1);
    // Nothing was executed at B; the real frame still works.
    p.b().handle_frame(Instant::ZERO, &frame);
    assert_eq!(p.b().counters().rcvd_pkts, 1);
}

/// Moves A's QP to SQD, asking for the SQ Drained event.
fn drain_sq_of_a(p: &mut Pair) {
    let qa = p.qa;
    let attr = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..QpAttr::default()
    };
    p.a()
        .modify_qp(
            qa,
            &attr,
            QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY,
        )
        .unwrap();
}

#[test]
fn sq_drain_raises_an_event_once_outstanding_wrs_complete() {
    let mut p = Pair::new(PairOptions::default());
    let s = p.sge_a(0, 3000);
    let op = write_op(&p, 0);
    p.post_a(1, op, vec![s]);
    let mut buf = vec![0; MAX_FRAME_LEN];
    let mut frames = Vec::new();
    while let Some(n) = p.a().poll_transmit(Instant::ZERO, &mut buf) {
        frames.push(buf[..n].to_vec());
    }
    // Post another WR, then drain: it must not start.
    let op = write_op(&p, 8192);
    p.post_a(2, op, vec![s]);
    let qa = p.qa;
    drain_sq_of_a(&mut p);
    assert_eq!(p.a().poll_event(), None, "WR 1 is still in flight");
    for f in &frames {
        p.b().handle_frame(Instant::ZERO, f);
    }
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::Success)]);
    assert_eq!(p.a().poll_event(), Some(Event::SqDrained(qa)));
    assert_eq!(p.a().send_queue_len(qa).unwrap(), 1, "WR 2 waits in SQD");
    // Back to RTS: WR 2 goes.
    let attr = QpAttr {
        qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    p.a().modify_qp(qa, &attr, QpAttrMask::STATE).unwrap();
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(statuses(&wcs), vec![(2, WcStatus::Success)]);
}

#[test]
fn a_drain_sends_again_asking_for_the_ack_a_followed_message_skipped() {
    let mut p = Pair::new(PairOptions::default());
    let s = p.sge_a(0, 64);
    for i in 1..=2 {
        let op = write_op(&p, i * 64);
        p.post_a(i, op, vec![s]);
    }
    // WRITE 1 leaves without AckReq: WRITE 2 is right behind it.
    let mut buf = vec![0; MAX_FRAME_LEN];
    let n = p.a().poll_transmit(Instant::ZERO, &mut buf).unwrap();
    let first = buf[..n].to_vec();
    let bth = |f: &[u8]| wire::parse_frame(f).unwrap().repr.roce.bth;
    assert!(!bth(&first).ack_req);
    // Then the drain: WRITE 2 will not start, so WRITE 1 goes again, asking.
    let qa = p.qa;
    drain_sq_of_a(&mut p);
    let n = p.a().poll_transmit(Instant::ZERO, &mut buf).unwrap();
    assert!(bth(&buf[..n]).ack_req);
    assert_eq!(bth(&buf[..n]).psn, bth(&first).psn);
    assert_eq!(p.a().poll_transmit(Instant::ZERO, &mut buf), None);
    // B executes the first copy and acknowledges the second (a duplicate): WRITE 1
    // completes and the drain ends long before any retransmission timer.
    p.b().handle_frame(Instant::ZERO, &first);
    p.b().handle_frame(Instant::ZERO, &buf[..n]);
    let start = p.net.now();
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::Success)]);
    assert!(p.net.now() - start < Duration::from_millis(1));
    assert_eq!(p.a().poll_event(), Some(Event::SqDrained(qa)));
    assert_eq!(p.a().counters().local_ack_timeout_err, 0);
}

#[test]
fn a_long_read_stream_after_a_gap_does_not_trigger_more_retries() {
    // 3000 response packets; the 10th is lost. The responder keeps streaming the rest before
    // it serves the retry (as rxe does); the requester must not time out meanwhile.
    let mut p = Pair::new(PairOptions {
        mtu: Mtu::Mtu256,
        timeout: 4, // 65 us: far shorter than the stream
        mr_len: 1 << 20,
        ..PairOptions::default()
    });
    let rdata = fill(&mut p, false, 0, 3000 * 256, 29);
    let op = read_op(&p, 0);
    let s = p.sge_a(0, 3000 * 256);
    p.post_a(1, op, vec![s]);
    p.net.set_filter(drop_nth(10, |f| f.from == 1));
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::Success)]);
    assert_eq!(read_mem(&mut p, true, 0, 3000 * 256), rdata);
    let c = p.a().counters().clone();
    assert_eq!(c.local_ack_timeout_err, 0, "{c:?}");
    assert_eq!(c.completer_retry_err, 1);
}

#[test]
fn ipv4_options_are_received_and_unsupported_headers_are_counted_apart() {
    let mut p = Pair::new(PairOptions::default());
    let op = write_op(&p, 0);
    let s = p.sge_a(0, 64);
    p.post_a(1, op, vec![s]);
    let mut buf = vec![0; MAX_FRAME_LEN];
    let n = p.a().poll_transmit(Instant::ZERO, &mut buf).unwrap();
    let frame = buf[..n].to_vec();
    assert_eq!(frame[14], 0x45, "untagged IPv4 without options");
    // QinQ copy: the parser refuses it by name, the engine counts it apart from malformed.
    let mut qinq = frame[..12].to_vec();
    qinq.extend_from_slice(&[0x88, 0xa8, 0x00, 0x64, 0x81, 0x00, 0x00, 0xc8]);
    qinq.extend_from_slice(&frame[12..]);
    p.b().handle_frame(Instant::ZERO, &qinq);
    assert_eq!(p.b().counters().drops.unsupported_headers, 1);
    assert_eq!(p.b().counters().drops.malformed, 0);
    // The same request with 4 bytes of IPv4 options (IHL 6), ICRC over the longer header.
    let mut opt = frame[..34].to_vec();
    opt.extend_from_slice(&[0x94, 0x04, 0x00, 0x00]); // Router Alert (RFC 2113)
    opt.extend_from_slice(&frame[34..]);
    opt[14] = 0x46;
    let total = u16::from_be_bytes([opt[16], opt[17]]) + 4;
    opt[16..18].copy_from_slice(&total.to_be_bytes());
    let icrc_at = opt.len() - 4;
    let crc = xroce::wire::icrc_ipv4(&opt[14..38], &opt[38..icrc_at]);
    opt[icrc_at..].copy_from_slice(&crc.to_le_bytes());
    p.b().handle_frame(Instant::ZERO, &opt);
    let c = p.b().counters();
    assert_eq!(
        (c.rcvd_pkts, c.drops.bad_icrc, c.drops.malformed),
        (1, 0, 0)
    );
}
