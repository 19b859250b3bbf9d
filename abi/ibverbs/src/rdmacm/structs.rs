//! The `#[repr(C)]` structs of `<rdma/rdma_cma.h>` (and `<infiniband/sa.h>`'s path record)
//! that programs read and write directly, laid out as rdma-core 44 lays them out on x86_64
//! (docs/rdmacm-abi.md §2; `tests/layout_rdmacm_c.rs` checks every field against gcc).
//!
//! C unions are spelled as their largest member (`sockaddr_storage` for the address unions)
//! or as a Rust `union` where both members matter (`rdma_cm_event::param`). `union ibv_gid`
//! holds a 64-bit member in C, so structs that contain one are 8-aligned: the explicit
//! `_pad` fields and `align(8)` keep Rust's `[u8; 16]` GIDs at the same offsets.

use std::ffi::{c_char, c_int, c_void};

use crate::objects::{ibv_comp_channel, ibv_context, ibv_cq, ibv_pd, ibv_qp, ibv_srq};
use crate::structs::{ibv_ah_attr, ibv_gid};

/// `enum rdma_port_space`: `RDMA_PS_IPOIB`.
pub const RDMA_PS_IPOIB: u32 = 0x0002;
/// `RDMA_PS_TCP`: reliable connected (RC) ids.
pub const RDMA_PS_TCP: u32 = 0x0106;
/// `RDMA_PS_UDP`: unreliable datagram (UD) ids.
pub const RDMA_PS_UDP: u32 = 0x0111;
/// `RDMA_PS_IB`: any QP type, IB addressing.
pub const RDMA_PS_IB: u32 = 0x013f;

/// `rdma_set_option` level `RDMA_OPTION_ID` and its options.
pub const RDMA_OPTION_ID: c_int = 0;
/// `RDMA_OPTION_ID_TOS` (`uint8_t`).
pub const RDMA_OPTION_ID_TOS: c_int = 0;
/// `RDMA_OPTION_ID_REUSEADDR` (`int`).
pub const RDMA_OPTION_ID_REUSEADDR: c_int = 1;
/// `RDMA_OPTION_ID_AFONLY` (`int`).
pub const RDMA_OPTION_ID_AFONLY: c_int = 2;
/// `RDMA_OPTION_ID_ACK_TIMEOUT` (`uint8_t`).
pub const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
/// Level `RDMA_OPTION_IB`.
pub const RDMA_OPTION_IB: c_int = 1;
/// `RDMA_OPTION_IB_PATH`.
pub const RDMA_OPTION_IB_PATH: c_int = 1;

/// `rdma_addrinfo::ai_flags`.
pub const RAI_PASSIVE: c_int = 1;
/// Node is a numeric address.
pub const RAI_NUMERICHOST: c_int = 2;
/// Do not resolve a route.
pub const RAI_NOROUTE: c_int = 4;
/// `ai_family` is given.
pub const RAI_FAMILY: c_int = 8;

/// `AF_IB`: InfiniBand addresses (`struct sockaddr_ib`), not meaningful on RoCE.
pub const AF_IB: c_int = 27;

/// "The device's maximum" in `rdma_conn_param`'s depths (librdmacm's `RDMA_MAX_RESP_RES`,
/// `RDMA_MAX_INIT_DEPTH`).
pub const RDMA_MAX_RESP_RES: u8 = 0xff;

/// `struct rdma_event_channel`: just the fd programs poll.
#[repr(C)]
#[derive(Debug)]
pub struct rdma_event_channel {
    /// Readable while an event is queued.
    pub fd: c_int,
}

/// `struct rdma_ib_addr`: the GIDs and P_Key of an id (RoCE: GIDs from the IP addresses).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default)]
pub struct rdma_ib_addr {
    /// Source GID.
    pub sgid: ibv_gid,
    /// Destination GID.
    pub dgid: ibv_gid,
    /// P_Key, network order.
    pub pkey: u16,
    pub(crate) _pad: [u8; 6],
}

/// `struct rdma_addr`: both addresses of an id (unions of `sockaddr*`, here as their
/// `sockaddr_storage` member) and the IB view.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addr {
    /// `src_addr` / `src_sin` / `src_sin6` / `src_storage`.
    pub src_storage: libc::sockaddr_storage,
    /// `dst_addr` / `dst_sin` / `dst_sin6` / `dst_storage`.
    pub dst_storage: libc::sockaddr_storage,
    /// `addr.ibaddr`.
    pub ibaddr: rdma_ib_addr,
}

/// `struct ibv_sa_path_rec` (`<infiniband/sa.h>`), IBTA 15.2.5.16's PathRecord; multi-byte
/// fields are network order.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_sa_path_rec {
    /// Destination GID.
    pub dgid: ibv_gid,
    /// Source GID.
    pub sgid: ibv_gid,
    /// 0 on RoCE.
    pub dlid: u16,
    /// 0 on RoCE.
    pub slid: u16,
    /// Raw traffic flag.
    pub raw_traffic: c_int,
    /// Flow label.
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    pub(crate) _pad1: [u8; 2],
    /// Reversible path.
    pub reversible: c_int,
    /// Number of paths.
    pub numb_path: u8,
    pub(crate) _pad2: u8,
    /// P_Key.
    pub pkey: u16,
    /// Service level.
    pub sl: u8,
    /// MTU selector.
    pub mtu_selector: u8,
    /// Path MTU (IB MTU enum).
    pub mtu: u8,
    /// Rate selector.
    pub rate_selector: u8,
    /// Rate.
    pub rate: u8,
    /// Packet lifetime selector.
    pub packet_life_time_selector: u8,
    /// Packet lifetime exponent.
    pub packet_life_time: u8,
    /// Preference.
    pub preference: u8,
}

/// `struct rdma_route`: addresses and path records.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_route {
    /// The addresses.
    pub addr: rdma_addr,
    /// `num_paths` records (the library's memory).
    pub path_rec: *mut ibv_sa_path_rec,
    /// How many.
    pub num_paths: c_int,
}

/// `struct rdma_cm_id` (416 bytes): the part of an id programs see.
#[repr(C)]
pub struct rdma_cm_id {
    /// The device context (xroce's libibverbs' own `ibv_context`).
    pub verbs: *mut ibv_context,
    /// The channel events go to.
    pub channel: *mut rdma_event_channel,
    /// The program's.
    pub context: *mut c_void,
    /// The QP `rdma_create_qp` made.
    pub qp: *mut ibv_qp,
    /// Addresses and path.
    pub route: rdma_route,
    /// `enum rdma_port_space`.
    pub ps: u32,
    /// The device's port (1).
    pub port_num: u8,
    /// Synchronous ids: the last event.
    pub event: *mut rdma_cm_event,
    /// Completion channel of the CQ the library made for sends.
    pub send_cq_channel: *mut ibv_comp_channel,
    /// CQ for sends (the library's, or the program's).
    pub send_cq: *mut ibv_cq,
    /// Completion channel of the receive CQ.
    pub recv_cq_channel: *mut ibv_comp_channel,
    /// CQ for receives.
    pub recv_cq: *mut ibv_cq,
    /// SRQ, if any.
    pub srq: *mut ibv_srq,
    /// The device's PD the library shares between its ids.
    pub pd: *mut ibv_pd,
    /// `enum ibv_qp_type`.
    pub qp_type: u32,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdma_conn_param {
    /// Private data to send / received.
    pub private_data: *const c_void,
    /// Its length.
    pub private_data_len: u8,
    /// RDMA READ/atomic requests the peer may have outstanding here.
    pub responder_resources: u8,
    /// RDMA READ/atomic requests we may have outstanding at the peer.
    pub initiator_depth: u8,
    /// End-to-end flow control.
    pub flow_control: u8,
    /// Transport retries (3 bits; ignored on accept).
    pub retry_count: u8,
    /// RNR retries (3 bits).
    pub rnr_retry_count: u8,
    /// The QP uses an SRQ.
    pub srq: u8,
    pub(crate) _pad: u8,
    /// The QP number, when the id has no QP.
    pub qp_num: u32,
}

/// `struct rdma_ud_param`: what a UD id's ESTABLISHED (or CONNECT_REQUEST) names.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdma_ud_param {
    /// Private data received.
    pub private_data: *const c_void,
    /// Its length.
    pub private_data_len: u8,
    pub(crate) _pad: [u8; 7],
    /// The address of the peer, for `ibv_create_ah`.
    pub ah_attr: ibv_ah_attr,
    /// The peer's QP.
    pub qp_num: u32,
    /// Its Q_Key.
    pub qkey: u32,
}

/// `rdma_cm_event::param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    /// Connected ids.
    pub conn: rdma_conn_param,
    /// UD ids.
    pub ud: rdma_ud_param,
}

/// `struct rdma_cm_event` (80 bytes).
#[repr(C)]
pub struct rdma_cm_event {
    /// The id (on CONNECT_REQUEST: the new one).
    pub id: *mut rdma_cm_id,
    /// CONNECT_REQUEST: the listener.
    pub listen_id: *mut rdma_cm_id,
    /// `enum rdma_cm_event_type`.
    pub event: u32,
    /// 0, a negative errno, or a CM reason.
    pub status: c_int,
    /// Connection or UD parameters.
    pub param: rdma_cm_event_param,
}

/// `struct rdma_addrinfo` (96 bytes).
#[repr(C)]
#[derive(Debug)]
pub struct rdma_addrinfo {
    /// `RAI_*`.
    pub ai_flags: c_int,
    /// `AF_INET`, `AF_INET6` (or `AF_IB`).
    pub ai_family: c_int,
    /// `enum ibv_qp_type`.
    pub ai_qp_type: c_int,
    /// `enum rdma_port_space`.
    pub ai_port_space: c_int,
    /// Length of `ai_src_addr`.
    pub ai_src_len: libc::socklen_t,
    /// Length of `ai_dst_addr`.
    pub ai_dst_len: libc::socklen_t,
    /// Source address.
    pub ai_src_addr: *mut libc::sockaddr,
    /// Destination address.
    pub ai_dst_addr: *mut libc::sockaddr,
    /// Source name.
    pub ai_src_canonname: *mut c_char,
    /// Destination name.
    pub ai_dst_canonname: *mut c_char,
    /// Length of `ai_route`.
    pub ai_route_len: usize,
    /// Path records (ib_acm).
    pub ai_route: *mut c_void,
    /// Length of `ai_connect`.
    pub ai_connect_len: usize,
    /// Private data for the connect.
    pub ai_connect: *mut c_void,
    /// Next entry.
    pub ai_next: *mut rdma_addrinfo,
}
