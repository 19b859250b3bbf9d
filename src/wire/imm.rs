//! Immediate Data (ImmDt, IBTA 9.3) and the Invalidate Extended Transport Header (IETH,
//! IBTA 9.3): each is one 32-bit big-endian word, so one view serves both.
//!
//! ImmDt is opaque data handed to the receiver's completion; IETH is the R_Key the
//! receiver must invalidate.

use std::fmt;

use super::bytes::{get_u32, set_u32};
use super::error::{check_len, Layer, Result};
use super::pretty::{Explainer, IcrcRole, PrettyPrint};

/// Length of ImmDt and of IETH in bytes.
pub const IMM_LEN: usize = 4;

/// A zero-copy view of a 4-byte ImmDt or IETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImmDt<T: AsRef<[u8]>> {
    buffer: T,
}

/// The IETH has the layout of [`ImmDt`]: one 32-bit R_Key.
pub type Ieth<T> = ImmDt<T>;

impl<T: AsRef<[u8]>> ImmDt<T> {
    /// Wraps a buffer without checking its length; accessors panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> ImmDt<T> {
        ImmDt { buffer }
    }
    /// Wraps a buffer after checking it holds 4 bytes.
    pub fn new_checked(buffer: T) -> Result<ImmDt<T>> {
        let v = Self::new_unchecked(buffer);
        v.check_len()?;
        Ok(v)
    }
    /// Checks that the buffer holds at least 4 bytes.
    pub fn check_len(&self) -> Result<()> {
        check_len(Layer::ImmDt, IMM_LEN, self.buffer.as_ref().len())
    }
    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    /// The 32-bit value (immediate data, or the R_Key to invalidate).
    pub fn value(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDt<T> {
    /// Sets the 32-bit value.
    pub fn set_value(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), 0, v);
    }
}

/// The ImmDt of a packet as a header of its own (a [`PacketRepr`](super::PacketRepr) holds
/// the bare value), so that it can explain itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImmDtRepr(pub u32);

/// The IETH of a packet as a header of its own: the R_Key to invalidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IethRepr(pub u32);

impl PrettyPrint for ImmDtRepr {
    fn pretty_print(&self, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
        out.heading(format_args!("ImmDt [{at}..{}]", at + IMM_LEN))?;
        out.field(
            at,
            IMM_LEN,
            format_args!(
                "immediate data 0x{:08x}: delivered in the receiver's completion",
                self.0
            ),
            IcrcRole::Covered,
        )
    }
}

impl PrettyPrint for IethRepr {
    fn pretty_print(&self, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
        out.heading(format_args!("IETH [{at}..{}]", at + IMM_LEN))?;
        out.field(
            at,
            IMM_LEN,
            format_args!("R_Key 0x{:08x} the receiver must invalidate", self.0),
            IcrcRole::Covered,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_big_endian() {
        let b = [0x00, 0x00, 0x00, 0x01];
        assert_eq!(ImmDt::new_checked(&b[..]).unwrap().value(), 1);
        let mut out = [0u8; 4];
        ImmDt::new_unchecked(&mut out[..]).set_value(0xDEAD_BEEF);
        assert_eq!(out, [0xDE, 0xAD, 0xBE, 0xEF]);
        assert!(Ieth::new_checked(&b[..3]).is_err());
    }
}
