//! The sans-IO RoCEv2 transport engine: RC and UD queue pairs over Ethernet frames.
//!
//! An [`Engine`] is one RDMA device (one port, one MAC, a GID table). It does no I/O and
//! reads no clock: time is always an argument, an [`Instant`] on the caller's clock
//! (nanoseconds since an epoch the caller chooses: when its progress loop started, or zero of
//! the simulator's virtual clock); how long something lasts is a `Duration`.
//!
//! # Calling order (quinn-proto style)
//!
//! Set-up, from the verbs layer, at any time:
//! `alloc_pd` → `reg_mr` → `create_cq` → `create_qp` → `modify_qp` (RESET→INIT→RTR→RTS with
//! the attributes of [`state::transition_rule`]) → `post_recv` / `post_send`.
//!
//! Then a progress loop (one thread, the engine behind a `Mutex` if others post):
//! 1. for every received frame: [`Engine::handle_frame`]`(now, frame)`
//!    (or [`Engine::handle_frame_unverified`] when the driver cannot see the IP header the
//!    ICRC covers);
//! 2. if `now >= poll_timeout()`: [`Engine::handle_timeout`]`(now)`;
//! 3. drain [`Engine::poll_transmit`]`(now, &mut buf)` until it returns `None`, sending each
//!    frame (`buf` must hold [`MAX_FRAME_LEN`] bytes);
//! 4. drain [`Engine::poll_event`] (wake completion channels) and let users
//!    [`Engine::poll_cq`];
//! 5. sleep until a frame arrives, a WR is posted, or [`Engine::poll_timeout`].
//!
//! Any call that changes state (post, modify, handle_*) may create output: always run
//! steps 3–4 after it.
//!
//! # Structure (as rxe divides it)
//! - `requester`: turns send WQEs into request packets (segmentation by path MTU, AckReq
//!   policy, the 128-PSN window, max_rd_atomic, fences).
//! - `responder`: checks each request (PSN, op sequence, lengths, R_Key/PD/access/bounds,
//!   receive WQEs, RNR), executes it and queues ACKs, NAKs, READ responses, atomic ACKs;
//!   answers duplicates from saved resources.
//! - `completer`: consumes ACKs, NAKs and responses: completes WQEs in order, go-back-N,
//!   RNR waits, retry counting, error mapping and flushing.
//!
//! Three kinds of failure never mix: malformed or unexpected packets are counted drops
//! ([`Counters::drops`]); remote failures are completion statuses ([`WcStatus`]); API misuse is
//! an [`EngineError`].
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

use crate::wire::{
    self, AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, EthRepr, FrameRepr, IpRepr,
    Opcode, PacketRepr, Psn, RethRepr, VlanTag, WireError,
};

pub mod av;
mod completer;
pub mod counters;
mod cq;
mod mr;
mod qp;
mod requester;
mod responder;
pub mod state;
pub mod time;
pub mod timers;
pub mod types;

pub use counters::{Counters, DropCounters};
pub use time::Instant;
pub use types::*;

use cq::CqTable;
use mr::MrTable;
use qp::{Qp, RecvWqe};

/// Largest frame the engine emits: Ethernet+VLAN 18, IPv6 40, UDP 8, BTH 12, the largest
/// extension headers 28, payload 4096, pad 3, ICRC 4.
pub const MAX_FRAME_LEN: usize = 18 + 40 + 8 + 12 + 28 + 4096 + 3 + 4;

/// Header bytes a frame may need beyond its payload (see [`MAX_FRAME_LEN`]).
const MAX_FRAME_OVERHEAD: usize = MAX_FRAME_LEN - 4096;

/// rxe: at most 128 unacknowledged PSNs per QP.
pub const MAX_UNACKED_PSNS: i32 = 128;

/// rxe sets AckReq at least every this many packets (and on the last packet of a message).
pub const ACK_REQ_INTERVAL: u32 = 64;

/// The default P_Key (full membership, default partition).
pub const DEFAULT_PKEY: u16 = 0xFFFF;

/// ACK credit code "unlimited" (what rxe sends).
pub const CREDIT_UNLIMITED: u8 = 0x1F;

/// Static configuration of one engine (one device port).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// The port's MAC address (Ethernet source of every frame).
    pub mac: [u8; 6],
    /// The GID table as addresses: index = GID index. An IPv4 address stands for its
    /// IPv4-mapped GID `::ffff:a.b.c.d`. Frames to other addresses are dropped.
    pub gids: Vec<IpAddr>,
    /// IPv4 identification: `None` = a per-engine counter (like rxe); `Some(v)` = always v
    /// (0 with DF matches what a kernel UDP socket sends, so the ICRC stays valid there).
    pub fixed_ip_ident: Option<u16>,
}

impl EngineConfig {
    /// A configuration with one GID.
    pub fn new(mac: [u8; 6], ip: IpAddr) -> EngineConfig {
        EngineConfig {
            mac,
            gids: vec![ip],
            fixed_ip_ident: None,
        }
    }
}

/// A registered memory region as the caller sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrInfo {
    /// Local key (SGEs).
    pub lkey: u32,
    /// Remote key (RETH / AtomicETH); equal to the lkey here, as in rxe.
    pub rkey: u32,
    /// Start of the region in the iova space the keys address.
    pub addr: u64,
    /// Length in bytes.
    pub length: usize,
    /// The PD it belongs to.
    pub pd: PdId,
    /// Access flags.
    pub access: Access,
}

/// Everything a QP's processing touches besides the QP itself.
pub(crate) struct Shared {
    pub cfg: EngineConfig,
    pub mrs: MrTable,
    pub cqs: CqTable,
    pub counters: Counters,
    pub events: VecDeque<Event>,
    /// Reused buffer for gathering payloads.
    pub scratch: Vec<u8>,
    pub ip_ident: u16,
    /// Why the last frame that could not be emitted failed (see `Counters::emit_failed`).
    pub last_emit_error: Option<String>,
}

/// A packet the requester or responder wants to send; its payload is in `Shared::scratch`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OutPacket {
    pub av: AddressVector,
    pub dest_qp: u32,
    pub opcode: Opcode,
    pub psn: Psn,
    pub ack_req: bool,
    pub solicited: bool,
    pub reth: Option<RethRepr>,
    pub aeth: Option<AethRepr>,
    pub atomic_eth: Option<AtomicEthRepr>,
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    pub immdt: Option<u32>,
    pub ieth: Option<u32>,
    pub deth: Option<DethRepr>,
    pub payload_len: usize,
    /// The payload lies in one MR (key, address): emitted straight from it, no gather copy.
    pub payload_mr: Option<(u32, u64)>,
    /// UD: the send WQE's completion (and whether it is signaled), pushed only once the
    /// frame is emitted; with an error status if it cannot be.
    pub ud_completion: Option<(Wc, bool)>,
}

impl OutPacket {
    pub fn new(av: AddressVector, dest_qp: u32, opcode: Opcode, psn: Psn) -> OutPacket {
        OutPacket {
            av,
            dest_qp,
            opcode,
            psn,
            ack_req: false,
            solicited: false,
            reth: None,
            aeth: None,
            atomic_eth: None,
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
            deth: None,
            payload_len: 0,
            payload_mr: None,
            ud_completion: None,
        }
    }
}

/// Hasher for QPN keys: QPNs are small distinct integers, so one multiply spreads them well
/// enough and costs far less than SipHash on every received packet.
#[derive(Default, Clone, Copy)]
pub(crate) struct QpnHasher(u64);

impl std::hash::Hasher for QpnHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (self.0 ^ v as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type QpMap = HashMap<u32, Qp, std::hash::BuildHasherDefault<QpnHasher>>;

/// The transport engine of one device. See the module docs for the calling order.
pub struct Engine {
    sh: Shared,
    qps: QpMap,
    pds: Vec<bool>,
    next_qpn: u32,
    /// QPs that may have a packet to send, round robin.
    tx_list: VecDeque<u32>,
    /// The QP of the frame the last `poll_transmit` returned, with its UD completion (for
    /// `report_send_failure`).
    last_tx: Option<(u32, Option<(Wc, bool)>)>,
}

impl Engine {
    /// A new engine with no objects.
    pub fn new(cfg: EngineConfig) -> Engine {
        Engine {
            sh: Shared {
                cfg,
                mrs: MrTable::default(),
                cqs: CqTable::default(),
                counters: Counters::default(),
                events: VecDeque::new(),
                scratch: vec![0; 4096],
                ip_ident: 0,
                last_emit_error: None,
            },
            qps: QpMap::default(),
            pds: Vec::new(),
            // rxe numbers QPs from 17 (0 and 1 are the special QPs).
            next_qpn: 0x11,
            tx_list: VecDeque::new(),
            last_tx: None,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.sh.cfg
    }

    /// Counters (rxe names plus drops by reason).
    pub fn counters(&self) -> &Counters {
        &self.sh.counters
    }

    /// Why the last frame that could not be emitted failed, with its QP (each such failure
    /// is counted in [`Counters::emit_failed`]).
    pub fn last_emit_error(&self) -> Option<&str> {
        self.sh.last_emit_error.as_deref()
    }

    // ----- protection domains and memory regions -----

    /// Allocate a protection domain.
    pub fn alloc_pd(&mut self) -> PdId {
        match self.pds.iter().position(|used| !used) {
            Some(i) => {
                self.pds[i] = true;
                PdId(i as u32)
            }
            None => {
                self.pds.push(true);
                PdId(self.pds.len() as u32 - 1)
            }
        }
    }

    fn check_pd(&self, pd: PdId) -> Result<(), EngineError> {
        match self.pds.get(pd.0 as usize) {
            Some(true) => Ok(()),
            _ => Err(EngineError::UnknownPd(pd)),
        }
    }

    /// Free a protection domain that no MR or QP uses.
    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<(), EngineError> {
        self.check_pd(pd)?;
        if self.sh.mrs.any_in_pd(pd) || self.qps.values().any(|q| q.pd == pd) {
            return Err(EngineError::InUse("protection domain"));
        }
        self.pds[pd.0 as usize] = false;
        Ok(())
    }

    /// Register a zero-filled memory region of `len` bytes that the engine owns.
    pub fn reg_mr(&mut self, pd: PdId, len: usize, access: Access) -> Result<MrInfo, EngineError> {
        self.check_pd(pd)?;
        // IBTA 10.6.3.1 (C10-x): remote write/atomic require local write.
        if (access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC))
            && !access.contains(Access::LOCAL_WRITE)
        {
            return Err(EngineError::InvalidArgument(
                "REMOTE_WRITE/REMOTE_ATOMIC need LOCAL_WRITE".into(),
            ));
        }
        if len > (1 << 32) {
            return Err(EngineError::InvalidArgument(format!(
                "memory region of {len} bytes is larger than 4 GiB"
            )));
        }
        let (key, addr) = self.sh.mrs.register(pd, len, access).ok_or_else(|| {
            EngineError::InvalidArgument(
                "no more memory regions: the device's key or address space is used up".into(),
            )
        })?;
        Ok(MrInfo {
            lkey: key,
            rkey: key,
            addr,
            length: len,
            pd,
            access,
        })
    }

    /// Deregister a memory region (its bytes are freed).
    pub fn dereg_mr(&mut self, lkey: u32) -> Result<(), EngineError> {
        self.sh
            .mrs
            .remove(lkey)
            .map(|_| ())
            .ok_or(EngineError::UnknownKey(lkey))
    }

    /// Facts about a registered MR.
    pub fn query_mr(&self, lkey: u32) -> Result<MrInfo, EngineError> {
        let mr = self.sh.mrs.get(lkey).ok_or(EngineError::UnknownKey(lkey))?;
        Ok(MrInfo {
            lkey: mr.key,
            rkey: mr.key,
            addr: mr.iova,
            length: mr.data.len(),
            pd: mr.pd,
            access: mr.access,
        })
    }

    /// The bytes `[addr, addr+len)` of an MR.
    pub fn mr_slice(&self, lkey: u32, addr: u64, len: usize) -> Result<&[u8], EngineError> {
        self.sh.mrs.get(lkey).ok_or(EngineError::UnknownKey(lkey))?;
        self.sh
            .mrs
            .slice(lkey, addr, len as u64)
            .ok_or(EngineError::OutOfBounds {
                key: lkey,
                addr,
                len,
            })
    }

    /// The bytes `[addr, addr+len)` of an MR, writable.
    pub fn mr_slice_mut(
        &mut self,
        lkey: u32,
        addr: u64,
        len: usize,
    ) -> Result<&mut [u8], EngineError> {
        self.sh.mrs.get(lkey).ok_or(EngineError::UnknownKey(lkey))?;
        self.sh
            .mrs
            .slice_mut(lkey, addr, len as u64)
            .ok_or(EngineError::OutOfBounds {
                key: lkey,
                addr,
                len,
            })
    }

    /// Copy MR bytes at `addr` into `out`.
    pub fn mr_read(&self, lkey: u32, addr: u64, out: &mut [u8]) -> Result<(), EngineError> {
        out.copy_from_slice(self.mr_slice(lkey, addr, out.len())?);
        Ok(())
    }

    /// Copy `data` into an MR at `addr`.
    pub fn mr_write(&mut self, lkey: u32, addr: u64, data: &[u8]) -> Result<(), EngineError> {
        self.mr_slice_mut(lkey, addr, data.len())?
            .copy_from_slice(data);
        Ok(())
    }

    // ----- completion queues -----

    /// Create a CQ holding up to `depth` completions.
    pub fn create_cq(&mut self, depth: u32) -> Result<CqId, EngineError> {
        if depth == 0 || depth > 1 << 22 {
            return Err(EngineError::InvalidArgument(format!("CQ depth {depth}")));
        }
        Ok(self.sh.cqs.create(depth as usize))
    }

    /// Destroy a CQ no QP uses.
    pub fn destroy_cq(&mut self, cq: CqId) -> Result<(), EngineError> {
        if !self.sh.cqs.exists(cq) {
            return Err(EngineError::UnknownCq(cq));
        }
        if self
            .qps
            .values()
            .any(|q| q.send_cq == cq || q.recv_cq == cq)
        {
            return Err(EngineError::InUse("completion queue"));
        }
        self.sh.cqs.slots[cq.0 as usize] = None;
        Ok(())
    }

    /// Take up to `out.len()` completions, oldest first; returns how many.
    pub fn poll_cq(&mut self, cq: CqId, out: &mut [Wc]) -> Result<usize, EngineError> {
        let q = self.sh.cqs.get_mut(cq).ok_or(EngineError::UnknownCq(cq))?;
        let n = out.len().min(q.entries.len());
        for (slot, wc) in out.iter_mut().zip(q.entries.drain(..n)) {
            *slot = wc;
        }
        Ok(n)
    }

    /// Take one completion.
    pub fn poll_cq_one(&mut self, cq: CqId) -> Result<Option<Wc>, EngineError> {
        let q = self.sh.cqs.get_mut(cq).ok_or(EngineError::UnknownCq(cq))?;
        Ok(q.entries.pop_front())
    }

    /// Completions waiting in a CQ.
    pub fn cq_len(&self, cq: CqId) -> Result<usize, EngineError> {
        match self.sh.cqs.slots.get(cq.0 as usize) {
            Some(Some(q)) => Ok(q.entries.len()),
            _ => Err(EngineError::UnknownCq(cq)),
        }
    }

    /// Arm a CQ: the next completion (or next solicited one) raises [`Event::CqNotify`].
    pub fn req_notify_cq(&mut self, cq: CqId, solicited_only: bool) -> Result<(), EngineError> {
        let q = self.sh.cqs.get_mut(cq).ok_or(EngineError::UnknownCq(cq))?;
        q.armed = Some(solicited_only);
        Ok(())
    }

    /// Next asynchronous event, if any.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.sh.events.pop_front()
    }

    // ----- queue pairs -----

    /// Create a QP in the RESET state; returns its QPN.
    pub fn create_qp(&mut self, init: QpInit) -> Result<u32, EngineError> {
        self.create_qp_inner(init, None)
    }

    /// Create a QP with a chosen QPN (2..2^24, not in use): for replaying captures and for
    /// conformance tests that must look like a given peer.
    pub fn create_qp_with_qpn(&mut self, init: QpInit, qpn: u32) -> Result<u32, EngineError> {
        if !(2..1 << 24).contains(&qpn) || self.qps.contains_key(&qpn) {
            return Err(EngineError::InvalidArgument(format!(
                "QPN {qpn:#x} is reserved, out of range or in use"
            )));
        }
        self.create_qp_inner(init, Some(qpn))
    }

    fn create_qp_inner(&mut self, init: QpInit, chosen: Option<u32>) -> Result<u32, EngineError> {
        self.check_pd(init.pd)?;
        for cq in [init.send_cq, init.recv_cq] {
            if !self.sh.cqs.exists(cq) {
                return Err(EngineError::UnknownCq(cq));
            }
        }
        let c = init.caps;
        if c.max_send_wr == 0 || c.max_send_wr > 16384 || c.max_recv_wr > 16384 {
            return Err(EngineError::InvalidArgument(format!(
                "queue depths {}/{} (1..=16384)",
                c.max_send_wr, c.max_recv_wr
            )));
        }
        if c.max_send_sge > 32 || c.max_recv_sge > 32 || c.max_inline_data > 4096 {
            return Err(EngineError::InvalidArgument(
                "max_send_sge/max_recv_sge <= 32, max_inline_data <= 4096".into(),
            ));
        }
        let qpn = match chosen {
            Some(q) => q,
            None => {
                let mut qpn = self.next_qpn;
                while self.qps.contains_key(&qpn) || qpn < 2 {
                    qpn = (qpn + 1) & 0xFF_FFFF;
                }
                self.next_qpn = (qpn + 1) & 0xFF_FFFF;
                qpn
            }
        };
        let qp = Qp {
            qpn,
            qp_type: init.qp_type,
            pd: init.pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            caps: init.caps,
            sq_sig_all: init.sq_sig_all,
            attr: QpAttr::default(),
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            req: Default::default(),
            resp: Default::default(),
            in_tx_list: false,
            sqd_notified: false,
        };
        self.qps.insert(qpn, qp);
        Ok(qpn)
    }

    /// Destroy a QP; outstanding WRs are dropped without completions (as ibv_destroy_qp).
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<(), EngineError> {
        self.qps
            .remove(&qpn)
            .map(|_| ())
            .ok_or(EngineError::UnknownQp(qpn))
    }

    /// Change QP attributes and/or state. The mask is checked against the IBTA transition
    /// table ([`state::check_transition`]); values are range-checked. On error nothing changes.
    pub fn modify_qp(
        &mut self,
        qpn: u32,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), EngineError> {
        let cfg = &self.sh.cfg;
        let qp = self.qps.get_mut(&qpn).ok_or(EngineError::UnknownQp(qpn))?;
        let cur = qp.state();
        let to = if mask.contains(QpAttrMask::STATE) {
            attr.qp_state
        } else {
            cur
        };
        if mask.contains(QpAttrMask::CUR_STATE) && attr.cur_qp_state != cur {
            return Err(EngineError::CurrentStateMismatch {
                asserted: attr.cur_qp_state,
                actual: cur,
            });
        }
        state::check_transition(cur, to, qp.qp_type, mask)?;
        validate_values(attr, mask, cfg)?;
        if mask.contains(QpAttrMask::ALT_PATH) || mask.contains(QpAttrMask::PATH_MIG_STATE) {
            return Err(EngineError::InvalidAttributeValue {
                attr: "ALT_PATH",
                reason: "automatic path migration is not supported".into(),
            });
        }
        // Apply the values named by the mask.
        let a = &mut qp.attr;
        let set = |bit: QpAttrMask| mask.contains(bit);
        if set(QpAttrMask::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if set(QpAttrMask::PKEY_INDEX) {
            a.pkey_index = attr.pkey_index;
        }
        if set(QpAttrMask::PORT) {
            a.port_num = attr.port_num;
        }
        if set(QpAttrMask::QKEY) {
            a.qkey = attr.qkey;
        }
        if set(QpAttrMask::AV) {
            a.ah_attr = attr.ah_attr;
        }
        if set(QpAttrMask::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if set(QpAttrMask::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if set(QpAttrMask::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
            qp.req.retry_left = attr.retry_cnt;
        }
        if set(QpAttrMask::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
            qp.req.rnr_left = attr.rnr_retry;
        }
        if set(QpAttrMask::RQ_PSN) {
            a.rq_psn = attr.rq_psn & 0xFF_FFFF;
            qp.resp.epsn = Psn::new(attr.rq_psn);
        }
        if set(QpAttrMask::SQ_PSN) {
            a.sq_psn = attr.sq_psn & 0xFF_FFFF;
            let p = Psn::new(attr.sq_psn);
            qp.req.next_psn = p;
            qp.req.una = p;
            qp.req.high_psn = p;
        }
        if set(QpAttrMask::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if set(QpAttrMask::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if set(QpAttrMask::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if set(QpAttrMask::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num & 0xFF_FFFF;
        }
        if set(QpAttrMask::EN_SQD_ASYNC_NOTIFY) {
            a.en_sqd_async_notify = attr.en_sqd_async_notify;
        }
        if to != cur {
            match to {
                QpState::Reset => {
                    // Back to a fresh QP: queues emptied without completions (IBTA 10.3.1).
                    let keep = (qp.qpn, qp.qp_type, qp.pd, qp.send_cq, qp.recv_cq);
                    qp.sq.clear();
                    qp.rq.clear();
                    qp.req = Default::default();
                    qp.resp = Default::default();
                    qp.attr = QpAttr::default();
                    let _ = keep;
                }
                QpState::Err => {
                    qp.attr.qp_state = QpState::Err;
                    flush_qp(qp, &mut self.sh);
                }
                _ => {}
            }
            qp.attr.qp_state = to;
            qp.attr.cur_qp_state = to;
            qp.sqd_notified = false;
            check_sq_drained(qp, &mut self.sh);
        }
        schedule(&mut self.tx_list, qp);
        Ok(())
    }

    /// The attributes in force and the capabilities of a QP.
    pub fn query_qp(&self, qpn: u32) -> Result<(QpAttr, QpCaps), EngineError> {
        let qp = self.qps.get(&qpn).ok_or(EngineError::UnknownQp(qpn))?;
        let mut attr = qp.attr.clone();
        attr.cur_qp_state = qp.state();
        if qp.qp_type == QpType::Rc && matches!(qp.state(), QpState::Rts | QpState::Sqd) {
            attr.sq_psn = qp.req.next_psn.value();
        }
        if matches!(qp.state(), QpState::Rtr | QpState::Rts | QpState::Sqd) {
            attr.rq_psn = qp.resp.epsn.value();
        }
        Ok((attr, qp.caps))
    }

    /// The QP's type.
    pub fn qp_type(&self, qpn: u32) -> Result<QpType, EngineError> {
        Ok(self
            .qps
            .get(&qpn)
            .ok_or(EngineError::UnknownQp(qpn))?
            .qp_type)
    }

    /// Send WRs posted and not yet completed.
    pub fn send_queue_len(&self, qpn: u32) -> Result<usize, EngineError> {
        Ok(self
            .qps
            .get(&qpn)
            .ok_or(EngineError::UnknownQp(qpn))?
            .sq
            .len())
    }

    /// Receive WRs posted and not yet consumed.
    pub fn recv_queue_len(&self, qpn: u32) -> Result<usize, EngineError> {
        Ok(self
            .qps
            .get(&qpn)
            .ok_or(EngineError::UnknownQp(qpn))?
            .rq
            .len())
    }

    /// Post a send WR. Errors are API misuse (bad state, full queue, bad SGE); remote
    /// failures arrive later as completion statuses.
    pub fn post_send(&mut self, qpn: u32, wr: &SendWr) -> Result<(), EngineError> {
        let qp = self.qps.get_mut(&qpn).ok_or(EngineError::UnknownQp(qpn))?;
        let state = qp.state();
        if matches!(state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(EngineError::BadState {
                what: "send",
                state,
            });
        }
        if qp.sq.len() >= qp.caps.max_send_wr as usize {
            return Err(EngineError::QueueFull("send"));
        }
        if wr.sg_list.len() > qp.caps.max_send_sge as usize {
            return Err(EngineError::InvalidWr(format!(
                "{} SGEs > max_send_sge {}",
                wr.sg_list.len(),
                qp.caps.max_send_sge
            )));
        }
        if let Some(dest) = &wr.ud {
            dest.av.validate(&self.sh.cfg.gids, self.sh.cfg.mac)?;
        }
        let wqe = requester::make_wqe(qp, &self.sh, wr)?;
        if state == QpState::Err {
            // IBTA 10.8.3.3: WRs posted in the error state complete with a flush error.
            let wc = requester::wc_for(qp, &wqe, WcStatus::WrFlushErr);
            self.sh.cqs.push(qp.send_cq, wc, false, &mut self.sh.events);
            return Ok(());
        }
        qp.sq.push_back(wqe);
        schedule(&mut self.tx_list, qp);
        Ok(())
    }

    /// Post a receive WR.
    pub fn post_recv(&mut self, qpn: u32, wr: &RecvWr) -> Result<(), EngineError> {
        let qp = self.qps.get_mut(&qpn).ok_or(EngineError::UnknownQp(qpn))?;
        if qp.state() == QpState::Reset {
            return Err(EngineError::BadState {
                what: "receive",
                state: QpState::Reset,
            });
        }
        if qp.rq.len() >= qp.caps.max_recv_wr as usize {
            return Err(EngineError::QueueFull("receive"));
        }
        if wr.sg_list.len() > qp.caps.max_recv_sge as usize {
            return Err(EngineError::InvalidWr(format!(
                "{} SGEs > max_recv_sge {}",
                wr.sg_list.len(),
                qp.caps.max_recv_sge
            )));
        }
        let len = self
            .sh
            .mrs
            .check_sges(qp.pd, &wr.sg_list, Access::LOCAL_WRITE)
            .map_err(|f| EngineError::InvalidWr(format!("receive SGE: {f:?}")))?;
        let wqe = RecvWqe {
            wr_id: wr.wr_id,
            sges: wr.sg_list.as_slice().into(),
            len,
        };
        if qp.state() == QpState::Err {
            let wc = responder::recv_wc(qp, &wqe, WcStatus::WrFlushErr, 0);
            self.sh.cqs.push(qp.recv_cq, wc, false, &mut self.sh.events);
            return Ok(());
        }
        qp.rq.push_back(wqe);
        Ok(())
    }

    // ----- the sans-IO entry points -----

    /// Process one received Ethernet frame; the ICRC is verified.
    pub fn handle_frame(&mut self, now: Instant, frame: &[u8]) {
        self.receive(now, frame, true)
    }

    /// Process one received frame without checking its ICRC: for drivers that do not see
    /// the real IP header (the kernel UDP socket driver synthesizes one). Corruption that
    /// the ICRC would catch goes unnoticed; say so where such a driver is offered.
    pub fn handle_frame_unverified(&mut self, now: Instant, frame: &[u8]) {
        self.receive(now, frame, false)
    }

    fn receive(&mut self, now: Instant, frame: &[u8], verify: bool) {
        let drops = &mut self.sh.counters.drops;
        let repr = if verify {
            match wire::parse_frame_verified(frame) {
                Ok(r) => r,
                Err(WireError::BadIcrc { .. }) => {
                    drops.bad_icrc += 1;
                    return;
                }
                Err(e) => {
                    count_parse_error(drops, &e);
                    return;
                }
            }
        } else {
            match wire::parse_frame(frame) {
                Ok(p) => p.repr,
                Err(e) => {
                    count_parse_error(drops, &e);
                    return;
                }
            }
        };
        let (src_ip, dst_ip) = match repr.ip {
            IpRepr::V4 { src, dst, .. } => (IpAddr::V4(src), IpAddr::V4(dst)),
            IpRepr::V6 { src, dst, .. } => (IpAddr::V6(src), IpAddr::V6(dst)),
        };
        if !self.sh.cfg.gids.contains(&dst_ip) {
            drops.bad_dest_addr += 1;
            return;
        }
        let bth = repr.roce.bth;
        // P_Key: only the default partition exists; compare the 15-bit key (IBTA 10.9.3).
        if bth.pkey & 0x7FFF != DEFAULT_PKEY & 0x7FFF {
            drops.bad_pkey += 1;
            return;
        }
        let Some(info) = bth.opcode.info() else {
            drops.malformed += 1;
            return;
        };
        let Some(qp) = self.qps.get_mut(&bth.dest_qp) else {
            drops.unknown_qp += 1;
            return;
        };
        match qp.qp_type {
            QpType::Rc => {
                if info.transport != wire::Transport::Rc {
                    drops.bad_opcode += 1;
                    return;
                }
                match qp.av() {
                    Some(av) if av.dest_ip == src_ip => {}
                    _ => {
                        drops.bad_source_addr += 1;
                        return;
                    }
                }
                self.sh.counters.rcvd_pkts += 1;
                if info.is_request {
                    responder::handle_request(qp, &mut self.sh, &repr.roce, info);
                } else {
                    completer::handle_response(qp, &mut self.sh, now, &repr.roce, info);
                }
            }
            QpType::Ud => {
                if info.transport != wire::Transport::Ud || repr.roce.deth.is_none() {
                    drops.bad_opcode += 1;
                    return;
                }
                let ip_off = if repr.eth.vlan.is_some() { 18 } else { 14 };
                let ip_header = frame.get(ip_off..).unwrap_or(&[]);
                self.sh.counters.rcvd_pkts += 1;
                responder::handle_ud(qp, &mut self.sh, &repr, src_ip, ip_header);
            }
        }
        schedule(&mut self.tx_list, qp);
    }

    /// Run the timers that are due at `now` (local ACK timeout, RNR wait).
    pub fn handle_timeout(&mut self, now: Instant) {
        for qp in self.qps.values_mut() {
            if completer::handle_timers(qp, &mut self.sh, now) {
                schedule(&mut self.tx_list, qp);
            }
        }
    }

    /// The earliest time `handle_timeout` has work to do.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.qps
            .values()
            .flat_map(|q| [q.req.retrans_deadline, q.req.rnr_deadline])
            .flatten()
            .min()
    }

    /// Write the next frame to send into `buf` (at least [`MAX_FRAME_LEN`] bytes, or the
    /// QP's path MTU plus 132) and return its length, or `None` if nothing is to be sent.
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        self.last_tx = None;
        let mut budget = self.tx_list.len();
        while budget > 0 {
            budget -= 1;
            let qpn = self.tx_list.pop_front()?;
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            qp.in_tx_list = false;
            if buf.len() < qp.mtu() as usize + MAX_FRAME_OVERHEAD {
                self.sh.counters.drops.tx_buffer_too_small += 1;
                schedule(&mut self.tx_list, qp);
                return None;
            }
            let (pkt, is_request) = match responder::next_response(qp, &mut self.sh) {
                Some(p) => (p, false),
                None => match requester::next_request(qp, &mut self.sh, now) {
                    Some(p) => (p, true),
                    None => continue,
                },
            };
            let written = emit_packet(qp, &mut self.sh, &pkt, buf);
            match written {
                Ok(n) => {
                    self.sh.counters.sent_pkts += 1;
                    // UD: the send is done only now that its frame exists.
                    if let Some((wc, true)) = pkt.ud_completion {
                        let cq = qp.send_cq;
                        cq::post(qp, &mut self.sh, cq, wc, false);
                    }
                    self.last_tx = Some((qpn, pkt.ud_completion));
                    if has_tx_work(qp) {
                        schedule(&mut self.tx_list, qp);
                    }
                    return Some(n);
                }
                Err(why) => {
                    self.sh.counters.emit_failed += 1;
                    self.sh.last_emit_error = Some(format!(
                        "QP {qpn:#x}: {} PSN {}: {why}",
                        pkt.opcode.name(),
                        pkt.psn.value()
                    ));
                    if is_request {
                        fail_unemitted_request(qp, &mut self.sh, pkt.ud_completion);
                    }
                    if has_tx_work(qp) {
                        schedule(&mut self.tx_list, qp);
                    }
                }
            }
        }
        None
    }

    /// The driver could not send the frame the last [`Engine::poll_transmit`] returned (call
    /// it right after, before any other engine call). A UD send then completes with
    /// `LocQpOpErr` instead of success and its QP enters ERR, as for a frame the engine
    /// cannot emit; an RC frame is left to the transport's retry, like a frame lost on the
    /// wire. Either way it is counted in [`Counters::emit_failed`] with its cause.
    pub fn report_send_failure(&mut self, reason: &str) {
        let Some((qpn, ud_completion)) = self.last_tx.take() else {
            return;
        };
        self.sh.counters.emit_failed += 1;
        self.sh.last_emit_error = Some(format!(
            "QP {qpn:#x}: the driver refused the frame: {reason}"
        ));
        let (Some((wc, signaled)), Some(qp)) = (ud_completion, self.qps.get_mut(&qpn)) else {
            return;
        };
        if signaled {
            // Nobody polled since poll_transmit pushed the success: take it back.
            if let Some(cq) = self.sh.cqs.get_mut(qp.send_cq) {
                if cq.entries.back() == Some(&wc) {
                    cq.entries.pop_back();
                }
            }
        }
        fail_unemitted_request(qp, &mut self.sh, ud_completion);
        schedule(&mut self.tx_list, qp);
    }
}

/// Range checks of attribute values (the table checks presence).
fn validate_values(attr: &QpAttr, mask: QpAttrMask, cfg: &EngineConfig) -> Result<(), EngineError> {
    let bad = |attr: &'static str, reason: String| {
        Err(EngineError::InvalidAttributeValue { attr, reason })
    };
    if mask.contains(QpAttrMask::PORT) && attr.port_num != 1 {
        return bad(
            "PORT",
            format!("port {} (only port 1 exists)", attr.port_num),
        );
    }
    if mask.contains(QpAttrMask::PKEY_INDEX) && attr.pkey_index != 0 {
        return bad(
            "PKEY_INDEX",
            format!("index {} (the P_Key table has one entry)", attr.pkey_index),
        );
    }
    if mask.contains(QpAttrMask::RETRY_CNT) && attr.retry_cnt > 7 {
        return bad("RETRY_CNT", format!("{} > 7", attr.retry_cnt));
    }
    if mask.contains(QpAttrMask::RNR_RETRY) && attr.rnr_retry > 7 {
        return bad("RNR_RETRY", format!("{} > 7", attr.rnr_retry));
    }
    if mask.contains(QpAttrMask::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
        return bad("MIN_RNR_TIMER", format!("{} > 31", attr.min_rnr_timer));
    }
    if mask.contains(QpAttrMask::TIMEOUT) && attr.timeout > 31 {
        return bad("TIMEOUT", format!("{} > 31", attr.timeout));
    }
    if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > 128 {
        return bad("MAX_QP_RD_ATOMIC", format!("{} > 128", attr.max_rd_atomic));
    }
    if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > 128 {
        return bad(
            "MAX_DEST_RD_ATOMIC",
            format!("{} > 128", attr.max_dest_rd_atomic),
        );
    }
    if mask.contains(QpAttrMask::AV) {
        let Some(av) = attr.ah_attr else {
            return bad("AV", "no address vector given".into());
        };
        av.validate(&cfg.gids, cfg.mac)?;
    }
    Ok(())
}

/// In SQD with `en_sqd_async_notify`: raise `Event::SqDrained` once no started WQE is left
/// outstanding (IBTA 10.3.1 "SQ Drain").
pub(crate) fn check_sq_drained(qp: &mut Qp, sh: &mut Shared) {
    if qp.state() == QpState::Sqd
        && qp.attr.en_sqd_async_notify
        && !qp.sqd_notified
        && qp.sq.iter().all(|w| w.first_psn.is_none())
    {
        qp.sqd_notified = true;
        sh.events.push_back(Event::SqDrained(qp.qpn));
    }
}

/// Put a QP on the transmit list if it may have something to send.
/// Counts a frame the wire parser refused: RoCEv2 behind headers xroce leaves to the kernel
/// apart from the rest.
fn count_parse_error(drops: &mut DropCounters, e: &WireError) {
    match e {
        WireError::StackedVlan { .. }
        | WireError::ServiceVlanTag { .. }
        | WireError::Ipv6ExtensionHeaders { .. } => drops.unsupported_headers += 1,
        _ => drops.malformed += 1,
    }
}

fn schedule(list: &mut VecDeque<u32>, qp: &mut Qp) {
    if !qp.in_tx_list && has_tx_work(qp) {
        qp.in_tx_list = true;
        list.push_back(qp.qpn);
    }
}

fn has_tx_work(qp: &Qp) -> bool {
    if !qp.resp.responses.is_empty() {
        return true;
    }
    matches!(qp.state(), QpState::Rts | QpState::Sqd)
        && qp.req.rnr_deadline.is_none()
        && qp.req.send_idx < qp.sq.len()
}

/// Move a QP to the error state: every outstanding WR completes with WR_FLUSH_ERR, in order
/// (IBTA 10.3.1 "Error state"); queued NAKs are still sent.
pub(crate) fn flush_qp(qp: &mut Qp, sh: &mut Shared) {
    qp.attr.qp_state = QpState::Err;
    qp.attr.cur_qp_state = QpState::Err;
    qp.req.retrans_deadline = None;
    qp.req.rnr_deadline = None;
    while let Some(wqe) = qp.sq.pop_front() {
        let wc = requester::wc_for(qp, &wqe, WcStatus::WrFlushErr);
        sh.cqs.push(qp.send_cq, wc, false, &mut sh.events);
    }
    qp.req.send_idx = 0;
    qp.req.send_pkt = 0;
    if let qp::InProgress::Send { wqe, .. } =
        std::mem::replace(&mut qp.resp.in_progress, qp::InProgress::None)
    {
        let wc = responder::recv_wc(qp, &wqe, WcStatus::WrFlushErr, 0);
        sh.cqs.push(qp.recv_cq, wc, false, &mut sh.events);
    }
    while let Some(wqe) = qp.rq.pop_front() {
        let wc = responder::recv_wc(qp, &wqe, WcStatus::WrFlushErr, 0);
        sh.cqs.push(qp.recv_cq, wc, false, &mut sh.events);
    }
    // Keep only NAKs: READ responses and ACKs of a dead QP are not sent.
    qp.resp.responses.retain(|r| {
        matches!(r, qp::Response::Ack { syndrome, .. } if !matches!(syndrome, wire::Syndrome::Ack { .. }))
    });
}

/// A QP fails by itself: the WQE at the head of the send queue completes with `status`, the
/// QP enters ERR and everything else is flushed.
pub(crate) fn fail_qp(qp: &mut Qp, sh: &mut Shared, status: WcStatus) {
    if let Some(wqe) = qp.sq.pop_front() {
        let wc = requester::wc_for(qp, &wqe, status);
        sh.cqs.push(qp.send_cq, wc, false, &mut sh.events);
    }
    sh.events.push_back(Event::QpFatal(qp.qpn));
    flush_qp(qp, sh);
}

/// A request whose frame could not be emitted after its PSN was assigned: as rxe does when
/// it cannot build or transmit a packet, the WQE completes with LOC_QP_OP_ERR and the QP
/// enters the error state (no retry could ever send it). A UD WQE is already off the queue.
fn fail_unemitted_request(qp: &mut Qp, sh: &mut Shared, ud_completion: Option<(Wc, bool)>) {
    match ud_completion {
        Some((mut wc, _)) => {
            wc.status = WcStatus::LocQpOpErr;
            sh.cqs.push(qp.send_cq, wc, false, &mut sh.events);
            sh.events.push_back(Event::QpFatal(qp.qpn));
            flush_qp(qp, sh);
        }
        None => fail_qp(qp, sh, WcStatus::LocQpOpErr),
    }
}

/// Build the frame for `pkt` from the QP's address vector and write it to `buf`; the error
/// says why it cannot be built.
fn emit_packet(qp: &Qp, sh: &mut Shared, pkt: &OutPacket, buf: &mut [u8]) -> Result<usize, String> {
    let av = &pkt.av;
    let src_ip = *sh
        .cfg
        .gids
        .get(av.sgid_index as usize)
        .ok_or_else(|| format!("source GID index {} is beyond the GID table", av.sgid_index))?;
    let ident = match sh.cfg.fixed_ip_ident {
        Some(v) => v,
        None => {
            sh.ip_ident = sh.ip_ident.wrapping_add(1);
            sh.ip_ident
        }
    };
    let ip = match (src_ip, av.dest_ip) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => IpRepr::V4 {
            src,
            dst,
            tos: av.traffic_class,
            ttl: av.hop_limit,
            ident,
            dont_fragment: true,
        },
        (IpAddr::V6(src), IpAddr::V6(dst)) => IpRepr::V6 {
            src,
            dst,
            traffic_class: av.traffic_class,
            flow_label: av.flow_label,
            hop_limit: av.hop_limit,
        },
        (src, dst) => {
            return Err(format!(
                "source {src} and destination {dst} differ in family"
            ))
        }
    };
    let payload = match pkt.payload_mr {
        Some((key, va)) => sh
            .mrs
            .slice(key, va, pkt.payload_len as u64)
            .ok_or_else(|| format!("payload {va:#x}+{} of MR {key:#x} is gone", pkt.payload_len))?,
        None => &sh.scratch[..pkt.payload_len],
    };
    let udp_src_port = av
        .udp_src_port
        .unwrap_or_else(|| wire::rxe_udp_source_port(qp.qpn, pkt.dest_qp));
    let frame = FrameRepr {
        eth: EthRepr {
            dst: av.dest_mac,
            src: sh.cfg.mac,
            vlan: av.vlan_id.map(|vid| VlanTag {
                pcp: av.traffic_class >> 5,
                dei: false,
                vid,
            }),
        },
        ip,
        udp_src_port,
        roce: PacketRepr {
            bth: BthRepr {
                opcode: pkt.opcode,
                solicited: pkt.solicited,
                migreq: false,
                pad_count: ((4 - (pkt.payload_len % 4)) % 4) as u8,
                tver: 0,
                pkey: DEFAULT_PKEY,
                fecn: false,
                becn: false,
                dest_qp: pkt.dest_qp,
                ack_req: pkt.ack_req,
                psn: pkt.psn,
            },
            reth: pkt.reth,
            aeth: pkt.aeth,
            atomic_eth: pkt.atomic_eth,
            atomic_ack_eth: pkt.atomic_ack_eth,
            immdt: pkt.immdt,
            ieth: pkt.ieth,
            deth: pkt.deth,
            payload,
        },
    };
    frame.emit(buf).map_err(|e| e.to_string())
}
