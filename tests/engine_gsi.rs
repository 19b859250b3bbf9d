//! The GSI (QP1) in the engine: two engines exchange 256-byte MADs from QP1 to QP1 in both
//! directions; Q_Key mismatches, frames to a missing GSI and a second GSI are refused and
//! counted (IBTA 13.5.1, 10.2.5).
use std::net::IpAddr;

use xroce::engine::*;
use xroce::sim::workload::{IP_A, IP_B, MAC_A, MAC_B};
use xroce::wire;

struct Side {
    engine: Engine,
    cq: CqId,
    qpn: u32,
    mr: MrInfo,
}

fn init(e: &mut Engine) -> (QpInit, PdId, CqId) {
    let pd = e.alloc_pd();
    let cq = e.create_cq(64).unwrap();
    let init = QpInit {
        qp_type: QpType::Ud,
        pd,
        send_cq: cq,
        recv_cq: cq,
        caps: QpCaps::default(),
        sq_sig_all: true,
        srq: None,
    };
    (init, pd, cq)
}

fn gsi_side(mac: [u8; 6], ip: IpAddr) -> Side {
    let mut engine = Engine::new(EngineConfig::new(mac, ip));
    let (init, pd, cq) = init(&mut engine);
    let qpn = engine.create_gsi(init).unwrap();
    let mr = engine.reg_mr(pd, 16 * 4096, Access::LOCAL_WRITE).unwrap();
    Side {
        engine,
        cq,
        qpn,
        mr,
    }
}

fn post_recv(s: &mut Side, slot: u64) {
    let sge = Sge {
        addr: s.mr.addr + slot * 512,
        length: 40 + 256,
        lkey: s.mr.lkey,
    };
    s.engine
        .post_recv(
            s.qpn,
            &RecvWr {
                wr_id: slot,
                sg_list: vec![sge],
            },
        )
        .unwrap();
}

/// Posts `mad` from `from`'s QP `qpn` to QP1 at (`mac`, `ip`) with Q_Key `qkey`; returns
/// the frame it emits.
fn send_mad(
    from: &mut Side,
    qpn: u32,
    to: ([u8; 6], IpAddr),
    qkey: u32,
    mad: &[u8; 256],
) -> Vec<u8> {
    let at = from.mr.addr + 8 * 4096;
    from.engine.mr_write(from.mr.lkey, at, mad).unwrap();
    from.engine
        .post_send(
            qpn,
            &SendWr {
                wr_id: 99,
                op: WrOp::Send,
                sg_list: vec![Sge {
                    addr: at,
                    length: 256,
                    lkey: from.mr.lkey,
                }],
                flags: SendFlags::SIGNALED,
                ud: Some(UdDest {
                    av: AddressVector::new(to.0, to.1),
                    remote_qpn: GSI_QPN,
                    remote_qkey: qkey,
                }),
            },
        )
        .unwrap();
    let mut buf = vec![0; MAX_FRAME_LEN];
    let n = from.engine.poll_transmit(Instant::ZERO, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

fn mad(tag: u8) -> [u8; 256] {
    let mut m = [0u8; 256];
    for (i, b) in m.iter_mut().enumerate() {
        *b = tag ^ i as u8;
    }
    m
}

fn drain(e: &mut Engine, cq: CqId) -> Vec<Wc> {
    let mut out = Vec::new();
    while let Some(wc) = e.poll_cq_one(cq).unwrap() {
        out.push(wc);
    }
    out
}

#[test]
fn two_engines_exchange_mads_from_qp1_to_qp1_both_ways() {
    let ip_a = IpAddr::V4(IP_A);
    let ip_b = IpAddr::V4(IP_B);
    let mut a = gsi_side(MAC_A, ip_a);
    let mut b = gsi_side(MAC_B, ip_b);
    assert_eq!((a.qpn, b.qpn), (1, 1));
    let (attr, _) = a.engine.query_qp(1).unwrap();
    assert_eq!(attr.cur_qp_state, QpState::Rts);
    assert_eq!(attr.qkey, GSI_QKEY);
    assert_eq!(attr.pkey_index, 0);

    post_recv(&mut b, 0);
    // A Q_Key with bit 31 set in the WR means "the QP's own": the GSI's 0x80010000.
    let frame = send_mad(&mut a, 1, (MAC_B, ip_b), GSI_QKEY, &mad(0xa5));
    let f = wire::parse_frame_verified(&frame).unwrap();
    assert_eq!(f.roce.bth.opcode, wire::Opcode::UD_SEND_ONLY);
    assert_eq!(f.roce.bth.dest_qp, 1);
    assert_eq!(f.roce.bth.pkey, 0xFFFF);
    let deth = f.roce.deth.unwrap();
    assert_eq!((deth.qkey, deth.src_qp), (0x8001_0000, 1));
    assert_eq!(f.roce.payload, &mad(0xa5)[..]);
    assert_eq!(f.udp_src_port, wire::rxe_udp_source_port(1, 1));
    b.engine.handle_frame(Instant::ZERO, &frame);
    let wcs = drain(&mut b.engine, b.cq);
    assert_eq!(wcs.len(), 1);
    let wc = wcs[0];
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(wc.byte_len, 40 + 256);
    assert_eq!((wc.qp_num, wc.src_qp), (1, 1));
    assert_eq!(wc.sender_ip, Some(ip_a));
    assert_eq!(wc.sender_mac, Some(MAC_A));
    assert_eq!(
        b.engine.mr_to_vec(b.mr.lkey, b.mr.addr + 40, 256).unwrap(),
        mad(0xa5)
    );
    assert_eq!(a.engine.counters().gsi_sent, 1);
    assert_eq!(b.engine.counters().gsi_rcvd, 1);

    // And the answer, back to where the request came from.
    post_recv(&mut a, 3);
    let answer = send_mad(
        &mut b,
        1,
        (wc.sender_mac.unwrap(), wc.sender_ip.unwrap()),
        GSI_QKEY,
        &mad(0x5a),
    );
    a.engine.handle_frame(Instant::ZERO, &answer);
    let wcs = drain(&mut a.engine, a.cq);
    let recv: Vec<_> = wcs.iter().filter(|w| w.opcode == WcOpcode::Recv).collect();
    assert_eq!(recv.len(), 1);
    assert_eq!((recv[0].wr_id, recv[0].src_qp), (3, 1));
    assert_eq!(
        a.engine
            .mr_to_vec(a.mr.lkey, a.mr.addr + 3 * 512 + 40, 256)
            .unwrap(),
        mad(0x5a)
    );
    assert_eq!(a.engine.counters().gsi_rcvd, 1);
}

#[test]
fn a_mad_with_the_wrong_qkey_is_dropped_and_counted() {
    let mut a = gsi_side(MAC_A, IpAddr::V4(IP_A));
    let mut b = gsi_side(MAC_B, IpAddr::V4(IP_B));
    post_recv(&mut b, 0);
    let mut frame = send_mad(&mut a, 1, (MAC_B, IpAddr::V4(IP_B)), GSI_QKEY, &mad(1));
    // Rewrite the DETH Q_Key (Ethernet 14 + IPv4 20 + UDP 8 + BTH 12); the ICRC no longer
    // covers it, so the frame goes in unverified.
    let off = 14 + 20 + 8 + 12;
    assert_eq!(frame[off..off + 4], [0x80, 0x01, 0x00, 0x00]);
    frame[off..off + 4].copy_from_slice(&0x8001_0001u32.to_be_bytes());
    b.engine.handle_frame_unverified(Instant::ZERO, &frame);
    assert_eq!(b.engine.counters().drops.gsi_bad_qkey, 1);
    assert_eq!(b.engine.counters().gsi_rcvd, 0);
    assert!(drain(&mut b.engine, b.cq).is_empty());
    // The receive WQE is still there for a right one.
    let frame = send_mad(&mut a, 1, (MAC_B, IpAddr::V4(IP_B)), GSI_QKEY, &mad(2));
    b.engine.handle_frame(Instant::ZERO, &frame);
    assert_eq!(drain(&mut b.engine, b.cq).len(), 1);
}

#[test]
fn an_ordinary_ud_qp_cannot_reach_qp1_nor_take_a_controlled_qkey() {
    let mut a = Engine::new(EngineConfig::new(MAC_A, IpAddr::V4(IP_A)));
    let (qinit, pd, cq) = init(&mut a);
    let qp = a.create_qp(qinit).unwrap();
    use QpAttrMask as M;
    let mut attr = QpAttr {
        qp_state: QpState::Init,
        qkey: GSI_QKEY,
        ..QpAttr::default()
    };
    let to_init = M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY;
    // IBTA 10.2.5: a controlled Q_Key (bit 31) is refused on an ordinary QP.
    let err = a.modify_qp(qp, &attr, to_init).unwrap_err();
    assert!(
        matches!(err, EngineError::InvalidAttributeValue { attr: "QKEY", .. }),
        "{err}"
    );
    attr.qkey = 0x1234;
    a.modify_qp(qp, &attr, to_init).unwrap();
    attr.qp_state = QpState::Rtr;
    a.modify_qp(qp, &attr, M::STATE).unwrap();
    attr.qp_state = QpState::Rts;
    a.modify_qp(qp, &attr, M::STATE | M::SQ_PSN).unwrap();
    let mr = a.reg_mr(pd, 16 * 4096, Access::LOCAL_WRITE).unwrap();
    let mut a = Side {
        engine: a,
        cq,
        qpn: qp,
        mr,
    };
    let mut b = gsi_side(MAC_B, IpAddr::V4(IP_B));
    post_recv(&mut b, 0);
    // Asking for 0x80010000 gives the QP's own Q_Key 0x1234: dropped at QP1.
    let frame = send_mad(&mut a, qp, (MAC_B, IpAddr::V4(IP_B)), GSI_QKEY, &mad(3));
    let f = wire::parse_frame_verified(&frame).unwrap();
    assert_eq!(f.roce.deth.unwrap().qkey, 0x1234);
    b.engine.handle_frame(Instant::ZERO, &frame);
    // A plain wrong Q_Key too.
    let frame = send_mad(&mut a, qp, (MAC_B, IpAddr::V4(IP_B)), 0x1111, &mad(4));
    b.engine.handle_frame(Instant::ZERO, &frame);
    assert_eq!(b.engine.counters().drops.gsi_bad_qkey, 2);
    assert_eq!(b.engine.counters().gsi_rcvd, 0);
    assert!(drain(&mut b.engine, b.cq).is_empty());
    assert_eq!(a.engine.counters().gsi_sent, 0);
}

#[test]
fn the_gsi_is_opened_once_and_keeps_its_qkey() {
    let mut a = gsi_side(MAC_A, IpAddr::V4(IP_A));
    let (qinit, _, _) = init(&mut a.engine);
    assert_eq!(a.engine.create_gsi(qinit), Err(EngineError::GsiExists));
    // Its Q_Key is fixed.
    let attr = QpAttr {
        qkey: 0x1234,
        ..QpAttr::default()
    };
    let err = a.engine.modify_qp(1, &attr, QpAttrMask::QKEY).unwrap_err();
    assert!(matches!(
        err,
        EngineError::InvalidAttributeValue { attr: "QKEY", .. }
    ));
    // Closed, it may be opened again.
    a.engine.destroy_qp(1).unwrap();
    assert!(!a.engine.has_gsi());
    assert_eq!(a.engine.create_gsi(qinit), Ok(1));
    // Not a UD QP: refused.
    let (mut rc, _, _) = init(&mut a.engine);
    rc.qp_type = QpType::Rc;
    a.engine.destroy_qp(1).unwrap();
    assert!(matches!(
        a.engine.create_gsi(rc),
        Err(EngineError::InvalidArgument(_))
    ));
    // Ordinary QPs never get QPN 1.
    assert!(a.engine.create_qp_with_qpn(qinit, 1).is_err());
}

#[test]
fn frames_to_qp1_without_a_gsi_are_counted_apart() {
    let mut a = gsi_side(MAC_A, IpAddr::V4(IP_A));
    let mut b = Engine::new(EngineConfig::new(MAC_B, IpAddr::V4(IP_B)));
    let frame = send_mad(&mut a, 1, (MAC_B, IpAddr::V4(IP_B)), GSI_QKEY, &mad(5));
    b.handle_frame(Instant::ZERO, &frame);
    assert_eq!(b.counters().drops.no_gsi, 1);
    assert_eq!(b.counters().drops.unknown_qp, 0);
}

/// QP1 lives on shard `1 % count`; an engine behind a relay (a QPN prefix) holds its own
/// QP1 too, outside its slot's range: the relay hands each CM MAD to its process.
#[test]
fn only_qp1s_shard_holds_the_gsi_and_a_prefixed_engine_holds_its_own() {
    let cfg = EngineConfig::new(MAC_A, IpAddr::V4(IP_A));
    let mut shards = Engine::new_shards(cfg.clone(), 2);
    let (qinit, _, _) = init(&mut shards[0]);
    assert!(matches!(
        shards[0].create_gsi(qinit),
        Err(EngineError::InvalidArgument(_))
    ));
    assert_eq!(shards[1].create_gsi(qinit), Ok(1));
    let mut prefixed = EngineConfig::new(MAC_A, IpAddr::V4(IP_A));
    prefixed.qpn_prefix = Some(3);
    let mut e = Engine::new(prefixed);
    let (qinit, _, _) = init(&mut e);
    assert_eq!(e.create_gsi(qinit), Ok(1));
    assert_eq!(e.create_gsi(qinit), Err(EngineError::GsiExists));
}
