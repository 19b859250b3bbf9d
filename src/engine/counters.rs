//! Per-engine counters: the names rxe exports in its hw_counters, plus drops by reason.
//!
//! Each struct lists its counters once (the `counters!` macro below) and enumerates them with
//! `fields()`, in declaration order: JSON and tables are built from that by the tools and the
//! CLI, so the engine needs no serialization library.

/// Declares a counter struct and its `fields()` enumeration from one list of fields.
macro_rules! counters {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $($(#[doc = $doc:expr])* $field:ident,)*
            $(; $(#[doc = $gdoc:expr])* $group:ident: $gty:ty,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct $name {
            $($(#[doc = $doc])* pub $field: u64,)*
            $($(#[doc = $gdoc])* pub $group: $gty,)?
        }

        impl $name {
            /// The counter names, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($field)),*];

            /// Every counter as (name, value), in declaration order (a nested group such as
            /// [`Counters::drops`] enumerates itself).
            pub fn fields(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$((stringify!($field), self.$field)),*].into_iter()
            }

            /// Adds `other`'s counts to these (the shards of one device).
            pub fn add(&mut self, other: &Self) {
                $(self.$field += other.$field;)*
                $(self.$group.add(&other.$group);)?
            }
        }
    };
}

counters! {
    /// Transport counters. Field names follow rxe's `hw_counters` where one exists; the drops
    /// by reason are the nested group [`Counters::drops`].
    pub struct Counters {
        /// Packets transmitted.
        sent_pkts,
        /// Packets received and accepted for processing.
        rcvd_pkts,
        /// Requests received with a PSN already seen.
        duplicate_request,
        /// Requests received ahead of the expected PSN.
        out_of_seq_request,
        /// RNR NAKs received by the requester.
        rcvd_rnr_err,
        /// RNR NAKs sent by the responder.
        send_rnr_err,
        /// PSN-sequence NAKs received by the requester.
        rcvd_seq_err,
        /// WRs completed with RETRY_EXC_ERR.
        retry_exceeded_err,
        /// WRs completed with RNR_RETRY_EXC_ERR.
        retry_rnr_exceeded_err,
        /// Retries started by the completer (timeouts, sequence NAKs, implied NAKs).
        completer_retry_err,
        /// Local ACK timeouts that fired.
        local_ack_timeout_err,
        /// Request packets sent again (PSN not beyond the highest sent).
        retransmitted_packets,
        /// ACKs coalesced into a later ACK before transmission.
        acks_coalesced,
        /// Frames built but not emitted (a field no frame can carry, a region gone): the WR
        /// completes with `LocQpOpErr` and the QP enters the error state, as rxe does.
        emit_failed,
        /// READ responses whose memory was gone when their turn came (MR deregistered or R_Key
        /// invalidated mid-stream): answered with a remote access NAK, the QP enters ERR.
        read_response_faults,
        /// UC messages the responder dropped: abandoned part-way (a PSN gap, a FIRST/ONLY
        /// before the LAST) or refused at their start (no receive WQE, R_Key, length).
        uc_messages_dropped,
        /// MADs the GSI (QP1) sent.
        gsi_sent,
        /// MADs the GSI (QP1) received into a receive WQE.
        gsi_rcvd,
        ;
        /// Incoming frames dropped, by reason.
        drops: DropCounters,
    }
}

counters! {
    /// Incoming frames dropped, by reason (never a panic, never an error to the caller).
    pub struct DropCounters {
        /// ICRC did not verify (corruption).
        bad_icrc,
        /// Frame could not be parsed (truncated, lengths, unknown opcode, TVer, ...).
        malformed,
        /// RoCEv2 frames with headers xroce does not take: stacked VLAN tags, an 802.1ad
        /// service tag, IPv6 extension headers (the XDP program leaves these to the kernel, so
        /// only other drivers can deliver them).
        unsupported_headers,
        /// Destination IP is none of this engine's GIDs.
        bad_dest_addr,
        /// Source address does not match the RC QP's address vector.
        bad_source_addr,
        /// No QP with the BTH destination QPN.
        unknown_qp,
        /// P_Key mismatch.
        bad_pkey,
        /// UD Q_Key mismatch.
        bad_qkey,
        /// Opcode does not fit the QP type or state.
        bad_opcode,
        /// QP not in a state that receives.
        bad_state,
        /// Out-of-sequence requests after the one NAK per gap.
        out_of_seq_silent,
        /// Duplicate READ/ATOMIC with no saved resource.
        stale_duplicate,
        /// Duplicate READ that is not a sub-range of the READ it repeats (other R_Key, longer,
        /// or not starting where its PSN says): never executed.
        bad_duplicate,
        /// ACK/response whose PSN is beyond anything sent (ghost or out-of-window).
        ghost_ack,
        /// ACK/response for PSNs already acknowledged.
        duplicate_ack,
        /// READ response not at the expected PSN (triggers a retry when ahead).
        unexpected_response,
        /// UC MIDDLE/LAST packets dropped because they continue no message being received
        /// (a PSN gap before them, or their FIRST was lost or refused).
        uc_out_of_sequence,
        /// UD SEND with no receive WQE posted.
        ud_no_recv_wqe,
        /// Responder output queue full.
        response_queue_full,
        /// `poll_transmit` got a buffer too small for the next frame.
        tx_buffer_too_small,
        /// Frames to QP1 while no GSI is open on the device.
        no_gsi,
        /// Frames to QP1 whose Q_Key is not the GSI's 0x8001_0000 (IBTA 13.5.1).
        gsi_bad_qkey,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_enumerate_every_counter_in_order() {
        let c = Counters {
            sent_pkts: 1,
            read_response_faults: 15,
            drops: DropCounters {
                bad_icrc: 2,
                tx_buffer_too_small: 19,
                ..DropCounters::default()
            },
            ..Counters::default()
        };
        let top: Vec<_> = c.fields().collect();
        assert_eq!(top.len(), 18);
        assert_eq!(top[0], ("sent_pkts", 1));
        assert_eq!(top[14], ("read_response_faults", 15));
        assert_eq!(
            Counters::NAMES,
            top.iter().map(|(n, _)| *n).collect::<Vec<_>>()
        );
        let drops: Vec<_> = c.drops.fields().collect();
        assert_eq!(drops.len(), 22);
        assert_eq!(drops[0], ("bad_icrc", 2));
        assert_eq!(drops[19], ("tx_buffer_too_small", 19));
        assert_eq!(DropCounters::NAMES.len(), 22);
    }
}
