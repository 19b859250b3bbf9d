//! Public value types of the engine API: handles, access flags, work requests, work
//! completions, QP attributes and the typed errors of API misuse.
use std::fmt;
use std::net::IpAddr;

/// A protection domain handle (`ibv_pd`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PdId(pub u32);

/// A completion queue handle (`ibv_cq`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CqId(pub u32);

/// Memory region and QP access flags, with the bit values of `ibv_access_flags`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Access(pub u32);

impl Access {
    /// No access beyond local read.
    pub const NONE: Access = Access(0);
    /// The local HCA may write (receive buffers, READ and atomic results).
    pub const LOCAL_WRITE: Access = Access(1);
    /// A remote peer may RDMA WRITE.
    pub const REMOTE_WRITE: Access = Access(2);
    /// A remote peer may RDMA READ.
    pub const REMOTE_READ: Access = Access(4);
    /// A remote peer may run atomics.
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// Everything.
    pub const ALL: Access = Access(15);

    /// True if every bit of `other` is set in `self`.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// Path MTU of a QP (IB MTU enum: the payload bytes a packet may carry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256,
    /// 512 bytes.
    Mtu512,
    /// 1024 bytes (rxe on a 1500-byte link).
    #[default]
    Mtu1024,
    /// 2048 bytes.
    Mtu2048,
    /// 4096 bytes.
    Mtu4096,
}

impl Mtu {
    /// The payload size in bytes.
    pub fn bytes(self) -> u32 {
        match self {
            Mtu::Mtu256 => 256,
            Mtu::Mtu512 => 512,
            Mtu::Mtu1024 => 1024,
            Mtu::Mtu2048 => 2048,
            Mtu::Mtu4096 => 4096,
        }
    }

    /// The MTU for a byte count, if it is one of the five IB MTUs.
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        Some(match bytes {
            256 => Mtu::Mtu256,
            512 => Mtu::Mtu512,
            1024 => Mtu::Mtu1024,
            2048 => Mtu::Mtu2048,
            4096 => Mtu::Mtu4096,
            _ => return None,
        })
    }

    /// The `ibv_mtu` enum value (1 = 256 .. 5 = 4096).
    pub fn ibv_value(self) -> u8 {
        self.bytes().trailing_zeros() as u8 - 7
    }
}

/// QP transport service type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable datagram.
    Ud,
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

/// Which QP attributes a `modify_qp` call sets (bit values of `ibv_qp_attr_mask`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct QpAttrMask(pub u32);

macro_rules! attr_bits {
    ($($name:ident = $bit:expr, $text:expr;)*) => {
        impl QpAttrMask {
            $(
                #[doc = concat!("`IBV_QP_", $text, "`")]
                pub const $name: QpAttrMask = QpAttrMask(1 << $bit);
            )*
            /// Every named bit with its libibverbs name, for error messages.
            pub const NAMED: &'static [(QpAttrMask, &'static str)] = &[
                $((QpAttrMask(1 << $bit), $text),)*
            ];
        }
    };
}

attr_bits! {
    STATE = 0, "STATE";
    CUR_STATE = 1, "CUR_STATE";
    EN_SQD_ASYNC_NOTIFY = 2, "EN_SQD_ASYNC_NOTIFY";
    ACCESS_FLAGS = 3, "ACCESS_FLAGS";
    PKEY_INDEX = 4, "PKEY_INDEX";
    PORT = 5, "PORT";
    QKEY = 6, "QKEY";
    AV = 7, "AV";
    PATH_MTU = 8, "PATH_MTU";
    TIMEOUT = 9, "TIMEOUT";
    RETRY_CNT = 10, "RETRY_CNT";
    RNR_RETRY = 11, "RNR_RETRY";
    RQ_PSN = 12, "RQ_PSN";
    MAX_QP_RD_ATOMIC = 13, "MAX_QP_RD_ATOMIC";
    ALT_PATH = 14, "ALT_PATH";
    MIN_RNR_TIMER = 15, "MIN_RNR_TIMER";
    SQ_PSN = 16, "SQ_PSN";
    MAX_DEST_RD_ATOMIC = 17, "MAX_DEST_RD_ATOMIC";
    PATH_MIG_STATE = 18, "PATH_MIG_STATE";
    CAP = 19, "CAP";
    DEST_QPN = 20, "DEST_QPN";
}

impl QpAttrMask {
    /// No attribute.
    pub const EMPTY: QpAttrMask = QpAttrMask(0);

    /// True if every bit of `other` is set.
    pub fn contains(self, other: QpAttrMask) -> bool {
        self.0 & other.0 == other.0
    }

    /// The libibverbs names of the bits set, e.g. `"AV|PATH_MTU"`.
    pub fn names(self) -> String {
        let mut out = String::new();
        for (bit, name) in QpAttrMask::NAMED {
            if self.0 & bit.0 != 0 {
                if !out.is_empty() {
                    out.push('|');
                }
                out.push_str(name);
            }
        }
        if self.0 >> 21 != 0 {
            if !out.is_empty() {
                out.push('|');
            }
            out.push_str(&format!("0x{:x}", self.0 & !((1 << 21) - 1)));
        }
        out
    }
}

impl std::ops::BitOr for QpAttrMask {
    type Output = QpAttrMask;
    fn bitor(self, rhs: QpAttrMask) -> QpAttrMask {
        QpAttrMask(self.0 | rhs.0)
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
    /// UDP source port; `None` = rxe's rule from the two QPNs (see `rxe_udp_src_port`).
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

/// Send WR flags (`ibv_send_flags` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SendFlags(pub u32);

impl SendFlags {
    /// Wait for every earlier READ/ATOMIC to complete first.
    pub const FENCE: SendFlags = SendFlags(1);
    /// Produce a completion on success.
    pub const SIGNALED: SendFlags = SendFlags(2);
    /// Set the BTH SE bit on the last packet.
    pub const SOLICITED: SendFlags = SendFlags(4);
    /// Copy the data at post time (the SGEs may be reused at once).
    pub const INLINE: SendFlags = SendFlags(8);

    /// True if every bit of `other` is set.
    pub fn contains(self, other: SendFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, rhs: SendFlags) -> SendFlags {
        SendFlags(self.0 | rhs.0)
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
}

impl WrOp {
    /// True for RDMA READ and the atomics (the ops bounded by max_rd_atomic).
    pub fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            WrOp::Read { .. } | WrOp::CompareSwap { .. } | WrOp::FetchAdd { .. }
        )
    }

    /// True for the atomics.
    pub fn is_atomic(&self) -> bool {
        matches!(self, WrOp::CompareSwap { .. } | WrOp::FetchAdd { .. })
    }

    /// The completion opcode of this operation.
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            WrOp::Send | WrOp::SendWithImm { .. } | WrOp::SendWithInv { .. } => WcOpcode::Send,
            WrOp::Write { .. } | WrOp::WriteWithImm { .. } => WcOpcode::RdmaWrite,
            WrOp::Read { .. } => WcOpcode::RdmaRead,
            WrOp::CompareSwap { .. } => WcOpcode::CompSwap,
            WrOp::FetchAdd { .. } => WcOpcode::FetchAdd,
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

/// A receive work request (`ibv_recv_wr`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvWr {
    /// Caller's id, returned in the completion.
    pub wr_id: u64,
    /// Where incoming data goes, in order.
    pub sg_list: Vec<Sge>,
}

/// Completion status (`ibv_wc_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum WcStatus {
    /// Success.
    Success,
    /// Local length error (message larger than the receive buffer).
    LocLenErr,
    /// Local QP operation error.
    LocQpOpErr,
    /// Local protection error (bad lkey or SGE out of bounds).
    LocProtErr,
    /// Flushed: the QP is in the error state.
    WrFlushErr,
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
    /// The `ibv_wc_status_str` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
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
    /// An object is still used (PD with MRs/QPs, CQ with QPs).
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
