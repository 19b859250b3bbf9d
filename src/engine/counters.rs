//! Per-engine counters: the names rxe exports in its hw_counters, plus drops by reason.
use serde::Serialize;

/// Transport counters. Field names follow rxe's `hw_counters` where one exists.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Packets transmitted.
    pub sent_pkts: u64,
    /// Packets received and accepted for processing.
    pub rcvd_pkts: u64,
    /// Requests received with a PSN already seen.
    pub duplicate_request: u64,
    /// Requests received ahead of the expected PSN.
    pub out_of_seq_request: u64,
    /// RNR NAKs received by the requester.
    pub rcvd_rnr_err: u64,
    /// RNR NAKs sent by the responder.
    pub send_rnr_err: u64,
    /// PSN-sequence NAKs received by the requester.
    pub rcvd_seq_err: u64,
    /// WRs completed with RETRY_EXC_ERR.
    pub retry_exceeded_err: u64,
    /// WRs completed with RNR_RETRY_EXC_ERR.
    pub retry_rnr_exceeded_err: u64,
    /// Retries started by the completer (timeouts, sequence NAKs, implied NAKs).
    pub completer_retry_err: u64,
    /// Local ACK timeouts that fired.
    pub local_ack_timeout_err: u64,
    /// Request packets sent again (PSN not beyond the highest sent).
    pub retransmitted_packets: u64,
    /// ACKs coalesced into a later ACK before transmission.
    pub acks_coalesced: u64,
    /// Frames built but not emitted (a field no frame can carry, a region gone): the WR
    /// completes with `LocQpOpErr` and the QP enters the error state, as rxe does.
    pub emit_failed: u64,
    /// READ responses whose memory was gone when their turn came (MR deregistered or R_Key
    /// invalidated mid-stream): answered with a remote access NAK, the QP enters ERR.
    pub read_response_faults: u64,
    /// Incoming frames dropped, by reason.
    pub drops: DropCounters,
}

/// Incoming frames dropped, by reason (never a panic, never an error to the caller).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DropCounters {
    /// ICRC did not verify (corruption).
    pub bad_icrc: u64,
    /// Frame could not be parsed (truncated, lengths, unknown opcode, TVer, ...).
    pub malformed: u64,
    /// RoCEv2 frames with headers xroce does not take: stacked VLAN tags, an 802.1ad
    /// service tag, IPv6 extension headers (the XDP program leaves these to the kernel, so
    /// only other drivers can deliver them).
    pub unsupported_headers: u64,
    /// Destination IP is none of this engine's GIDs.
    pub bad_dest_addr: u64,
    /// Source address does not match the RC QP's address vector.
    pub bad_source_addr: u64,
    /// No QP with the BTH destination QPN.
    pub unknown_qp: u64,
    /// P_Key mismatch.
    pub bad_pkey: u64,
    /// UD Q_Key mismatch.
    pub bad_qkey: u64,
    /// Opcode does not fit the QP type or state.
    pub bad_opcode: u64,
    /// QP not in a state that receives.
    pub bad_state: u64,
    /// Out-of-sequence requests after the one NAK per gap.
    pub out_of_seq_silent: u64,
    /// Duplicate READ/ATOMIC with no saved resource.
    pub stale_duplicate: u64,
    /// Duplicate READ that is not a sub-range of the READ it repeats (other R_Key, longer,
    /// or not starting where its PSN says): never executed.
    pub bad_duplicate: u64,
    /// ACK/response whose PSN is beyond anything sent (ghost or out-of-window).
    pub ghost_ack: u64,
    /// ACK/response for PSNs already acknowledged.
    pub duplicate_ack: u64,
    /// READ response not at the expected PSN (triggers a retry when ahead).
    pub unexpected_response: u64,
    /// UD SEND with no receive WQE posted.
    pub ud_no_recv_wqe: u64,
    /// Responder output queue full.
    pub response_queue_full: u64,
    /// `poll_transmit` got a buffer too small for the next frame.
    pub tx_buffer_too_small: u64,
}

impl Counters {
    /// Every counter as (name, value), drops prefixed with `drop_`.
    pub fn to_pairs(&self) -> Vec<(String, u64)> {
        let v = serde_json::to_value(self).unwrap_or_default();
        let mut out = Vec::new();
        if let serde_json::Value::Object(map) = v {
            for (k, val) in map {
                match val {
                    serde_json::Value::Object(drops) => {
                        for (dk, dv) in drops {
                            out.push((format!("drop_{dk}"), dv.as_u64().unwrap_or(0)));
                        }
                    }
                    other => out.push((k, other.as_u64().unwrap_or(0))),
                }
            }
        }
        out
    }
}
