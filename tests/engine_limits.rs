//! One set of device limits: the engine enforces `engine::limits` (at the limit accepted, one
//! beyond refused) and the verbs layer reports the same values in `query_device`.
use xroce::engine::*;
use xroce::verbs::{mem_link_config, Device, DeviceConfig};

fn engine() -> (Engine, PdId, CqId) {
    let mut e = Engine::new(EngineConfig::new(
        [2, 0, 0, 0, 0, 1],
        "198.18.0.1".parse().unwrap(),
    ));
    let pd = e.alloc_pd();
    let cq = e.create_cq(16).unwrap();
    (e, pd, cq)
}

fn qp_init(pd: PdId, cq: CqId, caps: QpCaps) -> QpInit {
    QpInit {
        qp_type: QpType::Rc,
        pd,
        send_cq: cq,
        recv_cq: cq,
        caps,
        sq_sig_all: true,
        srq: None,
    }
}

#[test]
fn the_engine_enforces_the_limits() {
    let (mut e, pd, cq) = engine();
    let at_limit = QpCaps {
        max_send_wr: limits::MAX_QP_WR,
        max_recv_wr: limits::MAX_QP_WR,
        max_send_sge: limits::MAX_SGE,
        max_recv_sge: limits::MAX_SGE,
        max_inline_data: limits::MAX_INLINE_DATA,
    };
    let qpn = e.create_qp(qp_init(pd, cq, at_limit)).unwrap();
    for beyond in [
        QpCaps {
            max_send_wr: limits::MAX_QP_WR + 1,
            ..at_limit
        },
        QpCaps {
            max_recv_wr: limits::MAX_QP_WR + 1,
            ..at_limit
        },
        QpCaps {
            max_send_sge: limits::MAX_SGE + 1,
            ..at_limit
        },
        QpCaps {
            max_recv_sge: limits::MAX_SGE + 1,
            ..at_limit
        },
        QpCaps {
            max_inline_data: limits::MAX_INLINE_DATA + 1,
            ..at_limit
        },
    ] {
        assert!(
            matches!(
                e.create_qp(qp_init(pd, cq, beyond)),
                Err(EngineError::InvalidArgument(_))
            ),
            "{beyond:?} accepted"
        );
    }

    assert!(e.create_cq(limits::MAX_CQE).is_ok());
    assert!(e.create_cq(limits::MAX_CQE + 1).is_err());
    let too_big = limits::MAX_MR_SIZE as usize + 1;
    assert!(matches!(
        e.reg_mr(pd, too_big, Access::LOCAL_WRITE),
        Err(EngineError::InvalidArgument(_))
    ));

    // MAX_DEST_RD_ATOMIC on INIT -> RTR, MAX_QP_RD_ATOMIC on RTR -> RTS.
    let mut attr = QpAttr {
        qp_state: QpState::Init,
        ah_attr: Some(AddressVector::new(
            [2, 0, 0, 0, 0, 2],
            "198.18.0.2".parse().unwrap(),
        )),
        ..QpAttr::default()
    };
    use QpAttrMask as M;
    e.modify_qp(
        qpn,
        &attr,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )
    .unwrap();
    let rtr = M::STATE
        | M::AV
        | M::PATH_MTU
        | M::DEST_QPN
        | M::RQ_PSN
        | M::MAX_DEST_RD_ATOMIC
        | M::MIN_RNR_TIMER;
    let rts = M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
    let rd = limits::MAX_RD_ATOMIC as u8;
    attr.qp_state = QpState::Rtr;
    attr.max_dest_rd_atomic = rd + 1;
    assert_refused(e.modify_qp(qpn, &attr, rtr));
    attr.max_dest_rd_atomic = rd;
    e.modify_qp(qpn, &attr, rtr).unwrap();
    attr.qp_state = QpState::Rts;
    attr.max_rd_atomic = rd + 1;
    assert_refused(e.modify_qp(qpn, &attr, rts));
    attr.max_rd_atomic = rd;
    e.modify_qp(qpn, &attr, rts).unwrap();
}

fn assert_refused(r: Result<(), EngineError>) {
    let err = r.unwrap_err();
    assert!(
        matches!(err, EngineError::InvalidAttributeValue { .. }),
        "{err}"
    );
    let limit = format!("> {}", limits::MAX_RD_ATOMIC);
    assert!(err.to_string().contains(&limit), "{err}");
}

#[test]
fn verbs_reports_the_engine_limits() {
    let (dev, _peer, _link) =
        Device::mem_pair(&mem_link_config(1500, 0.0, 1), DeviceConfig::default()).unwrap();
    let a = dev.query_device();
    assert_eq!(a.max_qp, limits::MAX_QP);
    assert_eq!(a.max_qp_wr, limits::MAX_QP_WR);
    assert_eq!(a.max_sge, limits::MAX_SGE);
    assert_eq!(a.max_cq, limits::MAX_CQ);
    assert_eq!(a.max_cqe, limits::MAX_CQE);
    assert_eq!(a.max_mr, limits::MAX_MR);
    assert_eq!(a.max_pd, limits::MAX_PD);
    assert_eq!(a.max_mr_size, limits::MAX_MR_SIZE);
    assert_eq!(a.max_qp_rd_atom, limits::MAX_RD_ATOMIC);
    assert_eq!(a.max_qp_init_rd_atom, limits::MAX_RD_ATOMIC);
    assert_eq!(a.max_inline_data, limits::MAX_INLINE_DATA);
    assert_eq!(a.max_ah, limits::MAX_AH);
    assert_eq!(dev.query_port(1).unwrap().max_msg_sz, limits::MAX_MSG_SZ);
}

/// A UD message is one packet as large as the port carries (IBTA 9.8.3), whatever the port:
/// 4096 at a 9000-byte link. (It was 1,024 at any link: `ibv_ud_pingpong -s 2048` failed.)
/// An RC path MTU above the port's is refused (rxe and mlx5 say EINVAL), not accepted and
/// then lost on the link.
#[test]
fn the_port_mtu_bounds_ud_messages_and_rc_paths() {
    let mut config = EngineConfig::new([2, 0, 0, 0, 0, 1], "198.18.0.1".parse().unwrap());
    config.port_mtu = Mtu::Mtu2048;
    let mut e = Engine::new(config);
    let pd = e.alloc_pd();
    let cq = e.create_cq(16).unwrap();
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let ud = e
        .create_qp(QpInit {
            qp_type: QpType::Ud,
            ..qp_init(pd, cq, caps)
        })
        .unwrap();
    assert_eq!(e.query_qp(ud).unwrap().0.path_mtu, Mtu::Mtu2048);

    let rc = e.create_qp(qp_init(pd, cq, caps)).unwrap();
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    e.modify_qp(
        rc,
        &init,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    let rtr = |mtu| QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: mtu,
        dest_qp_num: ud,
        ah_attr: Some(AddressVector::new(
            [2, 0, 0, 0, 0, 2],
            "198.18.0.2".parse().unwrap(),
        )),
        ..QpAttr::default()
    };
    let rtr_mask = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    match e.modify_qp(rc, &rtr(Mtu::Mtu4096), rtr_mask) {
        Err(EngineError::InvalidAttributeValue { attr, .. }) => assert_eq!(attr, "PATH_MTU"),
        other => panic!("path MTU 4096 over a 2048 port: {other:?}"),
    }
    e.modify_qp(rc, &rtr(Mtu::Mtu2048), rtr_mask).unwrap();
}
