//! The receive demultiplexer: parse a frame, check its addresses, P_Key, QP and transport,
//! and hand it to the responder (requests) or the completer (responses).
use std::net::IpAddr;

use super::outgoing::schedule;
use super::time::Instant;
use super::types::QpType;
use super::{completer, responder, DropCounters, Engine, DEFAULT_PKEY};
use crate::wire::{self, IpRepr, WireError};

impl Engine {
    /// Process one received Ethernet frame; the ICRC is verified.
    pub fn handle_frame(&mut self, now: Instant, frame: &[u8]) {
        self.receive(now, frame, true)
    }

    /// Process one received frame without checking its ICRC: for drivers that do not see
    /// the real IP header (the kernel UDP socket driver synthesizes one). Corruption that
    /// the ICRC would catch goes unnoticed; say so where such a driver is offered.
    pub fn handle_frame_unverified(&mut self, now: Instant, frame: &[u8]) {
        self.receive(now, frame, false)
    }

    fn receive(&mut self, now: Instant, frame: &[u8], verify: bool) {
        let drops = &mut self.sh.counters.drops;
        let repr = if verify {
            match wire::parse_frame_verified(frame) {
                Ok(r) => r,
                Err(WireError::BadIcrc { .. }) => {
                    drops.bad_icrc += 1;
                    return;
                }
                Err(e) => {
                    count_parse_error(drops, &e);
                    return;
                }
            }
        } else {
            match wire::parse_frame(frame) {
                Ok(p) => p.repr,
                Err(e) => {
                    count_parse_error(drops, &e);
                    return;
                }
            }
        };
        let (src_ip, dst_ip) = match repr.ip {
            IpRepr::V4 { src, dst, .. } => (IpAddr::V4(src), IpAddr::V4(dst)),
            IpRepr::V6 { src, dst, .. } => (IpAddr::V6(src), IpAddr::V6(dst)),
        };
        if !self.sh.cfg.gids.contains(&dst_ip) {
            drops.bad_dest_addr += 1;
            return;
        }
        let bth = repr.roce.bth;
        // P_Key: only the default partition exists; compare the 15-bit key (IBTA 10.9.3).
        if bth.pkey & 0x7FFF != DEFAULT_PKEY & 0x7FFF {
            drops.bad_pkey += 1;
            return;
        }
        let Some(info) = bth.opcode.info() else {
            drops.malformed += 1;
            return;
        };
        let Some(qp) = self.qps.get_mut(&bth.dest_qp) else {
            if bth.dest_qp == super::GSI_QPN {
                drops.no_gsi += 1;
            } else {
                drops.unknown_qp += 1;
            }
            return;
        };
        match qp.qp_type {
            QpType::Rc | QpType::Uc => {
                let transport = match qp.qp_type {
                    QpType::Uc => wire::Transport::Uc,
                    _ => wire::Transport::Rc,
                };
                if info.transport != transport {
                    drops.bad_opcode += 1;
                    return;
                }
                match qp.av() {
                    Some(av) if av.dest_ip == src_ip => {}
                    _ => {
                        drops.bad_source_addr += 1;
                        return;
                    }
                }
                self.sh.counters.rcvd_pkts += 1;
                if qp.qp_type == QpType::Uc {
                    // Every UC opcode is a request: UC has no responses (IBTA 9.8).
                    responder::handle_uc(qp, &mut self.sh, &repr.roce, info);
                } else if info.is_request {
                    responder::handle_request(qp, &mut self.sh, &repr.roce, info);
                } else {
                    completer::handle_response(qp, &mut self.sh, now, &repr.roce, info);
                }
            }
            QpType::Ud => {
                if info.transport != wire::Transport::Ud || repr.roce.deth.is_none() {
                    drops.bad_opcode += 1;
                    return;
                }
                let ip_off = if repr.eth.vlan.is_some() { 18 } else { 14 };
                let ip_header = frame.get(ip_off..).unwrap_or(&[]);
                self.sh.counters.rcvd_pkts += 1;
                responder::handle_ud(qp, &mut self.sh, &repr, src_ip, ip_header);
            }
        }
        Engine::sync_timer(&mut self.timers, qp);
        schedule(&mut self.tx_list, qp);
    }
}

/// Counts a frame the wire parser refused: RoCEv2 behind headers xroce leaves to the kernel
/// apart from the rest.
fn count_parse_error(drops: &mut DropCounters, e: &WireError) {
    match e {
        WireError::StackedVlan { .. }
        | WireError::ServiceVlanTag { .. }
        | WireError::Ipv6ExtensionHeaders { .. } => drops.unsupported_headers += 1,
        _ => drops.malformed += 1,
    }
}
