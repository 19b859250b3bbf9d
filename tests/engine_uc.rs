//! UC queue pairs in the simulator (IBTA 9.8): SEND and RDMA WRITE without ACKs or retries;
//! a message lost in part is lost whole, the responder resynchronises on the next FIRST/ONLY
//! and later messages complete with the right data; READ, atomics and RC-only attributes are
//! refused.
#[path = "common/pair.rs"]
mod pair;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use pair::{drain, Pair, PairOptions};
use xroce::engine::*;
use xroce::sim::{FrameInfo, LinkConfig, Verdict};
use xroce::wire::{Opcode, Transport};

const SEC: Duration = Duration::from_secs(1);

fn uc_pair() -> Pair {
    Pair::new(PairOptions {
        qp_type: QpType::Uc,
        ..PairOptions::default()
    })
}

/// Drop the n-th (1-based) frame A sends.
fn drop_a_frames(numbers: &'static [u32]) -> impl FnMut(&FrameInfo<'_>) -> Verdict {
    let mut count = 0;
    move |f| {
        if f.from == 0 {
            count += 1;
            if numbers.contains(&count) {
                return Verdict::Drop;
            }
        }
        Verdict::Pass
    }
}

fn fill(p: &mut Pair, offset: u64, len: usize, seed: u8) -> Vec<u8> {
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    let (lkey, addr) = (p.mr_a.lkey, p.mr_a.addr);
    p.a().mr_write(lkey, addr + offset, &data).unwrap();
    data
}

fn read_b(p: &mut Pair, offset: u64, len: usize) -> Vec<u8> {
    let (lkey, addr) = (p.mr_b.lkey, p.mr_b.addr);
    p.b().mr_to_vec(lkey, addr + offset, len).unwrap()
}

fn statuses(wcs: &[Wc]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

fn recv_b(p: &mut Pair) -> Vec<Wc> {
    let cq = p.cq_b;
    drain(p.b(), cq)
}

/// Records (direction, opcode, AckReq) of every frame on the link.
fn record(p: &mut Pair) -> Rc<RefCell<Vec<(usize, Opcode, bool)>>> {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let log = seen.clone();
    p.net.set_filter(move |f| {
        if let Some(pkt) = f.packet() {
            log.borrow_mut()
                .push((f.from, pkt.bth.opcode, pkt.bth.ack_req));
        }
        Verdict::Pass
    });
    seen
}

#[test]
fn send_and_write_with_immediate_complete_without_acks() {
    let mut p = uc_pair();
    let seen = record(&mut p);
    let data = fill(&mut p, 0, 3000, 1);
    p.post_recv_b(7, 0, 4096);
    p.post_recv_b(8, 0x10000, 16);
    let s = p.sge_a(0, 3000);
    p.post_a(1, WrOp::SendWithImm { imm: 0xABCD }, vec![s]);
    let write = WrOp::WriteWithImm {
        remote_addr: p.mr_b.addr + 0x8000,
        rkey: p.mr_b.rkey,
        imm: 0x1234,
    };
    p.post_a(2, write, vec![s]);
    let small = p.sge_a(0, 100);
    p.post_a(
        3,
        WrOp::Write {
            remote_addr: p.mr_b.addr + 0x20000,
            rkey: p.mr_b.rkey,
        },
        vec![small],
    );
    let wcs = p.run_for_completions(3, SEC);
    assert_eq!(
        statuses(&wcs),
        (1..=3).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    assert_eq!(wcs[0].opcode, WcOpcode::Send);
    assert_eq!(wcs[1].opcode, WcOpcode::RdmaWrite);
    p.run_idle(SEC);
    let recv = recv_b(&mut p);
    assert_eq!(recv.len(), 2);
    assert_eq!((recv[0].wr_id, recv[0].opcode), (7, WcOpcode::Recv));
    assert_eq!((recv[0].byte_len, recv[0].imm_data), (3000, Some(0xABCD)));
    assert_eq!(
        (recv[1].wr_id, recv[1].opcode),
        (8, WcOpcode::RecvRdmaWithImm)
    );
    assert_eq!((recv[1].byte_len, recv[1].imm_data), (3000, Some(0x1234)));
    assert_eq!(read_b(&mut p, 0, 3000), data);
    assert_eq!(read_b(&mut p, 0x8000, 3000), data);
    assert_eq!(read_b(&mut p, 0x20000, 100), data[..100]);
    let seen = seen.borrow();
    let want = [
        Opcode::UC_SEND_FIRST,
        Opcode::UC_SEND_MIDDLE,
        Opcode::UC_SEND_LAST_WITH_IMMEDIATE,
        Opcode::UC_RDMA_WRITE_FIRST,
        Opcode::UC_RDMA_WRITE_MIDDLE,
        Opcode::UC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
        Opcode::UC_RDMA_WRITE_ONLY,
    ];
    let opcodes: Vec<_> = seen.iter().map(|s| s.1).collect();
    assert_eq!(opcodes, want, "only A sends, and only UC requests");
    assert!(seen.iter().all(|s| s.0 == 0 && !s.2), "no ACK, no AckReq");
    assert!(want
        .iter()
        .all(|o| o.info().map(|i| i.transport) == Some(Transport::Uc)));
    let (a, b) = (p.a().counters().clone(), p.b().counters().clone());
    assert_eq!(a.retransmitted_packets, 0);
    assert_eq!(b.sent_pkts, 0);
    assert_eq!(b.uc_messages_dropped, 0);
}

#[test]
fn a_gap_mid_message_drops_that_message_only() {
    let mut p = uc_pair();
    let data = fill(&mut p, 0, 3000, 5);
    for i in 0..3 {
        p.post_recv_b(i, i * 4096, 4096);
    }
    for i in 0..3 {
        let s = p.sge_a(0, 3000);
        p.post_a(10 + i, WrOp::Send, vec![s]);
    }
    // Lose the MIDDLE of the second SEND (A's 5th frame): its LAST is dropped with it.
    p.net.set_filter(drop_a_frames(&[5]));
    let wcs = p.run_for_completions(3, SEC);
    // The requester knows nothing of the loss: every WR succeeds once sent.
    assert_eq!(
        statuses(&wcs),
        (10..13).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    p.run_idle(SEC);
    let recv = recv_b(&mut p);
    // The abandoned message gave its WQE (1) back: the third message fills it.
    assert_eq!(
        statuses(&recv),
        vec![(0, WcStatus::Success), (1, WcStatus::Success)]
    );
    assert!(recv.iter().all(|w| w.byte_len == 3000));
    assert_eq!(read_b(&mut p, 0, 3000), data);
    assert_eq!(read_b(&mut p, 4096, 3000), data);
    let qb = p.qb;
    assert_eq!(
        p.b().recv_queue_len(qb).unwrap(),
        1,
        "WQE 2 is still posted"
    );
    let b = p.b().counters().clone();
    assert_eq!(b.uc_messages_dropped, 1);
    assert_eq!(b.drops.uc_out_of_sequence, 1, "the LAST after the gap");
    // The LAST and the next FIRST arrived past the expected PSN.
    assert_eq!(b.out_of_seq_request, 2);
    assert_eq!(b.sent_pkts, 0, "no NAK either");
    assert_eq!(p.a().counters().retransmitted_packets, 0);
    assert_eq!(p.b().query_qp(qb).unwrap().0.qp_state, QpState::Rts);
}

#[test]
fn a_lost_first_drops_the_rest_and_consumes_no_wqe() {
    let mut p = uc_pair();
    let data = fill(&mut p, 0, 3000, 9);
    p.post_recv_b(0, 0, 4096);
    let s = p.sge_a(0, 3000);
    p.post_a(1, WrOp::Send, vec![s]);
    p.post_a(2, WrOp::Send, vec![s]);
    p.net.set_filter(drop_a_frames(&[1]));
    let wcs = p.run_for_completions(2, SEC);
    assert_eq!(
        statuses(&wcs),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    p.run_idle(SEC);
    let recv = recv_b(&mut p);
    assert_eq!(statuses(&recv), vec![(0, WcStatus::Success)]);
    assert_eq!(read_b(&mut p, 0, 3000), data);
    let b = p.b().counters().clone();
    assert_eq!(
        b.drops.uc_out_of_sequence, 2,
        "MIDDLE and LAST continue nothing"
    );
    assert_eq!(b.uc_messages_dropped, 0, "nothing of it was accepted");
}

#[test]
fn a_lost_last_is_noticed_at_the_next_first() {
    let mut p = uc_pair();
    let data = fill(&mut p, 0, 2048, 3);
    p.post_recv_b(0, 0, 4096);
    // Two 2-packet WRITEs with immediate: the first loses its LAST (A's 2nd frame).
    for (i, off) in [(1, 0x8000), (2, 0x9000)] {
        let s = p.sge_a(0, 2048);
        let op = WrOp::WriteWithImm {
            remote_addr: p.mr_b.addr + off,
            rkey: p.mr_b.rkey,
            imm: i as u32,
        };
        p.post_a(i, op, vec![s]);
    }
    p.net.set_filter(drop_a_frames(&[2]));
    p.run_for_completions(2, SEC);
    p.run_idle(SEC);
    let recv = recv_b(&mut p);
    assert_eq!(recv.len(), 1);
    assert_eq!((recv[0].wr_id, recv[0].imm_data), (0, Some(2)));
    assert_eq!(read_b(&mut p, 0x9000, 2048), data);
    // The first WRITE's FIRST was placed (UC never undoes a placement); its LAST was not.
    assert_eq!(read_b(&mut p, 0x8000, 1024), data[..1024]);
    assert_eq!(read_b(&mut p, 0x8000 + 1024, 1024), vec![0; 1024]);
    assert_eq!(p.b().counters().uc_messages_dropped, 1);
}

#[test]
fn no_receive_wqe_drops_the_send_silently() {
    let mut p = uc_pair();
    let data = fill(&mut p, 0, 2000, 4);
    let s = p.sge_a(0, 2000);
    p.post_a(1, WrOp::Send, vec![s]);
    p.run_for_completions(1, SEC);
    p.run_idle(SEC);
    let b = p.b().counters().clone();
    assert_eq!(b.uc_messages_dropped, 1);
    assert_eq!(b.drops.uc_out_of_sequence, 1, "its LAST");
    assert_eq!((b.send_rnr_err, b.sent_pkts), (0, 0), "no RNR NAK");
    p.post_recv_b(5, 0, 4096);
    p.post_a(2, WrOp::Send, vec![s]);
    p.run_for_completions(1, SEC);
    p.run_idle(SEC);
    let recv = recv_b(&mut p);
    assert_eq!(statuses(&recv), vec![(5, WcStatus::Success)]);
    assert_eq!(read_b(&mut p, 0, 2000), data);
}

#[test]
fn a_refused_write_leaves_memory_untouched_and_the_qp_working() {
    let mut p = uc_pair();
    let data = fill(&mut p, 0, 2048, 6);
    let s = p.sge_a(0, 2048);
    let bad = WrOp::Write {
        remote_addr: p.mr_b.addr + 0x1000,
        rkey: p.mr_b.rkey ^ 0x55,
    };
    p.post_a(1, bad, vec![s]);
    let good = WrOp::Write {
        remote_addr: p.mr_b.addr + 0x4000,
        rkey: p.mr_b.rkey,
    };
    p.post_a(2, good, vec![s]);
    let wcs = p.run_for_completions(2, SEC);
    assert_eq!(
        statuses(&wcs),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    p.run_idle(SEC);
    assert_eq!(read_b(&mut p, 0x1000, 2048), vec![0; 2048]);
    assert_eq!(read_b(&mut p, 0x4000, 2048), data);
    let b = p.b().counters().clone();
    assert_eq!((b.uc_messages_dropped, b.drops.uc_out_of_sequence), (1, 1));
    let qb = p.qb;
    assert_eq!(p.b().query_qp(qb).unwrap().0.qp_state, QpState::Rts);
}

/// Messages of 1..=4 packets over a lossy link: each that arrives is whole and right, in
/// order; the lost ones are lost; the requester completes every WR.
#[test]
fn with_loss_on_the_link_lost_messages_are_lost_and_later_ones_complete() {
    let mut p = Pair::new(PairOptions {
        qp_type: QpType::Uc,
        mtu: Mtu::Mtu256,
        link: LinkConfig {
            loss: 0.05,
            ..LinkConfig::default()
        },
        seed: 7,
        ..PairOptions::default()
    });
    const N: u64 = 200;
    let len = |i: u64| 200 + (i as u32 * 97) % 800;
    for i in 0..N {
        // Message i: its index in the first 8 bytes, then bytes seeded by i.
        let mut data: Vec<u8> = (0..len(i) as usize)
            .map(|k| (k as u8).wrapping_mul(7).wrapping_add(i as u8))
            .collect();
        data[..8].copy_from_slice(&i.to_le_bytes());
        let (lkey, addr) = (p.mr_a.lkey, p.mr_a.addr);
        p.a().mr_write(lkey, addr + i * 1024, &data).unwrap();
    }
    for i in 0..N {
        p.post_recv_b(i, i * 1024, 1024);
    }
    for i in 0..N {
        let s = p.sge_a(i * 1024, len(i));
        if i % 2 == 0 {
            p.post_a(i, WrOp::Send, vec![s]);
        } else {
            let op = WrOp::WriteWithImm {
                remote_addr: p.mr_b.addr + 0x80000 + i * 1024,
                rkey: p.mr_b.rkey,
                imm: i as u32,
            };
            p.post_a(i, op, vec![s]);
        }
    }
    let wcs = p.run_for_completions(N as usize, 10 * SEC);
    assert_eq!(
        statuses(&wcs),
        (0..N).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    p.run_idle(SEC);
    let recv = recv_b(&mut p);
    assert!(p.net.stats().lost > 0);
    assert!(
        recv.len() > N as usize / 2 && recv.len() < N as usize,
        "{} of {N} arrived",
        recv.len()
    );
    // Receive WQEs are used in order: the k-th completion is WQE k, whatever was lost.
    let mut last = None;
    for (k, wc) in recv.iter().enumerate() {
        assert_eq!((wc.wr_id, wc.status), (k as u64, WcStatus::Success));
        let (i, got) = match wc.opcode {
            WcOpcode::Recv => {
                let got = read_b(&mut p, k as u64 * 1024, wc.byte_len as usize);
                (u64::from_le_bytes(got[..8].try_into().unwrap()), got)
            }
            _ => {
                let i = wc.imm_data.unwrap() as u64;
                let got = read_b(&mut p, 0x80000 + i * 1024, wc.byte_len as usize);
                (i, got)
            }
        };
        assert_eq!(wc.byte_len, len(i), "message {i}");
        let sent = {
            let (lkey, addr) = (p.mr_a.lkey, p.mr_a.addr);
            p.a()
                .mr_to_vec(lkey, addr + i * 1024, len(i) as usize)
                .unwrap()
        };
        assert_eq!(got, sent, "message {i} arrived whole");
        assert!(last < Some(i), "in order");
        last = Some(i);
    }
    let b = p.b().counters().clone();
    assert!(b.uc_messages_dropped + b.drops.uc_out_of_sequence > 0);
    assert_eq!(b.sent_pkts, 0);
}

#[test]
fn read_atomics_and_send_with_invalidate_are_refused_on_uc() {
    let mut p = uc_pair();
    let (qa, rkey, va) = (p.qa, p.mr_b.rkey, p.mr_b.addr);
    let s = p.sge_a(0, 8);
    let ops = [
        WrOp::Read {
            remote_addr: va,
            rkey,
        },
        WrOp::CompareSwap {
            remote_addr: va,
            rkey,
            compare: 0,
            swap: 1,
        },
        WrOp::FetchAdd {
            remote_addr: va,
            rkey,
            add: 1,
        },
        WrOp::SendWithInv { rkey },
    ];
    for op in ops {
        let wr = SendWr {
            wr_id: 1,
            op,
            sg_list: vec![s],
            flags: SendFlags::SIGNALED,
            ud: None,
        };
        let err = p.a().post_send(qa, &wr).unwrap_err();
        assert_eq!(
            err,
            EngineError::UnsupportedOperation {
                op: op.name(),
                qp_type: QpType::Uc
            }
        );
        assert!(err.to_string().contains("UC"), "{err}");
    }
    assert_eq!(p.a().send_queue_len(qa).unwrap(), 0);
}

#[test]
fn rc_only_attributes_are_refused_on_uc_transitions() {
    use QpAttrMask as M;
    let mut e = Engine::new(EngineConfig::new(
        [2, 0, 0, 0, 0, 1],
        "198.18.0.1".parse().unwrap(),
    ));
    let pd = e.alloc_pd();
    let cq = e.create_cq(16).unwrap();
    let qpn = e
        .create_qp(QpInit {
            qp_type: QpType::Uc,
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
        ..QpAttr::default()
    };
    // RESET -> INIT: access flags as for RC, no Q_Key.
    let err = e
        .modify_qp(qpn, &attr, M::STATE | M::PKEY_INDEX | M::PORT)
        .unwrap_err();
    assert!(
        matches!(err, EngineError::MissingAttribute { missing, .. } if missing == M::ACCESS_FLAGS)
    );
    let err = e
        .modify_qp(
            qpn,
            &attr,
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS | M::QKEY,
        )
        .unwrap_err();
    assert!(matches!(err, EngineError::AttributeNotAllowed { extra, .. } if extra == M::QKEY));
    e.modify_qp(
        qpn,
        &attr,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )
    .unwrap();
    // INIT -> RTR: the connection, without READ/ATOMIC depth or RNR timer.
    attr.qp_state = QpState::Rtr;
    attr.ah_attr = Some(AddressVector::new(
        [2, 0, 0, 0, 0, 2],
        "198.18.0.2".parse().unwrap(),
    ));
    let rtr = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    for rc_only in [M::MAX_DEST_RD_ATOMIC, M::MIN_RNR_TIMER] {
        let err = e.modify_qp(qpn, &attr, rtr | rc_only).unwrap_err();
        assert!(
            matches!(err, EngineError::AttributeNotAllowed { extra, .. } if extra == rc_only),
            "{err}"
        );
    }
    let err = e.modify_qp(qpn, &attr, rtr - M::RQ_PSN).unwrap_err();
    assert!(matches!(err, EngineError::MissingAttribute { missing, .. } if missing == M::RQ_PSN));
    e.modify_qp(qpn, &attr, rtr).unwrap();
    // RTR -> RTS: only the first PSN; no timeout, retries or READ depth.
    attr.qp_state = QpState::Rts;
    for rc_only in [
        M::TIMEOUT,
        M::RETRY_CNT,
        M::RNR_RETRY,
        M::MAX_QP_RD_ATOMIC,
        M::MIN_RNR_TIMER,
    ] {
        let err = e
            .modify_qp(qpn, &attr, M::STATE | M::SQ_PSN | rc_only)
            .unwrap_err();
        assert!(
            matches!(err, EngineError::AttributeNotAllowed { extra, .. } if extra == rc_only),
            "{err}"
        );
    }
    e.modify_qp(qpn, &attr, M::STATE | M::SQ_PSN | M::ACCESS_FLAGS)
        .unwrap();
    assert_eq!(e.query_qp(qpn).unwrap().0.qp_state, QpState::Rts);
    // RTS -> RTS may not set the RNR timer either (RC may).
    let err = e.modify_qp(qpn, &attr, M::MIN_RNR_TIMER).unwrap_err();
    assert!(matches!(err, EngineError::AttributeNotAllowed { .. }));
}

/// Runs `n` UC messages (SENDs and WRITEs with immediate, `len(i)` bytes) over `link` and
/// checks what arrived: every send WR succeeds, every receive completion is one whole message
/// that was sent, and (`in_order`) in sending order with no message twice.
fn random_uc_run(mtu: Mtu, link: LinkConfig, seed: u64, sizes: &[u32], in_order: bool) {
    let mut p = Pair::new(PairOptions {
        qp_type: QpType::Uc,
        mtu,
        link,
        seed,
        ..PairOptions::default()
    });
    let n = sizes.len() as u64;
    let slot = 8192u64;
    for (i, &len) in sizes.iter().enumerate() {
        let i = i as u64;
        let mut data: Vec<u8> = (0..len as usize)
            .map(|k| (k as u8).wrapping_mul(13) ^ (i as u8))
            .collect();
        data[..8].copy_from_slice(&i.to_le_bytes());
        let (lkey, addr) = (p.mr_a.lkey, p.mr_a.addr);
        p.a().mr_write(lkey, addr + i * slot, &data).unwrap();
        p.post_recv_b(i, i * slot, slot as u32);
    }
    for (i, &len) in sizes.iter().enumerate() {
        let i = i as u64;
        let s = p.sge_a(i * slot, len);
        let op = if i % 3 == 0 {
            WrOp::WriteWithImm {
                remote_addr: p.mr_b.addr + 0x80000 + i * slot,
                rkey: p.mr_b.rkey,
                imm: i as u32,
            }
        } else {
            WrOp::Send
        };
        p.post_a(i, op, vec![s]);
    }
    let wcs = p.run_for_completions(n as usize, 10 * SEC);
    assert_eq!(
        statuses(&wcs),
        (0..n).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    p.run_idle(SEC);
    let recv = recv_b(&mut p);
    let mut last = None;
    for (k, wc) in recv.iter().enumerate() {
        assert_eq!((wc.wr_id, wc.status), (k as u64, WcStatus::Success));
        let (i, got) = match wc.opcode {
            WcOpcode::Recv => {
                let got = read_b(&mut p, k as u64 * slot, wc.byte_len as usize);
                (u64::from_le_bytes(got[..8].try_into().unwrap()), got)
            }
            _ => {
                let i = wc.imm_data.unwrap() as u64;
                (i, read_b(&mut p, 0x80000 + i * slot, wc.byte_len as usize))
            }
        };
        assert!(i < n, "message {i} was never sent");
        assert_eq!(wc.byte_len, sizes[i as usize], "message {i}");
        let (lkey, addr) = (p.mr_a.lkey, p.mr_a.addr);
        let sent = p
            .a()
            .mr_to_vec(lkey, addr + i * slot, sizes[i as usize] as usize)
            .unwrap();
        assert_eq!(got, sent, "message {i} is whole");
        if in_order {
            assert!(last < Some(i), "message {i} after {last:?}");
        }
        last = Some(i);
    }
    let b = p.b().counters().clone();
    assert_eq!(b.sent_pkts, 0, "a UC responder sends nothing");
    let link = p.net.stats().clone();
    if link.lost + link.corrupted + link.reordered + link.duplicated == 0 {
        assert_eq!(recv.len() as u64, n, "a clean link delivers every message");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, ..Default::default() })]

    /// Loss and corruption: the messages that arrive are whole and in order; nothing is
    /// answered.
    #[test]
    fn random_loss_leaves_whole_messages_in_order(
        seed in 0u64..1 << 32,
        loss in 0.0f64..0.15,
        corrupt in 0.0f64..0.05,
        mtu in proptest::sample::select(vec![Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096]),
        sizes in proptest::collection::vec(8u32..8192, 1..60),
    ) {
        let link = LinkConfig { loss, corrupt, ..LinkConfig::default() };
        random_uc_run(mtu, link, seed, &sizes, true);
    }

    /// Reordering and duplicates as well: whatever arrives is still a whole message that was
    /// sent (a duplicated or overtaken FIRST/ONLY may start a message again: UC has no
    /// duplicate detection, IBTA 9.8.3).
    #[test]
    fn random_reorder_and_duplicates_never_deliver_a_torn_message(
        seed in 0u64..1 << 32,
        loss in 0.0f64..0.1,
        reorder in 0.0f64..0.2,
        duplicate in 0.0f64..0.1,
        sizes in proptest::collection::vec(8u32..8192, 1..60),
    ) {
        let link = LinkConfig { loss, reorder, duplicate, ..LinkConfig::default() };
        random_uc_run(Mtu::Mtu1024, link, seed, &sizes, false);
    }
}
