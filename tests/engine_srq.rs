//! Shared receive queues in the engine (IBTA 10.2.9): several RC, UC and UD QPs take their
//! receives from one SRQ; the SRQ limit event (armed by modify_srq, raised once when the WQEs
//! fall below the limit) and the last-WQE-reached event of a QP that went to error (IBTA
//! 11.6.3); the typed errors of the SRQ verbs; one SRQ used by QPs of two shards; and one SRQ
//! shared by several QPs over a lossy simulated link, every message delivered once.
use std::net::IpAddr;
use std::time::Duration;

use xroce::engine::*;
use xroce::sim::workload::{connect, WorkloadConfig, IP_A, IP_B, MAC_A, MAC_B};
use xroce::sim::{LinkConfig, Network};

const SEC: Duration = Duration::from_secs(1);
const MSG: u32 = 3000;

/// A (senders, one QP per pair, own CQ) and B (receivers: every QP on one SRQ, one CQ).
struct Rig {
    net: Network,
    a_qps: Vec<u32>,
    b_qps: Vec<u32>,
    mr_a: MrInfo,
    mr_b: MrInfo,
    cq_a: CqId,
    cq_b: CqId,
    srq: SrqId,
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 64,
        max_recv_wr: 0,
        max_recv_sge: 0,
        ..QpCaps::default()
    }
}

fn rig(n: usize, qp_type: QpType, srq_attr: SrqAttr, link: LinkConfig, seed: u64) -> Rig {
    let mut a = Engine::new(EngineConfig::new(MAC_A, IpAddr::V4(IP_A)));
    let mut b = Engine::new(EngineConfig::new(MAC_B, IpAddr::V4(IP_B)));
    let pd_a = a.alloc_pd();
    let pd_b = b.alloc_pd();
    let cq_a = a.create_cq(4096).unwrap();
    let cq_b = b.create_cq(4096).unwrap();
    let srq = b.create_srq(pd_b, srq_attr).unwrap();
    let mr_a = a.reg_mr(pd_a, 1 << 20, Access::ALL).unwrap();
    let mr_b = b.reg_mr(pd_b, 1 << 22, Access::ALL).unwrap();
    let cfg = WorkloadConfig {
        timeout: 8,
        min_rnr_timer: 1,
        ..WorkloadConfig::default()
    };
    let (mut a_qps, mut b_qps) = (Vec::new(), Vec::new());
    for i in 0..n {
        let qa = a
            .create_qp(QpInit {
                qp_type,
                pd: pd_a,
                send_cq: cq_a,
                recv_cq: cq_a,
                caps: QpCaps {
                    max_recv_wr: 16,
                    max_recv_sge: 1,
                    ..caps()
                },
                sq_sig_all: true,
                srq: None,
            })
            .unwrap();
        let qb = b
            .create_qp(QpInit {
                qp_type,
                pd: pd_b,
                send_cq: cq_b,
                recv_cq: cq_b,
                caps: caps(),
                sq_sig_all: true,
                srq: Some(srq),
            })
            .unwrap();
        if qp_type == QpType::Ud {
            for (e, q) in [(&mut a, qa), (&mut b, qb)] {
                ready_ud(e, q);
            }
        } else {
            let psn = 100 * i as u32;
            connect(&mut a, qa, qb, MAC_B, IP_B, psn, psn + 7, &cfg).unwrap();
            connect(&mut b, qb, qa, MAC_A, IP_A, psn + 7, psn, &cfg).unwrap();
        }
        a_qps.push(qa);
        b_qps.push(qb);
    }
    Rig {
        net: Network::new(a, b, link, seed),
        a_qps,
        b_qps,
        mr_a,
        mr_b,
        cq_a,
        cq_b,
        srq,
    }
}

const QKEY: u32 = 0x1111_1111;

fn ready_ud(e: &mut Engine, qpn: u32) {
    use QpAttrMask as M;
    let mut attr = QpAttr {
        qp_state: QpState::Init,
        qkey: QKEY,
        ..QpAttr::default()
    };
    e.modify_qp(qpn, &attr, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)
        .unwrap();
    attr.qp_state = QpState::Rtr;
    e.modify_qp(qpn, &attr, M::STATE).unwrap();
    attr.qp_state = QpState::Rts;
    e.modify_qp(qpn, &attr, M::STATE | M::SQ_PSN).unwrap();
}

impl Rig {
    fn a(&mut self) -> &mut Engine {
        &mut self.net.engines[0]
    }
    fn b(&mut self) -> &mut Engine {
        &mut self.net.engines[1]
    }

    /// Posts a receive of `MSG` bytes at slot `slot` of B's memory to the SRQ.
    fn post_srq(&mut self, wr_id: u64, slot: u64) {
        let (srq, mr) = (self.srq, self.mr_b);
        let sge = Sge {
            addr: mr.addr + slot * 4096,
            length: MSG + 40,
            lkey: mr.lkey,
        };
        self.b().post_srq_recv_sges(srq, wr_id, &[sge]).unwrap();
    }

    /// A sends `len` bytes of pattern `seed` on pair `pair` (from the pair's source slot).
    fn send(&mut self, pair: usize, wr_id: u64, len: u32, seed: u8) -> Vec<u8> {
        self.send_from(pair, pair as u64, wr_id, len, seed)
    }

    /// [`Rig::send`] from source slot `slot` of A's memory (a retransmission reads it again,
    /// so messages in flight need slots of their own).
    fn send_from(&mut self, pair: usize, slot: u64, wr_id: u64, len: u32, seed: u8) -> Vec<u8> {
        let data: Vec<u8> = (0..len)
            .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
            .collect();
        let (mr, qa) = (self.mr_a, self.a_qps[pair]);
        let addr = mr.addr + slot * 4096;
        self.a().mr_write(mr.lkey, addr, &data).unwrap();
        let is_ud = self.a().qp_type(qa).unwrap() == QpType::Ud;
        let ud = is_ud.then(|| UdDest {
            av: AddressVector::new(MAC_B, IpAddr::V4(IP_B)),
            remote_qpn: self.b_qps[pair],
            remote_qkey: QKEY,
        });
        self.a()
            .post_send(
                qa,
                &SendWr {
                    wr_id,
                    op: WrOp::Send,
                    sg_list: vec![Sge {
                        addr,
                        length: len,
                        lkey: mr.lkey,
                    }],
                    flags: SendFlags::SIGNALED,
                    ud,
                },
            )
            .unwrap();
        data
    }

    fn run_until_b_has(&mut self, n: usize, limit: Duration) -> Vec<Wc> {
        let cq = self.cq_b;
        let deadline = self.net.now() + limit;
        self.net
            .run_until(deadline, |net| net.engines[1].cq_len(cq).unwrap() >= n);
        drain(self.b(), cq)
    }

    /// Until the link is quiet (the last ACKs delivered).
    fn run_idle(&mut self) {
        let deadline = self.net.now() + SEC;
        self.net.run_until(deadline, |_| false);
    }

    fn b_bytes(&mut self, slot: u64, offset: u64, len: usize) -> Vec<u8> {
        let mr = self.mr_b;
        self.b()
            .mr_to_vec(mr.lkey, mr.addr + slot * 4096 + offset, len)
            .unwrap()
    }

    fn events_b(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.net.engines[1].poll_event()).collect()
    }
}

fn drain(e: &mut Engine, cq: CqId) -> Vec<Wc> {
    std::iter::from_fn(|| e.poll_cq_one(cq).unwrap()).collect()
}

fn attr(max_wr: u32, srq_limit: u32) -> SrqAttr {
    SrqAttr {
        max_wr,
        max_sge: 1,
        srq_limit,
    }
}

#[test]
fn several_rc_qps_take_their_receives_from_one_srq_in_arrival_order() {
    let mut r = rig(3, QpType::Rc, attr(16, 0), LinkConfig::default(), 1);
    for slot in 0..6 {
        r.post_srq(100 + slot, slot);
    }

    // One message per QP, one after the other: the SRQ's WQEs go out in posting order,
    // whichever QP the message arrives on.
    let mut sent = Vec::new();
    for (i, pair) in [2usize, 0, 1].into_iter().enumerate() {
        sent.push((pair, r.send(pair, i as u64, MSG, i as u8)));
        let wcs = r.run_until_b_has(1, SEC);
        assert_eq!(wcs.len(), 1, "{wcs:?}");
        let wc = wcs[0];
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(
            wc.wr_id,
            100 + i as u64,
            "the SRQ's WQEs are taken in order"
        );
        assert_eq!(wc.qp_num, r.b_qps[pair], "the completion names the QP");
        assert_eq!(wc.src_qp, r.a_qps[pair]);
        assert_eq!(wc.byte_len, MSG);
    }
    for (i, (_, data)) in sent.iter().enumerate() {
        assert_eq!(&r.b_bytes(i as u64, 0, MSG as usize), data, "message {i}");
    }
    let srq = r.srq;
    assert_eq!(r.b().srq_len(srq).unwrap(), 3);
    for &q in &r.b_qps.clone() {
        assert_eq!(r.b().recv_queue_len(q).unwrap(), 0);
        assert_eq!(r.b().qp_srq(q).unwrap(), Some(srq));
    }
    r.run_idle();
    let cq_a = r.cq_a;
    let sends = drain(r.a(), cq_a);
    assert_eq!(sends.len(), 3);
    assert!(sends.iter().all(|w| w.status == WcStatus::Success));
    assert!(r.events_b().is_empty());
}

#[test]
fn an_empty_srq_is_rnr_nakked_and_the_message_lands_once_a_wqe_is_posted() {
    let mut r = rig(2, QpType::Rc, attr(4, 0), LinkConfig::default(), 2);
    let data = r.send(1, 9, MSG, 5);
    assert!(r.run_until_b_has(1, Duration::from_millis(2)).is_empty());
    assert!(
        r.b().counters().send_rnr_err >= 1,
        "RNR NAK while the SRQ is empty"
    );
    r.post_srq(77, 0);
    let wcs = r.run_until_b_has(1, SEC);
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (77, WcStatus::Success));
    assert_eq!(wcs[0].qp_num, r.b_qps[1]);
    assert_eq!(r.b_bytes(0, 0, MSG as usize), data);
    r.run_idle();
    let cq_a = r.cq_a;
    let sends = drain(r.a(), cq_a);
    assert_eq!(sends.len(), 1);
    assert_eq!(sends[0].status, WcStatus::Success);
}

#[test]
fn the_limit_event_fires_once_when_the_wqes_fall_below_the_armed_limit() {
    let mut r = rig(2, QpType::Rc, attr(8, 0), LinkConfig::default(), 3);
    for slot in 0..5 {
        r.post_srq(slot, slot);
    }
    let srq = r.srq;
    // Not armed: nothing fires however low it goes.
    r.send(0, 0, 64, 0);
    assert_eq!(r.run_until_b_has(1, SEC).len(), 1);
    assert!(r.events_b().is_empty());
    // Arm at 3 with 4 left: the next take leaves 3 (not below), the one after leaves 2.
    r.b()
        .modify_srq(srq, &attr(0, 3), SrqAttrMask::LIMIT)
        .unwrap();
    assert_eq!(r.b().query_srq(srq).unwrap().srq_limit, 3);
    r.send(1, 1, 64, 1);
    assert_eq!(r.run_until_b_has(1, SEC).len(), 1);
    assert!(r.events_b().is_empty(), "3 left is not below the limit 3");
    r.send(0, 2, 64, 2);
    assert_eq!(r.run_until_b_has(1, SEC).len(), 1);
    assert_eq!(r.events_b(), vec![Event::SrqLimitReached(srq)]);
    // Disarmed by the event: query reads 0, and the next take raises nothing.
    assert_eq!(r.b().query_srq(srq).unwrap().srq_limit, 0);
    r.send(1, 3, 64, 3);
    assert_eq!(r.run_until_b_has(1, SEC).len(), 1);
    assert!(r.events_b().is_empty());
    // Armed again above what it holds (1 left, limit 2): the next take fires it.
    r.b()
        .modify_srq(srq, &attr(0, 2), SrqAttrMask::LIMIT)
        .unwrap();
    assert!(r.events_b().is_empty(), "arming alone raises nothing");
    r.send(0, 4, 64, 4);
    assert_eq!(r.run_until_b_has(1, SEC).len(), 1);
    assert_eq!(r.events_b(), vec![Event::SrqLimitReached(srq)]);
    assert_eq!(r.b().srq_len(srq).unwrap(), 0);
}

#[test]
fn a_limit_armed_at_creation_fires_too() {
    let mut r = rig(1, QpType::Rc, attr(8, 2), LinkConfig::default(), 4);
    let srq = r.srq;
    assert_eq!(r.b().query_srq(srq).unwrap().srq_limit, 2);
    for slot in 0..2 {
        r.post_srq(slot, slot);
    }
    r.send(0, 0, 64, 0);
    assert_eq!(r.run_until_b_has(1, SEC).len(), 1);
    assert_eq!(r.events_b(), vec![Event::SrqLimitReached(srq)]);
}

#[test]
fn a_qp_in_error_raises_last_wqe_reached_and_leaves_the_srq_to_the_others() {
    let mut r = rig(2, QpType::Rc, attr(8, 0), LinkConfig::default(), 5);
    for slot in 0..4 {
        r.post_srq(slot, slot);
    }
    let (srq, dead, alive) = (r.srq, r.b_qps[0], r.b_qps[1]);
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    r.b().modify_qp(dead, &err, QpAttrMask::STATE).unwrap();
    assert_eq!(r.events_b(), vec![Event::QpLastWqeReached(dead)]);
    // The SRQ's WQEs belong to the SRQ: none is flushed by the QP's error.
    assert_eq!(r.b().srq_len(srq).unwrap(), 4);
    let cq_b = r.cq_b;
    assert!(drain(r.b(), cq_b).is_empty());
    // The other QP still receives from it.
    let data = r.send(1, 1, MSG, 9);
    let wcs = r.run_until_b_has(1, SEC);
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].qp_num), (0, alive));
    assert_eq!(r.b_bytes(0, 0, MSG as usize), data);
    // Reset and error again: raised once per stay in ERR.
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    r.b().modify_qp(dead, &reset, QpAttrMask::STATE).unwrap();
    r.b().modify_qp(dead, &err, QpAttrMask::STATE).unwrap();
    assert_eq!(r.events_b(), vec![Event::QpLastWqeReached(dead)]);
}

#[test]
fn a_fatal_error_on_a_qp_of_the_srq_completes_only_its_own_wqe() {
    // A SEND larger than the SRQ's WQE: class C length error, the QP ends (IBTA 9.9.3.1).
    let mut r = rig(2, QpType::Rc, attr(8, 0), LinkConfig::default(), 6);
    for slot in 0..3 {
        r.post_srq(slot, slot);
    }
    let srq = r.srq;
    r.send(0, 0, MSG + 100, 1);
    let wcs = r.run_until_b_has(1, SEC);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!((wcs[0].wr_id, wcs[0].status), (0, WcStatus::LocLenErr));
    let ev = r.events_b();
    assert!(ev.contains(&Event::QpFatal(r.b_qps[0])), "{ev:?}");
    assert!(ev.contains(&Event::QpLastWqeReached(r.b_qps[0])), "{ev:?}");
    assert_eq!(
        r.b().srq_len(srq).unwrap(),
        2,
        "the other WQEs stay in the SRQ"
    );
    let data = r.send(1, 1, MSG, 2);
    let wcs = r.run_until_b_has(1, SEC);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
    assert_eq!(r.b_bytes(1, 0, MSG as usize), data);
}

#[test]
fn ud_qps_on_an_srq() {
    let mut r = rig(2, QpType::Ud, attr(8, 0), LinkConfig::default(), 7);
    for slot in 0..2 {
        r.post_srq(10 + slot, slot);
    }
    let d1 = r.send(1, 0, 512, 3);
    let d0 = r.send(0, 1, 256, 4);
    let wcs = r.run_until_b_has(2, SEC);
    assert_eq!(wcs.len(), 2);
    assert_eq!((wcs[0].wr_id, wcs[0].qp_num), (10, r.b_qps[1]));
    assert_eq!((wcs[1].wr_id, wcs[1].qp_num), (11, r.b_qps[0]));
    assert!(wcs
        .iter()
        .all(|w| w.grh_present && w.status == WcStatus::Success));
    // The 40-byte GRH area precedes the payload.
    assert_eq!(r.b_bytes(0, 40, 512), d1);
    assert_eq!(r.b_bytes(1, 40, 256), d0);
    // A datagram with the SRQ empty is dropped and counted.
    r.send(0, 2, 64, 5);
    assert!(r.run_until_b_has(1, Duration::from_millis(5)).is_empty());
    assert_eq!(r.b().counters().drops.ud_no_recv_wqe, 1);
}

#[test]
fn uc_qps_on_an_srq() {
    let mut r = rig(2, QpType::Uc, attr(8, 0), LinkConfig::default(), 8);
    for slot in 0..2 {
        r.post_srq(slot, slot);
    }
    let d0 = r.send(0, 0, MSG, 1);
    let d1 = r.send(1, 1, MSG, 2);
    let wcs = r.run_until_b_has(2, SEC);
    assert_eq!(wcs.len(), 2);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    let by_qp = |q: u32| wcs.iter().find(|w| w.qp_num == q).unwrap().wr_id;
    assert_eq!(r.b_bytes(by_qp(r.b_qps[0]), 0, MSG as usize), d0);
    assert_eq!(r.b_bytes(by_qp(r.b_qps[1]), 0, MSG as usize), d1);
}

#[test]
fn srq_verbs_refuse_bad_values_with_typed_errors() {
    let mut e = Engine::new(EngineConfig::new(MAC_B, IpAddr::V4(IP_B)));
    let pd = e.alloc_pd();
    let other_pd = e.alloc_pd();
    assert!(matches!(
        e.create_srq(pd, attr(0, 0)),
        Err(EngineError::InvalidArgument(_))
    ));
    assert!(matches!(
        e.create_srq(pd, attr(limits::MAX_SRQ_WR + 1, 0)),
        Err(EngineError::LimitExceeded {
            what: "max_srq_wr",
            ..
        })
    ));
    assert!(matches!(
        e.create_srq(
            pd,
            SrqAttr {
                max_sge: limits::MAX_SRQ_SGE + 1,
                ..attr(4, 0)
            }
        ),
        Err(EngineError::LimitExceeded {
            what: "max_srq_sge",
            ..
        })
    ));
    assert!(matches!(
        e.create_srq(pd, attr(4, 5)),
        Err(EngineError::InvalidArgument(_))
    ));
    assert_eq!(
        e.create_srq(PdId(99), attr(4, 0)),
        Err(EngineError::UnknownPd(PdId(99)))
    );
    let srq = e.create_srq(pd, attr(2, 0)).unwrap();
    assert_eq!(e.query_srq(srq).unwrap(), attr(2, 0));
    let mr = e.reg_mr(pd, 4096, Access::LOCAL_WRITE).unwrap();
    let foreign = e.reg_mr(other_pd, 4096, Access::LOCAL_WRITE).unwrap();
    let read_only = e.reg_mr(pd, 4096, Access::NONE).unwrap();
    let sge = |m: &MrInfo| Sge {
        addr: m.addr,
        length: 64,
        lkey: m.lkey,
    };
    // SGEs need local write when posted; their PD is checked when a message is written into
    // them (a region may move to another PD meanwhile), so a foreign region is taken here.
    assert!(matches!(
        e.post_srq_recv_sges(srq, 1, &[sge(&read_only)]),
        Err(EngineError::InvalidWr(_))
    ));
    let other_srq = e.create_srq(pd, attr(2, 0)).unwrap();
    e.post_srq_recv_sges(other_srq, 1, &[sge(&foreign)])
        .unwrap();
    assert_eq!(e.srq_len(other_srq).unwrap(), 1);
    assert!(matches!(
        e.post_srq_recv_sges(srq, 1, &[sge(&mr), sge(&mr)]),
        Err(EngineError::InvalidWr(_))
    ));
    e.post_srq_recv_sges(srq, 1, &[sge(&mr)]).unwrap();
    e.post_srq_recv_sges(srq, 2, &[sge(&mr)]).unwrap();
    assert_eq!(
        e.post_srq_recv_sges(srq, 3, &[sge(&mr)]),
        Err(EngineError::QueueFull("shared receive"))
    );
    assert_eq!(e.srq_len(srq).unwrap(), 2);
    // Modify: no shrinking below what it holds, no limit above max_wr, no unknown bits;
    // nothing changes on error.
    assert!(e.modify_srq(srq, &attr(1, 0), SrqAttrMask::MAX_WR).is_err());
    assert!(e.modify_srq(srq, &attr(0, 3), SrqAttrMask::LIMIT).is_err());
    assert!(e
        .modify_srq(srq, &attr(8, 9), SrqAttrMask::MAX_WR | SrqAttrMask::LIMIT)
        .is_err());
    assert!(e
        .modify_srq(srq, &attr(8, 0), SrqAttrMask::from_bits_retain(4))
        .is_err());
    assert_eq!(e.query_srq(srq).unwrap(), attr(2, 0));
    e.modify_srq(srq, &attr(8, 6), SrqAttrMask::MAX_WR | SrqAttrMask::LIMIT)
        .unwrap();
    assert_eq!(e.query_srq(srq).unwrap(), attr(8, 6));
    assert!(
        matches!(
            e.modify_srq(srq, &attr(5, 0), SrqAttrMask::MAX_WR),
            Err(EngineError::InvalidArgument(_))
        ),
        "below the armed limit"
    );
    // A QP on it: posting to the QP itself is refused; the SRQ and its PD cannot go first.
    let cq = e.create_cq(16).unwrap();
    let init = QpInit {
        qp_type: QpType::Rc,
        pd,
        send_cq: cq,
        recv_cq: cq,
        caps: caps(),
        sq_sig_all: true,
        srq: Some(srq),
    };
    assert_eq!(
        e.create_qp(QpInit {
            srq: Some(SrqId(42)),
            ..init
        }),
        Err(EngineError::UnknownSrq(SrqId(42)))
    );
    let qp = e.create_qp(init).unwrap();
    assert_eq!(
        e.post_recv_sges(qp, 1, &[sge(&mr)]),
        Err(EngineError::ReceivesFromSrq(qp))
    );
    assert_eq!(
        e.destroy_srq(srq),
        Err(EngineError::InUse("shared receive queue"))
    );
    e.destroy_qp(qp).unwrap();
    e.dereg_mr(mr.lkey).unwrap();
    e.dereg_mr(read_only.lkey).unwrap();
    assert_eq!(
        e.dealloc_pd(pd),
        Err(EngineError::InUse("protection domain")),
        "the SRQ still uses the PD"
    );
    e.destroy_srq(other_srq).unwrap();
    e.destroy_srq(srq).unwrap();
    assert_eq!(e.destroy_srq(srq), Err(EngineError::UnknownSrq(srq)));
    assert_eq!(e.query_srq(srq), Err(EngineError::UnknownSrq(srq)));
    assert_eq!(
        e.post_srq_recv_sges(srq, 1, &[]),
        Err(EngineError::UnknownSrq(srq))
    );
    e.dealloc_pd(pd).unwrap();
}

#[test]
fn qps_of_two_shards_share_one_srq() {
    let mut shards = Engine::new_shards(EngineConfig::new(MAC_B, IpAddr::V4(IP_B)), 2);
    let pd = shards[0].alloc_pd();
    let cq = shards[0].create_cq(64).unwrap();
    let srq = shards[0].create_srq(pd, attr(4, 1)).unwrap();
    let mr = shards[1].reg_mr(pd, 4096, Access::LOCAL_WRITE).unwrap();
    let mut qps = Vec::new();
    for s in shards.iter_mut() {
        qps.push(
            s.create_qp(QpInit {
                qp_type: QpType::Rc,
                pd,
                send_cq: cq,
                recv_cq: cq,
                caps: caps(),
                sq_sig_all: true,
                srq: Some(srq),
            })
            .unwrap(),
        );
    }
    assert_ne!(shard_of_qpn(qps[0], 2), shard_of_qpn(qps[1], 2));
    // Posted through shard 1, seen and counted by shard 0.
    let sge = Sge {
        addr: mr.addr,
        length: 64,
        lkey: mr.lkey,
    };
    shards[1].post_srq_recv_sges(srq, 5, &[sge]).unwrap();
    assert_eq!(shards[0].srq_len(srq).unwrap(), 1);
    assert_eq!(
        shards[0].destroy_srq(srq),
        Err(EngineError::InUse("shared receive queue"))
    );
    shards[0].destroy_qp(qps[0]).unwrap();
    assert_eq!(
        shards[1].destroy_srq(srq),
        Err(EngineError::InUse("shared receive queue")),
        "shard 1's QP still uses it"
    );
    shards[1].destroy_qp(qps[1]).unwrap();
    shards[1].destroy_srq(srq).unwrap();
    assert_eq!(shards[0].query_srq(srq), Err(EngineError::UnknownSrq(srq)));
}

/// The simulator test: one SRQ shared by four RC QPs over a link that loses, duplicates and
/// reorders frames. Every message is delivered exactly once, each SRQ WQE is used by exactly
/// one message, the bytes are intact, and the SRQ is refilled as the tool would (the limit
/// event says when).
#[test]
fn one_srq_shared_by_several_qps_under_loss() {
    let link = LinkConfig {
        loss: 0.05,
        duplicate: 0.02,
        reorder: 0.05,
        ..LinkConfig::default()
    };
    let pairs = 4;
    let per_pair = 40u64;
    let depth = 12u32;
    let mut r = rig(pairs, QpType::Rc, attr(depth, depth / 2), link, 42);
    let srq = r.srq;
    // A WQE's wr_id is its slot in B's memory (1024 slots: none is reused).
    let slots = 1024u64;
    let mut next_wqe = 0u64;
    for _ in 0..depth {
        r.post_srq(next_wqe, next_wqe);
        next_wqe += 1;
    }
    let mut expected = std::collections::HashMap::new();
    let mut sent = vec![0u64; pairs];
    let mut received = Vec::new();
    let mut limit_events = 0;
    let deadline = r.net.now() + Duration::from_secs(120);
    let cq_a = r.cq_a;
    while received.len() < pairs * per_pair as usize {
        assert!(
            r.net.now() < deadline,
            "stalled: {} received",
            received.len()
        );
        // Keep a few messages in flight on every QP.
        for (p, n) in sent.iter_mut().enumerate() {
            let in_flight = *n - received.iter().filter(|(q, _)| *q == p).count() as u64;
            if *n < per_pair && in_flight < 2 {
                let seed = (p as u64 * 1000 + *n) as u8;
                let len = 1 + ((*n * 977 + p as u64 * 131) % MSG as u64) as u32;
                let slot = p as u64 * per_pair + *n;
                let data = r.send_from(p, slot, *n, len, seed);
                expected.insert((p, *n), data);
                *n += 1;
            }
        }
        let cq_b = r.cq_b;
        let step_until = r.net.now() + Duration::from_micros(200);
        r.net
            .run_until(step_until, |net| net.engines[1].cq_len(cq_b).unwrap() > 0);
        for wc in drain(r.b(), cq_b) {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            let p = r.b_qps.iter().position(|&q| q == wc.qp_num).unwrap();
            received.push((p, wc));
        }
        for ev in r.events_b() {
            assert_eq!(ev, Event::SrqLimitReached(srq));
            limit_events += 1;
            // Refill to the depth and arm again, as an application would.
            while r.b().srq_len(srq).unwrap() < depth as usize {
                r.post_srq(next_wqe, next_wqe);
                next_wqe += 1;
            }
            r.b()
                .modify_srq(srq, &attr(0, depth / 2), SrqAttrMask::LIMIT)
                .unwrap();
        }
        drain(r.a(), cq_a)
            .iter()
            .for_each(|w| assert_eq!(w.status, WcStatus::Success, "{w:?}"));
    }
    // Each WQE once; each QP's messages in its send order, intact.
    let used: Vec<u64> = received.iter().map(|(_, w)| w.wr_id).collect();
    let mut sorted = used.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), used.len(), "a WQE was used twice");
    // Completions come in the order messages end, not the order their FIRSTs took WQEs
    // (messages of several QPs interleave): none is skipped.
    assert_eq!(sorted, (0..used.len() as u64).collect::<Vec<_>>());
    assert_ne!(used, sorted, "the QPs' messages did interleave");
    let mut nth = vec![0u64; pairs];
    for (p, wc) in &received {
        let data = &expected[&(*p, nth[*p])];
        assert_eq!(wc.byte_len as usize, data.len());
        assert_eq!(
            &r.b_bytes(wc.wr_id, 0, data.len()),
            data,
            "QP {p} message {}",
            nth[*p]
        );
        nth[*p] += 1;
    }
    assert!(nth.iter().all(|&n| n == per_pair));
    assert!(next_wqe < slots);
    assert!(limit_events > 0, "the limit event paced the refills");
    let stats = r.net.stats().clone();
    assert!(stats.lost > 0 && stats.duplicated > 0, "{stats:?}");
    assert!(
        r.b().counters().duplicate_request > 0,
        "retransmissions reached the responder"
    );
}

/// A trace sink the test reads back (run with `--nocapture` to see the trace
/// docs/transport.md shows).
#[derive(Clone, Default)]
struct Trace(std::rc::Rc<std::cell::RefCell<Vec<u8>>>);

impl std::io::Write for Trace {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn trace_two_qps_one_wqe_rnr_then_the_limit_event_refills() {
    // One WQE for two QPs: the first SEND takes it (and leaves 0 < limit 1: the event), the
    // second finds the SRQ empty and is RNR NAKed; the refill lets its retry land.
    let mut r = rig(2, QpType::Rc, attr(4, 1), LinkConfig::default(), 9);
    let trace = Trace::default();
    r.net.set_trace(Box::new(trace.clone()));
    let srq = r.srq;
    r.post_srq(0, 0);
    r.send(0, 0, 64, 1);
    let first = r.run_until_b_has(1, SEC);
    assert_eq!((first[0].wr_id, first[0].qp_num), (0, r.b_qps[0]));
    r.send(1, 1, 64, 2);
    let none = r.run_until_b_has(1, Duration::from_micros(30));
    assert!(none.is_empty());
    let events = r.events_b();
    assert_eq!(events, vec![Event::SrqLimitReached(srq)]);
    r.net
        .note("B: Event::SrqLimitReached; post_srq_recv(wr_id 1)");
    r.post_srq(1, 1);
    let second = r.run_until_b_has(1, SEC);
    assert_eq!((second[0].wr_id, second[0].qp_num), (1, r.b_qps[1]));
    r.net.finish();
    let text = String::from_utf8_lossy(&trace.0.borrow()).into_owned();
    println!("{text}");
    assert!(text.contains("RNR"), "{text}");
    // The first SEND, the RNR-NAKed one, and at least its successful retry.
    assert!(text.matches("RC_SEND_ONLY").count() >= 3, "{text}");
}
