//! The values the caller and the agent exchange: ids, the peer's address, requests and
//! replies, events, states, errors and counters.
use std::time::Duration;

use crate::wire::addr::Gid;
use crate::wire::cm::{CmRep, CmReq, PathMtu, RejectReason, SidrStatus, TransportType};

/// The unit of every CM timeout field: 4.096 µs × 2^exponent (IBTA 12.6.5, "Remote CM
/// Response Timeout" and the others). Exponents above 31 count as 31.
pub fn iba_time(exponent: u8) -> Duration {
    crate::wire::cm::timeout_duration(exponent)
}

/// Where a MAD came from or goes to: the peer's port and QP (QP1 for CM MADs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct MadPeer {
    /// The peer port's GID (on RoCE v2 its IP address, [`Gid::from_ip`]).
    pub gid: Gid,
    /// The source or destination QP: 1 for the GSI.
    pub qpn: u32,
    /// The P_Key index the MAD came in on or goes out with.
    pub pkey_index: u16,
    /// The peer's MAC when the caller knows it (the agent only copies it).
    pub mac: Option<[u8; 6]>,
}

/// A MAD for the caller to send on QP1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutgoingMad {
    pub to: MadPeer,
    /// The whole 256-byte MAD (IBTA 13.4.3).
    pub bytes: Vec<u8>,
}

/// A connection: its local communication id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u32);

/// A listener made by [`CmAgent::listen`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListenId(pub u32);

/// A SIDR exchange: on the requesting side the SIDR_REQ's request id, on the answering side a
/// handle of the agent's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SidrId(pub u32);

/// The agent's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CmConfig {
    /// This CA's GUID: sent in REQ and REP, and in the ARI of a REJ "timeout".
    pub local_ca_guid: u64,
    /// The packet lifetime exponent of the paths (4.096 µs × 2^t); RoCE has no SA to ask.
    /// 18 (1.07 s) as rxe's kernel rdma_cm uses: its REQ is resent after 2 × 2^(18-8) ms +
    /// 2^(20-8) ms = 6.1 s (tests/fixtures/rxe_cm_lost_req.pcap). Every wait for an answer
    /// adds twice this; time wait is twice this plus the target ACK delay.
    pub packet_life_time: u8,
    /// What a REQ of ours puts in "Local CM Response Timeout": how long the passive side
    /// should wait for our RTU.
    pub local_cm_response_timeout: u8,
    /// The service timeout exponent of the MRA the agent sends on its own when a duplicate
    /// REQ arrives while the user has not yet answered the first (IBTA 12.6.6); 24 (68.7 s)
    /// as rxe's rdma_cm sends (tests/fixtures/rxe_cm_slow_accept.pcap).
    pub duplicate_req_mra_timeout: u8,
    /// A peer's timeout exponents above this are taken as this (a peer's 31 would make us
    /// wait 2.4 hours); counted in [`CmStats::clamped_timeouts`].
    pub max_peer_timeout_exponent: u8,
    /// The first local communication id handed out (a random start makes ids of a restarted
    /// agent unlikely to meet the peer's memory of the old ones).
    pub first_comm_id: u32,
    /// `Some(p)`: every local communication id and SIDR request id has `p` in bits 24..31
    /// (only the low 24 bits count up). Behind an `xroce relay` this is the process's slot:
    /// the relay hands a CM MAD that echoes one of our ids (REP, RTU, REJ, MRA, DREQ, DREP,
    /// LAP, APR: the remote comm id; SIDR_REP: the request id) to the process it names, as
    /// Linux's CM finds the id's owner by comm id (cm_acquire_id). `None`: all 32 bits.
    pub comm_id_prefix: Option<u8>,
    /// The first transaction id.
    pub first_tid: u64,
    /// More connections than this are refused with REJ "no resources" (a REQ flood is
    /// bounded).
    pub max_connections: usize,
    /// How long the answering side of SIDR keeps its SIDR_REP to resend on a duplicate
    /// SIDR_REQ.
    pub sidr_reply_linger: Duration,
    /// How long a REQ or SIDR_REQ for a service id nobody listens on waits for a listener
    /// before it is refused (REJ "invalid service id", IBTA 12.6.7; SIDR_REP status 1,
    /// 12.11.2). Zero refuses at once, as Linux's CM does. A program whose client may connect
    /// a moment before its server listens (perftest 4.5's `-R`) is then served, and one that
    /// connects where nobody will listen learns it this much later. Not used with a
    /// `comm_id_prefix` (behind a relay the listener may appear in another process).
    pub listen_grace: Duration,
}

impl Default for CmConfig {
    fn default() -> CmConfig {
        CmConfig {
            local_ca_guid: 0,
            packet_life_time: 18,
            local_cm_response_timeout: 20,
            duplicate_req_mra_timeout: 24,
            max_peer_timeout_exponent: 24,
            first_comm_id: 1,
            comm_id_prefix: None,
            first_tid: 1,
            max_connections: 65536,
            sidr_reply_linger: Duration::from_secs(2),
            listen_grace: Duration::ZERO,
        }
    }
}

/// What [`CmAgent::connect`] puts in its REQ (IBTA 12.6.5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectRequest {
    /// Where the REQ goes: the peer's port, QP1.
    pub to: MadPeer,
    pub service_id: u64,
    /// This port's GID and the peer's, for the REQ's primary path.
    pub local_gid: Gid,
    pub remote_gid: Gid,
    /// Our QP and its first PSN.
    pub qpn: u32,
    pub starting_psn: u32,
    pub qkey: u32,
    pub transport: TransportType,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// Transport retries (3 bits) and RNR retries (3 bits; 7 means forever).
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub path_mtu: PathMtu,
    pub pkey: u16,
    pub traffic_class: u8,
    pub hop_limit: u8,
    pub flow_label: u32,
    pub sl: u8,
    /// Exponent: the transport's local ACK timeout.
    pub local_ack_timeout: u8,
    /// Exponent: how long we wait for the REP ("Remote CM Response Timeout").
    pub cm_response_timeout: u8,
    /// How many times the REQ is sent again before giving up (4 bits).
    pub max_cm_retries: u8,
    pub srq: bool,
    /// At most 92 bytes.
    pub private_data: Vec<u8>,
}

impl Default for ConnectRequest {
    fn default() -> ConnectRequest {
        ConnectRequest {
            to: MadPeer {
                qpn: 1,
                ..MadPeer::default()
            },
            service_id: 0,
            local_gid: Gid::default(),
            remote_gid: Gid::default(),
            qpn: 0,
            starting_psn: 0,
            qkey: 0,
            transport: TransportType::Rc,
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            path_mtu: PathMtu::Mtu4096,
            pkey: 0xffff,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
            sl: 0,
            local_ack_timeout: 14,
            cm_response_timeout: 20,
            max_cm_retries: 15,
            srq: false,
            private_data: Vec::new(),
        }
    }
}

/// What [`CmAgent::accept`] puts in its REP (IBTA 12.6.8).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ReplyParams {
    pub qpn: u32,
    pub starting_psn: u32,
    pub qkey: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// Exponent: how long our transport may take to ACK.
    pub target_ack_delay: u8,
    pub end_to_end_flow_control: bool,
    pub rnr_retry_count: u8,
    pub srq: bool,
    /// At most 196 bytes.
    pub private_data: Vec<u8>,
}

/// What [`CmAgent::sidr_request`] sends (IBTA 12.11.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrRequest {
    pub to: MadPeer,
    pub service_id: u64,
    pub pkey: u16,
    /// Exponent: how long to wait for the SIDR_REP before sending again.
    pub timeout: u8,
    pub max_retries: u8,
    /// At most 216 bytes.
    pub private_data: Vec<u8>,
}

/// What [`CmAgent::sidr_reply`] sends (IBTA 12.11.2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrReply {
    pub status: SidrStatus,
    pub qpn: u32,
    pub qkey: u32,
    /// At most 136 bytes.
    pub private_data: Vec<u8>,
}

/// What happened, for the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for one of our listeners: answer with accept, reject or send_mra.
    ReqReceived {
        conn: ConnId,
        listen: ListenId,
        from: MadPeer,
        req: CmReq,
    },
    /// Our REQ was answered: move the QP to RTR/RTS, then send_rtu (or reject).
    RepReceived { conn: ConnId, rep: CmRep },
    /// The peer needs more time; our wait was extended by `service_timeout`.
    MraReceived {
        conn: ConnId,
        service_timeout: Duration,
    },
    /// The connection is up: RTU received or sent, or [`CmAgent::establish`] called.
    Established { conn: ConnId },
    /// The connection attempt ended with a REJ: the peer's (`from_peer`) or one we sent
    /// because the peer's answer showed a stale connection.
    Rejected {
        conn: ConnId,
        reason: RejectReason,
        ari: Vec<u8>,
        private_data: Vec<u8>,
        from_peer: bool,
    },
    /// Our REQ or REP was sent `1 + max_cm_retries` times and never answered; a REJ
    /// "timeout" went to the peer.
    Timeout { conn: ConnId },
    /// The peer sent DREQ: call disconnect to answer with DREP.
    DisconnectRequested { conn: ConnId, private_data: Vec<u8> },
    /// The connection is closed and in time wait: DREP sent or received, or our DREQ was
    /// never answered (`timed_out`).
    Disconnected {
        conn: ConnId,
        private_data: Vec<u8>,
        timed_out: bool,
    },
    /// Time wait is over; the id is gone and may be reused later.
    TimewaitExit { conn: ConnId },
    /// A SIDR_REQ for one of our listeners: answer with sidr_reply.
    SidrReqReceived {
        sidr: SidrId,
        listen: ListenId,
        from: MadPeer,
        service_id: u64,
        pkey: u16,
        private_data: Vec<u8>,
    },
    /// The answer to our SIDR_REQ.
    SidrRepReceived {
        sidr: SidrId,
        status: SidrStatus,
        qpn: u32,
        qkey: u32,
        additional_info: Vec<u8>,
        private_data: Vec<u8>,
    },
    /// Our SIDR_REQ was never answered.
    SidrTimeout { sidr: SidrId },
}

impl CmEvent {
    /// The connection the event is about (`None` for SIDR events).
    pub fn conn(&self) -> Option<ConnId> {
        match self {
            CmEvent::ReqReceived { conn, .. }
            | CmEvent::RepReceived { conn, .. }
            | CmEvent::MraReceived { conn, .. }
            | CmEvent::Established { conn }
            | CmEvent::Rejected { conn, .. }
            | CmEvent::Timeout { conn }
            | CmEvent::DisconnectRequested { conn, .. }
            | CmEvent::Disconnected { conn, .. }
            | CmEvent::TimewaitExit { conn } => Some(*conn),
            CmEvent::SidrReqReceived { .. }
            | CmEvent::SidrRepReceived { .. }
            | CmEvent::SidrTimeout { .. } => None,
        }
    }
}

/// A connection's state (IBTA 12.9.5, 12.9.6, figures 158 and 159).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Active: REQ sent, waiting for REP.
    ReqSent,
    /// Active: the peer sent MRA for our REQ.
    MraReqRcvd,
    /// Passive: REQ received, waiting for the user.
    ReqRcvd,
    /// Passive: we sent MRA for the REQ.
    MraReqSent,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Passive: the peer sent MRA for our REP.
    MraRepRcvd,
    /// Active: REP received, waiting for the user's RTU.
    RepRcvd,
    /// Active: we sent MRA for the REP.
    MraRepSent,
    Established,
    DreqSent,
    DreqRcvd,
    TimeWait,
}

/// Errors of the user API.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    #[error("no connection {0:?}")]
    NoSuchConnection(ConnId),
    #[error("connection {conn:?} is in state {state:?}, which does not allow this")]
    WrongState { conn: ConnId, state: State },
    #[error("private data of {len} bytes, the message holds {max}")]
    PrivateDataTooLong { len: usize, max: usize },
    #[error("additional rejection information of {len} bytes, REJ holds 72")]
    AriTooLong { len: usize },
    #[error("service id {service_id:#x} (mask {mask:#x}) overlaps an existing listener")]
    ServiceIdInUse { service_id: u64, mask: u64 },
    #[error("no listener {0:?}")]
    NoSuchListener(ListenId),
    #[error("no SIDR exchange {0:?} waiting for a reply")]
    NoSuchSidr(SidrId),
    #[error("{0} connections, the configured maximum")]
    TooManyConnections(usize),
    #[error("{field} = {value} is out of range")]
    OutOfRange { field: &'static str, value: u32 },
}

/// Counters: what the agent sent, and every MAD it dropped, by why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CmStats {
    pub received: u64,
    pub sent: u64,
    /// Sends again of a message after a timeout.
    pub retransmits: u64,
    /// Answers sent again for a duplicate (MRA, REP, RTU, DREP, REJ stale).
    pub duplicate_answers: u64,
    pub rejects_sent: u64,
    /// MADs that did not parse or are not CM messages.
    pub dropped_malformed: u64,
    /// LAP and APR (alternate paths, IBTA 12.8), which the agent does not take.
    pub dropped_unsupported: u64,
    /// Messages for a connection we do not have.
    pub dropped_unknown_connection: u64,
    /// Duplicates needing no answer.
    pub dropped_duplicate: u64,
    /// Messages the connection's state does not take.
    pub dropped_wrong_state: u64,
    /// Messages whose comm ids or QPN do not match the connection's.
    pub dropped_mismatch: u64,
    /// Peer timeout exponents clamped to `max_peer_timeout_exponent`.
    pub clamped_timeouts: u64,
    /// Messages of ours that could not be encoded (none, unless the agent has a bug).
    pub unencodable: u64,
    /// REQs and SIDR_REQs that waited for a listener ([`CmConfig::listen_grace`]).
    pub held_for_listener: u64,
}
