//! The C enums carried by the structs, as `u32` newtypes with rdma-core's values, and the
//! flag bits of `wc_flags` and `link_layer`.

use std::fmt;

use bytemuck::{Pod, Zeroable};

/// A C enum as a transparent `u32` (an `int`-sized field in C), with one associated constant
/// per enumerator and `Debug` printing the C name.
macro_rules! c_enum {
    (
        $(#[$meta:meta])*
        $name:ident, prefix $prefix:literal {
            $($(#[$vmeta:meta])* $variant:ident = $value:literal,)*
        }
    ) => {
        $(#[$meta])*
        #[repr(transparent)]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Pod, Zeroable)]
        pub struct $name(pub u32);

        impl $name {
            $($(#[$vmeta])* pub const $variant: $name = $name($value);)*

            /// Every enumerator the header defines, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            /// The enumerator's C name (`IBV_...`), or `None` for a value the header does
            /// not define.
            pub fn c_name(self) -> Option<&'static str> {
                match self.0 {
                    $($value => Some(concat!($prefix, stringify!($variant))),)*
                    _ => None,
                }
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.c_name() {
                    Some(name) => f.write_str(name),
                    None => write!(f, concat!(stringify!($name), "({})"), self.0),
                }
            }
        }
    };
}

c_enum! {
    /// `enum ibv_wc_status`: the outcome of a work request.
    ibv_wc_status, prefix "IBV_WC_" {
        /// Completed without error.
        SUCCESS = 0,
        /// Local length error.
        LOC_LEN_ERR = 1,
        /// Local QP operation error.
        LOC_QP_OP_ERR = 2,
        /// Local EE context operation error (RD only).
        LOC_EEC_OP_ERR = 3,
        /// Local protection error.
        LOC_PROT_ERR = 4,
        /// Flushed: the QP was in the error state.
        WR_FLUSH_ERR = 5,
        /// Memory window bind error.
        MW_BIND_ERR = 6,
        /// Bad response from the responder.
        BAD_RESP_ERR = 7,
        /// Local access error.
        LOC_ACCESS_ERR = 8,
        /// Remote invalid request error.
        REM_INV_REQ_ERR = 9,
        /// Remote access error.
        REM_ACCESS_ERR = 10,
        /// Remote operational error.
        REM_OP_ERR = 11,
        /// Transport retry counter exceeded.
        RETRY_EXC_ERR = 12,
        /// RNR retry counter exceeded.
        RNR_RETRY_EXC_ERR = 13,
        /// Local RDD violation (RD only).
        LOC_RDD_VIOL_ERR = 14,
        /// Remote invalid RD request.
        REM_INV_RD_REQ_ERR = 15,
        /// Remote aborted.
        REM_ABORT_ERR = 16,
        /// Invalid EE context number.
        INV_EECN_ERR = 17,
        /// Invalid EE context state.
        INV_EEC_STATE_ERR = 18,
        /// Fatal error.
        FATAL_ERR = 19,
        /// Response timeout.
        RESP_TIMEOUT_ERR = 20,
        /// General error.
        GENERAL_ERR = 21,
        /// Tag matching error.
        TM_ERR = 22,
        /// Tag matching rendezvous incomplete.
        TM_RNDV_INCOMPLETE = 23,
    }
}

c_enum! {
    /// `enum ibv_wc_opcode`: what a completion is for. Receive opcodes have bit 7 set
    /// (`opcode & IBV_WC_RECV`).
    ibv_wc_opcode, prefix "IBV_WC_" {
        /// SEND.
        SEND = 0,
        /// RDMA WRITE.
        RDMA_WRITE = 1,
        /// RDMA READ.
        RDMA_READ = 2,
        /// Compare and swap.
        COMP_SWAP = 3,
        /// Fetch and add.
        FETCH_ADD = 4,
        /// Memory window bind.
        BIND_MW = 5,
        /// Local invalidate.
        LOCAL_INV = 6,
        /// TCP segmentation offload send.
        TSO = 7,
        /// ATOMIC WRITE.
        ATOMIC_WRITE = 9,
        /// A SEND arrived.
        RECV = 128,
        /// An RDMA WRITE with immediate arrived.
        RECV_RDMA_WITH_IMM = 129,
        /// Tag matching: tag added.
        TM_ADD = 130,
        /// Tag matching: tag removed.
        TM_DEL = 131,
        /// Tag matching: sync.
        TM_SYNC = 132,
        /// Tag matching: tagged receive.
        TM_RECV = 133,
        /// Tag matching: no tag matched.
        TM_NO_TAG = 134,
        /// Provider-specific.
        DRIVER1 = 135,
        /// Provider-specific.
        DRIVER2 = 136,
        /// Provider-specific.
        DRIVER3 = 137,
    }
}

c_enum! {
    /// `enum ibv_qp_state`.
    ibv_qp_state, prefix "IBV_QPS_" {
        /// Reset.
        RESET = 0,
        /// Initialized.
        INIT = 1,
        /// Ready to receive.
        RTR = 2,
        /// Ready to send.
        RTS = 3,
        /// Send queue drained.
        SQD = 4,
        /// Send queue error.
        SQE = 5,
        /// Error.
        ERR = 6,
        /// Unknown (a `cur_qp_state` the provider cannot tell).
        UNKNOWN = 7,
    }
}

c_enum! {
    /// `enum ibv_mtu`: an IB path MTU.
    ibv_mtu, prefix "IBV_" {
        /// 256 bytes.
        MTU_256 = 1,
        /// 512 bytes.
        MTU_512 = 2,
        /// 1024 bytes.
        MTU_1024 = 3,
        /// 2048 bytes.
        MTU_2048 = 4,
        /// 4096 bytes.
        MTU_4096 = 5,
    }
}

impl ibv_mtu {
    /// The MTU of exactly `bytes` payload bytes (256, 512, ... 4096).
    pub fn from_bytes(bytes: u32) -> Option<ibv_mtu> {
        ibv_mtu::ALL
            .iter()
            .copied()
            .find(|m| m.bytes() == Some(bytes))
    }

    /// Payload bytes per packet, or `None` for a value that is no `enum ibv_mtu`.
    pub fn bytes(self) -> Option<u32> {
        ibv_mtu::ALL.contains(&self).then(|| 128 << self.0)
    }
}

c_enum! {
    /// `enum ibv_port_state`: the logical state of a port.
    ibv_port_state, prefix "IBV_PORT_" {
        /// No state change.
        NOP = 0,
        /// Down.
        DOWN = 1,
        /// Initializing.
        INIT = 2,
        /// Armed.
        ARMED = 3,
        /// Active: traffic flows.
        ACTIVE = 4,
        /// Active, deferring (the SM asked to wait).
        ACTIVE_DEFER = 5,
    }
}

c_enum! {
    /// `enum ibv_mig_state`: path migration state.
    ibv_mig_state, prefix "IBV_MIG_" {
        /// Migrated.
        MIGRATED = 0,
        /// Rearm.
        REARM = 1,
        /// Armed.
        ARMED = 2,
    }
}

c_enum! {
    /// `enum ibv_atomic_cap`: how atomic the atomic operations are.
    ibv_atomic_cap, prefix "IBV_ATOMIC_" {
        /// No atomics.
        NONE = 0,
        /// Atomic among operations through this device.
        HCA = 1,
        /// Atomic with respect to every access to the memory.
        GLOB = 2,
    }
}

c_enum! {
    /// `enum ibv_gid_type` (stored as `uint32_t` in `ibv_gid_entry`).
    ibv_gid_type, prefix "IBV_GID_TYPE_" {
        /// InfiniBand.
        IB = 0,
        /// RoCE v1 (Ethertype 0x8915).
        ROCE_V1 = 1,
        /// RoCE v2 (UDP port 4791).
        ROCE_V2 = 2,
    }
}

/// Bits of `ibv_wc::wc_flags` (`enum ibv_wc_flags`).
pub mod wc_flags {
    /// A 40-byte GRH precedes the payload in the receive buffer (UD).
    pub const IBV_WC_GRH: u32 = 1 << 0;
    /// `imm_data` is valid.
    pub const IBV_WC_WITH_IMM: u32 = 1 << 1;
    /// The IP checksum was verified by the device.
    pub const IBV_WC_IP_CSUM_OK: u32 = 1 << 2;
    /// `invalidated_rkey` is valid (SEND with invalidate).
    pub const IBV_WC_WITH_INV: u32 = 1 << 3;
    /// Tag matching: sync request.
    pub const IBV_WC_TM_SYNC_REQ: u32 = 1 << 4;
    /// Tag matching: a tag matched.
    pub const IBV_WC_TM_MATCH: u32 = 1 << 5;
    /// Tag matching: the data is valid.
    pub const IBV_WC_TM_DATA_VALID: u32 = 1 << 6;
}

/// Values of `ibv_port_attr::link_layer` (an anonymous enum in `verbs.h`, stored as `u8`).
pub mod link_layer {
    /// Not reported.
    pub const IBV_LINK_LAYER_UNSPECIFIED: u8 = 0;
    /// InfiniBand.
    pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
    /// Ethernet: RoCE.
    pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_prints_the_c_name_or_the_number() {
        assert_eq!(
            format!("{:?}", ibv_wc_status::RETRY_EXC_ERR),
            "IBV_WC_RETRY_EXC_ERR"
        );
        assert_eq!(format!("{:?}", ibv_wc_opcode::RECV), "IBV_WC_RECV");
        assert_eq!(format!("{:?}", ibv_qp_state(99)), "ibv_qp_state(99)");
        assert_eq!(ibv_wc_opcode(8).c_name(), None);
    }

    #[test]
    fn every_enumerator_is_listed_once_with_its_own_value() {
        fn distinct(values: &[u32]) {
            let mut sorted = values.to_vec();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), values.len(), "{values:?}");
        }
        distinct(&ibv_wc_status::ALL.iter().map(|v| v.0).collect::<Vec<_>>());
        distinct(&ibv_wc_opcode::ALL.iter().map(|v| v.0).collect::<Vec<_>>());
        distinct(&ibv_qp_state::ALL.iter().map(|v| v.0).collect::<Vec<_>>());
        assert_eq!(ibv_wc_status::ALL.len(), 24);
        assert_eq!(ibv_qp_state::ALL.len(), 8);
        // Receive opcodes are told apart by one bit, as C programs test them.
        for op in ibv_wc_opcode::ALL {
            let is_recv = op.0 & ibv_wc_opcode::RECV.0 != 0;
            assert_eq!(is_recv, op.0 >= 128, "{op:?}");
        }
    }
}
