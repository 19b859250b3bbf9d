//! Completion queues: bounded FIFOs of work completions with an arm flag for notification.
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::shared_table::{SharedTable, Snapshot};

use super::types::{CqId, EngineError, Event, Wc};

#[derive(Debug)]
pub(crate) struct Cq {
    pub entries: VecDeque<Wc>,
    pub depth: usize,
    /// `Some(solicited_only)` when armed by `req_notify_cq`.
    pub armed: Option<bool>,
    pub overruns: u64,
    /// The CQ overflowed: it is in the error state and takes no more completions (IBTA
    /// 10.10.2.3, "CQ Error": CQEs can no longer be posted to it). What it holds can still be
    /// polled.
    pub error: bool,
    /// QPs (on any shard) that complete into it: it cannot be destroyed before them.
    pub qp_refs: u32,
}

/// The CQs of a device, shared by its engine shards: a QP on any shard may complete into any
/// CQ. Each CQ has its own lock, so shards completing into different CQs never wait for
/// each other; the table is a [`SharedTable`] (no shared lock: each shard reads its cached
/// snapshot), copied to create or destroy a CQ.
///
/// The CQ slots, by id (a copy is published on every create and destroy).
type CqSlots = Vec<Option<Arc<Mutex<Cq>>>>;

/// Each shard has its own view (`clone`), with its own cached snapshot.
#[derive(Debug, Default, Clone)]
pub(crate) struct CqTable {
    slots: SharedTable<CqSlots>,
}

impl CqTable {
    fn read(&self) -> Snapshot<'_, CqSlots> {
        self.slots.read()
    }

    /// Runs `change` on a copy of the table and publishes the copy.
    fn update<R>(&self, change: impl FnOnce(&mut CqSlots) -> R) -> R {
        self.slots.update(change)
    }

    pub fn create(&self, depth: usize) -> CqId {
        let cq = Arc::new(Mutex::new(Cq {
            entries: VecDeque::with_capacity(depth.min(4096)),
            depth,
            armed: None,
            overruns: 0,
            error: false,
            qp_refs: 0,
        }));
        self.update(|slots| match slots.iter().position(|s| s.is_none()) {
            Some(i) => {
                slots[i] = Some(cq);
                CqId(i as u32)
            }
            None => {
                slots.push(Some(cq));
                CqId(slots.len() as u32 - 1)
            }
        })
    }

    /// Runs `f` on the CQ `id`; `None` if there is none. `f` must not touch the table.
    pub fn with<R>(&self, id: CqId, f: impl FnOnce(&mut Cq) -> R) -> Option<R> {
        let slots = self.read();
        let cq = slots.get(id.0 as usize)?.as_ref()?;
        let mut cq = cq.lock().unwrap_or_else(|p| p.into_inner());
        Some(f(&mut cq))
    }

    pub fn exists(&self, id: CqId) -> bool {
        matches!(self.read().get(id.0 as usize), Some(Some(_)))
    }

    /// Destroys the CQ `id` unless a QP still uses it.
    pub fn destroy(&self, id: CqId) -> Result<(), EngineError> {
        self.update(|slots| {
            let Some(Some(cq)) = slots.get(id.0 as usize) else {
                return Err(EngineError::UnknownCq(id));
            };
            if cq.lock().unwrap_or_else(|p| p.into_inner()).qp_refs > 0 {
                return Err(EngineError::InUse("completion queue"));
            }
            slots[id.0 as usize] = None;
            Ok(())
        })
    }

    /// Add a completion. Returns false if it was lost: the CQ is full (the first time, it
    /// enters the error state and raises [`Event::CqError`], IBTA 10.10.2.3 affiliated
    /// asynchronous error "CQ Error", caused by a CQ overrun) or already in error. The caller
    /// decides what that means for its QP; live paths use [`post`].
    pub fn push(&self, id: CqId, wc: Wc, solicited: bool, events: &mut VecDeque<Event>) -> bool {
        self.with(id, |cq| {
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
        })
        .unwrap_or(false)
    }
}
