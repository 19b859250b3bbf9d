//! The pointer-free structs of `<infiniband/verbs.h>` that applications read or fill in
//! themselves. Field order and types follow the header; `_pad` fields are where the C
//! compiler leaves a gap, so each struct has no hidden padding and can be `Pod`.
//!
//! Byte order: fields the header declares `__be32`/`__be64` (`imm_data`, the GUIDs) hold the
//! value in network byte order, so their native integer is `value.to_be()`.

use bytemuck::{Pod, Zeroable};

use crate::values::{
    ibv_atomic_cap, ibv_gid_type, ibv_mig_state, ibv_mtu, ibv_port_state, ibv_qp_state,
    ibv_wc_opcode, ibv_wc_status,
};

/// `Default` as all zero bytes, which is what a C program gets from `memset(0)`.
macro_rules! zeroed_default {
    ($($name:ident),*) => {$(
        impl Default for $name {
            fn default() -> Self {
                Zeroable::zeroed()
            }
        }
    )*};
}

/// `union ibv_gid`: 16 bytes, also readable in C as two big-endian halves
/// (`global.subnet_prefix`, `global.interface_id`), hence its 8-byte alignment.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct ibv_gid {
    /// The GID in network byte order (a RoCE v2 GID is an IPv6 address).
    pub raw: [u8; 16],
}

impl ibv_gid {
    /// `global.subnet_prefix` as a host integer.
    pub fn subnet_prefix(&self) -> u64 {
        u64::from_be_bytes(self.raw[..8].try_into().expect("8 of 16 bytes"))
    }

    /// `global.interface_id` as a host integer.
    pub fn interface_id(&self) -> u64 {
        u64::from_be_bytes(self.raw[8..].try_into().expect("8 of 16 bytes"))
    }
}

/// `struct ibv_gid_entry`: one GID table entry (`ibv_query_gid_ex`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct ibv_gid_entry {
    /// The GID.
    pub gid: ibv_gid,
    /// Its index in the port's table.
    pub gid_index: u32,
    /// The port (1-based).
    pub port_num: u32,
    /// Its type (`uint32_t` in C).
    pub gid_type: ibv_gid_type,
    /// The ifindex of the netdev the GID belongs to.
    pub ndev_ifindex: u32,
}

/// `struct ibv_global_route`: the GRH part of an address.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct ibv_global_route {
    /// Destination GID.
    pub dgid: ibv_gid,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Index of the source GID in the local GID table.
    pub sgid_index: u8,
    /// Hop limit (RoCE v2: the IP TTL).
    pub hop_limit: u8,
    /// Traffic class (RoCE v2: the IP DSCP/ECN byte).
    pub traffic_class: u8,
    pub(crate) _pad: [u8; 1],
}

/// `struct ibv_ah_attr`: an address, for an AH or a connected QP's path.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct ibv_ah_attr {
    /// Global routing (always used on RoCE).
    pub grh: ibv_global_route,
    /// Destination LID (unused on RoCE).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits (unused on RoCE).
    pub src_path_bits: u8,
    /// Static rate (`enum ibv_rate`).
    pub static_rate: u8,
    /// Nonzero when `grh` is valid.
    pub is_global: u8,
    /// Local port (1-based).
    pub port_num: u8,
    pub(crate) _pad: [u8; 1],
}

/// `struct ibv_qp_cap`: queue depths and sizes of a QP.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Pod, Zeroable)]
pub struct ibv_qp_cap {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Bytes of inline data per send WR.
    pub max_inline_data: u32,
}

/// `struct ibv_qp_attr`: what `ibv_modify_qp` sets and `ibv_query_qp` reports.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct ibv_qp_attr {
    /// State to move to.
    pub qp_state: ibv_qp_state,
    /// State the caller believes the QP is in.
    pub cur_qp_state: ibv_qp_state,
    /// Path MTU.
    pub path_mtu: ibv_mtu,
    /// Path migration state.
    pub path_mig_state: ibv_mig_state,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Receive PSN.
    pub rq_psn: u32,
    /// Send PSN.
    pub sq_psn: u32,
    /// Remote QPN (RC).
    pub dest_qp_num: u32,
    /// `enum ibv_access_flags` bits for remote access.
    pub qp_access_flags: u32,
    /// Queue sizes.
    pub cap: ibv_qp_cap,
    /// Primary path.
    pub ah_attr: ibv_ah_attr,
    /// Alternate path.
    pub alt_ah_attr: ibv_ah_attr,
    /// P_Key index.
    pub pkey_index: u16,
    /// Alternate P_Key index.
    pub alt_pkey_index: u16,
    /// Raise an event when SQD has drained.
    pub en_sqd_async_notify: u8,
    /// Query only: the send queue is draining.
    pub sq_draining: u8,
    /// Outstanding RDMA READ/atomic requests as initiator.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA READ/atomic requests as responder.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code (IBTA table 45).
    pub min_rnr_timer: u8,
    /// Local port.
    pub port_num: u8,
    /// Local ACK timeout exponent (4.096 us * 2^timeout).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7: infinite).
    pub rnr_retry: u8,
    /// Alternate port.
    pub alt_port_num: u8,
    /// Alternate ACK timeout.
    pub alt_timeout: u8,
    pub(crate) _pad0: [u8; 1],
    /// Packet pacing rate in kbps (0: unlimited).
    pub rate_limit: u32,
    pub(crate) _pad1: [u8; 4],
}

/// `struct ibv_srq_attr`: limits of a shared receive queue.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Pod, Zeroable)]
pub struct ibv_srq_attr {
    /// Queue depth.
    pub max_wr: u32,
    /// SGEs per receive WR.
    pub max_sge: u32,
    /// Limit event threshold.
    pub srq_limit: u32,
}

/// `struct ibv_sge`: one scatter/gather element of a work request.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Pod, Zeroable)]
pub struct ibv_sge {
    /// Start address in the application's memory.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// L_Key of the memory region holding it.
    pub lkey: u32,
}

/// `struct ibv_wc`: a work completion, as `ibv_poll_cq` writes it into the caller's array.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct ibv_wc {
    /// The work request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: ibv_wc_status,
    /// What completed (valid for a successful completion).
    pub opcode: ibv_wc_opcode,
    /// Provider-specific error code.
    pub vendor_err: u32,
    /// Bytes received (receive completions).
    pub byte_len: u32,
    /// A C union: the immediate data in network byte order (`wc_flags & IBV_WC_WITH_IMM`),
    /// or `invalidated_rkey` as a host integer (`wc_flags & IBV_WC_WITH_INV`).
    pub imm_data: u32,
    /// Local QPN.
    pub qp_num: u32,
    /// Remote QPN (UD).
    pub src_qp: u32,
    /// `IBV_WC_*` flag bits ([`crate::wc_flags`]).
    pub wc_flags: u32,
    /// P_Key index (UD on GSI).
    pub pkey_index: u16,
    /// Source LID (unused on RoCE).
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Destination LID path bits (unused on RoCE).
    pub dlid_path_bits: u8,
    pub(crate) _pad: [u8; 2],
}

/// `struct ibv_device_attr`: what `ibv_query_device` reports. C `int` limits are `i32`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct ibv_device_attr {
    /// Firmware version, NUL-terminated.
    pub fw_ver: [u8; 64],
    /// Node GUID, network byte order.
    pub node_guid: u64,
    /// System image GUID, network byte order.
    pub sys_image_guid: u64,
    /// Largest memory region.
    pub max_mr_size: u64,
    /// Supported page sizes (bit mask).
    pub page_size_cap: u64,
    /// IEEE vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// QPs.
    pub max_qp: i32,
    /// WRs per queue.
    pub max_qp_wr: i32,
    /// `IBV_DEVICE_*` capability bits.
    pub device_cap_flags: u32,
    /// SGEs per WR.
    pub max_sge: i32,
    /// SGEs per RDMA READ WR.
    pub max_sge_rd: i32,
    /// CQs.
    pub max_cq: i32,
    /// Entries per CQ.
    pub max_cqe: i32,
    /// MRs.
    pub max_mr: i32,
    /// PDs.
    pub max_pd: i32,
    /// Outstanding READ/atomic requests per QP as responder.
    pub max_qp_rd_atom: i32,
    /// Same, per EE context (RD).
    pub max_ee_rd_atom: i32,
    /// Responder resources for READ/atomic, device-wide.
    pub max_res_rd_atom: i32,
    /// Outstanding READ/atomic requests per QP as initiator.
    pub max_qp_init_rd_atom: i32,
    /// Same, per EE context (RD).
    pub max_ee_init_rd_atom: i32,
    /// Atomicity of the atomic operations.
    pub atomic_cap: ibv_atomic_cap,
    /// EE contexts (RD).
    pub max_ee: i32,
    /// RD domains.
    pub max_rdd: i32,
    /// Memory windows.
    pub max_mw: i32,
    /// Raw IPv6 QPs.
    pub max_raw_ipv6_qp: i32,
    /// Raw Ethertype QPs.
    pub max_raw_ethy_qp: i32,
    /// Multicast groups.
    pub max_mcast_grp: i32,
    /// QPs per multicast group.
    pub max_mcast_qp_attach: i32,
    /// QP attachments to multicast groups, device-wide.
    pub max_total_mcast_qp_attach: i32,
    /// Address handles.
    pub max_ah: i32,
    /// FMRs.
    pub max_fmr: i32,
    /// Remaps per FMR.
    pub max_map_per_fmr: i32,
    /// SRQs.
    pub max_srq: i32,
    /// WRs per SRQ.
    pub max_srq_wr: i32,
    /// SGEs per SRQ WR.
    pub max_srq_sge: i32,
    /// P_Key table entries.
    pub max_pkeys: u16,
    /// Local CA ACK delay exponent.
    pub local_ca_ack_delay: u8,
    /// Physical ports.
    pub phys_port_cnt: u8,
    pub(crate) _pad: [u8; 4],
}

/// `struct ibv_port_attr` (52 bytes; the exported `ibv_query_port` of older programs fills
/// only the first 48, up to `port_cap_flags2`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct ibv_port_attr {
    /// Logical state.
    pub state: ibv_port_state,
    /// Largest MTU supported.
    pub max_mtu: ibv_mtu,
    /// MTU in use.
    pub active_mtu: ibv_mtu,
    /// GID table entries (C `int`).
    pub gid_tbl_len: i32,
    /// `IBV_PORT_*` capability bits.
    pub port_cap_flags: u32,
    /// Largest message.
    pub max_msg_sz: u32,
    /// Bad P_Key counter.
    pub bad_pkey_cntr: u32,
    /// Q_Key violation counter.
    pub qkey_viol_cntr: u32,
    /// P_Key table entries.
    pub pkey_tbl_len: u16,
    /// LID (unused on RoCE).
    pub lid: u16,
    /// Subnet manager LID (unused on RoCE).
    pub sm_lid: u16,
    /// LID mask control.
    pub lmc: u8,
    /// Virtual lanes.
    pub max_vl_num: u8,
    /// Subnet manager SL.
    pub sm_sl: u8,
    /// Subnet timeout.
    pub subnet_timeout: u8,
    /// Init type reply.
    pub init_type_reply: u8,
    /// Link width (IB encoding).
    pub active_width: u8,
    /// Link speed (IB encoding).
    pub active_speed: u8,
    /// Physical state (5: LinkUp).
    pub phys_state: u8,
    /// `IBV_LINK_LAYER_*` ([`crate::link_layer`]).
    pub link_layer: u8,
    /// `IBV_QPF_*` flags.
    pub flags: u8,
    /// `IBV_PORT_*2` capability bits.
    pub port_cap_flags2: u16,
    pub(crate) _pad: [u8; 2],
}

zeroed_default!(
    ibv_gid,
    ibv_gid_entry,
    ibv_global_route,
    ibv_ah_attr,
    ibv_qp_attr,
    ibv_wc,
    ibv_device_attr,
    ibv_port_attr
);
