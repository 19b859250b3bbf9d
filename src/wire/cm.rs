//! Communication manager messages (IBTA 12.6 and 12.11): the 232 bytes of class data in a
//! CM MAD (management class 0x07, class version 2, method Send), told apart by the MAD's
//! attribute id.
//!
//! Byte offsets below are from the start of the CM data (MAD byte 24); bit positions are
//! IBTA's `byte[bit]` notation, bit 0 being the most significant. Every field that spans
//! fewer than 8 bits is kept in a `u8` and checked on emit. Reserved bits are written as
//! zero and ignored on parse; the vendor-id bytes that IBTA comment 9434 carved out of
//! reserved space (used by Linux for ECE) are kept, so a parsed message re-emits byte for
//! byte.
//!
//! ```text
//! attribute  message   IBTA      private data
//! 0x0010     REQ       12.6.5     92 bytes at 140
//! 0x0011     MRA       12.6.6    222 bytes at  10
//! 0x0012     REJ       12.6.7    148 bytes at  84
//! 0x0013     REP       12.6.8    196 bytes at  36
//! 0x0014     RTU       12.6.9    224 bytes at   8
//! 0x0015     DREQ      12.6.10   220 bytes at  12
//! 0x0016     DREP      12.6.11   224 bytes at   8
//! 0x0017     SIDR_REQ  12.11.1   216 bytes at  16
//! 0x0018     SIDR_REP  12.11.2   136 bytes at  96
//! 0x0019     LAP       12.8.1    (kept raw)
//! 0x001A     APR       12.8.2    (kept raw)
//! ```

use std::time::Duration;

use super::bytes::{get_u16, get_u24, get_u32, get_u64, set_u16, set_u24, set_u32, set_u64};
use super::mad::{
    check_mad_len, MadError, MadHeader, MadPacket, MadResult, MAD_DATA_LEN, MAD_HEADER_LEN, MAD_LEN,
};

/// CM attribute ids (IBTA 12.6.1, Table 105).
pub mod attr {
    /// ClassPortInfo (not a connection message).
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// Request for communication.
    pub const REQ: u16 = 0x0010;
    /// Message receipt acknowledgement.
    pub const MRA: u16 = 0x0011;
    /// Reject.
    pub const REJ: u16 = 0x0012;
    /// Reply to request for communication.
    pub const REP: u16 = 0x0013;
    /// Ready to use.
    pub const RTU: u16 = 0x0014;
    /// Disconnect request.
    pub const DREQ: u16 = 0x0015;
    /// Disconnect reply.
    pub const DREP: u16 = 0x0016;
    /// Service id resolution request.
    pub const SIDR_REQ: u16 = 0x0017;
    /// Service id resolution reply.
    pub const SIDR_REP: u16 = 0x0018;
    /// Load alternate path.
    pub const LAP: u16 = 0x0019;
    /// Alternate path response.
    pub const APR: u16 = 0x001A;
}

/// Private-data sizes per message (IBTA 12.6.5-12.6.11, 12.11.1-2).
pub mod private_len {
    /// REQ.
    pub const REQ: usize = 92;
    /// MRA.
    pub const MRA: usize = 222;
    /// REJ.
    pub const REJ: usize = 148;
    /// REP.
    pub const REP: usize = 196;
    /// RTU.
    pub const RTU: usize = 224;
    /// DREQ.
    pub const DREQ: usize = 220;
    /// DREP.
    pub const DREP: usize = 224;
    /// SIDR_REQ.
    pub const SIDR_REQ: usize = 216;
    /// SIDR_REP.
    pub const SIDR_REP: usize = 136;
}

/// Length of the additional reject information in REJ and SIDR_REP (IBTA 12.6.7).
pub const ARI_LEN: usize = 72;

/// A CM timeout field's time: 4.096 µs × 2^exponent (IBTA 12.6.5, "CM Response Timeout").
/// Exponents above 31 are clamped to 31 (the field is 5 bits).
pub fn timeout_duration(exponent: u8) -> Duration {
    Duration::from_nanos(4096u64 << exponent.min(31))
}

/// Fixed-size private data. On the wire it has no length: the whole area is sent, zero padded
/// (IBTA 12.6: a consumer's shorter data is followed by zeros).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PrivateData<const N: usize>(pub [u8; N]);

impl<const N: usize> PrivateData<N> {
    /// Bytes this message carries.
    pub const LEN: usize = N;
    /// All zero.
    pub const fn zeroed() -> Self {
        PrivateData([0; N])
    }
    /// `data` followed by zeros; an error if it is longer than the message carries.
    pub fn from_slice(data: &[u8]) -> MadResult<Self> {
        if data.len() > N {
            return Err(MadError::PrivateDataTooLong {
                len: data.len(),
                max: N,
            });
        }
        let mut out = [0u8; N];
        out[..data.len()].copy_from_slice(data);
        Ok(PrivateData(out))
    }
    /// The whole area.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
    /// Whether every byte is zero.
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|&b| b == 0)
    }
    fn read(b: &[u8], at: usize) -> Self {
        let mut out = [0u8; N];
        out.copy_from_slice(&b[at..at + N]);
        PrivateData(out)
    }
}

impl<const N: usize> Default for PrivateData<N> {
    fn default() -> Self {
        Self::zeroed()
    }
}

impl<const N: usize> core::fmt::Debug for PrivateData<N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let used = self.0.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        write!(f, "PrivateData<{N}>(")?;
        for b in &self.0[..used] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "; {} zero bytes after)", N - used)
    }
}

/// Transport service type of a REQ (IBTA 12.6.5: 2 bits at 43[5]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TransportType {
    /// Reliable connection.
    #[default]
    Rc,
    /// Unreliable connection.
    Uc,
    /// Reliable datagram.
    Rd,
    /// "See extended transport type" (XRC is extended type 1).
    Extended,
}

impl TransportType {
    /// From the 2-bit code.
    pub const fn from_code(c: u8) -> TransportType {
        match c & 3 {
            0 => TransportType::Rc,
            1 => TransportType::Uc,
            2 => TransportType::Rd,
            _ => TransportType::Extended,
        }
    }
    /// The 2-bit code.
    pub const fn code(self) -> u8 {
        match self {
            TransportType::Rc => 0,
            TransportType::Uc => 1,
            TransportType::Rd => 2,
            TransportType::Extended => 3,
        }
    }
}

/// Path MTU code of a REQ (IBTA 12.6.5, encoded as in IBTA 9.7.7/Table 9: 1 = 256 .. 5 = 4096).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PathMtu {
    /// 256 bytes.
    Mtu256,
    /// 512 bytes.
    Mtu512,
    /// 1024 bytes.
    #[default]
    Mtu1024,
    /// 2048 bytes.
    Mtu2048,
    /// 4096 bytes.
    Mtu4096,
    /// A reserved code (0, 6..15), kept so the message re-emits.
    Reserved(u8),
}

impl PathMtu {
    /// From the 4-bit code.
    pub const fn from_code(c: u8) -> PathMtu {
        match c & 0xF {
            1 => PathMtu::Mtu256,
            2 => PathMtu::Mtu512,
            3 => PathMtu::Mtu1024,
            4 => PathMtu::Mtu2048,
            5 => PathMtu::Mtu4096,
            other => PathMtu::Reserved(other),
        }
    }
    /// The 4-bit code.
    pub const fn code(self) -> u8 {
        match self {
            PathMtu::Mtu256 => 1,
            PathMtu::Mtu512 => 2,
            PathMtu::Mtu1024 => 3,
            PathMtu::Mtu2048 => 4,
            PathMtu::Mtu4096 => 5,
            PathMtu::Reserved(c) => c,
        }
    }
    /// The MTU in bytes, `None` for a reserved code.
    pub const fn bytes(self) -> Option<u32> {
        match self {
            PathMtu::Mtu256 => Some(256),
            PathMtu::Mtu512 => Some(512),
            PathMtu::Mtu1024 => Some(1024),
            PathMtu::Mtu2048 => Some(2048),
            PathMtu::Mtu4096 => Some(4096),
            PathMtu::Reserved(_) => None,
        }
    }
    /// The code for an MTU in bytes (256..4096, powers of two).
    pub const fn from_bytes(bytes: u32) -> Option<PathMtu> {
        match bytes {
            256 => Some(PathMtu::Mtu256),
            512 => Some(PathMtu::Mtu512),
            1024 => Some(PathMtu::Mtu1024),
            2048 => Some(PathMtu::Mtu2048),
            4096 => Some(PathMtu::Mtu4096),
            _ => None,
        }
    }
}

/// One path of a REQ (primary at 52, alternate at 96; IBTA 12.6.5, Table 106). On RoCE the
/// LIDs are zero and the GIDs are the IP addresses (IPv4-mapped for IPv4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CmPath {
    /// Local port LID (0xFFFF permissive on RoCE, or 0).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID.
    pub local_gid: [u8; 16],
    /// Remote port GID.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits, IBTA 15.2.5.16 encoding).
    pub packet_rate: u8,
    /// Traffic class (the IP DSCP/ECN byte on RoCEv2).
    pub traffic_class: u8,
    /// Hop limit (the IP TTL on RoCEv2).
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local: the remote port is in the local subnet (no GRH needed on IB).
    pub subnet_local: bool,
    /// Local ACK timeout exponent (5 bits): the QP's transport timer, 4.096 µs × 2^t.
    pub local_ack_timeout: u8,
}

impl CmPath {
    /// Bytes one path occupies in a REQ.
    pub const LEN: usize = 44;

    /// Whether every field is zero: an absent alternate path.
    pub fn is_empty(&self) -> bool {
        *self == CmPath::default()
    }

    fn read(b: &[u8], at: usize) -> CmPath {
        let mut local_gid = [0u8; 16];
        local_gid.copy_from_slice(&b[at + 4..at + 20]);
        let mut remote_gid = [0u8; 16];
        remote_gid.copy_from_slice(&b[at + 20..at + 36]);
        CmPath {
            local_lid: get_u16(b, at),
            remote_lid: get_u16(b, at + 2),
            local_gid,
            remote_gid,
            flow_label: get_u32(b, at + 36) >> 12,
            packet_rate: b[at + 39] & 0x3F,
            traffic_class: b[at + 40],
            hop_limit: b[at + 41],
            sl: b[at + 42] >> 4,
            subnet_local: b[at + 42] & 0x08 != 0,
            local_ack_timeout: b[at + 43] >> 3,
        }
    }

    /// Writes the path at `at`; byte `at + 43`'s low 3 bits are left for the caller (SAP).
    fn write(&self, b: &mut [u8], at: usize) -> MadResult<()> {
        check_width("flow_label", self.flow_label.into(), 20)?;
        check_width("packet_rate", self.packet_rate.into(), 6)?;
        check_width("sl", self.sl.into(), 4)?;
        check_width("local_ack_timeout", self.local_ack_timeout.into(), 5)?;
        set_u16(b, at, self.local_lid);
        set_u16(b, at + 2, self.remote_lid);
        b[at + 4..at + 20].copy_from_slice(&self.local_gid);
        b[at + 20..at + 36].copy_from_slice(&self.remote_gid);
        set_u32(
            b,
            at + 36,
            (self.flow_label << 12) | u32::from(self.packet_rate),
        );
        b[at + 40] = self.traffic_class;
        b[at + 41] = self.hop_limit;
        b[at + 42] = (self.sl << 4) | (u8::from(self.subnet_local) << 3);
        b[at + 43] = self.local_ack_timeout << 3;
        Ok(())
    }
}

/// REQ: request for communication (IBTA 12.6.5, Table 106).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CmReq {
    /// The active side's communication id (0).
    pub local_comm_id: u32,
    /// Vendor id (24 bits at 5, IBTA comment 9434; Linux ECE).
    pub vendor_id: u32,
    /// Service the passive side listens on (8).
    pub service_id: u64,
    /// The active side's CA GUID (16).
    pub local_ca_guid: u64,
    /// The active QP's Q_Key (28; used for RD only).
    pub local_qkey: u32,
    /// The active side's QP number (24 bits at 32).
    pub local_qpn: u32,
    /// RDMA READ/atomic requests the active side accepts at once (35).
    pub responder_resources: u8,
    /// Local EE context (24 bits at 36; RD only).
    pub local_eecn: u32,
    /// RDMA READ/atomic requests the active side issues at once (39).
    pub initiator_depth: u8,
    /// Remote EE context (24 bits at 40; RD only).
    pub remote_eecn: u32,
    /// How long the passive side may take to answer the REQ (5-bit exponent at 43[0]).
    pub remote_cm_response_timeout: u8,
    /// Transport service type (2 bits at 43[5]).
    pub transport_type: TransportType,
    /// End-to-end flow control (43[7]).
    pub end_to_end_flow_control: bool,
    /// Starting PSN (24 bits at 44): the first PSN the active QP receives, so where the
    /// passive QP starts sending (its SQ PSN). Linux's CM and rxe use it so (the
    /// rxe_cm_rping.pcap capture: g1's first packet carries the REQ's PSN).
    pub starting_psn: u32,
    /// How long the active side takes to answer a REP (5-bit exponent at 47[0]).
    pub local_cm_response_timeout: u8,
    /// Transport retry count for the passive QP (3 bits at 47[5]).
    pub retry_count: u8,
    /// Partition key (48).
    pub partition_key: u16,
    /// Path MTU (4 bits at 50[0]).
    pub path_mtu: PathMtu,
    /// RDC exists (50[4]; RD only).
    pub rdc_exists: bool,
    /// RNR retry count for the passive QP (3 bits at 50[5]).
    pub rnr_retry_count: u8,
    /// How often the active side resends the REQ before giving up (4 bits at 51[0]).
    pub max_cm_retries: u8,
    /// The active QP has an SRQ (51[4]).
    pub srq: bool,
    /// Extended transport type (3 bits at 51[5]; 1 = XRC).
    pub extended_transport_type: u8,
    /// Primary path (52..96).
    pub primary_path: CmPath,
    /// Alternate path (96..140), all zero when there is none.
    pub alternate_path: CmPath,
    /// Alternate path supported (139[5]).
    pub sap_supported: bool,
    /// Consumer private data (140; rdma_cm puts its header first, see [`super::cma`]).
    pub private_data: PrivateData<{ private_len::REQ }>,
}

/// Which message an MRA acknowledges (IBTA 12.6.6: 2 bits at 8[0]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MraedMessage {
    /// A REQ.
    #[default]
    Req,
    /// A REP.
    Rep,
    /// A LAP.
    Lap,
    /// Code 3, reserved.
    Reserved,
}

impl MraedMessage {
    /// From the 2-bit code.
    pub const fn from_code(c: u8) -> Self {
        match c & 3 {
            0 => MraedMessage::Req,
            1 => MraedMessage::Rep,
            2 => MraedMessage::Lap,
            _ => MraedMessage::Reserved,
        }
    }
    /// The 2-bit code.
    pub const fn code(self) -> u8 {
        match self {
            MraedMessage::Req => 0,
            MraedMessage::Rep => 1,
            MraedMessage::Lap => 2,
            MraedMessage::Reserved => 3,
        }
    }
}

/// MRA: message receipt acknowledgement (IBTA 12.6.6, Table 107): "I got it, give me longer".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CmMra {
    /// The sender's comm id (0).
    pub local_comm_id: u32,
    /// The receiver's comm id (4): for an MRA of a REQ, the REQ's local comm id.
    pub remote_comm_id: u32,
    /// Which message is acknowledged (2 bits at 8[0]).
    pub message_mraed: MraedMessage,
    /// Extra time the sender needs (5-bit exponent at 9[0]), added to the response timeout.
    pub service_timeout: u8,
    /// Private data (10).
    pub private_data: PrivateData<{ private_len::MRA }>,
}

/// Which message a REJ rejects (IBTA 12.6.7: 2 bits at 8[0]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RejectedMessage {
    /// The REQ.
    #[default]
    Req,
    /// The REP.
    Rep,
    /// No message, or another one (a timeout, a stale connection).
    Other,
    /// Code 3, reserved.
    Reserved,
}

impl RejectedMessage {
    /// From the 2-bit code.
    pub const fn from_code(c: u8) -> Self {
        match c & 3 {
            0 => RejectedMessage::Req,
            1 => RejectedMessage::Rep,
            2 => RejectedMessage::Other,
            _ => RejectedMessage::Reserved,
        }
    }
    /// The 2-bit code.
    pub const fn code(self) -> u8 {
        match self {
            RejectedMessage::Req => 0,
            RejectedMessage::Rep => 1,
            RejectedMessage::Other => 2,
            RejectedMessage::Reserved => 3,
        }
    }
}

macro_rules! reject_reasons {
    ($($(#[$doc:meta])* $name:ident = $code:expr, $text:expr;)*) => {
        /// Reject reason of a REJ (IBTA 12.6.7, reject reasons).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum RejectReason {
            $($(#[$doc])* $name,)*
            /// A code IBTA does not define (or reserves), kept so the message re-emits.
            Unknown(u16),
        }

        impl RejectReason {
            /// Every defined reason, in code order.
            pub const ALL: &'static [RejectReason] = &[$(RejectReason::$name,)*];

            /// From the 16-bit code.
            pub const fn from_code(c: u16) -> RejectReason {
                match c {
                    $($code => RejectReason::$name,)*
                    other => RejectReason::Unknown(other),
                }
            }
            /// The 16-bit code.
            pub const fn code(self) -> u16 {
                match self {
                    $(RejectReason::$name => $code,)*
                    RejectReason::Unknown(c) => c,
                }
            }
            /// A short description, as IBTA names it.
            pub const fn description(self) -> &'static str {
                match self {
                    $(RejectReason::$name => $text,)*
                    RejectReason::Unknown(_) => "unknown reason",
                }
            }
        }
    };
}

reject_reasons! {
    /// No QP available.
    NoQp = 1, "no QP available";
    /// No EE context available.
    NoEec = 2, "no EEC available";
    /// No resources available.
    NoResources = 3, "no resources available";
    /// The sender timed out waiting for the peer (ARI: the sender's CA GUID).
    Timeout = 4, "timeout";
    /// The REQ asks for something unsupported.
    UnsupportedRequest = 5, "unsupported request";
    /// The comm id is not one the sender knows.
    InvalidCommId = 6, "invalid communication id";
    /// The comm id names an older instance.
    InvalidCommInstance = 7, "invalid communication instance";
    /// Nobody listens on the service id (rdma_cm: connection refused).
    InvalidServiceId = 8, "invalid service id";
    /// Transport type not supported.
    InvalidTransportType = 9, "invalid transport service type";
    /// The QP is still in use by an old connection (IBTA 12.4: stale connection).
    StaleConnection = 10, "stale connection";
    /// RDC does not exist.
    RdcNotExist = 11, "RDC does not exist";
    /// Primary remote port GID rejected (ARI: the GID the passive side wants).
    InvalidGid = 12, "primary remote port GID rejected";
    /// Primary remote port LID rejected.
    InvalidLid = 13, "primary remote port LID rejected";
    /// Primary SL rejected.
    InvalidSl = 14, "invalid primary SL";
    /// Primary traffic class rejected.
    InvalidTrafficClass = 15, "invalid primary traffic class";
    /// Primary hop limit rejected.
    InvalidHopLimit = 16, "invalid primary hop limit";
    /// Primary packet rate rejected.
    InvalidPacketRate = 17, "invalid primary packet rate";
    /// Alternate remote port GID rejected.
    InvalidAltGid = 18, "alternate remote port GID rejected";
    /// Alternate remote port LID rejected.
    InvalidAltLid = 19, "alternate remote port LID rejected";
    /// Alternate SL rejected.
    InvalidAltSl = 20, "invalid alternate SL";
    /// Alternate traffic class rejected.
    InvalidAltTrafficClass = 21, "invalid alternate traffic class";
    /// Alternate hop limit rejected.
    InvalidAltHopLimit = 22, "invalid alternate hop limit";
    /// Alternate packet rate rejected.
    InvalidAltPacketRate = 23, "invalid alternate packet rate";
    /// Redirect to another port's CM (ARI: a ClassPortInfo).
    PortCmRedirect = 24, "port CM redirection";
    /// Redirect to another port (ARI: a PortInfo).
    PortRedirect = 25, "port redirection";
    /// Path MTU not supported.
    InvalidMtu = 26, "invalid path MTU";
    /// Not enough responder resources (initiator depth above what the peer offers).
    InsufficientRespResources = 27, "insufficient responder resources";
    /// The consumer rejected (rdma_reject; rdma_cm's private data says why).
    ConsumerDefined = 28, "consumer defined";
    /// RNR retry count not accepted.
    InvalidRnrRetry = 29, "invalid RNR retry count";
    /// The local comm id is already in use with this peer.
    DuplicateLocalCommId = 30, "duplicate local comm id";
    /// Class version not supported (ARI: the highest version supported).
    InvalidClassVersion = 31, "unsupported class version";
    /// Primary flow label rejected.
    InvalidFlowLabel = 32, "invalid primary flow label";
    /// Alternate flow label rejected.
    InvalidAltFlowLabel = 33, "invalid alternate flow label";
    /// A vendor option (ECE) the peer does not support (IBTA comment 9434).
    VendorOptionNotSupported = 35, "vendor option not supported";
}

/// REJ: reject (IBTA 12.6.7, Table 108).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmRej {
    /// The sender's comm id (0).
    pub local_comm_id: u32,
    /// The receiver's comm id (4).
    pub remote_comm_id: u32,
    /// Which message is rejected (2 bits at 8[0]).
    pub message_rejected: RejectedMessage,
    /// Bytes of ARI that are meaningful (7 bits at 9[0]).
    pub reject_info_length: u8,
    /// Why (16 bits at 10).
    pub reason: RejectReason,
    /// Additional reject information (72 bytes at 12).
    pub ari: [u8; ARI_LEN],
    /// Private data (84).
    pub private_data: PrivateData<{ private_len::REJ }>,
}

impl Default for CmRej {
    fn default() -> Self {
        CmRej {
            local_comm_id: 0,
            remote_comm_id: 0,
            message_rejected: RejectedMessage::Req,
            reject_info_length: 0,
            reason: RejectReason::ConsumerDefined,
            ari: [0; ARI_LEN],
            private_data: PrivateData::zeroed(),
        }
    }
}

impl CmRej {
    /// The meaningful part of the ARI.
    pub fn ari_bytes(&self) -> &[u8] {
        &self.ari[..usize::from(self.reject_info_length).min(ARI_LEN)]
    }
}

/// Failover accepted field of a REP (IBTA 12.6.8: 2 bits at 26[5]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FailoverAccepted {
    /// The alternate path is accepted.
    #[default]
    Accepted,
    /// Failover is not supported.
    NotSupported,
    /// The alternate path is rejected.
    Rejected,
    /// Code 3, reserved.
    Reserved,
}

impl FailoverAccepted {
    /// From the 2-bit code.
    pub const fn from_code(c: u8) -> Self {
        match c & 3 {
            0 => FailoverAccepted::Accepted,
            1 => FailoverAccepted::NotSupported,
            2 => FailoverAccepted::Rejected,
            _ => FailoverAccepted::Reserved,
        }
    }
    /// The 2-bit code.
    pub const fn code(self) -> u8 {
        match self {
            FailoverAccepted::Accepted => 0,
            FailoverAccepted::NotSupported => 1,
            FailoverAccepted::Rejected => 2,
            FailoverAccepted::Reserved => 3,
        }
    }
}

/// REP: reply to a REQ (IBTA 12.6.8, Table 110).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CmRep {
    /// The passive side's comm id (0).
    pub local_comm_id: u32,
    /// The REQ's local comm id (4).
    pub remote_comm_id: u32,
    /// The passive QP's Q_Key (8; RD only).
    pub local_qkey: u32,
    /// The passive side's QP number (24 bits at 12).
    pub local_qpn: u32,
    /// Vendor id (24 bits: bytes 15, 19 and 23, IBTA comment 9434; Linux ECE).
    pub vendor_id: u32,
    /// Local EE context (24 bits at 16; RD only).
    pub local_eecn: u32,
    /// Starting PSN (24 bits at 20): the first PSN the passive QP receives, so where the
    /// active QP starts sending.
    pub starting_psn: u32,
    /// RDMA READ/atomic requests the passive side accepts at once (24).
    pub responder_resources: u8,
    /// RDMA READ/atomic requests the passive side issues at once (25).
    pub initiator_depth: u8,
    /// The passive CA's ACK delay (5-bit exponent at 26[0]).
    pub target_ack_delay: u8,
    /// Whether the REQ's alternate path is accepted (2 bits at 26[5]).
    pub failover_accepted: FailoverAccepted,
    /// End-to-end flow control (26[7]).
    pub end_to_end_flow_control: bool,
    /// RNR retry count for the active QP (3 bits at 27[0]).
    pub rnr_retry_count: u8,
    /// The passive QP has an SRQ (27[3]).
    pub srq: bool,
    /// The passive side's CA GUID (28).
    pub local_ca_guid: u64,
    /// Private data (36).
    pub private_data: PrivateData<{ private_len::REP }>,
}

/// RTU: ready to use (IBTA 12.6.9, Table 111).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CmRtu {
    /// The active side's comm id (0).
    pub local_comm_id: u32,
    /// The passive side's comm id (4).
    pub remote_comm_id: u32,
    /// Private data (8).
    pub private_data: PrivateData<{ private_len::RTU }>,
}

/// DREQ: disconnect request (IBTA 12.6.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CmDreq {
    /// The sender's comm id (0).
    pub local_comm_id: u32,
    /// The receiver's comm id (4).
    pub remote_comm_id: u32,
    /// The receiver's QPN (24 bits at 8), so a stale DREQ can be told apart.
    pub remote_qpn: u32,
    /// Private data (12).
    pub private_data: PrivateData<{ private_len::DREQ }>,
}

/// DREP: disconnect reply (IBTA 12.6.11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CmDrep {
    /// The sender's comm id (0).
    pub local_comm_id: u32,
    /// The receiver's comm id (4).
    pub remote_comm_id: u32,
    /// Private data (8).
    pub private_data: PrivateData<{ private_len::DREP }>,
}

/// SIDR_REQ: service id resolution request, for UD (IBTA 12.11.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SidrReq {
    /// The requester's id, echoed in the reply (0).
    pub request_id: u32,
    /// Partition key (16 bits at 4).
    pub partition_key: u16,
    /// Service to resolve (8).
    pub service_id: u64,
    /// Private data (16; rdma_cm's header first).
    pub private_data: PrivateData<{ private_len::SIDR_REQ }>,
}

/// SIDR_REP status (IBTA 12.11.2, Table 120's status values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SidrStatus {
    /// QPN and Q_Key are valid.
    #[default]
    Success,
    /// Service id not supported.
    Unsupported,
    /// Rejected by the service provider.
    Reject,
    /// No QP available.
    NoQp,
    /// Redirect (ARI: a ClassPortInfo).
    Redirect,
    /// Class version not supported.
    UnsupportedVersion,
    /// A code IBTA does not define.
    Unknown(u8),
}

impl SidrStatus {
    /// From the 8-bit code.
    pub const fn from_code(c: u8) -> Self {
        match c {
            0 => SidrStatus::Success,
            1 => SidrStatus::Unsupported,
            2 => SidrStatus::Reject,
            3 => SidrStatus::NoQp,
            4 => SidrStatus::Redirect,
            5 => SidrStatus::UnsupportedVersion,
            other => SidrStatus::Unknown(other),
        }
    }
    /// The 8-bit code.
    pub const fn code(self) -> u8 {
        match self {
            SidrStatus::Success => 0,
            SidrStatus::Unsupported => 1,
            SidrStatus::Reject => 2,
            SidrStatus::NoQp => 3,
            SidrStatus::Redirect => 4,
            SidrStatus::UnsupportedVersion => 5,
            SidrStatus::Unknown(c) => c,
        }
    }
    /// A short description.
    pub const fn description(self) -> &'static str {
        match self {
            SidrStatus::Success => "success",
            SidrStatus::Unsupported => "service id not supported",
            SidrStatus::Reject => "rejected by the service",
            SidrStatus::NoQp => "no QP available",
            SidrStatus::Redirect => "redirect",
            SidrStatus::UnsupportedVersion => "class version not supported",
            SidrStatus::Unknown(_) => "unknown status",
        }
    }
}

/// SIDR_REP: service id resolution reply (IBTA 12.11.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrRep {
    /// The SIDR_REQ's request id (0).
    pub request_id: u32,
    /// Status (4).
    pub status: SidrStatus,
    /// Bytes of additional information that are meaningful (5).
    pub additional_info_length: u8,
    /// Vendor id (24 bits: bytes 6, 7 and 11; Linux ECE).
    pub vendor_id: u32,
    /// The service's UD QPN (24 bits at 8).
    pub qpn: u32,
    /// The service id resolved (12).
    pub service_id: u64,
    /// The service QP's Q_Key (20).
    pub qkey: u32,
    /// Additional information (72 bytes at 24).
    pub additional_info: [u8; ARI_LEN],
    /// Private data (96).
    pub private_data: PrivateData<{ private_len::SIDR_REP }>,
}

impl Default for SidrRep {
    fn default() -> Self {
        SidrRep {
            request_id: 0,
            status: SidrStatus::Success,
            additional_info_length: 0,
            vendor_id: 0,
            qpn: 0,
            service_id: 0,
            qkey: 0,
            additional_info: [0; ARI_LEN],
            private_data: PrivateData::zeroed(),
        }
    }
}

/// A CM message xroce does not decode beyond its comm ids (LAP, APR: alternate paths are
/// not used on RoCE); the whole body is kept so it re-emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmOpaque {
    /// The sender's comm id (0).
    pub local_comm_id: u32,
    /// The receiver's comm id (4).
    pub remote_comm_id: u32,
    /// All 232 bytes of CM data, comm ids included.
    pub data: [u8; MAD_DATA_LEN],
}

/// A CM message: the 232 bytes of CM data as typed fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmMessage {
    /// REQ (0x0010).
    Req(CmReq),
    /// MRA (0x0011).
    Mra(CmMra),
    /// REJ (0x0012).
    Rej(CmRej),
    /// REP (0x0013).
    Rep(CmRep),
    /// RTU (0x0014).
    Rtu(CmRtu),
    /// DREQ (0x0015).
    Dreq(CmDreq),
    /// DREP (0x0016).
    Drep(CmDrep),
    /// SIDR_REQ (0x0017).
    SidrReq(SidrReq),
    /// SIDR_REP (0x0018).
    SidrRep(SidrRep),
    /// LAP (0x0019), kept raw.
    Lap(CmOpaque),
    /// APR (0x001A), kept raw.
    Apr(CmOpaque),
}

fn check_width(field: &'static str, value: u64, bits: u32) -> MadResult<()> {
    if value >> bits != 0 {
        Err(MadError::FieldOutOfRange { field, value })
    } else {
        Ok(())
    }
}

impl CmMessage {
    /// The attribute id that names this message in the MAD header.
    pub const fn attribute_id(&self) -> u16 {
        match self {
            CmMessage::Req(_) => attr::REQ,
            CmMessage::Mra(_) => attr::MRA,
            CmMessage::Rej(_) => attr::REJ,
            CmMessage::Rep(_) => attr::REP,
            CmMessage::Rtu(_) => attr::RTU,
            CmMessage::Dreq(_) => attr::DREQ,
            CmMessage::Drep(_) => attr::DREP,
            CmMessage::SidrReq(_) => attr::SIDR_REQ,
            CmMessage::SidrRep(_) => attr::SIDR_REP,
            CmMessage::Lap(_) => attr::LAP,
            CmMessage::Apr(_) => attr::APR,
        }
    }

    /// The message's name as IBTA writes it ("REQ", "SIDR_REP").
    pub const fn name(&self) -> &'static str {
        match attribute_name(self.attribute_id()) {
            Some(n) => n,
            None => "?",
        }
    }

    /// The sender's comm id (a SIDR message's request id).
    pub const fn local_comm_id(&self) -> u32 {
        match self {
            CmMessage::Req(m) => m.local_comm_id,
            CmMessage::Mra(m) => m.local_comm_id,
            CmMessage::Rej(m) => m.local_comm_id,
            CmMessage::Rep(m) => m.local_comm_id,
            CmMessage::Rtu(m) => m.local_comm_id,
            CmMessage::Dreq(m) => m.local_comm_id,
            CmMessage::Drep(m) => m.local_comm_id,
            CmMessage::SidrReq(m) => m.request_id,
            CmMessage::SidrRep(m) => m.request_id,
            CmMessage::Lap(m) | CmMessage::Apr(m) => m.local_comm_id,
        }
    }

    /// The receiver's comm id; `None` for REQ and the SIDR messages, which carry none.
    pub const fn remote_comm_id(&self) -> Option<u32> {
        match self {
            CmMessage::Req(_) | CmMessage::SidrReq(_) | CmMessage::SidrRep(_) => None,
            CmMessage::Mra(m) => Some(m.remote_comm_id),
            CmMessage::Rej(m) => Some(m.remote_comm_id),
            CmMessage::Rep(m) => Some(m.remote_comm_id),
            CmMessage::Rtu(m) => Some(m.remote_comm_id),
            CmMessage::Dreq(m) => Some(m.remote_comm_id),
            CmMessage::Drep(m) => Some(m.remote_comm_id),
            CmMessage::Lap(m) | CmMessage::Apr(m) => Some(m.remote_comm_id),
        }
    }

    /// The message's private data (LAP/APR: empty, they are kept raw).
    pub fn private_data(&self) -> &[u8] {
        match self {
            CmMessage::Req(m) => m.private_data.as_bytes(),
            CmMessage::Mra(m) => m.private_data.as_bytes(),
            CmMessage::Rej(m) => m.private_data.as_bytes(),
            CmMessage::Rep(m) => m.private_data.as_bytes(),
            CmMessage::Rtu(m) => m.private_data.as_bytes(),
            CmMessage::Dreq(m) => m.private_data.as_bytes(),
            CmMessage::Drep(m) => m.private_data.as_bytes(),
            CmMessage::SidrReq(m) => m.private_data.as_bytes(),
            CmMessage::SidrRep(m) => m.private_data.as_bytes(),
            CmMessage::Lap(_) | CmMessage::Apr(_) => &[],
        }
    }

    /// Reads the CM data (at least 232 bytes) of a message with this attribute id.
    pub fn parse(attribute_id: u16, data: &[u8]) -> MadResult<CmMessage> {
        check_mad_len("CM message", MAD_DATA_LEN, data.len())?;
        let b = &data[..MAD_DATA_LEN];
        let msg = match attribute_id {
            attr::REQ => CmMessage::Req(CmReq {
                local_comm_id: get_u32(b, 0),
                vendor_id: get_u24(b, 5),
                service_id: get_u64(b, 8),
                local_ca_guid: get_u64(b, 16),
                local_qkey: get_u32(b, 28),
                local_qpn: get_u24(b, 32),
                responder_resources: b[35],
                local_eecn: get_u24(b, 36),
                initiator_depth: b[39],
                remote_eecn: get_u24(b, 40),
                remote_cm_response_timeout: b[43] >> 3,
                transport_type: TransportType::from_code((b[43] >> 1) & 3),
                end_to_end_flow_control: b[43] & 1 != 0,
                starting_psn: get_u24(b, 44),
                local_cm_response_timeout: b[47] >> 3,
                retry_count: b[47] & 7,
                partition_key: get_u16(b, 48),
                path_mtu: PathMtu::from_code(b[50] >> 4),
                rdc_exists: b[50] & 0x08 != 0,
                rnr_retry_count: b[50] & 7,
                max_cm_retries: b[51] >> 4,
                srq: b[51] & 0x08 != 0,
                extended_transport_type: b[51] & 7,
                primary_path: CmPath::read(b, 52),
                alternate_path: CmPath::read(b, 96),
                sap_supported: b[139] & 0x04 != 0,
                private_data: PrivateData::read(b, 140),
            }),
            attr::MRA => CmMessage::Mra(CmMra {
                local_comm_id: get_u32(b, 0),
                remote_comm_id: get_u32(b, 4),
                message_mraed: MraedMessage::from_code(b[8] >> 6),
                service_timeout: b[9] >> 3,
                private_data: PrivateData::read(b, 10),
            }),
            attr::REJ => {
                let mut ari = [0u8; ARI_LEN];
                ari.copy_from_slice(&b[12..12 + ARI_LEN]);
                CmMessage::Rej(CmRej {
                    local_comm_id: get_u32(b, 0),
                    remote_comm_id: get_u32(b, 4),
                    message_rejected: RejectedMessage::from_code(b[8] >> 6),
                    reject_info_length: b[9] >> 1,
                    reason: RejectReason::from_code(get_u16(b, 10)),
                    ari,
                    private_data: PrivateData::read(b, 84),
                })
            }
            attr::REP => CmMessage::Rep(CmRep {
                local_comm_id: get_u32(b, 0),
                remote_comm_id: get_u32(b, 4),
                local_qkey: get_u32(b, 8),
                local_qpn: get_u24(b, 12),
                vendor_id: (u32::from(b[15]) << 16) | (u32::from(b[19]) << 8) | u32::from(b[23]),
                local_eecn: get_u24(b, 16),
                starting_psn: get_u24(b, 20),
                responder_resources: b[24],
                initiator_depth: b[25],
                target_ack_delay: b[26] >> 3,
                failover_accepted: FailoverAccepted::from_code((b[26] >> 1) & 3),
                end_to_end_flow_control: b[26] & 1 != 0,
                rnr_retry_count: b[27] >> 5,
                srq: b[27] & 0x10 != 0,
                local_ca_guid: get_u64(b, 28),
                private_data: PrivateData::read(b, 36),
            }),
            attr::RTU => CmMessage::Rtu(CmRtu {
                local_comm_id: get_u32(b, 0),
                remote_comm_id: get_u32(b, 4),
                private_data: PrivateData::read(b, 8),
            }),
            attr::DREQ => CmMessage::Dreq(CmDreq {
                local_comm_id: get_u32(b, 0),
                remote_comm_id: get_u32(b, 4),
                remote_qpn: get_u24(b, 8),
                private_data: PrivateData::read(b, 12),
            }),
            attr::DREP => CmMessage::Drep(CmDrep {
                local_comm_id: get_u32(b, 0),
                remote_comm_id: get_u32(b, 4),
                private_data: PrivateData::read(b, 8),
            }),
            attr::SIDR_REQ => CmMessage::SidrReq(SidrReq {
                request_id: get_u32(b, 0),
                partition_key: get_u16(b, 4),
                service_id: get_u64(b, 8),
                private_data: PrivateData::read(b, 16),
            }),
            attr::SIDR_REP => {
                let mut additional_info = [0u8; ARI_LEN];
                additional_info.copy_from_slice(&b[24..24 + ARI_LEN]);
                CmMessage::SidrRep(SidrRep {
                    request_id: get_u32(b, 0),
                    status: SidrStatus::from_code(b[4]),
                    additional_info_length: b[5],
                    vendor_id: (u32::from(get_u16(b, 6)) << 8) | u32::from(b[11]),
                    qpn: get_u24(b, 8),
                    service_id: get_u64(b, 12),
                    qkey: get_u32(b, 20),
                    additional_info,
                    private_data: PrivateData::read(b, 96),
                })
            }
            attr::LAP | attr::APR => {
                let mut raw = [0u8; MAD_DATA_LEN];
                raw.copy_from_slice(b);
                let m = CmOpaque {
                    local_comm_id: get_u32(b, 0),
                    remote_comm_id: get_u32(b, 4),
                    data: raw,
                };
                if attribute_id == attr::LAP {
                    CmMessage::Lap(m)
                } else {
                    CmMessage::Apr(m)
                }
            }
            attr::CLASS_PORT_INFO => return Err(MadError::UnsupportedAttribute(attribute_id)),
            other => return Err(MadError::UnknownAttribute(other)),
        };
        Ok(msg)
    }

    /// Bytes [`emit`](Self::emit) writes: the whole CM data.
    pub const fn buffer_len(&self) -> usize {
        MAD_DATA_LEN
    }

    /// Writes all 232 bytes of CM data (reserved bits zero). Fails, writing nothing, if a
    /// field does not fit its width or the buffer is short.
    pub fn emit(&self, data: &mut [u8]) -> MadResult<()> {
        check_mad_len("CM message buffer", MAD_DATA_LEN, data.len())?;
        let mut b = [0u8; MAD_DATA_LEN];
        match self {
            CmMessage::Req(m) => {
                check_width("vendor_id", m.vendor_id.into(), 24)?;
                check_width("local_qpn", m.local_qpn.into(), 24)?;
                check_width("local_eecn", m.local_eecn.into(), 24)?;
                check_width("remote_eecn", m.remote_eecn.into(), 24)?;
                check_width(
                    "remote_cm_response_timeout",
                    m.remote_cm_response_timeout.into(),
                    5,
                )?;
                check_width("starting_psn", m.starting_psn.into(), 24)?;
                check_width(
                    "local_cm_response_timeout",
                    m.local_cm_response_timeout.into(),
                    5,
                )?;
                check_width("retry_count", m.retry_count.into(), 3)?;
                check_width("path_mtu", m.path_mtu.code().into(), 4)?;
                check_width("rnr_retry_count", m.rnr_retry_count.into(), 3)?;
                check_width("max_cm_retries", m.max_cm_retries.into(), 4)?;
                check_width(
                    "extended_transport_type",
                    m.extended_transport_type.into(),
                    3,
                )?;
                set_u32(&mut b, 0, m.local_comm_id);
                set_u24(&mut b, 5, m.vendor_id);
                set_u64(&mut b, 8, m.service_id);
                set_u64(&mut b, 16, m.local_ca_guid);
                set_u32(&mut b, 28, m.local_qkey);
                set_u24(&mut b, 32, m.local_qpn);
                b[35] = m.responder_resources;
                set_u24(&mut b, 36, m.local_eecn);
                b[39] = m.initiator_depth;
                set_u24(&mut b, 40, m.remote_eecn);
                b[43] = (m.remote_cm_response_timeout << 3)
                    | (m.transport_type.code() << 1)
                    | u8::from(m.end_to_end_flow_control);
                set_u24(&mut b, 44, m.starting_psn);
                b[47] = (m.local_cm_response_timeout << 3) | m.retry_count;
                set_u16(&mut b, 48, m.partition_key);
                b[50] =
                    (m.path_mtu.code() << 4) | (u8::from(m.rdc_exists) << 3) | m.rnr_retry_count;
                b[51] =
                    (m.max_cm_retries << 4) | (u8::from(m.srq) << 3) | m.extended_transport_type;
                m.primary_path.write(&mut b, 52)?;
                m.alternate_path.write(&mut b, 96)?;
                b[139] |= u8::from(m.sap_supported) << 2;
                b[140..].copy_from_slice(m.private_data.as_bytes());
            }
            CmMessage::Mra(m) => {
                check_width("service_timeout", m.service_timeout.into(), 5)?;
                set_u32(&mut b, 0, m.local_comm_id);
                set_u32(&mut b, 4, m.remote_comm_id);
                b[8] = m.message_mraed.code() << 6;
                b[9] = m.service_timeout << 3;
                b[10..].copy_from_slice(m.private_data.as_bytes());
            }
            CmMessage::Rej(m) => {
                check_width("reject_info_length", m.reject_info_length.into(), 7)?;
                set_u32(&mut b, 0, m.local_comm_id);
                set_u32(&mut b, 4, m.remote_comm_id);
                b[8] = m.message_rejected.code() << 6;
                b[9] = m.reject_info_length << 1;
                set_u16(&mut b, 10, m.reason.code());
                b[12..12 + ARI_LEN].copy_from_slice(&m.ari);
                b[84..].copy_from_slice(m.private_data.as_bytes());
            }
            CmMessage::Rep(m) => {
                check_width("local_qpn", m.local_qpn.into(), 24)?;
                check_width("vendor_id", m.vendor_id.into(), 24)?;
                check_width("local_eecn", m.local_eecn.into(), 24)?;
                check_width("starting_psn", m.starting_psn.into(), 24)?;
                check_width("target_ack_delay", m.target_ack_delay.into(), 5)?;
                check_width("rnr_retry_count", m.rnr_retry_count.into(), 3)?;
                set_u32(&mut b, 0, m.local_comm_id);
                set_u32(&mut b, 4, m.remote_comm_id);
                set_u32(&mut b, 8, m.local_qkey);
                set_u24(&mut b, 12, m.local_qpn);
                b[15] = (m.vendor_id >> 16) as u8;
                set_u24(&mut b, 16, m.local_eecn);
                b[19] = (m.vendor_id >> 8) as u8;
                set_u24(&mut b, 20, m.starting_psn);
                b[23] = m.vendor_id as u8;
                b[24] = m.responder_resources;
                b[25] = m.initiator_depth;
                b[26] = (m.target_ack_delay << 3)
                    | (m.failover_accepted.code() << 1)
                    | u8::from(m.end_to_end_flow_control);
                b[27] = (m.rnr_retry_count << 5) | (u8::from(m.srq) << 4);
                set_u64(&mut b, 28, m.local_ca_guid);
                b[36..].copy_from_slice(m.private_data.as_bytes());
            }
            CmMessage::Rtu(m) => {
                set_u32(&mut b, 0, m.local_comm_id);
                set_u32(&mut b, 4, m.remote_comm_id);
                b[8..].copy_from_slice(m.private_data.as_bytes());
            }
            CmMessage::Dreq(m) => {
                check_width("remote_qpn", m.remote_qpn.into(), 24)?;
                set_u32(&mut b, 0, m.local_comm_id);
                set_u32(&mut b, 4, m.remote_comm_id);
                set_u24(&mut b, 8, m.remote_qpn);
                b[12..].copy_from_slice(m.private_data.as_bytes());
            }
            CmMessage::Drep(m) => {
                set_u32(&mut b, 0, m.local_comm_id);
                set_u32(&mut b, 4, m.remote_comm_id);
                b[8..].copy_from_slice(m.private_data.as_bytes());
            }
            CmMessage::SidrReq(m) => {
                set_u32(&mut b, 0, m.request_id);
                set_u16(&mut b, 4, m.partition_key);
                set_u64(&mut b, 8, m.service_id);
                b[16..].copy_from_slice(m.private_data.as_bytes());
            }
            CmMessage::SidrRep(m) => {
                check_width("vendor_id", m.vendor_id.into(), 24)?;
                check_width("qpn", m.qpn.into(), 24)?;
                set_u32(&mut b, 0, m.request_id);
                b[4] = m.status.code();
                b[5] = m.additional_info_length;
                set_u16(&mut b, 6, (m.vendor_id >> 8) as u16);
                set_u24(&mut b, 8, m.qpn);
                b[11] = m.vendor_id as u8;
                set_u64(&mut b, 12, m.service_id);
                set_u32(&mut b, 20, m.qkey);
                b[24..24 + ARI_LEN].copy_from_slice(&m.additional_info);
                b[96..].copy_from_slice(m.private_data.as_bytes());
            }
            CmMessage::Lap(m) | CmMessage::Apr(m) => {
                b.copy_from_slice(&m.data);
                set_u32(&mut b, 0, m.local_comm_id);
                set_u32(&mut b, 4, m.remote_comm_id);
            }
        }
        data[..MAD_DATA_LEN].copy_from_slice(&b);
        Ok(())
    }
}

/// The name of a CM attribute id, `None` if it names no CM message.
pub const fn attribute_name(attribute_id: u16) -> Option<&'static str> {
    Some(match attribute_id {
        attr::CLASS_PORT_INFO => "ClassPortInfo",
        attr::REQ => "REQ",
        attr::MRA => "MRA",
        attr::REJ => "REJ",
        attr::REP => "REP",
        attr::RTU => "RTU",
        attr::DREQ => "DREQ",
        attr::DREP => "DREP",
        attr::SIDR_REQ => "SIDR_REQ",
        attr::SIDR_REP => "SIDR_REP",
        attr::LAP => "LAP",
        attr::APR => "APR",
        _ => return None,
    })
}

/// A whole CM MAD: the common header and the message it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmMad {
    /// The common MAD header (its attribute id is the message's).
    pub header: MadHeader,
    /// The message.
    pub message: CmMessage,
}

impl CmMad {
    /// A CM MAD with the standard header for `message` (IBTA 12.6.1).
    pub const fn new(transaction_id: u64, message: CmMessage) -> CmMad {
        CmMad {
            header: MadHeader::cm(message.attribute_id(), transaction_id),
            message,
        }
    }

    /// Reads a 256-byte MAD that must be a CM MAD of class version 2 with method Send.
    /// Bytes past 256 (UD payload padding) are ignored.
    pub fn parse(mad: &[u8]) -> MadResult<CmMad> {
        let v = MadPacket::new_checked(mad)?;
        let header = MadHeader::parse(&v)?;
        header.check_cm()?;
        let message = CmMessage::parse(header.attribute_id, v.data())?;
        Ok(CmMad { header, message })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        MAD_LEN
    }

    /// Writes the 256-byte MAD; the header's attribute id is taken from the message.
    pub fn emit(&self, buf: &mut [u8]) -> MadResult<()> {
        check_mad_len("MAD buffer", MAD_LEN, buf.len())?;
        let header = MadHeader {
            attribute_id: self.message.attribute_id(),
            ..self.header
        };
        self.message.emit(&mut buf[MAD_HEADER_LEN..MAD_LEN])?;
        header.emit(&mut buf[..MAD_HEADER_LEN])
    }

    /// The MAD as a fresh 256-byte array.
    pub fn to_bytes(&self) -> MadResult<[u8; MAD_LEN]> {
        let mut out = [0u8; MAD_LEN];
        self.emit(&mut out)?;
        Ok(out)
    }
}

/// The CM MAD a RoCE packet carries, if it is one: a UD SEND to QP1 (the GSI, IBTA 13.5.1)
/// whose MAD is of the CM class. `None` for any other packet (including GSI MADs of other
/// classes); `Some(Err)` for a CM MAD that does not parse.
pub fn gsi_cm_mad(packet: &super::packet::PacketRepr<'_>) -> Option<MadResult<CmMad>> {
    use super::mad::{GSI_QPN, MGMT_CLASS_CM};
    if packet.bth.opcode != super::opcode::Opcode::UD_SEND_ONLY
        || packet.bth.dest_qp != GSI_QPN
        || packet.payload.get(1) != Some(&MGMT_CLASS_CM)
    {
        return None;
    }
    Some(CmMad::parse(packet.payload))
}
