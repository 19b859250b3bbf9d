//! Public value types of the engine API: handles, access flags, work requests, work
//! completions, QP attributes and the typed errors of API misuse.
use std::fmt;
use std::net::IpAddr;

use crate::wire::Mtu;

/// A protection domain handle (`ibv_pd`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PdId(pub u32);

/// A completion queue handle (`ibv_cq`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CqId(pub u32);

/// A shared receive queue handle (`ibv_srq`): shared by the device's shards, like CQs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SrqId(pub u32);

/// The attributes of a shared receive queue (`ibv_srq_attr`; IBTA 10.2.9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SrqAttr {
    /// Receive WRs it holds at most.
    pub max_wr: u32,
    /// Scatter/gather entries per receive WR.
    pub max_sge: u32,
    /// The limit: when the WRs it holds fall below it, [`Event::SrqLimitReached`] is raised
    /// once and the limit goes back to 0 (disarmed). 0 = not armed.
    pub srq_limit: u32,
}

bitflags::bitflags! {
    /// Which attributes `modify_srq` sets (`ibv_srq_attr_mask` values).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct SrqAttrMask: u32 {
        /// `IBV_SRQ_MAX_WR`: resize the queue.
        const MAX_WR = 1;
        /// `IBV_SRQ_LIMIT`: arm (or, with 0, disarm) the limit event.
        const LIMIT = 1 << 1;
    }
}

bitflags::bitflags! {
    /// Memory region and QP access flags, with the bit values of `ibv_access_flags`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct Access: u32 {
        /// The local HCA may write (receive buffers, READ and atomic results).
        const LOCAL_WRITE = 1;
        /// A remote peer may RDMA WRITE.
        const REMOTE_WRITE = 1 << 1;
        /// A remote peer may RDMA READ.
        const REMOTE_READ = 1 << 2;
        /// A remote peer may run atomics.
        const REMOTE_ATOMIC = 1 << 3;
        /// Memory windows may be bound to the region (`IBV_ACCESS_MW_BIND`, IBTA 10.6.7.2
        /// C10-73); meaningless on a QP or a window.
        const MW_BIND = 1 << 4;
    }
}

impl Access {
    /// No access beyond local read.
    pub const NONE: Access = Access::empty();
    /// Everything.
    pub const ALL: Access = Access::all();
    /// The rights a memory window can grant: the remote ones (`ibv_mw_bind_info`'s
    /// `mw_access_flags`; zero-based windows are not supported).
    pub const WINDOW_RIGHTS: Access = Access::REMOTE_WRITE
        .union(Access::REMOTE_READ)
        .union(Access::REMOTE_ATOMIC);
}

/// The two kinds of memory window (`ibv_mw_type`, IBTA 10.6.7.1): a type 1 window is bound
/// by the Bind Memory Window verb and serves every QP of its PD; a type 2 window (IBTA's
/// type 2B) is bound by a BIND_MW work request, serves only the QP that bound it, and is
/// invalidated by LOCAL_INV or a peer's SEND_WITH_INV.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MwType {
    /// Bound by [`Engine::bind_mw`](super::Engine::bind_mw) (`ibv_bind_mw`).
    Type1 = 1,
    /// Bound by a [`WrOp::BindMw`] work request, QP-associated.
    Type2 = 2,
}

/// A memory window handle: the index part of its R_Keys (`rkey >> 8`); the low byte of the
/// R_Key changes with every bind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MwId(pub u32);

/// What a bind makes a window cover (`ibv_mw_bind_info`): `length` bytes at `addr` of the
/// MR `mr_lkey` (addresses in the MR's iova space: windows are not zero-based), with the
/// rights `access` (a subset of [`Access::WINDOW_RIGHTS`]). Length 0 unbinds a type 1 window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MwBindInfo {
    /// Local key of the region the window lies in (it needs [`Access::MW_BIND`]).
    pub mr_lkey: u32,
    /// First byte of the window.
    pub addr: u64,
    /// Bytes covered.
    pub length: u64,
    /// What a remote peer may do through the window.
    pub access: Access,
}

/// The R_Key after `rkey` for the next bind of a window: the same index, the next key byte
/// (what libibverbs' `ibv_inc_rkey` computes).
pub fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xFF) | (rkey.wrapping_add(1) & 0xFF)
}

/// QP transport service type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable connected (IBTA 9.8): SEND and RDMA WRITE only, no ACKs, no retries; a
    /// message lost in part is lost whole.
    Uc,
    /// Unreliable datagram.
    Ud,
}

impl QpType {
    /// The libibverbs spelling ("RC", "UC", "UD").
    pub fn name(self) -> &'static str {
        match self {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
        }
    }

    /// A connected service (RC or UC): one remote QP set by `modify_qp`.
    pub fn is_connected(self) -> bool {
        matches!(self, QpType::Rc | QpType::Uc)
    }
}

/// QP states (IBTA 10.3.1), in `ibv_qp_state` order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QpState {
    /// Just created or reset: no traffic.
    Reset,
    /// Initialized: receives may be posted, nothing is processed.
    Init,
    /// Ready to receive: the responder runs.
    Rtr,
    /// Ready to send: requester and responder run.
    Rts,
    /// Send queue drained: no new send WQE is started.
    Sqd,
    /// Send queue error (UD only in practice).
    Sqe,
    /// Error: every WR completes with WR_FLUSH_ERR.
    Err,
}

impl QpState {
    /// All states, in table order.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];
}

bitflags::bitflags! {
    /// Which QP attributes a `modify_qp` call sets (bit values of `ibv_qp_attr_mask`; the
    /// flag names are the libibverbs names without `IBV_QP_`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        /// `IBV_QP_STATE`
        const STATE = 1 << 0;
        /// `IBV_QP_CUR_STATE`
        const CUR_STATE = 1 << 1;
        /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `IBV_QP_ACCESS_FLAGS`
        const ACCESS_FLAGS = 1 << 3;
        /// `IBV_QP_PKEY_INDEX`
        const PKEY_INDEX = 1 << 4;
        /// `IBV_QP_PORT`
        const PORT = 1 << 5;
        /// `IBV_QP_QKEY`
        const QKEY = 1 << 6;
        /// `IBV_QP_AV`
        const AV = 1 << 7;
        /// `IBV_QP_PATH_MTU`
        const PATH_MTU = 1 << 8;
        /// `IBV_QP_TIMEOUT`
        const TIMEOUT = 1 << 9;
        /// `IBV_QP_RETRY_CNT`
        const RETRY_CNT = 1 << 10;
        /// `IBV_QP_RNR_RETRY`
        const RNR_RETRY = 1 << 11;
        /// `IBV_QP_RQ_PSN`
        const RQ_PSN = 1 << 12;
        /// `IBV_QP_MAX_QP_RD_ATOMIC`
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `IBV_QP_ALT_PATH`
        const ALT_PATH = 1 << 14;
        /// `IBV_QP_MIN_RNR_TIMER`
        const MIN_RNR_TIMER = 1 << 15;
        /// `IBV_QP_SQ_PSN`
        const SQ_PSN = 1 << 16;
        /// `IBV_QP_MAX_DEST_RD_ATOMIC`
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `IBV_QP_PATH_MIG_STATE`
        const PATH_MIG_STATE = 1 << 18;
        /// `IBV_QP_CAP`
        const CAP = 1 << 19;
        /// `IBV_QP_DEST_QPN`
        const DEST_QPN = 1 << 20;
    }
}

impl QpAttrMask {
    /// No attribute.
    pub const EMPTY: QpAttrMask = QpAttrMask::empty();

    /// The libibverbs names of the bits set, e.g. `"AV|PATH_MTU"`; unnamed bits follow in hex.
    pub fn names(self) -> String {
        let mut parts: Vec<String> = self
            .iter_names()
            .map(|(name, _)| name.to_string())
            .collect();
        let unnamed = self.bits() & !QpAttrMask::all().bits();
        if unnamed != 0 {
            parts.push(format!("{unnamed:#x}"));
        }
        parts.join("|")
    }
}

impl fmt::Display for QpAttrMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.names())
    }
}

/// Where a QP's packets go: the RoCEv2 address vector (`ibv_ah_attr` with its GRH).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AddressVector {
    /// Destination MAC (resolved by the caller: ARP/ND is not the engine's job).
    pub dest_mac: [u8; 6],
    /// Destination IP (the peer's GID as an address; IPv4-mapped GIDs are IPv4).
    pub dest_ip: IpAddr,
    /// Index into the engine's source GID table.
    pub sgid_index: u8,
    /// IPv4 TTL / IPv6 hop limit (GRH hop_limit).
    pub hop_limit: u8,
    /// IPv4 TOS / IPv6 traffic class.
    pub traffic_class: u8,
    /// IPv6 flow label, 20 bits (ignored for IPv4).
    pub flow_label: u32,
    /// UDP source port; `None` = rxe's rule from the two QPNs
    /// ([`crate::wire::rxe_udp_source_port`]).
    pub udp_src_port: Option<u16>,
    /// 802.1Q VLAN id (0..=4094), if the port is on a VLAN.
    pub vlan_id: Option<u16>,
}

impl AddressVector {
    /// An address vector with rxe-like defaults (hop limit 64, TC 0, GID index 0).
    pub fn new(dest_mac: [u8; 6], dest_ip: IpAddr) -> AddressVector {
        AddressVector {
            dest_mac,
            dest_ip,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            udp_src_port: None,
            vlan_id: None,
        }
    }
}

/// The attributes of a QP (`ibv_qp_attr`). `modify_qp` reads the fields named by the mask;
/// `query_qp` returns what is in force.
#[derive(Clone, Debug, PartialEq)]
pub struct QpAttr {
    /// Target state (`STATE`).
    pub qp_state: QpState,
    /// Asserted current state (`CUR_STATE`).
    pub cur_qp_state: QpState,
    /// Path MTU (`PATH_MTU`).
    pub path_mtu: Mtu,
    /// UD Q_Key (`QKEY`).
    pub qkey: u32,
    /// First PSN the responder expects (`RQ_PSN`).
    pub rq_psn: u32,
    /// First PSN the requester sends (`SQ_PSN`).
    pub sq_psn: u32,
    /// Remote QPN (`DEST_QPN`).
    pub dest_qp_num: u32,
    /// What remote peers may do through this QP (`ACCESS_FLAGS`).
    pub qp_access_flags: Access,
    /// Primary path (`AV`).
    pub ah_attr: Option<AddressVector>,
    /// P_Key index (`PKEY_INDEX`); the table holds only 0xFFFF at index 0.
    pub pkey_index: u16,
    /// Port number (`PORT`); only port 1 exists.
    pub port_num: u8,
    /// Local ACK timeout exponent: 4.096 us x 2^timeout, 0 = none (`TIMEOUT`).
    pub timeout: u8,
    /// Transport retries (`RETRY_CNT`), 0..=7.
    pub retry_cnt: u8,
    /// RNR retries (`RNR_RETRY`), 0..=7, 7 = infinite.
    pub rnr_retry: u8,
    /// RNR NAK timer code this responder advertises (`MIN_RNR_TIMER`), 0..=31.
    pub min_rnr_timer: u8,
    /// Outstanding READ/ATOMIC as initiator (`MAX_QP_RD_ATOMIC`).
    pub max_rd_atomic: u8,
    /// Outstanding READ/ATOMIC as responder (`MAX_DEST_RD_ATOMIC`).
    pub max_dest_rd_atomic: u8,
    /// `EN_SQD_ASYNC_NOTIFY`.
    pub en_sqd_async_notify: bool,
}

impl Default for QpAttr {
    fn default() -> QpAttr {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu1024,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: Access::NONE,
            ah_attr: None,
            pkey_index: 0,
            port_num: 1,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            en_sqd_async_notify: false,
        }
    }
}

/// Queue sizes of a QP (`ibv_qp_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send WR.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive WR.
    pub max_recv_sge: u32,
    /// Largest inline send.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> QpCaps {
        QpCaps {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 16,
            max_recv_sge: 16,
            max_inline_data: 256,
        }
    }
}

/// Arguments of `create_qp` (`ibv_qp_init_attr`).
#[derive(Clone, Copy, Debug)]
pub struct QpInit {
    /// RC or UD.
    pub qp_type: QpType,
    /// Protection domain.
    pub pd: PdId,
    /// CQ for send completions.
    pub send_cq: CqId,
    /// CQ for receive completions.
    pub recv_cq: CqId,
    /// Queue sizes.
    pub caps: QpCaps,
    /// If false, only WRs with `SendFlags::SIGNALED` produce successful completions.
    pub sq_sig_all: bool,
    /// Take receives from this shared receive queue instead of the QP's own (IBTA 10.2.9);
    /// `caps.max_recv_wr` and `max_recv_sge` are then unused.
    pub srq: Option<SrqId>,
}

/// One scatter/gather element: `length` bytes at `addr` inside the MR `lkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Address in the MR's iova space.
    pub addr: u64,
    /// Byte count.
    pub length: u32,
    /// Local key of the MR.
    pub lkey: u32,
}

bitflags::bitflags! {
    /// Send WR flags (`ibv_send_flags` values).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Wait for every earlier READ/ATOMIC to complete first.
        const FENCE = 1;
        /// Produce a completion on success.
        const SIGNALED = 1 << 1;
        /// Set the BTH SE bit on the last packet.
        const SOLICITED = 1 << 2;
        /// Copy the data at post time (the SGEs may be reused at once).
        const INLINE = 1 << 3;
    }
}

/// What a send WR does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WrOp {
    /// SEND.
    Send,
    /// SEND with 32-bit immediate data.
    SendWithImm {
        /// Immediate data (host order; sent big-endian).
        imm: u32,
    },
    /// SEND that invalidates `rkey` at the responder.
    SendWithInv {
        /// The R_Key to invalidate.
        rkey: u32,
    },
    /// RDMA WRITE.
    Write {
        /// Remote iova.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// RDMA WRITE that also consumes a receive WQE with immediate data.
    WriteWithImm {
        /// Remote iova.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ into the local SGEs.
    Read {
        /// Remote iova.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// 64-bit compare and swap; the original value lands in the (8-byte) SGE.
    CompareSwap {
        /// Remote iova, 8-byte aligned.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value to compare with.
        compare: u64,
        /// Value stored if equal.
        swap: u64,
    },
    /// 64-bit fetch and add; the original value lands in the (8-byte) SGE.
    FetchAdd {
        /// Remote iova, 8-byte aligned.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Addend.
        add: u64,
    },
    /// Bind a type 2 memory window (`IBV_WR_BIND_MW`, IBTA 10.6.7.2): a local operation,
    /// executed in send queue order, that gives the window the R_Key `rkey` (its index part
    /// must be the window's) and the range `bind`. No SGEs.
    BindMw {
        /// The window.
        mw: MwId,
        /// The R_Key the window takes (usually [`inc_rkey`] of its current one).
        rkey: u32,
        /// What it covers.
        bind: MwBindInfo,
    },
    /// Invalidate an R_Key on this device (`IBV_WR_LOCAL_INV`, IBTA 10.6.7.3): a type 2
    /// window becomes free (unbound) or an MR's R_Key stops working. No SGEs.
    LocalInv {
        /// The R_Key.
        rkey: u32,
    },
}

impl WrOp {
    /// True for RDMA READ and the atomics (the ops bounded by max_rd_atomic).
    pub fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            WrOp::Read { .. } | WrOp::CompareSwap { .. } | WrOp::FetchAdd { .. }
        )
    }

    /// True for the operations the send queue executes locally, with no packet: bind and
    /// local invalidate.
    pub fn is_local(&self) -> bool {
        matches!(self, WrOp::BindMw { .. } | WrOp::LocalInv { .. })
    }

    /// True for the atomics.
    pub fn is_atomic(&self) -> bool {
        matches!(self, WrOp::CompareSwap { .. } | WrOp::FetchAdd { .. })
    }

    /// The variant's name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            WrOp::Send => "Send",
            WrOp::SendWithImm { .. } => "SendWithImm",
            WrOp::SendWithInv { .. } => "SendWithInv",
            WrOp::Write { .. } => "Write",
            WrOp::WriteWithImm { .. } => "WriteWithImm",
            WrOp::Read { .. } => "Read",
            WrOp::CompareSwap { .. } => "CompareSwap",
            WrOp::FetchAdd { .. } => "FetchAdd",
            WrOp::BindMw { .. } => "BindMw",
            WrOp::LocalInv { .. } => "LocalInv",
        }
    }

    /// The completion opcode of this operation.
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            WrOp::Send | WrOp::SendWithImm { .. } | WrOp::SendWithInv { .. } => WcOpcode::Send,
            WrOp::Write { .. } | WrOp::WriteWithImm { .. } => WcOpcode::RdmaWrite,
            WrOp::Read { .. } => WcOpcode::RdmaRead,
            WrOp::CompareSwap { .. } => WcOpcode::CompSwap,
            WrOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            WrOp::BindMw { .. } => WcOpcode::BindMw,
            WrOp::LocalInv { .. } => WcOpcode::LocalInv,
        }
    }
}

/// UD destination of a send WR (`ibv_ah` + remote QPN and Q_Key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdDest {
    /// Where to send.
    pub av: AddressVector,
    /// Remote QPN.
    pub remote_qpn: u32,
    /// Remote Q_Key; if its top bit is set the QP's own Q_Key is sent (IBTA 3.5.3).
    pub remote_qkey: u32,
}

/// A send work request (`ibv_send_wr`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// Caller's id, returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: WrOp,
    /// Local data (gathered for SEND/WRITE, scattered into for READ/atomics).
    pub sg_list: Vec<Sge>,
    /// Flags.
    pub flags: SendFlags,
    /// UD only: where to send.
    pub ud: Option<UdDest>,
}

impl SendWr {
    /// The WR with its SGE list borrowed, as [`Engine::post_send_ref`](super::Engine::post_send_ref) takes it.
    pub fn borrowed(&self) -> SendWrRef<'_> {
        SendWrRef {
            wr_id: self.wr_id,
            op: self.op,
            sg_list: &self.sg_list,
            flags: self.flags,
            ud: self.ud,
        }
    }
}

/// A send work request whose SGE list is borrowed: posting it through
/// [`Engine::post_send_ref`](super::Engine::post_send_ref) needs no `Vec` per WR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWrRef<'a> {
    /// Caller's id, returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: WrOp,
    /// Local data (gathered for SEND/WRITE, scattered into for READ/atomics).
    pub sg_list: &'a [Sge],
    /// Flags.
    pub flags: SendFlags,
    /// UD only: where to send.
    pub ud: Option<UdDest>,
}

/// A receive work request (`ibv_recv_wr`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvWr {
    /// Caller's id, returned in the completion.
    pub wr_id: u64,
    /// Where incoming data goes, in order.
    pub sg_list: Vec<Sge>,
}

/// Completion status (`ibv_wc_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// Success.
    Success,
    /// Local length error (message larger than the receive buffer).
    LocLenErr,
    /// Local QP operation error (also a LOCAL_INV that cannot be done).
    LocQpOpErr,
    /// Local protection error (bad lkey or SGE out of bounds).
    LocProtErr,
    /// Flushed: the QP is in the error state.
    WrFlushErr,
    /// A memory window bind failed its checks (IBTA 10.6.7.2): the QP enters ERR.
    MwBindErr,
    /// Bad response (unexpected opcode from the responder).
    BadRespErr,
    /// Local access error.
    LocAccessErr,
    /// Responder NAKed with Invalid Request.
    RemInvReqErr,
    /// Responder NAKed with Remote Access Error.
    RemAccessErr,
    /// Responder NAKed with Remote Operational Error.
    RemOpErr,
    /// Transport retries exhausted (timeouts or sequence NAKs).
    RetryExcErr,
    /// RNR retries exhausted.
    RnrRetryExcErr,
}

impl WcStatus {
    /// The `enum ibv_wc_status` number (what `ibv_rc_pingpong` and rping print).
    pub fn code(self) -> u32 {
        match self {
            WcStatus::Success => 0,
            WcStatus::LocLenErr => 1,
            WcStatus::LocQpOpErr => 2,
            WcStatus::LocProtErr => 4,
            WcStatus::WrFlushErr => 5,
            WcStatus::MwBindErr => 6,
            WcStatus::BadRespErr => 7,
            WcStatus::LocAccessErr => 8,
            WcStatus::RemInvReqErr => 9,
            WcStatus::RemAccessErr => 10,
            WcStatus::RemOpErr => 11,
            WcStatus::RetryExcErr => 12,
            WcStatus::RnrRetryExcErr => 13,
        }
    }

    /// The `ibv_wc_status_str` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
        }
    }
}

/// Completion opcode (`ibv_wc_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// A SEND finished.
    Send,
    /// An RDMA WRITE finished.
    RdmaWrite,
    /// An RDMA READ finished.
    RdmaRead,
    /// A compare-and-swap finished.
    CompSwap,
    /// A fetch-and-add finished.
    FetchAdd,
    /// A memory window bind finished.
    BindMw,
    /// A local invalidate finished.
    LocalInv,
    /// A SEND arrived.
    Recv,
    /// An RDMA WRITE with immediate arrived.
    RecvRdmaWithImm,
}

/// A work completion (`ibv_wc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wc {
    /// The WR's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What finished.
    pub opcode: WcOpcode,
    /// Bytes received (receive completions; READ length for READs).
    pub byte_len: u32,
    /// Immediate data, if the message carried one.
    pub imm_data: Option<u32>,
    /// The R_Key the peer invalidated (SEND_WITH_INV).
    pub invalidated_rkey: Option<u32>,
    /// Local QPN.
    pub qp_num: u32,
    /// Remote QPN (UD: from the DETH; RC: the connected QP).
    pub src_qp: u32,
    /// UD: a 40-byte GRH precedes the payload in the buffer.
    pub grh_present: bool,
    /// UD: the sender's IP address.
    pub sender_ip: Option<IpAddr>,
    /// UD: the sender's MAC address.
    pub sender_mac: Option<[u8; 6]>,
}

impl Wc {
    /// A completion array's contents before the first poll fills it (`poll_cq` takes
    /// `&mut [Wc]`).
    pub const EMPTY: Wc = Wc {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm_data: None,
        invalidated_rkey: None,
        qp_num: 0,
        src_qp: 0,
        grh_present: false,
        sender_ip: None,
        sender_mac: None,
    };
}

/// Asynchronous events for a completion channel or an async-event fd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A completion was added to a CQ armed with `req_notify_cq`.
    CqNotify(CqId),
    /// A CQ overflowed and lost a completion: it is in the error state and takes no more
    /// completions (IBTA 10.10.2.3 "CQ Error", `IBV_EVENT_CQ_ERR`). Each QP that loses a
    /// completion to it enters the error state and raises [`Event::QpFatal`].
    CqError(CqId),
    /// A QP entered the error state by itself (retry exhaustion, remote error, ...).
    QpFatal(u32),
    /// A QP in SQD has drained its send queue (when `en_sqd_async_notify` was set).
    SqDrained(u32),
    /// An SRQ armed with a limit holds fewer WRs than the limit now (IBTA 11.6.3, the SRQ
    /// affiliated event "SRQ Limit Reached"; `IBV_EVENT_SRQ_LIMIT_REACHED`). Raised once: the
    /// SRQ is disarmed (its limit reads 0) until `modify_srq` arms it again.
    SrqLimitReached(SrqId),
    /// A QP on an SRQ entered the error state and will take no more WQEs from it (IBTA
    /// 11.6.3, "Last WQE Reached"; `IBV_EVENT_QP_LAST_WQE_REACHED`): the WQE it was filling, if
    /// any, is completed, so the application may destroy the QP.
    QpLastWqeReached(u32),
    /// The port (its number) can carry frames again: the interface's link came up
    /// (`IBV_EVENT_PORT_ACTIVE`; an unaffiliated asynchronous event, IBTA 11.6.3). Raised by
    /// the verbs layer, which watches the interface; the engine has no port state.
    PortActive(u8),
    /// The port (its number) cannot carry frames: the interface went down or lost its
    /// carrier (`IBV_EVENT_PORT_ERR`, IBTA 11.6.3). QPs keep their state: RC retries
    /// (IBTA 9.7.6) cover an outage shorter than `retry_cnt` local ACK timeouts, as on rxe.
    PortError(u8),
}

/// API misuse: what a verbs call returns when it cannot be done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// No QP with that number.
    #[error("no QP with number {0:#x}")]
    UnknownQp(u32),
    /// No CQ with that handle.
    #[error("no CQ {0:?}")]
    UnknownCq(CqId),
    /// No PD with that handle.
    #[error("no PD {0:?}")]
    UnknownPd(PdId),
    /// No MR with that key.
    #[error("no memory region with key {0:#x}")]
    UnknownKey(u32),
    /// No memory window with that handle.
    #[error("no memory window {0:?}")]
    UnknownMw(MwId),
    /// No SRQ with that handle.
    #[error("no SRQ {0:?}")]
    UnknownSrq(SrqId),
    /// A receive WR was posted to a QP that takes its receives from an SRQ (post it to the
    /// SRQ: `ibv_post_recv` fails the same way on such a QP).
    #[error("QP {0:#x} takes its receives from a shared receive queue: post them to the SRQ")]
    ReceivesFromSrq(u32),
    /// The engine already holds the GSI (QP1): there is one per device (IBTA 13.5.1).
    #[error("the GSI (QP1) of this device is open already")]
    GsiExists,
    /// An object is still used (PD with MRs/QPs/SRQs/windows, CQ with QPs, SRQ with QPs,
    /// MR with bound windows).
    #[error("{0} is still in use")]
    InUse(&'static str),
    /// The transition is not in the QP state table.
    #[error("QP state transition {from:?} -> {to:?} is not allowed")]
    InvalidTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// A required attribute was not in the mask.
    #[error("modify_qp {from:?} -> {to:?}: required attribute(s) {missing} missing")]
    MissingAttribute {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// The missing bits.
        missing: QpAttrMask,
    },
    /// An attribute was in the mask that this transition does not accept.
    #[error("modify_qp {from:?} -> {to:?}: attribute(s) {extra} not allowed")]
    AttributeNotAllowed {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// The disallowed bits.
        extra: QpAttrMask,
    },
    /// An attribute's value is out of range or unsupported.
    #[error("modify_qp: attribute {attr}: {reason}")]
    InvalidAttributeValue {
        /// libibverbs name of the attribute.
        attr: &'static str,
        /// Why.
        reason: String,
    },
    /// CUR_STATE did not match the QP's state.
    #[error("modify_qp: CUR_STATE {asserted:?} does not match the QP state {actual:?}")]
    CurrentStateMismatch {
        /// What the caller said.
        asserted: QpState,
        /// What it is.
        actual: QpState,
    },
    /// The queue is full.
    #[error("{0} queue is full")]
    QueueFull(&'static str),
    /// Posting is not allowed in this state.
    #[error("cannot post a {what} WR in state {state:?}")]
    BadState {
        /// send or receive.
        what: &'static str,
        /// QP state.
        state: QpState,
    },
    /// A work request is malformed.
    #[error("invalid work request: {0}")]
    InvalidWr(String),
    /// A request exceeds a limit of the QP or device (inline data over `max_inline_data`,
    /// a CQ resized over `MAX_CQE`).
    #[error("{what} {requested} exceeds the limit {max}")]
    LimitExceeded {
        /// libibverbs name of what was asked for (`max_inline_data`, `cqe`).
        what: &'static str,
        /// What was asked for.
        requested: u64,
        /// The limit.
        max: u64,
    },
    /// `resize_cq` asked for fewer entries than the CQ holds (ibv_resize_cq fails with
    /// EINVAL then: completions are never dropped by a resize).
    #[error("cannot resize a CQ holding {held} completions to {requested} entries")]
    CqTooSmall {
        /// Completions the CQ holds.
        held: usize,
        /// The depth asked for.
        requested: u32,
    },
    /// An MR access check failed for a local operation (mr_read/mr_write).
    #[error("address range {addr:#x}+{len} is outside memory region {key:#x}")]
    OutOfBounds {
        /// Key of the MR.
        key: u32,
        /// Start.
        addr: u64,
        /// Length.
        len: usize,
    },
    /// A configuration or argument value is invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Access rights a memory region may not have (IBTA 10.6.3.1; `ibv_reg_mr` and
    /// `ibv_rereg_mr` fail with EINVAL): see `engine::check_mr_access`.
    #[error("memory region access {access:?}: {reason}")]
    InvalidMrAccess {
        /// The rights asked for.
        access: Access,
        /// The rule they break.
        reason: &'static str,
    },
    /// The operation does not exist on this QP type (IBTA 9.8.1: UC has neither RDMA READ
    /// nor atomics, nor SEND with invalidate; UD only SENDs).
    #[error("{op} is not supported on a {} QP", qp_type.name())]
    UnsupportedOperation {
        /// The work request's operation (`WrOp` variant name).
        op: &'static str,
        /// The QP's type.
        qp_type: QpType,
    },
    /// An address vector field no frame can carry (checked where the AV is set: `modify_qp`
    /// with `AV`, a UD send's destination, `create_ah`).
    #[error("address vector field {field}: {reason}")]
    InvalidAddressVector {
        /// The field of [`AddressVector`] at fault (`vlan_id`, `flow_label`, ...).
        field: &'static str,
        /// Why.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_values_are_the_libibverbs_ones() {
        // ibv_access_flags
        assert_eq!(Access::LOCAL_WRITE.bits(), 1);
        assert_eq!(Access::REMOTE_WRITE.bits(), 2);
        assert_eq!(Access::REMOTE_READ.bits(), 4);
        assert_eq!(Access::REMOTE_ATOMIC.bits(), 8);
        assert_eq!(Access::MW_BIND.bits(), 16);
        assert_eq!(Access::ALL.bits(), 31);
        assert_eq!(Access::WINDOW_RIGHTS.bits(), 14);
        assert_eq!(inc_rkey(0x1234_56FF), 0x1234_5600);
        assert_eq!(inc_rkey(0x1234_5601), 0x1234_5602);
        assert_eq!(Access::NONE.bits(), 0);
        // ibv_send_flags
        assert_eq!(SendFlags::FENCE.bits(), 1);
        assert_eq!(SendFlags::SIGNALED.bits(), 2);
        assert_eq!(SendFlags::SOLICITED.bits(), 4);
        assert_eq!(SendFlags::INLINE.bits(), 8);
        // ibv_qp_attr_mask: IBV_QP_STATE = 1 << 0 .. IBV_QP_DEST_QPN = 1 << 20, in order.
        let names: Vec<_> = QpAttrMask::all().iter_names().map(|(n, _)| n).collect();
        assert_eq!(names.len(), 21);
        for (bit, (name, flag)) in QpAttrMask::all().iter_names().enumerate() {
            assert_eq!(flag.bits(), 1 << bit, "{name}");
        }
        assert_eq!(QpAttrMask::AV.bits(), 1 << 7);
        assert_eq!(QpAttrMask::MIN_RNR_TIMER.bits(), 1 << 15);
        assert_eq!(QpAttrMask::DEST_QPN.bits(), 1 << 20);
    }

    #[test]
    fn attr_mask_names() {
        assert_eq!(
            (QpAttrMask::AV | QpAttrMask::PATH_MTU).names(),
            "AV|PATH_MTU"
        );
        assert_eq!(QpAttrMask::EMPTY.names(), "");
        let odd = QpAttrMask::STATE | QpAttrMask::from_bits_retain(1 << 22);
        assert_eq!(odd.to_string(), "STATE|0x400000");
    }

    #[test]
    fn mtu_values() {
        for (i, m) in Mtu::ALL.into_iter().enumerate() {
            assert_eq!(m.bytes(), 256 << i);
            assert_eq!(m.ibv_value() as usize, i + 1);
            assert_eq!(Mtu::from_ibv_value(i as u32 + 1), Some(m));
            assert_eq!(Mtu::from_bytes(m.bytes()), Some(m));
        }
        assert_eq!(Mtu::from_bytes(1500), None);
        assert_eq!(Mtu::from_ibv_value(0), None);
        assert_eq!(Mtu::from_ibv_value(6), None);
        assert_eq!(Mtu::default(), Mtu::Mtu1024);
        assert_eq!(Mtu::Mtu2048.to_string(), "2048");
        assert!(Mtu::Mtu256 < Mtu::Mtu4096);
    }
}
