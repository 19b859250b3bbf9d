//! Outgoing packets: what the requester and the responder hand to transmit (an [`OutPacket`]),
//! and the round-robin list of QPs with something to send.
use std::collections::VecDeque;

use super::qp::Qp;
use super::types::{AddressVector, QpState, Wc};
use crate::wire::{AethRepr, AtomicAckEthRepr, AtomicEthRepr, DethRepr, Opcode, Psn, RethRepr};

/// A packet the requester or responder wants to send; its payload is in one MR
/// (`payload_mr`) or in `DeviceState::scratch`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OutPacket {
    pub av: AddressVector,
    pub dest_qp: u32,
    pub opcode: Opcode,
    pub psn: Psn,
    pub ack_req: bool,
    pub solicited: bool,
    pub reth: Option<RethRepr>,
    pub aeth: Option<AethRepr>,
    pub atomic_eth: Option<AtomicEthRepr>,
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    pub immdt: Option<u32>,
    pub ieth: Option<u32>,
    pub deth: Option<DethRepr>,
    pub payload_len: usize,
    /// The payload lies in one MR (key, address): emitted straight from it, no gather copy.
    pub payload_mr: Option<(u32, u64)>,
    /// UD, and the last packet of a UC message: the send WQE's completion (and whether it
    /// is signaled), pushed only once the frame is emitted; with an error status if it
    /// cannot be.
    pub ud_completion: Option<(Wc, bool)>,
}

impl OutPacket {
    pub fn new(av: AddressVector, dest_qp: u32, opcode: Opcode, psn: Psn) -> OutPacket {
        OutPacket {
            av,
            dest_qp,
            opcode,
            psn,
            ack_req: false,
            solicited: false,
            reth: None,
            aeth: None,
            atomic_eth: None,
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
            deth: None,
            payload_len: 0,
            payload_mr: None,
            ud_completion: None,
        }
    }

    /// Make this the packet [`OutPacket::new`] gives, in place.
    pub fn reset(&mut self, av: AddressVector, dest_qp: u32, opcode: Opcode, psn: Psn) {
        *self = OutPacket::new(av, dest_qp, opcode, psn);
    }
}

/// Put a QP on the transmit list if it may have something to send.
pub(crate) fn schedule(list: &mut VecDeque<u32>, qp: &mut Qp) {
    if !qp.in_tx_list && has_tx_work(qp) {
        qp.in_tx_list = true;
        list.push_back(qp.qpn);
    }
}

pub(crate) fn has_tx_work(qp: &Qp) -> bool {
    if !qp.resp.responses.is_empty() {
        return true;
    }
    matches!(qp.state(), QpState::Rts | QpState::Sqd)
        && qp.req.rnr_deadline.is_none()
        && qp.req.send_idx < qp.sq.len()
}
