//! Shared receive queues (`ibv_srq`): one pool of receive WRs for many QPs.
use std::sync::Arc;

use crate::engine::{RecvWr, SrqAttr, SrqAttrMask, SrqId};

use super::attr::limits;
use super::device::{ObjectKind, ObjectSlot};
use super::error::{Result, VerbsError};
use super::pd::{Pd, PdInner};

pub(crate) struct SrqInner {
    pub pd: Arc<PdInner>,
    pub id: SrqId,
    _slot: ObjectSlot,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // Every QP on it holds this SRQ alive, so none uses it any more.
        let _ = self
            .pd
            .core
            .runtime
            .with_engine(0, false, |e| e.destroy_srq(self.id));
    }
}

/// A shared receive queue (`ibv_srq`, IBTA 10.2.9): QPs created with it in their
/// [`QpInitAttr::srq`](super::QpInitAttr::srq) take every receive from it, in the order
/// their messages arrive. Clone to post from several threads; the SRQ lives as long as a
/// handle or a QP on it does. Its limit event ([`crate::engine::Event::SrqLimitReached`]) and
/// its QPs' last-WQE events arrive through [`super::Device::poll_async_event`].
#[derive(Clone)]
pub struct Srq {
    pub(crate) inner: Arc<SrqInner>,
}

impl std::fmt::Debug for Srq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Srq").field(&self.inner.id).finish()
    }
}

impl Srq {
    pub(crate) fn create(pd: &Pd, attr: &SrqAttr) -> Result<Srq> {
        if attr.max_wr == 0 {
            return Err(VerbsError::Zero { what: "max_srq_wr" });
        }
        for (what, requested, max) in [
            ("max_srq_wr", attr.max_wr, limits::MAX_SRQ_WR),
            ("max_srq_sge", attr.max_sge, limits::MAX_SRQ_SGE),
        ] {
            if requested > max {
                return Err(VerbsError::LimitExceeded {
                    what,
                    requested: requested.into(),
                    max: max.into(),
                });
            }
        }
        let slot = ObjectSlot::take(&pd.inner.core, ObjectKind::Srq)?;
        let id = pd
            .inner
            .core
            .runtime
            .with_engine(0, false, |e| e.create_srq(pd.inner.id, *attr))??;
        Ok(Srq {
            inner: Arc::new(SrqInner {
                pd: pd.inner.clone(),
                id,
                _slot: slot,
            }),
        })
    }

    /// The SRQ's handle.
    pub fn id(&self) -> SrqId {
        self.inner.id
    }

    /// Runs `f` on the engine that holds the SRQ (shard 0: the shards share the SRQ table).
    fn on_engine<R>(&self, f: impl FnOnce(&mut crate::engine::Engine) -> R) -> Result<R> {
        self.inner.pd.core.runtime.with_engine(0, false, f)
    }

    fn with<R>(
        &self,
        f: impl FnOnce(&mut crate::engine::Engine) -> std::result::Result<R, crate::engine::EngineError>,
    ) -> Result<R> {
        Ok(self.on_engine(f)??)
    }

    /// Posts one receive WR (`ibv_post_srq_recv`); its SGEs must be in memory of the SRQ's
    /// PD. Like [`super::Qp::post_recv`], it does not wake the progress thread.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        let id = self.inner.id;
        self.with(|e| e.post_srq_recv(id, wr))
    }

    /// Posts a chain of receive WRs (wr_id, SGEs) under one engine lock, as
    /// [`super::Qp::post_send_chain`] does sends.
    pub fn post_recv_chain(
        &self,
        walk: impl FnOnce(&mut dyn FnMut(u64, &[crate::engine::Sge]) -> Result<()>) -> Result<()>,
    ) -> Result<()> {
        let id = self.inner.id;
        self.on_engine(|e| walk(&mut |wr_id, sges| Ok(e.post_srq_recv_sges(id, wr_id, sges)?)))?
    }

    /// Posts receive WRs in order under one engine lock; the first refusal stops the batch
    /// and names its index and wr_id (those before it stay posted).
    pub fn post_recv_batch(&self, wrs: &[RecvWr]) -> Result<()> {
        let id = self.inner.id;
        let refused = self.on_engine(|e| {
            wrs.iter()
                .enumerate()
                .find_map(|(i, wr)| e.post_srq_recv(id, wr).err().map(|err| (i, wr.wr_id, err)))
        })?;
        match refused {
            None => Ok(()),
            Some((index, wr_id, err)) => Err(VerbsError::PostFailed {
                index,
                wr_id,
                source: Box::new(err.into()),
            }),
        }
    }

    /// Changes the SRQ (`ibv_modify_srq`): [`SrqAttrMask::LIMIT`] arms the limit event with
    /// `attr.srq_limit` (0 disarms), [`SrqAttrMask::MAX_WR`] resizes the queue.
    pub fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        let id = self.inner.id;
        self.with(|e| e.modify_srq(id, attr, mask))
    }

    /// Its attributes (`ibv_query_srq`): `srq_limit` reads 0 once the limit event fired.
    pub fn query(&self) -> Result<SrqAttr> {
        let id = self.inner.id;
        self.with(|e| e.query_srq(id))
    }

    /// Receive WRs posted and not yet taken by a QP.
    pub fn queued(&self) -> Result<usize> {
        let id = self.inner.id;
        self.with(|e| e.srq_len(id))
    }
}

impl Pd {
    /// Creates a shared receive queue (`ibv_create_srq`) of `attr.max_wr` WRs with
    /// `attr.max_sge` SGEs each; a non-zero `attr.srq_limit` arms the limit event at once.
    pub fn create_srq(&self, attr: &SrqAttr) -> Result<Srq> {
        Srq::create(self, attr)
    }
}
