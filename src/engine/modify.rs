//! QP state changes: `modify_qp` (its mask is checked against the transition table in
//! `state.rs`, its values here) and the transitions the engine makes by itself: flushing
//! to ERR, failing a QP, the SQ-drained event.
use super::completion::{check_sq_drained, flush_qp};
use super::outgoing::schedule;
use super::qp::{self, Qp};
use super::types::{EngineError, QpAttr, QpAttrMask, QpState};
use super::{limits, requester, srq, state, DeviceState, Engine, EngineConfig};
use crate::wire::Psn;

impl Engine {
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
        if mask.contains(QpAttrMask::QKEY) {
            if let Some(reason) = super::gsi::qkey_refusal(qpn, attr.qkey) {
                return Err(EngineError::InvalidAttributeValue {
                    attr: "QKEY",
                    reason,
                });
            }
        }
        if mask.contains(QpAttrMask::ALT_PATH) || mask.contains(QpAttrMask::PATH_MIG_STATE) {
            return Err(EngineError::InvalidAttributeValue {
                attr: "ALT_PATH",
                reason: "automatic path migration is not supported".into(),
            });
        }
        apply_attributes(qp, attr, mask);
        if to != cur {
            enter_state(qp, &mut self.sh, to);
        }
        Engine::sync_timer(&mut self.timers, qp);
        schedule(&mut self.tx_list, qp);
        Ok(())
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
    if mask.contains(QpAttrMask::PATH_MTU) && attr.path_mtu > cfg.port_mtu {
        return bad(
            "PATH_MTU",
            format!(
                "{} is above the port's active MTU {} (its frames would not fit the link)",
                attr.path_mtu, cfg.port_mtu
            ),
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
    let max_rd = limits::MAX_RD_ATOMIC;
    if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC) && u32::from(attr.max_rd_atomic) > max_rd {
        return bad(
            "MAX_QP_RD_ATOMIC",
            format!("{} > {max_rd}", attr.max_rd_atomic),
        );
    }
    if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC) && u32::from(attr.max_dest_rd_atomic) > max_rd
    {
        return bad(
            "MAX_DEST_RD_ATOMIC",
            format!("{} > {max_rd}", attr.max_dest_rd_atomic),
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

/// Set the attributes `mask` names (checked already) to their values in `attr`, with the
/// requester and responder state they start.
fn apply_attributes(qp: &mut Qp, attr: &QpAttr, mask: QpAttrMask) {
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
}

/// The state change of a `modify_qp`: RESET clears the QP, ERR flushes it.
fn enter_state(qp: &mut Qp, sh: &mut DeviceState, to: QpState) {
    match to {
        QpState::Reset => {
            // Back to a fresh QP: queues emptied without completions (IBTA 10.3.1); its
            // QPN, type, PD, CQs and SRQ stay. A WQE it had taken from its SRQ for a message
            // in progress goes back to the SRQ for the other QPs.
            if let qp::InProgress::Send { wqe, .. } =
                std::mem::replace(&mut qp.resp.in_progress, qp::InProgress::None)
            {
                srq::give_back_recv_wqe(qp, sh, wqe);
            }
            qp.sq.clear();
            qp.rq.clear();
            // Its completions still waiting in its CQs go too (flushes of the error state
            // above all): a program that resets a QP and polls again must not read them as
            // new completions. rdma-core's hardware providers do the same on RESET
            // (mlx4/mlx5 clean their CQs of the QP); rdma-core's test suite relies on it.
            for cq in [qp.send_cq, qp.recv_cq] {
                let qpn = qp.qpn;
                sh.cqs.with(cq, |c| c.entries.retain(|wc| wc.qp_num != qpn));
            }
            qp.last_wqe_reached = false;
            qp.req = Default::default();
            qp.resp = Default::default();
            qp.attr = QpAttr::default();
        }
        QpState::Err => {
            qp.attr.qp_state = QpState::Err;
            flush_qp(qp, sh);
        }
        _ => {}
    }
    qp.attr.qp_state = to;
    qp.attr.cur_qp_state = to;
    qp.sqd_notified = false;
    if to == QpState::Sqd {
        requester::ask_ack_before_drain(qp);
    }
    check_sq_drained(qp, sh);
}
