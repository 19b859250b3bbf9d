//! RDMA Extended Transport Header (IBTA 9.3, 16 bytes): names the remote buffer of an
//! RDMA WRITE (FIRST/ONLY) or READ request.
//!
//! ```text
//! +---------------------------------------------------------------+
//! |                  Virtual Address (64 bits)                    |
//! +---------------------------------------------------------------+
//! |                        R_Key (32 bits)                        |
//! +---------------------------------------------------------------+
//! |                    DMA Length (32 bits)                       |
//! +---------------------------------------------------------------+
//! ```

use std::fmt;

use super::bytes::{get_u32, get_u64, set_u32, set_u64};
use super::error::{check_len, Layer, Result};
use super::pretty::{Explainer, IcrcRole, PrettyPrint};

/// Byte offsets of the RETH fields.
pub mod field {
    /// Virtual address (8 bytes).
    pub const VA: usize = 0;
    /// Remote key (4 bytes).
    pub const RKEY: usize = 8;
    /// DMA length (4 bytes).
    pub const DMA_LEN: usize = 12;
}

/// Length of the RETH in bytes.
pub const RETH_LEN: usize = 16;

/// A zero-copy view of a RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Reth<T> {
    /// Wraps a buffer without checking its length; accessors panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> Reth<T> {
        Reth { buffer }
    }
    /// Wraps a buffer after checking it holds a whole RETH.
    pub fn new_checked(buffer: T) -> Result<Reth<T>> {
        let v = Self::new_unchecked(buffer);
        v.check_len()?;
        Ok(v)
    }
    /// Checks that the buffer holds at least [`RETH_LEN`] bytes.
    pub fn check_len(&self) -> Result<()> {
        check_len(Layer::Reth, RETH_LEN, self.buffer.as_ref().len())
    }
    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    /// Remote virtual address of the first byte.
    pub fn va(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::VA)
    }
    /// Remote key of the memory region.
    pub fn rkey(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::RKEY)
    }
    /// Length of the whole transfer in bytes (all packets of the message).
    pub fn dma_len(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::DMA_LEN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Reth<T> {
    /// Sets the virtual address.
    pub fn set_va(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), field::VA, v);
    }
    /// Sets the R_Key.
    pub fn set_rkey(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::RKEY, v);
    }
    /// Sets the DMA length.
    pub fn set_dma_len(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::DMA_LEN, v);
    }
}

/// The RETH as plain fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RethRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Total transfer length in bytes.
    pub dma_len: u32,
}

impl RethRepr {
    /// Reads a RETH.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(v: &Reth<T>) -> Result<RethRepr> {
        v.check_len()?;
        Ok(RethRepr {
            va: v.va(),
            rkey: v.rkey(),
            dma_len: v.dma_len(),
        })
    }
    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        RETH_LEN
    }
    /// Writes every field.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, v: &mut Reth<T>) {
        v.set_va(self.va);
        v.set_rkey(self.rkey);
        v.set_dma_len(self.dma_len);
    }
}

impl PrettyPrint for RethRepr {
    fn pretty_print(&self, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
        let covered = IcrcRole::Covered;
        out.heading(format_args!("RETH [{at}..{}]  RDMA ETH", at + RETH_LEN))?;
        out.field(
            at,
            8,
            format_args!(
                "virtual address 0x{:x} in the responder's memory region",
                self.va
            ),
            covered,
        )?;
        out.field(
            at + 8,
            4,
            format_args!(
                "R_Key 0x{:x}: the key that grants access to that region",
                self.rkey
            ),
            covered,
        )?;
        out.field(
            at + 12,
            4,
            format_args!("DMA length {} bytes for the whole message", self.dma_len),
            covered,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The RETH of rxe_write_lat.pcap frame 23 (RC_RDMA_WRITE_ONLY, 64 bytes).
    static BYTES: [u8; 16] = [
        0x00, 0x00, 0x55, 0xcd, 0x3e, 0xa3, 0x60, 0x00, 0x00, 0x00, 0x07, 0x2b, 0x00, 0x00, 0x00,
        0x40,
    ];

    #[test]
    fn parse_and_emit_real_reth() {
        let r = RethRepr::parse(&Reth::new_checked(&BYTES[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            RethRepr {
                va: 0x55cd_3ea3_6000,
                rkey: 0x72b,
                dma_len: 64
            }
        );
        let mut out = [0u8; 16];
        r.emit(&mut Reth::new_unchecked(&mut out[..]));
        assert_eq!(out, BYTES);
        assert!(Reth::new_checked(&BYTES[..15]).is_err());
    }
}
