//! Creating, querying and destroying the engine's objects: protection domains, memory
//! regions, completion queues and queue pairs. State changes of a QP are in `modify.rs`.
use std::collections::VecDeque;

use super::qp::Qp;
use super::types::{Access, CqId, EngineError, PdId, QpAttr, QpCaps, QpInit, QpState, QpType, Wc};
use super::Engine;

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

impl Engine {
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
        // Remote write/atomic access requires local write (IBTA 10.6.3.1; ibv_reg_mr(3)).
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

    /// Arm a CQ: the next completion (or next solicited one) raises
    /// [`Event::CqNotify`](super::Event::CqNotify).
    pub fn req_notify_cq(&mut self, cq: CqId, solicited_only: bool) -> Result<(), EngineError> {
        let q = self.sh.cqs.get_mut(cq).ok_or(EngineError::UnknownCq(cq))?;
        q.armed = Some(solicited_only);
        Ok(())
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
}
