//! xroce's types in C's spelling: `From` for what xroce reports to a C program, `TryFrom`
//! (failing with the C value that has no xroce meaning) for what a C program hands in.
//!
//! Nothing here decides anything: a value the engine or the verbs layer does not report
//! stays zero, as a C caller's `memset` would leave it.

use xroce::engine::av::MAX_FLOW_LABEL;
use xroce::engine::{Mtu, QpState, Wc, WcOpcode, WcStatus};
use xroce::netdev::{Gid, GidEntry, GidType};
use xroce::verbs::attr::AtomicCap;
use xroce::verbs::{AhAttr, DeviceAttr, LinkLayer, PortAttr, PortState};

use crate::structs::{
    ibv_ah_attr, ibv_device_attr, ibv_gid, ibv_gid_entry, ibv_global_route, ibv_port_attr, ibv_wc,
};
use crate::values::{
    ibv_atomic_cap, ibv_gid_type, ibv_mtu, ibv_port_state, ibv_qp_state, ibv_wc_opcode,
    ibv_wc_status, link_layer, wc_flags,
};

/// Both directions of a one-to-one mapping between an xroce enum and a C enum newtype.
macro_rules! both_ways {
    ($rust:ty, $c:ty { $($r:path => $v:path,)* }) => {
        impl From<$rust> for $c {
            fn from(value: $rust) -> $c {
                match value {
                    $($r => $v,)*
                }
            }
        }

        impl TryFrom<$c> for $rust {
            type Error = $c;
            fn try_from(value: $c) -> Result<$rust, $c> {
                match value {
                    $($v => Ok($r),)*
                    other => Err(other),
                }
            }
        }
    };
}

both_ways!(WcStatus, ibv_wc_status {
    WcStatus::Success => ibv_wc_status::SUCCESS,
    WcStatus::LocLenErr => ibv_wc_status::LOC_LEN_ERR,
    WcStatus::LocQpOpErr => ibv_wc_status::LOC_QP_OP_ERR,
    WcStatus::LocProtErr => ibv_wc_status::LOC_PROT_ERR,
    WcStatus::WrFlushErr => ibv_wc_status::WR_FLUSH_ERR,
    WcStatus::MwBindErr => ibv_wc_status::MW_BIND_ERR,
    WcStatus::BadRespErr => ibv_wc_status::BAD_RESP_ERR,
    WcStatus::LocAccessErr => ibv_wc_status::LOC_ACCESS_ERR,
    WcStatus::RemInvReqErr => ibv_wc_status::REM_INV_REQ_ERR,
    WcStatus::RemAccessErr => ibv_wc_status::REM_ACCESS_ERR,
    WcStatus::RemOpErr => ibv_wc_status::REM_OP_ERR,
    WcStatus::RetryExcErr => ibv_wc_status::RETRY_EXC_ERR,
    WcStatus::RnrRetryExcErr => ibv_wc_status::RNR_RETRY_EXC_ERR,
});

both_ways!(WcOpcode, ibv_wc_opcode {
    WcOpcode::Send => ibv_wc_opcode::SEND,
    WcOpcode::RdmaWrite => ibv_wc_opcode::RDMA_WRITE,
    WcOpcode::RdmaRead => ibv_wc_opcode::RDMA_READ,
    WcOpcode::CompSwap => ibv_wc_opcode::COMP_SWAP,
    WcOpcode::FetchAdd => ibv_wc_opcode::FETCH_ADD,
    WcOpcode::BindMw => ibv_wc_opcode::BIND_MW,
    WcOpcode::LocalInv => ibv_wc_opcode::LOCAL_INV,
    WcOpcode::Recv => ibv_wc_opcode::RECV,
    WcOpcode::RecvRdmaWithImm => ibv_wc_opcode::RECV_RDMA_WITH_IMM,
});

both_ways!(QpState, ibv_qp_state {
    QpState::Reset => ibv_qp_state::RESET,
    QpState::Init => ibv_qp_state::INIT,
    QpState::Rtr => ibv_qp_state::RTR,
    QpState::Rts => ibv_qp_state::RTS,
    QpState::Sqd => ibv_qp_state::SQD,
    QpState::Sqe => ibv_qp_state::SQE,
    QpState::Err => ibv_qp_state::ERR,
});

both_ways!(PortState, ibv_port_state {
    PortState::Down => ibv_port_state::DOWN,
    PortState::Active => ibv_port_state::ACTIVE,
});

both_ways!(AtomicCap, ibv_atomic_cap {
    AtomicCap::Hca => ibv_atomic_cap::HCA,
});

both_ways!(GidType, ibv_gid_type {
    GidType::RoceV2 => ibv_gid_type::ROCE_V2,
});

impl From<Mtu> for ibv_mtu {
    fn from(mtu: Mtu) -> ibv_mtu {
        ibv_mtu::from_bytes(mtu.bytes()).expect("every IB MTU is an ibv_mtu")
    }
}

impl TryFrom<ibv_mtu> for Mtu {
    type Error = ibv_mtu;
    fn try_from(value: ibv_mtu) -> Result<Mtu, ibv_mtu> {
        value.bytes().and_then(Mtu::from_bytes).ok_or(value)
    }
}

/// The `link_layer` byte of a port.
pub fn link_layer_of(layer: LinkLayer) -> u8 {
    match layer {
        LinkLayer::Ethernet => link_layer::IBV_LINK_LAYER_ETHERNET,
    }
}

impl From<Gid> for ibv_gid {
    fn from(gid: Gid) -> ibv_gid {
        ibv_gid { raw: gid.0 }
    }
}

impl From<ibv_gid> for Gid {
    fn from(gid: ibv_gid) -> Gid {
        Gid(gid.raw)
    }
}

/// A GID table entry as `ibv_query_gid_ex` reports it; the entry itself does not know its
/// port or the netdev's ifindex.
pub fn gid_entry(entry: &GidEntry, port_num: u32, ndev_ifindex: u32) -> ibv_gid_entry {
    ibv_gid_entry {
        gid: entry.gid.into(),
        gid_index: entry.index,
        port_num,
        gid_type: entry.gid_type.into(),
        ndev_ifindex,
    }
}

impl From<AhAttr> for ibv_ah_attr {
    fn from(ah: AhAttr) -> ibv_ah_attr {
        let mut c = ibv_ah_attr {
            grh: ibv_global_route {
                dgid: ah.dgid.into(),
                flow_label: ah.flow_label,
                sgid_index: ah.sgid_index,
                hop_limit: ah.hop_limit,
                traffic_class: ah.traffic_class,
                _pad: [0],
            },
            ..ibv_ah_attr::default()
        };
        // RoCE addresses by GID: every xroce address has a GRH.
        c.is_global = 1;
        c
    }
}

/// A C address without a GRH (`is_global == 0`) names a LID, which RoCE does not have.
///
/// The flow label keeps its low 20 bits, the GRH field's width (IBTA 8.3.1), as Linux's
/// uverbs and mlx5 do: UCX passes `~0` and expects that to work.
impl TryFrom<ibv_ah_attr> for AhAttr {
    type Error = ibv_ah_attr;
    fn try_from(c: ibv_ah_attr) -> Result<AhAttr, ibv_ah_attr> {
        if c.is_global == 0 {
            return Err(c);
        }
        Ok(AhAttr {
            dgid: c.grh.dgid.into(),
            sgid_index: c.grh.sgid_index,
            hop_limit: c.grh.hop_limit,
            traffic_class: c.grh.traffic_class,
            flow_label: c.grh.flow_label & MAX_FLOW_LABEL,
        })
    }
}

/// `ibv_wc::sl` of a UD receive over RoCE: there is no service level on Ethernet, and mlx5
/// reports the frame's L3 header type there (0 GRH, 1 IPv6, 2 IPv4; RoCEv2 Annex A17.4.5.1:
/// a UD completion says which header the GRH area holds). UCX reads it to find the
/// destination GID in the 40-byte area (an IPv4 header sits in its last 20 bytes) and drops
/// every packet it cannot match.
fn roce_packet_type(sender: Option<std::net::IpAddr>) -> u8 {
    match sender {
        Some(std::net::IpAddr::V4(_)) => 2,
        Some(std::net::IpAddr::V6(_)) => 1,
        None => 0,
    }
}

impl From<&Wc> for ibv_wc {
    fn from(wc: &Wc) -> ibv_wc {
        let mut flags = 0;
        let mut imm_or_rkey = 0;
        if wc.grh_present {
            flags |= wc_flags::IBV_WC_GRH;
        }
        if let Some(imm) = wc.imm_data {
            flags |= wc_flags::IBV_WC_WITH_IMM;
            imm_or_rkey = imm.to_be();
        }
        if let Some(rkey) = wc.invalidated_rkey {
            flags |= wc_flags::IBV_WC_WITH_INV;
            imm_or_rkey = rkey;
        }
        ibv_wc {
            wr_id: wc.wr_id,
            status: wc.status.into(),
            opcode: wc.opcode.into(),
            byte_len: wc.byte_len,
            imm_data: imm_or_rkey,
            qp_num: wc.qp_num,
            src_qp: wc.src_qp,
            wc_flags: flags,
            sl: roce_packet_type(wc.sender_ip),
            ..ibv_wc::default()
        }
    }
}

/// A limit in a C `int` field (xroce's limits are far below `i32::MAX`; saturate anyway).
fn c_int(value: u32) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

impl From<&DeviceAttr> for ibv_device_attr {
    fn from(attr: &DeviceAttr) -> ibv_device_attr {
        let mut fw_ver = [0u8; 64];
        // Keep the last byte for the terminating NUL.
        let len = attr.fw_ver.len().min(fw_ver.len() - 1);
        fw_ver[..len].copy_from_slice(&attr.fw_ver.as_bytes()[..len]);
        ibv_device_attr {
            fw_ver,
            node_guid: attr.node_guid.to_be(),
            sys_image_guid: attr.sys_image_guid.to_be(),
            max_mr_size: attr.max_mr_size,
            page_size_cap: attr.page_size_cap,
            vendor_id: attr.vendor_id,
            vendor_part_id: attr.vendor_part_id,
            hw_ver: attr.hw_ver,
            max_qp: c_int(attr.max_qp),
            max_qp_wr: c_int(attr.max_qp_wr),
            max_sge: c_int(attr.max_sge),
            // The verbs layer has one SGE limit for every send WR, RDMA READ included.
            max_sge_rd: c_int(attr.max_sge),
            max_cq: c_int(attr.max_cq),
            max_cqe: c_int(attr.max_cqe),
            max_mr: c_int(attr.max_mr),
            max_pd: c_int(attr.max_pd),
            max_qp_rd_atom: c_int(attr.max_qp_rd_atom),
            max_qp_init_rd_atom: c_int(attr.max_qp_init_rd_atom),
            atomic_cap: attr.atomic_cap.into(),
            max_ah: c_int(attr.max_ah),
            max_srq: c_int(attr.max_srq),
            max_srq_wr: c_int(attr.max_srq_wr),
            max_srq_sge: c_int(attr.max_srq_sge),
            max_mw: c_int(attr.max_mw),
            // One P_Key: the default 0xFFFF (RoCE partitions are unused, IBTA A17.4).
            max_pkeys: 1,
            phys_port_cnt: attr.phys_port_cnt,
            ..ibv_device_attr::default()
        }
    }
}

impl From<&PortAttr> for ibv_port_attr {
    fn from(attr: &PortAttr) -> ibv_port_attr {
        let mtu = |m: Mtu| ibv_mtu::from_bytes(m.bytes()).expect("every IB MTU is an ibv_mtu");
        ibv_port_attr {
            state: attr.state.into(),
            max_mtu: mtu(attr.max_mtu),
            active_mtu: mtu(attr.active_mtu),
            gid_tbl_len: c_int(attr.gid_tbl_len),
            max_msg_sz: attr.max_msg_sz,
            pkey_tbl_len: attr.pkey_tbl_len,
            link_layer: link_layer_of(attr.link_layer),
            // One data VL; a 1X, SDR-rate port: RoCE over a NIC whose IB width and speed
            // mean nothing (rxe maps the Ethernet speed; a veth has none).
            max_vl_num: 1,
            active_width: 1,
            active_speed: 1,
            // IB PortPhysicalState: 5 LinkUp, 3 Disabled.
            phys_state: if attr.state == PortState::Active {
                5
            } else {
                3
            },
            ..ibv_port_attr::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;

    /// Checks `From` against the expected C number and `TryFrom` back, for every xroce value,
    /// and that every other C value of the enum is refused.
    fn both_ways<R, C>(pairs: &[(R, u32)], all_c: &[C], c_value: fn(C) -> u32)
    where
        R: Copy + PartialEq + std::fmt::Debug + Into<C> + TryFrom<C, Error = C>,
        C: Copy + PartialEq + std::fmt::Debug,
    {
        for &(rust, number) in pairs {
            let c: C = rust.into();
            assert_eq!(c_value(c), number, "{rust:?}");
            assert_eq!(R::try_from(c), Ok(rust), "{c:?} back");
        }
        for &c in all_c {
            if !pairs.iter().any(|&(_, n)| n == c_value(c)) {
                assert_eq!(R::try_from(c), Err(c), "{c:?} has no xroce meaning");
            }
        }
    }

    #[test]
    fn wc_status_both_ways() {
        let pairs = [
            (WcStatus::Success, 0),
            (WcStatus::LocLenErr, 1),
            (WcStatus::LocQpOpErr, 2),
            (WcStatus::LocProtErr, 4),
            (WcStatus::WrFlushErr, 5),
            (WcStatus::MwBindErr, 6),
            (WcStatus::BadRespErr, 7),
            (WcStatus::LocAccessErr, 8),
            (WcStatus::RemInvReqErr, 9),
            (WcStatus::RemAccessErr, 10),
            (WcStatus::RemOpErr, 11),
            (WcStatus::RetryExcErr, 12),
            (WcStatus::RnrRetryExcErr, 13),
        ];
        both_ways(&pairs, ibv_wc_status::ALL, |c| c.0);
        // The library's own copy of the numbers (what the tools print) says the same.
        for (status, number) in pairs {
            assert_eq!(status.code(), number, "{status:?}");
        }
        assert_eq!(
            WcStatus::try_from(ibv_wc_status(1000)),
            Err(ibv_wc_status(1000))
        );
    }

    #[test]
    fn wc_opcode_both_ways() {
        both_ways(
            &[
                (WcOpcode::Send, 0),
                (WcOpcode::RdmaWrite, 1),
                (WcOpcode::RdmaRead, 2),
                (WcOpcode::CompSwap, 3),
                (WcOpcode::FetchAdd, 4),
                (WcOpcode::BindMw, 5),
                (WcOpcode::LocalInv, 6),
                (WcOpcode::Recv, 128),
                (WcOpcode::RecvRdmaWithImm, 129),
            ],
            ibv_wc_opcode::ALL,
            |c| c.0,
        );
    }

    #[test]
    fn qp_state_both_ways() {
        let pairs: Vec<(QpState, u32)> = QpState::ALL
            .iter()
            .zip(0..)
            .map(|(&state, n)| (state, n))
            .collect();
        assert_eq!(pairs.len(), 7);
        both_ways(&pairs, ibv_qp_state::ALL, |c| c.0);
        assert_eq!(
            QpState::try_from(ibv_qp_state::UNKNOWN),
            Err(ibv_qp_state::UNKNOWN)
        );
    }

    #[test]
    fn mtu_both_ways() {
        both_ways(
            &[
                (Mtu::Mtu256, 1),
                (Mtu::Mtu512, 2),
                (Mtu::Mtu1024, 3),
                (Mtu::Mtu2048, 4),
                (Mtu::Mtu4096, 5),
            ],
            &[ibv_mtu(0), ibv_mtu(6), ibv_mtu(u32::MAX)],
            |c| c.0,
        );
        assert_eq!(ibv_mtu::MTU_4096.bytes(), Some(4096));
        assert_eq!(ibv_mtu(0).bytes(), None);
        assert_eq!(ibv_mtu::from_bytes(1500), None);
    }

    #[test]
    fn port_state_atomic_cap_and_gid_type_both_ways() {
        both_ways(
            &[(PortState::Down, 1), (PortState::Active, 4)],
            ibv_port_state::ALL,
            |c| c.0,
        );
        both_ways(&[(AtomicCap::Hca, 1)], ibv_atomic_cap::ALL, |c| c.0);
        both_ways(&[(GidType::RoceV2, 2)], ibv_gid_type::ALL, |c| c.0);
        assert_eq!(link_layer_of(LinkLayer::Ethernet), 2);
    }

    #[test]
    fn gid_keeps_network_byte_order() {
        let gid = Gid::from_ip(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)));
        let c = ibv_gid::from(gid);
        assert_eq!(c.subnet_prefix(), 0);
        assert_eq!(c.interface_id(), 0x0000_ffff_c612_0001);
        assert_eq!(Gid::from(c), gid);
        let entry = gid_entry(
            &GidEntry {
                index: 1,
                gid,
                gid_type: GidType::RoceV2,
            },
            1,
            7,
        );
        assert_eq!(
            (
                entry.gid_index,
                entry.port_num,
                entry.gid_type,
                entry.ndev_ifindex
            ),
            (1, 1, ibv_gid_type::ROCE_V2, 7)
        );
    }

    #[test]
    fn ah_attr_both_ways() {
        let ah = AhAttr {
            dgid: Gid::from_ip(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2))),
            sgid_index: 1,
            hop_limit: 63,
            traffic_class: 0x28,
            flow_label: 0xabcde,
        };
        let c = ibv_ah_attr::from(ah);
        assert_eq!(c.is_global, 1);
        assert_eq!(c.grh.dgid.raw, ah.dgid.0);
        assert_eq!(
            (
                c.grh.sgid_index,
                c.grh.hop_limit,
                c.grh.traffic_class,
                c.grh.flow_label
            ),
            (1, 63, 0x28, 0xabcde)
        );
        assert_eq!((c.dlid, c.sl, c.port_num), (0, 0, 0));
        assert_eq!(AhAttr::try_from(c), Ok(ah));
        let lid_only = ibv_ah_attr {
            is_global: 0,
            dlid: 7,
            ..c
        };
        assert_eq!(AhAttr::try_from(lid_only), Err(lid_only));
    }

    #[test]
    fn a_flow_label_keeps_its_low_20_bits() {
        // UCX sets every bit; Linux's uverbs and mlx5 take the GRH field's 20.
        let c = ibv_ah_attr {
            is_global: 1,
            grh: ibv_global_route {
                flow_label: u32::MAX,
                ..bytemuck::Zeroable::zeroed()
            },
            ..ibv_ah_attr::default()
        };
        assert_eq!(AhAttr::try_from(c).unwrap().flow_label, 0xF_FFFF);
    }

    #[test]
    fn a_ud_receive_reports_its_l3_header_type_in_sl() {
        let mut wc = engine_wc();
        assert_eq!(ibv_wc::from(&wc).sl, 0, "no sender: no GRH area");
        wc.sender_ip = Some(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)));
        assert_eq!(ibv_wc::from(&wc).sl, 2, "IPv4 (mlx5's L3 header type)");
        wc.sender_ip = Some("2001:2::2".parse().unwrap());
        assert_eq!(ibv_wc::from(&wc).sl, 1, "IPv6");
    }

    fn engine_wc() -> Wc {
        Wc {
            wr_id: 0x1122_3344_5566_7788,
            status: WcStatus::Success,
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len: 4096,
            imm_data: Some(0x0102_0304),
            invalidated_rkey: None,
            qp_num: 0x11,
            src_qp: 0x22,
            grh_present: true,
            sender_ip: None,
            sender_mac: None,
        }
    }

    #[test]
    fn wc_carries_every_field_and_flag() {
        let c = ibv_wc::from(&engine_wc());
        assert_eq!(c.wr_id, 0x1122_3344_5566_7788);
        assert_eq!(c.status, ibv_wc_status::SUCCESS);
        assert_eq!(c.opcode, ibv_wc_opcode::RECV_RDMA_WITH_IMM);
        assert_eq!((c.byte_len, c.qp_num, c.src_qp), (4096, 0x11, 0x22));
        assert_eq!(c.wc_flags, wc_flags::IBV_WC_GRH | wc_flags::IBV_WC_WITH_IMM);
        // __be32: the bytes in memory are in wire order.
        assert_eq!(c.imm_data.to_ne_bytes(), [1, 2, 3, 4]);
        assert_eq!((c.vendor_err, c.pkey_index, c.slid, c.sl), (0, 0, 0, 0));

        let inv = Wc {
            opcode: WcOpcode::Recv,
            imm_data: None,
            invalidated_rkey: Some(0xabcd),
            grh_present: false,
            ..engine_wc()
        };
        let c = ibv_wc::from(&inv);
        assert_eq!(c.wc_flags, wc_flags::IBV_WC_WITH_INV);
        assert_eq!(c.imm_data, 0xabcd, "invalidated_rkey is a host integer");

        let flushed = Wc {
            status: WcStatus::WrFlushErr,
            imm_data: None,
            grh_present: false,
            ..engine_wc()
        };
        let c = ibv_wc::from(&flushed);
        assert_eq!(c.status, ibv_wc_status::WR_FLUSH_ERR);
        assert_eq!(c.wc_flags, 0);
    }

    #[test]
    fn device_attr_translates_limits_and_guids() {
        let attr = DeviceAttr {
            fw_ver: "x".repeat(100),
            node_guid: 0x00fc_00ff_fe00_0001,
            sys_image_guid: 0x00fc_00ff_fe00_0001,
            vendor_id: 0,
            vendor_part_id: 0,
            hw_ver: 0,
            phys_port_cnt: 1,
            max_mr_size: 1 << 40,
            page_size_cap: !0xfff,
            max_qp: 1024,
            max_qp_wr: 16384,
            max_sge: 32,
            max_cq: 1024,
            max_cqe: 65536,
            max_mr: 4096,
            max_pd: 1024,
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 16,
            max_inline_data: 256,
            max_ah: 4096,
            max_srq: 1024,
            max_srq_wr: 16384,
            max_srq_sge: 32,
            max_mw: 4096,
            atomic_cap: AtomicCap::Hca,
        };
        let c = ibv_device_attr::from(&attr);
        assert_eq!(&c.fw_ver[..63], "x".repeat(63).as_bytes());
        assert_eq!(c.fw_ver[63], 0, "NUL-terminated even when too long");
        assert_eq!(c.node_guid.to_ne_bytes(), [0, 0xfc, 0, 0xff, 0xfe, 0, 0, 1]);
        assert_eq!(
            (c.max_qp, c.max_qp_wr, c.max_sge, c.max_sge_rd),
            (1024, 16384, 32, 32)
        );
        assert_eq!(
            (c.max_cq, c.max_cqe, c.max_mr, c.max_pd),
            (1024, 65536, 4096, 1024)
        );
        assert_eq!(
            (c.max_qp_rd_atom, c.max_qp_init_rd_atom, c.max_ah),
            (16, 16, 4096)
        );
        assert_eq!(
            (c.max_srq, c.max_srq_wr, c.max_srq_sge, c.max_mw),
            (1024, 16384, 32, 4096)
        );
        assert_eq!(c.max_pkeys, 1);
        assert_eq!((c.atomic_cap, c.phys_port_cnt), (ibv_atomic_cap::HCA, 1));
        assert_eq!((c.max_mr_size, c.page_size_cap), (1 << 40, !0xfff));
        assert_eq!(c_int(u32::MAX), i32::MAX);
    }

    #[test]
    fn port_attr_translates() {
        let attr = PortAttr {
            state: PortState::Active,
            max_mtu: Mtu::Mtu4096,
            active_mtu: Mtu::Mtu1024,
            link_mtu: 1500,
            gid_tbl_len: 2,
            pkey_tbl_len: 1,
            max_msg_sz: 1 << 31,
            link_layer: LinkLayer::Ethernet,
        };
        let c = ibv_port_attr::from(&attr);
        assert_eq!(c.state, ibv_port_state::ACTIVE);
        assert_eq!(
            (c.max_mtu, c.active_mtu),
            (ibv_mtu::MTU_4096, ibv_mtu::MTU_1024)
        );
        assert_eq!(
            (c.gid_tbl_len, c.pkey_tbl_len, c.max_msg_sz),
            (2, 1, 1 << 31)
        );
        assert_eq!(c.link_layer, link_layer::IBV_LINK_LAYER_ETHERNET);
    }
}
