//! The InfiniBand communication manager's protocol (IBTA chapter 12) as a sans-IO state
//! machine, in the style of the engine: time is an argument, nothing here reads a clock or
//! touches a socket or a QP.
//!
//! One [`CmAgent`] serves one port (GID). The caller feeds it the CM MADs that arrive on QP1
//! ([`CmAgent::handle_mad`]), sends what [`CmAgent::poll_transmit`] hands out, runs
//! [`CmAgent::handle_timeout`] at [`CmAgent::poll_timeout`], and reads [`CmEvent`]s from
//! [`CmAgent::poll_event`]. The agent knows nothing about QPs: the caller (the rdma_cm layer)
//! moves its QPs through INIT/RTR/RTS from the events' contents, then answers with
//! [`CmAgent::accept`], [`CmAgent::send_rtu`], [`CmAgent::reject`], [`CmAgent::disconnect`].
//!
//! The states, timers and rules are described in docs/cm.md, "The state machine".
//!
//! Every connection is named by its local communication id ([`ConnId`]); an id is not handed
//! out again while a connection holds it, time wait included (IBTA 12.9.8.3).

mod msg;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Duration;

pub use crate::engine::Instant;
use crate::netdev::Gid;
use crate::wire::cm::{
    CmDrep, CmDreq, CmMessage, CmMra, CmPath, CmRej, CmRtu, FailoverAccepted, MraedMessage,
    PrivateData, RejectedMessage, SidrRep, SidrReq, ARI_LEN,
};
pub use crate::wire::cm::{CmRep, CmReq, PathMtu, RejectReason, SidrStatus, TransportType};
use msg::Envelope;

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
}

/// A message sent until it is answered.
#[derive(Clone, Debug)]
struct Pending {
    env: Envelope,
    retries_left: u8,
}

#[derive(Clone, Debug)]
struct Conn {
    state: State,
    peer: MadPeer,
    /// The peer's comm id, 0 until known.
    remote_comm_id: u32,
    remote_ca_guid: u64,
    /// The peer's QPN, 0 until known.
    remote_qpn: u32,
    local_qpn: u32,
    /// The transaction of the REQ/REP/RTU exchange, then of the DREQ/DREP one.
    tid: u64,
    max_cm_retries: u8,
    /// How long the peer may take to answer us (2 × packet lifetime + its response time).
    response_timeout: Duration,
    time_wait: Duration,
    pending: Option<Pending>,
    /// The last answer that needs no answer (MRA, RTU), sent again on a duplicate.
    answer: Option<Envelope>,
    deadline: Option<Instant>,
    mra_seen: bool,
}

#[derive(Clone, Debug)]
struct Listener {
    id: ListenId,
    service_id: u64,
    mask: u64,
}

#[derive(Clone, Debug)]
struct SidrOut {
    peer: MadPeer,
    env: Envelope,
    retries_left: u8,
    timeout: Duration,
    deadline: Instant,
}

#[derive(Clone, Debug)]
struct SidrIn {
    peer: MadPeer,
    request_id: u32,
    service_id: u64,
    /// The SIDR_REQ's transaction id, which the SIDR_REP carries back.
    tid: u64,
    reply: Option<Envelope>,
    /// Set once replied: when the reply is forgotten.
    deadline: Option<Instant>,
}

/// The CM of one port. See the module docs.
#[derive(Debug)]
pub struct CmAgent {
    config: CmConfig,
    listeners: Vec<Listener>,
    next_listen: u32,
    conns: BTreeMap<u32, Conn>,
    /// (peer CA GUID, peer comm id) → local comm id: duplicate REQs (IBTA 12.9.7).
    by_remote_id: HashMap<(u64, u32), u32>,
    /// (peer CA GUID, peer QPN) → local comm id of a connection not in time wait: stale
    /// connections (IBTA 12.9.7, 12.9.8.3).
    by_remote_qpn: HashMap<(u64, u32), u32>,
    next_comm_id: u32,
    next_tid: u64,
    sidr_out: BTreeMap<u32, SidrOut>,
    next_sidr_request: u32,
    sidr_in: BTreeMap<u32, SidrIn>,
    /// (peer GID, request id) → the local handle of a SIDR_REQ we answer.
    sidr_in_by_request: HashMap<(Gid, u32), u32>,
    next_sidr_in: u32,
    transmit: VecDeque<(MadPeer, Envelope)>,
    events: VecDeque<CmEvent>,
    /// Connections the user is done with ([`CmAgent::abandon`]): no more events for them.
    abandoned: HashSet<u32>,
    stats: CmStats,
}

/// The user's private data as a message's fixed field (zero padded, IBTA 12.6).
fn private<const N: usize>(data: &[u8]) -> Result<PrivateData<N>, CmError> {
    PrivateData::from_slice(data).map_err(|_| CmError::PrivateDataTooLong {
        len: data.len(),
        max: N,
    })
}

/// The user's additional rejection information as REJ's field and its length.
fn ari_field(ari: &[u8]) -> Result<([u8; ARI_LEN], u8), CmError> {
    if ari.len() > ARI_LEN {
        return Err(CmError::AriTooLong { len: ari.len() });
    }
    let mut field = [0u8; ARI_LEN];
    field[..ari.len()].copy_from_slice(ari);
    Ok((field, ari.len() as u8))
}

/// A REJ (IBTA 12.6.7) from the agent itself, with no private data.
fn agent_rej(
    local_comm_id: u32,
    remote_comm_id: u32,
    message_rejected: RejectedMessage,
    reason: RejectReason,
    ari: &[u8],
) -> CmMessage {
    let (ari, reject_info_length) = ari_field(ari).unwrap_or(([0; ARI_LEN], 0));
    CmMessage::Rej(CmRej {
        local_comm_id,
        remote_comm_id,
        message_rejected,
        reject_info_length,
        reason,
        ari,
        private_data: PrivateData::zeroed(),
    })
}

fn check_bits(field: &'static str, value: u32, bits: u32) -> Result<(), CmError> {
    if value >> bits != 0 {
        return Err(CmError::OutOfRange { field, value });
    }
    Ok(())
}

impl CmAgent {
    pub fn new(config: CmConfig) -> CmAgent {
        CmAgent {
            next_comm_id: config.first_comm_id,
            next_tid: config.first_tid,
            next_sidr_request: config.first_comm_id,
            config,
            listeners: Vec::new(),
            next_listen: 1,
            conns: BTreeMap::new(),
            by_remote_id: HashMap::new(),
            by_remote_qpn: HashMap::new(),
            sidr_out: BTreeMap::new(),
            sidr_in: BTreeMap::new(),
            sidr_in_by_request: HashMap::new(),
            next_sidr_in: 1,
            transmit: VecDeque::new(),
            events: VecDeque::new(),
            abandoned: HashSet::new(),
            stats: CmStats::default(),
        }
    }

    pub fn config(&self) -> &CmConfig {
        &self.config
    }

    pub fn stats(&self) -> &CmStats {
        &self.stats
    }

    /// A connection's state; `None` once it is gone (after time wait, or rejected early).
    pub fn state(&self, conn: ConnId) -> Option<State> {
        self.conns.get(&conn.0).map(|c| c.state)
    }

    /// How many connections the agent holds, time wait included.
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Take REQs and SIDR_REQs whose service id matches `service_id` under `mask` (all ones
    /// when `None`). Listeners may not overlap.
    pub fn listen(&mut self, service_id: u64, mask: Option<u64>) -> Result<ListenId, CmError> {
        let mask = mask.unwrap_or(u64::MAX);
        let overlaps = self.listeners.iter().any(|l| {
            let common = l.mask & mask;
            l.service_id & common == service_id & common
        });
        if overlaps {
            return Err(CmError::ServiceIdInUse { service_id, mask });
        }
        let id = ListenId(self.next_listen);
        self.next_listen = self.next_listen.wrapping_add(1);
        self.listeners.push(Listener {
            id,
            service_id: service_id & mask,
            mask,
        });
        Ok(id)
    }

    pub fn unlisten(&mut self, listen: ListenId) -> Result<(), CmError> {
        let before = self.listeners.len();
        self.listeners.retain(|l| l.id != listen);
        if self.listeners.len() == before {
            return Err(CmError::NoSuchListener(listen));
        }
        Ok(())
    }

    fn find_listener(&self, service_id: u64) -> Option<ListenId> {
        self.listeners
            .iter()
            .find(|l| service_id & l.mask == l.service_id)
            .map(|l| l.id)
    }

    /// `counter` as an id of ours: with the configured prefix in bits 24..31, if any.
    fn local_id(&self, counter: u32) -> u32 {
        match self.config.comm_id_prefix {
            Some(p) => (u32::from(p) << 24) | (counter & 0x00ff_ffff),
            None => counter,
        }
    }

    fn alloc_comm_id(&mut self) -> u32 {
        loop {
            let id = self.local_id(self.next_comm_id);
            self.next_comm_id = self.next_comm_id.wrapping_add(1);
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    fn alloc_tid(&mut self) -> u64 {
        let tid = self.next_tid;
        self.next_tid = self.next_tid.wrapping_add(1);
        tid
    }

    /// A peer's timeout exponent, clamped.
    fn peer_time(&mut self, exponent: u8) -> Duration {
        if exponent > self.config.max_peer_timeout_exponent {
            self.stats.clamped_timeouts += 1;
            return iba_time(self.config.max_peer_timeout_exponent);
        }
        iba_time(exponent)
    }

    fn packet_life(&self) -> Duration {
        iba_time(self.config.packet_life_time)
    }

    fn send(&mut self, to: MadPeer, env: Envelope) {
        if matches!(env.msg, CmMessage::Rej(_)) {
            self.stats.rejects_sent += 1;
        }
        self.transmit.push_back((to, env));
    }

    fn conn_mut(&mut self, conn: ConnId) -> Result<&mut Conn, CmError> {
        self.conns
            .get_mut(&conn.0)
            .ok_or(CmError::NoSuchConnection(conn))
    }

    /// Send a REQ (IBTA 12.6.5) and wait for REP, resending it every
    /// 2 × packet lifetime + 4.096 µs × 2^cm_response_timeout, `max_cm_retries` times.
    pub fn connect(&mut self, now: Instant, request: ConnectRequest) -> Result<ConnId, CmError> {
        let private_data = private(&request.private_data)?;
        check_bits("qpn", request.qpn, 24)?;
        check_bits("starting_psn", request.starting_psn, 24)?;
        check_bits("retry_count", request.retry_count.into(), 3)?;
        check_bits("rnr_retry_count", request.rnr_retry_count.into(), 3)?;
        check_bits("max_cm_retries", request.max_cm_retries.into(), 4)?;
        check_bits("cm_response_timeout", request.cm_response_timeout.into(), 5)?;
        check_bits("local_ack_timeout", request.local_ack_timeout.into(), 5)?;
        check_bits("flow_label", request.flow_label, 20)?;
        check_bits("sl", request.sl.into(), 4)?;
        if request.path_mtu.bytes().is_none() {
            return Err(CmError::OutOfRange {
                field: "path_mtu",
                value: request.path_mtu.code().into(),
            });
        }
        if !matches!(request.transport, TransportType::Rc | TransportType::Uc) {
            return Err(CmError::OutOfRange {
                field: "transport",
                value: request.transport.code().into(),
            });
        }
        if self.conns.len() >= self.config.max_connections {
            return Err(CmError::TooManyConnections(self.conns.len()));
        }
        let local_comm_id = self.alloc_comm_id();
        let tid = self.alloc_tid();
        let req = CmReq {
            local_comm_id,
            service_id: request.service_id,
            local_ca_guid: self.config.local_ca_guid,
            local_qkey: request.qkey,
            local_qpn: request.qpn,
            responder_resources: request.responder_resources,
            initiator_depth: request.initiator_depth,
            remote_cm_response_timeout: request.cm_response_timeout,
            transport_type: request.transport,
            starting_psn: request.starting_psn,
            local_cm_response_timeout: self.config.local_cm_response_timeout.min(31),
            retry_count: request.retry_count,
            partition_key: request.pkey,
            path_mtu: request.path_mtu,
            rnr_retry_count: request.rnr_retry_count,
            max_cm_retries: request.max_cm_retries,
            srq: request.srq,
            primary_path: CmPath {
                local_lid: 0,
                remote_lid: 0,
                local_gid: request.local_gid.0,
                remote_gid: request.remote_gid.0,
                flow_label: request.flow_label,
                packet_rate: 0,
                traffic_class: request.traffic_class,
                hop_limit: request.hop_limit,
                sl: request.sl,
                subnet_local: false,
                local_ack_timeout: request.local_ack_timeout,
            },
            private_data,
            ..CmReq::default()
        };
        let response_timeout = self.packet_life() * 2 + iba_time(request.cm_response_timeout);
        let env = Envelope {
            tid,
            msg: CmMessage::Req(req),
        };
        self.conns.insert(
            local_comm_id,
            Conn {
                state: State::ReqSent,
                peer: request.to,
                remote_comm_id: 0,
                remote_ca_guid: 0,
                remote_qpn: 0,
                local_qpn: request.qpn,
                tid,
                max_cm_retries: request.max_cm_retries,
                response_timeout,
                time_wait: self.packet_life() * 2,
                pending: Some(Pending {
                    env: env.clone(),
                    retries_left: request.max_cm_retries,
                }),
                answer: None,
                deadline: Some(now + response_timeout),
                mra_seen: false,
            },
        );
        self.send(request.to, env);
        Ok(ConnId(local_comm_id))
    }

    /// Answer a REQ with REP (IBTA 12.6.8); wait for RTU, resending the REP as the REQ's
    /// "Local CM Response Timeout" and "Max CM Retries" say.
    pub fn accept(
        &mut self,
        now: Instant,
        conn: ConnId,
        params: ReplyParams,
    ) -> Result<(), CmError> {
        let private_data = private(&params.private_data)?;
        check_bits("qpn", params.qpn, 24)?;
        check_bits("starting_psn", params.starting_psn, 24)?;
        check_bits("rnr_retry_count", params.rnr_retry_count.into(), 3)?;
        check_bits("target_ack_delay", params.target_ack_delay.into(), 5)?;
        let local_ca_guid = self.config.local_ca_guid;
        let packet_life = self.packet_life();
        let target_ack_delay = iba_time(params.target_ack_delay);
        let c = self.conn_mut(conn)?;
        if !matches!(c.state, State::ReqRcvd | State::MraReqSent) {
            return Err(CmError::WrongState {
                conn,
                state: c.state,
            });
        }
        let rep = CmRep {
            local_comm_id: conn.0,
            remote_comm_id: c.remote_comm_id,
            local_qkey: params.qkey,
            local_qpn: params.qpn,
            starting_psn: params.starting_psn,
            responder_resources: params.responder_resources,
            initiator_depth: params.initiator_depth,
            target_ack_delay: params.target_ack_delay,
            // RoCE has no alternate path (IBTA 12.6.8).
            failover_accepted: FailoverAccepted::NotSupported,
            end_to_end_flow_control: params.end_to_end_flow_control,
            rnr_retry_count: params.rnr_retry_count,
            srq: params.srq,
            local_ca_guid,
            private_data,
            ..CmRep::default()
        };
        let env = Envelope {
            tid: c.tid,
            msg: CmMessage::Rep(rep),
        };
        c.state = State::RepSent;
        c.local_qpn = params.qpn;
        c.time_wait = packet_life * 2 + target_ack_delay;
        c.pending = Some(Pending {
            env: env.clone(),
            retries_left: c.max_cm_retries,
        });
        c.answer = None;
        c.deadline = Some(now + c.response_timeout);
        let to = c.peer;
        self.send(to, env);
        Ok(())
    }

    /// Send MRA (IBTA 12.6.6) for the REQ (passive, before accept) or the REP (active,
    /// before send_rtu): the peer waits `4.096 µs × 2^service_timeout` longer.
    pub fn send_mra(
        &mut self,
        _now: Instant,
        conn: ConnId,
        service_timeout: u8,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let private_data = private(private_data)?;
        check_bits("service_timeout", service_timeout.into(), 5)?;
        let c = self.conn_mut(conn)?;
        let (kind, next) = match c.state {
            State::ReqRcvd | State::MraReqSent => (MraedMessage::Req, State::MraReqSent),
            State::RepRcvd | State::MraRepSent => (MraedMessage::Rep, State::MraRepSent),
            state => return Err(CmError::WrongState { conn, state }),
        };
        let env = Envelope {
            tid: c.tid,
            msg: CmMessage::Mra(CmMra {
                local_comm_id: conn.0,
                remote_comm_id: c.remote_comm_id,
                message_mraed: kind,
                service_timeout,
                private_data,
            }),
        };
        c.state = next;
        c.answer = Some(env.clone());
        let to = c.peer;
        self.send(to, env);
        Ok(())
    }

    /// Active side, after RepReceived and moving the QP to RTR/RTS: send RTU (IBTA 12.6.9);
    /// the connection is established.
    pub fn send_rtu(
        &mut self,
        _now: Instant,
        conn: ConnId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let private_data = private(private_data)?;
        let c = self.conn_mut(conn)?;
        if !matches!(c.state, State::RepRcvd | State::MraRepSent) {
            return Err(CmError::WrongState {
                conn,
                state: c.state,
            });
        }
        let env = Envelope {
            tid: c.tid,
            msg: CmMessage::Rtu(CmRtu {
                local_comm_id: conn.0,
                remote_comm_id: c.remote_comm_id,
                private_data,
            }),
        };
        c.state = State::Established;
        c.answer = Some(env.clone());
        let to = c.peer;
        self.send(to, env);
        self.emit(CmEvent::Established { conn });
        Ok(())
    }

    /// Passive side: data arrived on the QP before the RTU (lost or late): the connection is
    /// established all the same (IBTA 12.9.6, "communication established" event).
    pub fn establish(&mut self, _now: Instant, conn: ConnId) -> Result<(), CmError> {
        let c = self.conn_mut(conn)?;
        match c.state {
            State::RepSent | State::MraRepRcvd => {
                c.state = State::Established;
                c.pending = None;
                c.deadline = None;
                self.emit(CmEvent::Established { conn });
                Ok(())
            }
            State::Established => Ok(()),
            state => Err(CmError::WrongState { conn, state }),
        }
    }

    /// Refuse a REQ (passive, before accept), a REP (active, before send_rtu), or give up
    /// waiting for an RTU, with REJ (IBTA 12.6.7). A connection that got as far as a REP
    /// goes to time wait, an earlier one is gone at once.
    pub fn reject(
        &mut self,
        now: Instant,
        conn: ConnId,
        reason: RejectReason,
        ari: &[u8],
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let private_data = private(private_data)?;
        let (ari, reject_info_length) = ari_field(ari)?;
        let c = self.conn_mut(conn)?;
        let (kind, time_wait) = match c.state {
            State::ReqRcvd | State::MraReqSent => (RejectedMessage::Req, false),
            State::RepRcvd | State::MraRepSent => (RejectedMessage::Rep, true),
            State::RepSent | State::MraRepRcvd => (RejectedMessage::Other, true),
            state => return Err(CmError::WrongState { conn, state }),
        };
        let env = Envelope {
            tid: c.tid,
            msg: CmMessage::Rej(CmRej {
                local_comm_id: conn.0,
                remote_comm_id: c.remote_comm_id,
                message_rejected: kind,
                reject_info_length,
                reason,
                ari,
                private_data,
            }),
        };
        let to = c.peer;
        self.send(to, env);
        if time_wait {
            self.enter_time_wait(now, conn.0);
        } else {
            self.remove(conn.0);
        }
        Ok(())
    }

    /// Established: send DREQ (IBTA 12.6.10), resent like the REQ until DREP or the
    /// retries run out. After DisconnectRequested: answer with DREP (IBTA 12.6.11).
    /// Either way the connection ends in time wait.
    pub fn disconnect(
        &mut self,
        now: Instant,
        conn: ConnId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let state = self.conn_mut(conn)?.state;
        match state {
            State::Established => {
                let private_data = private(private_data)?;
                let tid = self.alloc_tid();
                let c = self.conn_mut(conn)?;
                let env = Envelope {
                    tid,
                    msg: CmMessage::Dreq(CmDreq {
                        local_comm_id: conn.0,
                        remote_comm_id: c.remote_comm_id,
                        remote_qpn: c.remote_qpn,
                        private_data,
                    }),
                };
                c.tid = tid;
                c.state = State::DreqSent;
                c.answer = None;
                c.pending = Some(Pending {
                    env: env.clone(),
                    retries_left: c.max_cm_retries,
                });
                c.deadline = Some(now + c.response_timeout);
                let to = c.peer;
                self.send(to, env);
                Ok(())
            }
            State::DreqRcvd => {
                let private_data = private(private_data)?;
                let c = self.conn_mut(conn)?;
                let env = Envelope {
                    tid: c.tid,
                    msg: CmMessage::Drep(CmDrep {
                        local_comm_id: conn.0,
                        remote_comm_id: c.remote_comm_id,
                        private_data,
                    }),
                };
                let to = c.peer;
                self.send(to, env);
                self.enter_time_wait(now, conn.0);
                self.emit(CmEvent::Disconnected {
                    conn,
                    private_data: Vec::new(),
                    timed_out: false,
                });
                Ok(())
            }
            state => Err(CmError::WrongState { conn, state }),
        }
    }

    /// The user is done with a connection, whatever its state (rdma_destroy_id): the peer
    /// is told as the state requires, as the kernel's cm.c does on destroy — REJ "timeout"
    /// for our REQ, REJ "consumer defined" before Established, one DREQ (not resent) when
    /// established, DREP after a DREQ — and a connection that may still get packets stays in
    /// time wait. No more events come for it.
    pub fn abandon(&mut self, now: Instant, conn: ConnId) -> Result<(), CmError> {
        let state = self.conn_mut(conn)?.state;
        self.abandoned.insert(conn.0);
        let consumer = RejectReason::ConsumerDefined;
        match state {
            State::ReqSent | State::MraReqRcvd => {
                self.send_timeout_rej(conn.0);
                self.remove(conn.0);
            }
            State::ReqRcvd
            | State::MraReqSent
            | State::RepRcvd
            | State::MraRepSent
            | State::RepSent
            | State::MraRepRcvd => self.reject(now, conn, consumer, &[], &[])?,
            State::Established => {
                self.disconnect(now, conn, &[])?;
                self.enter_time_wait(now, conn.0);
            }
            State::DreqSent => self.enter_time_wait(now, conn.0),
            State::DreqRcvd => self.disconnect(now, conn, &[])?,
            State::TimeWait => {}
        }
        Ok(())
    }

    /// Ask a peer which UD QP serves `service_id` (IBTA 12.11.1); answered by
    /// SidrRepReceived or, after `1 + max_retries` unanswered sends, SidrTimeout.
    pub fn sidr_request(&mut self, now: Instant, request: SidrRequest) -> Result<SidrId, CmError> {
        let private_data = private(&request.private_data)?;
        check_bits("timeout", request.timeout.into(), 5)?;
        let request_id = loop {
            let id = self.local_id(self.next_sidr_request);
            self.next_sidr_request = self.next_sidr_request.wrapping_add(1);
            if id != 0 && !self.sidr_out.contains_key(&id) {
                break id;
            }
        };
        let tid = self.alloc_tid();
        let env = Envelope {
            tid,
            msg: CmMessage::SidrReq(SidrReq {
                request_id,
                partition_key: request.pkey,
                service_id: request.service_id,
                private_data,
            }),
        };
        let timeout = self.packet_life() * 2 + iba_time(request.timeout);
        self.sidr_out.insert(
            request_id,
            SidrOut {
                peer: request.to,
                env: env.clone(),
                retries_left: request.max_retries,
                timeout,
                deadline: now + timeout,
            },
        );
        self.send(request.to, env);
        Ok(SidrId(request_id))
    }

    /// Answer a SidrReqReceived with SIDR_REP (IBTA 12.11.2).
    pub fn sidr_reply(
        &mut self,
        now: Instant,
        sidr: SidrId,
        reply: SidrReply,
    ) -> Result<(), CmError> {
        let private_data = private(&reply.private_data)?;
        check_bits("qpn", reply.qpn, 24)?;
        let linger = self.config.sidr_reply_linger;
        let entry = self
            .sidr_in
            .get_mut(&sidr.0)
            .filter(|e| e.reply.is_none())
            .ok_or(CmError::NoSuchSidr(sidr))?;
        let tid = entry.tid;
        let env = Envelope {
            tid,
            msg: CmMessage::SidrRep(SidrRep {
                request_id: entry.request_id,
                status: reply.status,
                qpn: reply.qpn,
                service_id: entry.service_id,
                qkey: reply.qkey,
                private_data,
                ..SidrRep::default()
            }),
        };
        entry.reply = Some(env.clone());
        entry.deadline = Some(now + linger);
        let to = entry.peer;
        self.send(to, env);
        Ok(())
    }

    /// The next MAD to send.
    pub fn poll_transmit(&mut self) -> Option<OutgoingMad> {
        loop {
            let (to, env) = self.transmit.pop_front()?;
            match env.encode() {
                Ok(bytes) => {
                    self.stats.sent += 1;
                    return Some(OutgoingMad { to, bytes });
                }
                // Fields are checked where they enter; a failure here is a bug, counted.
                Err(_) => self.stats.unencodable += 1,
            }
        }
    }

    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// When [`CmAgent::handle_timeout`] should run next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let conns = self.conns.values().filter_map(|c| c.deadline);
        let out = self.sidr_out.values().map(|s| s.deadline);
        let inbound = self.sidr_in.values().filter_map(|s| s.deadline);
        conns.chain(out).chain(inbound).min()
    }

    /// Run every timer due at `now`: resends, giving up, time wait ends.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            self.conn_timeout(now, id);
        }
        let due: Vec<u32> = self
            .sidr_out
            .iter()
            .filter(|(_, s)| s.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let Some(s) = self.sidr_out.get_mut(&id) else {
                continue;
            };
            if s.retries_left == 0 {
                self.sidr_out.remove(&id);
                self.emit(CmEvent::SidrTimeout { sidr: SidrId(id) });
                continue;
            }
            s.retries_left -= 1;
            s.deadline = now + s.timeout;
            let (to, env) = (s.peer, s.env.clone());
            self.stats.retransmits += 1;
            self.send(to, env);
        }
        let expired: Vec<u32> = self
            .sidr_in
            .iter()
            .filter(|(_, s)| s.deadline.is_some_and(|d| d <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some(s) = self.sidr_in.remove(&id) {
                self.sidr_in_by_request.remove(&(s.peer.gid, s.request_id));
            }
        }
    }

    fn conn_timeout(&mut self, now: Instant, id: u32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.state == State::TimeWait {
            // Emitted first: `remove` forgets whether the user abandoned it.
            self.emit(CmEvent::TimewaitExit { conn: ConnId(id) });
            self.remove(id);
            return;
        }
        let Some(pending) = c.pending.as_mut() else {
            c.deadline = None;
            return;
        };
        if pending.retries_left > 0 {
            pending.retries_left -= 1;
            c.deadline = Some(now + c.response_timeout);
            let (to, env) = (c.peer, pending.env.clone());
            self.stats.retransmits += 1;
            self.send(to, env);
            return;
        }
        // Out of retries (IBTA 12.9.5: REJ "timeout" on giving up on REQ or REP).
        let conn = ConnId(id);
        match c.state {
            State::ReqSent | State::MraReqRcvd | State::RepSent | State::MraRepRcvd => {
                let passive = matches!(c.state, State::RepSent | State::MraRepRcvd);
                self.send_timeout_rej(id);
                self.emit(CmEvent::Timeout { conn });
                if passive {
                    self.enter_time_wait(now, id);
                } else {
                    self.remove(id);
                }
            }
            State::DreqSent => {
                self.enter_time_wait(now, id);
                self.emit(CmEvent::Disconnected {
                    conn,
                    private_data: Vec::new(),
                    timed_out: true,
                });
            }
            _ => {
                c.pending = None;
                c.deadline = None;
            }
        }
    }

    /// REJ "timeout", its ARI our CA GUID (IBTA 12.6.7.2, table 112).
    fn send_timeout_rej(&mut self, id: u32) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let env = Envelope {
            tid: c.tid,
            msg: agent_rej(
                id,
                c.remote_comm_id,
                RejectedMessage::Other,
                RejectReason::Timeout,
                &self.config.local_ca_guid.to_be_bytes(),
            ),
        };
        let to = c.peer;
        self.send(to, env);
    }

    /// The connection waits out its packets' lifetime before its comm id is free again.
    /// Its peer's QPN is free at once, as Linux's CM frees it (cm_enter_timewait): the peer
    /// may connect that QP anew (a restarted program gets the same QPN), while a REQ of
    /// the old connection (its comm id, kept in `by_remote_id`) still gets REJ "stale
    /// connection" (IBTA 12.9.8.3).
    fn enter_time_wait(&mut self, now: Instant, id: u32) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::TimeWait;
            c.pending = None;
            c.answer = None;
            c.deadline = Some(now + c.time_wait);
            let key = (c.remote_ca_guid, c.remote_qpn);
            if self.by_remote_qpn.get(&key) == Some(&id) {
                self.by_remote_qpn.remove(&key);
            }
        }
    }

    fn emit(&mut self, event: CmEvent) {
        if event.conn().is_some_and(|c| self.abandoned.contains(&c.0)) {
            return;
        }
        self.events.push_back(event);
    }

    fn remove(&mut self, id: u32) {
        self.abandoned.remove(&id);
        if let Some(c) = self.conns.remove(&id) {
            let key = (c.remote_ca_guid, c.remote_comm_id);
            if self.by_remote_id.get(&key) == Some(&id) {
                self.by_remote_id.remove(&key);
            }
            let key = (c.remote_ca_guid, c.remote_qpn);
            if self.by_remote_qpn.get(&key) == Some(&id) {
                self.by_remote_qpn.remove(&key);
            }
        }
    }

    /// Take a MAD that arrived on QP1 from `from`. Anything that is not a well-formed CM
    /// message, or that no connection takes, is counted in [`CmAgent::stats`] and dropped.
    pub fn handle_mad(&mut self, now: Instant, from: MadPeer, bytes: &[u8]) {
        self.stats.received += 1;
        match Envelope::decode(bytes) {
            Ok(env) => self.handle_message(now, from, env),
            Err(_) => self.stats.dropped_malformed += 1,
        }
    }

    fn handle_message(&mut self, now: Instant, from: MadPeer, env: Envelope) {
        let tid = env.tid;
        match env.msg {
            CmMessage::Req(req) => self.on_req(from, tid, req),
            CmMessage::Mra(mra) => self.on_mra(now, mra),
            CmMessage::Rej(rej) => self.on_rej(now, rej),
            CmMessage::Rep(rep) => self.on_rep(now, from, tid, rep),
            CmMessage::Rtu(rtu) => self.on_rtu(rtu),
            CmMessage::Dreq(dreq) => self.on_dreq(now, from, tid, dreq),
            CmMessage::Drep(drep) => self.on_drep(now, drep),
            CmMessage::SidrReq(req) => self.on_sidr_req(from, tid, req),
            CmMessage::SidrRep(rep) => self.on_sidr_rep(rep),
            // Alternate paths are not used on RoCE: LAP/APR are dropped (IBTA 12.8 optional).
            CmMessage::Lap(_) | CmMessage::Apr(_) => self.stats.dropped_unsupported += 1,
        }
    }

    /// A REJ for a message no connection of ours owns (the peer's comm id in
    /// `remote_comm_id`, IBTA 12.6.7).
    fn reject_unowned(
        &mut self,
        to: MadPeer,
        tid: u64,
        remote_comm_id: u32,
        kind: RejectedMessage,
        reason: RejectReason,
    ) {
        let env = Envelope {
            tid,
            msg: agent_rej(0, remote_comm_id, kind, reason, &[]),
        };
        self.send(to, env);
    }

    fn on_req(&mut self, from: MadPeer, tid: u64, req: CmReq) {
        // A REQ we have seen (IBTA 12.9.7): answer as the connection's state says.
        if let Some(&id) = self
            .by_remote_id
            .get(&(req.local_ca_guid, req.local_comm_id))
        {
            self.duplicate_req(id, from, tid, req.local_comm_id);
            return;
        }
        // A REQ from a QP we still hold a connection with (IBTA 12.9.8.3: stale).
        if self
            .by_remote_qpn
            .contains_key(&(req.local_ca_guid, req.local_qpn))
        {
            self.reject_unowned(
                from,
                tid,
                req.local_comm_id,
                RejectedMessage::Req,
                RejectReason::StaleConnection,
            );
            return;
        }
        if !matches!(req.transport_type, TransportType::Rc | TransportType::Uc) {
            self.reject_unowned(
                from,
                tid,
                req.local_comm_id,
                RejectedMessage::Req,
                RejectReason::InvalidTransportType,
            );
            return;
        }
        if req.path_mtu.bytes().is_none() {
            self.reject_unowned(
                from,
                tid,
                req.local_comm_id,
                RejectedMessage::Req,
                RejectReason::InvalidMtu,
            );
            return;
        }
        let Some(listen) = self.find_listener(req.service_id) else {
            self.reject_unowned(
                from,
                tid,
                req.local_comm_id,
                RejectedMessage::Req,
                RejectReason::InvalidServiceId,
            );
            return;
        };
        if self.conns.len() >= self.config.max_connections {
            self.reject_unowned(
                from,
                tid,
                req.local_comm_id,
                RejectedMessage::Req,
                RejectReason::NoResources,
            );
            return;
        }
        let id = self.alloc_comm_id();
        let response_timeout =
            self.packet_life() * 2 + self.peer_time(req.local_cm_response_timeout);
        self.conns.insert(
            id,
            Conn {
                state: State::ReqRcvd,
                peer: from,
                remote_comm_id: req.local_comm_id,
                remote_ca_guid: req.local_ca_guid,
                remote_qpn: req.local_qpn,
                local_qpn: 0,
                tid,
                max_cm_retries: req.max_cm_retries.min(15),
                response_timeout,
                time_wait: self.packet_life() * 2,
                pending: None,
                answer: None,
                deadline: None,
                mra_seen: false,
            },
        );
        self.by_remote_id
            .insert((req.local_ca_guid, req.local_comm_id), id);
        self.by_remote_qpn
            .insert((req.local_ca_guid, req.local_qpn), id);
        self.emit(CmEvent::ReqReceived {
            conn: ConnId(id),
            listen,
            from,
            req,
        });
    }

    fn duplicate_req(&mut self, id: u32, from: MadPeer, tid: u64, remote_comm_id: u32) {
        let mra_timeout = self.config.duplicate_req_mra_timeout.min(31);
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let resend = match c.state {
            // The user is still deciding: tell the peer to wait (IBTA 12.6.6).
            State::ReqRcvd => {
                let env = Envelope {
                    tid: c.tid,
                    msg: CmMessage::Mra(CmMra {
                        local_comm_id: id,
                        remote_comm_id: c.remote_comm_id,
                        message_mraed: MraedMessage::Req,
                        service_timeout: mra_timeout,
                        private_data: PrivateData::zeroed(),
                    }),
                };
                c.state = State::MraReqSent;
                c.answer = Some(env.clone());
                Some(env)
            }
            State::MraReqSent => c.answer.clone(),
            State::RepSent | State::MraRepRcvd => c.pending.as_ref().map(|p| p.env.clone()),
            State::TimeWait => {
                self.stats.duplicate_answers += 1;
                self.reject_unowned(
                    from,
                    tid,
                    remote_comm_id,
                    RejectedMessage::Req,
                    RejectReason::StaleConnection,
                );
                return;
            }
            _ => None,
        };
        let to = c.peer;
        match resend {
            Some(env) => {
                self.stats.duplicate_answers += 1;
                self.send(to, env);
            }
            None => self.stats.dropped_duplicate += 1,
        }
    }

    /// The connection a message names in its "Remote Communication ID" (ours), if its
    /// "Local Communication ID" is the peer's we know (or we know none yet).
    fn lookup(&mut self, our_id: u32, their_id: u32) -> Option<u32> {
        let Some(c) = self.conns.get(&our_id) else {
            self.stats.dropped_unknown_connection += 1;
            return None;
        };
        if c.remote_comm_id != 0 && their_id != 0 && c.remote_comm_id != their_id {
            self.stats.dropped_mismatch += 1;
            return None;
        }
        Some(our_id)
    }

    fn on_mra(&mut self, now: Instant, mra: CmMra) {
        let Some(id) = self.lookup(mra.remote_comm_id, mra.local_comm_id) else {
            return;
        };
        let extra = self.peer_time(mra.service_timeout) + self.packet_life();
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let next = match (c.state, mra.message_mraed) {
            (State::ReqSent | State::MraReqRcvd, MraedMessage::Req) => State::MraReqRcvd,
            (State::RepSent | State::MraRepRcvd, MraedMessage::Rep) => State::MraRepRcvd,
            _ => {
                self.stats.dropped_wrong_state += 1;
                return;
            }
        };
        c.state = next;
        if c.remote_comm_id == 0 {
            c.remote_comm_id = mra.local_comm_id;
        }
        // IBTA 12.6.6: wait the service timeout more before sending again.
        c.deadline = Some(now + extra);
        if !c.mra_seen {
            c.mra_seen = true;
            self.emit(CmEvent::MraReceived {
                conn: ConnId(id),
                service_timeout: extra - self.packet_life(),
            });
        }
    }

    fn on_rej(&mut self, now: Instant, rej: CmRej) {
        let mut our_id = rej.remote_comm_id;
        // A REJ "timeout" from a side that never learnt our comm id (its REQ unanswered)
        // names its own comm id and, in the ARI, its CA GUID (IBTA 12.6.7.2).
        if our_id == 0 && rej.reason == RejectReason::Timeout {
            if let Ok(guid) = <[u8; 8]>::try_from(rej.ari_bytes()) {
                let key = (u64::from_be_bytes(guid), rej.local_comm_id);
                our_id = self.by_remote_id.get(&key).copied().unwrap_or(0);
            }
        }
        let Some(id) = self.lookup(our_id, rej.local_comm_id) else {
            return;
        };
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let reason = rej.reason;
        let time_wait = match c.state {
            State::ReqSent | State::MraReqRcvd | State::ReqRcvd | State::MraReqSent => {
                reason == RejectReason::StaleConnection
            }
            State::RepSent
            | State::MraRepRcvd
            | State::RepRcvd
            | State::MraRepSent
            | State::DreqSent
            | State::Established => true,
            _ => {
                self.stats.dropped_wrong_state += 1;
                return;
            }
        };
        self.emit(CmEvent::Rejected {
            conn: ConnId(id),
            reason,
            ari: rej.ari_bytes().to_vec(),
            private_data: rej.private_data.as_bytes().to_vec(),
            from_peer: true,
        });
        if time_wait {
            self.enter_time_wait(now, id);
        } else {
            self.remove(id);
        }
    }

    fn on_rep(&mut self, now: Instant, from: MadPeer, tid: u64, rep: CmRep) {
        let Some(c) = self.conns.get(&rep.remote_comm_id) else {
            self.stats.dropped_unknown_connection += 1;
            // IBTA 12.6.7: a REP for no REQ of ours.
            self.reject_unowned(
                from,
                tid,
                rep.local_comm_id,
                RejectedMessage::Rep,
                RejectReason::InvalidCommId,
            );
            return;
        };
        let id = rep.remote_comm_id;
        match c.state {
            State::ReqSent | State::MraReqRcvd => {}
            State::RepRcvd | State::MraRepSent | State::Established
                if c.remote_comm_id != rep.local_comm_id =>
            {
                self.stats.dropped_mismatch += 1;
                return;
            }
            // Our RTU or MRA was lost: send it again.
            State::MraRepSent | State::Established => {
                let (to, answer) = (c.peer, c.answer.clone());
                match answer {
                    Some(env) => {
                        self.stats.duplicate_answers += 1;
                        self.send(to, env);
                    }
                    None => self.stats.dropped_duplicate += 1,
                }
                return;
            }
            State::RepRcvd => {
                self.stats.dropped_duplicate += 1;
                return;
            }
            _ => {
                self.stats.dropped_wrong_state += 1;
                return;
            }
        }
        // A REP from a QP another connection of ours still holds (IBTA 12.9.8.3): stale.
        if let Some(&old) = self
            .by_remote_qpn
            .get(&(rep.local_ca_guid, rep.local_qpn))
            .filter(|&&old| old != id)
        {
            let c = &self.conns[&id];
            let env = Envelope {
                tid: c.tid,
                msg: agent_rej(
                    id,
                    rep.local_comm_id,
                    RejectedMessage::Rep,
                    RejectReason::StaleConnection,
                    &[],
                ),
            };
            let to = c.peer;
            self.send(to, env);
            self.enter_time_wait(now, id);
            self.emit(CmEvent::Rejected {
                conn: ConnId(id),
                reason: RejectReason::StaleConnection,
                ari: Vec::new(),
                private_data: Vec::new(),
                from_peer: false,
            });
            // The old connection's peer has forgotten it: close ours.
            if self.state(ConnId(old)) == Some(State::Established) {
                let _ = self.disconnect(now, ConnId(old), &[]);
            }
            return;
        }
        let target_ack_delay = self.peer_time(rep.target_ack_delay);
        let packet_life = self.packet_life();
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.state = State::RepRcvd;
        c.remote_comm_id = rep.local_comm_id;
        c.remote_ca_guid = rep.local_ca_guid;
        c.remote_qpn = rep.local_qpn;
        c.time_wait = packet_life * 2 + target_ack_delay;
        c.pending = None;
        c.deadline = None;
        self.by_remote_id
            .insert((rep.local_ca_guid, rep.local_comm_id), id);
        self.by_remote_qpn
            .insert((rep.local_ca_guid, rep.local_qpn), id);
        self.emit(CmEvent::RepReceived {
            conn: ConnId(id),
            rep,
        });
    }

    fn on_rtu(&mut self, rtu: CmRtu) {
        let Some(id) = self.lookup(rtu.remote_comm_id, rtu.local_comm_id) else {
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match c.state {
            State::RepSent | State::MraRepRcvd => {
                c.state = State::Established;
                c.pending = None;
                c.deadline = None;
                self.emit(CmEvent::Established { conn: ConnId(id) });
            }
            // Already established by `establish`, or a duplicate.
            State::Established | State::DreqSent | State::DreqRcvd | State::TimeWait => {
                self.stats.dropped_duplicate += 1
            }
            _ => self.stats.dropped_wrong_state += 1,
        }
    }

    fn on_dreq(&mut self, now: Instant, from: MadPeer, tid: u64, dreq: CmDreq) {
        let drep = |local_comm_id: u32, remote_comm_id: u32| Envelope {
            tid,
            msg: CmMessage::Drep(CmDrep {
                local_comm_id,
                remote_comm_id,
                private_data: PrivateData::zeroed(),
            }),
        };
        let known = self
            .conns
            .get(&dreq.remote_comm_id)
            .filter(|c| c.remote_comm_id == dreq.local_comm_id);
        let Some(c) = known else {
            // No connection has these comm ids: it is over and forgotten (time wait ended),
            // or our id went to a newer connection. A DREP lets the peer finish its
            // (IBTA 12.9.6); Linux's cm_dreq_handler answers so too (cm_issue_drep).
            self.stats.dropped_unknown_connection += 1;
            self.send(from, drep(dreq.remote_comm_id, dreq.local_comm_id));
            return;
        };
        let id = dreq.remote_comm_id;
        // Our connection, but not our QP: not ours to close (Linux drops it too).
        if c.local_qpn != dreq.remote_qpn {
            self.stats.dropped_mismatch += 1;
            return;
        }
        let conn = ConnId(id);
        match c.state {
            State::RepSent | State::MraRepRcvd | State::Established => {
                if c.state != State::Established {
                    // The RTU was lost; the DREQ proves the peer got our REP.
                    self.emit(CmEvent::Established { conn });
                }
                let c = self.conns.get_mut(&id).expect("looked up above");
                c.state = State::DreqRcvd;
                c.tid = tid;
                c.pending = None;
                c.deadline = None;
                self.emit(CmEvent::DisconnectRequested {
                    conn,
                    private_data: dreq.private_data.as_bytes().to_vec(),
                });
            }
            // Both sides sent DREQ (IBTA 12.9.6): answer, and close.
            State::DreqSent => {
                let to = c.peer;
                self.send(to, drep(id, dreq.local_comm_id));
                self.enter_time_wait(now, id);
                self.emit(CmEvent::Disconnected {
                    conn,
                    private_data: dreq.private_data.as_bytes().to_vec(),
                    timed_out: false,
                });
            }
            // Our DREP was lost.
            State::TimeWait => {
                let to = c.peer;
                self.stats.duplicate_answers += 1;
                self.send(to, drep(id, dreq.local_comm_id));
            }
            State::DreqRcvd => self.stats.dropped_duplicate += 1,
            _ => self.stats.dropped_wrong_state += 1,
        }
    }

    fn on_drep(&mut self, now: Instant, drep: CmDrep) {
        let Some(id) = self.lookup(drep.remote_comm_id, drep.local_comm_id) else {
            return;
        };
        match self.conns.get(&id).map(|c| c.state) {
            Some(State::DreqSent) => {
                self.enter_time_wait(now, id);
                self.emit(CmEvent::Disconnected {
                    conn: ConnId(id),
                    private_data: drep.private_data.as_bytes().to_vec(),
                    timed_out: false,
                });
            }
            Some(State::TimeWait) => self.stats.dropped_duplicate += 1,
            _ => self.stats.dropped_wrong_state += 1,
        }
    }

    fn on_sidr_req(&mut self, from: MadPeer, tid: u64, req: SidrReq) {
        if let Some(&id) = self.sidr_in_by_request.get(&(from.gid, req.request_id)) {
            match self.sidr_in.get(&id).and_then(|e| e.reply.clone()) {
                Some(env) => {
                    self.stats.duplicate_answers += 1;
                    self.send(from, env);
                }
                None => self.stats.dropped_duplicate += 1,
            }
            return;
        }
        let Some(listen) = self.find_listener(req.service_id) else {
            let env = Envelope {
                tid,
                msg: CmMessage::SidrRep(SidrRep {
                    request_id: req.request_id,
                    status: SidrStatus::Unsupported,
                    service_id: req.service_id,
                    ..SidrRep::default()
                }),
            };
            self.send(from, env);
            return;
        };
        if self.sidr_in.len() >= self.config.max_connections {
            self.stats.dropped_wrong_state += 1;
            return;
        }
        let id = loop {
            let id = self.next_sidr_in;
            self.next_sidr_in = self.next_sidr_in.wrapping_add(1);
            if !self.sidr_in.contains_key(&id) {
                break id;
            }
        };
        self.sidr_in.insert(
            id,
            SidrIn {
                peer: from,
                request_id: req.request_id,
                service_id: req.service_id,
                tid,
                reply: None,
                deadline: None,
            },
        );
        self.sidr_in_by_request
            .insert((from.gid, req.request_id), id);
        self.emit(CmEvent::SidrReqReceived {
            sidr: SidrId(id),
            listen,
            from,
            service_id: req.service_id,
            pkey: req.partition_key,
            private_data: req.private_data.as_bytes().to_vec(),
        });
    }

    fn on_sidr_rep(&mut self, rep: SidrRep) {
        let Some(_) = self.sidr_out.remove(&rep.request_id) else {
            self.stats.dropped_unknown_connection += 1;
            return;
        };
        self.emit(CmEvent::SidrRepReceived {
            sidr: SidrId(rep.request_id),
            status: rep.status,
            qpn: rep.qpn,
            qkey: rep.qkey,
            additional_info: rep.additional_info
                [..usize::from(rep.additional_info_length).min(ARI_LEN)]
                .to_vec(),
            private_data: rep.private_data.as_bytes().to_vec(),
        });
    }
}
