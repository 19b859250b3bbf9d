//! The responder: receives requests, checks them step by step (as rxe's `rxe_resp.c`
//! state machine does), executes them and queues what goes back (IBTA 9.7.5).
//!
//! Check order for a request: PSN (9.7.5.1.1) → op sequence (9.7.5.1.2) → lengths
//! (9.7.5.1.3 / C9-88..) → receive WQE or RNR (9.7.5.1.4) → R_Key/PD/access/bounds/alignment
//! (9.7.5.1.3, C9-88) → execute → ACK (9.7.5.1.5/6). A failed check sends one NAK; a class
//! B/C/D error also moves the QP to the error state.
use std::net::IpAddr;

use crate::wire::{FrameRepr, NakCode, OpcodeInfo, PacketRepr, Position, Psn, Syndrome};

use super::modify::flush_qp;
use super::mr::AccessFault;
use super::qp::{InProgress, Qp, RecvWqe, Response, SavedResource};
use super::transmit::OutPacket;
use super::types::{Access, QpState, Wc, WcOpcode, WcStatus};
use super::{DeviceState, CREDIT_UNLIMITED};

/// Responses queued per QP at most; beyond that new ACKs are dropped (the requester's
/// timer recovers) so a duplicate flood cannot grow memory.
const MAX_QUEUED_RESPONSES: usize = 1024;

/// The largest message a request may carry or ask for: 2^31 bytes, what `max_msg_sz`
/// announces. A longer RETH DMA length is an invalid request: "the length specified in an
/// RDMA request is greater than 2^31 bytes" is one of the causes of a Remote Invalid Request
/// the IBTA lists for that completion status (ibv_poll_cq(3) quotes it); rxe checks the same
/// (`check_length`, class C, NAK Invalid Request).
pub(crate) const MAX_MESSAGE_LEN: u64 = super::limits::MAX_MSG_SZ as u64;

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

fn queue(qp: &mut Qp, sh: &mut DeviceState, r: Response) {
    // ACK coalescing: a not-yet-sent ACK is superseded by a later one (it acknowledges more).
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

/// A class B/C/D responder error: NAK `code` at `psn`; the receive WQE in use (if any)
/// completes with `status`; the QP goes to ERR (IBTA 9.9.3.1.2/3).
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

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    Write,
    Read,
    Atomic,
}

fn kind(info: &OpcodeInfo, opcode: crate::wire::Opcode) -> Option<Kind> {
    use crate::wire::Opcode as O;
    if info.has_atomic_eth {
        return Some(Kind::Atomic);
    }
    if opcode == O::RC_RDMA_READ_REQUEST {
        return Some(Kind::Read);
    }
    let op = opcode.0 & 0x1F;
    match op {
        0..=5 | 22 | 23 => Some(Kind::Send),
        6..=11 => Some(Kind::Write),
        _ => None,
    }
}

/// Handle an RC request packet.
pub(crate) fn handle_request(
    qp: &mut Qp,
    sh: &mut DeviceState,
    pkt: &PacketRepr<'_>,
    info: &OpcodeInfo,
) {
    if !matches!(
        qp.state(),
        QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
    ) {
        sh.counters.drops.bad_state += 1;
        return;
    }
    let Some(kind) = kind(info, pkt.bth.opcode) else {
        sh.counters.drops.bad_opcode += 1;
        return;
    };
    let psn = pkt.bth.psn;
    let diff = qp.resp.epsn.distance_to(psn);
    if diff > 0 {
        // 9.7.5.1.1: ahead of the expected PSN: one sequence NAK per gap, then silence.
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
        return;
    }
    if diff < 0 {
        duplicate(qp, sh, pkt, kind);
        return;
    }
    let mtu = qp.mtu() as usize;
    let plen = pkt.payload.len();
    // 9.7.5.1.2 op sequence: inside a SEND only SEND MIDDLE/LAST, inside a WRITE only
    // WRITE MIDDLE/LAST, otherwise only a FIRST/ONLY/READ/ATOMIC.
    let pos = info.position;
    let seq_ok = matches!(
        (&qp.resp.in_progress, kind, pos),
        (
            InProgress::Send { .. },
            Kind::Send,
            Position::Middle | Position::Last
        ) | (
            InProgress::Write { .. },
            Kind::Write,
            Position::Middle | Position::Last
        ) | (InProgress::None, Kind::Read | Kind::Atomic, _)
            | (
                InProgress::None,
                Kind::Send | Kind::Write,
                Position::First | Position::Only
            )
    );
    if !seq_ok {
        fatal(qp, sh, psn, NakCode::InvalidRequest, WcStatus::RemInvReqErr);
        return;
    }
    // Length rules (C9-24..): FIRST/MIDDLE exactly one MTU, LAST 1..=MTU, ONLY 0..=MTU.
    let len_ok = match (kind, pos) {
        (Kind::Read | Kind::Atomic, _) => plen == 0,
        (_, Position::First | Position::Middle) => plen == mtu,
        (_, Position::Last) => plen >= 1 && plen <= mtu,
        (_, Position::Only) => plen <= mtu,
    };
    if !len_ok {
        fatal(qp, sh, psn, NakCode::InvalidRequest, WcStatus::LocLenErr);
        return;
    }
    let last = matches!(pos, Position::Last | Position::Only);
    // Receive WQE for SEND (FIRST/ONLY) and for WRITE with immediate (LAST/ONLY).
    let needs_wqe = match kind {
        Kind::Send => matches!(pos, Position::First | Position::Only),
        Kind::Write => last && info.has_immdt,
        _ => false,
    };
    if needs_wqe && qp.rq.is_empty() {
        // 9.7.5.1.4: Receiver Not Ready. The PSN is not consumed; stay silent until the
        // requester comes back to it.
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
        return;
    }
    match kind {
        Kind::Send => {
            if matches!(pos, Position::First | Position::Only) {
                let Some(wqe) = qp.rq.pop_front() else {
                    return;
                };
                qp.resp.in_progress = InProgress::Send { wqe, offset: 0 };
            }
            let InProgress::Send { wqe, offset, .. } = &mut qp.resp.in_progress else {
                return;
            };
            // Both terms are bounded (offset <= wqe.len, plen <= MTU): no overflow.
            let end = *offset + plen as u64;
            if end > wqe.len || end > MAX_MESSAGE_LEN {
                // C9-xx: the message does not fit the receive buffer (or is longer than any
                // message may be, so its byte count would not fit a completion).
                fatal(qp, sh, psn, NakCode::InvalidRequest, WcStatus::LocLenErr);
                return;
            }
            if !sh.mrs.scatter(&wqe.sges, *offset, pkt.payload) {
                fatal(
                    qp,
                    sh,
                    psn,
                    NakCode::RemoteOperationalError,
                    WcStatus::LocProtErr,
                );
                return;
            }
            *offset += plen as u64;
            if last {
                let InProgress::Send { wqe, offset, .. } =
                    std::mem::replace(&mut qp.resp.in_progress, InProgress::None)
                else {
                    return;
                };
                let mut wc = recv_wc(qp, &wqe, WcStatus::Success, offset as u32);
                wc.imm_data = pkt.immdt;
                if let Some(rkey) = pkt.ieth {
                    // SEND with invalidate: the R_Key stops working (IBTA 10.6.7.2).
                    match sh.mrs.get_mut(rkey) {
                        Some(mr) if mr.pd == qp.pd => {
                            mr.rkey_valid = false;
                            wc.invalidated_rkey = Some(rkey);
                        }
                        _ => {
                            fatal(qp, sh, psn, NakCode::InvalidRequest, WcStatus::RemInvReqErr);
                            return;
                        }
                    }
                }
                qp.resp.msn = qp.resp.msn.wrapping_add(1) & 0xFF_FFFF;
                let cq = qp.recv_cq;
                if !super::cq::post(qp, sh, cq, wc, pkt.bth.solicited) {
                    return;
                }
            }
        }
        Kind::Write => {
            if matches!(pos, Position::First | Position::Only) {
                let Some(reth) = pkt.reth else {
                    sh.counters.drops.malformed += 1;
                    return;
                };
                let len = reth.dma_len as u64;
                if len > MAX_MESSAGE_LEN {
                    fatal(qp, sh, psn, NakCode::InvalidRequest, WcStatus::RemInvReqErr);
                    return;
                }
                if pos == Position::Only && plen as u64 != len
                    || pos == Position::First && plen as u64 >= len
                {
                    fatal(qp, sh, psn, NakCode::InvalidRequest, WcStatus::RemInvReqErr);
                    return;
                }
                if len > 0
                    && check_remote(qp, sh, reth.rkey, reth.va, len, Access::REMOTE_WRITE).is_err()
                {
                    fatal(
                        qp,
                        sh,
                        psn,
                        NakCode::RemoteAccessError,
                        WcStatus::RemAccessErr,
                    );
                    return;
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
                return;
            };
            if plen as u64 > *remaining || (last && plen as u64 != *remaining) {
                fatal(qp, sh, psn, NakCode::InvalidRequest, WcStatus::RemInvReqErr);
                return;
            }
            if plen > 0 {
                let Some(dst) = sh.mrs.slice_mut(*rkey, *va, plen as u64) else {
                    fatal(
                        qp,
                        sh,
                        psn,
                        NakCode::RemoteAccessError,
                        WcStatus::RemAccessErr,
                    );
                    return;
                };
                dst.copy_from_slice(pkt.payload);
            }
            // Wrapping, and harmless: a non-zero length was bounds-checked as a whole above,
            // so [va, va+len) does not wrap; with length 0 nothing is added. The next packet's
            // `slice_mut` checks the address again.
            *va = va.wrapping_add(plen as u64);
            *remaining -= plen as u64;
            let total = *total;
            if last {
                qp.resp.in_progress = InProgress::None;
                qp.resp.msn = qp.resp.msn.wrapping_add(1) & 0xFF_FFFF;
                if info.has_immdt {
                    let Some(wqe) = qp.rq.pop_front() else {
                        return;
                    };
                    let mut wc = recv_wc(qp, &wqe, WcStatus::Success, total as u32);
                    wc.opcode = WcOpcode::RecvRdmaWithImm;
                    wc.imm_data = pkt.immdt;
                    let cq = qp.recv_cq;
                    if !super::cq::post(qp, sh, cq, wc, pkt.bth.solicited) {
                        return;
                    }
                }
            }
        }
        Kind::Read => {
            let Some(reth) = pkt.reth else {
                sh.counters.drops.malformed += 1;
                return;
            };
            let len = reth.dma_len;
            if len as u64 > MAX_MESSAGE_LEN {
                fatal(qp, sh, psn, NakCode::InvalidRequest, WcStatus::RemInvReqErr);
                return;
            }
            // IBTA 9.4.3: a zero-length READ needs no R_Key or address check; it is answered
            // with one empty READ RESPONSE ONLY. Its VA stays unchecked (it may be anything,
            // u64::MAX included): the saved resource has length 0, so no later duplicate can
            // reach memory through it (`replay_fits`).
            if len > 0
                && check_remote(qp, sh, reth.rkey, reth.va, len as u64, Access::REMOTE_READ)
                    .is_err()
            {
                fatal(
                    qp,
                    sh,
                    psn,
                    NakCode::RemoteAccessError,
                    WcStatus::RemAccessErr,
                );
                return;
            }
            let npkts = (len as usize).div_ceil(mtu).max(1) as u32;
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
            return;
        }
        Kind::Atomic => {
            let Some(a) = pkt.atomic_eth else {
                sh.counters.drops.malformed += 1;
                return;
            };
            // A misaligned atomic is an invalid request, not an access error: the AtomicETH
            // VA must be naturally (8-byte) aligned (IBTA 9.4.5), and the IBTA's responder
            // error classes put "misaligned atomic" in class C with NAK Invalid Request
            // (9.9.3.1.3), as rxe does (RESPST_ERR_MISALIGNED_ATOMIC) and qib/hfi1 (nack_inv).
            // The requester completes with REM_INV_REQ_ERR.
            if a.va % 8 != 0 {
                fatal(qp, sh, psn, NakCode::InvalidRequest, WcStatus::RemInvReqErr);
                return;
            }
            let cell = match check_remote(qp, sh, a.rkey, a.va, 8, Access::REMOTE_ATOMIC) {
                Ok(()) => sh.mrs.slice_mut(a.rkey, a.va, 8),
                Err(_) => None,
            };
            let Some(cell) = cell else {
                fatal(
                    qp,
                    sh,
                    psn,
                    NakCode::RemoteAccessError,
                    WcStatus::RemAccessErr,
                );
                return;
            };
            let mut word = [0u8; 8];
            word.copy_from_slice(cell);
            let orig = u64::from_ne_bytes(word);
            let new = if pkt.bth.opcode == crate::wire::Opcode::RC_COMPARE_SWAP {
                if orig == a.compare {
                    a.swap_add
                } else {
                    orig
                }
            } else {
                orig.wrapping_add(a.swap_add)
            };
            cell.copy_from_slice(&new.to_ne_bytes());
            qp.resp.msn = qp.resp.msn.wrapping_add(1) & 0xFF_FFFF;
            let msn = qp.resp.msn;
            save_resource(qp, SavedResource::Atomic { psn, orig, msn });
            queue(qp, sh, Response::AtomicAck { psn, orig, msn });
            qp.resp.epsn = psn.wrapping_add(1);
            qp.resp.nak_sent = false;
            return;
        }
    }
    qp.resp.epsn = psn.wrapping_add(1);
    qp.resp.nak_sent = false;
    if pkt.bth.ack_req {
        ack(qp, sh, psn);
    }
}

fn check_remote(
    qp: &Qp,
    sh: &DeviceState,
    rkey: u32,
    va: u64,
    len: u64,
    need: Access,
) -> Result<(), AccessFault> {
    // The QP's own access flags gate remote operations as well as the MR's (C10-x).
    if !qp.attr.qp_access_flags.contains(need) {
        return Err(AccessFault::NoPermission);
    }
    sh.mrs.check_remote(rkey, qp.pd, va, len, need)
}

fn save_resource(qp: &mut Qp, r: SavedResource) {
    let limit = Qp::rd_atomic_limit(qp.attr.max_dest_rd_atomic);
    while qp.resp.resources.len() >= limit {
        qp.resp.resources.pop_front();
    }
    qp.resp.resources.push_back(r);
}

/// A request with a PSN before the expected one (9.7.5.1.1 "duplicate").
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
            // and start where its PSN says (9.7.5.1.5). Anything else (a longer range, another
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
                // Return the saved result; never execute an atomic twice (C9-152).
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
/// they are answered again from the saved resources (IBTA 9.7.5.1.5, C9-178). ACKs and
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

/// The next ACK, NAK, atomic ACK or READ response packet of this QP.
pub(crate) fn next_response(qp: &mut Qp, sh: &mut DeviceState) -> Option<OutPacket> {
    let av = *qp.av()?;
    let dest_qp = qp.attr.dest_qp_num;
    let mtu = qp.mtu();
    let front = *qp.resp.responses.front()?;
    use crate::wire::{AethRepr, AtomicAckEthRepr, Opcode};
    match front {
        Response::Ack { psn, syndrome, msn } => {
            qp.resp.responses.pop_front();
            let mut pkt = OutPacket::new(av, dest_qp, Opcode::RC_ACKNOWLEDGE, psn);
            pkt.aeth = Some(AethRepr { syndrome, msn });
            Some(pkt)
        }
        Response::AtomicAck { psn, orig, msn } => {
            qp.resp.responses.pop_front();
            let mut pkt = OutPacket::new(av, dest_qp, Opcode::RC_ATOMIC_ACKNOWLEDGE, psn);
            pkt.aeth = Some(AethRepr {
                syndrome: Syndrome::Ack {
                    credit: CREDIT_UNLIMITED,
                },
                msn,
            });
            pkt.atomic_ack_eth = Some(AtomicAckEthRepr { orig_data: orig });
            Some(pkt)
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
                    .check_remote(rkey, qp.pd, data_va, plen as u64, Access::REMOTE_READ)
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
                return next_response(qp, sh);
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
            let mut pkt = OutPacket::new(av, dest_qp, opcode, psn.wrapping_add(k));
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
            Some(pkt)
        }
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

/// UD receive (IBTA 9.8.3 / 10.2.4): Q_Key check, receive WQE, 40-byte GRH before the data.
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
    if deth.qkey != qp.attr.qkey {
        sh.counters.drops.bad_qkey += 1;
        return;
    }
    let Some(wqe) = qp.rq.pop_front() else {
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
        super::cq::post(qp, sh, cq, wc, false);
        return;
    }
    if !sh.mrs.scatter(&wqe.sges, 0, &grh) || !sh.mrs.scatter(&wqe.sges, 40, pkt.payload) {
        let wc = recv_wc(qp, &wqe, WcStatus::LocProtErr, 0);
        let cq = qp.recv_cq;
        super::cq::post(qp, sh, cq, wc, false);
        return;
    }
    let mut wc = recv_wc(qp, &wqe, WcStatus::Success, total as u32);
    wc.imm_data = pkt.immdt;
    wc.src_qp = deth.src_qp;
    wc.grh_present = true;
    wc.sender_ip = Some(src_ip);
    wc.sender_mac = Some(frame.eth.src);
    let cq = qp.recv_cq;
    super::cq::post(qp, sh, cq, wc, pkt.bth.solicited);
}
