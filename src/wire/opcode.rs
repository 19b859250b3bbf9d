//! The BTH opcode and the one table that says what each opcode carries (IBTA 9.2,
//! Table 38; RoCEv2 CNP: Annex A17.9.3, Figure 6).
//!
//! The opcode's top three bits select the transport (RC `000`, UC `001`, RD `010`, UD `011`,
//! CNP `100`), the low five bits the operation. Parsing a packet is driven by
//! [`OpcodeInfo`]: which extension headers follow the BTH, in which order, and whether a
//! payload may follow them.

use core::fmt;

/// Transport service an opcode belongs to (its top three bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected.
    Rc,
    /// Unreliable Connected.
    Uc,
    /// Reliable Datagram (recognised by its bits, not supported: no table entries).
    Rd,
    /// Unreliable Datagram.
    Ud,
    /// RoCEv2 Congestion Notification Packet.
    Cnp,
}

impl Transport {
    /// Short upper-case name ("RC", "UC", "RD", "UD", "CNP").
    pub const fn name(self) -> &'static str {
        match self {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Rd => "RD",
            Transport::Ud => "UD",
            Transport::Cnp => "CNP",
        }
    }
}

/// Where a packet sits in a multi-packet message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a message of two or more packets.
    First,
    /// A packet between First and Last; carries exactly one path MTU of payload.
    Middle,
    /// Last packet of a message of two or more packets.
    Last,
    /// The only packet of its message (also every single-packet operation: ACK, READ
    /// request, atomics, UD sends, CNP).
    Only,
}

impl Position {
    /// True for `First` and `Only`: the packet starts a message.
    pub const fn starts_message(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }
    /// True for `Last` and `Only`: the packet ends a message.
    pub const fn ends_message(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// Everything the wire layer knows about one opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// The opcode.
    pub opcode: Opcode,
    /// Name as rxe spells it (its `IB_OPCODE_` constants without the prefix), e.g.
    /// `RC_SEND_LAST_WITH_IMMEDIATE`.
    pub name: &'static str,
    /// One sentence saying what the packet does, for `xroce dump --explain`.
    pub meaning: &'static str,
    /// Transport service.
    pub transport: Transport,
    /// Place in a message.
    pub position: Position,
    /// Carries a RETH (16 B): WRITE FIRST/ONLY and READ request.
    pub has_reth: bool,
    /// Carries an AETH (4 B): ACK, atomic ACK, READ response FIRST/LAST/ONLY.
    pub has_aeth: bool,
    /// Carries an AtomicETH (28 B): COMPARE_SWAP, FETCH_ADD.
    pub has_atomic_eth: bool,
    /// Carries an AtomicAckETH (8 B): ATOMIC_ACKNOWLEDGE.
    pub has_atomic_ack_eth: bool,
    /// Carries immediate data (4 B): the `_WITH_IMMEDIATE` LAST/ONLY opcodes.
    pub has_immdt: bool,
    /// Carries an IETH (4 B): SEND LAST/ONLY `_WITH_INVALIDATE`.
    pub has_ieth: bool,
    /// Carries a DETH (8 B): every UD opcode.
    pub has_deth: bool,
    /// May carry payload after its headers (for CNP: the 16 reserved bytes).
    pub has_payload: bool,
    /// Sent by a requester (SEND, WRITE, READ request, atomics).
    pub is_request: bool,
    /// Sent by a responder (ACK, atomic ACK, READ responses).
    pub is_response: bool,
}

impl OpcodeInfo {
    /// Length in bytes of the extension headers between the BTH and the payload.
    pub const fn ext_headers_len(&self) -> usize {
        (if self.has_deth { 8 } else { 0 })
            + (if self.has_reth { 16 } else { 0 })
            + (if self.has_atomic_eth { 28 } else { 0 })
            + (if self.has_aeth { 4 } else { 0 })
            + (if self.has_atomic_ack_eth { 8 } else { 0 })
            + (if self.has_immdt { 4 } else { 0 })
            + (if self.has_ieth { 4 } else { 0 })
    }
}

/// A BTH opcode byte. Unknown values are representable; [`Opcode::info`] says whether
/// xroce knows the opcode.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Opcode(pub u8);

const RC: u8 = 0x00;
const UC: u8 = 0x20;
const UD: u8 = 0x60;

impl Opcode {
    /// RC SEND First.
    pub const RC_SEND_FIRST: Opcode = Opcode(RC);
    /// RC SEND Middle.
    pub const RC_SEND_MIDDLE: Opcode = Opcode(RC | 0x01);
    /// RC SEND Last.
    pub const RC_SEND_LAST: Opcode = Opcode(RC | 0x02);
    /// RC SEND Last with Immediate.
    pub const RC_SEND_LAST_WITH_IMMEDIATE: Opcode = Opcode(RC | 0x03);
    /// RC SEND Only.
    pub const RC_SEND_ONLY: Opcode = Opcode(RC | 0x04);
    /// RC SEND Only with Immediate.
    pub const RC_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(RC | 0x05);
    /// RC RDMA WRITE First.
    pub const RC_RDMA_WRITE_FIRST: Opcode = Opcode(RC | 0x06);
    /// RC RDMA WRITE Middle.
    pub const RC_RDMA_WRITE_MIDDLE: Opcode = Opcode(RC | 0x07);
    /// RC RDMA WRITE Last.
    pub const RC_RDMA_WRITE_LAST: Opcode = Opcode(RC | 0x08);
    /// RC RDMA WRITE Last with Immediate.
    pub const RC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(RC | 0x09);
    /// RC RDMA WRITE Only.
    pub const RC_RDMA_WRITE_ONLY: Opcode = Opcode(RC | 0x0A);
    /// RC RDMA WRITE Only with Immediate.
    pub const RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(RC | 0x0B);
    /// RC RDMA READ Request.
    pub const RC_RDMA_READ_REQUEST: Opcode = Opcode(RC | 0x0C);
    /// RC RDMA READ Response First.
    pub const RC_RDMA_READ_RESPONSE_FIRST: Opcode = Opcode(RC | 0x0D);
    /// RC RDMA READ Response Middle.
    pub const RC_RDMA_READ_RESPONSE_MIDDLE: Opcode = Opcode(RC | 0x0E);
    /// RC RDMA READ Response Last.
    pub const RC_RDMA_READ_RESPONSE_LAST: Opcode = Opcode(RC | 0x0F);
    /// RC RDMA READ Response Only.
    pub const RC_RDMA_READ_RESPONSE_ONLY: Opcode = Opcode(RC | 0x10);
    /// RC Acknowledge (ACK, NAK or RNR NAK by its AETH syndrome).
    pub const RC_ACKNOWLEDGE: Opcode = Opcode(RC | 0x11);
    /// RC ATOMIC Acknowledge.
    pub const RC_ATOMIC_ACKNOWLEDGE: Opcode = Opcode(RC | 0x12);
    /// RC CmpSwap.
    pub const RC_COMPARE_SWAP: Opcode = Opcode(RC | 0x13);
    /// RC FetchAdd.
    pub const RC_FETCH_ADD: Opcode = Opcode(RC | 0x14);
    /// RC SEND Last with Invalidate.
    pub const RC_SEND_LAST_WITH_INVALIDATE: Opcode = Opcode(RC | 0x16);
    /// RC SEND Only with Invalidate.
    pub const RC_SEND_ONLY_WITH_INVALIDATE: Opcode = Opcode(RC | 0x17);

    /// UC SEND First.
    pub const UC_SEND_FIRST: Opcode = Opcode(UC);
    /// UC SEND Middle.
    pub const UC_SEND_MIDDLE: Opcode = Opcode(UC | 0x01);
    /// UC SEND Last.
    pub const UC_SEND_LAST: Opcode = Opcode(UC | 0x02);
    /// UC SEND Last with Immediate.
    pub const UC_SEND_LAST_WITH_IMMEDIATE: Opcode = Opcode(UC | 0x03);
    /// UC SEND Only.
    pub const UC_SEND_ONLY: Opcode = Opcode(UC | 0x04);
    /// UC SEND Only with Immediate.
    pub const UC_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(UC | 0x05);
    /// UC RDMA WRITE First.
    pub const UC_RDMA_WRITE_FIRST: Opcode = Opcode(UC | 0x06);
    /// UC RDMA WRITE Middle.
    pub const UC_RDMA_WRITE_MIDDLE: Opcode = Opcode(UC | 0x07);
    /// UC RDMA WRITE Last.
    pub const UC_RDMA_WRITE_LAST: Opcode = Opcode(UC | 0x08);
    /// UC RDMA WRITE Last with Immediate.
    pub const UC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(UC | 0x09);
    /// UC RDMA WRITE Only.
    pub const UC_RDMA_WRITE_ONLY: Opcode = Opcode(UC | 0x0A);
    /// UC RDMA WRITE Only with Immediate.
    pub const UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(UC | 0x0B);

    /// UD SEND Only.
    pub const UD_SEND_ONLY: Opcode = Opcode(UD | 0x04);
    /// UD SEND Only with Immediate.
    pub const UD_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(UD | 0x05);

    /// RoCEv2 Congestion Notification Packet (Annex A17.9.3), opcode `1000_0001`.
    pub const CNP: Opcode = Opcode(0x81);

    /// The table entry for this opcode, or `None` for a reserved, RD or unsupported one.
    #[inline]
    pub fn info(self) -> Option<&'static OpcodeInfo> {
        match INDEX[self.0 as usize] {
            NONE => None,
            i => Some(&TABLE[i as usize]),
        }
    }

    /// The transport its top bits select, even for opcodes not in the table (`None` for the
    /// reserved `101`..`111` ranges other than CNP).
    pub const fn transport(self) -> Option<Transport> {
        match self.0 >> 5 {
            0 => Some(Transport::Rc),
            1 => Some(Transport::Uc),
            2 => Some(Transport::Rd),
            3 => Some(Transport::Ud),
            _ if self.0 == 0x81 => Some(Transport::Cnp),
            _ => None,
        }
    }

    /// The rxe-style name, or `"UNKNOWN"`.
    pub fn name(self) -> &'static str {
        self.info().map_or("UNKNOWN", |i| i.name)
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Opcode(0x{:02x} {})", self.0, self.name())
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.info() {
            Some(info) => f.pad(info.name),
            None => write!(f, "opcode 0x{:02x}", self.0),
        }
    }
}

// Header bits for the table builder.
const RETH: u16 = 1;
const AETH: u16 = 1 << 1;
const ATOMIC: u16 = 1 << 2;
const ATOMIC_ACK: u16 = 1 << 3;
const IMM: u16 = 1 << 4;
const IETH: u16 = 1 << 5;
const DETH: u16 = 1 << 6;
const PAYLOAD: u16 = 1 << 7;
const REQ: u16 = 1 << 8;
const RESP: u16 = 1 << 9;

const fn entry(
    opcode: Opcode,
    name: &'static str,
    meaning: &'static str,
    transport: Transport,
    position: Position,
    bits: u16,
) -> OpcodeInfo {
    OpcodeInfo {
        opcode,
        name,
        meaning,
        transport,
        position,
        has_reth: bits & RETH != 0,
        has_aeth: bits & AETH != 0,
        has_atomic_eth: bits & ATOMIC != 0,
        has_atomic_ack_eth: bits & ATOMIC_ACK != 0,
        has_immdt: bits & IMM != 0,
        has_ieth: bits & IETH != 0,
        has_deth: bits & DETH != 0,
        has_payload: bits & PAYLOAD != 0,
        is_request: bits & REQ != 0,
        is_response: bits & RESP != 0,
    }
}

use Position::{First, Last, Middle, Only};
use Transport::{Cnp, Rc, Uc, Ud};

/// Every opcode xroce knows, in opcode order (IBTA Table 38; the extension headers of each
/// are those IBTA 9.2-9.3 give it).
#[rustfmt::skip]
pub static TABLE: [OpcodeInfo; 38] = [
    entry(Opcode::RC_SEND_FIRST, "RC_SEND_FIRST", "first packet of a multi-packet SEND; consumes a receive WQE at the responder", Rc, First, PAYLOAD | REQ),
    entry(Opcode::RC_SEND_MIDDLE, "RC_SEND_MIDDLE", "middle packet of a SEND: exactly one path MTU of payload", Rc, Middle, PAYLOAD | REQ),
    entry(Opcode::RC_SEND_LAST, "RC_SEND_LAST", "last packet of a multi-packet SEND; completes the receive WQE", Rc, Last, PAYLOAD | REQ),
    entry(Opcode::RC_SEND_LAST_WITH_IMMEDIATE, "RC_SEND_LAST_WITH_IMMEDIATE", "last packet of a SEND carrying 32 bits of immediate data for the receive completion", Rc, Last, PAYLOAD | IMM | REQ),
    entry(Opcode::RC_SEND_ONLY, "RC_SEND_ONLY", "a whole SEND message in one packet", Rc, Only, PAYLOAD | REQ),
    entry(Opcode::RC_SEND_ONLY_WITH_IMMEDIATE, "RC_SEND_ONLY_WITH_IMMEDIATE", "a whole SEND in one packet, with 32 bits of immediate data", Rc, Only, PAYLOAD | IMM | REQ),
    entry(Opcode::RC_RDMA_WRITE_FIRST, "RC_RDMA_WRITE_FIRST", "first packet of an RDMA WRITE; its RETH names the remote buffer and total length", Rc, First, RETH | PAYLOAD | REQ),
    entry(Opcode::RC_RDMA_WRITE_MIDDLE, "RC_RDMA_WRITE_MIDDLE", "middle packet of an RDMA WRITE: one path MTU placed after the previous one", Rc, Middle, PAYLOAD | REQ),
    entry(Opcode::RC_RDMA_WRITE_LAST, "RC_RDMA_WRITE_LAST", "last packet of an RDMA WRITE", Rc, Last, PAYLOAD | REQ),
    entry(Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", "last packet of an RDMA WRITE; the immediate data consumes a receive WQE", Rc, Last, PAYLOAD | IMM | REQ),
    entry(Opcode::RC_RDMA_WRITE_ONLY, "RC_RDMA_WRITE_ONLY", "a whole RDMA WRITE in one packet; the RETH names the remote buffer", Rc, Only, RETH | PAYLOAD | REQ),
    entry(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", "a whole RDMA WRITE with immediate data, which consumes a receive WQE", Rc, Only, RETH | PAYLOAD | IMM | REQ),
    entry(Opcode::RC_RDMA_READ_REQUEST, "RC_RDMA_READ_REQUEST", "asks the responder to send back the remote buffer named in the RETH; consumes one PSN per response packet", Rc, Only, RETH | REQ),
    entry(Opcode::RC_RDMA_READ_RESPONSE_FIRST, "RC_RDMA_READ_RESPONSE_FIRST", "first packet of READ data; its AETH acknowledges the request", Rc, First, AETH | PAYLOAD | RESP),
    entry(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, "RC_RDMA_READ_RESPONSE_MIDDLE", "middle packet of READ data (no AETH)", Rc, Middle, PAYLOAD | RESP),
    entry(Opcode::RC_RDMA_READ_RESPONSE_LAST, "RC_RDMA_READ_RESPONSE_LAST", "last packet of READ data, with an AETH", Rc, Last, AETH | PAYLOAD | RESP),
    entry(Opcode::RC_RDMA_READ_RESPONSE_ONLY, "RC_RDMA_READ_RESPONSE_ONLY", "all of the READ data in one packet, with an AETH", Rc, Only, AETH | PAYLOAD | RESP),
    entry(Opcode::RC_ACKNOWLEDGE, "RC_ACKNOWLEDGE", "acknowledges every request up to its PSN (ACK), or reports an error or RNR (NAK) by its AETH syndrome", Rc, Only, AETH | RESP),
    entry(Opcode::RC_ATOMIC_ACKNOWLEDGE, "RC_ATOMIC_ACKNOWLEDGE", "acknowledges an atomic and returns the original remote value", Rc, Only, AETH | ATOMIC_ACK | RESP),
    entry(Opcode::RC_COMPARE_SWAP, "RC_COMPARE_SWAP", "atomically: if the remote 64-bit word equals Compare, replace it with Swap", Rc, Only, ATOMIC | REQ),
    entry(Opcode::RC_FETCH_ADD, "RC_FETCH_ADD", "atomically add to the remote 64-bit word and return its old value", Rc, Only, ATOMIC | REQ),
    entry(Opcode::RC_SEND_LAST_WITH_INVALIDATE, "RC_SEND_LAST_WITH_INVALIDATE", "last packet of a SEND that also invalidates the R_Key in its IETH", Rc, Last, PAYLOAD | IETH | REQ),
    entry(Opcode::RC_SEND_ONLY_WITH_INVALIDATE, "RC_SEND_ONLY_WITH_INVALIDATE", "a whole SEND that also invalidates the R_Key in its IETH", Rc, Only, PAYLOAD | IETH | REQ),
    entry(Opcode::UC_SEND_FIRST, "UC_SEND_FIRST", "first packet of an unreliable-connected SEND", Uc, First, PAYLOAD | REQ),
    entry(Opcode::UC_SEND_MIDDLE, "UC_SEND_MIDDLE", "middle packet of a UC SEND", Uc, Middle, PAYLOAD | REQ),
    entry(Opcode::UC_SEND_LAST, "UC_SEND_LAST", "last packet of a UC SEND", Uc, Last, PAYLOAD | REQ),
    entry(Opcode::UC_SEND_LAST_WITH_IMMEDIATE, "UC_SEND_LAST_WITH_IMMEDIATE", "last packet of a UC SEND with immediate data", Uc, Last, PAYLOAD | IMM | REQ),
    entry(Opcode::UC_SEND_ONLY, "UC_SEND_ONLY", "a whole UC SEND in one packet", Uc, Only, PAYLOAD | REQ),
    entry(Opcode::UC_SEND_ONLY_WITH_IMMEDIATE, "UC_SEND_ONLY_WITH_IMMEDIATE", "a whole UC SEND with immediate data", Uc, Only, PAYLOAD | IMM | REQ),
    entry(Opcode::UC_RDMA_WRITE_FIRST, "UC_RDMA_WRITE_FIRST", "first packet of a UC RDMA WRITE, with RETH", Uc, First, RETH | PAYLOAD | REQ),
    entry(Opcode::UC_RDMA_WRITE_MIDDLE, "UC_RDMA_WRITE_MIDDLE", "middle packet of a UC RDMA WRITE", Uc, Middle, PAYLOAD | REQ),
    entry(Opcode::UC_RDMA_WRITE_LAST, "UC_RDMA_WRITE_LAST", "last packet of a UC RDMA WRITE", Uc, Last, PAYLOAD | REQ),
    entry(Opcode::UC_RDMA_WRITE_LAST_WITH_IMMEDIATE, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", "last packet of a UC RDMA WRITE with immediate data", Uc, Last, PAYLOAD | IMM | REQ),
    entry(Opcode::UC_RDMA_WRITE_ONLY, "UC_RDMA_WRITE_ONLY", "a whole UC RDMA WRITE in one packet, with RETH", Uc, Only, RETH | PAYLOAD | REQ),
    entry(Opcode::UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", "a whole UC RDMA WRITE with RETH and immediate data", Uc, Only, RETH | PAYLOAD | IMM | REQ),
    entry(Opcode::UD_SEND_ONLY, "UD_SEND_ONLY", "a datagram SEND; its DETH carries the Q_Key and the sender's QP", Ud, Only, DETH | PAYLOAD | REQ),
    entry(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE, "UD_SEND_ONLY_WITH_IMMEDIATE", "a datagram SEND with immediate data", Ud, Only, DETH | PAYLOAD | IMM | REQ),
    entry(Opcode::CNP, "CNP", "congestion notification: the receiver saw ECN CE marks and asks the sender's QP to slow down (DCQCN)", Cnp, Only, PAYLOAD),
];

const NONE: u8 = u8::MAX;
const KNOWN: usize = TABLE.len();

/// Opcode byte -> index into `TABLE`, built at compile time so the table is the only source.
static INDEX: [u8; 256] = {
    let mut index = [NONE; 256];
    let mut i = 0;
    while i < KNOWN {
        index[TABLE[i].opcode.0 as usize] = i as u8;
        i += 1;
    }
    index
};

/// Iterates over every opcode in the table.
pub fn known_opcodes() -> impl Iterator<Item = &'static OpcodeInfo> {
    TABLE.iter()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        let mut seen = 0;
        for info in known_opcodes() {
            assert_eq!(info.opcode.info().unwrap().opcode, info.opcode);
            assert_eq!(Some(info.transport), info.opcode.transport());
            assert!(!(info.is_request && info.is_response), "{}", info.name);
            seen += 1;
        }
        assert_eq!(seen, 38);
        let known = (0..=255u8).filter(|b| Opcode(*b).info().is_some()).count();
        assert_eq!(known, 38);
        assert!(Opcode(0xFF).info().is_none());
        assert!(Opcode(0x15).info().is_none());
        assert!(Opcode(0x40).info().is_none(), "RD is not supported");
    }

    #[test]
    fn headers_follow_the_spec() {
        let ack = Opcode::RC_ACKNOWLEDGE.info().unwrap();
        assert!(ack.has_aeth && !ack.has_payload && ack.is_response);
        assert_eq!(ack.ext_headers_len(), 4);
        let w = Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.info().unwrap();
        assert_eq!(w.ext_headers_len(), 20);
        assert!(
            !Opcode::RC_RDMA_READ_RESPONSE_MIDDLE
                .info()
                .unwrap()
                .has_aeth
        );
        assert_eq!(
            Opcode::RC_ATOMIC_ACKNOWLEDGE
                .info()
                .unwrap()
                .ext_headers_len(),
            12
        );
        assert_eq!(Opcode::RC_FETCH_ADD.info().unwrap().ext_headers_len(), 28);
        assert_eq!(
            Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
                .info()
                .unwrap()
                .ext_headers_len(),
            12
        );
        assert_eq!(Opcode(0x64), Opcode::UD_SEND_ONLY);
        assert_eq!(Opcode(0x17), Opcode::RC_SEND_ONLY_WITH_INVALIDATE);
    }
}
