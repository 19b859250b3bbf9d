//! Creating, querying and destroying the engine's objects: protection domains, memory
//! regions, completion queues and queue pairs. State changes of a QP are in `modify.rs`.
use std::collections::VecDeque;
use std::sync::Mutex;

use super::mr::{MrMemory, MrTable, MrUpdate, ReregFault};
use super::qp::Qp;
use super::types::{Access, CqId, EngineError, PdId, QpAttr, QpCaps, QpInit, QpState, QpType, Wc};
use super::{limits, Engine};
use crate::dma::UserMemory;

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

/// What [`Engine::rereg_mr`] changes, as `ibv_rereg_mr`'s flags: `memory` is
/// `IBV_REREG_MR_CHANGE_TRANSLATION`, `pd` `IBV_REREG_MR_CHANGE_PD`, `access`
/// `IBV_REREG_MR_CHANGE_ACCESS`; `None` keeps what the region has.
#[derive(Clone, Debug, Default)]
pub struct MrChange {
    /// New bytes (the engine's or the application's); the region gets a fresh iova for
    /// them and never reaches the old ones again.
    pub memory: Option<MrMemory>,
    /// The protection domain the region moves to.
    pub pd: Option<PdId>,
    /// The new access rights (checked as at registration: [`check_mr_access`]).
    pub access: Option<Access>,
}

/// The access rights a memory region may be registered with (IBTA 10.6.3.1; rdma-core and
/// the kernel check the same in `ib_check_mr_access`): remote write or remote atomic access
/// needs local write, since the HCA writes the region for them; and no bit beyond the
/// flags this device knows.
pub fn check_mr_access(access: Access) -> Result<(), EngineError> {
    if Access::from_bits(access.bits()).is_none() {
        return Err(EngineError::InvalidMrAccess {
            access,
            reason: "bits this device does not know",
        });
    }
    if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
        && !access.contains(Access::LOCAL_WRITE)
    {
        return Err(EngineError::InvalidMrAccess {
            access,
            reason: "REMOTE_WRITE or REMOTE_ATOMIC needs LOCAL_WRITE",
        });
    }
    Ok(())
}

/// The PDs of a device, shared by its shards: for each, how many QPs and SRQs use it.
#[derive(Debug, Default)]
pub(crate) struct PdTable {
    slots: Mutex<Vec<Option<u32>>>,
}

impl PdTable {
    fn slots(&self) -> std::sync::MutexGuard<'_, Vec<Option<u32>>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn alloc(&self) -> PdId {
        let mut slots = self.slots();
        match slots.iter().position(Option::is_none) {
            Some(i) => {
                slots[i] = Some(0);
                PdId(i as u32)
            }
            None => {
                slots.push(Some(0));
                PdId(slots.len() as u32 - 1)
            }
        }
    }

    fn exists(&self, pd: PdId) -> bool {
        matches!(self.slots().get(pd.0 as usize), Some(Some(_)))
    }

    fn free(&self, pd: PdId, mrs: &MrTable) -> Result<(), EngineError> {
        let mut slots = self.slots();
        match slots.get(pd.0 as usize) {
            Some(Some(0)) if !mrs.any_in_pd(pd) => {
                slots[pd.0 as usize] = None;
                Ok(())
            }
            Some(Some(_)) => Err(EngineError::InUse("protection domain")),
            _ => Err(EngineError::UnknownPd(pd)),
        }
    }

    /// A QP or SRQ starts (`+1`) or stops (`-1`) using `pd`.
    fn count_qp(&self, pd: PdId, delta: i32) {
        if let Some(Some(n)) = self.slots().get_mut(pd.0 as usize) {
            *n = n.saturating_add_signed(delta);
        }
    }
}

fn check_mr_len(len: usize) -> Result<(), EngineError> {
    if len as u64 > limits::MAX_MR_SIZE {
        return Err(EngineError::InvalidArgument(format!(
            "memory region of {len} bytes is larger than the limit of {} bytes",
            limits::MAX_MR_SIZE
        )));
    }
    Ok(())
}

fn mr_space_used_up() -> EngineError {
    EngineError::InvalidArgument(
        "no more memory regions: the device's key or address space is used up".into(),
    )
}

impl Engine {
    // ----- protection domains and memory regions -----

    /// Allocate a protection domain (on every shard of the device: PDs are shared).
    pub fn alloc_pd(&mut self) -> PdId {
        self.pds.alloc()
    }

    pub(crate) fn check_pd(&self, pd: PdId) -> Result<(), EngineError> {
        if self.pds.exists(pd) {
            Ok(())
        } else {
            Err(EngineError::UnknownPd(pd))
        }
    }

    /// A QP or SRQ starts (`+1`) or stops (`-1`) using `pd`, which cannot be freed before.
    pub(super) fn count_pd_user(&self, pd: PdId, delta: i32) {
        self.pds.count_qp(pd, delta);
    }

    /// Free a protection domain that no MR, memory window, QP or SRQ (of any shard) uses.
    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<(), EngineError> {
        self.pds.free(pd, &self.sh.mrs)
    }

    /// Register a zero-filled memory region of `len` bytes that the engine owns.
    pub fn reg_mr(&mut self, pd: PdId, len: usize, access: Access) -> Result<MrInfo, EngineError> {
        self.reg_mr_on(pd, MrMemory::Device(len), access, None)
    }

    /// Register a memory region on the application's memory: the transport reads and
    /// writes those bytes in place. It stops reaching them once the region is deregistered
    /// (or re-registered elsewhere).
    pub fn reg_user_mr(
        &mut self,
        pd: PdId,
        memory: UserMemory,
        access: Access,
    ) -> Result<MrInfo, EngineError> {
        self.reg_mr_on(pd, MrMemory::User(memory), access, None)
    }

    /// [`Engine::reg_user_mr`] at a chosen iova: the region's addresses are `iova ..
    /// iova + len` (`ibv_reg_mr` registers at the buffer's virtual address, `ibv_reg_mr_iova2`
    /// at any). Regions registered this way may overlap; each access names its region by key.
    pub fn reg_user_mr_at(
        &mut self,
        pd: PdId,
        memory: UserMemory,
        access: Access,
        iova: u64,
    ) -> Result<MrInfo, EngineError> {
        if iova.checked_add(memory.len() as u64).is_none() {
            return Err(EngineError::InvalidArgument(format!(
                "reg_mr: iova {iova:#x} + {} bytes wraps around",
                memory.len()
            )));
        }
        self.reg_mr_on(pd, MrMemory::User(memory), access, Some(iova))
    }

    fn reg_mr_on(
        &mut self,
        pd: PdId,
        memory: MrMemory,
        access: Access,
        iova: Option<u64>,
    ) -> Result<MrInfo, EngineError> {
        self.check_pd(pd)?;
        check_mr_access(access)?;
        check_mr_len(memory.len())?;
        let len = memory.len();
        let (key, addr) = self
            .sh
            .mrs
            .register_on(pd, memory, access, iova)
            .ok_or_else(mr_space_used_up)?;
        Ok(MrInfo {
            lkey: key,
            rkey: key,
            addr,
            length: len,
            pd,
            access,
        })
    }

    /// Re-register a memory region (`ibv_rereg_mr`): move it to other memory, another PD or
    /// other access rights, keeping its keys. A refused change leaves the region as it was
    /// (`IBV_REREG_MR_ERR_INPUT`): a change of nothing is `InvalidArgument`, an unknown PD
    /// `UnknownPd`, access against the rules `InvalidMrAccess`. New memory gets a fresh
    /// iova (in the returned `MrInfo`): an access through the old addresses is out of
    /// bounds, and the old memory is not reached again once this returns. Operations
    /// checked before the call may still complete against the old rights.
    pub fn rereg_mr(&mut self, lkey: u32, change: MrChange) -> Result<MrInfo, EngineError> {
        self.rereg_mr_at(lkey, change, None)
    }

    /// [`Engine::rereg_mr`], with new memory placed at `iova` (as `ibv_rereg_mr` with
    /// `IBV_REREG_MR_CHANGE_TRANSLATION` places it at the new buffer's address).
    pub fn rereg_mr_at(
        &mut self,
        lkey: u32,
        change: MrChange,
        iova: Option<u64>,
    ) -> Result<MrInfo, EngineError> {
        let old = self
            .sh
            .mrs
            .facts(lkey)
            .ok_or(EngineError::UnknownKey(lkey))?;
        if change.memory.is_none() && change.pd.is_none() && change.access.is_none() {
            return Err(EngineError::InvalidArgument(
                "rereg_mr: nothing to change (no memory, PD or access given)".into(),
            ));
        }
        if let Some(pd) = change.pd {
            self.check_pd(pd)?;
        }
        if let Some(access) = change.access {
            check_mr_access(access)?;
        }
        if let Some(memory) = &change.memory {
            check_mr_len(memory.len())?;
        }
        let length = change.memory.as_ref().map_or(old.len, MrMemory::len);
        let info = MrInfo {
            lkey,
            rkey: lkey,
            addr: old.iova,
            length,
            pd: change.pd.unwrap_or(old.pd),
            access: change.access.unwrap_or(old.access),
        };
        let update = MrUpdate {
            memory: change.memory,
            iova,
            pd: change.pd,
            access: change.access,
        };
        let addr = self
            .sh
            .mrs
            .reregister(lkey, update)
            .map_err(|fault| match fault {
                ReregFault::NoSuchRegion => EngineError::UnknownKey(lkey),
                ReregFault::WindowsBound => {
                    EngineError::InUse("memory region (memory windows are bound to it)")
                }
                ReregFault::IovaSpaceUsedUp => mr_space_used_up(),
            })?;
        Ok(MrInfo { addr, ..info })
    }

    /// The application's memory the region `lkey` is registered on (`None` for the
    /// engine's own bytes, or no such region).
    pub fn mr_user_memory(&self, lkey: u32) -> Option<UserMemory> {
        self.sh.mrs.user_memory(lkey)
    }

    /// Deregister a memory region (its bytes are freed). Refused while memory windows are
    /// bound to it ([`EngineError::InUse`], IBTA 10.6.7).
    pub fn dereg_mr(&mut self, lkey: u32) -> Result<(), EngineError> {
        match self.sh.mrs.remove(lkey) {
            Ok(()) => Ok(()),
            Err(true) => Err(EngineError::InUse(
                "memory region (memory windows are bound to it)",
            )),
            Err(false) => Err(EngineError::UnknownKey(lkey)),
        }
    }

    /// How many memory windows are bound to the region `lkey` right now (a region with
    /// bound windows cannot be deregistered).
    pub fn mr_bound_windows(&self, lkey: u32) -> u32 {
        self.sh.mrs.bound_windows(lkey)
    }

    /// Facts about a registered MR.
    pub fn query_mr(&self, lkey: u32) -> Result<MrInfo, EngineError> {
        let mr = self
            .sh
            .mrs
            .facts(lkey)
            .ok_or(EngineError::UnknownKey(lkey))?;
        Ok(MrInfo {
            lkey: mr.key,
            rkey: mr.key,
            addr: mr.iova,
            length: mr.len,
            pd: mr.pd,
            access: mr.access,
        })
    }

    /// Copy MR bytes at `addr` into `out`.
    pub fn mr_read(&self, lkey: u32, addr: u64, out: &mut [u8]) -> Result<(), EngineError> {
        self.sh
            .mrs
            .facts(lkey)
            .ok_or(EngineError::UnknownKey(lkey))?;
        self.sh
            .mrs
            .with_bytes(lkey, addr, out.len() as u64, |b| out.copy_from_slice(b))
            .ok_or(EngineError::OutOfBounds {
                key: lkey,
                addr,
                len: out.len(),
            })
    }

    /// A copy of the MR bytes `[addr, addr+len)`.
    pub fn mr_to_vec(&self, lkey: u32, addr: u64, len: usize) -> Result<Vec<u8>, EngineError> {
        let mut out = vec![0; len];
        self.mr_read(lkey, addr, &mut out)?;
        Ok(out)
    }

    /// Copy `data` into an MR at `addr`.
    pub fn mr_write(&mut self, lkey: u32, addr: u64, data: &[u8]) -> Result<(), EngineError> {
        self.sh
            .mrs
            .facts(lkey)
            .ok_or(EngineError::UnknownKey(lkey))?;
        self.sh
            .mrs
            .with_bytes_mut(lkey, addr, data.len() as u64, |b| b.copy_from_slice(data))
            .ok_or(EngineError::OutOfBounds {
                key: lkey,
                addr,
                len: data.len(),
            })
    }

    // ----- completion queues -----

    /// Create a CQ holding up to `depth` completions.
    pub fn create_cq(&mut self, depth: u32) -> Result<CqId, EngineError> {
        if depth == 0 || depth > limits::MAX_CQE {
            return Err(EngineError::InvalidArgument(format!("CQ depth {depth}")));
        }
        Ok(self.sh.cqs.create(depth as usize))
    }

    /// Resize a CQ to `depth` entries (`ibv_resize_cq`): the completions it holds stay, in
    /// order. Fewer entries than it holds is [`EngineError::CqTooSmall`]; 0 or more than
    /// `MAX_CQE` is [`EngineError::LimitExceeded`]. The CQ is shared by the shards: the
    /// resize happens under its own lock, between two completions of any shard.
    pub fn resize_cq(&mut self, cq: CqId, depth: u32) -> Result<(), EngineError> {
        if depth == 0 || depth > limits::MAX_CQE {
            return Err(EngineError::LimitExceeded {
                what: "cqe",
                requested: depth as u64,
                max: limits::MAX_CQE as u64,
            });
        }
        self.sh
            .cqs
            .with(cq, |q| {
                if q.entries.len() > depth as usize {
                    return Err(EngineError::CqTooSmall {
                        held: q.entries.len(),
                        requested: depth,
                    });
                }
                q.depth = depth as usize;
                Ok(())
            })
            .ok_or(EngineError::UnknownCq(cq))?
    }

    /// The depth of a CQ (what `resize_cq` last set).
    pub fn cq_depth(&self, cq: CqId) -> Result<u32, EngineError> {
        self.sh
            .cqs
            .with(cq, |q| q.depth as u32)
            .ok_or(EngineError::UnknownCq(cq))
    }

    /// Destroy a CQ no QP (of any shard) uses.
    pub fn destroy_cq(&mut self, cq: CqId) -> Result<(), EngineError> {
        self.sh.cqs.destroy(cq)
    }

    /// Take up to `out.len()` completions, oldest first; returns how many.
    pub fn poll_cq(&mut self, cq: CqId, out: &mut [Wc]) -> Result<usize, EngineError> {
        let n = self
            .sh
            .cqs
            .with(cq, |q| {
                let n = out.len().min(q.entries.len());
                for (slot, wc) in out.iter_mut().zip(q.entries.drain(..n)) {
                    *slot = wc;
                }
                n
            })
            .ok_or(EngineError::UnknownCq(cq))?;
        self.completions_polled += n as u64;
        Ok(n)
    }

    /// Take one completion.
    pub fn poll_cq_one(&mut self, cq: CqId) -> Result<Option<Wc>, EngineError> {
        let wc = self
            .sh
            .cqs
            .with(cq, |q| q.entries.pop_front())
            .ok_or(EngineError::UnknownCq(cq))?;
        self.completions_polled += u64::from(wc.is_some());
        Ok(wc)
    }

    /// Completions waiting in a CQ.
    pub fn cq_len(&self, cq: CqId) -> Result<usize, EngineError> {
        self.sh
            .cqs
            .with(cq, |q| q.entries.len())
            .ok_or(EngineError::UnknownCq(cq))
    }

    /// Arm a CQ: the next completion (or next solicited one) raises
    /// [`Event::CqNotify`](super::Event::CqNotify).
    pub fn req_notify_cq(&mut self, cq: CqId, solicited_only: bool) -> Result<(), EngineError> {
        self.sh
            .cqs
            .with(cq, |q| q.armed = Some(solicited_only))
            .ok_or(EngineError::UnknownCq(cq))
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
        if !self.shard.owns_range(qpn) {
            return Err(EngineError::InvalidArgument(format!(
                "QPN {qpn:#x} is outside this engine's QPN prefix {:#x} (bits 16..23)",
                self.shard.prefix
            )));
        }
        if super::shard_of_qpn(qpn, self.shard.count) != self.shard.index {
            return Err(EngineError::InvalidArgument(format!(
                "QPN {qpn:#x} belongs to shard {} of {}, not to this one ({})",
                super::shard_of_qpn(qpn, self.shard.count),
                self.shard.count,
                self.shard.index
            )));
        }
        self.create_qp_inner(init, Some(qpn))
    }

    pub(super) fn create_qp_inner(
        &mut self,
        init: QpInit,
        chosen: Option<u32>,
    ) -> Result<u32, EngineError> {
        self.check_pd(init.pd)?;
        for cq in [init.send_cq, init.recv_cq] {
            if !self.sh.cqs.exists(cq) {
                return Err(EngineError::UnknownCq(cq));
            }
        }
        if let Some(srq) = init.srq {
            if self.sh.srqs.with(srq, |_| ()).is_none() {
                return Err(EngineError::UnknownSrq(srq));
            }
        }
        let c = init.caps;
        let max_wr = limits::MAX_QP_WR;
        if c.max_send_wr == 0 || c.max_send_wr > max_wr || c.max_recv_wr > max_wr {
            return Err(EngineError::InvalidArgument(format!(
                "queue depths {}/{} (1..={max_wr})",
                c.max_send_wr, c.max_recv_wr
            )));
        }
        let (max_sge, max_inline) = (limits::MAX_SGE, limits::MAX_INLINE_DATA);
        if c.max_send_sge > max_sge || c.max_recv_sge > max_sge || c.max_inline_data > max_inline {
            return Err(EngineError::InvalidArgument(format!(
                "max_send_sge/max_recv_sge <= {max_sge}, max_inline_data <= {max_inline}"
            )));
        }
        let qpn = match chosen {
            Some(q) => q,
            None => {
                let mut qpn = self.next_qpn;
                while self.qps.contains_key(&qpn) {
                    qpn = self.shard.next_qpn(qpn);
                }
                self.next_qpn = self.shard.next_qpn(qpn);
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
            attr: QpAttr {
                // A UD QP has no path: its messages are as large as the port carries.
                path_mtu: match init.qp_type {
                    QpType::Ud => self.sh.cfg.port_mtu,
                    _ => QpAttr::default().path_mtu,
                },
                ..QpAttr::default()
            },
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            req: Default::default(),
            resp: Default::default(),
            in_tx_list: false,
            sqd_notified: false,
            srq: init.srq,
            last_wqe_reached: false,
        };
        self.pds.count_qp(init.pd, 1);
        if let Some(srq) = init.srq {
            self.sh.srqs.with(srq, |q| q.qp_refs += 1);
        }
        for cq in [init.send_cq, init.recv_cq] {
            self.sh.cqs.with(cq, |q| q.qp_refs += 1);
        }
        self.qps.insert(qpn, qp);
        Ok(qpn)
    }

    /// Destroy a QP; outstanding WRs are dropped without completions (as ibv_destroy_qp).
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<(), EngineError> {
        let qp = self.qps.remove(&qpn).ok_or(EngineError::UnknownQp(qpn))?;
        self.timers.set(qpn, None);
        self.pds.count_qp(qp.pd, -1);
        if let Some(srq) = qp.srq {
            self.sh
                .srqs
                .with(srq, |q| q.qp_refs = q.qp_refs.saturating_sub(1));
        }
        for cq in [qp.send_cq, qp.recv_cq] {
            self.sh
                .cqs
                .with(cq, |q| q.qp_refs = q.qp_refs.saturating_sub(1));
        }
        Ok(())
    }

    /// The attributes in force and the capabilities of a QP.
    pub fn query_qp(&self, qpn: u32) -> Result<(QpAttr, QpCaps), EngineError> {
        let qp = self.qps.get(&qpn).ok_or(EngineError::UnknownQp(qpn))?;
        let mut attr = qp.attr.clone();
        attr.cur_qp_state = qp.state();
        if qp.qp_type.is_connected() && matches!(qp.state(), QpState::Rts | QpState::Sqd) {
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

    /// The SRQ the QP takes its receives from, if any.
    pub fn qp_srq(&self, qpn: u32) -> Result<Option<super::SrqId>, EngineError> {
        Ok(self.qps.get(&qpn).ok_or(EngineError::UnknownQp(qpn))?.srq)
    }

    /// Receive WRs posted to the QP's own receive queue and not yet consumed (0 for a QP on
    /// an SRQ: see [`Engine::srq_len`]).
    pub fn recv_queue_len(&self, qpn: u32) -> Result<usize, EngineError> {
        Ok(self
            .qps
            .get(&qpn)
            .ok_or(EngineError::UnknownQp(qpn))?
            .rq
            .len())
    }
}
