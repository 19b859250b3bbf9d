//! Datagram Extended Transport Header (IBTA 9.3.2, 8 bytes), on every UD packet.
//!
//! ```text
//! +---------------------------------------------------------------+
//! |                        Q_Key (32 bits)                        |
//! +---------------+-----------------------------------------------+
//! |   reserved    |             Source QP (24 bits)               |
//! +---------------+-----------------------------------------------+
//! ```
//! A Q_Key with the high bit set is a controlled Q_Key (IBTA 3.5.3): the sender's QP may
//! use it only if privileged, and the sender substitutes its own QP's Q_Key.

use std::fmt;

use super::bytes::{get_u24, get_u32, set_u24, set_u32};
use super::error::{check_len, Layer, Result};
use super::pretty::{Explainer, IcrcRole, PrettyPrint};

/// Byte offsets of the DETH fields.
pub mod field {
    /// Queue key (4 bytes).
    pub const QKEY: usize = 0;
    /// Reserved byte.
    pub const RESERVED: usize = 4;
    /// Source QP (3 bytes).
    pub const SRC_QP: usize = 5;
}

/// Length of the DETH in bytes.
pub const DETH_LEN: usize = 8;

/// A zero-copy view of a DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Deth<T> {
    /// Wraps a buffer without checking its length; accessors panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> Deth<T> {
        Deth { buffer }
    }
    /// Wraps a buffer after checking it holds a whole DETH.
    pub fn new_checked(buffer: T) -> Result<Deth<T>> {
        let v = Self::new_unchecked(buffer);
        v.check_len()?;
        Ok(v)
    }
    /// Checks that the buffer holds at least [`DETH_LEN`] bytes.
    pub fn check_len(&self) -> Result<()> {
        check_len(Layer::Deth, DETH_LEN, self.buffer.as_ref().len())
    }
    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    /// Queue key the receiving UD QP must match.
    pub fn qkey(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::QKEY)
    }
    /// The sending QP (24 bits), so the receiver can reply.
    pub fn src_qp(&self) -> u32 {
        get_u24(self.buffer.as_ref(), field::SRC_QP)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Deth<T> {
    /// Sets the Q_Key.
    pub fn set_qkey(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::QKEY, v);
    }
    /// Sets the source QP (low 24 bits) and clears the reserved byte.
    pub fn set_src_qp(&mut self, v: u32) {
        self.buffer.as_mut()[field::RESERVED] = 0;
        set_u24(self.buffer.as_mut(), field::SRC_QP, v);
    }
}

/// The DETH as plain fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: u32,
    /// Source QP (24 bits).
    pub src_qp: u32,
}

impl DethRepr {
    /// Reads a DETH (the reserved byte is ignored).
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(v: &Deth<T>) -> Result<DethRepr> {
        v.check_len()?;
        Ok(DethRepr {
            qkey: v.qkey(),
            src_qp: v.src_qp(),
        })
    }
    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        DETH_LEN
    }
    /// Writes every field (reserved byte zero).
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, v: &mut Deth<T>) {
        v.set_qkey(self.qkey);
        v.set_src_qp(self.src_qp);
    }
}

impl PrettyPrint for DethRepr {
    fn pretty_print(&self, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
        let covered = IcrcRole::Covered;
        out.heading(format_args!("DETH [{at}..{}]  Datagram ETH", at + DETH_LEN))?;
        let controlled = if self.qkey & 0x8000_0000 != 0 {
            " (high bit set: a controlled Q_Key)"
        } else {
            ""
        };
        out.field(
            at,
            4,
            format_args!(
                "Q_Key 0x{:08x}: must match the receiving UD QP's Q_Key{controlled}",
                self.qkey
            ),
            covered,
        )?;
        out.field(at + 4, 1, "reserved", covered)?;
        out.field(
            at + 5,
            3,
            format_args!("source QP 0x{:x}: where a reply goes", self.src_qp),
            covered,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The DETH of rxe_ud_pingpong.pcap frame 12 (UD_SEND_ONLY).
    static BYTES: [u8; 8] = [0x11, 0x11, 0x11, 0x11, 0x00, 0x00, 0x00, 0x12];

    #[test]
    fn parse_and_emit_real_deth() {
        let r = DethRepr::parse(&Deth::new_checked(&BYTES[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            DethRepr {
                qkey: 0x1111_1111,
                src_qp: 0x12
            }
        );
        let mut out = [0xFFu8; 8];
        r.emit(&mut Deth::new_unchecked(&mut out[..]));
        assert_eq!(out, BYTES);
        assert!(Deth::new_checked(&BYTES[..7]).is_err());
    }
}
