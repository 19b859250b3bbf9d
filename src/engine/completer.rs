//! The completer: consumes ACKs, NAKs, READ responses and atomic ACKs; completes send WQEs
//! strictly in posting order; runs go-back-N, the local ACK timer and RNR waits (IBTA 9.7.5.2,
//! 9.7.6).
//!
//! The requester's outstanding PSNs are `[una, high_psn)`. A response outside that range is
//! a ghost (beyond anything sent) or a duplicate (already acknowledged) and is dropped.
use crate::wire::{NakCode, OpcodeInfo, PacketRepr, Position, Psn, Syndrome};

use super::completion::{check_sq_drained, fail_qp, send_wc};
use super::qp::Qp;
use super::time::Instant;
use super::timers::{local_ack_timeout, rnr_delay};
use super::types::{QpState, WcStatus, WrOp};
use super::DeviceState;

/// Handle an RC response packet (ACK, NAK, READ response, atomic ACK).
pub(crate) fn handle_response(
    qp: &mut Qp,
    sh: &mut DeviceState,
    now: Instant,
    pkt: &PacketRepr<'_>,
    info: &OpcodeInfo,
) {
    if !matches!(qp.state(), QpState::Rts | QpState::Sqd | QpState::Sqe) {
        sh.counters.drops.bad_state += 1;
        return;
    }
    let psn = pkt.bth.psn;
    if !psn.is_before(qp.req.high_psn) {
        // Ghost or out-of-window: acknowledges something never sent (IBTA 9.7).
        sh.counters.drops.ghost_ack += 1;
        return;
    }
    if psn.is_before(qp.req.una) {
        sh.counters.drops.duplicate_ack += 1;
        if is_read_response(pkt.bth.opcode) && qp.req.una.is_before(qp.req.high_psn) {
            // A replay of a READ we already have (rxe answers every duplicate READ in full,
            // in order): the responder is alive and will reach what we wait for after it.
            // Firing the ACK timer now would only queue one more replay behind this one
            // (a livelock once a replay takes longer than the timeout).
            qp.req.retrans_deadline = local_ack_timeout(qp.attr.timeout).map(|t| now + t);
        }
        return;
    }
    use crate::wire::Opcode as O;
    match pkt.bth.opcode {
        O::RC_RDMA_READ_RESPONSE_FIRST
        | O::RC_RDMA_READ_RESPONSE_MIDDLE
        | O::RC_RDMA_READ_RESPONSE_LAST
        | O::RC_RDMA_READ_RESPONSE_ONLY => read_response(qp, sh, now, pkt, info),
        O::RC_ATOMIC_ACKNOWLEDGE => atomic_ack(qp, sh, now, pkt),
        O::RC_ACKNOWLEDGE => {
            let Some(aeth) = pkt.aeth else {
                sh.counters.drops.malformed += 1;
                return;
            };
            match aeth.syndrome {
                Syndrome::Ack { .. } => {
                    ack_through(qp, sh, now, psn);
                }
                Syndrome::RnrNak { timer } => {
                    // The NAK acknowledges everything before its PSN.
                    if !ack_through(qp, sh, now, psn.wrapping_sub(1)) {
                        return;
                    }
                    sh.counters.rcvd_rnr_err += 1;
                    if qp.attr.rnr_retry != 7 {
                        if qp.req.rnr_left == 0 {
                            sh.counters.retry_rnr_exceeded_err += 1;
                            fail_qp(qp, sh, WcStatus::RnrRetryExcErr);
                            return;
                        }
                        qp.req.rnr_left -= 1;
                    }
                    go_back(qp, psn);
                    qp.req.retrans_deadline = None;
                    qp.req.rnr_deadline = Some(now + rnr_delay(timer));
                }
                Syndrome::Nak(code) => {
                    if !ack_through(qp, sh, now, psn.wrapping_sub(1)) {
                        return;
                    }
                    let status = match code {
                        NakCode::PsnSequenceError => {
                            sh.counters.rcvd_seq_err += 1;
                            retry(qp, sh, now, psn);
                            return;
                        }
                        NakCode::InvalidRequest | NakCode::InvalidRdRequest => {
                            WcStatus::RemInvReqErr
                        }
                        NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                        NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                        NakCode::Reserved(_) => {
                            sh.counters.drops.malformed += 1;
                            return;
                        }
                    };
                    fail_qp(qp, sh, status);
                }
                Syndrome::Reserved(_) => sh.counters.drops.malformed += 1,
            }
        }
        _ => sh.counters.drops.bad_opcode += 1,
    }
}

fn is_read_response(op: crate::wire::Opcode) -> bool {
    use crate::wire::Opcode as O;
    matches!(
        op,
        O::RC_RDMA_READ_RESPONSE_FIRST
            | O::RC_RDMA_READ_RESPONSE_MIDDLE
            | O::RC_RDMA_READ_RESPONSE_LAST
            | O::RC_RDMA_READ_RESPONSE_ONLY
    )
}

/// Progress was made: retry budgets refill and the ACK timer restarts (or stops).
fn progressed(qp: &mut Qp, now: Instant) {
    qp.req.retry_left = qp.attr.retry_cnt;
    qp.req.rnr_left = qp.attr.rnr_retry;
    qp.req.gap_retry_at = None;
    qp.req.retrans_deadline = if qp.req.una.is_before(qp.req.high_psn) {
        local_ack_timeout(qp.attr.timeout).map(|t| now + t)
    } else {
        None
    };
}

/// The oldest WQE is done: complete it (if signaled) and consider every PSN it used
/// acknowledged; then the local operations right behind it that have run complete too.
pub(crate) fn complete_front(qp: &mut Qp, sh: &mut DeviceState) {
    complete_one(qp, sh);
    while qp.sq.front().is_some_and(|w| w.local_done) {
        complete_one(qp, sh);
    }
}

fn complete_one(qp: &mut Qp, sh: &mut DeviceState) {
    // Read in place, then dropped: popping it into a local moved the whole WQE.
    let Some(wqe) = qp.sq.front() else {
        return;
    };
    let wc = wqe.signaled.then(|| send_wc(qp, wqe, WcStatus::Success));
    let last = wqe.last_psn();
    qp.sq.pop_front();
    if let Some(wc) = wc {
        let cq = qp.send_cq;
        super::completion::post(qp, sh, cq, wc, false);
    }
    if qp.req.send_idx > 0 {
        qp.req.send_idx -= 1;
    } else {
        qp.req.send_pkt = 0;
    }
    if let Some(last) = last {
        advance_una(qp, last.wrapping_add(1));
    }
    check_sq_drained(qp, sh);
}

fn advance_una(qp: &mut Qp, to: Psn) -> bool {
    if qp.req.una.is_before(to) {
        qp.req.una = to;
        if qp.req.next_psn.is_before(to) {
            go_back(qp, to);
        }
        true
    } else {
        false
    }
}

/// Complete every SEND/WRITE WQE whose last PSN is at or before `p` (ACK coalescing,
/// 9.7.5.1.2). A READ or ATOMIC covered by `p` whose response never came is an implied NAK
/// (IBTA 9.7): its responses were lost, so it is retried. Returns false if a
/// retry started or the QP failed.
fn ack_through(qp: &mut Qp, sh: &mut DeviceState, now: Instant, p: Psn) -> bool {
    if p.is_before(qp.req.una) {
        return true;
    }
    let mut progress = false;
    while let Some(w) = qp.sq.front() {
        let Some(first) = w.first_psn else { break };
        if p.is_before(first) {
            break;
        }
        if w.op.is_read_or_atomic() {
            let resume = first.wrapping_add(w.read_done_pkts);
            if p.is_before(resume) {
                // `p` ends inside the part of this READ already received (a NAK in place of
                // its next response acknowledges up to the one before): nothing is implied
                // lost, the READ is still owed.
                break;
            }
            if advance_una(qp, resume) {
                progress = true;
            }
            if progress {
                progressed(qp, now);
            }
            gap_retry(qp, sh, now, resume);
            return false;
        }
        let Some(last) = w.last_psn() else { break };
        if p.is_before(last) {
            break;
        }
        complete_front(qp, sh);
        progress = true;
    }
    if advance_una(qp, p.wrapping_add(1)) {
        progress = true;
    }
    if progress {
        progressed(qp, now);
    }
    true
}

/// Complete the SEND/WRITE WQEs before `psn` (a response at `psn` implies them), leaving
/// the READ/ATOMIC that `psn` belongs to at the front. Returns false if there is none.
fn settle_before(qp: &mut Qp, sh: &mut DeviceState, psn: Psn) -> bool {
    while let Some(w) = qp.sq.front() {
        let (Some(first), Some(last)) = (w.first_psn, w.last_psn()) else {
            return false;
        };
        if w.op.is_read_or_atomic() {
            return !psn.is_before(first);
        }
        if !last.is_before(psn) {
            return false;
        }
        complete_front(qp, sh);
    }
    false
}

/// A READ response or atomic ACK whose PSN is one of the oldest outstanding SEND's or
/// WRITE's: the responder answered another kind of request than was sent, a bad response
/// (IBTA 9.7.5.2; the WR completes with BAD_RESP_ERR).
fn answers_a_send_or_write(qp: &Qp, psn: Psn) -> bool {
    qp.sq.front().is_some_and(|w| {
        !w.op.is_read_or_atomic()
            && matches!((w.first_psn, w.last_psn()), (Some(first), Some(last))
                if !psn.is_before(first) && !last.is_before(psn))
    })
}

fn read_response(
    qp: &mut Qp,
    sh: &mut DeviceState,
    now: Instant,
    pkt: &PacketRepr<'_>,
    info: &OpcodeInfo,
) {
    let psn = pkt.bth.psn;
    if !settle_before(qp, sh, psn) {
        if answers_a_send_or_write(qp, psn) {
            fail_qp(qp, sh, WcStatus::BadRespErr);
            return;
        }
        sh.counters.drops.unexpected_response += 1;
        return;
    }
    let mtu = qp.mtu();
    let Some(w) = qp.sq.front_mut() else { return };
    let Some(first) = w.first_psn else { return };
    let inside = !psn.is_before(first) && psn.is_before(first.wrapping_add(w.npkts));
    if inside && !matches!(w.op, WrOp::Read { .. }) {
        // A READ response at the PSN of a SEND, WRITE or atomic: the responder answered
        // another request than this one (IBTA 9.7.5.2, bad response).
        fail_qp(qp, sh, WcStatus::BadRespErr);
        return;
    }
    if !matches!(w.op, WrOp::Read { .. }) || !psn.is_before(first.wrapping_add(w.npkts)) {
        // An ATOMIC (or a READ response beyond this READ) is still owed: implied NAK.
        let resume = first.wrapping_add(w.read_done_pkts);
        sh.counters.drops.unexpected_response += 1;
        if resume.is_before(psn) {
            gap_retry(qp, sh, now, resume);
        }
        return;
    }
    let expected = first.wrapping_add(w.read_done_pkts);
    if psn != expected {
        sh.counters.drops.unexpected_response += 1;
        if psn.is_after(expected) {
            // A response packet was lost: retry the READ from the first missing one.
            gap_retry(qp, sh, now, expected);
            // The responder is alive and still streaming the old responses; like rxe it
            // may finish that stream before it serves the retry, so each such packet
            // restarts the ACK timer instead of letting it fire and queue more retries
            // (each of which would make the responder replay the whole rest again).
            qp.req.retrans_deadline = local_ack_timeout(qp.attr.timeout).map(|t| now + t);
        }
        return;
    }
    let offset = w.read_done_pkts as u64 * mtu as u64;
    let remaining = w.len as u64 - offset.min(w.len as u64);
    let plen = pkt.payload.len() as u64;
    let ends = matches!(info.position, Position::Last | Position::Only);
    let shape_ok = if ends {
        plen == remaining
    } else {
        plen == mtu as u64 && remaining > mtu as u64
    };
    if !shape_ok {
        fail_qp(qp, sh, WcStatus::BadRespErr);
        return;
    }
    if plen > 0 && !sh.mrs.scatter(&w.sges, offset, pkt.payload) {
        fail_qp(qp, sh, WcStatus::LocProtErr);
        return;
    }
    w.read_done_pkts += 1;
    // The retried READ's responses flow again: the WQEs behind it may be resent.
    qp.req.retry_hold = None;
    if ends {
        complete_front(qp, sh);
    }
    advance_una(qp, psn.wrapping_add(1));
    progressed(qp, now);
}

fn atomic_ack(qp: &mut Qp, sh: &mut DeviceState, now: Instant, pkt: &PacketRepr<'_>) {
    let psn = pkt.bth.psn;
    let Some(ack) = pkt.atomic_ack_eth else {
        sh.counters.drops.malformed += 1;
        return;
    };
    if !settle_before(qp, sh, psn) {
        if answers_a_send_or_write(qp, psn) {
            fail_qp(qp, sh, WcStatus::BadRespErr);
            return;
        }
        sh.counters.drops.unexpected_response += 1;
        return;
    }
    let Some(w) = qp.sq.front() else { return };
    let Some(first) = w.first_psn else { return };
    let inside = !psn.is_before(first) && psn.is_before(first.wrapping_add(w.npkts));
    if inside && !w.op.is_atomic() {
        // An atomic ACK at the PSN of a SEND, WRITE or READ: a bad response (IBTA 9.7.5.2).
        fail_qp(qp, sh, WcStatus::BadRespErr);
        return;
    }
    if !w.op.is_atomic() || first != psn {
        sh.counters.drops.unexpected_response += 1;
        let resume = first.wrapping_add(w.read_done_pkts);
        if resume.is_before(psn) {
            gap_retry(qp, sh, now, resume);
        }
        return;
    }
    let sges = w.sges.clone();
    if !sh.mrs.scatter(&sges, 0, &ack.orig_data.to_ne_bytes()) {
        fail_qp(qp, sh, WcStatus::LocProtErr);
        return;
    }
    qp.req.retry_hold = None;
    complete_front(qp, sh);
    advance_una(qp, psn.wrapping_add(1));
    progressed(qp, now);
}

/// A retry caused by a gap in the responses: once per gap (the following packets of the
/// same lost stream are evidence of the same loss).
fn gap_retry(qp: &mut Qp, sh: &mut DeviceState, now: Instant, psn: Psn) {
    if qp.req.gap_retry_at == Some(psn) {
        return;
    }
    retry(qp, sh, now, psn);
    qp.req.gap_retry_at = Some(psn);
    hold_behind_retried_read(qp);
}

/// After a retry that resumes inside a READ or ATOMIC whose responses broke off, hold back
/// the WQEs behind it. The responder answers strictly in PSN order (IBTA 9.7, as rxe
/// does): whatever it still owes for the later requests comes before the replay and is
/// discarded here, and duplicates of the later requests sent now would only queue more
/// responses to discard. They are resent once the retried operation's responses flow
/// again (`retry_hold` is cleared by the first response placed in order), or by the next
/// retry if they do not.
fn hold_behind_retried_read(qp: &mut Qp) {
    if !matches!(qp.state(), QpState::Rts | QpState::Sqd) {
        return;
    }
    let Some(w) = qp.sq.get(qp.req.send_idx) else {
        return;
    };
    if w.op.is_read_or_atomic() && w.first_psn.is_some() {
        qp.req.retry_hold = w.last_psn().map(|l| l.wrapping_add(1));
    }
}

/// Go-back-N from `psn`, spending one transport retry. retry_cnt 7 is seven retries, as the
/// spec has it (IBTA Vol. 1 9.7; only rnr_retry has an "infinite" 7). rxe retries
/// forever at 7 (docs/interop.md); hardware HCAs and xroce do not, so a vanished peer ends
/// in RETRY_EXC_ERR instead of a hang.
fn retry(qp: &mut Qp, sh: &mut DeviceState, now: Instant, psn: Psn) {
    if qp.req.retry_left == 0 {
        sh.counters.retry_exceeded_err += 1;
        fail_qp(qp, sh, WcStatus::RetryExcErr);
        return;
    }
    qp.req.retry_left -= 1;
    sh.counters.completer_retry_err += 1;
    qp.req.retry_hold = None;
    go_back(qp, psn);
    qp.req.retrans_deadline = local_ack_timeout(qp.attr.timeout).map(|t| now + t);
}

/// Rewind transmission to `psn`: the WQE holding it resumes at that packet, every later
/// WQE is sent again from its start with the same PSNs.
pub(crate) fn go_back(qp: &mut Qp, mut psn: Psn) {
    // Never rewind before the oldest outstanding WQE (its earlier PSNs are done).
    if let Some(first) = qp.sq.front().and_then(|w| w.first_psn) {
        let resume = first.wrapping_add(qp.sq[0].read_done_pkts);
        if psn.is_before(resume) {
            psn = resume;
        }
    }
    qp.req.next_psn = psn;
    qp.req.since_ackreq = 0;
    let mut started = 0;
    for (i, w) in qp.sq.iter().enumerate() {
        if w.local_done {
            // A bind or invalidation that ran takes no PSN and never runs again.
            started = i + 1;
            continue;
        }
        let Some(first) = w.first_psn else { break };
        started = i + 1;
        let k = first.distance_to(psn);
        if k >= 0 && (k as u32) < w.npkts {
            qp.req.send_idx = i;
            qp.req.send_pkt = k as u32;
            return;
        }
    }
    qp.req.send_idx = started;
    qp.req.send_pkt = 0;
}

/// Run due timers. Returns true if the QP may have something to send now.
pub(crate) fn handle_timers(qp: &mut Qp, sh: &mut DeviceState, now: Instant) -> bool {
    let mut woke = false;
    if qp.req.rnr_deadline.is_some_and(|d| d <= now) {
        qp.req.rnr_deadline = None;
        woke = true;
    }
    if qp.req.retrans_deadline.is_some_and(|d| d <= now) {
        if matches!(qp.state(), QpState::Rts | QpState::Sqd)
            && qp.req.una.is_before(qp.req.high_psn)
        {
            // Local ACK timeout (9.7.6.1.3): resend from the oldest unacknowledged PSN.
            sh.counters.local_ack_timeout_err += 1;
            let una = qp.req.una;
            retry(qp, sh, now, una);
            hold_behind_retried_read(qp);
            woke = true;
        } else {
            qp.req.retrans_deadline = None;
        }
    }
    woke
}
