//! The rdma_cm vocabulary: events, connection parameters, id states, errors.
use std::net::SocketAddr;

use crate::cm::CmError;
use crate::verbs::{AhAttr, VerbsError};
use crate::wire::addr::{Gid, MacAddr};

use super::CmId;

/// `RDMA_UDP_QKEY`: the Q_Key of every UD QP in the UDP port space (librdmacm's rule, which
/// the kernel's rdma_cm answers SIDR_REQs with).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// What an [`RdmaCmEvent`] reports, with librdmacm's numbering (`enum rdma_cm_event_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    AddrResolved = 0,
    AddrError = 1,
    RouteResolved = 2,
    RouteError = 3,
    ConnectRequest = 4,
    ConnectResponse = 5,
    ConnectError = 6,
    Unreachable = 7,
    Rejected = 8,
    Established = 9,
    Disconnected = 10,
    DeviceRemoval = 11,
    MulticastJoin = 12,
    MulticastError = 13,
    AddrChange = 14,
    TimewaitExit = 15,
}

impl EventKind {
    /// `RDMA_CM_EVENT_*`'s value.
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// `rdma_event_str`'s text.
    pub const fn name(self) -> &'static str {
        match self {
            EventKind::AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            EventKind::AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            EventKind::RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            EventKind::RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            EventKind::ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            EventKind::ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            EventKind::ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            EventKind::Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            EventKind::Rejected => "RDMA_CM_EVENT_REJECTED",
            EventKind::Established => "RDMA_CM_EVENT_ESTABLISHED",
            EventKind::Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            EventKind::DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            EventKind::MulticastJoin => "RDMA_CM_EVENT_MULTICAST_JOIN",
            EventKind::MulticastError => "RDMA_CM_EVENT_MULTICAST_ERROR",
            EventKind::AddrChange => "RDMA_CM_EVENT_ADDR_CHANGE",
            EventKind::TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        }
    }
}

/// Connection parameters (`struct rdma_conn_param`): what [`CmId::connect`] and
/// [`CmId::accept`] send, and what a ConnectRequest, ConnectResponse, Established or Rejected
/// event received (seen from the receiver: `responder_resources` is what the peer may have
/// outstanding towards us, IBTA 12.6.5 and 12.6.8 swapped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnParam {
    /// The user's private data: sent after rdma_cm's 36-byte header in a REQ (at most 56
    /// bytes), alone in a REP (196) or REJ (148). Received: the whole field, zero padded, as
    /// the kernel's rdma_cm reports it (CM messages carry no length).
    pub private_data: Vec<u8>,
    /// READ/atomic requests the peer may have outstanding at our responder.
    pub responder_resources: u8,
    /// READ/atomic requests we may have outstanding at the peer.
    pub initiator_depth: u8,
    pub flow_control: bool,
    /// Transport retries (0..=7); taken from the REQ only.
    pub retry_count: u8,
    /// RNR retries (0..=7, 7 = forever).
    pub rnr_retry_count: u8,
    pub srq: bool,
    /// The QP number to announce when the id has no QP of its own (the application moves
    /// its QP itself with [`CmId::init_qp_attr`]). Received: the peer's QP.
    pub qp_num: u32,
}

impl Default for ConnParam {
    /// librdmacm's usual choice (rping's): one READ each way, 7 retries, RNR forever.
    fn default() -> ConnParam {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: 1,
            initiator_depth: 1,
            flow_control: false,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            qp_num: 0,
        }
    }
}

/// A UD peer (`struct rdma_ud_param`): the QP, Q_Key and address a SIDR exchange found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UdParam {
    pub private_data: Vec<u8>,
    /// The address to send to (an AH made from it reaches the peer).
    pub ah_attr: AhAttr,
    pub qp_num: u32,
    pub qkey: u32,
}

/// What an event carries besides its kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventParam {
    None,
    Conn(ConnParam),
    Ud(UdParam),
}

/// One event (`struct rdma_cm_event`).
#[derive(Clone, Debug)]
pub struct RdmaCmEvent {
    /// The id it is about: on ConnectRequest a new id for the connection.
    pub id: CmId,
    /// On ConnectRequest: the listening id the request came to.
    pub listen_id: Option<CmId>,
    pub kind: EventKind,
    /// 0 on success. Rejected: the REJ reason (IBTA 12.6.7, table 112); Unreachable after a
    /// SIDR_REP: its status (IBTA 12.11.2); other errors: a negative errno, as the kernel
    /// reports them (-ETIMEDOUT for an unanswered REQ, -EHOSTUNREACH for no route).
    pub status: i32,
    pub param: EventParam,
}

/// Where an id is (librdmacm's `enum rdma_cm_state`, the ones a user can see).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdState {
    /// Created, nothing asked yet.
    Idle,
    /// Bound to a local address.
    Bound,
    /// Address resolution running.
    AddrQuery,
    AddrResolved,
    RouteQuery,
    RouteResolved,
    Listening,
    /// Passive: a request arrived, not yet accepted or rejected.
    ConnectRequest,
    /// Active: REQ (or SIDR_REQ) sent; passive: REP sent.
    Connecting,
    /// Active, no QP on the id: REP received, [`CmId::establish`] sends the RTU.
    ConnectResponse,
    Established,
    /// DREQ sent or received.
    Disconnecting,
    /// The connection is over (disconnected, rejected, unreachable).
    Closed,
    Destroyed,
}

/// The path an id uses (what `rdma_resolve_route` fills in): RoCEv2 has no SA, the path is
/// built from the GIDs, the kernel's route and the next hop's MAC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathInfo {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub sgid: Gid,
    pub dgid: Gid,
    /// The local GID's index.
    pub sgid_index: u8,
    /// The next hop (destination MAC of the frames).
    pub next_hop_mac: MacAddr,
    /// The router, `None` on-link.
    pub gateway: Option<std::net::IpAddr>,
    pub mtu: crate::engine::Mtu,
    pub hop_limit: u8,
    pub traffic_class: u8,
    /// Packet lifetime exponent (4.096 µs × 2^t).
    pub packet_life_time: u8,
}

/// Errors of the rdma_cm calls; [`RdmaCmError::errno`] is the value librdmacm sets.
#[derive(Debug, thiserror::Error)]
pub enum RdmaCmError {
    #[error("no xroce device has the address {0}")]
    AddressNotAvailable(std::net::IpAddr),
    #[error("port {port} of {space} is in use on {addr}")]
    AddressInUse {
        space: &'static str,
        port: u16,
        addr: std::net::IpAddr,
    },
    #[error("{call} in state {state:?}: the id must be {expected}")]
    WrongState {
        call: &'static str,
        state: IdState,
        expected: &'static str,
    },
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0} is not supported by xroce")]
    Unsupported(&'static str),
    #[error("the id already has a QP")]
    QpExists,
    #[error("no event within {0:?}")]
    Timeout(std::time::Duration),
    #[error("no event waiting")]
    WouldBlock,
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    #[error(transparent)]
    Cm(#[from] CmError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl RdmaCmError {
    /// The errno a C caller sees.
    pub fn errno(&self) -> i32 {
        match self {
            RdmaCmError::AddressNotAvailable(_) => libc::EADDRNOTAVAIL,
            RdmaCmError::AddressInUse { .. } => libc::EADDRINUSE,
            RdmaCmError::WrongState { .. } | RdmaCmError::InvalidArgument(_) => libc::EINVAL,
            RdmaCmError::Unsupported(_) => libc::EOPNOTSUPP,
            RdmaCmError::QpExists => libc::EINVAL,
            RdmaCmError::Timeout(_) => libc::ETIMEDOUT,
            RdmaCmError::WouldBlock => libc::EAGAIN,
            RdmaCmError::Verbs(VerbsError::Netdev(_)) => libc::EHOSTUNREACH,
            RdmaCmError::Verbs(_) => libc::EINVAL,
            RdmaCmError::Cm(CmError::TooManyConnections(_)) => libc::ENOMEM,
            RdmaCmError::Cm(_) => libc::EINVAL,
            RdmaCmError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

pub type Result<T> = std::result::Result<T, RdmaCmError>;
