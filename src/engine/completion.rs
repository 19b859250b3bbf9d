//! Completions and QP errors, below the requester, the responder and the completer, which all
//! end work here: the completion of a send or receive WQE, posting it to its CQ (a CQ that
//! cannot take it fails the QP), moving a QP to the error state with every outstanding WR
//! flushed, and the SQ-drained event of SQD.
use super::qp::{self, Qp, RecvWqe, SendWqe};
use super::srq;
use super::types::{CqId, Event, QpState, Wc, WcOpcode, WcStatus, WrOp};
use super::DeviceState;
use crate::wire;

/// The completion of a send WQE.
pub(crate) fn send_wc(qp: &Qp, wqe: &SendWqe, status: WcStatus) -> Wc {
    Wc {
        wr_id: wqe.wr_id,
        status,
        opcode: wqe.op.wc_opcode(),
        byte_len: if matches!(wqe.op, WrOp::Read { .. }) || wqe.op.is_atomic() {
            wqe.len
        } else {
            0
        },
        imm_data: None,
        invalidated_rkey: None,
        qp_num: qp.qpn,
        src_qp: qp.attr.dest_qp_num,
        grh_present: false,
        sender_ip: None,
        sender_mac: None,
    }
}

/// The receive completion for a WQE.
pub(crate) fn recv_wc(qp: &Qp, wqe: &RecvWqe, status: WcStatus, byte_len: u32) -> Wc {
    Wc {
        wr_id: wqe.wr_id,
        status,
        opcode: WcOpcode::Recv,
        byte_len,
        imm_data: None,
        invalidated_rkey: None,
        qp_num: qp.qpn,
        src_qp: qp.attr.dest_qp_num,
        grh_present: false,
        sender_ip: None,
        sender_mac: None,
    }
}

/// Post a completion of `qp` to `cq`. If the CQ cannot take it (overrun, or in error since an
/// earlier overrun), the completion is lost and the QP cannot report its work any more: it
/// enters the error state with [`Event::QpFatal`] ("Local Work Queue Catastrophic Error",
/// IBTA 10.10.2.3; rxe's RESPST_ERR_CQ_OVERFLOW moves the QP to error the same way), its
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

/// A QP fails by itself: the WQE at the head of the send queue completes with `status`, the
/// QP enters ERR and everything else is flushed.
pub(crate) fn fail_qp(qp: &mut Qp, sh: &mut DeviceState, status: WcStatus) {
    if let Some(wqe) = qp.sq.pop_front() {
        let wc = send_wc(qp, &wqe, status);
        sh.cqs.push(qp.send_cq, wc, false, &mut sh.events);
    }
    sh.events.push_back(Event::QpFatal(qp.qpn));
    flush_qp(qp, sh);
}

/// Move a QP to the error state: every outstanding WR completes with WR_FLUSH_ERR, in order
/// (IBTA 10.3.1, the Error state); queued NAKs are still sent. A QP on an SRQ flushes only the
/// WQE it was filling and raises [`Event::QpLastWqeReached`].
pub(crate) fn flush_qp(qp: &mut Qp, sh: &mut DeviceState) {
    qp.attr.qp_state = QpState::Err;
    qp.attr.cur_qp_state = QpState::Err;
    qp.req.retrans_deadline = None;
    qp.req.rnr_deadline = None;
    while let Some(wqe) = qp.sq.pop_front() {
        let wc = send_wc(qp, &wqe, WcStatus::WrFlushErr);
        sh.cqs.push(qp.send_cq, wc, false, &mut sh.events);
    }
    qp.req.send_idx = 0;
    qp.req.send_pkt = 0;
    if let qp::InProgress::Send { wqe, .. } =
        std::mem::replace(&mut qp.resp.in_progress, qp::InProgress::None)
    {
        let wc = recv_wc(qp, &wqe, WcStatus::WrFlushErr, 0);
        sh.cqs.push(qp.recv_cq, wc, false, &mut sh.events);
    }
    // A QP on an SRQ has nothing here: the SRQ's WQEs stay for its other QPs.
    while let Some(wqe) = qp.rq.pop_front() {
        let wc = recv_wc(qp, &wqe, WcStatus::WrFlushErr, 0);
        sh.cqs.push(qp.recv_cq, wc, false, &mut sh.events);
    }
    srq::last_wqe_reached(qp, sh);
    // Keep only NAKs: READ responses and ACKs of a dead QP are not sent.
    qp.resp.responses.retain(|r| {
        matches!(r, qp::Response::Ack { syndrome, .. } if !matches!(syndrome, wire::Syndrome::Ack { .. }))
    });
}

/// In SQD with `en_sqd_async_notify`: raise `Event::SqDrained` once no started WQE is left
/// outstanding (IBTA 10.3.1, "SQ Drain").
pub(crate) fn check_sq_drained(qp: &mut Qp, sh: &mut DeviceState) {
    if qp.state() == QpState::Sqd
        && qp.attr.en_sqd_async_notify
        && !qp.sqd_notified
        && qp.sq.iter().all(|w| w.first_psn.is_none())
    {
        qp.sqd_notified = true;
        sh.events.push_back(Event::SqDrained(qp.qpn));
    }
}
