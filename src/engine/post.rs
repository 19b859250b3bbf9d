//! Posting work requests: `post_send` and `post_recv` check a WR against the QP and queue
//! it (or complete it at once with a flush error in ERR).
use super::completion;
use super::outgoing::schedule;
use super::qp::RecvWqe;
use super::types::{EngineError, QpState, RecvWr, SendWr, SendWrRef, Sge, WcStatus};
use super::{mw, requester, Engine};

impl Engine {
    /// Post a send WR. Errors are API misuse (bad state, full queue, bad SGE); remote
    /// failures arrive later as completion statuses.
    pub fn post_send(&mut self, qpn: u32, wr: &SendWr) -> Result<(), EngineError> {
        self.post_send_ref(qpn, &wr.borrowed())
    }

    /// [`Engine::post_send`] with the SGE list borrowed (no `Vec` needed per WR).
    pub fn post_send_ref(&mut self, qpn: u32, wr: &SendWrRef<'_>) -> Result<(), EngineError> {
        self.post_send_with(qpn, wr, None)
    }

    /// Post a SEND or WRITE whose payload is `data`, copied now (inline, as
    /// `IBV_SEND_INLINE` copies at post time): the caller may reuse `data` at once, and it
    /// need not be in a memory region. `wr.sg_list` is ignored; at most the QP's
    /// `max_inline_data` bytes ([`EngineError::LimitExceeded`] above it).
    pub fn post_send_inline(
        &mut self,
        qpn: u32,
        wr: &SendWrRef<'_>,
        data: &[u8],
    ) -> Result<(), EngineError> {
        self.post_send_with(qpn, wr, Some(data))
    }

    fn post_send_with(
        &mut self,
        qpn: u32,
        wr: &SendWrRef<'_>,
        data: Option<&[u8]>,
    ) -> Result<(), EngineError> {
        self.post_send_checked(qpn, wr, data, false)
    }

    /// `type1_bind`: the WR is [`Engine::bind_mw`]'s (only it binds type 1 windows).
    pub(super) fn post_send_checked(
        &mut self,
        qpn: u32,
        wr: &SendWrRef<'_>,
        data: Option<&[u8]>,
        type1_bind: bool,
    ) -> Result<(), EngineError> {
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
        if wr.op.is_local() {
            mw::check_local_wr(qp, &self.sh, wr, data, type1_bind)?;
        }
        let checked = requester::check_send_wr(qp, &self.sh, wr, data)?;
        if state == QpState::Err {
            // IBTA 10.3.1 (Error state): WRs posted in the error state complete with a flush error.
            let wqe = requester::new_wqe(qp, wr, checked);
            let wc = completion::send_wc(qp, &wqe, WcStatus::WrFlushErr);
            self.sh.cqs.push(qp.send_cq, wc, false, &mut self.sh.events);
            return Ok(());
        }
        qp.sq.push_back(requester::new_wqe(qp, wr, checked));
        schedule(&mut self.tx_list, qp);
        Ok(())
    }

    /// Post a receive WR to the QP's own receive queue (a QP on an SRQ refuses it with
    /// [`EngineError::ReceivesFromSrq`]: see [`Engine::post_srq_recv`]).
    pub fn post_recv(&mut self, qpn: u32, wr: &RecvWr) -> Result<(), EngineError> {
        self.post_recv_sges(qpn, wr.wr_id, &wr.sg_list)
    }

    /// [`Engine::post_recv`] with the SGE list borrowed (no `Vec` needed per WR).
    pub fn post_recv_sges(
        &mut self,
        qpn: u32,
        wr_id: u64,
        sg_list: &[Sge],
    ) -> Result<(), EngineError> {
        let qp = self.qps.get_mut(&qpn).ok_or(EngineError::UnknownQp(qpn))?;
        if qp.srq.is_some() {
            return Err(EngineError::ReceivesFromSrq(qpn));
        }
        if qp.state() == QpState::Reset {
            return Err(EngineError::BadState {
                what: "receive",
                state: QpState::Reset,
            });
        }
        if qp.rq.len() >= qp.caps.max_recv_wr as usize {
            return Err(EngineError::QueueFull("receive"));
        }
        if sg_list.len() > qp.caps.max_recv_sge as usize {
            return Err(EngineError::InvalidWr(format!(
                "{} SGEs > max_recv_sge {}",
                sg_list.len(),
                qp.caps.max_recv_sge
            )));
        }
        let len = self
            .sh
            .mrs
            .check_recv_sges(sg_list)
            .map_err(|f| EngineError::InvalidWr(format!("receive SGE: {f:?}")))?;
        let wqe = RecvWqe {
            wr_id,
            sges: sg_list.into(),
            len,
            pd: qp.pd,
        };
        if qp.state() == QpState::Err {
            let wc = completion::recv_wc(qp, &wqe, WcStatus::WrFlushErr, 0);
            self.sh.cqs.push(qp.recv_cq, wc, false, &mut self.sh.events);
            return Ok(());
        }
        qp.rq.push_back(wqe);
        Ok(())
    }
}
