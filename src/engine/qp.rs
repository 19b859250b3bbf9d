//! Queue pair state: the send and receive queues, the requester's PSN bookkeeping, the
//! responder's expected PSN, MSN and saved READ/ATOMIC resources.
use std::collections::VecDeque;

use crate::wire::Psn;

use super::time::Instant;
use super::types::{AddressVector, CqId, PdId, QpAttr, QpCaps, QpState, QpType, Sge, UdDest, WrOp};

/// A WQE's scatter/gather list. Nearly every WR has one SGE; keeping that one inline means
/// posting a WR does not allocate (a heap `Vec` per WR was a visible per-packet cost).
#[derive(Debug, Clone)]
pub(crate) enum SgeList {
    One(Sge),
    Many(Vec<Sge>),
}

impl From<&[Sge]> for SgeList {
    // Inlined into the WQE being built: returned from a call, the list came back through the
    // stack and the WQE's wider copy of it stalled on store forwarding.
    #[inline(always)]
    fn from(sges: &[Sge]) -> SgeList {
        match sges {
            [one] => SgeList::One(*one),
            // An empty Vec does not allocate either.
            many => SgeList::Many(many.to_vec()),
        }
    }
}

impl std::ops::Deref for SgeList {
    type Target = [Sge];
    fn deref(&self) -> &[Sge] {
        match self {
            SgeList::One(sge) => std::slice::from_ref(sge),
            SgeList::Many(v) => v,
        }
    }
}

/// A posted send WR and its transmission progress.
#[derive(Debug, Clone)]
pub(crate) struct SendWqe {
    pub wr_id: u64,
    pub op: WrOp,
    pub sges: SgeList,
    /// Data copied at post time (INLINE).
    pub inline: Option<Vec<u8>>,
    pub signaled: bool,
    pub fence: bool,
    pub solicited: bool,
    pub ud: Option<UdDest>,
    /// Message length in bytes (8 for atomics).
    pub len: u32,
    /// First PSN, fixed the first time the WQE is transmitted.
    pub first_psn: Option<Psn>,
    /// PSNs the WQE occupies: packets for SEND/WRITE, response packets for READ, 1 for atomics.
    pub npkts: u32,
    /// READ: response packets already placed (a retry restarts here).
    pub read_done_pkts: u32,
    /// A local operation (bind, local invalidate) that has run; it completes once every
    /// WQE before it has.
    pub local_done: bool,
}

impl SendWqe {
    /// The last PSN of the WQE.
    pub fn last_psn(&self) -> Option<Psn> {
        self.first_psn.map(|p| p.wrapping_add(self.npkts - 1))
    }
}

/// A posted receive WR.
#[derive(Debug, Clone)]
pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub sges: SgeList,
    pub len: u64,
    /// The PD its buffers must be in when they are written (the QP's, or the SRQ's): a
    /// region can move to another PD (`ibv_rereg_mr`) between the post and the message.
    pub pd: PdId,
}

/// Requester + completer state (rxe's `req` and `comp` halves).
#[derive(Debug, Default)]
pub(crate) struct Requester {
    /// PSN of the next packet to transmit.
    pub next_psn: Psn,
    /// Oldest PSN not yet acknowledged.
    pub una: Psn,
    /// One past the highest PSN ever sent (to count retransmissions).
    pub high_psn: Psn,
    /// Index in the send queue of the WQE being transmitted.
    pub send_idx: usize,
    /// Packet index inside that WQE.
    pub send_pkt: u32,
    /// Packets since the last AckReq.
    pub since_ackreq: u32,
    /// Transport retries left (retry_cnt, 0..=7 retries; 7 is finite, unlike in rxe).
    pub retry_left: u8,
    /// RNR retries left (rnr_retry; 7 = infinite).
    pub rnr_left: u8,
    /// Local ACK timer deadline.
    pub retrans_deadline: Option<Instant>,
    /// RNR wait: transmission resumes at this time.
    pub rnr_deadline: Option<Instant>,
    /// A retry from this PSN was started by a gap in the responses (or an implied NAK);
    /// further evidence of the same gap does not start another (as rxe's `started_retry`).
    pub gap_retry_at: Option<Psn>,
    /// A READ/ATOMIC is being retried after its responses broke off: request packets at or
    /// after this PSN (the WQEs behind it, already sent once) wait until the retried
    /// operation's responses flow again, so the responder is not handed a flood of duplicate
    /// requests whose answers would queue behind it and be discarded (IBTA 9.7 allows
    /// resending them later).
    pub retry_hold: Option<Psn>,
}

impl Requester {
    /// The earlier of the local ACK timer and the RNR wait: when `handle_timeout` has work
    /// for this QP (the deadline the engine's [`TimerQueue`](super::timers::TimerQueue) holds).
    pub fn next_deadline(&self) -> Option<Instant> {
        match (self.retrans_deadline, self.rnr_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// An operation in the middle of a multi-packet message at the responder.
#[derive(Debug, Clone)]
pub(crate) enum InProgress {
    None,
    Send {
        wqe: RecvWqe,
        offset: u64,
    },
    Write {
        rkey: u32,
        va: u64,
        /// Bytes of the RETH length not yet written.
        remaining: u64,
        /// The RETH length (reported by a WRITE_WITH_IMM receive completion).
        total: u64,
    },
}

/// A saved READ or ATOMIC so a duplicate request can be answered (IBTA 9.7).
#[derive(Debug, Clone, Copy)]
pub(crate) enum SavedResource {
    Read {
        first_psn: Psn,
        npkts: u32,
        va: u64,
        rkey: u32,
        len: u32,
        msn: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
}

/// Something the responder still has to transmit.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Response {
    Ack {
        psn: Psn,
        syndrome: crate::wire::Syndrome,
        msn: u32,
    },
    AtomicAck {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
    /// READ response packets `psn..` covering `[va, va+len)` of MR `rkey`.
    Read {
        psn: Psn,
        va: u64,
        rkey: u32,
        len: u32,
        /// Offset of the next packet.
        offset: u32,
        msn: u32,
    },
}

/// Responder state (rxe's `resp` half).
#[derive(Debug)]
pub(crate) struct Responder {
    /// Expected PSN of the next new request.
    pub epsn: Psn,
    /// Message sequence number: completed requests (C9-148).
    pub msn: u32,
    /// A NAK (sequence or RNR) was sent for the current gap; stay silent until it is filled.
    pub nak_sent: bool,
    pub in_progress: InProgress,
    pub responses: VecDeque<Response>,
    pub resources: VecDeque<SavedResource>,
}

impl Default for Responder {
    fn default() -> Responder {
        Responder {
            epsn: Psn::new(0),
            msn: 0,
            nak_sent: false,
            in_progress: InProgress::None,
            responses: VecDeque::new(),
            resources: VecDeque::new(),
        }
    }
}

/// A queue pair.
#[derive(Debug)]
pub(crate) struct Qp {
    pub qpn: u32,
    pub qp_type: QpType,
    pub pd: PdId,
    pub send_cq: CqId,
    pub recv_cq: CqId,
    pub caps: QpCaps,
    pub sq_sig_all: bool,
    /// Attributes in force; `attr.qp_state` is the state.
    pub attr: QpAttr,
    pub sq: VecDeque<SendWqe>,
    pub rq: VecDeque<RecvWqe>,
    pub req: Requester,
    pub resp: Responder,
    /// In the engine's transmit round-robin list.
    pub in_tx_list: bool,
    /// `Event::SqDrained` was raised for the current SQD period.
    pub sqd_notified: bool,
    /// The SRQ receives are taken from instead of `rq` (which then stays empty).
    pub srq: Option<super::types::SrqId>,
    /// `Event::QpLastWqeReached` was raised for the current stay in ERR.
    pub last_wqe_reached: bool,
}

impl Qp {
    pub fn state(&self) -> QpState {
        self.attr.qp_state
    }

    pub fn mtu(&self) -> u32 {
        self.attr.path_mtu.bytes()
    }

    pub fn av(&self) -> Option<&AddressVector> {
        self.attr.ah_attr.as_ref()
    }

    /// rxe rounds max_rd_atomic / max_dest_rd_atomic up to a power of two, at most 128.
    pub fn rd_atomic_limit(v: u8) -> usize {
        (v.max(1) as usize).next_power_of_two().min(128)
    }

    /// Packets a message of `len` bytes takes at this path MTU (0 bytes still take one).
    pub fn packets_for(&self, len: u32) -> u32 {
        len.div_ceil(self.mtu()).max(1)
    }
}

#[cfg(test)]
impl Qp {
    /// An RC QP in RTS (path MTU 1024, the default) for unit tests.
    pub(crate) fn rc_in_rts(pd: PdId, cq: CqId, access: crate::engine::Access) -> Qp {
        let attr = QpAttr {
            qp_state: QpState::Rts,
            cur_qp_state: QpState::Rts,
            qp_access_flags: access,
            ..Default::default()
        };
        Qp {
            qpn: 0x11,
            qp_type: QpType::Rc,
            pd,
            send_cq: cq,
            recv_cq: cq,
            caps: QpCaps::default(),
            sq_sig_all: false,
            attr,
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            req: Default::default(),
            resp: Default::default(),
            in_tx_list: false,
            sqd_notified: false,
            srq: None,
            last_wqe_reached: false,
        }
    }
}
