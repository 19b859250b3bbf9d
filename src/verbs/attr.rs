//! Device and port attributes: what `ibv_query_device` / `ibv_query_port` report.
use crate::engine::Mtu;
use crate::netdev::{MacAddr, NetdevInfo};

/// Limits and identity of an xroce device (`struct ibv_device_attr`). The limits are the ones
/// the verbs layer enforces; asking for more is a typed error naming the limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Firmware version string (xroce's crate version).
    pub fw_ver: String,
    /// Node GUID: the modified EUI-64 of the interface MAC, as rxe derives it.
    pub node_guid: u64,
    /// System image GUID (same as the node GUID).
    pub sys_image_guid: u64,
    /// IEEE vendor id: [`VENDOR_ID`], nobody's.
    pub vendor_id: u32,
    /// Vendor part id: [`VENDOR_PART_ID`].
    pub vendor_part_id: u32,
    /// Hardware version (0).
    pub hw_ver: u32,
    /// Number of physical ports (1).
    pub phys_port_cnt: u8,
    /// Largest registrable memory region in bytes.
    pub max_mr_size: u64,
    /// Page sizes supported for registration (bit mask; xroce: any).
    pub page_size_cap: u64,
    /// Maximum queue pairs.
    pub max_qp: u32,
    /// Maximum work requests per send or receive queue.
    pub max_qp_wr: u32,
    /// Maximum scatter/gather entries per work request.
    pub max_sge: u32,
    /// Maximum completion queues.
    pub max_cq: u32,
    /// Maximum entries per completion queue.
    pub max_cqe: u32,
    /// Maximum memory regions.
    pub max_mr: u32,
    /// Maximum protection domains.
    pub max_pd: u32,
    /// Maximum outstanding RDMA READ/ATOMIC requests a QP accepts as responder.
    pub max_qp_rd_atom: u32,
    /// Maximum outstanding RDMA READ/ATOMIC requests a QP issues as initiator.
    pub max_qp_init_rd_atom: u32,
    /// Maximum inline data per send work request.
    pub max_inline_data: u32,
    /// Maximum address handles.
    pub max_ah: u32,
    /// Maximum shared receive queues.
    pub max_srq: u32,
    /// Maximum work requests per shared receive queue.
    pub max_srq_wr: u32,
    /// Maximum scatter/gather entries per shared receive queue WR.
    pub max_srq_sge: u32,
    /// Maximum memory windows (types 1 and 2, IBTA 10.6.7).
    pub max_mw: u32,
    /// Atomic operations are atomic with respect to this device only (IBV_ATOMIC_HCA).
    pub atomic_cap: AtomicCap,
}

/// The vendor id xroce reports: 0xFFFFFF is no company's OUI (its first octet has the
/// individual/group bit set, which the IEEE never assigns to a company), so no tool mistakes
/// xroce for a Mellanox (0x02c9) or Amazon EFA (0x1d0f) device and applies their quirks. rxe,
/// also nobody's hardware, reports the same value (`RXE_VENDOR_ID`).
pub const VENDOR_ID: u32 = 0xFF_FFFF;

/// The vendor part id: `"xr"` in ASCII, telling xroce from rxe (part 0) under the shared
/// no-vendor id.
pub const VENDOR_PART_ID: u32 = 0x7872;

/// Atomicity guarantee of CMP_SWAP/FETCH_ADD (`enum ibv_atomic_cap`).
///
/// xroce runs an atomic under the lock of the target region's bytes, which every engine shard
/// of the device takes, so atomics through this device are atomic with each other. A CPU store
/// to the region does not take part (nor would another device's), so `GLOB` would be a lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicCap {
    /// Atomic among operations through this device (`IBV_ATOMIC_HCA`, what rxe also
    /// reports).
    Hca = 1,
}

impl AtomicCap {
    /// The name ibv_devinfo prints.
    pub fn name(self) -> &'static str {
        match self {
            AtomicCap::Hca => "ATOMIC_HCA",
        }
    }
}

/// The limits xroce enforces: the engine's, which this layer checks first and reports.
pub use crate::engine::limits;

impl DeviceAttr {
    /// The attributes of a device on interface `net`.
    pub fn for_netdev(net: &NetdevInfo) -> DeviceAttr {
        let guid = node_guid(net.mac);
        DeviceAttr {
            fw_ver: env!("CARGO_PKG_VERSION").to_string(),
            node_guid: guid,
            sys_image_guid: guid,
            vendor_id: VENDOR_ID,
            vendor_part_id: VENDOR_PART_ID,
            hw_ver: 0,
            phys_port_cnt: 1,
            max_mr_size: limits::MAX_MR_SIZE,
            page_size_cap: !0xfff,
            max_qp: limits::MAX_QP,
            max_qp_wr: limits::MAX_QP_WR,
            max_sge: limits::MAX_SGE,
            max_cq: limits::MAX_CQ,
            max_cqe: limits::MAX_CQE,
            max_mr: limits::MAX_MR,
            max_pd: limits::MAX_PD,
            max_qp_rd_atom: limits::MAX_RD_ATOMIC,
            max_qp_init_rd_atom: limits::MAX_RD_ATOMIC,
            max_inline_data: limits::MAX_INLINE_DATA,
            max_ah: limits::MAX_AH,
            max_srq: limits::MAX_SRQ,
            max_srq_wr: limits::MAX_SRQ_WR,
            max_srq_sge: limits::MAX_SRQ_SGE,
            max_mw: limits::MAX_MW,
            atomic_cap: AtomicCap::Hca,
        }
    }
}

/// The modified EUI-64 of a MAC (flip the universal/local bit, insert ff:fe), as a GUID.
pub fn node_guid(mac: MacAddr) -> u64 {
    let m = mac.0;
    u64::from_be_bytes([m[0] ^ 0x02, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]])
}

/// Formats a GUID the way ibv_devinfo does: `xxxx:xxxx:xxxx:xxxx`.
pub fn format_guid(guid: u64) -> String {
    let b = guid.to_be_bytes();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

/// Logical state of a port (`enum ibv_port_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    /// The link is down.
    Down = 1,
    /// The link is up and traffic can flow (RoCE has no subnet manager: Active at once).
    Active = 4,
}

impl PortState {
    /// The name ibv_devinfo prints.
    pub fn name(self) -> &'static str {
        match self {
            PortState::Down => "PORT_DOWN",
            PortState::Active => "PORT_ACTIVE",
        }
    }
}

/// Attributes of the device's one port (`struct ibv_port_attr`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortAttr {
    /// Logical port state, from the interface's operational state.
    pub state: PortState,
    /// Largest IB MTU the port supports.
    pub max_mtu: Mtu,
    /// IB MTU in use: the largest that fits the link MTU minus 80 bytes.
    pub active_mtu: Mtu,
    /// The link (IP) MTU of the interface.
    pub link_mtu: u32,
    /// Entries in the GID table.
    pub gid_tbl_len: u32,
    /// Entries in the P_Key table (1: the default 0xFFFF).
    pub pkey_tbl_len: u16,
    /// Largest message size.
    pub max_msg_sz: u32,
    /// Always Ethernet: this is RoCE.
    pub link_layer: LinkLayer,
}

/// The link layer of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// RoCE: Ethernet (no LIDs; addressing by GID).
    Ethernet,
}

impl PortAttr {
    /// The port attributes of a device on interface `net`. A link too small for RoCE (IP MTU
    /// under 336 bytes) reports an active MTU of 256 and a port that is down.
    pub fn for_netdev(net: &NetdevInfo) -> PortAttr {
        let active = net.active_mtu();
        PortAttr {
            state: if net.is_active() && active.is_some() {
                PortState::Active
            } else {
                PortState::Down
            },
            // Like rxe: the port supports 4096; the link MTU decides the active one.
            max_mtu: Mtu::Mtu4096,
            active_mtu: active.unwrap_or(Mtu::Mtu256),
            link_mtu: net.mtu,
            gid_tbl_len: net.gid_table().len() as u32,
            pkey_tbl_len: 1,
            max_msg_sz: limits::MAX_MSG_SZ,
            link_layer: LinkLayer::Ethernet,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_is_modified_eui64_of_mac() {
        let guid = node_guid(MacAddr([0x02, 0xfc, 0x00, 0x00, 0x00, 0x01]));
        assert_eq!(format_guid(guid), "00fc:00ff:fe00:0001");
    }
}
