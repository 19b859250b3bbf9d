//! Address-vector checks: every field a frame is built from is checked where the address
//! vector is set (`modify_qp` with `AV`, a UD send's destination, the verbs layer's
//! `create_ah`), so that `poll_transmit` never assigns a PSN to a frame it cannot emit.
use std::net::IpAddr;

use super::types::{AddressVector, EngineError};

/// Largest IPv6 flow label (20 bits, RFC 8200 section 6).
pub const MAX_FLOW_LABEL: u32 = 0xF_FFFF;

/// Largest 802.1Q VLAN id that may be sent: 4095 (0xFFF) is reserved and "shall not be
/// transmitted in a tag header" (IEEE 802.1Q table 9-2); 0 is a priority tag.
pub const MAX_VLAN_ID: u16 = 4094;

fn bad(field: &'static str, reason: String) -> Result<(), EngineError> {
    Err(EngineError::InvalidAddressVector { field, reason })
}

fn is_multicast_mac(mac: [u8; 6]) -> bool {
    mac[0] & 1 != 0
}

impl AddressVector {
    /// Checks that a frame can be built from this address vector with the source GID table
    /// `gids` on a port whose MAC is `port_mac`; the error names the field at fault.
    pub fn validate(&self, gids: &[IpAddr], port_mac: [u8; 6]) -> Result<(), EngineError> {
        let Some(src) = gids.get(self.sgid_index as usize) else {
            return bad(
                "sgid_index",
                format!(
                    "{} is beyond the GID table of {} entries",
                    self.sgid_index,
                    gids.len()
                ),
            );
        };
        if src.is_unspecified() {
            return bad(
                "sgid_index",
                format!(
                    "GID index {} holds no address (the interface has none to send from)",
                    self.sgid_index
                ),
            );
        }
        if src.is_ipv4() != self.dest_ip.is_ipv4() {
            return bad(
                "dest_ip",
                format!(
                    "destination {} and source GID {src} (index {}) differ in IP family",
                    self.dest_ip, self.sgid_index
                ),
            );
        }
        // Only unicast destinations: multicast groups are not supported (no attach_mcast).
        let dest_ok = match self.dest_ip {
            IpAddr::V4(ip) => !(ip.is_unspecified() || ip.is_multicast() || ip.is_broadcast()),
            IpAddr::V6(ip) => !(ip.is_unspecified() || ip.is_multicast()),
        };
        if !dest_ok {
            return bad(
                "dest_ip",
                format!("{} is not a unicast address", self.dest_ip),
            );
        }
        // A zero MAC is only right on a port that has none itself (loopback, where the
        // kernel UDP socket builds the frame); elsewhere the frame would reach no one.
        let zero_mac_ok = port_mac == [0; 6];
        if (self.dest_mac == [0; 6] && !zero_mac_ok) || is_multicast_mac(self.dest_mac) {
            let m = self.dest_mac;
            return bad(
                "dest_mac",
                format!(
                    "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x} is not a unicast MAC for the \
                     unicast destination {}",
                    m[0], m[1], m[2], m[3], m[4], m[5], self.dest_ip
                ),
            );
        }
        // RFC 1122 3.2.1.7: a host must not send a datagram with a TTL of zero.
        if self.hop_limit == 0 {
            return bad(
                "hop_limit",
                "0 (a frame with TTL 0 is never delivered)".into(),
            );
        }
        if self.flow_label > MAX_FLOW_LABEL {
            return bad(
                "flow_label",
                format!(
                    "{:#x} does not fit the 20 bits of an IPv6 flow label",
                    self.flow_label
                ),
            );
        }
        if let Some(vid) = self.vlan_id {
            if vid > MAX_VLAN_ID {
                return bad(
                    "vlan_id",
                    format!("{vid} is outside 0..={MAX_VLAN_ID} (802.1Q: 12 bits, 4095 reserved)"),
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::super::*;
    use super::MAX_FLOW_LABEL;

    const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 2];
    const IP_A: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1));
    const IP_B: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2));

    fn field_of(r: Result<(), EngineError>) -> &'static str {
        match r {
            Err(EngineError::InvalidAddressVector { field, .. }) => field,
            other => panic!("expected an address vector error, got {other:?}"),
        }
    }

    #[test]
    fn each_field_is_checked_and_named() {
        let gids = [IP_A, IpAddr::V6(Ipv6Addr::UNSPECIFIED)];
        let good = AddressVector::new(MAC_B, IP_B);
        good.validate(&gids, MAC_A).unwrap();
        type Edit = fn(&mut AddressVector);
        let cases: [(&str, Edit); 11] = [
            ("sgid_index", |a| a.sgid_index = 2),
            ("sgid_index", |a| {
                a.sgid_index = 1;
                a.dest_ip = "2001:2::2".parse().unwrap()
            }),
            ("dest_ip", |a| a.dest_ip = "2001:2::2".parse().unwrap()),
            ("dest_ip", |a| {
                a.dest_ip = Ipv4Addr::new(224, 0, 0, 1).into()
            }),
            ("dest_ip", |a| a.dest_ip = Ipv4Addr::BROADCAST.into()),
            ("dest_ip", |a| a.dest_ip = Ipv4Addr::UNSPECIFIED.into()),
            ("dest_mac", |a| a.dest_mac = [0; 6]),
            ("dest_mac", |a| a.dest_mac = [0xff; 6]),
            ("hop_limit", |a| a.hop_limit = 0),
            ("flow_label", |a| a.flow_label = 1 << 20),
            ("vlan_id", |a| a.vlan_id = Some(4095)),
        ];
        for (want, edit) in cases {
            let mut av = good;
            edit(&mut av);
            let err = av.validate(&gids, MAC_A).unwrap_err();
            assert!(err.to_string().contains(want), "{err}");
            assert_eq!(field_of(Err(err)), want, "{av:?}");
        }
        let mut av = good;
        av.vlan_id = Some(4094);
        av.flow_label = MAX_FLOW_LABEL;
        av.hop_limit = 1;
        av.validate(&gids, MAC_A).unwrap();
        // On a port without a MAC (loopback), the zero MAC is the neighbour's.
        av.dest_mac = [0; 6];
        av.validate(&gids, [0; 6]).unwrap();
        av.dest_mac = [0xff; 6];
        assert_eq!(field_of(av.validate(&gids, [0; 6])), "dest_mac");
    }

    /// A UD QP in RTS on an engine with one GID.
    fn ud_engine() -> (Engine, u32, CqId, MrInfo) {
        let mut e = Engine::new(EngineConfig::new(MAC_A, IP_A));
        let pd = e.alloc_pd();
        let cq = e.create_cq(16).unwrap();
        let qpn = e
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
        let m = QpAttrMask::STATE;
        let init = QpAttr {
            qp_state: QpState::Init,
            qkey: 7,
            ..QpAttr::default()
        };
        e.modify_qp(
            qpn,
            &init,
            m | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
        )
        .unwrap();
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            ..QpAttr::default()
        };
        e.modify_qp(qpn, &rtr, m).unwrap();
        let rts = QpAttr {
            qp_state: QpState::Rts,
            ..QpAttr::default()
        };
        e.modify_qp(qpn, &rts, m | QpAttrMask::SQ_PSN).unwrap();
        let mr = e.reg_mr(pd, 256, Access::LOCAL_WRITE).unwrap();
        (e, qpn, cq, mr)
    }

    fn ud_send(mr: &MrInfo, av: AddressVector) -> SendWr {
        SendWr {
            wr_id: 9,
            op: WrOp::Send,
            sg_list: vec![Sge {
                addr: mr.addr,
                length: 64,
                lkey: mr.lkey,
            }],
            flags: SendFlags::SIGNALED,
            ud: Some(UdDest {
                av,
                remote_qpn: 0x22,
                remote_qkey: 7,
            }),
        }
    }

    #[test]
    fn a_ud_send_with_a_bad_destination_is_refused_at_post() {
        let (mut e, qpn, _, mr) = ud_engine();
        let mut av = AddressVector::new(MAC_B, IP_B);
        av.vlan_id = Some(5000);
        let err = e.post_send(qpn, &ud_send(&mr, av)).unwrap_err();
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
        assert_eq!(e.send_queue_len(qpn).unwrap(), 0);
    }

    #[test]
    fn a_ud_send_completes_only_once_its_frame_is_emitted() {
        let (mut e, qpn, cq, mr) = ud_engine();
        e.post_send(qpn, &ud_send(&mr, AddressVector::new(MAC_B, IP_B)))
            .unwrap();
        assert_eq!(e.cq_len(cq).unwrap(), 0, "no completion before the frame");
        let mut buf = vec![0u8; MAX_FRAME_LEN];
        assert!(e.poll_transmit(Instant::ZERO, &mut buf).is_some());
        let wc = e.poll_cq_one(cq).unwrap().expect("completed after emit");
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(e.counters().emit_failed, 0);
    }

    #[test]
    fn an_emit_failure_is_counted_and_fails_the_ud_send() {
        let (mut e, qpn, cq, mr) = ud_engine();
        e.post_send(qpn, &ud_send(&mr, AddressVector::new(MAC_B, IP_B)))
            .unwrap();
        e.post_send(qpn, &ud_send(&mr, AddressVector::new(MAC_B, IP_B)))
            .unwrap();
        // Force a frame that cannot be built: the destination is corrupted after the
        // post-time check (what any emit failure looks like to poll_transmit).
        let qp = e.qps.get_mut(&qpn).unwrap();
        qp.sq[0].ud.as_mut().unwrap().av.vlan_id = Some(5000);
        let mut buf = vec![0u8; MAX_FRAME_LEN];
        while e.poll_transmit(Instant::ZERO, &mut buf).is_some() {}
        assert_eq!(e.counters().emit_failed, 1);
        let wc = e
            .poll_cq_one(cq)
            .unwrap()
            .expect("a completion for the lost frame");
        assert_eq!(wc.wr_id, 9);
        assert_eq!(wc.status, WcStatus::LocQpOpErr);
        // rxe: a send that cannot be transmitted moves the QP to the error state.
        assert_eq!(e.query_qp(qpn).unwrap().0.qp_state, QpState::Err);
        assert_eq!(
            e.poll_cq_one(cq).unwrap().unwrap().status,
            WcStatus::WrFlushErr
        );
        assert!(std::iter::from_fn(|| e.poll_event()).any(|ev| ev == Event::QpFatal(qpn)));
        let cause = e.last_emit_error().expect("the cause is kept");
        assert!(cause.contains("VLAN") && cause.contains("5000"), "{cause}");
    }

    #[test]
    fn a_ud_send_the_driver_refuses_completes_with_an_error() {
        for signaled in [true, false] {
            let (mut e, qpn, cq, mr) = ud_engine();
            let mut wr = ud_send(&mr, AddressVector::new(MAC_B, IP_B));
            if !signaled {
                wr.flags = SendFlags::default();
                e.qps.get_mut(&qpn).unwrap().sq_sig_all = false;
            }
            e.post_send(qpn, &wr).unwrap();
            let mut buf = vec![0u8; MAX_FRAME_LEN];
            assert!(e.poll_transmit(Instant::ZERO, &mut buf).is_some());
            e.report_send_failure("frame of 1100 bytes exceeds the driver's 1000");
            let wc = e.poll_cq_one(cq).unwrap().expect("an error completion");
            assert_eq!(
                (wc.wr_id, wc.status),
                (9, WcStatus::LocQpOpErr),
                "{signaled}"
            );
            assert!(
                e.poll_cq_one(cq).unwrap().is_none(),
                "no success left behind"
            );
            assert_eq!(e.counters().emit_failed, 1);
            assert!(e.last_emit_error().unwrap().contains("driver refused"));
            assert_eq!(e.query_qp(qpn).unwrap().0.qp_state, QpState::Err);
        }
    }

    #[test]
    fn an_emit_failure_fails_an_rc_send_at_once_with_its_cause() {
        let mut e = Engine::new(EngineConfig::new(MAC_A, IP_A));
        let pd = e.alloc_pd();
        let cq = e.create_cq(16).unwrap();
        let qpn = e
            .create_qp(QpInit {
                qp_type: QpType::Rc,
                pd,
                send_cq: cq,
                recv_cq: cq,
                caps: QpCaps::default(),
                sq_sig_all: true,
                srq: None,
            })
            .unwrap();
        for (state, mask) in [
            (
                QpState::Init,
                QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
            ),
            (
                QpState::Rtr,
                QpAttrMask::AV
                    | QpAttrMask::PATH_MTU
                    | QpAttrMask::DEST_QPN
                    | QpAttrMask::RQ_PSN
                    | QpAttrMask::MAX_DEST_RD_ATOMIC
                    | QpAttrMask::MIN_RNR_TIMER,
            ),
            (
                QpState::Rts,
                QpAttrMask::TIMEOUT
                    | QpAttrMask::RETRY_CNT
                    | QpAttrMask::RNR_RETRY
                    | QpAttrMask::SQ_PSN
                    | QpAttrMask::MAX_QP_RD_ATOMIC,
            ),
        ] {
            let attr = QpAttr {
                qp_state: state,
                ah_attr: Some(AddressVector::new(MAC_B, IP_B)),
                dest_qp_num: 0x22,
                ..QpAttr::default()
            };
            e.modify_qp(qpn, &attr, QpAttrMask::STATE | mask).unwrap();
        }
        e.qps
            .get_mut(&qpn)
            .unwrap()
            .attr
            .ah_attr
            .as_mut()
            .unwrap()
            .flow_label = 1 << 20;
        e.qps
            .get_mut(&qpn)
            .unwrap()
            .attr
            .ah_attr
            .as_mut()
            .unwrap()
            .dest_ip = "2001:2::2".parse().unwrap();
        e.sh.cfg.gids[0] = "2001:2::1".parse().unwrap();
        let mr = e.reg_mr(pd, 64, Access::LOCAL_WRITE).unwrap();
        e.post_send(
            qpn,
            &SendWr {
                wr_id: 5,
                op: WrOp::Send,
                sg_list: vec![Sge {
                    addr: mr.addr,
                    length: 8,
                    lkey: mr.lkey,
                }],
                flags: SendFlags::SIGNALED,
                ud: None,
            },
        )
        .unwrap();
        let mut buf = vec![0u8; MAX_FRAME_LEN];
        while e.poll_transmit(Instant::ZERO, &mut buf).is_some() {}
        assert_eq!(e.counters().emit_failed, 1);
        // At once, not RETRY_EXC_ERR after retry_cnt local ACK timeouts.
        let wc = e.poll_cq_one(cq).unwrap().expect("completed at once");
        assert_eq!((wc.wr_id, wc.status), (5, WcStatus::LocQpOpErr));
        assert_eq!(e.query_qp(qpn).unwrap().0.qp_state, QpState::Err);
        assert_eq!(e.poll_timeout(), None, "no retry timer left running");
        let cause = e.last_emit_error().unwrap();
        assert!(cause.contains("flow label"), "{cause}");
    }
}
