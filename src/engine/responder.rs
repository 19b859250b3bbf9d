//! The responder: receives requests, checks them step by step (as rxe's `rxe_resp.c` does),
//! executes them and queues what goes back: ACKs, NAKs, READ responses, atomic ACKs.
//!
//! [`handle_request`] reads as the list of checks. Every request passes `check_state`,
//! `check_opcode`, `check_psn`, `check_op_sequence` and `check_packet_length`, then
//! `take_resource` takes the receive WQE it needs (from the QP's receive queue or its SRQ);
//! each operation then checks its own headers, lengths and keys
//! (`check_reth`, `check_message_length`, `check_write_length`, `check_rkey`,
//! `check_atomic_alignment`, `check_receive_space`, ...). A failed check returns a
//! [`ResponderError`] whose [`Outcome`] is its IBTA class: a silent drop, a duplicate, a
//! PSN sequence error NAK (class B), an RNR NAK, or a NAK that ends the QP (class A/C).
//! docs/engine.md has the checks as a table.
use std::net::IpAddr;

use crate::wire::{
    AtomicEthRepr, FrameRepr, NakCode, OpcodeInfo, PacketRepr, Position, Psn, RethRepr, Syndrome,
};

use super::completion::{self, flush_qp, recv_wc};
use super::limits::MAX_MSG_SZ;
use super::mr::{AccessFault, MrTable, RemoteAccess};
use super::outgoing::OutPacket;
use super::qp::{InProgress, Qp, RecvWqe, Response, SavedResource};
use super::srq::{give_back_recv_wqe, take_recv_wqe};
use super::types::{Access, PdId, QpState, WcOpcode, WcStatus};
use super::{DeviceState, CREDIT_UNLIMITED};

/// Responses queued per QP at most; beyond that new ACKs are dropped (the requester's
/// timer recovers) so a duplicate flood cannot grow memory.
const MAX_QUEUED_RESPONSES: usize = 1024;

fn queue(qp: &mut Qp, sh: &mut DeviceState, r: Response) {
    // ACK coalescing (IBTA 9.7.5.1.2): a not-yet-sent ACK is superseded by a later one (it
    // acknowledges more).
    if let (
        Response::Ack {
            syndrome: Syndrome::Ack { .. },
            ..
        },
        Some(Response::Ack {
            syndrome: Syndrome::Ack { .. },
            ..
        }),
    ) = (&r, qp.resp.responses.back())
    {
        qp.resp.responses.pop_back();
        sh.counters.acks_coalesced += 1;
    }
    if qp.resp.responses.len() >= MAX_QUEUED_RESPONSES {
        sh.counters.drops.response_queue_full += 1;
        return;
    }
    qp.resp.responses.push_back(r);
}

fn ack(qp: &mut Qp, sh: &mut DeviceState, psn: Psn) {
    let msn = qp.resp.msn;
    queue(
        qp,
        sh,
        Response::Ack {
            psn,
            syndrome: Syndrome::Ack {
                credit: CREDIT_UNLIMITED,
            },
            msn,
        },
    );
}

/// A class A or C responder error (IBTA 9.9.3.1, Table 63; class C: 9.9.3.1.3): NAK `code`
/// at `psn`; the receive WQE in use (if any) completes with `status`; the QP goes to ERR.
fn fatal(qp: &mut Qp, sh: &mut DeviceState, psn: Psn, code: NakCode, status: WcStatus) {
    let msn = qp.resp.msn;
    queue(
        qp,
        sh,
        Response::Ack {
            psn,
            syndrome: Syndrome::Nak(code),
            msn,
        },
    );
    if let InProgress::Send { wqe, offset, .. } =
        std::mem::replace(&mut qp.resp.in_progress, InProgress::None)
    {
        let wc = recv_wc(qp, &wqe, status, offset as u32);
        sh.cqs.push(qp.recv_cq, wc, false, &mut sh.events);
    }
    sh.events.push_back(super::Event::QpFatal(qp.qpn));
    flush_qp(qp, sh);
}

/// The four kinds of RC request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Send,
    Write,
    Read,
    Atomic,
}

/// Why the responder does not execute a request: one variant per check that can fail. Each
/// carries what the IBTA prescribes for it ([`ResponderError::outcome`]); the classes are
/// those of IBTA Table 63 "Responder Error Behavior Summary" (9.9.3.1): class A and C errors
/// are NAKed and end the QP, class B (a PSN sequence error) is NAKed and recovered from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ResponderError {
    /// The QP does not receive in its state: RESET, INIT and ERR drop what arrives (IBTA
    /// 10.3.1). Silent drop.
    NotReceiving,
    /// An RC request opcode this responder does not implement. Silent drop.
    UnsupportedOpcode,
    /// The RETH or AtomicETH the opcode needs is missing. Silent drop.
    MissingHeader,
    /// The PSN is ahead of the expected PSN: packets were lost (IBTA 9.7, RC responder). Class B
    /// (9.9.3.1, Table 63): one PSN sequence error NAK per gap, the QP state does not change.
    PsnAhead,
    /// The PSN is behind the expected PSN: a duplicate (IBTA 9.7, C9-105). Not
    /// executed again; re-acknowledged or answered from a saved resource.
    Duplicate,
    /// A MIDDLE/LAST that continues no message of its kind, or a FIRST/ONLY/READ/ATOMIC in
    /// the middle of one. Class C (9.9.3.1.3): NAK Invalid Request, REM_INV_REQ_ERR.
    OpSequence,
    /// The payload does not fit the packet's place in the message (FIRST/MIDDLE one MTU,
    /// LAST 1..=MTU, ONLY 0..=MTU, READ/ATOMIC none). Class C: NAK Invalid Request; the
    /// receive WQE in use completes with LOC_LEN_ERR.
    PacketLength,
    /// A SEND (FIRST/ONLY) or a WRITE with immediate (LAST/ONLY) finds no receive WQE (IBTA
    /// 9.7, RC responder). RNR NAK (9.7.5.2.8); the PSN is not consumed. A WRITE without
    /// immediate consumes no WQE (C10-87, IBTA 10.7.2.2).
    ReceiverNotReady,
    /// The RETH DMA length is over 2^31 bytes ([`MAX_MSG_SZ`]). Class C: NAK Invalid
    /// Request.
    MessageTooLong,
    /// A WRITE's payload disagrees with its RETH DMA length (an ONLY carries all of it, a
    /// FIRST less, no packet more than is left, a LAST exactly the rest). Class C: NAK
    /// Invalid Request.
    WriteLength,
    /// The R_Key, PD, access rights or bounds refuse the access, or the memory went away
    /// (IBTA 9.7.4.1.5, R_Key validation). Class C (Table 63 lists R_Key violations there):
    /// NAK Remote Access Error.
    RemoteAccess,
    /// The AtomicETH VA is not 8-byte aligned (IBTA 9.4). Class C: NAK Invalid Request, as
    /// rxe (RESPST_ERR_MISALIGNED_ATOMIC) and qib/hfi1 do.
    MisalignedAtomic,
    /// The SEND is longer than its receive WQE (or than any message may be, so its byte count
    /// would not fit a completion). Class C length error: NAK Invalid Request, LOC_LEN_ERR.
    ReceiveBufferTooSmall,
    /// The receive WQE's buffers could not be written. Class A (9.9.3.1, Table 63: a malformed
    /// WQE): NAK Remote Operational Error, LOC_PROT_ERR.
    ReceiveBufferFault,
    /// SEND with invalidate names an R_Key that is not an MR of the QP's PD (IBTA 10.6).
    /// Class C: NAK Invalid Request.
    InvalidateRkey,
}

/// What the responder does about a [`ResponderError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Dropped without an answer and counted.
    SilentDrop,
    /// Answered from what was saved, never executed twice.
    Duplicate,
    /// One PSN sequence error NAK at the expected PSN per gap, then silence (class B).
    SequenceNak,
    /// An RNR NAK at the request's PSN; the requester retries it after the timer.
    RnrNak,
    /// NAK `nak`; the receive WQE in use completes with `status`; the QP enters ERR.
    Fatal { nak: NakCode, status: WcStatus },
}

impl ResponderError {
    /// The IBTA class of the error: how the responder answers it.
    pub(crate) fn outcome(self) -> Outcome {
        use ResponderError as E;
        let fatal = |nak, status| Outcome::Fatal { nak, status };
        match self {
            E::NotReceiving | E::UnsupportedOpcode | E::MissingHeader => Outcome::SilentDrop,
            E::Duplicate => Outcome::Duplicate,
            E::PsnAhead => Outcome::SequenceNak,
            E::ReceiverNotReady => Outcome::RnrNak,
            E::OpSequence
            | E::MessageTooLong
            | E::WriteLength
            | E::MisalignedAtomic
            | E::InvalidateRkey => fatal(NakCode::InvalidRequest, WcStatus::RemInvReqErr),
            E::PacketLength | E::ReceiveBufferTooSmall => {
                fatal(NakCode::InvalidRequest, WcStatus::LocLenErr)
            }
            E::RemoteAccess => fatal(NakCode::RemoteAccessError, WcStatus::RemAccessErr),
            E::ReceiveBufferFault => fatal(NakCode::RemoteOperationalError, WcStatus::LocProtErr),
        }
    }
}

/// How a request that passed its checks ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Executed {
    /// It consumed its PSN: move the expected PSN on, ACK if it asks (IBTA 9.7.5.1).
    Acknowledge,
    /// A READ or ATOMIC: its response is queued and the expected PSN is past it already.
    Responded,
    /// Its completion could not be posted (the CQ overran and the QP is in ERR now), or a
    /// state the checks rule out was met: nothing more to do.
    Stopped,
}

/// Handle an RC request packet: the checks, in rxe's order where it does not change what
/// goes on the wire, then the operation, then the answer.
pub(crate) fn handle_request(
    qp: &mut Qp,
    sh: &mut DeviceState,
    pkt: &PacketRepr<'_>,
    info: &OpcodeInfo,
) {
    let result = check_request(qp, pkt, info).and_then(|kind| {
        let wqe = take_resource(qp, sh, kind, info)?;
        match kind {
            Kind::Send => execute_send(qp, sh, pkt, info, wqe),
            Kind::Write => execute_write(qp, sh, pkt, info, wqe),
            Kind::Read => execute_read(qp, sh, pkt),
            Kind::Atomic => execute_atomic(qp, sh, pkt),
        }
    });
    match result {
        Ok(Executed::Acknowledge) => {
            let psn = pkt.bth.psn;
            qp.resp.epsn = psn.wrapping_add(1);
            qp.resp.nak_sent = false;
            if pkt.bth.ack_req {
                ack(qp, sh, psn);
            }
        }
        Ok(Executed::Responded | Executed::Stopped) => {}
        Err(e) => reject(qp, sh, pkt, info, e),
    }
}

/// The checks every request passes before its operation starts; each operation checks its
/// own headers and keys next (`execute_*`).
fn check_request(qp: &Qp, pkt: &PacketRepr<'_>, info: &OpcodeInfo) -> Result<Kind, ResponderError> {
    check_state(qp.state())?;
    let kind = check_opcode(info)?;
    check_psn(qp.resp.epsn, pkt.bth.psn)?;
    check_op_sequence(&qp.resp.in_progress, kind, info.position)?;
    check_packet_length(kind, info.position, pkt.payload.len(), qp.mtu() as usize)?;
    Ok(kind)
}

/// Answer a request that failed a check, as its error's class says.
fn reject(
    qp: &mut Qp,
    sh: &mut DeviceState,
    pkt: &PacketRepr<'_>,
    info: &OpcodeInfo,
    e: ResponderError,
) {
    let psn = pkt.bth.psn;
    match e.outcome() {
        Outcome::SilentDrop => {
            let drops = &mut sh.counters.drops;
            match e {
                ResponderError::NotReceiving => drops.bad_state += 1,
                ResponderError::UnsupportedOpcode => drops.bad_opcode += 1,
                _ => drops.malformed += 1,
            }
        }
        Outcome::Duplicate => {
            if let Ok(kind) = check_opcode(info) {
                duplicate(qp, sh, pkt, kind);
            }
        }
        Outcome::SequenceNak => {
            sh.counters.out_of_seq_request += 1;
            if qp.resp.nak_sent {
                sh.counters.drops.out_of_seq_silent += 1;
            } else {
                qp.resp.nak_sent = true;
                let (epsn, msn) = (qp.resp.epsn, qp.resp.msn);
                queue(
                    qp,
                    sh,
                    Response::Ack {
                        psn: epsn,
                        syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
                        msn,
                    },
                );
            }
        }
        Outcome::RnrNak => {
            // Stay silent until the requester comes back to this PSN.
            sh.counters.send_rnr_err += 1;
            qp.resp.nak_sent = true;
            let (msn, timer) = (qp.resp.msn, qp.attr.min_rnr_timer);
            queue(
                qp,
                sh,
                Response::Ack {
                    psn,
                    syndrome: Syndrome::RnrNak { timer },
                    msn,
                },
            );
        }
        Outcome::Fatal { nak, status } => fatal(qp, sh, psn, nak, status),
    }
}

// ----- the checks every request passes -----

/// A QP receives requests in RTR, RTS, SQD and SQE.
fn check_state(state: QpState) -> Result<(), ResponderError> {
    match state {
        QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe => Ok(()),
        _ => Err(ResponderError::NotReceiving),
    }
}

/// The kind of request the opcode asks for.
fn check_opcode(info: &OpcodeInfo) -> Result<Kind, ResponderError> {
    use crate::wire::Opcode as O;
    if info.has_atomic_eth {
        return Ok(Kind::Atomic);
    }
    if info.opcode == O::RC_RDMA_READ_REQUEST {
        return Ok(Kind::Read);
    }
    match info.opcode.0 & 0x1F {
        0..=5 | 22 | 23 => Ok(Kind::Send),
        6..=11 => Ok(Kind::Write),
        _ => Err(ResponderError::UnsupportedOpcode),
    }
}

/// The request is the one expected next.
fn check_psn(epsn: Psn, psn: Psn) -> Result<(), ResponderError> {
    match epsn.distance_to(psn) {
        0 => Ok(()),
        d if d > 0 => Err(ResponderError::PsnAhead),
        _ => Err(ResponderError::Duplicate),
    }
}

/// Inside a SEND only SEND MIDDLE/LAST may come, inside a WRITE only WRITE MIDDLE/LAST,
/// otherwise only a FIRST, an ONLY, a READ or an ATOMIC.
fn check_op_sequence(
    in_progress: &InProgress,
    kind: Kind,
    pos: Position,
) -> Result<(), ResponderError> {
    let continues = matches!(pos, Position::Middle | Position::Last);
    let ok = match in_progress {
        InProgress::Send { .. } => kind == Kind::Send && continues,
        InProgress::Write { .. } => kind == Kind::Write && continues,
        InProgress::None => matches!(kind, Kind::Read | Kind::Atomic) || !continues,
    };
    ok.then_some(()).ok_or(ResponderError::OpSequence)
}

/// FIRST and MIDDLE carry exactly one MTU, LAST 1..=MTU, ONLY 0..=MTU; READ and ATOMIC
/// requests carry no payload.
fn check_packet_length(
    kind: Kind,
    pos: Position,
    plen: usize,
    mtu: usize,
) -> Result<(), ResponderError> {
    let ok = match (kind, pos) {
        (Kind::Read | Kind::Atomic, _) => plen == 0,
        (_, Position::First | Position::Middle) => plen == mtu,
        (_, Position::Last) => plen >= 1 && plen <= mtu,
        (_, Position::Only) => plen <= mtu,
    };
    ok.then_some(()).ok_or(ResponderError::PacketLength)
}

/// A SEND (FIRST/ONLY) and a WRITE with immediate (LAST/ONLY) consume a receive WQE.
fn needs_wqe(kind: Kind, info: &OpcodeInfo) -> bool {
    match kind {
        Kind::Send => matches!(info.position, Position::First | Position::Only),
        Kind::Write => matches!(info.position, Position::Last | Position::Only) && info.has_immdt,
        _ => false,
    }
}

/// Takes the receive WQE the request consumes, if it consumes one: from the QP's receive
/// queue, or from its SRQ (IBTA 10.2.9), where it is taken at once, so that a QP of another
/// shard cannot take the same one between the check and the use (rxe's `get_srq_wqe` copies
/// it out alike). None there: receiver not ready. A request refused before it wrote to the
/// WQE's buffer gives it back (`give_back_recv_wqe`).
fn take_resource(
    qp: &mut Qp,
    sh: &mut DeviceState,
    kind: Kind,
    info: &OpcodeInfo,
) -> Result<Option<RecvWqe>, ResponderError> {
    if !needs_wqe(kind, info) {
        return Ok(None);
    }
    take_recv_wqe(qp, sh)
        .map(Some)
        .ok_or(ResponderError::ReceiverNotReady)
}

// ----- the checks of each operation -----

/// The RETH of a WRITE FIRST/ONLY or a READ request.
fn check_reth(pkt: &PacketRepr<'_>) -> Result<RethRepr, ResponderError> {
    pkt.reth.ok_or(ResponderError::MissingHeader)
}

/// No message is longer than [`MAX_MSG_SZ`].
fn check_message_length(dma_len: u64) -> Result<(), ResponderError> {
    if dma_len > u64::from(MAX_MSG_SZ) {
        return Err(ResponderError::MessageTooLong);
    }
    Ok(())
}

/// The first packet of a WRITE agrees with its RETH length: an ONLY carries all of it, a
/// FIRST less than all.
fn check_write_length(pos: Position, plen: u64, dma_len: u64) -> Result<(), ResponderError> {
    if pos == Position::Only && plen != dma_len || pos == Position::First && plen >= dma_len {
        return Err(ResponderError::WriteLength);
    }
    Ok(())
}

/// No WRITE packet carries more than is left of the RETH length; the LAST one carries all
/// that is left.
fn check_write_payload(plen: u64, remaining: u64, last: bool) -> Result<(), ResponderError> {
    if plen > remaining || (last && plen != remaining) {
        return Err(ResponderError::WriteLength);
    }
    Ok(())
}

/// The remote access `[va, va+len)` through `rkey` is allowed: the QP's own remote access
/// enables (set by Modify QP, IBTA 11.2.4.2) gate it as well as the MR's key, PD, access
/// rights and bounds.
fn check_rkey(
    qp: &Qp,
    sh: &DeviceState,
    rkey: u32,
    va: u64,
    len: u64,
    need: Access,
) -> Result<(), ResponderError> {
    if !qp.attr.qp_access_flags.contains(need) {
        return Err(ResponderError::RemoteAccess);
    }
    sh.mrs
        .check_remote(&remote(qp, rkey, va, len, need))
        .map_err(|_: AccessFault| ResponderError::RemoteAccess)
}

/// The remote access `[va, va+len)` through `rkey` on behalf of `qp`.
fn remote(qp: &Qp, rkey: u32, va: u64, len: u64, need: Access) -> RemoteAccess {
    RemoteAccess {
        rkey,
        pd: qp.pd,
        qpn: qp.qpn,
        va,
        len,
        need,
    }
}

/// The AtomicETH of an atomic request.
fn check_atomic_eth(pkt: &PacketRepr<'_>) -> Result<AtomicEthRepr, ResponderError> {
    pkt.atomic_eth.ok_or(ResponderError::MissingHeader)
}

/// An atomic's VA is naturally (8-byte) aligned.
fn check_atomic_alignment(va: u64) -> Result<(), ResponderError> {
    if va % 8 != 0 {
        return Err(ResponderError::MisalignedAtomic);
    }
    Ok(())
}

/// A SEND that ends at byte `end` of its message fits its receive WQE.
fn check_receive_space(end: u64, wqe_len: u64) -> Result<(), ResponderError> {
    if end > wqe_len || end > u64::from(MAX_MSG_SZ) {
        return Err(ResponderError::ReceiveBufferTooSmall);
    }
    Ok(())
}

/// SEND with invalidate: the R_Key stops working (IBTA 10.6.7.3); it must name
/// an MR of the QP's PD or a bound type 2 window of that PD bound to this QP.
fn invalidate_rkey(mrs: &MrTable, pd: PdId, qpn: u32, rkey: u32) -> Result<(), ResponderError> {
    if mrs.invalidate(rkey, pd, Some(qpn)) {
        Ok(())
    } else {
        Err(ResponderError::InvalidateRkey)
    }
}

// ----- execution -----

/// A SEND packet; `wqe` is the receive WQE a FIRST or ONLY took.
fn execute_send(
    qp: &mut Qp,
    sh: &mut DeviceState,
    pkt: &PacketRepr<'_>,
    info: &OpcodeInfo,
    wqe: Option<RecvWqe>,
) -> Result<Executed, ResponderError> {
    let pos = info.position;
    let plen = pkt.payload.len() as u64;
    if let Some(wqe) = wqe {
        qp.resp.in_progress = InProgress::Send { wqe, offset: 0 };
    }
    let InProgress::Send { wqe, offset, .. } = &mut qp.resp.in_progress else {
        return Ok(Executed::Stopped);
    };
    // Both terms are bounded (offset <= wqe.len, plen <= MTU): no overflow.
    check_receive_space(*offset + plen, wqe.len)?;
    if !sh
        .mrs
        .scatter_to_receive(wqe.pd, &wqe.sges, *offset, pkt.payload)
    {
        return Err(ResponderError::ReceiveBufferFault);
    }
    *offset += plen;
    if !matches!(pos, Position::Last | Position::Only) {
        return Ok(Executed::Acknowledge);
    }
    let InProgress::Send { wqe, offset, .. } =
        std::mem::replace(&mut qp.resp.in_progress, InProgress::None)
    else {
        return Ok(Executed::Stopped);
    };
    let mut wc = recv_wc(qp, &wqe, WcStatus::Success, offset as u32);
    wc.imm_data = pkt.immdt;
    if let Some(rkey) = pkt.ieth {
        invalidate_rkey(&sh.mrs, qp.pd, qp.qpn, rkey)?;
        wc.invalidated_rkey = Some(rkey);
    }
    qp.resp.msn = qp.resp.msn.wrapping_add(1) & 0xFF_FFFF;
    let cq = qp.recv_cq;
    if !completion::post(qp, sh, cq, wc, pkt.bth.solicited) {
        return Ok(Executed::Stopped);
    }
    Ok(Executed::Acknowledge)
}

/// A WRITE packet; `wqe` is the receive WQE a LAST or ONLY with immediate took. If the
/// packet is refused, the WQE goes back unconsumed (a WRITE writes none of its buffer).
fn execute_write(
    qp: &mut Qp,
    sh: &mut DeviceState,
    pkt: &PacketRepr<'_>,
    info: &OpcodeInfo,
    wqe: Option<RecvWqe>,
) -> Result<Executed, ResponderError> {
    match place_write(qp, sh, pkt, info) {
        Ok(Some(total)) => {
            qp.resp.msn = qp.resp.msn.wrapping_add(1) & 0xFF_FFFF;
            let Some(wqe) = wqe else {
                return Ok(Executed::Acknowledge);
            };
            let mut wc = recv_wc(qp, &wqe, WcStatus::Success, total as u32);
            wc.opcode = WcOpcode::RecvRdmaWithImm;
            wc.imm_data = pkt.immdt;
            let cq = qp.recv_cq;
            if !completion::post(qp, sh, cq, wc, pkt.bth.solicited) {
                return Ok(Executed::Stopped);
            }
            Ok(Executed::Acknowledge)
        }
        Ok(None) => Ok(Executed::Acknowledge),
        Err(e) => {
            if let Some(wqe) = wqe {
                give_back_recv_wqe(qp, sh, wqe);
            }
            Err(e)
        }
    }
}

/// Checks a WRITE packet and places its payload; `Some(total)` when it ended the message
/// (of `total` bytes, the RETH length).
fn place_write(
    qp: &mut Qp,
    sh: &mut DeviceState,
    pkt: &PacketRepr<'_>,
    info: &OpcodeInfo,
) -> Result<Option<u64>, ResponderError> {
    let pos = info.position;
    let plen = pkt.payload.len() as u64;
    let last = matches!(pos, Position::Last | Position::Only);
    let (pd, qpn) = (qp.pd, qp.qpn);
    if matches!(pos, Position::First | Position::Only) {
        let reth = check_reth(pkt)?;
        let len = reth.dma_len as u64;
        check_message_length(len)?;
        check_write_length(pos, plen, len)?;
        if len > 0 {
            check_rkey(qp, sh, reth.rkey, reth.va, len, Access::REMOTE_WRITE)?;
        }
        qp.resp.in_progress = InProgress::Write {
            rkey: reth.rkey,
            va: reth.va,
            remaining: len,
            total: len,
        };
    }
    let InProgress::Write {
        rkey,
        va,
        remaining,
        total,
    } = &mut qp.resp.in_progress
    else {
        // check_op_sequence admits a MIDDLE/LAST only inside a WRITE.
        return Err(ResponderError::OpSequence);
    };
    check_write_payload(plen, *remaining, last)?;
    if plen > 0 {
        // Checked again with every packet, under the window's lock: a window invalidated
        // or rebound part-way through a message takes no byte after that (the rest of the
        // message is NAKed, class C).
        let access = RemoteAccess {
            rkey: *rkey,
            pd,
            qpn,
            va: *va,
            len: plen,
            need: Access::REMOTE_WRITE,
        };
        sh.mrs
            .with_remote(&access, |dst| dst.copy_from_slice(pkt.payload))
            .map_err(|_| ResponderError::RemoteAccess)?;
    }
    // Wrapping, and harmless: a non-zero length was bounds-checked as a whole above, so
    // [va, va+len) does not wrap; with length 0 nothing is added. The next packet's
    // `slice_mut` checks the address again.
    *va = va.wrapping_add(plen);
    *remaining -= plen;
    let total = *total;
    if last {
        qp.resp.in_progress = InProgress::None;
        return Ok(Some(total));
    }
    Ok(None)
}

fn execute_read(
    qp: &mut Qp,
    sh: &mut DeviceState,
    pkt: &PacketRepr<'_>,
) -> Result<Executed, ResponderError> {
    let psn = pkt.bth.psn;
    let reth = check_reth(pkt)?;
    let len = reth.dma_len;
    check_message_length(len as u64)?;
    // IBTA 9.4 (rxe alike): a zero-length READ needs no R_Key or address check; it is answered with
    // one empty READ RESPONSE ONLY. Its VA stays unchecked (it may be anything, u64::MAX
    // included): the saved resource has length 0, so no later duplicate can reach memory
    // through it (`replay_fits`).
    if len > 0 {
        check_rkey(qp, sh, reth.rkey, reth.va, len as u64, Access::REMOTE_READ)?;
    }
    let npkts = (len as usize).div_ceil(qp.mtu() as usize).max(1) as u32;
    qp.resp.msn = qp.resp.msn.wrapping_add(1) & 0xFF_FFFF;
    let msn = qp.resp.msn;
    save_resource(
        qp,
        SavedResource::Read {
            first_psn: psn,
            npkts,
            va: reth.va,
            rkey: reth.rkey,
            len,
            msn,
        },
    );
    queue(
        qp,
        sh,
        Response::Read {
            psn,
            va: reth.va,
            rkey: reth.rkey,
            len,
            offset: 0,
            msn,
        },
    );
    qp.resp.epsn = psn.wrapping_add(npkts);
    qp.resp.nak_sent = false;
    Ok(Executed::Responded)
}

fn execute_atomic(
    qp: &mut Qp,
    sh: &mut DeviceState,
    pkt: &PacketRepr<'_>,
) -> Result<Executed, ResponderError> {
    let psn = pkt.bth.psn;
    let a = check_atomic_eth(pkt)?;
    // Misaligned is an invalid request, not an access error: checked before the R_Key.
    check_atomic_alignment(a.va)?;
    check_rkey(qp, sh, a.rkey, a.va, 8, Access::REMOTE_ATOMIC)?;
    // Read, modify and write under the region's lock: atomic against every other shard.
    let compare_swap = pkt.bth.opcode == crate::wire::Opcode::RC_COMPARE_SWAP;
    let access = remote(qp, a.rkey, a.va, 8, Access::REMOTE_ATOMIC);
    let executed = sh.mrs.with_remote(&access, |cell| {
        let mut word = [0u8; 8];
        word.copy_from_slice(cell);
        let orig = u64::from_ne_bytes(word);
        let new = if compare_swap {
            if orig == a.compare {
                a.swap_add
            } else {
                orig
            }
        } else {
            orig.wrapping_add(a.swap_add)
        };
        cell.copy_from_slice(&new.to_ne_bytes());
        orig
    });
    let Ok(orig) = executed else {
        return Err(ResponderError::RemoteAccess);
    };
    qp.resp.msn = qp.resp.msn.wrapping_add(1) & 0xFF_FFFF;
    let msn = qp.resp.msn;
    save_resource(qp, SavedResource::Atomic { psn, orig, msn });
    queue(qp, sh, Response::AtomicAck { psn, orig, msn });
    qp.resp.epsn = psn.wrapping_add(1);
    qp.resp.nak_sent = false;
    Ok(Executed::Responded)
}

fn save_resource(qp: &mut Qp, r: SavedResource) {
    let limit = Qp::rd_atomic_limit(qp.attr.max_dest_rd_atomic);
    while qp.resp.resources.len() >= limit {
        qp.resp.resources.pop_front();
    }
    qp.resp.resources.push_back(r);
}

/// A request with a PSN before the expected one: a duplicate (IBTA 9.7, C9-105).
fn duplicate(qp: &mut Qp, sh: &mut DeviceState, pkt: &PacketRepr<'_>, kind: Kind) {
    sh.counters.duplicate_request += 1;
    let psn = pkt.bth.psn;
    match kind {
        Kind::Send | Kind::Write => {
            // C9-105: acknowledge again (up to the last PSN executed), do not execute.
            let prev = qp.resp.epsn.wrapping_sub(1);
            ack(qp, sh, prev);
        }
        Kind::Read => {
            let Some(reth) = pkt.reth else {
                sh.counters.drops.malformed += 1;
                return;
            };
            let mtu = qp.mtu();
            let found = qp.resp.resources.iter().rev().find_map(|r| match *r {
                SavedResource::Read {
                    first_psn,
                    npkts,
                    va,
                    rkey,
                    len,
                    msn,
                } => {
                    let k = first_psn.distance_to(psn);
                    (k >= 0 && (k as u32) < npkts)
                        .then_some((first_psn, k as u32, va, rkey, len, msn))
                }
                _ => None,
            });
            let Some((_first, k, va, rkey, len, msn)) = found else {
                sh.counters.drops.stale_duplicate += 1;
                return;
            };
            // The retried request may ask for a sub-range; it must lie inside the original
            // and start where its PSN says (9.4.4). Anything else (a longer range, another
            // R_Key, a non-zero length against a zero-length original) is not a replay of what
            // was accepted and is dropped, as rxe does; it is never executed as a new READ.
            if reth.rkey != rkey || !replay_fits(va, len, k, mtu, reth.va, reth.dma_len) {
                sh.counters.drops.bad_duplicate += 1;
                return;
            }
            abandon_responses_from(qp, psn);
            queue(
                qp,
                sh,
                Response::Read {
                    psn,
                    va: reth.va,
                    rkey,
                    len: reth.dma_len,
                    offset: 0,
                    msn,
                },
            );
        }
        Kind::Atomic => {
            let found = qp.resp.resources.iter().rev().find_map(|r| match *r {
                SavedResource::Atomic { psn: p, orig, msn } if p == psn => Some((orig, msn)),
                _ => None,
            });
            match found {
                // Return the saved result; never execute an atomic twice (IBTA 9.7).
                Some((orig, msn)) => {
                    abandon_responses_from(qp, psn);
                    queue(qp, sh, Response::AtomicAck { psn, orig, msn })
                }
                None => sh.counters.drops.stale_duplicate += 1,
            }
        }
    }
}

/// Is `[dup_va, dup_va + dup_len)`, asked for at packet `k` of a saved READ of
/// `[va, va + len)`, the tail of that READ starting at packet `k`? Every value comes from a
/// peer, so nothing here may overflow: the offset is computed in u64 from k < 2^24 and an MTU
/// of at most 4096, and the comparison is on lengths, never on end addresses.
fn replay_fits(va: u64, len: u32, k: u32, mtu: u32, dup_va: u64, dup_len: u32) -> bool {
    let offset = k as u64 * mtu as u64;
    if offset > len as u64 {
        return false;
    }
    // Wrapping is right here: the VA is only compared. A non-zero original was
    // bounds-checked (no wrap within it); a zero-length one has offset 0.
    dup_va == va.wrapping_add(offset) && dup_len as u64 <= len as u64 - offset
}

/// A duplicate READ/ATOMIC at `psn` came in: the requester went back to `psn`, so it has
/// everything before and will discard every response at or after it that is still queued
/// here (the rest of the same READ, later READs, later atomic ACKs). Drop those so the
/// replay goes out at once; the requester resends the later requests it still needs and
/// they are answered again from the saved resources (IBTA 9.7). ACKs and
/// NAKs stay (they are small and acknowledge the SEND/WRITEs before them).
fn abandon_responses_from(qp: &mut Qp, psn: Psn) {
    let mtu = qp.mtu();
    qp.resp.responses.retain(|r| match *r {
        Response::Read {
            psn: first, len, ..
        } => {
            let last = first.wrapping_add(len.div_ceil(mtu).max(1) - 1);
            last.is_before(psn)
        }
        Response::AtomicAck { psn: p, .. } => p.is_before(psn),
        Response::Ack { .. } => true,
    });
}

/// The next ACK, NAK, atomic ACK or READ response packet of this QP, written into `pkt`
/// (in place, as [`super::requester::next_request`] does); false if there is none.
pub(crate) fn next_response(qp: &mut Qp, sh: &mut DeviceState, pkt: &mut OutPacket) -> bool {
    next_response_into(qp, sh, pkt).is_some()
}

fn next_response_into(qp: &mut Qp, sh: &mut DeviceState, pkt: &mut OutPacket) -> Option<()> {
    let av = *qp.av()?;
    let dest_qp = qp.attr.dest_qp_num;
    let mtu = qp.mtu();
    let front = *qp.resp.responses.front()?;
    use crate::wire::{AethRepr, AtomicAckEthRepr, Opcode};
    match front {
        Response::Ack { psn, syndrome, msn } => {
            qp.resp.responses.pop_front();
            pkt.reset(av, dest_qp, Opcode::RC_ACKNOWLEDGE, psn);
            pkt.aeth = Some(AethRepr { syndrome, msn });
            Some(())
        }
        Response::AtomicAck { psn, orig, msn } => {
            qp.resp.responses.pop_front();
            pkt.reset(av, dest_qp, Opcode::RC_ATOMIC_ACKNOWLEDGE, psn);
            pkt.aeth = Some(AethRepr {
                syndrome: Syndrome::Ack {
                    credit: CREDIT_UNLIMITED,
                },
                msn,
            });
            pkt.atomic_ack_eth = Some(AtomicAckEthRepr { orig_data: orig });
            Some(())
        }
        Response::Read {
            psn,
            va,
            rkey,
            len,
            offset,
            msn,
        } => {
            let n = len.div_ceil(mtu).max(1);
            let k = offset / mtu;
            let plen = (len - offset).min(mtu);
            let (first, last) = (k == 0, k + 1 == n);
            // Wrapping: the address is opaque until the check below tests it against the MR
            // (a zero-length READ reads nothing and is never checked).
            let data_va = va.wrapping_add(offset as u64);
            if plen > 0
                && sh
                    .mrs
                    .check_remote(&remote(qp, rkey, data_va, plen as u64, Access::REMOTE_READ))
                    .is_err()
            {
                // The memory went away under a streaming READ (MR deregistered, R_Key
                // invalidated). The responder can no longer read it: NAK remote access error
                // in place of this response packet, with the PSN it would have had (the IBTA
                // rule for NAKing an RDMA READ: the NAK replaces the response packet and takes
                // its PSN), and the QP enters the error state (class C, as rxe's read_reply
                // does when rxe_recheck_mr fails).
                qp.resp.responses.pop_front();
                read_fault(qp, sh, psn.wrapping_add(k));
                return next_response_into(qp, sh, pkt);
            }
            if let Some(Response::Read { offset, .. }) = qp.resp.responses.front_mut() {
                *offset += plen;
            }
            if last {
                qp.resp.responses.pop_front();
            }
            let opcode = match (first, last) {
                (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                (false, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
            };
            pkt.reset(av, dest_qp, opcode, psn.wrapping_add(k));
            if plen > 0 {
                pkt.payload_mr = Some((rkey, data_va));
            }
            pkt.payload_len = plen as usize;
            if first || last {
                pkt.aeth = Some(AethRepr {
                    syndrome: Syndrome::Ack {
                        credit: CREDIT_UNLIMITED,
                    },
                    msn,
                });
            }
            Some(())
        }
    }
}

// ----- UC (IBTA 9.8.3) -----

/// Handle a UC request packet (IBTA 9.8.3, unreliable connected responder). Nothing is ever
/// answered: no ACK, no NAK, no duplicate detection. The expected PSN only says whether a
/// MIDDLE or LAST continues the message in progress:
/// - a FIRST or ONLY starts a new message whatever its PSN: the expected PSN resynchronises
///   to it, and a message still in progress lost its end and is abandoned;
/// - a MIDDLE or LAST that is not at the expected PSN (packets were lost) or continues no
///   message of its kind (its FIRST was lost or refused) is dropped, and with it the rest of
///   the message in progress: every packet up to the next FIRST/ONLY is dropped.
///
/// An abandoned SEND gives its receive WQE back, untouched by completion, to the head of the
/// receive queue: the next message fills it from byte 0 (rxe's "class D1": the receive WR is
/// reset to its original state). The bytes the abandoned part already placed stay in the
/// buffer (and in a WRITE's target) until overwritten: UC never undoes a placement. A
/// message refused at its start (no receive WQE, an R_Key the target refuses, a length that
/// does not fit) is dropped the same way (rxe's class D for a QP without an SRQ); only a
/// receive buffer that cannot be written ends the QP (class A, the WQE completes with
/// LOC_PROT_ERR).
pub(crate) fn handle_uc(
    qp: &mut Qp,
    sh: &mut DeviceState,
    pkt: &PacketRepr<'_>,
    info: &OpcodeInfo,
) {
    if check_state(qp.state()).is_err() {
        sh.counters.drops.bad_state += 1;
        return;
    }
    let kind = match check_opcode(info) {
        Ok(k @ (Kind::Send | Kind::Write)) => k,
        _ => {
            sh.counters.drops.bad_opcode += 1;
            return;
        }
    };
    let psn = pkt.bth.psn;
    let in_sequence = psn == qp.resp.epsn;
    if !in_sequence {
        sh.counters.out_of_seq_request += 1;
    }
    if matches!(info.position, Position::First | Position::Only) {
        abandon_uc_message(qp, sh);
        if qp.state() == QpState::Err {
            // Completing an abandoned SRQ WQE overran the CQ.
            return;
        }
        qp.resp.epsn = psn;
    } else if !in_sequence || check_op_sequence(&qp.resp.in_progress, kind, info.position).is_err()
    {
        abandon_uc_message(qp, sh);
        sh.counters.drops.uc_out_of_sequence += 1;
        return;
    }
    let result = check_packet_length(kind, info.position, pkt.payload.len(), qp.mtu() as usize)
        .and_then(|()| take_resource(qp, sh, kind, info))
        .and_then(|wqe| match kind {
            Kind::Send => execute_send(qp, sh, pkt, info, wqe),
            _ => execute_write(qp, sh, pkt, info, wqe),
        });
    match result {
        Ok(_) => qp.resp.epsn = psn.wrapping_add(1),
        Err(ResponderError::ReceiveBufferFault) => {
            // Class A: the receive WQE is malformed; it completes in error, the QP ends.
            if let InProgress::Send { wqe, .. } =
                std::mem::replace(&mut qp.resp.in_progress, InProgress::None)
            {
                let wc = recv_wc(qp, &wqe, WcStatus::LocProtErr, 0);
                sh.cqs.push(qp.recv_cq, wc, false, &mut sh.events);
            }
            sh.events.push_back(super::Event::QpFatal(qp.qpn));
            flush_qp(qp, sh);
        }
        Err(_) => {
            // The message is refused: it counts as dropped even if nothing was in progress.
            if matches!(qp.resp.in_progress, InProgress::None) {
                sh.counters.uc_messages_dropped += 1;
            }
            abandon_uc_message(qp, sh);
        }
    }
}

/// Drop the UC message in progress, if any (counted): a SEND's receive WQE goes back to the
/// head of the receive queue, unconsumed. On an SRQ it completes with REM_INV_REQ_ERR
/// instead and the QP stays usable (rxe's class E, `do_class_d1e_error`: the WQE, already
/// written to in part, is not handed to another QP of the SRQ).
fn abandon_uc_message(qp: &mut Qp, sh: &mut DeviceState) {
    match std::mem::replace(&mut qp.resp.in_progress, InProgress::None) {
        InProgress::None => {}
        InProgress::Send { wqe, offset } if qp.srq.is_some() => {
            sh.counters.uc_messages_dropped += 1;
            let wc = recv_wc(qp, &wqe, WcStatus::RemInvReqErr, offset as u32);
            let cq = qp.recv_cq;
            completion::post(qp, sh, cq, wc, false);
        }
        InProgress::Send { wqe, .. } => {
            sh.counters.uc_messages_dropped += 1;
            qp.rq.push_front(wqe);
        }
        InProgress::Write { .. } => sh.counters.uc_messages_dropped += 1,
    }
}

/// A READ response could not be read from memory: NAK remote access error at `psn`, the QP
/// enters ERR (every queued response but NAKs is dropped, every WR flushed).
fn read_fault(qp: &mut Qp, sh: &mut DeviceState, psn: Psn) {
    sh.counters.read_response_faults += 1;
    let msn = qp.resp.msn;
    queue(
        qp,
        sh,
        Response::Ack {
            psn,
            syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
            msn,
        },
    );
    sh.events.push_back(super::Event::QpFatal(qp.qpn));
    flush_qp(qp, sh);
}

/// UD receive (IBTA 9.8): Q_Key check, receive WQE, 40-byte GRH area before the data (IBTA
/// 11.4.1.2, Annex A17.4.5.2).
pub(crate) fn handle_ud(
    qp: &mut Qp,
    sh: &mut DeviceState,
    frame: &FrameRepr<'_>,
    src_ip: IpAddr,
    ip_header: &[u8],
) {
    if !matches!(
        qp.state(),
        QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
    ) {
        sh.counters.drops.bad_state += 1;
        return;
    }
    let pkt = &frame.roce;
    let Some(deth) = pkt.deth else {
        sh.counters.drops.malformed += 1;
        return;
    };
    let gsi = qp.qpn == super::GSI_QPN;
    if deth.qkey != qp.attr.qkey {
        if gsi {
            sh.counters.drops.gsi_bad_qkey += 1;
        } else {
            sh.counters.drops.bad_qkey += 1;
        }
        return;
    }
    let Some(wqe) = take_recv_wqe(qp, sh) else {
        sh.counters.drops.ud_no_recv_wqe += 1;
        return;
    };
    // The GRH slot: an IPv6 header is the GRH; an IPv4 header goes in its last 20 bytes
    // (what rxe and hardware do for RoCEv2 over IPv4).
    let mut grh = [0u8; 40];
    match src_ip {
        IpAddr::V4(_) => {
            let n = ip_header.len().min(20);
            grh[20..20 + n].copy_from_slice(&ip_header[..n]);
        }
        IpAddr::V6(_) => {
            let n = ip_header.len().min(40);
            grh[..n].copy_from_slice(&ip_header[..n]);
        }
    }
    let total = 40 + pkt.payload.len() as u64;
    if total > wqe.len {
        let wc = recv_wc(qp, &wqe, WcStatus::LocLenErr, 0);
        let cq = qp.recv_cq;
        completion::post(qp, sh, cq, wc, false);
        return;
    }
    if !sh.mrs.scatter_to_receive(wqe.pd, &wqe.sges, 0, &grh)
        || !sh
            .mrs
            .scatter_to_receive(wqe.pd, &wqe.sges, 40, pkt.payload)
    {
        let wc = recv_wc(qp, &wqe, WcStatus::LocProtErr, 0);
        let cq = qp.recv_cq;
        completion::post(qp, sh, cq, wc, false);
        return;
    }
    let mut wc = recv_wc(qp, &wqe, WcStatus::Success, total as u32);
    wc.imm_data = pkt.immdt;
    wc.src_qp = deth.src_qp;
    wc.grh_present = true;
    wc.sender_ip = Some(src_ip);
    wc.sender_mac = Some(frame.eth.src);
    if gsi {
        sh.counters.gsi_rcvd += 1;
    }
    let cq = qp.recv_cq;
    completion::post(qp, sh, cq, wc, pkt.bth.solicited);
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use crate::engine::qp::SgeList;
    use crate::engine::types::CqId;
    use crate::engine::{Counters, EngineConfig};
    use crate::wire::Opcode;

    fn every_access() -> Access {
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
    }

    fn info(op: Opcode) -> &'static OpcodeInfo {
        op.info().expect("a defined opcode")
    }

    fn device() -> DeviceState {
        DeviceState {
            cfg: EngineConfig::new([2, 0, 0, 0, 0, 1], "198.18.0.1".parse().unwrap()),
            mrs: Default::default(),
            cqs: Default::default(),
            srqs: Default::default(),
            counters: Counters::default(),
            events: VecDeque::new(),
            scratch: vec![0; 4096],
            ip_ident: 0,
            last_emit_error: None,
        }
    }

    /// An RC QP in RTS with every remote access enabled (path MTU 1024, the default).
    fn rts_qp(pd: PdId, recv_cq: CqId) -> Qp {
        Qp::rc_in_rts(pd, recv_cq, every_access())
    }

    fn packet<'a>(opcode: Opcode, psn: u32, payload: &'a [u8]) -> PacketRepr<'a> {
        let mut pkt = PacketRepr::new(opcode, 0x11);
        pkt.bth.psn = Psn::new(psn);
        PacketRepr { payload, ..pkt }
    }

    #[test]
    fn check_state_receives_in_rtr_rts_sqd_sqe_only() {
        for s in [QpState::Rtr, QpState::Rts, QpState::Sqd, QpState::Sqe] {
            assert_eq!(check_state(s), Ok(()), "{s:?}");
        }
        for s in [QpState::Reset, QpState::Init, QpState::Err] {
            assert_eq!(check_state(s), Err(ResponderError::NotReceiving), "{s:?}");
        }
    }

    #[test]
    fn check_opcode_knows_the_four_request_kinds() {
        assert_eq!(
            check_opcode(info(Opcode::RC_SEND_ONLY_WITH_INVALIDATE)),
            Ok(Kind::Send)
        );
        assert_eq!(
            check_opcode(info(Opcode::RC_RDMA_WRITE_MIDDLE)),
            Ok(Kind::Write)
        );
        assert_eq!(
            check_opcode(info(Opcode::RC_RDMA_READ_REQUEST)),
            Ok(Kind::Read)
        );
        assert_eq!(check_opcode(info(Opcode::RC_FETCH_ADD)), Ok(Kind::Atomic));
        assert_eq!(
            check_opcode(info(Opcode::RC_ACKNOWLEDGE)),
            Err(ResponderError::UnsupportedOpcode)
        );
    }

    #[test]
    fn check_psn_sorts_expected_ahead_and_duplicate() {
        let epsn = Psn::new(0xFF_FFFF);
        assert_eq!(check_psn(epsn, Psn::new(0xFF_FFFF)), Ok(()));
        // Ahead across the 24-bit wrap.
        assert_eq!(check_psn(epsn, Psn::new(3)), Err(ResponderError::PsnAhead));
        assert_eq!(
            check_psn(epsn, Psn::new(0xFF_FFFE)),
            Err(ResponderError::Duplicate)
        );
    }

    #[test]
    fn check_op_sequence_follows_the_message_in_progress() {
        use Position::*;
        let send = InProgress::Send {
            wqe: RecvWqe {
                wr_id: 1,
                sges: SgeList::from(&[][..]),
                len: 0,
                pd: PdId(0),
            },
            offset: 0,
        };
        let write = InProgress::Write {
            rkey: 0,
            va: 0,
            remaining: 0,
            total: 0,
        };
        assert_eq!(check_op_sequence(&send, Kind::Send, Last), Ok(()));
        assert_eq!(check_op_sequence(&write, Kind::Write, Middle), Ok(()));
        assert_eq!(
            check_op_sequence(&InProgress::None, Kind::Write, First),
            Ok(())
        );
        assert_eq!(
            check_op_sequence(&InProgress::None, Kind::Read, Only),
            Ok(())
        );
        for (in_progress, kind, pos) in [
            (&send, Kind::Write, Middle),
            (&send, Kind::Send, First),
            (&write, Kind::Read, Only),
            (&InProgress::None, Kind::Send, Middle),
            (&InProgress::None, Kind::Write, Last),
        ] {
            assert_eq!(
                check_op_sequence(in_progress, kind, pos),
                Err(ResponderError::OpSequence),
                "{kind:?} {pos:?}"
            );
        }
    }

    #[test]
    fn check_packet_length_by_place_in_the_message() {
        use Position::*;
        let mtu = 1024;
        assert_eq!(check_packet_length(Kind::Send, First, mtu, mtu), Ok(()));
        assert_eq!(check_packet_length(Kind::Write, Last, 1, mtu), Ok(()));
        assert_eq!(check_packet_length(Kind::Send, Only, 0, mtu), Ok(()));
        assert_eq!(check_packet_length(Kind::Read, Only, 0, mtu), Ok(()));
        for (kind, pos, plen) in [
            (Kind::Send, First, mtu - 1),
            (Kind::Write, Middle, mtu + 1),
            (Kind::Send, Last, 0),
            (Kind::Write, Only, mtu + 1),
            (Kind::Atomic, Only, 8),
        ] {
            assert_eq!(
                check_packet_length(kind, pos, plen, mtu),
                Err(ResponderError::PacketLength),
                "{kind:?} {pos:?} {plen}"
            );
        }
    }

    #[test]
    fn a_wqe_is_taken_for_send_and_write_with_immediate() {
        assert!(needs_wqe(Kind::Send, info(Opcode::RC_SEND_FIRST)));
        assert!(needs_wqe(
            Kind::Send,
            info(Opcode::RC_SEND_ONLY_WITH_IMMEDIATE)
        ));
        assert!(needs_wqe(
            Kind::Write,
            info(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE)
        ));
        assert!(needs_wqe(
            Kind::Write,
            info(Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE)
        ));
        // A SEND MIDDLE uses the WQE its FIRST took; a WRITE without immediate takes none.
        assert!(!needs_wqe(Kind::Send, info(Opcode::RC_SEND_MIDDLE)));
        assert!(!needs_wqe(Kind::Write, info(Opcode::RC_RDMA_WRITE_ONLY)));
        assert!(!needs_wqe(Kind::Read, info(Opcode::RC_RDMA_READ_REQUEST)));

        let mut sh = device();
        let mut qp = rts_qp(PdId(0), CqId(0));
        let send = info(Opcode::RC_SEND_ONLY);
        assert_eq!(
            take_resource(&mut qp, &mut sh, Kind::Send, send).map(|w| w.is_some()),
            Err(ResponderError::ReceiverNotReady)
        );
        qp.rq.push_back(RecvWqe {
            wr_id: 7,
            sges: SgeList::from(&[][..]),
            len: 0,
            pd: PdId(0),
        });
        let taken = take_resource(&mut qp, &mut sh, Kind::Send, send).unwrap();
        assert_eq!(taken.map(|w| w.wr_id), Some(7));
        assert!(qp.rq.is_empty());
    }

    #[test]
    fn check_headers_lengths_and_alignment() {
        let mut pkt = packet(Opcode::RC_RDMA_READ_REQUEST, 0, &[]);
        assert_eq!(check_reth(&pkt), Err(ResponderError::MissingHeader));
        let reth = RethRepr {
            va: 0x1000,
            rkey: 0x100,
            dma_len: 8,
        };
        pkt.reth = Some(reth);
        assert_eq!(check_reth(&pkt), Ok(reth));
        assert_eq!(check_atomic_eth(&pkt), Err(ResponderError::MissingHeader));

        assert_eq!(check_message_length(u64::from(MAX_MSG_SZ)), Ok(()));
        assert_eq!(
            check_message_length(u64::from(MAX_MSG_SZ) + 1),
            Err(ResponderError::MessageTooLong)
        );

        assert_eq!(check_write_length(Position::Only, 8, 8), Ok(()));
        assert_eq!(check_write_length(Position::First, 1024, 4096), Ok(()));
        assert_eq!(
            check_write_length(Position::Only, 4, 8),
            Err(ResponderError::WriteLength)
        );
        assert_eq!(
            check_write_length(Position::First, 1024, 1024),
            Err(ResponderError::WriteLength)
        );

        assert_eq!(check_write_payload(1024, 2048, false), Ok(()));
        assert_eq!(check_write_payload(100, 100, true), Ok(()));
        assert_eq!(
            check_write_payload(1024, 100, false),
            Err(ResponderError::WriteLength)
        );
        assert_eq!(
            check_write_payload(50, 100, true),
            Err(ResponderError::WriteLength)
        );

        assert_eq!(check_atomic_alignment(0x1008), Ok(()));
        assert_eq!(
            check_atomic_alignment(0x1004),
            Err(ResponderError::MisalignedAtomic)
        );

        assert_eq!(check_receive_space(64, 64), Ok(()));
        assert_eq!(
            check_receive_space(65, 64),
            Err(ResponderError::ReceiveBufferTooSmall)
        );
    }

    #[test]
    fn check_rkey_wants_the_qp_enable_and_the_mr_rights() {
        let sh = device();
        let pd = PdId(0);
        let (key, addr) = sh.mrs.register(pd, 4096, every_access()).unwrap();
        let (read_only, _) = sh.mrs.register(pd, 4096, Access::REMOTE_READ).unwrap();
        let mut qp = rts_qp(pd, CqId(0));
        assert_eq!(
            check_rkey(&qp, &sh, key, addr, 4096, Access::REMOTE_WRITE),
            Ok(())
        );
        let refused = Err(ResponderError::RemoteAccess);
        // Past the end, another PD, a key without the right, an unknown key.
        assert_eq!(
            check_rkey(&qp, &sh, key, addr + 1, 4096, Access::REMOTE_WRITE),
            refused
        );
        assert_eq!(
            check_rkey(
                &rts_qp(PdId(1), CqId(0)),
                &sh,
                key,
                addr,
                8,
                Access::REMOTE_READ
            ),
            refused
        );
        assert_eq!(
            check_rkey(&qp, &sh, read_only, 0, 0, Access::REMOTE_WRITE),
            refused
        );
        assert_eq!(
            check_rkey(&qp, &sh, key ^ 1, addr, 8, Access::REMOTE_READ),
            refused
        );
        // The QP's own enables gate the access as well.
        qp.attr.qp_access_flags = Access::REMOTE_READ;
        assert_eq!(
            check_rkey(&qp, &sh, key, addr, 8, Access::REMOTE_WRITE),
            refused
        );
        assert_eq!(
            check_rkey(&qp, &sh, key, addr, 8, Access::REMOTE_READ),
            Ok(())
        );
    }

    #[test]
    fn invalidate_rkey_wants_an_mr_of_the_qps_pd() {
        let sh = device();
        let (key, addr) = sh.mrs.register(PdId(0), 64, every_access()).unwrap();
        assert_eq!(
            invalidate_rkey(&sh.mrs, PdId(1), 0x11, key),
            Err(ResponderError::InvalidateRkey)
        );
        assert!(sh.mrs.facts(key).unwrap().rkey_valid);
        assert_eq!(invalidate_rkey(&sh.mrs, PdId(0), 0x11, key), Ok(()));
        let qp = rts_qp(PdId(0), CqId(0));
        assert_eq!(
            check_rkey(&qp, &sh, key, addr, 8, Access::REMOTE_READ),
            Err(ResponderError::RemoteAccess)
        );
    }

    #[test]
    fn each_error_has_its_ibta_class() {
        use ResponderError as E;
        let fatal = |nak, status| Outcome::Fatal { nak, status };
        let inv = fatal(NakCode::InvalidRequest, WcStatus::RemInvReqErr);
        for (e, outcome) in [
            (E::NotReceiving, Outcome::SilentDrop),
            (E::UnsupportedOpcode, Outcome::SilentDrop),
            (E::MissingHeader, Outcome::SilentDrop),
            (E::PsnAhead, Outcome::SequenceNak),
            (E::Duplicate, Outcome::Duplicate),
            (E::ReceiverNotReady, Outcome::RnrNak),
            (E::OpSequence, inv),
            (E::MessageTooLong, inv),
            (E::WriteLength, inv),
            (E::MisalignedAtomic, inv),
            (E::InvalidateRkey, inv),
            (
                E::PacketLength,
                fatal(NakCode::InvalidRequest, WcStatus::LocLenErr),
            ),
            (
                E::ReceiveBufferTooSmall,
                fatal(NakCode::InvalidRequest, WcStatus::LocLenErr),
            ),
            (
                E::RemoteAccess,
                fatal(NakCode::RemoteAccessError, WcStatus::RemAccessErr),
            ),
            (
                E::ReceiveBufferFault,
                fatal(NakCode::RemoteOperationalError, WcStatus::LocProtErr),
            ),
        ] {
            assert_eq!(e.outcome(), outcome, "{e:?}");
        }
    }

    #[test]
    fn a_psn_gap_is_nakked_once_then_dropped_silently() {
        let mut sh = device();
        let cq = sh.cqs.create(16);
        let mut qp = rts_qp(PdId(0), cq);
        let pkt = packet(Opcode::RC_RDMA_WRITE_ONLY, 5, &[]);
        handle_request(&mut qp, &mut sh, &pkt, info(pkt.bth.opcode));
        handle_request(&mut qp, &mut sh, &pkt, info(pkt.bth.opcode));
        assert_eq!(sh.counters.out_of_seq_request, 2);
        assert_eq!(sh.counters.drops.out_of_seq_silent, 1);
        assert!(matches!(
            qp.resp.responses.as_slices().0,
            [Response::Ack {
                syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
                ..
            }]
        ));
        assert_eq!(qp.state(), QpState::Rts);
    }

    #[test]
    fn a_send_without_a_receive_wqe_is_rnr_nakked_and_a_fatal_error_ends_the_qp() {
        let mut sh = device();
        let cq = sh.cqs.create(16);
        let mut qp = rts_qp(PdId(0), cq);
        let send = packet(Opcode::RC_SEND_ONLY, 0, b"hi");
        handle_request(&mut qp, &mut sh, &send, info(send.bth.opcode));
        assert_eq!(sh.counters.send_rnr_err, 1);
        assert_eq!(qp.resp.epsn, Psn::new(0), "an RNR NAK consumes no PSN");
        assert!(matches!(
            qp.resp.responses.back(),
            Some(Response::Ack {
                syndrome: Syndrome::RnrNak { .. },
                psn,
                ..
            }) if *psn == Psn::new(0)
        ));

        // A WRITE through an unknown R_Key: NAK remote access error, the QP enters ERR.
        let mut write = packet(Opcode::RC_RDMA_WRITE_ONLY, 0, &[0; 8]);
        write.reth = Some(RethRepr {
            va: 0,
            rkey: 0x1234,
            dma_len: 8,
        });
        handle_request(&mut qp, &mut sh, &write, info(write.bth.opcode));
        assert_eq!(qp.state(), QpState::Err);
        assert!(matches!(
            qp.resp.responses.back(),
            Some(Response::Ack {
                syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
                ..
            })
        ));
        assert_eq!(sh.events.back(), Some(&super::super::Event::QpFatal(0x11)));
    }
}
