//! Atomic Extended Transport Header (IBTA 9.3, 28 bytes) on COMPARE_SWAP / FETCH_ADD,
//! and the Atomic Acknowledge ETH (IBTA 9.3, 8 bytes) on ATOMIC_ACKNOWLEDGE.
//!
//! ```text
//! AtomicETH:                              AtomicAckETH:
//! +--------------------------------+      +--------------------------------+
//! |  Virtual Address (64)          |      |  Original Remote Data (64)     |
//! +--------------------------------+      +--------------------------------+
//! |  R_Key (32)                    |
//! +--------------------------------+
//! |  Swap (CmpSwap) / Add (FetchAdd) (64)
//! +--------------------------------+
//! |  Compare (64; unused by FetchAdd)
//! +--------------------------------+
//! ```
//! The virtual address must be 8-byte aligned; a responder NAKs a misaligned one.

use std::fmt;

use super::bytes::{get_u32, get_u64, set_u32, set_u64};
use super::error::{check_len, Layer, Result};
use super::pretty::{Explainer, IcrcRole, PrettyPrint};

/// Byte offsets of the AtomicETH fields.
pub mod field {
    /// Virtual address (8 bytes).
    pub const VA: usize = 0;
    /// Remote key (4 bytes).
    pub const RKEY: usize = 8;
    /// Swap or add operand (8 bytes).
    pub const SWAP_ADD: usize = 12;
    /// Compare operand (8 bytes).
    pub const COMPARE: usize = 20;
}

/// Length of the AtomicETH in bytes.
pub const ATOMIC_ETH_LEN: usize = 28;
/// Length of the AtomicAckETH in bytes.
pub const ATOMIC_ACK_ETH_LEN: usize = 8;

/// A zero-copy view of an AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicEth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> AtomicEth<T> {
    /// Wraps a buffer without checking its length; accessors panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> AtomicEth<T> {
        AtomicEth { buffer }
    }
    /// Wraps a buffer after checking it holds a whole AtomicETH.
    pub fn new_checked(buffer: T) -> Result<AtomicEth<T>> {
        let v = Self::new_unchecked(buffer);
        v.check_len()?;
        Ok(v)
    }
    /// Checks that the buffer holds at least [`ATOMIC_ETH_LEN`] bytes.
    pub fn check_len(&self) -> Result<()> {
        check_len(Layer::AtomicEth, ATOMIC_ETH_LEN, self.buffer.as_ref().len())
    }
    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    /// Remote virtual address of the 64-bit word.
    pub fn va(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::VA)
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::RKEY)
    }
    /// Swap value (COMPARE_SWAP) or addend (FETCH_ADD).
    pub fn swap_add(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::SWAP_ADD)
    }
    /// Compare value (COMPARE_SWAP).
    pub fn compare(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::COMPARE)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEth<T> {
    /// Sets the virtual address.
    pub fn set_va(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), field::VA, v);
    }
    /// Sets the R_Key.
    pub fn set_rkey(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::RKEY, v);
    }
    /// Sets the swap/add operand.
    pub fn set_swap_add(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), field::SWAP_ADD, v);
    }
    /// Sets the compare operand.
    pub fn set_compare(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), field::COMPARE, v);
    }
}

/// The AtomicETH as plain fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicEthRepr {
    /// Remote virtual address (8-byte aligned).
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap value or addend.
    pub swap_add: u64,
    /// Compare value.
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Reads an AtomicETH.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(v: &AtomicEth<T>) -> Result<AtomicEthRepr> {
        v.check_len()?;
        Ok(AtomicEthRepr {
            va: v.va(),
            rkey: v.rkey(),
            swap_add: v.swap_add(),
            compare: v.compare(),
        })
    }
    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_ETH_LEN
    }
    /// Writes every field.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, v: &mut AtomicEth<T>) {
        v.set_va(self.va);
        v.set_rkey(self.rkey);
        v.set_swap_add(self.swap_add);
        v.set_compare(self.compare);
    }
}

/// A zero-copy view of an AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicAckEth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> AtomicAckEth<T> {
    /// Wraps a buffer without checking its length; accessors panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> AtomicAckEth<T> {
        AtomicAckEth { buffer }
    }
    /// Wraps a buffer after checking it holds a whole AtomicAckETH.
    pub fn new_checked(buffer: T) -> Result<AtomicAckEth<T>> {
        let v = Self::new_unchecked(buffer);
        v.check_len()?;
        Ok(v)
    }
    /// Checks that the buffer holds at least [`ATOMIC_ACK_ETH_LEN`] bytes.
    pub fn check_len(&self) -> Result<()> {
        check_len(
            Layer::AtomicAckEth,
            ATOMIC_ACK_ETH_LEN,
            self.buffer.as_ref().len(),
        )
    }
    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    /// The remote word's value before the atomic operation.
    pub fn orig_data(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEth<T> {
    /// Sets the original data.
    pub fn set_orig_data(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), 0, v);
    }
}

/// The AtomicAckETH as plain fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicAckEthRepr {
    /// The remote word's value before the operation.
    pub orig_data: u64,
}

impl AtomicAckEthRepr {
    /// Reads an AtomicAckETH.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(v: &AtomicAckEth<T>) -> Result<AtomicAckEthRepr> {
        v.check_len()?;
        Ok(AtomicAckEthRepr {
            orig_data: v.orig_data(),
        })
    }
    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_ACK_ETH_LEN
    }
    /// Writes the field.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, v: &mut AtomicAckEth<T>) {
        v.set_orig_data(self.orig_data);
    }
}

impl PrettyPrint for AtomicEthRepr {
    fn pretty_print(&self, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
        let covered = IcrcRole::Covered;
        out.heading(format_args!("AtomicETH [{at}..{}]", at + ATOMIC_ETH_LEN))?;
        out.field(
            at,
            8,
            format_args!("virtual address 0x{:x} (8-byte aligned)", self.va),
            covered,
        )?;
        out.field(at + 8, 4, format_args!("R_Key 0x{:x}", self.rkey), covered)?;
        out.field(
            at + 12,
            8,
            format_args!("swap/add data 0x{:x}", self.swap_add),
            covered,
        )?;
        out.field(
            at + 20,
            8,
            format_args!("compare data 0x{:x}", self.compare),
            covered,
        )
    }
}

impl PrettyPrint for AtomicAckEthRepr {
    fn pretty_print(&self, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
        out.heading(format_args!(
            "AtomicAckETH [{at}..{}]",
            at + ATOMIC_ACK_ETH_LEN
        ))?;
        out.field(
            at,
            8,
            format_args!("original remote data 0x{:x}", self.orig_data),
            IcrcRole::Covered,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_eth_layout() {
        let r = AtomicEthRepr {
            va: 0x0102_0304_0506_0708,
            rkey: 0x1122_3344,
            swap_add: 0xA1A2_A3A4_A5A6_A7A8,
            compare: 0xB1B2_B3B4_B5B6_B7B8,
        };
        let mut out = [0u8; 28];
        r.emit(&mut AtomicEth::new_unchecked(&mut out[..]));
        assert_eq!(&out[..8], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&out[8..12], &[0x11, 0x22, 0x33, 0x44]);
        assert_eq!(out[12], 0xA1);
        assert_eq!(out[20], 0xB1);
        assert_eq!(
            AtomicEthRepr::parse(&AtomicEth::new_checked(&out[..]).unwrap()),
            Ok(r)
        );
        assert!(AtomicEth::new_checked(&out[..27]).is_err());
        let mut ack = [0u8; 8];
        AtomicAckEthRepr { orig_data: 42 }.emit(&mut AtomicAckEth::new_unchecked(&mut ack[..]));
        assert_eq!(ack, [0, 0, 0, 0, 0, 0, 0, 42]);
        assert!(AtomicAckEth::new_checked(&ack[..7]).is_err());
    }
}
