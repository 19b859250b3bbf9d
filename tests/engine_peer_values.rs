//! A peer's absurd values at the engine: zero-length READs with any VA and their duplicates,
//! lengths beyond 2^31, VAs near u64::MAX in retries, memory that goes away under a
//! streaming READ, misaligned atomics, and completion queues that overflow. Run with overflow
//! checks (the dev profile): an arithmetic overflow on a peer's value is a panic here.
#[path = "common/hostile.rs"]
mod hostile;
#[path = "common/pair.rs"]
mod pair;

use std::time::Duration;

use hostile::Forged;
use pair::{drain, Pair, PairOptions};
use xroce::engine::*;
use xroce::sim::workload::{connect, WorkloadConfig, IP_A, IP_B, MAC_A, MAC_B};
use xroce::wire::{self, NakCode, Opcode, Syndrome};

const SEC: Duration = Duration::from_secs(1);
const T0: Instant = Instant::ZERO;

/// Everything `e` wants to send now, parsed as (opcode, PSN, syndrome, payload length, VA,
/// DMA length).
fn transmitted(e: &mut Engine) -> Vec<Out> {
    let mut buf = vec![0; MAX_FRAME_LEN];
    let mut out = Vec::new();
    while let Some(n) = e.poll_transmit(T0, &mut buf) {
        out.push(Out::parse(&buf[..n]));
    }
    out
}

#[derive(Clone, Debug, PartialEq)]
struct Out {
    opcode: Opcode,
    psn: u32,
    syndrome: Option<Syndrome>,
    payload: Vec<u8>,
    reth: Option<(u64, u32)>,
    frame: Vec<u8>,
}

impl Out {
    fn parse(frame: &[u8]) -> Out {
        let p = wire::parse_frame(frame)
            .expect("engine output parses")
            .repr
            .roce;
        Out {
            opcode: p.bth.opcode,
            psn: p.bth.psn.value(),
            syndrome: p.aeth.map(|a| a.syndrome),
            payload: p.payload.to_vec(),
            reth: p.reth.map(|r| (r.va, r.dma_len)),
            frame: frame.to_vec(),
        }
    }
}

fn read_request(p: &Pair, psn: u32, va: u64, rkey: u32, len: u32) -> Vec<u8> {
    let mut f = Forged::new(true, p.qb, Opcode::RC_RDMA_READ_REQUEST, psn);
    f.va = va;
    f.rkey = rkey;
    f.dma_len = len;
    f.frame().expect("frame")
}

fn ack() -> Option<Syndrome> {
    Some(Syndrome::Ack { credit: 0x1F })
}

fn state(e: &Engine, qpn: u32) -> QpState {
    e.query_qp(qpn).unwrap().0.qp_state
}

/// Issue 10 item 5, the exact scenario: a zero-length READ with a VA near u64::MAX (and a
/// wrong R_Key: with length 0 neither is checked, IBTA 9.4) is answered with one empty
/// READ RESPONSE ONLY. A duplicate with the same PSN and a non-zero length is not a replay of
/// what was accepted: it is dropped and counted (never a panic, never an access), while an
/// exact duplicate is replayed, and the QP goes on serving.
#[test]
fn zero_length_read_near_u64_max_then_a_longer_duplicate() {
    for va in [u64::MAX, u64::MAX - 3, u64::MAX - 4095] {
        let mut p = Pair::new(PairOptions::default());
        let psn = 100; // B's expected PSN
        let f = read_request(&p, psn, va, 0xDEAD_BEEF, 0);
        p.b().handle_frame(T0, &f);
        let out = transmitted(p.b());
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].opcode, Opcode::RC_RDMA_READ_RESPONSE_ONLY);
        assert_eq!((out[0].psn, out[0].syndrome), (psn, ack()));
        assert!(out[0].payload.is_empty());

        let rkey = p.mr_b.rkey;
        for (key, len) in [
            (0xDEAD_BEEF, 1),
            (0xDEAD_BEEF, 4096),
            (rkey, 8),
            (rkey, u32::MAX),
        ] {
            let dup = read_request(&p, psn, va, key, len);
            p.b().handle_frame(T0, &dup);
            assert_eq!(
                transmitted(p.b()),
                vec![],
                "VA {va:#x} len {len}: not replayed"
            );
        }
        assert_eq!(p.b().counters().drops.bad_duplicate, 4);
        assert_eq!(p.b().counters().duplicate_request, 4);

        // The exact duplicate is answered again, the same way.
        p.b().handle_frame(T0, &f);
        let again = transmitted(p.b());
        assert_eq!(again.len(), 1);
        assert_eq!(
            (again[0].opcode, again[0].psn),
            (Opcode::RC_RDMA_READ_RESPONSE_ONLY, psn)
        );

        // B still serves the next request.
        let qb = p.qb;
        assert_eq!(state(p.b(), qb), QpState::Rts);
        let (lkey, addr) = (p.mr_b.lkey, p.mr_b.addr);
        p.b().mr_write(lkey, addr, b"still here").unwrap();
        let next = read_request(&p, psn + 1, addr, rkey, 10);
        p.b().handle_frame(T0, &next);
        let out = transmitted(p.b());
        assert_eq!(out.len(), 1);
        assert_eq!(
            (out[0].psn, out[0].payload.as_slice()),
            (psn + 1, &b"still here"[..])
        );
    }
}

/// A duplicate READ asking for more than the original, or starting elsewhere, is dropped;
/// the tail a retry asks for (from the PSN it resumes at) is replayed.
#[test]
fn duplicate_read_ranges_are_checked_without_overflow() {
    let mut p = Pair::new(PairOptions::default());
    let (addr, rkey) = (p.mr_b.addr, p.mr_b.rkey);
    let f = read_request(&p, 100, addr, rkey, 3000);
    p.b().handle_frame(T0, &f);
    assert_eq!(transmitted(p.b()).len(), 3);
    for (psn, va, len) in [
        (100, addr, 3001),
        (101, addr, 100),
        (101, addr + 1024, 1977),
        (102, u64::MAX, 1),
        (102, addr + 2048, u32::MAX),
    ] {
        let f = read_request(&p, psn, va, rkey, len);
        p.b().handle_frame(T0, &f);
        assert_eq!(transmitted(p.b()), vec![], "PSN {psn} VA {va:#x} len {len}");
    }
    assert_eq!(p.b().counters().drops.bad_duplicate, 5);
    // The retry of the last two packets.
    let f = read_request(&p, 101, addr + 1024, rkey, 1976);
    p.b().handle_frame(T0, &f);
    let out = transmitted(p.b());
    let psns: Vec<u32> = out.iter().map(|o| o.psn).collect();
    assert_eq!(psns, vec![101, 102]);
    assert_eq!(out[0].opcode, Opcode::RC_RDMA_READ_RESPONSE_FIRST);
}

/// A READ or WRITE longer than 2^31 bytes is an invalid request (NAK Invalid Request), not
/// an access error; u32::MAX at MTU 256 would otherwise be 2^24 response packets, the whole
/// PSN space.
#[test]
fn dma_length_beyond_2_pow_31_is_an_invalid_request() {
    for (opcode, len) in [
        (Opcode::RC_RDMA_READ_REQUEST, (1u32 << 31) + 1),
        (Opcode::RC_RDMA_READ_REQUEST, u32::MAX),
        (Opcode::RC_RDMA_WRITE_FIRST, u32::MAX),
    ] {
        let mut p = Pair::new(PairOptions {
            mtu: Mtu::Mtu256,
            ..PairOptions::default()
        });
        let mut f = Forged::new(true, p.qb, opcode, 100);
        f.va = p.mr_b.addr;
        f.rkey = p.mr_b.rkey;
        f.dma_len = len;
        f.payload_len = if opcode == Opcode::RC_RDMA_WRITE_FIRST {
            256
        } else {
            0
        };
        p.b().handle_frame(T0, &f.frame().unwrap());
        let out = transmitted(p.b());
        assert_eq!(out.len(), 1, "{opcode:?} {len}");
        assert_eq!(
            out[0].syndrome,
            Some(Syndrome::Nak(NakCode::InvalidRequest))
        );
        let qb = p.qb;
        assert_eq!(state(p.b(), qb), QpState::Err);
    }
    // Locally, a WR longer than 2^31 bytes is refused at post time (9 SGEs of 256 MiB over
    // one region; zeroed memory is not touched, so this costs nothing).
    let mut p = Pair::new(PairOptions::default());
    let pd = p.mr_a.pd;
    let mr = p.a().reg_mr(pd, 256 << 20, Access::ALL).unwrap();
    let sge = Sge {
        addr: mr.addr,
        length: 256 << 20,
        lkey: mr.lkey,
    };
    let qa = p.qa;
    for (n, ok) in [(8, true), (9, false)] {
        let wr = SendWr {
            wr_id: n,
            op: WrOp::Write {
                remote_addr: p.mr_b.addr,
                rkey: p.mr_b.rkey,
            },
            sg_list: vec![sge; n as usize],
            flags: SendFlags::SIGNALED,
            ud: None,
        };
        match p.a().post_send(qa, &wr) {
            Ok(()) => assert!(ok, "{n} x 256 MiB accepted"),
            Err(e) => {
                assert!(!ok, "{n} x 256 MiB refused: {e}");
                assert_eq!(
                    e.to_string(),
                    "invalid work request: message of 2415919104 bytes exceeds the maximum \
                     message size of 2147483648 bytes (2 GiB)"
                );
            }
        }
    }
}

/// The requester's READ retry computes `remote_addr + offset`: with a remote address near
/// u64::MAX (opaque to the requester) that wraps instead of panicking, and the retry asks for
/// exactly the missing tail.
#[test]
fn read_retry_with_a_remote_address_near_u64_max() {
    let mut p = Pair::new(PairOptions::default());
    let remote_addr = u64::MAX - 100;
    let s = p.sge_a(0, 3000);
    p.post_a(
        1,
        WrOp::Read {
            remote_addr,
            rkey: 0x1234,
        },
        vec![s],
    );
    let req = transmitted(p.a());
    assert_eq!(req.len(), 1);
    assert_eq!(req[0].reth, Some((remote_addr, 3000)));
    // A forged responder answers the first packet and skips the second: A retries from 101.
    let qa = p.qa;
    let mut first = Forged::new(false, qa, Opcode::RC_RDMA_READ_RESPONSE_FIRST, 100);
    first.payload_len = 1024;
    let mut last = Forged::new(false, qa, Opcode::RC_RDMA_READ_RESPONSE_LAST, 102);
    last.payload_len = 952;
    p.a().handle_frame(T0, &first.frame().unwrap());
    p.a().handle_frame(T0, &last.frame().unwrap());
    let retry = transmitted(p.a());
    assert_eq!(retry.len(), 1, "{retry:?}");
    assert_eq!(retry[0].opcode, Opcode::RC_RDMA_READ_REQUEST);
    assert_eq!(retry[0].psn, 101);
    assert_eq!(retry[0].reth, Some((remote_addr.wrapping_add(1024), 1976)));
}

/// Issue 10 item 9: the MR behind a large READ is deregistered while the response streams.
/// The responder answers the next packet with NAK remote access error carrying that packet's
/// PSN, its QP enters ERR (nothing stays half-sent, nothing stalls), and the requester
/// completes the READ with REM_ACCESS_ERR at once, without retrying.
#[test]
fn mr_deregistered_while_a_read_response_streams() {
    let mut p = Pair::new(PairOptions::default());
    let pd = p.mr_b.pd;
    let src = p.b().reg_mr(pd, 64 * 1024, Access::ALL).unwrap();
    let s = p.sge_a(0, 64 * 1024);
    p.post_a(
        1,
        WrOp::Read {
            remote_addr: src.addr,
            rkey: src.rkey,
        },
        vec![s],
    );
    let req = transmitted(p.a());
    p.b().handle_frame(T0, &req[0].frame);
    // Three of 64 response packets go out, then the MR disappears.
    let mut buf = vec![0; MAX_FRAME_LEN];
    let mut sent = Vec::new();
    for _ in 0..3 {
        let n = p
            .b()
            .poll_transmit(T0, &mut buf)
            .expect("a response packet");
        sent.push(Out::parse(&buf[..n]));
    }
    p.b().dereg_mr(src.lkey).unwrap();
    let rest = transmitted(p.b());
    assert_eq!(rest.len(), 1, "one NAK, then nothing: {rest:?}");
    assert_eq!(rest[0].opcode, Opcode::RC_ACKNOWLEDGE);
    assert_eq!(rest[0].psn, 103, "the PSN of the response it replaces");
    assert_eq!(
        rest[0].syndrome,
        Some(Syndrome::Nak(NakCode::RemoteAccessError))
    );
    let qb = p.qb;
    assert_eq!(state(p.b(), qb), QpState::Err);
    assert_eq!(p.b().counters().read_response_faults, 1);
    assert_eq!(p.b().poll_event(), Some(Event::QpFatal(qb)));
    for o in sent.iter().chain(&rest) {
        p.a().handle_frame(T0, &o.frame);
    }
    let cq = p.cq_a;
    let wcs = drain(p.a(), cq);
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, vec![(1, WcStatus::RemAccessErr)]);
    assert_eq!(p.a().counters().completer_retry_err, 0, "no retry");
    let qa = p.qa;
    assert_eq!(state(p.a(), qa), QpState::Err);
}

/// The same over the simulated link, end to end: the stream stops with an error instead of
/// stalling until the requester's retries run out.
#[test]
fn mr_deregistered_mid_stream_over_the_link() {
    // A 1 Gb/s link whose transmit queue holds 20 us: B streams as the link drains.
    let mut p = Pair::new(PairOptions {
        link: xroce::sim::LinkConfig {
            rate_bps: Some(1_000_000_000),
            ..xroce::sim::LinkConfig::default()
        },
        ..PairOptions::default()
    });
    p.net.set_tx_queue_limit(Some(Duration::from_micros(20)));
    let pd = p.mr_b.pd;
    let src = p.b().reg_mr(pd, 512 * 1024, Access::ALL).unwrap();
    let s = p.sge_a(0, 512 * 1024);
    p.post_a(
        1,
        WrOp::Read {
            remote_addr: src.addr,
            rkey: src.rkey,
        },
        vec![s],
    );
    // Run until a few responses arrived at A, then deregister at B.
    let start = p.net.now();
    p.net
        .run_until(start + SEC, |net| net.engines[0].counters().rcvd_pkts >= 5);
    let received = p.a().counters().rcvd_pkts;
    assert!(
        received < 100,
        "{received} of 512 responses arrived before the deregistration"
    );
    p.b().dereg_mr(src.lkey).unwrap();
    let wcs = p.run_for_completions(1, SEC);
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, vec![(1, WcStatus::RemAccessErr)]);
    assert_eq!(p.a().counters().retry_exceeded_err, 0);
}

/// Issue 10 item 11: a misaligned atomic is NAKed Invalid Request (IBTA 9.4 with the
/// responder's class C errors; rxe does the same), so the requester sees REM_INV_REQ_ERR, and
/// memory is untouched.
#[test]
fn misaligned_atomic_is_an_invalid_request() {
    for op in ["fetch_add", "cmp_swap"] {
        let mut p = Pair::new(PairOptions::default());
        let (lkey, addr) = (p.mr_b.lkey, p.mr_b.addr);
        p.b().mr_write(lkey, addr, &[0x11; 16]).unwrap();
        let s = p.sge_a(0, 8);
        let (va, rkey) = (addr + 4, p.mr_b.rkey);
        let wr = match op {
            "fetch_add" => WrOp::FetchAdd {
                remote_addr: va,
                rkey,
                add: 1,
            },
            _ => WrOp::CompareSwap {
                remote_addr: va,
                rkey,
                compare: 0x1111_1111_1111_1111,
                swap: 0,
            },
        };
        p.post_a(1, wr, vec![s]);
        let req = transmitted(p.a());
        p.b().handle_frame(T0, &req[0].frame);
        let nak = transmitted(p.b());
        assert_eq!(nak.len(), 1);
        assert_eq!(
            nak[0].syndrome,
            Some(Syndrome::Nak(NakCode::InvalidRequest))
        );
        p.a().handle_frame(T0, &nak[0].frame);
        let cq = p.cq_a;
        let got: Vec<_> = drain(p.a(), cq)
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect();
        assert_eq!(got, vec![(1, WcStatus::RemInvReqErr)], "{op}");
        let mut mem = [0; 16];
        p.b().mr_read(lkey, addr, &mut mem).unwrap();
        assert_eq!(mem, [0x11; 16], "{op}: memory untouched");
    }
}

/// A QP pair on the engines of `p` whose CQs have the given depths (A's send CQ, B's
/// receive CQ).
fn small_cq_qps(p: &mut Pair, a_depth: u32, b_depth: u32) -> (u32, CqId, u32, CqId) {
    let side = |e: &mut Engine, pd: PdId, depth: u32| {
        let cq = e.create_cq(depth).unwrap();
        let qp = e
            .create_qp(QpInit {
                qp_type: QpType::Rc,
                pd,
                send_cq: cq,
                recv_cq: cq,
                caps: QpCaps::default(),
                sq_sig_all: false,
                srq: None,
            })
            .unwrap();
        (qp, cq)
    };
    let (pa, pb) = (p.mr_a.pd, p.mr_b.pd);
    let (qa, cqa) = side(p.a(), pa, a_depth);
    let (qb, cqb) = side(p.b(), pb, b_depth);
    let wc = WorkloadConfig {
        retry_cnt: 2,
        timeout: 8,
        ..WorkloadConfig::default()
    };
    connect(p.a(), qa, qb, MAC_B, IP_B, 7000, 9000, &wc).unwrap();
    connect(p.b(), qb, qa, MAC_A, IP_A, 9000, 7000, &wc).unwrap();
    (qa, cqa, qb, cqb)
}

fn events(e: &mut Engine) -> Vec<Event> {
    std::iter::from_fn(|| e.poll_event()).collect()
}

/// Issue 10 item 12, send side: the second signaled WRITE cannot be completed into a CQ of
/// depth 1. The CQ raises a CQ error event and takes nothing more, the QP enters ERR with a
/// QP fatal event (IBTA 10.10.2.3), and what the CQ already held can still be polled.
#[test]
fn send_cq_overflow_moves_the_qp_to_error() {
    let mut p = Pair::new(PairOptions::default());
    let (qa, cqa, _qb, _) = small_cq_qps(&mut p, 1, 64);
    let s = p.sge_a(0, 64);
    for id in 1..=3 {
        let wr = SendWr {
            wr_id: id,
            op: WrOp::Write {
                remote_addr: p.mr_b.addr,
                rkey: p.mr_b.rkey,
            },
            sg_list: vec![s],
            flags: SendFlags::SIGNALED,
            ud: None,
        };
        p.a().post_send(qa, &wr).unwrap();
        let limit = p.net.now() + Duration::from_millis(10);
        p.net.run_until(limit, |_| false);
    }
    assert_eq!(state(p.a(), qa), QpState::Err);
    let ev = events(p.a());
    assert!(ev.contains(&Event::CqError(cqa)), "{ev:?}");
    assert!(ev.contains(&Event::QpFatal(qa)), "{ev:?}");
    assert_eq!(
        ev.iter().filter(|e| matches!(e, Event::CqError(_))).count(),
        1,
        "one CQ error event: {ev:?}"
    );
    let wcs = drain(p.a(), cqa);
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, vec![(1, WcStatus::Success)], "only what fitted");
    // The CQ stays in error: nothing more is added to it, even with room again.
    let wr = SendWr {
        wr_id: 9,
        op: WrOp::Send,
        sg_list: vec![s],
        flags: SendFlags::SIGNALED,
        ud: None,
    };
    p.a().post_send(qa, &wr).unwrap();
    assert_eq!(p.a().cq_len(cqa).unwrap(), 0);
    // The device goes on: the pair's own QPs still work.
    let op = WrOp::Write {
        remote_addr: p.mr_b.addr,
        rkey: p.mr_b.rkey,
    };
    p.post_a(50, op, vec![s]);
    let wcs = p.run_for_completions(1, SEC);
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, vec![(50, WcStatus::Success)]);
}

/// Four receives of 256 bytes on B's `qb`, wr_ids 100..=103.
fn post_four_recvs(p: &mut Pair, qb: u32) {
    for id in 0..4u64 {
        let sge = p.sge_b(id * 256, 256);
        p.b()
            .post_recv(
                qb,
                &RecvWr {
                    wr_id: 100 + id,
                    sg_list: vec![sge],
                },
            )
            .unwrap();
    }
}

/// Receive side: the third SEND finds B's receive CQ (depth 2) full. B's QP enters ERR with
/// CQ error and QP fatal events and does not acknowledge the message whose completion was
/// lost (rxe: class G, RESPST_ERR_CQ_OVERFLOW): the sender's third SEND ends in
/// RETRY_EXC_ERR, never in a success for a message nobody can see. Posted together, the
/// first two asked for no ACK of their own (the third's would cover them), so they end in
/// the error too although B received them: a requester completes only what was
/// acknowledged. Posted one at a time, each is acknowledged and completes.
#[test]
fn recv_cq_overflow_moves_the_qp_to_error() {
    let mut p = Pair::new(PairOptions::default());
    let (qa, cqa, qb, cqb) = small_cq_qps(&mut p, 64, 2);
    post_four_recvs(&mut p, qb);
    let s = p.sge_a(0, 64);
    let send = |id| SendWr {
        wr_id: id,
        op: WrOp::Send,
        sg_list: vec![s],
        flags: SendFlags::SIGNALED,
        ud: None,
    };
    for id in 1..=2 {
        p.a().post_send(qa, &send(id)).unwrap();
        let limit = p.net.now() + SEC;
        p.net.run_until(limit, |net| {
            net.engines[0].cq_len(cqa).unwrap_or(0) >= id as usize
        });
    }
    p.a().post_send(qa, &send(3)).unwrap();
    let limit = p.net.now() + SEC;
    p.net
        .run_until(limit, |net| net.engines[0].cq_len(cqa).unwrap_or(0) >= 3);
    assert_eq!(state(p.b(), qb), QpState::Err);
    let ev = events(p.b());
    assert!(ev.contains(&Event::CqError(cqb)), "{ev:?}");
    assert!(ev.contains(&Event::QpFatal(qb)), "{ev:?}");
    let recv: Vec<_> = drain(p.b(), cqb)
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(
        recv,
        vec![(100, WcStatus::Success), (101, WcStatus::Success)]
    );
    let sent: Vec<_> = drain(p.a(), cqa)
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(sent[..2], [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert_eq!(sent[2], (3, WcStatus::RetryExcErr), "{sent:?}");
}

/// The same overflow with the three SENDs posted together: only the third asked for an ACK,
/// and B, in ERR, sends none, so all three end in errors although B received the first two
/// (IBTA 9.7.5.1.2: an ACK acknowledges every request before it; one never sent
/// acknowledges nothing).
#[test]
fn recv_cq_overflow_fails_the_unacknowledged_sends_posted_with_it() {
    let mut p = Pair::new(PairOptions::default());
    let (qa, cqa, qb, cqb) = small_cq_qps(&mut p, 64, 2);
    post_four_recvs(&mut p, qb);
    let s = p.sge_a(0, 64);
    for id in 1..=3 {
        let wr = SendWr {
            wr_id: id,
            op: WrOp::Send,
            sg_list: vec![s],
            flags: SendFlags::SIGNALED,
            ud: None,
        };
        p.a().post_send(qa, &wr).unwrap();
    }
    let limit = p.net.now() + SEC;
    p.net
        .run_until(limit, |net| net.engines[0].cq_len(cqa).unwrap_or(0) >= 3);
    assert_eq!(state(p.b(), qb), QpState::Err);
    let recv: Vec<_> = drain(p.b(), cqb).iter().map(|w| w.wr_id).collect();
    assert_eq!(recv, vec![100, 101]);
    let sent: Vec<_> = drain(p.a(), cqa)
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(
        sent,
        vec![
            (1, WcStatus::RetryExcErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
}

/// The CQ error and QP fatal events reach a verbs user through
/// `Device::poll_async_event` (over the in-memory driver, the real progress thread).
#[test]
fn cq_overflow_events_reach_the_verbs_async_event_queue() {
    use xroce::verbs;
    let (da, db, _link) = verbs::Device::mem_pair(
        &verbs::mem_link_config(1500, 0.0, 1),
        verbs::DeviceConfig::default(),
    )
    .unwrap();
    let side = |dev: &verbs::Device, depth: u32| {
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(depth, None).unwrap();
        let qp = pd.create_qp(&verbs::QpInitAttr::rc(&cq, &cq)).unwrap();
        let mr = pd.reg_mr(4096, Access::ALL).unwrap();
        (pd, cq, qp, mr)
    };
    let (_pa, cqa, qpa, mra) = side(&da, 1);
    let (_pb, _cqb, qpb, mrb) = side(&db, 64);
    let (ga, gb) = (da.ipv4_gid_index().unwrap(), db.ipv4_gid_index().unwrap());
    let oa = verbs::RcOptions {
        sgid_index: ga as u8,
        sq_psn: 10,
        ..verbs::RcOptions::default()
    };
    let ob = verbs::RcOptions {
        sgid_index: gb as u8,
        sq_psn: 20,
        ..verbs::RcOptions::default()
    };
    qpa.connect_rc(
        &verbs::RcPeer {
            qpn: qpb.qp_num(),
            psn: 20,
            gid: db.query_gid(gb).unwrap(),
        },
        &oa,
    )
    .unwrap();
    qpb.connect_rc(
        &verbs::RcPeer {
            qpn: qpa.qp_num(),
            psn: 10,
            gid: da.query_gid(ga).unwrap(),
        },
        &ob,
    )
    .unwrap();
    for id in 1..=2 {
        let wr = SendWr {
            wr_id: id,
            op: WrOp::Write {
                remote_addr: mrb.addr(),
                rkey: mrb.rkey(),
            },
            sg_list: vec![mra.sge(0, 64).unwrap()],
            flags: SendFlags::SIGNALED,
            ud: None,
        };
        qpa.post_send(&wr).unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    while std::time::Instant::now() < deadline
        && !(seen.iter().any(|e| matches!(e, Event::CqError(_)))
            && seen.contains(&Event::QpFatal(qpa.qp_num())))
    {
        match da.poll_async_event() {
            Some(e) => seen.push(e),
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    assert!(
        seen.iter().any(|e| matches!(e, Event::CqError(_))),
        "no CQ error event: {seen:?}"
    );
    assert!(seen.contains(&Event::QpFatal(qpa.qp_num())), "{seen:?}");
    assert_eq!(qpa.state().unwrap(), QpState::Err);
    let mut wcs = Vec::new();
    while let Some(wc) = cqa.poll_one().unwrap() {
        wcs.push(wc);
    }
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
}

/// The region behind a posted SEND is deregistered before its packet is built (IBTA 10.6.3:
/// a WR names its memory by L_Key, valid only while the region is registered): the WQE
/// completes with LOC_PROT_ERR, the QP enters ERR, the WR posted after it is flushed, and no
/// frame leaves. Over RC and UC (whose WQE is off the queue once its last packet is built).
#[test]
fn a_region_deregistered_under_a_posted_send_fails_it_locally() {
    for qp_type in [QpType::Rc, QpType::Uc] {
        let mut p = Pair::new(PairOptions {
            qp_type,
            ..PairOptions::default()
        });
        let pd = p.mr_a.pd;
        let gone = p.a().reg_mr(pd, 4096, Access::ALL).unwrap();
        let sge = Sge {
            addr: gone.addr,
            length: 64,
            lkey: gone.lkey,
        };
        p.post_a(1, WrOp::Send, vec![sge]);
        let kept = p.sge_a(0, 64);
        p.post_a(2, WrOp::Send, vec![kept]);
        p.a().dereg_mr(gone.lkey).unwrap();
        let sent = transmitted(p.a());
        assert!(sent.is_empty(), "{qp_type:?}: no frame leaves: {sent:?}");
        let cq = p.cq_a;
        let got: Vec<_> = drain(p.a(), cq)
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect();
        assert_eq!(
            got,
            vec![(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)],
            "{qp_type:?}"
        );
        let qa = p.qa;
        assert_eq!(state(p.a(), qa), QpState::Err, "{qp_type:?}");
        assert_eq!(
            p.a().counters().emit_failed,
            0,
            "{qp_type:?}: not a frame fault"
        );
    }
}
