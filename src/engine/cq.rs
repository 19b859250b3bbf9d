//! Completion queues: bounded FIFOs of work completions with an arm flag for notification.
use std::collections::VecDeque;

use super::modify::flush_qp;
use super::qp::Qp;
use super::types::{CqId, Event, QpState, Wc};
use super::DeviceState;

#[derive(Debug)]
pub(crate) struct Cq {
    pub entries: VecDeque<Wc>,
    pub depth: usize,
    /// `Some(solicited_only)` when armed by `req_notify_cq`.
    pub armed: Option<bool>,
    pub overruns: u64,
    /// The CQ overflowed: it is in the error state and takes no more completions (IBTA
    /// 11.6.3.2 "CQ Error": CQEs can no longer be posted to it). What it holds can still be
    /// polled.
    pub error: bool,
}

#[derive(Debug, Default)]
pub(crate) struct CqTable {
    pub slots: Vec<Option<Cq>>,
}

impl CqTable {
    pub fn create(&mut self, depth: usize) -> CqId {
        let cq = Cq {
            entries: VecDeque::with_capacity(depth.min(4096)),
            depth,
            armed: None,
            overruns: 0,
            error: false,
        };
        match self.slots.iter().position(|s| s.is_none()) {
            Some(i) => {
                self.slots[i] = Some(cq);
                CqId(i as u32)
            }
            None => {
                self.slots.push(Some(cq));
                CqId(self.slots.len() as u32 - 1)
            }
        }
    }

    pub fn get_mut(&mut self, id: CqId) -> Option<&mut Cq> {
        self.slots.get_mut(id.0 as usize)?.as_mut()
    }

    pub fn exists(&self, id: CqId) -> bool {
        matches!(self.slots.get(id.0 as usize), Some(Some(_)))
    }

    /// Add a completion. Returns false if it was lost: the CQ is full (the first time, it
    /// enters the error state and raises [`Event::CqError`], IBTA 11.6.3.2 affiliated
    /// asynchronous error "CQ Error", caused by a CQ overrun) or already in error. The caller
    /// decides what that means for its QP; live paths use [`post`].
    pub fn push(
        &mut self,
        id: CqId,
        wc: Wc,
        solicited: bool,
        events: &mut VecDeque<Event>,
    ) -> bool {
        let Some(cq) = self.get_mut(id) else {
            return false;
        };
        if cq.error {
            cq.overruns += 1;
            return false;
        }
        if cq.entries.len() >= cq.depth {
            cq.overruns += 1;
            cq.error = true;
            events.push_back(Event::CqError(id));
            return false;
        }
        cq.entries.push_back(wc);
        if let Some(solicited_only) = cq.armed {
            if !solicited_only || solicited || wc.status != super::types::WcStatus::Success {
                cq.armed = None;
                events.push_back(Event::CqNotify(id));
            }
        }
        true
    }
}

/// Post a completion of `qp` to `cq`. If the CQ cannot take it (overrun, or in error since an
/// earlier overrun), the completion is lost and the QP cannot report its work any more: it
/// enters the error state with [`Event::QpFatal`] ("Local Work Queue Catastrophic Error",
/// IBTA 11.6.3.2; rxe's RESPST_ERR_CQ_OVERFLOW moves the QP to error the same way), its
/// other WRs are flushed. Returns false in that case, so the caller stops (no ACK for a
/// message whose completion was lost).
pub(crate) fn post(qp: &mut Qp, sh: &mut DeviceState, cq: CqId, wc: Wc, solicited: bool) -> bool {
    if sh.cqs.push(cq, wc, solicited, &mut sh.events) {
        return true;
    }
    if qp.state() != QpState::Err {
        sh.events.push_back(Event::QpFatal(qp.qpn));
        flush_qp(qp, sh);
    }
    false
}
