//! The agent of one port: its connections, listeners and SIDR exchanges, and what every
//! room of work on it needs (allocating ids, sending, queueing events, forgetting a
//! connection).
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Duration;

use crate::wire::addr::Gid;
use crate::wire::cm::{
    CmMessage, CmRej, CmReq, PrivateData, RejectReason, RejectedMessage, SidrReq, ARI_LEN,
};

use super::msg::Envelope;
use super::types::*;
use super::Instant;

/// A message sent until it is answered.
#[derive(Clone, Debug)]
pub(super) struct Pending {
    pub(super) env: Envelope,
    pub(super) retries_left: u8,
}

#[derive(Clone, Debug)]
pub(super) struct Conn {
    pub(super) state: State,
    pub(super) peer: MadPeer,
    /// The peer's comm id, 0 until known.
    pub(super) remote_comm_id: u32,
    pub(super) remote_ca_guid: u64,
    /// The peer's QPN, 0 until known.
    pub(super) remote_qpn: u32,
    pub(super) local_qpn: u32,
    /// The transaction of the REQ/REP/RTU exchange, then of the DREQ/DREP one.
    pub(super) tid: u64,
    pub(super) max_cm_retries: u8,
    /// How long the peer may take to answer us (2 × packet lifetime + its response time).
    pub(super) response_timeout: Duration,
    pub(super) time_wait: Duration,
    pub(super) pending: Option<Pending>,
    /// The last answer that needs no answer (MRA, RTU), sent again on a duplicate.
    pub(super) answer: Option<Envelope>,
    pub(super) deadline: Option<Instant>,
    pub(super) mra_seen: bool,
}

#[derive(Clone, Debug)]
pub(super) struct Listener {
    pub(super) id: ListenId,
    pub(super) service_id: u64,
    pub(super) mask: u64,
}

#[derive(Clone, Debug)]
pub(super) struct SidrOut {
    pub(super) peer: MadPeer,
    pub(super) env: Envelope,
    pub(super) retries_left: u8,
    pub(super) timeout: Duration,
    pub(super) deadline: Instant,
}

#[derive(Clone, Debug)]
pub(super) struct SidrIn {
    pub(super) peer: MadPeer,
    pub(super) request_id: u32,
    pub(super) service_id: u64,
    /// The SIDR_REQ's transaction id, which the SIDR_REP carries back.
    pub(super) tid: u64,
    pub(super) reply: Option<Envelope>,
    /// Set once replied: when the reply is forgotten.
    pub(super) deadline: Option<Instant>,
}

/// A request for a service id nobody listens on yet, waiting up to
/// [`CmConfig::listen_grace`] for a listener.
#[derive(Clone, Debug)]
pub(super) struct HeldRequest {
    pub(super) from: MadPeer,
    pub(super) tid: u64,
    pub(super) msg: HeldMsg,
    pub(super) arrived: Instant,
}

#[derive(Clone, Debug)]
pub(super) enum HeldMsg {
    Req(CmReq),
    Sidr(SidrReq),
}

impl HeldMsg {
    pub(super) fn service_id(&self) -> u64 {
        match self {
            HeldMsg::Req(r) => r.service_id,
            HeldMsg::Sidr(r) => r.service_id,
        }
    }
}

/// Most requests held for a listener at once; beyond that one is refused at once.
pub(super) const MAX_HELD_REQUESTS: usize = 64;

/// The CM of one port. See the module docs.
#[derive(Debug)]
pub struct CmAgent {
    pub(super) config: CmConfig,
    pub(super) listeners: Vec<Listener>,
    pub(super) next_listen: u32,
    pub(super) conns: BTreeMap<u32, Conn>,
    /// (peer CA GUID, peer comm id) → local comm id: duplicate REQs (IBTA 12.9.7).
    pub(super) by_remote_id: HashMap<(u64, u32), u32>,
    /// (peer CA GUID, peer QPN) → local comm id of a connection not in time wait: stale
    /// connections (IBTA 12.9.7, 12.9.8.3).
    pub(super) by_remote_qpn: HashMap<(u64, u32), u32>,
    pub(super) next_comm_id: u32,
    pub(super) next_tid: u64,
    pub(super) sidr_out: BTreeMap<u32, SidrOut>,
    pub(super) next_sidr_request: u32,
    pub(super) sidr_in: BTreeMap<u32, SidrIn>,
    /// (peer GID, request id) → the local handle of a SIDR_REQ we answer.
    pub(super) sidr_in_by_request: HashMap<(Gid, u32), u32>,
    pub(super) next_sidr_in: u32,
    pub(super) transmit: VecDeque<(MadPeer, Envelope)>,
    pub(super) events: VecDeque<CmEvent>,
    /// Connections the user is done with ([`CmAgent::abandon`]): no more events for them.
    pub(super) abandoned: HashSet<u32>,
    /// Requests waiting for a listener ([`CmConfig::listen_grace`]).
    pub(super) held: Vec<HeldRequest>,
    pub(super) stats: CmStats,
}

/// The user's private data as a message's fixed field (zero padded, IBTA 12.6).
pub(super) fn private<const N: usize>(data: &[u8]) -> Result<PrivateData<N>, CmError> {
    PrivateData::from_slice(data).map_err(|_| CmError::PrivateDataTooLong {
        len: data.len(),
        max: N,
    })
}

/// The user's additional rejection information as REJ's field and its length.
pub(super) fn ari_field(ari: &[u8]) -> Result<([u8; ARI_LEN], u8), CmError> {
    if ari.len() > ARI_LEN {
        return Err(CmError::AriTooLong { len: ari.len() });
    }
    let mut field = [0u8; ARI_LEN];
    field[..ari.len()].copy_from_slice(ari);
    Ok((field, ari.len() as u8))
}

/// A REJ (IBTA 12.6.7) from the agent itself, with no private data.
pub(super) fn agent_rej(
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

pub(super) fn check_bits(field: &'static str, value: u32, bits: u32) -> Result<(), CmError> {
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
            held: Vec::new(),
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
        // Requests that came a moment early are this listener's now.
        let (mine, others): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| h.msg.service_id() & mask == service_id & mask);
        self.held = others;
        for h in mine {
            let env = Envelope {
                tid: h.tid,
                msg: match h.msg {
                    HeldMsg::Req(r) => CmMessage::Req(r),
                    HeldMsg::Sidr(r) => CmMessage::SidrReq(r),
                },
            };
            self.handle_message(h.arrived, h.from, env);
        }
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

    pub(super) fn find_listener(&self, service_id: u64) -> Option<ListenId> {
        self.listeners
            .iter()
            .find(|l| service_id & l.mask == l.service_id)
            .map(|l| l.id)
    }

    /// `counter` as an id of ours: with the configured prefix in bits 24..31, if any.
    pub(super) fn local_id(&self, counter: u32) -> u32 {
        match self.config.comm_id_prefix {
            Some(p) => (u32::from(p) << 24) | (counter & 0x00ff_ffff),
            None => counter,
        }
    }

    pub(super) fn alloc_comm_id(&mut self) -> u32 {
        loop {
            let id = self.local_id(self.next_comm_id);
            self.next_comm_id = self.next_comm_id.wrapping_add(1);
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    pub(super) fn alloc_tid(&mut self) -> u64 {
        let tid = self.next_tid;
        self.next_tid = self.next_tid.wrapping_add(1);
        tid
    }

    /// A peer's timeout exponent, clamped.
    pub(super) fn peer_time(&mut self, exponent: u8) -> Duration {
        if exponent > self.config.max_peer_timeout_exponent {
            self.stats.clamped_timeouts += 1;
            return iba_time(self.config.max_peer_timeout_exponent);
        }
        iba_time(exponent)
    }

    pub(super) fn packet_life(&self) -> Duration {
        iba_time(self.config.packet_life_time)
    }

    pub(super) fn send(&mut self, to: MadPeer, env: Envelope) {
        if matches!(env.msg, CmMessage::Rej(_)) {
            self.stats.rejects_sent += 1;
        }
        self.transmit.push_back((to, env));
    }

    pub(super) fn conn_mut(&mut self, conn: ConnId) -> Result<&mut Conn, CmError> {
        self.conns
            .get_mut(&conn.0)
            .ok_or(CmError::NoSuchConnection(conn))
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

    pub(super) fn emit(&mut self, event: CmEvent) {
        if event.conn().is_some_and(|c| self.abandoned.contains(&c.0)) {
            return;
        }
        self.events.push_back(event);
    }

    pub(super) fn remove(&mut self, id: u32) {
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
}
