//! Completion queues: bounded FIFOs of work completions with an arm flag for notification.
use std::collections::VecDeque;

use super::types::{CqId, Event, Wc};

#[derive(Debug)]
pub(crate) struct Cq {
    pub entries: VecDeque<Wc>,
    pub depth: usize,
    /// `Some(solicited_only)` when armed by `req_notify_cq`.
    pub armed: Option<bool>,
    pub overruns: u64,
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

    /// Add a completion; a full CQ loses it and reports an overrun (IBTA 11.4.2.1: CQ
    /// overrun is an affiliated asynchronous error).
    pub fn push(&mut self, id: CqId, wc: Wc, solicited: bool, events: &mut VecDeque<Event>) {
        let Some(cq) = self.get_mut(id) else {
            return;
        };
        if cq.entries.len() >= cq.depth {
            cq.overruns += 1;
            events.push_back(Event::CqOverrun(id));
            return;
        }
        cq.entries.push_back(wc);
        if let Some(solicited_only) = cq.armed {
            if !solicited_only || solicited || wc.status != super::types::WcStatus::Success {
                cq.armed = None;
                events.push_back(Event::CqNotify(id));
            }
        }
    }
}
