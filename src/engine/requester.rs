//! The requester: turns send WQEs into request packets (IBTA 9.7, reliable service).
//!
//! Each call of [`next_request`] produces at most one packet of the WQE at `send_idx`,
//! segmented by the path MTU, and moves `next_psn` on. Transmission stops at the 128-PSN
//! window, at `max_rd_atomic` outstanding READ/ATOMICs, at a fence, or during an RNR wait.
//! A retry (completer) only rewinds `send_idx`/`send_pkt`/`next_psn`: the same WQE then
//! yields the same PSNs again.
use crate::wire::{AtomicEthRepr, DethRepr, Opcode, Psn, RethRepr};

use super::completer::go_back;
use super::completion::{self, check_sq_drained, fail_qp, send_wc};
use super::outgoing::OutPacket;
use super::qp::{Qp, SendWqe};
use super::time::Instant;
use super::timers::local_ack_timeout;
use super::types::{
    Access, EngineError, QpState, QpType, SendFlags, SendWrRef, Sge, WcStatus, WrOp,
};
use super::{DeviceState, ACK_REQ_INTERVAL, FOLLOWED_ACK_REQ_INTERVAL, MAX_UNACKED_PSNS};

/// What checking a send WR found: its length and its inline data (copied now).
pub(crate) struct CheckedSend {
    len: u32,
    inline: Option<Vec<u8>>,
}

/// Check a send WR before it becomes a WQE ([`new_wqe`]). `data`, if given, is the WR's
/// inline payload handed over by the caller (the SGE list is then ignored), as a provider
/// copies `IBV_SEND_INLINE` data at post time. Inlined into its one caller, which builds the
/// WQE from the result: returned through the stack, the result was read back before its
/// stores had landed (a store-forwarding stall, a third of the post's own time).
#[inline(always)]
pub(crate) fn check_send_wr(
    qp: &Qp,
    sh: &DeviceState,
    wr: &SendWrRef<'_>,
    data: Option<&[u8]>,
) -> Result<CheckedSend, EngineError> {
    let bad = |s: String| Err(EngineError::InvalidWr(s));
    match (qp.qp_type, &wr.op) {
        (QpType::Ud, WrOp::Send | WrOp::SendWithImm { .. }) => {
            if wr.ud.is_none() {
                return bad("a UD send needs a destination (ud)".into());
            }
        }
        (QpType::Ud, op) => return bad(format!("{op:?} is not allowed on a UD QP")),
        (QpType::Rc, _) => {}
        // IBTA 9.8.1: UC carries SEND and RDMA WRITE (with and without immediate) only.
        // The local operations exist on both connected services.
        (
            QpType::Uc,
            WrOp::Send
            | WrOp::SendWithImm { .. }
            | WrOp::Write { .. }
            | WrOp::WriteWithImm { .. }
            | WrOp::BindMw { .. }
            | WrOp::LocalInv { .. },
        ) => {}
        (QpType::Uc, op) => {
            return Err(EngineError::UnsupportedOperation {
                op: op.name(),
                qp_type: QpType::Uc,
            })
        }
    }
    let inline = data.is_some() || wr.flags.contains(SendFlags::INLINE);
    let need = if wr.op.is_read_or_atomic() {
        Access::LOCAL_WRITE
    } else {
        Access::NONE
    };
    if inline && wr.op.is_read_or_atomic() {
        return bad("INLINE is only for SEND and WRITE".into());
    }
    // Inline data is read by address at post time: its SGEs' lkeys are not checked
    // (libibverbs: "the lkey field is not checked" for IBV_SEND_INLINE).
    let total = match (inline, data) {
        (_, Some(d)) => d.len() as u64,
        (true, None) => wr.sg_list.iter().map(|s| s.length as u64).sum(),
        (false, None) => sh
            .mrs
            .check_sges(qp.pd, wr.sg_list, need)
            .map_err(|f| EngineError::InvalidWr(format!("SGE: {f:?}")))?,
    };
    if inline && total > qp.caps.max_inline_data as u64 {
        return Err(EngineError::LimitExceeded {
            what: "max_inline_data",
            requested: total,
            max: qp.caps.max_inline_data as u64,
        });
    }
    if total > u64::from(super::limits::MAX_MSG_SZ) {
        return bad(format!(
            "message of {total} bytes exceeds the maximum message size of {} bytes (2 GiB)",
            u64::from(super::limits::MAX_MSG_SZ)
        ));
    }
    let len = total as u32;
    if wr.op.is_atomic() && len != 8 {
        return bad(format!("atomic needs an 8-byte SGE list, got {len} bytes"));
    }
    // A misaligned atomic is still posted: the responder NAKs it (class C), which is the
    // behaviour a conformance test wants to see on the wire.
    if qp.qp_type == QpType::Ud && len > qp.mtu() {
        return bad(format!(
            "UD message of {len} bytes exceeds the path MTU {}",
            qp.mtu()
        ));
    }
    let inline_data = match (inline, data) {
        (_, Some(d)) => Some(d.to_vec()),
        (true, None) => {
            let mut copy = vec![0; len as usize];
            if !sh.mrs.gather_by_addr(wr.sg_list, &mut copy) {
                return bad("inline SGE is not inside a registered region".into());
            }
            Some(copy)
        }
        (false, None) => None,
    };
    Ok(CheckedSend {
        len,
        inline: inline_data,
    })
}

/// The WQE of a checked send WR. Built where it is stored (`qp.sq.push_back(new_wqe(..))`),
/// not returned through a `Result`: each move of a WQE was a `memcpy`.
#[inline(always)]
pub(crate) fn new_wqe(qp: &Qp, wr: &SendWrRef<'_>, checked: CheckedSend) -> SendWqe {
    SendWqe {
        wr_id: wr.wr_id,
        op: wr.op,
        sges: if checked.inline.is_some() {
            (&[][..]).into()
        } else {
            wr.sg_list.into()
        },
        inline: checked.inline,
        signaled: qp.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED),
        fence: wr.flags.contains(SendFlags::FENCE),
        solicited: wr.flags.contains(SendFlags::SOLICITED),
        ud: wr.ud,
        len: checked.len,
        first_psn: None,
        npkts: 0,
        read_done_pkts: 0,
        local_done: false,
    }
}

/// If `[offset, offset+len)` of the SGE list lies inside one SGE: its (lkey, address).
fn single_sge_span(sges: &[Sge], mut offset: u64, len: u64) -> Option<(u32, u64)> {
    for sge in sges {
        let l = sge.length as u64;
        if offset < l || (l == 0 && offset == 0 && len == 0) {
            return (offset + len <= l).then_some((sge.lkey, sge.addr + offset));
        }
        offset -= l;
    }
    None
}

/// Position of packet `k` of `n`.
fn position(k: u32, n: u32) -> (bool, bool) {
    (k == 0, k + 1 == n)
}

/// Produce the next request packet of this QP into `pkt`, if any may be sent now; false if
/// none (then `pkt` may hold a packet half built, to be ignored). Written in place, not
/// returned: an `OutPacket` is a few hundred bytes, and each move of one was a `memcpy`.
pub(crate) fn next_request(
    qp: &mut Qp,
    sh: &mut DeviceState,
    now: Instant,
    pkt: &mut OutPacket,
) -> bool {
    next_request_into(qp, sh, now, pkt).is_some()
}

fn next_request_into(
    qp: &mut Qp,
    sh: &mut DeviceState,
    now: Instant,
    pkt: &mut OutPacket,
) -> Option<()> {
    let state = qp.state();
    if !matches!(state, QpState::Rts | QpState::Sqd) || qp.req.rnr_deadline.is_some() {
        return None;
    }
    match qp.qp_type {
        QpType::Ud => return next_ud(qp, sh, pkt),
        QpType::Uc => return next_uc(qp, sh, pkt),
        QpType::Rc => {}
    }
    let av = *qp.av()?;
    if !run_local_ops(qp, sh) {
        return None;
    }
    let idx = qp.req.send_idx;
    if !may_send(qp, idx) {
        return None;
    }
    let (psn, npkts) = next_packet_psn(qp, idx)?;
    let k = qp.req.send_pkt;
    let mtu = qp.mtu();
    let since_ackreq = qp.req.since_ackreq;
    let next_follows = next_message_follows(qp, idx, psn);
    pkt.reset(av, qp.attr.dest_qp_num, Opcode(0), psn);
    let wqe = qp.sq.get(idx)?;
    let consumed = match wqe.op {
        WrOp::Send
        | WrOp::SendWithImm { .. }
        | WrOp::SendWithInv { .. }
        | WrOp::Write { .. }
        | WrOp::WriteWithImm { .. } => {
            let asks = AckAsk {
                since_ackreq,
                next_follows,
            };
            if !data_request(wqe, sh, k, npkts, mtu, asks, pkt) {
                // The MR was deregistered under a posted WR: a local protection error.
                fail_qp(qp, sh, WcStatus::LocProtErr);
                return None;
            }
            1
        }
        WrOp::Read { .. } => read_request(wqe, k, npkts, mtu, pkt),
        WrOp::CompareSwap { .. } | WrOp::FetchAdd { .. } => {
            atomic_request(wqe, pkt);
            1
        }
        // run_local_ops stopped before a local operation; nothing to send for it.
        WrOp::BindMw { .. } | WrOp::LocalInv { .. } => return None,
    };
    record_sent(qp, sh, now, psn, consumed, npkts, pkt.ack_req);
    Some(())
}

/// Execute the local operations (bind, local invalidate) at the send position, in order,
/// until a WQE that sends packets: each runs once (a retry that rewinds over it skips it),
/// and completes once every WQE before it has. False if the QP cannot go on now (a fence or
/// SQD holds the operation, or it failed and the QP is in ERR).
fn run_local_ops(qp: &mut Qp, sh: &mut DeviceState) -> bool {
    loop {
        let idx = qp.req.send_idx;
        let Some(wqe) = qp.sq.get(idx) else {
            return true;
        };
        if !wqe.op.is_local() {
            return true;
        }
        if !wqe.local_done {
            if !may_send(qp, idx) {
                return false;
            }
            let op = wqe.op;
            if let Err(status) = super::mw::execute_local(qp, sh, &op) {
                fail_local_op(qp, sh, idx, status);
                return false;
            }
            if let Some(w) = qp.sq.get_mut(idx) {
                w.local_done = true;
            }
        }
        qp.req.send_idx += 1;
        qp.req.send_pkt = 0;
        if idx == 0 {
            super::completer::complete_front(qp, sh);
        }
    }
}

/// A local operation at `idx` failed: the WQEs before it (still waiting for their ACKs) are
/// flushed, it completes with `status`, and the QP enters ERR, so the send CQ still sees
/// every WQE in posting order.
fn fail_local_op(qp: &mut Qp, sh: &mut DeviceState, idx: usize, status: WcStatus) {
    for _ in 0..idx {
        if let Some(wqe) = qp.sq.pop_front() {
            let wc = send_wc(qp, &wqe, WcStatus::WrFlushErr);
            sh.cqs.push(qp.send_cq, wc, false, &mut sh.events);
        }
    }
    fail_qp(qp, sh, status);
}

/// Whether the WQE at `idx` may send a packet now: within the PSN window; for a WQE not
/// started yet, not in SQD, past its fence and within max_rd_atomic; and not behind a
/// READ/ATOMIC being retried.
fn may_send(qp: &Qp, idx: usize) -> bool {
    let Some(wqe) = qp.sq.get(idx) else {
        return false;
    };
    // rxe: at most 128 PSNs between the oldest unacknowledged and the next to send.
    if qp.req.una.distance_to(qp.req.next_psn) >= MAX_UNACKED_PSNS {
        return false;
    }
    if wqe.first_psn.is_none() {
        if qp.state() == QpState::Sqd {
            return false;
        }
        let rd_atomic_before = || {
            qp.sq
                .iter()
                .take(idx)
                .filter(|w| w.op.is_read_or_atomic())
                .count()
        };
        // Fence (IBTA 10.8.3, ordering rules): wait for every earlier READ/ATOMIC to complete.
        if wqe.fence && rd_atomic_before() > 0 {
            return false;
        }
        if wqe.op.is_read_or_atomic()
            && rd_atomic_before() >= Qp::rd_atomic_limit(qp.attr.max_rd_atomic)
        {
            return false;
        }
    }
    // A READ/ATOMIC is being retried: the WQEs behind it wait for its responses
    // (completer::hold_behind_retried_read).
    if let Some(hold) = qp.req.retry_hold {
        let psn = match wqe.first_psn {
            Some(first) => first.wrapping_add(qp.req.send_pkt),
            None => qp.req.next_psn,
        };
        if !psn.is_before(hold) {
            return false;
        }
    }
    true
}

/// The PSN of the next packet of the WQE at `idx` and its packet count; a WQE sent for the
/// first time takes its PSNs here.
fn next_packet_psn(qp: &mut Qp, idx: usize) -> Option<(Psn, u32)> {
    let wqe = qp.sq.get(idx)?;
    let npkts = match wqe.op {
        WrOp::CompareSwap { .. } | WrOp::FetchAdd { .. } => 1,
        _ => qp.packets_for(wqe.len),
    };
    let next_psn = qp.req.next_psn;
    let wqe = qp.sq.get_mut(idx)?;
    if wqe.first_psn.is_none() {
        wqe.first_psn = Some(next_psn);
        wqe.npkts = npkts;
    }
    let first_psn = wqe.first_psn?;
    Some((first_psn.wrapping_add(qp.req.send_pkt), npkts))
}

/// Packet `k` of `npkts` of a SEND or WRITE: its payload (inline data, straight from one MR,
/// or gathered into the scratch buffer), opcode, immediate data or R_Key to invalidate on the
/// last packet, RETH on the first, and AckReq. False if the payload's memory is gone.
fn data_request(
    wqe: &SendWqe,
    sh: &mut DeviceState,
    k: u32,
    npkts: u32,
    mtu: u32,
    asks: AckAsk,
    pkt: &mut OutPacket,
) -> bool {
    let (is_first, is_last) = position(k, npkts);
    let offset = k as u64 * mtu as u64;
    let plen = (wqe.len as u64 - offset.min(wqe.len as u64)).min(mtu as u64) as usize;
    if sh.scratch.len() < plen {
        sh.scratch.resize(plen, 0);
    }
    let ok = match &wqe.inline {
        Some(data) => {
            sh.scratch[..plen].copy_from_slice(&data[offset as usize..offset as usize + plen]);
            true
        }
        None => match single_sge_span(&wqe.sges, offset, plen as u64) {
            // The packet's bytes are contiguous in one MR: emitted from there, checked then
            // (a region gone by then fails the WQE as here: `EmitError::PayloadGone`).
            Some((key, va)) => {
                pkt.payload_mr = Some((key, va));
                true
            }
            None => sh.mrs.gather(&wqe.sges, offset, &mut sh.scratch[..plen]),
        },
    };
    if !ok {
        return false;
    }
    pkt.payload_len = plen;
    pkt.opcode = data_opcode(&wqe.op, is_first, is_last);
    match wqe.op {
        WrOp::SendWithImm { imm } | WrOp::WriteWithImm { imm, .. } if is_last => {
            pkt.immdt = Some(imm)
        }
        WrOp::SendWithInv { rkey } if is_last => pkt.ieth = Some(rkey),
        _ => {}
    }
    if let WrOp::Write { remote_addr, rkey }
    | WrOp::WriteWithImm {
        remote_addr, rkey, ..
    } = wqe.op
    {
        if is_first {
            pkt.reth = Some(RethRepr {
                va: remote_addr,
                rkey,
                dma_len: wqe.len,
            });
        }
    }
    pkt.solicited = is_last && wqe.solicited;
    let sent_without = asks.since_ackreq + 1;
    pkt.ack_req = if is_last && asks.next_follows {
        sent_without >= FOLLOWED_ACK_REQ_INTERVAL
    } else {
        is_last || sent_without >= ACK_REQ_INTERVAL
    };
    true
}

/// What decides a SEND or WRITE packet's AckReq besides its position.
#[derive(Clone, Copy)]
struct AckAsk {
    /// Packets sent without AckReq since the last that had it.
    since_ackreq: u32,
    /// Another SEND or WRITE leaves right after this message ([`next_message_follows`]).
    next_follows: bool,
}

/// Whether another SEND or WRITE already waits right behind the message at `idx` (whose
/// packet `psn` is being built) and nothing can hold it back: then the message's last packet
/// need not ask for an ACK, because the next one's will, and the responder's one ACK
/// acknowledges both (ACKs are cumulative, IBTA 9.7.5.1.2). With many QPs sending round-robin
/// this saves an ACK per message, which the responder cannot coalesce when each QP has one
/// request per round. Anything that may keep the next message waiting asks now: not RTS (in
/// SQD it will not start), a fence, a READ or atomic (its credits), a local operation, a
/// READ being retried, or a full window of unacknowledged PSNs. Such a message still asks
/// when [`FOLLOWED_ACK_REQ_INTERVAL`] packets have gone without.
fn next_message_follows(qp: &Qp, idx: usize, psn: Psn) -> bool {
    qp.state() == QpState::Rts
        && qp.req.retry_hold.is_none()
        && qp.req.una.distance_to(psn.wrapping_add(1)) < MAX_UNACKED_PSNS
        && qp.sq.get(idx + 1).is_some_and(|next| {
            !next.fence
                && matches!(
                    next.op,
                    WrOp::Send
                        | WrOp::SendWithImm { .. }
                        | WrOp::SendWithInv { .. }
                        | WrOp::Write { .. }
                        | WrOp::WriteWithImm { .. }
                )
        })
}

/// Entering SQD: the next message will not start, so if the last packet sent did not ask for
/// an ACK (its message was followed by one that now waits), send that packet again asking. The
/// responder acknowledges the duplicate (IBTA 9.7, C9-105), and the drain does not wait for
/// the retransmission timer.
pub(crate) fn ask_ack_before_drain(qp: &mut Qp) {
    let waiting_to_start = qp.req.send_pkt == 0
        && qp
            .sq
            .get(qp.req.send_idx)
            .is_some_and(|w| w.first_psn.is_none());
    if qp.qp_type == QpType::Rc
        && qp.req.since_ackreq > 0
        && waiting_to_start
        && qp.req.una.is_before(qp.req.next_psn)
    {
        go_back(qp, qp.req.next_psn.wrapping_sub(1));
    }
}

/// The READ request for packets `k..npkts` of a READ WQE; returns how many PSNs it takes.
fn read_request(wqe: &SendWqe, k: u32, npkts: u32, mtu: u32, pkt: &mut OutPacket) -> u32 {
    let WrOp::Read { remote_addr, rkey } = wqe.op else {
        return 1;
    };
    // A retried READ asks only for the part not yet received (IBTA 9.4.4).
    // k < npkts, so k * mtu < len + mtu: computed in u64 it cannot overflow.
    let offset = k as u64 * mtu as u64;
    pkt.opcode = Opcode::RC_RDMA_READ_REQUEST;
    pkt.reth = Some(RethRepr {
        // The remote VA is opaque here (the responder checks it): wrapping, never a panic
        // for an address near u64::MAX.
        va: remote_addr.wrapping_add(offset),
        rkey,
        dma_len: (wqe.len as u64 - offset.min(wqe.len as u64)) as u32,
    });
    pkt.ack_req = true;
    npkts - k
}

/// The COMPARE_SWAP or FETCH_ADD request of an atomic WQE.
fn atomic_request(wqe: &SendWqe, pkt: &mut OutPacket) {
    let (remote_addr, rkey, swap_add, compare, opcode) = match wqe.op {
        WrOp::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => (remote_addr, rkey, swap, compare, Opcode::RC_COMPARE_SWAP),
        WrOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        } => (remote_addr, rkey, add, 0, Opcode::RC_FETCH_ADD),
        _ => return,
    };
    pkt.opcode = opcode;
    pkt.atomic_eth = Some(AtomicEthRepr {
        va: remote_addr,
        rkey,
        swap_add,
        compare,
    });
    pkt.ack_req = true;
}

/// A request packet at `psn` taking `consumed` PSNs went out: move the send position, count
/// a retransmission, and start the local ACK timer if it is not running.
fn record_sent(
    qp: &mut Qp,
    sh: &mut DeviceState,
    now: Instant,
    psn: Psn,
    consumed: u32,
    npkts: u32,
    ack_req: bool,
) {
    qp.req.since_ackreq = if ack_req { 0 } else { qp.req.since_ackreq + 1 };
    qp.req.send_pkt += consumed;
    if qp.req.send_pkt >= npkts {
        qp.req.send_idx += 1;
        qp.req.send_pkt = 0;
    }
    qp.req.next_psn = psn.wrapping_add(consumed);
    if psn.is_before(qp.req.high_psn) {
        sh.counters.retransmitted_packets += 1;
    }
    if qp.req.high_psn.is_before(qp.req.next_psn) {
        qp.req.high_psn = qp.req.next_psn;
    }
    if qp.req.retrans_deadline.is_none() {
        qp.req.retrans_deadline = local_ack_timeout(qp.attr.timeout).map(|t| now + t);
    }
}

/// SEND/WRITE opcode for a packet position (IBTA 9.2, table 38).
fn data_opcode(op: &WrOp, first: bool, last: bool) -> Opcode {
    use Opcode as O;
    match (op, first, last) {
        (WrOp::Send, true, true) => O::RC_SEND_ONLY,
        (WrOp::SendWithImm { .. }, true, true) => O::RC_SEND_ONLY_WITH_IMMEDIATE,
        (WrOp::SendWithInv { .. }, true, true) => O::RC_SEND_ONLY_WITH_INVALIDATE,
        (WrOp::Send | WrOp::SendWithImm { .. } | WrOp::SendWithInv { .. }, true, false) => {
            O::RC_SEND_FIRST
        }
        (WrOp::Send, false, true) => O::RC_SEND_LAST,
        (WrOp::SendWithImm { .. }, false, true) => O::RC_SEND_LAST_WITH_IMMEDIATE,
        (WrOp::SendWithInv { .. }, false, true) => O::RC_SEND_LAST_WITH_INVALIDATE,
        (WrOp::Send | WrOp::SendWithImm { .. } | WrOp::SendWithInv { .. }, false, false) => {
            O::RC_SEND_MIDDLE
        }
        (WrOp::WriteWithImm { .. }, true, true) => O::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
        (_, true, true) => O::RC_RDMA_WRITE_ONLY,
        (_, true, false) => O::RC_RDMA_WRITE_FIRST,
        (WrOp::WriteWithImm { .. }, false, true) => O::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
        (_, false, true) => O::RC_RDMA_WRITE_LAST,
        (_, false, false) => O::RC_RDMA_WRITE_MIDDLE,
    }
}

/// UC (IBTA 9.8.2): the packets of the WQE at the head of the send queue go out in PSN
/// order with no window, no AckReq and no timer. Nothing is acknowledged, so the WQE is done
/// once its last packet is handed to the wire: like a UD send, its completion is pushed when
/// that frame is emitted.
fn next_uc(qp: &mut Qp, sh: &mut DeviceState, pkt: &mut OutPacket) -> Option<()> {
    let av = *qp.av()?;
    // Local operations at the head run now and complete at once (nothing before them is
    // outstanding: UC completes each message when its last packet leaves).
    while qp.sq.front().is_some_and(|w| w.op.is_local()) {
        if qp.state() == QpState::Sqd {
            return None;
        }
        let wqe = qp.sq.pop_front()?;
        let status = match super::mw::execute_local(qp, sh, &wqe.op) {
            Ok(()) => WcStatus::Success,
            Err(status) => status,
        };
        if status != WcStatus::Success {
            qp.sq.push_front(wqe);
            fail_qp(qp, sh, status);
            return None;
        }
        if wqe.signaled {
            let (wc, cq) = (send_wc(qp, &wqe, WcStatus::Success), qp.send_cq);
            completion::post(qp, sh, cq, wc, false);
        }
        check_sq_drained(qp, sh);
    }
    let head = qp.sq.front()?;
    if head.first_psn.is_none() && qp.state() == QpState::Sqd {
        return None;
    }
    let (psn, npkts) = next_packet_psn(qp, 0)?;
    let k = qp.req.send_pkt;
    let mtu = qp.mtu();
    pkt.reset(av, qp.attr.dest_qp_num, Opcode(0), psn);
    let wqe = qp.sq.front()?;
    // UC has no ACKs: the AckReq bit is cleared below whatever this says.
    let asks = AckAsk {
        since_ackreq: 0,
        next_follows: false,
    };
    if !data_request(wqe, sh, k, npkts, mtu, asks, pkt) {
        fail_qp(qp, sh, WcStatus::LocProtErr);
        return None;
    }
    // The UC opcodes are the RC ones with the transport bits 001 (IBTA 9.2, table 38).
    pkt.opcode = Opcode(pkt.opcode.0 | Opcode::UC_SEND_FIRST.0);
    pkt.ack_req = false;
    let next = psn.wrapping_add(1);
    qp.req.next_psn = next;
    qp.req.una = next;
    qp.req.high_psn = next;
    if k + 1 < npkts {
        qp.req.send_pkt = k + 1;
        return Some(());
    }
    qp.req.send_pkt = 0;
    let wqe = qp.sq.pop_front()?;
    pkt.ud_completion = Some((send_wc(qp, &wqe, WcStatus::Success), wqe.signaled));
    check_sq_drained(qp, sh);
    Some(())
}

/// UD: one packet per WQE, completed once its frame is emitted (there is no ACK).
fn next_ud(qp: &mut Qp, sh: &mut DeviceState, pkt: &mut OutPacket) -> Option<()> {
    if qp.state() == QpState::Sqd {
        return None;
    }
    let wqe = qp.sq.pop_front()?;
    let dest = wqe.ud?;
    let plen = wqe.len as usize;
    if sh.scratch.len() < plen {
        sh.scratch.resize(plen, 0);
    }
    let mut payload_mr = None;
    let ok = match &wqe.inline {
        Some(data) => {
            sh.scratch[..plen].copy_from_slice(data);
            true
        }
        None => match single_sge_span(&wqe.sges, 0, plen as u64) {
            // Contiguous in one MR: emitted straight from it, as for RC.
            Some((key, va)) => {
                payload_mr = Some((key, va));
                sh.mrs.in_bounds(key, va, plen as u64)
            }
            None => sh.mrs.gather(&wqe.sges, 0, &mut sh.scratch[..plen]),
        },
    };
    if !ok {
        let wc = send_wc(qp, &wqe, WcStatus::LocProtErr);
        let cq = qp.send_cq;
        completion::post(qp, sh, cq, wc, false);
        return None;
    }
    let psn = qp.req.next_psn;
    qp.req.next_psn = psn.wrapping_add(1);
    let opcode = match wqe.op {
        WrOp::SendWithImm { .. } => Opcode::UD_SEND_ONLY_WITH_IMMEDIATE,
        _ => Opcode::UD_SEND_ONLY,
    };
    pkt.reset(dest.av, dest.remote_qpn, opcode, psn);
    // IBTA 3.5.3: a Q_Key with the top bit set means "use the QP's own Q_Key".
    let qkey = if dest.remote_qkey & 0x8000_0000 != 0 {
        qp.attr.qkey
    } else {
        dest.remote_qkey
    };
    pkt.deth = Some(DethRepr {
        qkey,
        src_qp: qp.qpn,
    });
    if qp.qpn == super::GSI_QPN {
        sh.counters.gsi_sent += 1;
    }
    if let WrOp::SendWithImm { imm } = wqe.op {
        pkt.immdt = Some(imm);
    }
    pkt.solicited = wqe.solicited;
    pkt.payload_len = plen;
    pkt.payload_mr = payload_mr;
    // Pushed by poll_transmit once the frame is emitted (with an error if it cannot be).
    let mut wc = send_wc(qp, &wqe, WcStatus::Success);
    wc.src_qp = dest.remote_qpn;
    pkt.ud_completion = Some((wc, wqe.signaled));
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::qp::SgeList;
    use crate::engine::types::{CqId, PdId};

    fn wqe(op: WrOp, len: u32) -> SendWqe {
        SendWqe {
            wr_id: 7,
            op,
            sges: SgeList::from(&[][..]),
            inline: None,
            signaled: true,
            fence: false,
            solicited: false,
            ud: None,
            len,
            first_psn: None,
            npkts: 0,
            read_done_pkts: 0,
            local_done: false,
        }
    }

    fn read(len: u32) -> SendWqe {
        wqe(
            WrOp::Read {
                remote_addr: 0x1000,
                rkey: 0x100,
            },
            len,
        )
    }

    fn qp() -> Qp {
        let mut qp = Qp::rc_in_rts(PdId(0), CqId(0), Access::LOCAL_WRITE);
        qp.attr.max_rd_atomic = 1;
        qp
    }

    #[test]
    fn may_send_a_posted_wqe_within_the_window() {
        let mut qp = qp();
        assert!(!may_send(&qp, 0), "nothing posted");
        qp.sq.push_back(wqe(WrOp::Send, 8));
        assert!(may_send(&qp, 0));
        qp.req.next_psn = qp.req.una.wrapping_add(MAX_UNACKED_PSNS as u32);
        assert!(!may_send(&qp, 0), "the 128-PSN window is full");
    }

    #[test]
    fn may_send_waits_for_fences_max_rd_atomic_and_sqd() {
        let mut qp = qp();
        let mut started = read(8);
        started.first_psn = Some(Psn::new(0));
        started.npkts = 1;
        qp.sq.push_back(started);
        qp.req.next_psn = Psn::new(1);
        let mut fenced = wqe(WrOp::Send, 8);
        fenced.fence = true;
        qp.sq.push_back(fenced);
        qp.sq.push_back(read(8));
        assert!(!may_send(&qp, 1), "the fence waits for the READ before it");
        assert!(
            !may_send(&qp, 2),
            "max_rd_atomic 1 is taken by the first READ"
        );
        qp.attr.max_rd_atomic = 2;
        assert!(may_send(&qp, 2));
        qp.attr.qp_state = QpState::Sqd;
        assert!(!may_send(&qp, 2), "SQD starts no new WQE");
        assert!(may_send(&qp, 0), "SQD still finishes a started one");
    }

    #[test]
    fn may_send_holds_what_follows_a_retried_read() {
        let mut qp = qp();
        qp.attr.max_rd_atomic = 4;
        qp.sq.push_back(read(8));
        qp.req.retry_hold = Some(Psn::new(0));
        assert!(!may_send(&qp, 0));
        qp.req.retry_hold = Some(Psn::new(1));
        assert!(may_send(&qp, 0));
    }

    #[test]
    fn a_retried_read_asks_for_the_rest_only() {
        let w = read(3000);
        let mut pkt = OutPacket::new(av(), 0x12, Opcode(0), Psn::new(10));
        assert_eq!(read_request(&w, 2, 3, 1024, &mut pkt), 1);
        let reth = pkt.reth.unwrap();
        assert_eq!((reth.va, reth.dma_len), (0x1000 + 2048, 3000 - 2048));
        assert_eq!(pkt.opcode, Opcode::RC_RDMA_READ_REQUEST);
        assert!(pkt.ack_req);
    }

    #[test]
    fn atomic_request_carries_its_operands() {
        let w = wqe(
            WrOp::CompareSwap {
                remote_addr: 0x2000,
                rkey: 0x200,
                compare: 1,
                swap: 2,
            },
            8,
        );
        let mut pkt = OutPacket::new(av(), 0x12, Opcode(0), Psn::new(0));
        atomic_request(&w, &mut pkt);
        assert_eq!(pkt.opcode, Opcode::RC_COMPARE_SWAP);
        let a = pkt.atomic_eth.unwrap();
        assert_eq!((a.va, a.rkey, a.compare, a.swap_add), (0x2000, 0x200, 1, 2));
    }

    fn av() -> crate::engine::AddressVector {
        crate::engine::AddressVector::new([2, 0, 0, 0, 0, 2], "198.18.0.2".parse().unwrap())
    }
}
