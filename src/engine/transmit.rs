//! Transmit scheduling: the round-robin list of QPs with something to send, `poll_transmit`
//! (responses before requests on each QP), and building the frame of each packet.
use std::net::IpAddr;

use super::completion::{self, fail_qp, flush_qp};
use super::outgoing::{has_tx_work, schedule, OutPacket};
use super::qp::Qp;
use super::time::Instant;
use super::types::{Event, Wc, WcStatus};
use super::{requester, responder, DeviceState, Engine, DEFAULT_PKEY, MAX_FRAME_OVERHEAD};
use crate::wire::{BthRepr, EthRepr, FrameRepr, IpRepr, PacketRepr, VlanTag};

impl Engine {
    /// Write the next frame to send into `buf` (at least
    /// [`MAX_FRAME_LEN`](super::MAX_FRAME_LEN) bytes, or
    /// [`transmit_buffer_len`](super::transmit_buffer_len) of the largest path MTU in use) and
    /// return its length, or `None` if nothing is to be sent.
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        self.last_tx = None;
        if self.last_tx_ud.is_some() {
            self.last_tx_ud = None;
        }
        let mut budget = self.tx_list.len();
        while budget > 0 {
            budget -= 1;
            let qpn = self.tx_list.pop_front()?;
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            qp.in_tx_list = false;
            if buf.len() < qp.mtu() as usize + MAX_FRAME_OVERHEAD {
                self.sh.counters.drops.tx_buffer_too_small += 1;
                schedule(&mut self.tx_list, qp);
                return None;
            }
            let pkt = &mut self.out_packet;
            let is_request = if responder::next_response(qp, &mut self.sh, pkt) {
                false
            } else if requester::next_request(qp, &mut self.sh, now, pkt) {
                true
            } else {
                Engine::sync_timer(&mut self.timers, qp);
                continue;
            };
            let written = emit_packet(qp, &mut self.sh, pkt, buf);
            match written {
                Ok(n) => {
                    self.sh.counters.sent_pkts += 1;
                    // UD: the send is done only now that its frame exists.
                    if let Some((wc, true)) = pkt.ud_completion {
                        let cq = qp.send_cq;
                        completion::post(qp, &mut self.sh, cq, wc, false);
                    }
                    self.last_tx = Some(qpn);
                    if pkt.ud_completion.is_some() {
                        self.last_tx_ud = pkt.ud_completion;
                    }
                    Engine::sync_timer(&mut self.timers, qp);
                    if has_tx_work(qp) {
                        schedule(&mut self.tx_list, qp);
                    }
                    return Some(n);
                }
                Err(why) => {
                    // A request whose memory was deregistered under it: a local protection
                    // error (the requester leaves this check to the emission, which reads the
                    // bytes anyway). Anything else is a frame that cannot be built.
                    let status = if is_request && matches!(why, EmitError::PayloadGone) {
                        WcStatus::LocProtErr
                    } else {
                        let why = match (why, pkt.payload_mr) {
                            (EmitError::PayloadGone, Some((key, va))) => format!(
                                "payload {va:#x}+{} of MR {key:#x} is gone",
                                pkt.payload_len
                            ),
                            (why, _) => why.to_string(),
                        };
                        self.sh.counters.emit_failed += 1;
                        self.sh.last_emit_error = Some(format!(
                            "QP {qpn:#x}: {} PSN {}: {why}",
                            pkt.opcode.name(),
                            pkt.psn.value()
                        ));
                        WcStatus::LocQpOpErr
                    };
                    if is_request {
                        fail_unemitted_request(qp, &mut self.sh, pkt.ud_completion, status);
                    }
                    Engine::sync_timer(&mut self.timers, qp);
                    if has_tx_work(qp) {
                        schedule(&mut self.tx_list, qp);
                    }
                }
            }
        }
        None
    }

    /// The driver could not send the frame the last [`Engine::poll_transmit`] returned (call
    /// it right after, before any other engine call). A UD send then completes with
    /// `LocQpOpErr` instead of success and its QP enters ERR, as for a frame the engine
    /// cannot emit; an RC frame is left to the transport's retry, like a frame lost on the
    /// wire. Either way it is counted in
    /// [`Counters::emit_failed`](super::Counters::emit_failed) with its cause.
    pub fn report_send_failure(&mut self, reason: &str) {
        let ud_completion = self.last_tx_ud.take();
        let Some(qpn) = self.last_tx.take() else {
            return;
        };
        self.sh.counters.emit_failed += 1;
        self.sh.last_emit_error = Some(format!(
            "QP {qpn:#x}: the driver refused the frame: {reason}"
        ));
        let (Some((wc, signaled)), Some(qp)) = (ud_completion, self.qps.get_mut(&qpn)) else {
            return;
        };
        if signaled {
            // Nobody polled since poll_transmit pushed the success: take it back.
            self.sh.cqs.with(qp.send_cq, |cq| {
                if cq.entries.back() == Some(&wc) {
                    cq.entries.pop_back();
                }
            });
        }
        fail_unemitted_request(qp, &mut self.sh, ud_completion, WcStatus::LocQpOpErr);
        Engine::sync_timer(&mut self.timers, qp);
        schedule(&mut self.tx_list, qp);
    }
}

/// A request whose frame could not be emitted after its PSN was assigned: as rxe does when
/// it cannot build or transmit a packet, the WQE completes with `status` (LOC_QP_OP_ERR, or
/// LOC_PROT_ERR when its memory is gone) and the QP enters the error state (no retry could
/// ever send it). A UD or UC WQE is already off the queue.
fn fail_unemitted_request(
    qp: &mut Qp,
    sh: &mut DeviceState,
    ud_completion: Option<(Wc, bool)>,
    status: WcStatus,
) {
    match ud_completion {
        Some((mut wc, _)) => {
            wc.status = status;
            sh.cqs.push(qp.send_cq, wc, false, &mut sh.events);
            sh.events.push_back(Event::QpFatal(qp.qpn));
            flush_qp(qp, sh);
        }
        None => fail_qp(qp, sh, status),
    }
}

/// Why a packet's frame could not be built.
#[derive(Debug)]
enum EmitError {
    /// The payload's bytes are no longer in the region (deregistered, shrunk, moved).
    PayloadGone,
    /// Anything else (an address vector the frame cannot carry, a buffer too small).
    Frame(String),
}

impl std::fmt::Display for EmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmitError::PayloadGone => f.write_str("the payload's memory region is gone"),
            EmitError::Frame(why) => f.write_str(why),
        }
    }
}

/// Build the frame for `pkt` from the QP's address vector and write it to `buf`; the error
/// says why it cannot be built.
fn emit_packet(
    qp: &Qp,
    sh: &mut DeviceState,
    pkt: &OutPacket,
    buf: &mut [u8],
) -> Result<usize, EmitError> {
    let av = &pkt.av;
    let src_ip = *sh.cfg.gids.get(av.sgid_index as usize).ok_or_else(|| {
        EmitError::Frame(format!(
            "source GID index {} is beyond the GID table",
            av.sgid_index
        ))
    })?;
    let ident = match sh.cfg.fixed_ip_ident {
        Some(v) => v,
        None => {
            sh.ip_ident = sh.ip_ident.wrapping_add(1);
            sh.ip_ident
        }
    };
    let ip = match (src_ip, av.dest_ip) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => IpRepr::V4 {
            src,
            dst,
            tos: av.traffic_class,
            ttl: av.hop_limit,
            ident,
            dont_fragment: true,
        },
        (IpAddr::V6(src), IpAddr::V6(dst)) => IpRepr::V6 {
            src,
            dst,
            traffic_class: av.traffic_class,
            flow_label: av.flow_label,
            hop_limit: av.hop_limit,
        },
        (src, dst) => {
            return Err(EmitError::Frame(format!(
                "source {src} and destination {dst} differ in family"
            )))
        }
    };
    let udp_src_port = av
        .udp_src_port
        .unwrap_or_else(|| crate::wire::rxe_udp_source_port(qp.qpn, pkt.dest_qp));
    let mac = sh.cfg.mac;
    // The payload is copied from the region straight into the frame, under the region's
    // lock (another shard may be writing it). Two things keep that step cheap, each measured:
    // the headers are laid out before, and emitted with the payload beside them
    // (`emit_with_payload`), not copied into a repr of their own under the lock (that copy
    // read back fields just stored with wider loads, and stalled on store forwarding); and
    // the closure hands back only the frame's length, in a register (a `Result` carrying the
    // error came back through the stack).
    let headers = FrameRepr {
        eth: EthRepr {
            dst: av.dest_mac,
            src: mac,
            vlan: av.vlan_id.map(|vid| VlanTag {
                pcp: av.traffic_class >> 5,
                dei: false,
                vid,
            }),
        },
        ip,
        udp_src_port,
        roce: PacketRepr {
            bth: BthRepr {
                opcode: pkt.opcode,
                solicited: pkt.solicited,
                migreq: false,
                pad_count: ((4 - (pkt.payload_len % 4)) % 4) as u8,
                tver: 0,
                pkey: DEFAULT_PKEY,
                fecn: false,
                becn: false,
                dest_qp: pkt.dest_qp,
                ack_req: pkt.ack_req,
                psn: pkt.psn,
            },
            reth: pkt.reth,
            aeth: pkt.aeth,
            atomic_eth: pkt.atomic_eth,
            atomic_ack_eth: pkt.atomic_ack_eth,
            immdt: pkt.immdt,
            ieth: pkt.ieth,
            deth: pkt.deth,
            payload: &[],
        },
    };
    let mut failed = None;
    let mut build = |payload: &[u8]| {
        headers.emit_with_payload(buf, payload).unwrap_or_else(|e| {
            failed = Some(e);
            0
        })
    };
    let len = match pkt.payload_mr {
        Some((key, va)) => sh
            .mrs
            .with_payload(key, va, pkt.payload_len as u64, build)
            .ok_or(EmitError::PayloadGone)?,
        None => build(&sh.scratch[..pkt.payload_len]),
    };
    match failed {
        Some(e) => Err(EmitError::Frame(e.to_string())),
        None => Ok(len),
    }
}
