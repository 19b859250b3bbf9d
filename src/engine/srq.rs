//! Shared receive queues (IBTA 10.2.9): one queue of receive WQEs that many QPs (RC, UC or
//! UD) take their receives from, in arrival order of the messages that need one.
//!
//! The table is shared by the engine shards of a device, like the CQ table: a QP on any shard
//! may take its receives from any SRQ. Each SRQ has its own lock, held for one take or post;
//! the table is a [`SharedTable`] (each shard reads its cached snapshot), copied to create or destroy an SRQ.
//!
//! The SRQ limit (IBTA 10.2.9, 11.6.3 "SRQ Limit Reached"): armed with a non-zero limit, the
//! SRQ raises [`Event::SrqLimitReached`] on the shard that takes a WQE and leaves fewer than
//! `limit` behind, and disarms itself (its limit reads 0 again), as rxe's `get_srq_wqe` does.
//! Arming it while it already holds fewer WQEs than the limit raises the event at the next
//! WQE taken, not at once (rxe alike).
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::shared_table::{SharedTable, Snapshot};

use super::limits;
use super::qp::{Qp, RecvWqe};
use super::types::{EngineError, Event, PdId, Sge, SrqAttr, SrqAttrMask, SrqId};
use super::{DeviceState, Engine};

/// One shared receive queue.
#[derive(Debug)]
pub(crate) struct Srq {
    pub pd: PdId,
    pub max_wr: u32,
    pub max_sge: u32,
    /// 0: not armed.
    pub limit: u32,
    pub queue: VecDeque<RecvWqe>,
    /// QPs (on any shard) that take their receives from it: it cannot be destroyed before
    /// them.
    pub qp_refs: u32,
}

/// The SRQ slots, by id (a copy is published on every create and destroy).
type SrqSlots = Vec<Option<Arc<Mutex<Srq>>>>;

/// The SRQs of a device, shared by its engine shards.
/// Each shard has its own view (`clone`), with its own cached snapshot.
#[derive(Debug, Default, Clone)]
pub(crate) struct SrqTable {
    slots: SharedTable<SrqSlots>,
}

impl SrqTable {
    fn read(&self) -> Snapshot<'_, SrqSlots> {
        self.slots.read()
    }

    /// Runs `change` on a copy of the table and publishes the copy.
    fn update<R>(&self, change: impl FnOnce(&mut SrqSlots) -> R) -> R {
        self.slots.update(change)
    }

    fn create(&self, srq: Srq) -> SrqId {
        let srq = Arc::new(Mutex::new(srq));
        self.update(|slots| match slots.iter().position(|s| s.is_none()) {
            Some(i) => {
                slots[i] = Some(srq);
                SrqId(i as u32)
            }
            None => {
                slots.push(Some(srq));
                SrqId(slots.len() as u32 - 1)
            }
        })
    }

    /// Runs `f` on the SRQ `id`; `None` if there is none. `f` must not touch the table.
    pub fn with<R>(&self, id: SrqId, f: impl FnOnce(&mut Srq) -> R) -> Option<R> {
        let slots = self.read();
        let srq = slots.get(id.0 as usize)?.as_ref()?;
        let mut srq = srq.lock().unwrap_or_else(|p| p.into_inner());
        Some(f(&mut srq))
    }

    /// Destroys the SRQ `id` unless a QP still takes receives from it; returns its PD.
    fn destroy(&self, id: SrqId) -> Result<PdId, EngineError> {
        self.update(|slots| {
            let Some(Some(srq)) = slots.get(id.0 as usize) else {
                return Err(EngineError::UnknownSrq(id));
            };
            let srq = srq.lock().unwrap_or_else(|p| p.into_inner());
            if srq.qp_refs > 0 {
                return Err(EngineError::InUse("shared receive queue"));
            }
            let pd = srq.pd;
            drop(srq);
            slots[id.0 as usize] = None;
            Ok(pd)
        })
    }

    /// Takes the WQE at the head for a message that needs one; raises the limit event when
    /// that leaves fewer than an armed limit.
    fn take(&self, id: SrqId, events: &mut VecDeque<Event>) -> Option<RecvWqe> {
        self.with(id, |srq| {
            let wqe = srq.queue.pop_front()?;
            if srq.limit > 0 && (srq.queue.len() as u64) < u64::from(srq.limit) {
                srq.limit = 0;
                events.push_back(Event::SrqLimitReached(id));
            }
            Some(wqe)
        })
        .flatten()
    }

    /// Puts back, at the head, a WQE that was taken for a request refused before it used
    /// the WQE's buffer.
    fn give_back(&self, id: SrqId, wqe: RecvWqe) {
        self.with(id, |srq| srq.queue.push_front(wqe));
    }
}

/// The next receive WQE for `qp`: from its SRQ, or its own receive queue.
pub(crate) fn take_recv_wqe(qp: &mut Qp, sh: &mut DeviceState) -> Option<RecvWqe> {
    match qp.srq {
        Some(id) => sh.srqs.take(id, &mut sh.events),
        None => qp.rq.pop_front(),
    }
}

/// Returns a WQE that [`take_recv_wqe`] handed out and that nothing was written to: it goes
/// back to the head of the queue it came from, unconsumed.
pub(crate) fn give_back_recv_wqe(qp: &mut Qp, sh: &mut DeviceState, wqe: RecvWqe) {
    match qp.srq {
        Some(id) => sh.srqs.give_back(id, wqe),
        None => qp.rq.push_front(wqe),
    }
}

/// A QP on an SRQ entered the error state: its in-progress WQE was flushed, it takes no more
/// WQEs; raise "Last WQE Reached" once per stay in ERR (IBTA 11.6.3; rxe raises it when it
/// flushes such a QP's receive side).
pub(crate) fn last_wqe_reached(qp: &mut Qp, sh: &mut DeviceState) {
    if qp.srq.is_some() && !qp.last_wqe_reached {
        qp.last_wqe_reached = true;
        sh.events.push_back(Event::QpLastWqeReached(qp.qpn));
    }
}

fn check_srq_wr(what: &'static str, value: u32) -> Result<(), EngineError> {
    if value == 0 {
        return Err(EngineError::InvalidArgument(format!("SRQ {what} 0")));
    }
    if value > limits::MAX_SRQ_WR {
        return Err(EngineError::LimitExceeded {
            what,
            requested: u64::from(value),
            max: u64::from(limits::MAX_SRQ_WR),
        });
    }
    Ok(())
}

impl Engine {
    /// Create a shared receive queue in `pd` (`ibv_create_srq`): `max_wr` 1..=`MAX_SRQ_WR`,
    /// `max_sge` up to `MAX_SRQ_SGE`, and a non-zero `srq_limit` (at most `max_wr`) arms the
    /// limit event at once, as rxe takes it (libibverbs documents it as ignored here).
    pub fn create_srq(&mut self, pd: PdId, attr: SrqAttr) -> Result<SrqId, EngineError> {
        self.check_pd(pd)?;
        check_srq_wr("max_srq_wr", attr.max_wr)?;
        if attr.max_sge > limits::MAX_SRQ_SGE {
            return Err(EngineError::LimitExceeded {
                what: "max_srq_sge",
                requested: u64::from(attr.max_sge),
                max: u64::from(limits::MAX_SRQ_SGE),
            });
        }
        if attr.srq_limit > attr.max_wr {
            return Err(EngineError::InvalidArgument(format!(
                "srq_limit {} is larger than max_wr {}",
                attr.srq_limit, attr.max_wr
            )));
        }
        let id = self.sh.srqs.create(Srq {
            pd,
            max_wr: attr.max_wr,
            max_sge: attr.max_sge,
            limit: attr.srq_limit,
            queue: VecDeque::with_capacity((attr.max_wr as usize).min(4096)),
            qp_refs: 0,
        });
        self.count_pd_user(pd, 1);
        Ok(id)
    }

    /// Change an SRQ (`ibv_modify_srq`): `MAX_WR` resizes it (never below the WQEs it
    /// holds, nor below an armed limit), `LIMIT` arms the limit event with `srq_limit`
    /// (at most `max_wr`), or disarms it with 0. On error nothing changes.
    pub fn modify_srq(
        &mut self,
        srq: SrqId,
        attr: &SrqAttr,
        mask: SrqAttrMask,
    ) -> Result<(), EngineError> {
        let unknown = mask.bits() & !SrqAttrMask::all().bits();
        if unknown != 0 {
            return Err(EngineError::InvalidArgument(format!(
                "modify_srq: unknown attribute mask bits {unknown:#x}"
            )));
        }
        if mask.contains(SrqAttrMask::MAX_WR) {
            check_srq_wr("max_srq_wr", attr.max_wr)?;
        }
        self.sh
            .srqs
            .with(srq, |q| {
                let max_wr = if mask.contains(SrqAttrMask::MAX_WR) {
                    attr.max_wr
                } else {
                    q.max_wr
                };
                let limit = if mask.contains(SrqAttrMask::LIMIT) {
                    attr.srq_limit
                } else {
                    q.limit
                };
                if (q.queue.len() as u64) > u64::from(max_wr) {
                    return Err(EngineError::InvalidArgument(format!(
                        "cannot resize an SRQ holding {} WRs to max_wr {max_wr}",
                        q.queue.len()
                    )));
                }
                if limit > max_wr {
                    return Err(EngineError::InvalidArgument(format!(
                        "srq_limit {limit} is larger than max_wr {max_wr}"
                    )));
                }
                q.max_wr = max_wr;
                q.limit = limit;
                Ok(())
            })
            .ok_or(EngineError::UnknownSrq(srq))?
    }

    /// The attributes of an SRQ (`ibv_query_srq`); `srq_limit` is 0 once the limit event
    /// fired.
    pub fn query_srq(&self, srq: SrqId) -> Result<SrqAttr, EngineError> {
        self.sh
            .srqs
            .with(srq, |q| SrqAttr {
                max_wr: q.max_wr,
                max_sge: q.max_sge,
                srq_limit: q.limit,
            })
            .ok_or(EngineError::UnknownSrq(srq))
    }

    /// Receive WRs posted to an SRQ and not yet taken.
    pub fn srq_len(&self, srq: SrqId) -> Result<usize, EngineError> {
        self.sh
            .srqs
            .with(srq, |q| q.queue.len())
            .ok_or(EngineError::UnknownSrq(srq))
    }

    /// Destroy an SRQ no QP (of any shard) takes receives from (`ibv_destroy_srq` fails with
    /// EBUSY then); the WRs it holds are dropped without completions.
    pub fn destroy_srq(&mut self, srq: SrqId) -> Result<(), EngineError> {
        let pd = self.sh.srqs.destroy(srq)?;
        self.count_pd_user(pd, -1);
        Ok(())
    }

    /// Post a receive WR to an SRQ (`ibv_post_srq_recv`; the receive WR rules of IBTA 10.8
    /// apply): its SGEs are checked against the SRQ's PD, whichever QP takes it.
    pub fn post_srq_recv(&mut self, srq: SrqId, wr: &super::RecvWr) -> Result<(), EngineError> {
        self.post_srq_recv_sges(srq, wr.wr_id, &wr.sg_list)
    }

    /// [`Engine::post_srq_recv`] with the SGE list borrowed.
    pub fn post_srq_recv_sges(
        &mut self,
        srq: SrqId,
        wr_id: u64,
        sg_list: &[Sge],
    ) -> Result<(), EngineError> {
        let mrs = &self.sh.mrs;
        self.sh
            .srqs
            .with(srq, |q| {
                if q.queue.len() >= q.max_wr as usize {
                    return Err(EngineError::QueueFull("shared receive"));
                }
                if sg_list.len() > q.max_sge as usize {
                    return Err(EngineError::InvalidWr(format!(
                        "{} SGEs > the SRQ's max_sge {}",
                        sg_list.len(),
                        q.max_sge
                    )));
                }
                let len = mrs
                    .check_recv_sges(sg_list)
                    .map_err(|f| EngineError::InvalidWr(format!("receive SGE: {f:?}")))?;
                q.queue.push_back(RecvWqe {
                    wr_id,
                    sges: sg_list.into(),
                    len,
                    pd: q.pd,
                });
                Ok(())
            })
            .ok_or(EngineError::UnknownSrq(srq))?
    }
}
