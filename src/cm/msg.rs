//! The CM messages as the state machine sees them: every field it reads or writes, private
//! data as the bytes of the field (IBTA 12.6). `codec` turns them into MAD bytes and back
//! through `crate::wire::cm`.

use crate::netdev::Gid;

/// Private data lengths of each message (IBTA 12.6.5 to 12.6.11, 12.11.1, 12.11.2).
pub mod private_len {
    pub const REQ: usize = 92;
    pub const MRA: usize = 222;
    pub const REJ: usize = 148;
    pub const REP: usize = 196;
    pub const RTU: usize = 224;
    pub const DREQ: usize = 220;
    pub const DREP: usize = 224;
    pub const SIDR_REQ: usize = 216;
    pub const SIDR_REP: usize = 136;
    /// REJ's Additional Rejection Information (IBTA 12.6.7).
    pub const REJ_ARI: usize = 72;
    /// SIDR_REP's Additional Information (IBTA 12.11.2).
    pub const SIDR_REP_INFO: usize = 72;
}

/// Which message a REJ or MRA answers (IBTA 12.6.6 "Message MRAed", 12.6.7 "Message REJected").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageKind {
    Req,
    Rep,
    Other,
}

impl MessageKind {
    pub fn to_bits(self) -> u8 {
        match self {
            MessageKind::Req => 0,
            MessageKind::Rep => 1,
            MessageKind::Other => 2,
        }
    }

    pub fn from_bits(bits: u8) -> MessageKind {
        match bits {
            0 => MessageKind::Req,
            1 => MessageKind::Rep,
            _ => MessageKind::Other,
        }
    }
}

/// The transport a REQ asks for (IBTA 12.6.5 "Transport Service Type").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportType {
    Rc,
    Uc,
    /// RD, XRC, or a reserved value: rejected with "invalid transport type".
    Other(u8),
}

impl TransportType {
    pub fn to_bits(self) -> u8 {
        match self {
            TransportType::Rc => 0,
            TransportType::Uc => 1,
            TransportType::Other(bits) => bits,
        }
    }

    pub fn from_bits(bits: u8) -> TransportType {
        match bits {
            0 => TransportType::Rc,
            1 => TransportType::Uc,
            other => TransportType::Other(other),
        }
    }
}

/// The fields of a REQ (IBTA 12.6.5): the primary path only (RoCE has no alternate path
/// in practice; a REQ with one is accepted and the alternate is ignored).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Req {
    pub local_comm_id: u32,
    pub service_id: u64,
    pub local_ca_guid: u64,
    pub local_qkey: u32,
    pub local_qpn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// Exponent: how long the sender waits for the REP (4.096 µs × 2^t).
    pub remote_cm_response_timeout: u8,
    pub transport: u8,
    pub end_to_end_flow_control: bool,
    pub starting_psn: u32,
    /// Exponent: how long the receiver should wait for the sender's RTU.
    pub local_cm_response_timeout: u8,
    pub retry_count: u8,
    pub pkey: u16,
    pub path_mtu: u8,
    pub rnr_retry_count: u8,
    pub max_cm_retries: u8,
    pub srq: bool,
    pub primary_local_gid: Gid,
    pub primary_remote_gid: Gid,
    pub primary_flow_label: u32,
    pub primary_traffic_class: u8,
    pub primary_hop_limit: u8,
    pub primary_sl: u8,
    pub primary_local_ack_timeout: u8,
    pub private_data: Vec<u8>,
}

/// MRA (IBTA 12.6.6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mra {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub message_mraed: MessageKind,
    /// Exponent: 4.096 µs × 2^t more the receiver should wait.
    pub service_timeout: u8,
    pub private_data: Vec<u8>,
}

/// REJ (IBTA 12.6.7). The reason is the 16-bit code; `crate::wire::cm::RejectReason` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rej {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub message_rejected: MessageKind,
    pub reason: u16,
    pub ari: Vec<u8>,
    pub private_data: Vec<u8>,
}

/// REP (IBTA 12.6.8).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Rep {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub local_qkey: u32,
    pub local_qpn: u32,
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub target_ack_delay: u8,
    pub failover_accepted: u8,
    pub end_to_end_flow_control: bool,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub local_ca_guid: u64,
    pub private_data: Vec<u8>,
}

/// RTU (IBTA 12.6.9), DREP (12.6.11): comm ids and private data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommIdsAndData {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub private_data: Vec<u8>,
}

/// DREQ (IBTA 12.6.10).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dreq {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// The QPN of the receiver's end of the connection.
    pub remote_qpn: u32,
    pub private_data: Vec<u8>,
}

/// SIDR_REQ (IBTA 12.11.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrReq {
    pub request_id: u32,
    pub pkey: u16,
    pub service_id: u64,
    pub private_data: Vec<u8>,
}

/// SIDR_REP (IBTA 12.11.2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrRep {
    pub request_id: u32,
    pub status: u8,
    pub additional_info: Vec<u8>,
    pub qpn: u32,
    pub service_id: u64,
    pub qkey: u32,
    pub private_data: Vec<u8>,
}

/// One CM message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    Req(Req),
    Mra(Mra),
    Rej(Rej),
    Rep(Rep),
    Rtu(CommIdsAndData),
    Dreq(Dreq),
    Drep(CommIdsAndData),
    SidrReq(SidrReq),
    SidrRep(SidrRep),
}

impl Msg {
    pub fn name(&self) -> &'static str {
        match self {
            Msg::Req(_) => "REQ",
            Msg::Mra(_) => "MRA",
            Msg::Rej(_) => "REJ",
            Msg::Rep(_) => "REP",
            Msg::Rtu(_) => "RTU",
            Msg::Dreq(_) => "DREQ",
            Msg::Drep(_) => "DREP",
            Msg::SidrReq(_) => "SIDR_REQ",
            Msg::SidrRep(_) => "SIDR_REP",
        }
    }
}

/// A message with the transaction id of its MAD header (IBTA 13.4.6.4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    pub tid: u64,
    pub msg: Msg,
}
