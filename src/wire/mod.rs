//! The RoCEv2 wire format: zero-copy header views, plain `Repr` structs, the opcode table,
//! PSN arithmetic, ICRC, and whole frames.
//!
//! Layout follows smoltcp: each header has a view `Header<T: AsRef<[u8]>>` whose
//! `new_checked` verifies the length once (after which no accessor panics), setters on
//! `T: AsMut<[u8]>`, and a `HeaderRepr` with `parse`, `emit` and `buffer_len`. Untrusted
//! bytes always enter through [`parse_frame`], [`parse_frame_verified`] or
//! [`PacketRepr::parse`], which return a [`WireError`] for every malformed input and never
//! panic.
//!
//! ```text
//! Ethernet | [802.1Q] | IPv4/IPv6 | UDP dport 4791 | BTH | [DETH][RETH][AtomicETH][AETH]
//!          [AtomicAckETH][ImmDt][IETH] | payload | pad 0-3 | ICRC (LSB first)
//! ```
//! `docs/wire.md` walks through a real captured frame byte by byte.

#![warn(missing_docs)]

mod bytes;

pub mod addr;
pub mod aeth;
pub mod atomic;
pub mod bth;
pub mod cm;
pub mod cma;
pub mod deth;
pub mod error;
pub mod frame;
pub mod icrc;
pub mod imm;
pub mod mad;
pub mod mtu;
pub mod opcode;
pub mod packet;
pub mod pretty;
pub mod psn;
pub mod reth;

pub use aeth::{credit_count, rnr_timer, Aeth, AethRepr, NakCode, Syndrome, AETH_LEN};
pub use atomic::{
    AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr, ATOMIC_ACK_ETH_LEN, ATOMIC_ETH_LEN,
};
pub use bth::{Bth, BthRepr, BTH_LEN};
pub use deth::{Deth, DethRepr, DETH_LEN};
pub use error::{Layer, WireError};
pub use frame::{
    frame_icrc, parse_frame, parse_frame_verified, rxe_udp_source_port, EthRepr, FrameOffsets,
    FrameRepr, IpRepr, ParsedFrame, VlanTag, ROCEV2_UDP_PORT,
};
pub use icrc::{icrc_ipv4, icrc_ipv6, IcrcCheck, ICRC_LEN};
pub use imm::{Ieth, IethRepr, ImmDt, ImmDtRepr, IMM_LEN};
pub use mtu::{Mtu, ROCE_HEADER_ALLOWANCE};
pub use opcode::{known_opcodes, Opcode, OpcodeInfo, Position, Transport};
pub use packet::{pad_for, PacketRepr, CNP_BODY_LEN};
pub use pretty::{Explainer, IcrcRole, PrettyPrint};
pub use psn::Psn;
pub use reth::{Reth, RethRepr, RETH_LEN};
