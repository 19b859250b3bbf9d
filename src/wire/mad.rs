//! Management datagrams (IBTA 13.4): the 256-byte MADs that the general services interface
//! (GSI, QP1) carries in UD SENDs, and the 24-byte common MAD header (IBTA 13.4.3).
//!
//! ```text
//! byte 0           1            2              3
//! +--------------+------------+--------------+---+-----------+
//! | BaseVersion  | MgmtClass  | ClassVersion | R |  Method   |
//! +--------------+------------+--------------+---+-----------+
//! |           Status            |       ClassSpecific         |
//! +-----------------------------+-----------------------------+
//! |                  TransactionID (64 bits)                  |
//! +-----------------------------+-----------------------------+
//! |         AttributeID         |          reserved           |
//! +-----------------------------+-----------------------------+
//! |                 AttributeModifier (32 bits)               |
//! +-----------------------------------------------------------+
//! |             class data: 232 bytes (a CM message)          |
//! ```
//! The communication manager is management class 0x07, class version 2 (IBTA 12.6, 13.4.4);
//! its messages are in [`super::cm`].

use super::bytes::{get_u16, get_u32, get_u64, set_u16, set_u32, set_u64};

/// Length of every MAD on QP0/QP1 (IBTA 13.4.2: a MAD is exactly 256 bytes).
pub const MAD_LEN: usize = 256;
/// Length of the common MAD header (IBTA 13.4.3).
pub const MAD_HEADER_LEN: usize = 24;
/// Bytes of class data after the common header: a CM message's whole body.
pub const MAD_DATA_LEN: usize = MAD_LEN - MAD_HEADER_LEN;

/// The only base version defined (IBTA 13.4.3).
pub const MAD_BASE_VERSION: u8 = 1;
/// Management class of the communication manager (IBTA 13.4.4, Table 139).
pub const MGMT_CLASS_CM: u8 = 0x07;
/// Class version of the CM in IBTA 1.2 onward (what Linux's ib_cm sends and expects).
pub const CM_CLASS_VERSION: u8 = 2;
/// The well-known Q_Key of QP1 (IBTA 13.5.1: GSI Q_Key, a controlled Q_Key).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// QP number of the general services interface (IBTA 3.5.1.1: QP0 is the SMI, QP1 the GSI;
/// 13.5.1).
pub const GSI_QPN: u32 = 1;

/// MAD methods (IBTA 13.4.5, Table 140). Bit 7 (the R bit) marks a response.
pub mod method {
    /// Get an attribute.
    pub const GET: u8 = 0x01;
    /// Set an attribute.
    pub const SET: u8 = 0x02;
    /// Send a datagram: every CM message uses this method (IBTA 12.6.1).
    pub const SEND: u8 = 0x03;
    /// Unsolicited notice.
    pub const TRAP: u8 = 0x05;
    /// Forward an event to a subscriber.
    pub const REPORT: u8 = 0x06;
    /// Stop repeating a trap.
    pub const TRAP_REPRESS: u8 = 0x07;
    /// Response to Get or Set.
    pub const GET_RESP: u8 = 0x81;
    /// Response to Report.
    pub const REPORT_RESP: u8 = 0x86;
    /// The response bit (IBTA 13.4.3: R).
    pub const RESPONSE_BIT: u8 = 0x80;
}

/// Byte offsets of the common MAD header fields (IBTA 13.4.3, Figure 144).
pub mod field {
    /// Base version (1 byte).
    pub const BASE_VERSION: usize = 0;
    /// Management class (1 byte).
    pub const MGMT_CLASS: usize = 1;
    /// Class version (1 byte).
    pub const CLASS_VERSION: usize = 2;
    /// R bit and method (1 byte).
    pub const METHOD: usize = 3;
    /// Status (2 bytes).
    pub const STATUS: usize = 4;
    /// Class-specific (2 bytes).
    pub const CLASS_SPECIFIC: usize = 6;
    /// Transaction id (8 bytes).
    pub const TRANSACTION_ID: usize = 8;
    /// Attribute id (2 bytes).
    pub const ATTRIBUTE_ID: usize = 16;
    /// Reserved (2 bytes).
    pub const RESERVED: usize = 18;
    /// Attribute modifier (4 bytes).
    pub const ATTRIBUTE_MODIFIER: usize = 20;
}

/// Why bytes are not a well-formed MAD, CM message or rdma_cm header, or why one cannot be
/// emitted. Every variant is a reason a receiver can count a drop under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MadError {
    /// The buffer ends before the named structure does.
    #[error("truncated {what}: need {need} bytes, have {have}")]
    Truncated {
        /// What is cut short ("MAD", "CM message", "rdma_cm header").
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes there.
        have: usize,
    },
    /// Base version other than 1 (IBTA 13.4.3; the GSI drops these).
    #[error("MAD base version {0} is not 1")]
    BadBaseVersion(u8),
    /// A MAD of another management class where a CM MAD was expected.
    #[error("management class 0x{0:02x} is not the CM (0x07)")]
    NotCm(u8),
    /// CM class version other than 2 (IBTA 12.6.1; a CM answers REJ "invalid class version").
    #[error("CM class version {0} is not 2")]
    BadClassVersion(u8),
    /// A CM MAD whose method is not Send (IBTA 12.6.1: all CM messages use Send).
    #[error("CM method 0x{0:02x} is not Send (0x03)")]
    BadMethod(u8),
    /// An attribute id that names no CM message (IBTA 12.6.1, Table 105).
    #[error("unknown CM attribute id 0x{0:04x}")]
    UnknownAttribute(u16),
    /// A CM message xroce recognises but does not decode (ClassPortInfo; LAP/APR beyond
    /// their comm ids are kept raw).
    #[error("unsupported CM attribute id 0x{0:04x}")]
    UnsupportedAttribute(u16),
    /// On emit: a field value does not fit its wire width.
    #[error("CM field {field} value {value} does not fit its wire width")]
    FieldOutOfRange {
        /// Field name.
        field: &'static str,
        /// The value given.
        value: u64,
    },
    /// Private data longer than the message carries (IBTA 12.6: sizes are fixed per message).
    #[error("private data of {len} bytes exceeds the {max} bytes the message carries")]
    PrivateDataTooLong {
        /// Bytes offered.
        len: usize,
        /// Bytes the message holds.
        max: usize,
    },
    /// rdma_cm header with a version other than 0 (librdmacm and the kernel's cma.c send 0).
    #[error("rdma_cm private-data header version {0} is not 0")]
    BadCmaVersion(u8),
    /// rdma_cm header whose IP version nibble is neither 4 nor 6.
    #[error("rdma_cm private-data header IP version {0} is neither 4 nor 6")]
    BadCmaIpVersion(u8),
}

/// Result type of the MAD and CM wire layer.
pub type MadResult<T> = core::result::Result<T, MadError>;

pub(crate) fn check_mad_len(what: &'static str, need: usize, have: usize) -> MadResult<()> {
    if have < need {
        Err(MadError::Truncated { what, need, have })
    } else {
        Ok(())
    }
}

/// A zero-copy view of a MAD: the common header and the class data after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> MadPacket<T> {
    /// Wraps a buffer without checking its length; accessors panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> MadPacket<T> {
        MadPacket { buffer }
    }
    /// Wraps a buffer after checking it holds a whole 256-byte MAD.
    pub fn new_checked(buffer: T) -> MadResult<MadPacket<T>> {
        let v = Self::new_unchecked(buffer);
        v.check_len()?;
        Ok(v)
    }
    /// Checks that the buffer holds at least [`MAD_LEN`] bytes.
    pub fn check_len(&self) -> MadResult<()> {
        check_mad_len("MAD", MAD_LEN, self.buffer.as_ref().len())
    }
    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    /// Base version (1).
    pub fn base_version(&self) -> u8 {
        self.buffer.as_ref()[field::BASE_VERSION]
    }
    /// Management class (0x07 for the CM).
    pub fn mgmt_class(&self) -> u8 {
        self.buffer.as_ref()[field::MGMT_CLASS]
    }
    /// Class version.
    pub fn class_version(&self) -> u8 {
        self.buffer.as_ref()[field::CLASS_VERSION]
    }
    /// Method byte, R bit included.
    pub fn method(&self) -> u8 {
        self.buffer.as_ref()[field::METHOD]
    }
    /// Status.
    pub fn status(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::STATUS)
    }
    /// Class-specific word.
    pub fn class_specific(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::CLASS_SPECIFIC)
    }
    /// Transaction id: a request and its responses (and resends) share it (IBTA 13.4.6.4).
    pub fn transaction_id(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::TRANSACTION_ID)
    }
    /// Attribute id: for the CM, which message this is.
    pub fn attribute_id(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::ATTRIBUTE_ID)
    }
    /// Attribute modifier.
    pub fn attribute_modifier(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::ATTRIBUTE_MODIFIER)
    }
    /// The 232 bytes of class data.
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[MAD_HEADER_LEN..MAD_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> MadPacket<T> {
    /// The 232 bytes of class data, writable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[MAD_HEADER_LEN..MAD_LEN]
    }
}

/// The common MAD header as plain fields (IBTA 13.4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MadHeader {
    /// Base version (1).
    pub base_version: u8,
    /// Management class.
    pub mgmt_class: u8,
    /// Class version.
    pub class_version: u8,
    /// Method, R bit included (see [`method`]).
    pub method: u8,
    /// Status (IBTA 13.4.7; zero in every CM message).
    pub status: u16,
    /// Class-specific word (zero for the CM).
    pub class_specific: u16,
    /// Transaction id.
    pub transaction_id: u64,
    /// Attribute id.
    pub attribute_id: u16,
    /// Attribute modifier (zero for the CM, except ECE bits some kernels set in REQ/REP).
    pub attribute_modifier: u32,
}

impl MadHeader {
    /// The header of a CM message: base version 1, class 0x07, version 2, method Send.
    pub const fn cm(attribute_id: u16, transaction_id: u64) -> MadHeader {
        MadHeader {
            base_version: MAD_BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: method::SEND,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_id,
            attribute_modifier: 0,
        }
    }
    /// Reads the header of a MAD (the reserved word is ignored); checks only the length.
    pub fn parse<T: AsRef<[u8]>>(v: &MadPacket<T>) -> MadResult<MadHeader> {
        check_mad_len("MAD header", MAD_HEADER_LEN, v.buffer.as_ref().len())?;
        Ok(MadHeader {
            base_version: v.base_version(),
            mgmt_class: v.mgmt_class(),
            class_version: v.class_version(),
            method: v.method(),
            status: v.status(),
            class_specific: v.class_specific(),
            transaction_id: v.transaction_id(),
            attribute_id: v.attribute_id(),
            attribute_modifier: v.attribute_modifier(),
        })
    }
    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        MAD_HEADER_LEN
    }
    /// Writes the header into the first 24 bytes of `buf` (reserved word zero).
    pub fn emit(&self, buf: &mut [u8]) -> MadResult<()> {
        check_mad_len("MAD header buffer", MAD_HEADER_LEN, buf.len())?;
        buf[field::BASE_VERSION] = self.base_version;
        buf[field::MGMT_CLASS] = self.mgmt_class;
        buf[field::CLASS_VERSION] = self.class_version;
        buf[field::METHOD] = self.method;
        set_u16(buf, field::STATUS, self.status);
        set_u16(buf, field::CLASS_SPECIFIC, self.class_specific);
        set_u64(buf, field::TRANSACTION_ID, self.transaction_id);
        set_u16(buf, field::ATTRIBUTE_ID, self.attribute_id);
        set_u16(buf, field::RESERVED, 0);
        set_u32(buf, field::ATTRIBUTE_MODIFIER, self.attribute_modifier);
        Ok(())
    }
    /// Whether the R bit marks this MAD a response.
    pub const fn is_response(&self) -> bool {
        self.method & method::RESPONSE_BIT != 0
    }
    /// Checks the header is a CM MAD xroce understands (IBTA 12.6.1, 13.4.3).
    pub fn check_cm(&self) -> MadResult<()> {
        if self.base_version != MAD_BASE_VERSION {
            return Err(MadError::BadBaseVersion(self.base_version));
        }
        if self.mgmt_class != MGMT_CLASS_CM {
            return Err(MadError::NotCm(self.mgmt_class));
        }
        if self.class_version != CM_CLASS_VERSION {
            return Err(MadError::BadClassVersion(self.class_version));
        }
        if self.method != method::SEND {
            return Err(MadError::BadMethod(self.method));
        }
        Ok(())
    }
}

/// The name of a MAD method, for dumps.
pub fn method_name(m: u8) -> &'static str {
    match m {
        method::GET => "Get",
        method::SET => "Set",
        method::SEND => "Send",
        method::TRAP => "Trap",
        method::REPORT => "Report",
        method::TRAP_REPRESS => "TrapRepress",
        method::GET_RESP => "GetResp",
        method::REPORT_RESP => "ReportResp",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_cm_checks() {
        let h = MadHeader {
            attribute_modifier: 0x0102_0304,
            ..MadHeader::cm(0x0010, 0x1122_3344_5566_7788)
        };
        let mut buf = [0xAAu8; MAD_LEN];
        h.emit(&mut buf).unwrap();
        assert_eq!(&buf[..4], &[1, 7, 2, 3]);
        assert_eq!(&buf[16..20], &[0x00, 0x10, 0, 0]);
        let v = MadPacket::new_checked(&buf[..]).unwrap();
        assert_eq!(MadHeader::parse(&v).unwrap(), h);
        assert_eq!(v.data().len(), MAD_DATA_LEN);
        h.check_cm().unwrap();
        let bad = MadHeader {
            class_version: 1,
            ..h
        };
        assert_eq!(bad.check_cm(), Err(MadError::BadClassVersion(1)));
        let sa = MadHeader {
            mgmt_class: 0x03,
            ..h
        };
        assert_eq!(sa.check_cm(), Err(MadError::NotCm(3)));
        assert!(MadPacket::new_checked(&buf[..255]).is_err());
        assert!(h.emit(&mut [0u8; 23]).is_err());
    }
}
