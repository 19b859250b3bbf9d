//! The RoCE part of a packet: BTH, the extension headers its opcode calls for, payload and
//! pad (IBTA 9.2-9.3). The ICRC after it, and everything before the BTH, belong to
//! [`frame`](super::frame).
//!
//! Extension headers follow the BTH in this fixed order (IBTA 9.2-9.3): DETH, RETH,
//! AtomicETH, AETH, AtomicAckETH, ImmDt, IETH. Which ones are present is decided by the
//! opcode alone ([`OpcodeInfo`]). The payload is padded with PadCnt zero bytes to a multiple
//! of 4, because IBA packets are whole 32-bit words.

use std::fmt;

use super::aeth::{Aeth, AethRepr, AETH_LEN};
use super::atomic::{
    AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr, ATOMIC_ACK_ETH_LEN, ATOMIC_ETH_LEN,
};
use super::bth::{Bth, BthRepr, BTH_LEN};
use super::deth::{Deth, DethRepr, DETH_LEN};
use super::error::{Layer, Result, WireError};
use super::imm::{IethRepr, ImmDt, ImmDtRepr, IMM_LEN};
use super::opcode::{Opcode, OpcodeInfo, Transport};
use super::pretty::{Explainer, IcrcRole, PrettyPrint};
use super::reth::{Reth, RethRepr, RETH_LEN};

/// Length of a CNP's body: 16 reserved bytes (RoCEv2 Annex A17.9.3, Figure 6).
pub const CNP_BODY_LEN: usize = 16;

/// Pad bytes that bring `payload_len` to a multiple of 4: `(-len) & 3`.
#[inline]
pub const fn pad_for(payload_len: usize) -> u8 {
    (payload_len.wrapping_neg() & 3) as u8
}

/// A RoCE packet from the BTH to the end of its payload, as plain fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketRepr<'a> {
    /// Base transport header.
    pub bth: BthRepr,
    /// RDMA ETH (WRITE FIRST/ONLY, READ request).
    pub reth: Option<RethRepr>,
    /// ACK ETH (ACK, atomic ACK, READ response FIRST/LAST/ONLY).
    pub aeth: Option<AethRepr>,
    /// Atomic ETH (COMPARE_SWAP, FETCH_ADD).
    pub atomic_eth: Option<AtomicEthRepr>,
    /// Atomic ACK ETH (ATOMIC_ACKNOWLEDGE).
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// Immediate data (`_WITH_IMMEDIATE` LAST/ONLY).
    pub immdt: Option<u32>,
    /// R_Key to invalidate (SEND `_WITH_INVALIDATE` LAST/ONLY).
    pub ieth: Option<u32>,
    /// Datagram ETH (UD).
    pub deth: Option<DethRepr>,
    /// Payload without pad (for a CNP: its 16 reserved bytes).
    pub payload: &'a [u8],
}

impl<'a> PacketRepr<'a> {
    /// A packet with only a BTH for `opcode` (other fields default: P_Key 0xFFFF, PSN 0, no
    /// extension headers, no payload). Fill in what the opcode needs before emitting.
    pub fn new(opcode: Opcode, dest_qp: u32) -> PacketRepr<'static> {
        PacketRepr {
            bth: BthRepr {
                opcode,
                solicited: false,
                migreq: false,
                pad_count: 0,
                tver: 0,
                pkey: 0xFFFF,
                fecn: false,
                becn: false,
                dest_qp,
                ack_req: false,
                psn: super::Psn::ZERO,
            },
            reth: None,
            aeth: None,
            atomic_eth: None,
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
            deth: None,
            payload: &[],
        }
    }

    /// A CNP telling the sender's QP `dest_qp` to slow down (Annex A17.9.3): BTH with opcode
    /// 0x81, PSN 0 and BECN set, then 16 reserved zero bytes (the ICRC follows in the frame).
    pub fn cnp(dest_qp: u32, pkey: u16) -> PacketRepr<'static> {
        static BODY: [u8; CNP_BODY_LEN] = [0; CNP_BODY_LEN];
        let mut p = PacketRepr::new(Opcode::CNP, dest_qp);
        p.bth.pkey = pkey;
        p.bth.becn = true;
        p.payload = &BODY;
        p
    }

    /// Parses the bytes from the BTH to the end of the pad (the UDP payload without its last
    /// 4 bytes, the ICRC). The payload borrows from `buf`.
    #[inline(always)]
    pub fn parse(buf: &'a [u8]) -> Result<PacketRepr<'a>> {
        let bth = BthRepr::parse(&Bth::new_checked(buf)?)?;
        let info = bth
            .opcode
            .info()
            .ok_or(WireError::UnknownOpcode(bth.opcode.0))?;
        let mut rest = &buf[BTH_LEN..];

        // Takes `len` bytes for header `layer`, or reports it truncated.
        fn take<'b>(rest: &mut &'b [u8], layer: Layer, len: usize) -> Result<&'b [u8]> {
            if rest.len() < len {
                return Err(WireError::Truncated {
                    layer,
                    need: len,
                    have: rest.len(),
                });
            }
            let (head, tail) = rest.split_at(len);
            *rest = tail;
            Ok(head)
        }

        let mut p = PacketRepr::new(bth.opcode, bth.dest_qp);
        p.bth = bth;
        if info.has_deth {
            let b = take(&mut rest, Layer::Deth, DETH_LEN)?;
            p.deth = Some(DethRepr::parse(&Deth::new_unchecked(b))?);
        }
        if info.has_reth {
            let b = take(&mut rest, Layer::Reth, RETH_LEN)?;
            p.reth = Some(RethRepr::parse(&Reth::new_unchecked(b))?);
        }
        if info.has_atomic_eth {
            let b = take(&mut rest, Layer::AtomicEth, ATOMIC_ETH_LEN)?;
            p.atomic_eth = Some(AtomicEthRepr::parse(&AtomicEth::new_unchecked(b))?);
        }
        if info.has_aeth {
            let b = take(&mut rest, Layer::Aeth, AETH_LEN)?;
            p.aeth = Some(AethRepr::parse(&Aeth::new_unchecked(b))?);
        }
        if info.has_atomic_ack_eth {
            let b = take(&mut rest, Layer::AtomicAckEth, ATOMIC_ACK_ETH_LEN)?;
            p.atomic_ack_eth = Some(AtomicAckEthRepr::parse(&AtomicAckEth::new_unchecked(b))?);
        }
        if info.has_immdt {
            let b = take(&mut rest, Layer::ImmDt, IMM_LEN)?;
            p.immdt = Some(ImmDt::new_unchecked(b).value());
        }
        if info.has_ieth {
            let b = take(&mut rest, Layer::Ieth, IMM_LEN)?;
            p.ieth = Some(ImmDt::new_unchecked(b).value());
        }

        let pad = bth.pad_count;
        if !info.has_payload {
            if !rest.is_empty() {
                return Err(WireError::UnexpectedPayload {
                    opcode: bth.opcode,
                    len: rest.len(),
                });
            }
            if pad != 0 {
                return Err(WireError::PadExceedsPayload { pad, available: 0 });
            }
        }
        if usize::from(pad) > rest.len() {
            return Err(WireError::PadExceedsPayload {
                pad,
                available: rest.len(),
            });
        }
        let payload_len = rest.len() - usize::from(pad);
        if rest.len() % 4 != 0 {
            return Err(WireError::Misaligned {
                payload: payload_len,
                pad,
            });
        }
        if info.transport == Transport::Cnp && payload_len != CNP_BODY_LEN {
            return Err(WireError::BadCnpLength { len: payload_len });
        }
        p.payload = &rest[..payload_len];
        Ok(p)
    }

    /// The opcode's table entry, or `UnknownOpcode`.
    pub fn info(&self) -> Result<&'static OpcodeInfo> {
        self.bth
            .opcode
            .info()
            .ok_or(WireError::UnknownOpcode(self.bth.opcode.0))
    }

    /// Length of BTH plus the extension headers present.
    pub fn header_len(&self) -> usize {
        BTH_LEN
            + self.deth.map_or(0, |_| DETH_LEN)
            + self.reth.map_or(0, |_| RETH_LEN)
            + self.atomic_eth.map_or(0, |_| ATOMIC_ETH_LEN)
            + self.aeth.map_or(0, |_| AETH_LEN)
            + self.atomic_ack_eth.map_or(0, |_| ATOMIC_ACK_ETH_LEN)
            + self.immdt.map_or(0, |_| IMM_LEN)
            + self.ieth.map_or(0, |_| IMM_LEN)
    }

    /// The PadCnt that emit writes: `(-payload_len) & 3`.
    pub fn pad_count(&self) -> u8 {
        pad_for(self.payload.len())
    }

    /// Payload plus pad bytes.
    pub fn padded_payload_len(&self) -> usize {
        self.payload.len() + usize::from(self.pad_count())
    }

    /// Bytes [`emit`](Self::emit) writes: headers, payload and pad (not the ICRC).
    pub fn buffer_len(&self) -> usize {
        self.buffer_len_for(self.payload.len())
    }

    /// [`buffer_len`](Self::buffer_len) with a payload of `payload_len` bytes in place of the
    /// repr's own.
    #[inline]
    pub(super) fn buffer_len_for(&self, payload_len: usize) -> usize {
        self.header_len() + payload_len + usize::from(pad_for(payload_len))
    }

    /// Checks that the packet can be emitted: a known opcode, exactly the extension headers
    /// the opcode table lists, no payload where the opcode carries none, and every field
    /// within its wire width. TVer may be any 4-bit value, so conformance tests can emit
    /// packets a receiver must drop.
    pub fn check(&self) -> Result<&'static OpcodeInfo> {
        self.check_with(self.payload)
    }

    /// [`check`](Self::check) with `payload` in place of the repr's own.
    #[inline]
    pub(super) fn check_with(&self, payload: &[u8]) -> Result<&'static OpcodeInfo> {
        let info = self.info()?;
        let opcode = self.bth.opcode;
        let wanted = [
            info.has_deth,
            info.has_reth,
            info.has_atomic_eth,
            info.has_aeth,
            info.has_atomic_ack_eth,
            info.has_immdt,
            info.has_ieth,
        ];
        let present = [
            self.deth.is_some(),
            self.reth.is_some(),
            self.atomic_eth.is_some(),
            self.aeth.is_some(),
            self.atomic_ack_eth.is_some(),
            self.immdt.is_some(),
            self.ieth.is_some(),
        ];
        // The usual case is decided with one comparison; the names are for the error.
        if wanted != present {
            const MISSING: [&str; 7] = [
                "DETH missing",
                "RETH missing",
                "AtomicETH missing",
                "AETH missing",
                "AtomicAckETH missing",
                "ImmDt missing",
                "IETH missing",
            ];
            const EXTRA: [&str; 7] = [
                "DETH not allowed",
                "RETH not allowed",
                "AtomicETH not allowed",
                "AETH not allowed",
                "AtomicAckETH not allowed",
                "ImmDt not allowed",
                "IETH not allowed",
            ];
            for (i, (w, p)) in wanted.iter().zip(present).enumerate() {
                if *w != p {
                    let detail = if *w { MISSING[i] } else { EXTRA[i] };
                    return Err(WireError::HeaderMismatch { opcode, detail });
                }
            }
        }
        if !info.has_payload && !payload.is_empty() {
            return Err(WireError::UnexpectedPayload {
                opcode,
                len: payload.len(),
            });
        }
        if info.transport == Transport::Cnp && payload.len() != CNP_BODY_LEN {
            return Err(WireError::BadCnpLength { len: payload.len() });
        }
        fn fits(field: &'static str, value: u64, bits: u32) -> Result<()> {
            if value >> bits != 0 {
                Err(WireError::FieldOutOfRange { field, value })
            } else {
                Ok(())
            }
        }
        fits("BTH TVer", self.bth.tver.into(), 4)?;
        fits("BTH DestQP", self.bth.dest_qp.into(), 24)?;
        if let Some(a) = self.aeth {
            fits("AETH MSN", a.msn.into(), 24)?;
        }
        if let Some(d) = self.deth {
            fits("DETH SrcQP", d.src_qp.into(), 24)?;
        }
        Ok(info)
    }

    /// Writes headers, payload and zero pad bytes to the start of `buf` and returns the
    /// length written. PadCnt is computed from the payload length (`bth.pad_count` is
    /// ignored). Does not allocate.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        self.check()?;
        self.emit_checked(buf)
    }

    /// [`emit`](Self::emit) for a packet that already passed [`check`](Self::check) (the
    /// frame emitter checks once, not twice per packet).
    pub(super) fn emit_checked(&self, buf: &mut [u8]) -> Result<usize> {
        self.emit_checked_with(buf, self.payload)
    }

    /// [`emit_checked`](Self::emit_checked) with `payload` in place of the repr's own.
    #[inline]
    pub(super) fn emit_checked_with(&self, buf: &mut [u8], payload: &[u8]) -> Result<usize> {
        let pad_count = pad_for(payload.len());
        let len = self.buffer_len_for(payload.len());
        if buf.len() < len {
            return Err(WireError::BufferTooSmall {
                need: len,
                have: buf.len(),
            });
        }
        let buf = &mut buf[..len];
        let mut bth = self.bth;
        bth.pad_count = pad_count;
        bth.emit(&mut Bth::new_unchecked(&mut buf[..BTH_LEN]));
        let mut at = BTH_LEN;
        let mut next = |n: usize| {
            let r = at..at + n;
            at += n;
            r
        };
        if let Some(d) = self.deth {
            d.emit(&mut Deth::new_unchecked(&mut buf[next(DETH_LEN)]));
        }
        if let Some(r) = self.reth {
            r.emit(&mut Reth::new_unchecked(&mut buf[next(RETH_LEN)]));
        }
        if let Some(a) = self.atomic_eth {
            a.emit(&mut AtomicEth::new_unchecked(
                &mut buf[next(ATOMIC_ETH_LEN)],
            ));
        }
        if let Some(a) = self.aeth {
            a.emit(&mut Aeth::new_unchecked(&mut buf[next(AETH_LEN)]));
        }
        if let Some(a) = self.atomic_ack_eth {
            a.emit(&mut AtomicAckEth::new_unchecked(
                &mut buf[next(ATOMIC_ACK_ETH_LEN)],
            ));
        }
        if let Some(v) = self.immdt {
            ImmDt::new_unchecked(&mut buf[next(IMM_LEN)]).set_value(v);
        }
        if let Some(v) = self.ieth {
            ImmDt::new_unchecked(&mut buf[next(IMM_LEN)]).set_value(v);
        }
        let payload_at = next(payload.len());
        buf[payload_at].copy_from_slice(payload);
        let pad = next(usize::from(pad_count));
        buf[pad].fill(0);
        Ok(len)
    }
}

/// The BTH, then each extension header in wire order, then payload and pad (the ICRC after
/// them is the frame's).
impl PrettyPrint for PacketRepr<'_> {
    fn pretty_print(&self, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
        self.bth.pretty_print(at, out)?;
        let mut at = at + BTH_LEN;
        let mut header = |h: Option<&dyn PrettyPrint>, len: usize| -> fmt::Result {
            if let Some(h) = h {
                h.pretty_print(at, out)?;
                at += len;
            }
            Ok(())
        };
        header(self.deth.as_ref().map(|h| h as _), DETH_LEN)?;
        header(self.reth.as_ref().map(|h| h as _), RETH_LEN)?;
        header(self.atomic_eth.as_ref().map(|h| h as _), ATOMIC_ETH_LEN)?;
        header(self.aeth.as_ref().map(|h| h as _), AETH_LEN)?;
        header(
            self.atomic_ack_eth.as_ref().map(|h| h as _),
            ATOMIC_ACK_ETH_LEN,
        )?;
        header(self.immdt.map(ImmDtRepr).as_ref().map(|h| h as _), IMM_LEN)?;
        header(self.ieth.map(IethRepr).as_ref().map(|h| h as _), IMM_LEN)?;

        let payload_len = self.payload.len();
        let pad_at = at + payload_len;
        out.heading(format_args!(
            "payload [{at}..{pad_at}]  {payload_len} bytes"
        ))?;
        if payload_len > 0 {
            let what = if payload_len > 16 {
                "first 16 bytes ..."
            } else {
                "data"
            };
            out.field(at, payload_len.min(16), what, IcrcRole::Covered)?;
        }
        let pad = usize::from(self.bth.pad_count);
        if pad > 0 {
            out.heading(format_args!("pad [{pad_at}..{}]", pad_at + pad))?;
            out.field(
                pad_at,
                pad,
                format_args!("{pad} zero bytes: the packet must be whole 32-bit words"),
                IcrcRole::Covered,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{NakCode, Psn, Syndrome};

    // rxe_read_lat.pcap frame 25: RC_RDMA_READ_REQUEST (BTH + RETH), ICRC removed.
    static READ_REQ: [u8; 28] = [
        0x0c, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x17, 0x80, 0x37, 0x44, 0x6c, 0x00, 0x00, 0x55,
        0xb3, 0x29, 0x7e, 0x00, 0x00, 0x00, 0x00, 0x08, 0xc4, 0x00, 0x00, 0x00, 0x40,
    ];

    #[test]
    fn parse_real_read_request() {
        let p = PacketRepr::parse(&READ_REQ).unwrap();
        assert_eq!(p.bth.opcode, Opcode::RC_RDMA_READ_REQUEST);
        assert!(p.bth.ack_req);
        assert_eq!(p.bth.psn, Psn::new(0x37446c));
        let reth = p.reth.unwrap();
        assert_eq!(
            (reth.va, reth.rkey, reth.dma_len),
            (0x55b3_297e_0000, 0x8c4, 64)
        );
        assert!(p.payload.is_empty());
        let mut out = [0u8; 64];
        assert_eq!(p.emit(&mut out), Ok(28));
        assert_eq!(&out[..28], &READ_REQ);
    }

    #[test]
    fn length_rules() {
        assert_eq!(
            PacketRepr::parse(&READ_REQ[..27]),
            Err(WireError::Truncated {
                layer: Layer::Reth,
                need: 16,
                have: 15
            })
        );
        let mut long = [0u8; 32];
        long[..28].copy_from_slice(&READ_REQ);
        assert_eq!(
            PacketRepr::parse(&long),
            Err(WireError::UnexpectedPayload {
                opcode: Opcode::RC_RDMA_READ_REQUEST,
                len: 4
            })
        );
        // SEND_ONLY with 4 bytes after the BTH but PadCnt 3 -> 1 payload byte.
        let mut send = [0u8; 16];
        send[0] = Opcode::RC_SEND_ONLY.0;
        send[1] = 0x30;
        send[12] = 0xAB;
        let p = PacketRepr::parse(&send).unwrap();
        assert_eq!(p.payload, &[0xAB]);
        // 5 bytes after the BTH is never a whole number of words.
        let mut odd = [0u8; 17];
        odd[0] = Opcode::RC_SEND_ONLY.0;
        assert_eq!(
            PacketRepr::parse(&odd),
            Err(WireError::Misaligned { payload: 5, pad: 0 })
        );
        // PadCnt 3 with nothing after the headers.
        let mut empty = [0u8; 12];
        empty[0] = Opcode::RC_SEND_ONLY.0;
        empty[1] = 0x30;
        assert_eq!(
            PacketRepr::parse(&empty),
            Err(WireError::PadExceedsPayload {
                pad: 3,
                available: 0
            })
        );
        empty[1] = 0;
        empty[0] = 0x15;
        assert_eq!(
            PacketRepr::parse(&empty),
            Err(WireError::UnknownOpcode(0x15))
        );
    }

    #[test]
    fn emit_checks_headers_against_table() {
        let mut p = PacketRepr::new(Opcode::RC_ACKNOWLEDGE, 5);
        let mut buf = [0u8; 64];
        assert!(matches!(
            p.emit(&mut buf),
            Err(WireError::HeaderMismatch { .. })
        ));
        p.aeth = Some(AethRepr {
            syndrome: Syndrome::Nak(NakCode::InvalidRequest),
            msn: 7,
        });
        assert_eq!(p.emit(&mut buf), Ok(16));
        assert_eq!(buf[12], 0x61);
        p.bth.dest_qp = 1 << 24;
        assert!(matches!(
            p.emit(&mut buf),
            Err(WireError::FieldOutOfRange { .. })
        ));
        p.bth.dest_qp = 5;
        assert_eq!(
            p.emit(&mut buf[..15]),
            Err(WireError::BufferTooSmall { need: 16, have: 15 })
        );
    }

    #[test]
    fn pad_is_computed_and_zeroed() {
        let mut p = PacketRepr::new(Opcode::UD_SEND_ONLY, 1);
        p.deth = Some(DethRepr {
            qkey: 0x1111_1111,
            src_qp: 2,
        });
        p.payload = &[1, 2, 3, 4, 5];
        let mut buf = [0xEEu8; 64];
        let n = p.emit(&mut buf).unwrap();
        assert_eq!(n, 12 + 8 + 8);
        assert_eq!((buf[1] >> 4) & 3, 3);
        assert_eq!(&buf[20..28], &[1, 2, 3, 4, 5, 0, 0, 0]);
        let back = PacketRepr::parse(&buf[..n]).unwrap();
        assert_eq!(back.payload, &[1, 2, 3, 4, 5]);
        assert_eq!(back.bth.pad_count, 3);
    }

    #[test]
    fn cnp_round_trip() {
        let p = PacketRepr::cnp(0x123, 0xFFFF);
        let mut buf = [0u8; 28];
        assert_eq!(p.emit(&mut buf), Ok(28));
        let back = PacketRepr::parse(&buf).unwrap();
        assert_eq!(back, p);
        assert_eq!(
            PacketRepr::parse(&buf[..24]),
            Err(WireError::BadCnpLength { len: 12 })
        );
    }
}
