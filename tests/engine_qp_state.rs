//! The QP state machine against the IBTA transition table (Linux `ib_modify_qp_is_ok`):
//! every legal transition with its required attributes, a missing required attribute, an
//! extra attribute, and every transition that does not exist.
use std::net::{IpAddr, Ipv4Addr};

use xroce::engine::state::transition_rule;
use xroce::engine::*;

use QpAttrMask as M;
use QpState::*;

/// The table written out independently of `state.rs`, as (from, to, RC required, UD required).
fn legal() -> Vec<(QpState, QpState, M, M)> {
    let rc_init = M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
    let ud_init = M::PKEY_INDEX | M::PORT | M::QKEY;
    let rc_rtr =
        M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
    let rc_rts = M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC;
    let mut v = vec![
        (Reset, Init, rc_init, ud_init),
        (Init, Init, M::EMPTY, M::EMPTY),
        (Init, Rtr, rc_rtr, M::EMPTY),
        (Rtr, Rts, rc_rts, M::SQ_PSN),
        (Rts, Rts, M::EMPTY, M::EMPTY),
        (Rts, Sqd, M::EMPTY, M::EMPTY),
        (Sqd, Rts, M::EMPTY, M::EMPTY),
        (Sqd, Sqd, M::EMPTY, M::EMPTY),
        (Sqe, Rts, M::EMPTY, M::EMPTY),
    ];
    for s in QpState::ALL {
        v.push((s, Reset, M::EMPTY, M::EMPTY));
        v.push((s, Err, M::EMPTY, M::EMPTY));
    }
    v
}

fn is_legal(from: QpState, to: QpState) -> Option<(M, M)> {
    legal()
        .into_iter()
        .find(|(f, t, _, _)| *f == from && *t == to)
        .map(|(_, _, rc, ud)| (rc, ud))
}

#[test]
fn table_matches_the_ibta_transitions() {
    for from in QpState::ALL {
        for to in QpState::ALL {
            for (ty, pick) in [(QpType::Rc, 0), (QpType::Ud, 1)] {
                let rule = transition_rule(from, to, ty);
                match is_legal(from, to) {
                    None => assert!(rule.is_none(), "{from:?}->{to:?} must not exist"),
                    Some(req) => {
                        let want = if pick == 0 { req.0 } else { req.1 };
                        let rule = rule.unwrap_or_else(|| panic!("{from:?}->{to:?} missing"));
                        assert_eq!(rule.required, want, "{ty:?} {from:?}->{to:?} required");
                    }
                }
            }
        }
    }
}

#[test]
fn optional_attributes_are_those_of_linux() {
    let rule = transition_rule(Init, Rtr, QpType::Rc).unwrap();
    assert_eq!(rule.optional, M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX);
    let rule = transition_rule(Rtr, Rts, QpType::Rc).unwrap();
    assert_eq!(
        rule.optional,
        M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE
    );
    let rule = transition_rule(Rts, Sqd, QpType::Rc).unwrap();
    assert_eq!(rule.optional, M::EN_SQD_ASYNC_NOTIFY);
    let rule = transition_rule(Init, Rtr, QpType::Ud).unwrap();
    assert_eq!(rule.optional, M::PKEY_INDEX | M::QKEY);
}

fn engine_with_qp(ty: QpType) -> (Engine, u32) {
    let mut e = Engine::new(EngineConfig::new(
        [2, 0, 0, 0, 0, 1],
        IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)),
    ));
    let pd = e.alloc_pd();
    let cq = e.create_cq(16).unwrap();
    let qp = e
        .create_qp(QpInit {
            qp_type: ty,
            pd,
            send_cq: cq,
            recv_cq: cq,
            caps: QpCaps::default(),
            sq_sig_all: false,
            srq: None,
        })
        .unwrap();
    (e, qp)
}

fn full_attr(state: QpState) -> QpAttr {
    QpAttr {
        qp_state: state,
        ah_attr: Some(AddressVector::new(
            [2, 0, 0, 0, 0, 2],
            IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)),
        )),
        dest_qp_num: 0x22,
        qkey: 0x1234,
        ..QpAttr::default()
    }
}

/// Drive a fresh QP into `state` with exactly the required attributes.
fn reach(e: &mut Engine, qp: u32, ty: QpType, state: QpState) {
    let path: &[QpState] = match state {
        Reset => &[],
        Init => &[Init],
        Rtr => &[Init, Rtr],
        Rts => &[Init, Rtr, Rts],
        Sqd => &[Init, Rtr, Rts, Sqd],
        Err => &[Err],
        Sqe => &[Init, Rtr, Rts], // SQE is entered by the QP itself; not reachable by modify
    };
    let mut cur = Reset;
    for &next in path {
        let req = transition_rule(cur, next, ty).unwrap().required;
        e.modify_qp(qp, &full_attr(next), M::STATE | req)
            .unwrap_or_else(|err| panic!("{cur:?}->{next:?}: {err}"));
        cur = next;
    }
}

#[test]
fn every_legal_transition_succeeds_with_its_required_attributes() {
    for ty in [QpType::Rc, QpType::Ud] {
        for (from, to, rc, ud) in legal() {
            if from == Sqe {
                continue;
            }
            let (mut e, qp) = engine_with_qp(ty);
            reach(&mut e, qp, ty, from);
            let req = if ty == QpType::Rc { rc } else { ud };
            e.modify_qp(qp, &full_attr(to), M::STATE | req)
                .unwrap_or_else(|err| panic!("{ty:?} {from:?}->{to:?}: {err}"));
            assert_eq!(e.query_qp(qp).unwrap().0.qp_state, to);
        }
    }
}

#[test]
fn a_missing_required_attribute_is_named() {
    let (mut e, qp) = engine_with_qp(QpType::Rc);
    reach(&mut e, qp, QpType::Rc, Init);
    let req = transition_rule(Init, Rtr, QpType::Rc).unwrap().required;
    for (name, bit) in req.iter_names() {
        let mask = M::STATE | req.difference(bit);
        let err = e.modify_qp(qp, &full_attr(Rtr), mask).unwrap_err();
        assert_eq!(
            err,
            EngineError::MissingAttribute {
                from: Init,
                to: Rtr,
                missing: bit
            }
        );
        assert!(err.to_string().contains(name), "{err}");
    }
    // Nothing changed.
    assert_eq!(e.query_qp(qp).unwrap().0.qp_state, Init);
}

#[test]
fn an_extra_attribute_is_rejected_and_named() {
    let (mut e, qp) = engine_with_qp(QpType::Rc);
    let req = transition_rule(Reset, Init, QpType::Rc).unwrap().required;
    let err = e
        .modify_qp(qp, &full_attr(Init), M::STATE | req | M::SQ_PSN)
        .unwrap_err();
    assert_eq!(
        err,
        EngineError::AttributeNotAllowed {
            from: Reset,
            to: Init,
            extra: M::SQ_PSN
        }
    );
    assert!(err.to_string().contains("SQ_PSN"));
    // A UD QP takes a Q_Key, an RC QP does not.
    let (mut e, qp) = engine_with_qp(QpType::Rc);
    let err = e
        .modify_qp(qp, &full_attr(Init), M::STATE | req | M::QKEY)
        .unwrap_err();
    assert!(matches!(err, EngineError::AttributeNotAllowed { .. }));
    // CUR_STATE only from RTR/RTS/SQD/SQE.
    let (mut e, qp) = engine_with_qp(QpType::Rc);
    let err = e
        .modify_qp(qp, &full_attr(Init), M::STATE | req | M::CUR_STATE)
        .unwrap_err();
    assert!(matches!(err, EngineError::AttributeNotAllowed { extra, .. } if extra == M::CUR_STATE));
}

#[test]
fn illegal_transitions_are_rejected() {
    let samples = [
        (Reset, Rtr),
        (Reset, Rts),
        (Init, Rts),
        (Rtr, Init),
        (Rts, Init),
        (Rts, Rtr),
        (Err, Init),
        (Err, Rts),
        (Sqd, Init),
        (Reset, Sqd),
    ];
    for (from, to) in samples {
        assert!(is_legal(from, to).is_none());
        let (mut e, qp) = engine_with_qp(QpType::Rc);
        reach(&mut e, qp, QpType::Rc, from);
        let err = e.modify_qp(qp, &full_attr(to), M::STATE).unwrap_err();
        assert_eq!(
            err,
            EngineError::InvalidTransition { from, to },
            "{from:?}->{to:?}"
        );
        assert_eq!(e.query_qp(qp).unwrap().0.qp_state, from);
    }
}

#[test]
fn attribute_values_are_range_checked() {
    let (mut e, qp) = engine_with_qp(QpType::Rc);
    reach(&mut e, qp, QpType::Rc, Rtr);
    let req = transition_rule(Rtr, Rts, QpType::Rc).unwrap().required;
    let mut attr = full_attr(Rts);
    attr.retry_cnt = 8;
    let err = e.modify_qp(qp, &attr, M::STATE | req).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::InvalidAttributeValue {
                attr: "RETRY_CNT",
                ..
            }
        ),
        "{err}"
    );
    attr.retry_cnt = 7;
    attr.timeout = 32;
    assert!(e.modify_qp(qp, &attr, M::STATE | req).is_err());
    attr.timeout = 14;
    e.modify_qp(qp, &attr, M::STATE | req).unwrap();
    // An AV whose GID index does not exist.
    let (mut e, qp) = engine_with_qp(QpType::Rc);
    reach(&mut e, qp, QpType::Rc, Init);
    let mut attr = full_attr(Rtr);
    attr.ah_attr.as_mut().unwrap().sgid_index = 3;
    let req = transition_rule(Init, Rtr, QpType::Rc).unwrap().required;
    let err = e.modify_qp(qp, &attr, M::STATE | req).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::InvalidAddressVector {
                field: "sgid_index",
                ..
            }
        ),
        "{err}"
    );
}

/// Every address-vector field a frame is built from is checked at modify_qp (RTR), so no
/// PSN is ever assigned to a frame that cannot be emitted; the error names the field.
#[test]
fn each_invalid_address_vector_field_is_refused_at_rtr_and_named() {
    type Edit = fn(&mut AddressVector);
    let cases: [(&str, &str, Edit); 8] = [
        ("vlan_id", "4096", |a| a.vlan_id = Some(4096)),
        ("vlan_id", "4095", |a| a.vlan_id = Some(4095)),
        ("flow_label", "0x100000", |a| a.flow_label = 0x10_0000),
        ("hop_limit", "0", |a| a.hop_limit = 0),
        ("sgid_index", "7", |a| a.sgid_index = 7),
        ("dest_mac", "ff:ff:ff:ff:ff:ff", |a| a.dest_mac = [0xff; 6]),
        ("dest_mac", "00:00:00:00:00:00", |a| a.dest_mac = [0; 6]),
        ("dest_ip", "224.0.0.5", |a| {
            a.dest_ip = IpAddr::V4(Ipv4Addr::new(224, 0, 0, 5))
        }),
    ];
    let req = transition_rule(Init, Rtr, QpType::Rc).unwrap().required;
    for (field, value, edit) in cases {
        let (mut e, qp) = engine_with_qp(QpType::Rc);
        reach(&mut e, qp, QpType::Rc, Init);
        let mut attr = full_attr(Rtr);
        edit(attr.ah_attr.as_mut().unwrap());
        let err = e.modify_qp(qp, &attr, M::STATE | req).unwrap_err();
        match &err {
            EngineError::InvalidAddressVector { field: f, .. } => assert_eq!(*f, field, "{err}"),
            other => panic!("{field}: expected an address vector error, got {other:?}"),
        }
        let text = err.to_string();
        assert!(text.contains(field) && text.contains(value), "{text}");
        assert_eq!(e.query_qp(qp).unwrap().0.qp_state, Init, "nothing changed");
    }
    // The boundary values are accepted.
    let (mut e, qp) = engine_with_qp(QpType::Rc);
    reach(&mut e, qp, QpType::Rc, Init);
    let mut attr = full_attr(Rtr);
    let av = attr.ah_attr.as_mut().unwrap();
    av.vlan_id = Some(4094);
    av.flow_label = 0xF_FFFF;
    av.hop_limit = 1;
    e.modify_qp(qp, &attr, M::STATE | req).unwrap();
}

/// A UD send names its destination per WR: it is checked at post time, field by field.
#[test]
fn a_ud_destination_is_checked_when_posted() {
    let (mut e, qp) = engine_with_qp(QpType::Ud);
    reach(&mut e, qp, QpType::Ud, Rts);
    let mut av = AddressVector::new([2, 0, 0, 0, 0, 2], IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)));
    av.vlan_id = Some(5000);
    let wr = SendWr {
        wr_id: 1,
        op: WrOp::Send,
        sg_list: vec![],
        flags: SendFlags::SIGNALED,
        ud: Some(UdDest {
            av,
            remote_qpn: 0x22,
            remote_qkey: 0x1234,
        }),
    };
    let err = e.post_send(qp, &wr).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::InvalidAddressVector {
                field: "vlan_id",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(e.send_queue_len(qp).unwrap(), 0);
}

#[test]
fn query_returns_what_is_in_force() {
    let (mut e, qp) = engine_with_qp(QpType::Rc);
    reach(&mut e, qp, QpType::Rc, Rts);
    let (attr, caps) = e.query_qp(qp).unwrap();
    assert_eq!(attr.qp_state, Rts);
    assert_eq!(attr.dest_qp_num, 0x22);
    assert_eq!(attr.path_mtu, Mtu::Mtu1024);
    assert_eq!(attr.timeout, 14);
    assert_eq!(caps, QpCaps::default());
    // RESET clears the attributes.
    e.modify_qp(qp, &full_attr(Reset), M::STATE).unwrap();
    let (attr, _) = e.query_qp(qp).unwrap();
    assert_eq!(attr.qp_state, Reset);
    assert_eq!(attr.ah_attr, None);
}

#[test]
fn posting_in_the_wrong_state_is_an_error() {
    let (mut e, qp) = engine_with_qp(QpType::Rc);
    let wr = SendWr {
        wr_id: 1,
        op: WrOp::Send,
        sg_list: vec![],
        flags: SendFlags::SIGNALED,
        ud: None,
    };
    assert!(matches!(
        e.post_send(qp, &wr),
        Result::Err(EngineError::BadState { .. })
    ));
    let rwr = RecvWr {
        wr_id: 1,
        sg_list: vec![],
    };
    assert!(matches!(
        e.post_recv(qp, &rwr),
        Result::Err(EngineError::BadState { .. })
    ));
    reach(&mut e, qp, QpType::Rc, Init);
    e.post_recv(qp, &rwr).unwrap();
    assert!(e.post_send(qp, &wr).is_err());
    assert!(matches!(
        e.post_send(0x999, &wr),
        Result::Err(EngineError::UnknownQp(0x999))
    ));
}
