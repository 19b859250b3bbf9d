//! Base Transport Header (IBTA 9.2, 12 bytes), the first header after UDP in every RoCEv2
//! packet.
//!
//! ```text
//!  0               1               2               3
//!  0 1 2 3 4 5 6 7 0 1 2 3 4 5 6 7 0 1 2 3 4 5 6 7 0 1 2 3 4 5 6 7
//! +---------------+-+-+---+-------+-------------------------------+
//! |    OpCode     |S|M|Pad| TVer  |            P_Key              |
//! +-+-+-----------+---------------+-------------------------------+
//! |F|B|  resv6    |                 DestQP                        |
//! +-+-------------+---------------+-------------------------------+
//! |A|   resv7     |                   PSN                         |
//! +-+-------------+-----------------------------------------------+
//! ```
//! S = Solicited Event, M = MigReq, Pad = PadCnt, F/B = FECN/BECN, A = AckReq.
//! Byte 4 (F, B, resv6) is a *variant* field: switches may change it, so the ICRC covers it
//! as all ones.

use std::fmt;

use super::bytes::{get_u16, get_u24, set_u16, set_u24};
use super::error::{check_len, Layer, Result, WireError};
use super::opcode::Opcode;
use super::pretty::{Explainer, IcrcRole, PrettyPrint};
use super::psn::Psn;

/// Byte offsets of the BTH fields.
pub mod field {
    /// OpCode.
    pub const OPCODE: usize = 0;
    /// SE, M, PadCnt, TVer.
    pub const FLAGS: usize = 1;
    /// Partition key (2 bytes).
    pub const PKEY: usize = 2;
    /// FECN, BECN, resv6: the ICRC-masked byte.
    pub const VARIANT: usize = 4;
    /// Destination QP (3 bytes).
    pub const DEST_QP: usize = 5;
    /// AckReq and resv7.
    pub const ACK_REQ: usize = 8;
    /// PSN (3 bytes).
    pub const PSN: usize = 9;
}

/// Length of the BTH in bytes.
pub const BTH_LEN: usize = 12;

/// A zero-copy view of a BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Bth<T> {
    /// Wraps a buffer without checking its length; accessors panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> Bth<T> {
        Bth { buffer }
    }

    /// Wraps a buffer after checking it holds a whole BTH; no accessor panics afterwards.
    pub fn new_checked(buffer: T) -> Result<Bth<T>> {
        let bth = Self::new_unchecked(buffer);
        bth.check_len()?;
        Ok(bth)
    }

    /// Checks that the buffer holds at least [`BTH_LEN`] bytes.
    pub fn check_len(&self) -> Result<()> {
        check_len(Layer::Bth, BTH_LEN, self.buffer.as_ref().len())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// OpCode.
    pub fn opcode(&self) -> Opcode {
        Opcode(self.buffer.as_ref()[field::OPCODE])
    }
    /// Solicited Event: the responder should raise a completion event for this message.
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & 0x80 != 0
    }
    /// MigReq: path-migration state (1 = migrated or no alternate path).
    pub fn migreq(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & 0x40 != 0
    }
    /// PadCnt: pad bytes (0-3) between payload and ICRC.
    pub fn pad_count(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] >> 4) & 0x3
    }
    /// Transport header version; must be 0.
    pub fn tver(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & 0x0F
    }
    /// Partition key.
    pub fn pkey(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::PKEY)
    }
    /// Forward ECN: congestion seen on the way here.
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::VARIANT] & 0x80 != 0
    }
    /// Backward ECN.
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::VARIANT] & 0x40 != 0
    }
    /// Destination QP number (24 bits).
    pub fn dest_qp(&self) -> u32 {
        get_u24(self.buffer.as_ref(), field::DEST_QP)
    }
    /// AckReq: the requester asks for an acknowledgement of this packet.
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK_REQ] & 0x80 != 0
    }
    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(get_u24(self.buffer.as_ref(), field::PSN))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    fn flags_mut(&mut self, mask: u8, value: u8) {
        let b = &mut self.buffer.as_mut()[field::FLAGS];
        *b = (*b & !mask) | (value & mask);
    }
    /// Sets the opcode.
    pub fn set_opcode(&mut self, opcode: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = opcode.0;
    }
    /// Sets Solicited Event.
    pub fn set_solicited(&mut self, v: bool) {
        self.flags_mut(0x80, if v { 0x80 } else { 0 });
    }
    /// Sets MigReq.
    pub fn set_migreq(&mut self, v: bool) {
        self.flags_mut(0x40, if v { 0x40 } else { 0 });
    }
    /// Sets PadCnt (low 2 bits of `v`).
    pub fn set_pad_count(&mut self, v: u8) {
        self.flags_mut(0x30, v << 4);
    }
    /// Sets TVer (low 4 bits of `v`).
    pub fn set_tver(&mut self, v: u8) {
        self.flags_mut(0x0F, v);
    }
    /// Sets the partition key.
    pub fn set_pkey(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::PKEY, v);
    }
    /// Sets FECN and BECN and clears resv6.
    pub fn set_ecn(&mut self, fecn: bool, becn: bool) {
        self.buffer.as_mut()[field::VARIANT] = (u8::from(fecn) << 7) | (u8::from(becn) << 6);
    }
    /// Sets the destination QP (low 24 bits of `v`).
    pub fn set_dest_qp(&mut self, v: u32) {
        set_u24(self.buffer.as_mut(), field::DEST_QP, v);
    }
    /// Sets AckReq and clears resv7.
    pub fn set_ack_req(&mut self, v: bool) {
        self.buffer.as_mut()[field::ACK_REQ] = u8::from(v) << 7;
    }
    /// Sets the PSN.
    pub fn set_psn(&mut self, psn: Psn) {
        set_u24(self.buffer.as_mut(), field::PSN, psn.value());
    }
}

/// The BTH as plain fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// OpCode.
    pub opcode: Opcode,
    /// Solicited Event.
    pub solicited: bool,
    /// MigReq.
    pub migreq: bool,
    /// PadCnt as received. On emit, [`PacketRepr`](super::PacketRepr) computes it from the
    /// payload length and ignores this field.
    pub pad_count: u8,
    /// Transport header version (0).
    pub tver: u8,
    /// Partition key (default 0xFFFF).
    pub pkey: u16,
    /// Forward ECN.
    pub fecn: bool,
    /// Backward ECN.
    pub becn: bool,
    /// Destination QP (24 bits).
    pub dest_qp: u32,
    /// AckReq.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl BthRepr {
    /// Reads a BTH. Rejects TVer != 0 (IBTA 9.2: only version 0 is defined; rxe drops others). Reserved bits
    /// are ignored.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(bth: &Bth<T>) -> Result<BthRepr> {
        bth.check_len()?;
        if bth.tver() != 0 {
            return Err(WireError::BadTver(bth.tver()));
        }
        Ok(BthRepr {
            opcode: bth.opcode(),
            solicited: bth.solicited(),
            migreq: bth.migreq(),
            pad_count: bth.pad_count(),
            tver: bth.tver(),
            pkey: bth.pkey(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            dest_qp: bth.dest_qp(),
            ack_req: bth.ack_req(),
            psn: bth.psn(),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        BTH_LEN
    }

    /// Writes every field (reserved bits zero). Fields wider than the wire are truncated;
    /// [`PacketRepr::emit`](super::PacketRepr::emit) checks them first.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, bth: &mut Bth<T>) {
        bth.set_opcode(self.opcode);
        bth.buffer.as_mut()[field::FLAGS] = 0;
        bth.set_solicited(self.solicited);
        bth.set_migreq(self.migreq);
        bth.set_pad_count(self.pad_count);
        bth.set_tver(self.tver);
        bth.set_pkey(self.pkey);
        bth.set_ecn(self.fecn, self.becn);
        bth.set_dest_qp(self.dest_qp);
        bth.set_ack_req(self.ack_req);
        bth.set_psn(self.psn);
    }
}

impl PrettyPrint for BthRepr {
    fn pretty_print(&self, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
        use super::opcode::{Position, Transport};
        let covered = IcrcRole::Covered;
        out.heading(format_args!(
            "BTH [{at}..{}]  Base Transport Header",
            at + BTH_LEN
        ))?;
        let info = self.opcode.info();
        let meaning = info.map_or("", |i| i.meaning);
        let op = self.opcode;
        out.field(
            at,
            1,
            format_args!("opcode 0x{:02x} {op}: {meaning}", op.0),
            covered,
        )?;
        out.field(
            at + 1,
            1,
            format_args!(
                "SE {} (solicited event), M {} (MigReq), PadCnt {} (pad bytes before the ICRC), TVer {}",
                u8::from(self.solicited),
                u8::from(self.migreq),
                self.pad_count,
                self.tver
            ),
            covered,
        )?;
        let default_partition = if self.pkey == 0xFFFF {
            " (default partition, full member)"
        } else {
            ""
        };
        out.field(
            at + 2,
            2,
            format_args!("P_Key 0x{:04x}{default_partition}", self.pkey),
            covered,
        )?;
        out.field(
            at + 4,
            1,
            format_args!(
                "FECN {}, BECN {}, reserved (congestion marks; switches may set them)",
                u8::from(self.fecn),
                u8::from(self.becn)
            ),
            IcrcRole::Masked,
        )?;
        out.field(
            at + 5,
            3,
            format_args!("destination QP 0x{:x}", self.dest_qp),
            covered,
        )?;
        let ack_req = u8::from(self.ack_req);
        let ack_meaning = match info {
            None => format!("AckReq {ack_req}"),
            Some(i) if i.is_response || !i.is_request => {
                format!("AckReq {ack_req} (responses and CNPs are never acknowledged)")
            }
            Some(i) if self.ack_req => {
                let why = if matches!(i.position, Position::Last | Position::Only) {
                    "the last packet of a message: the requester needs the ACK to complete the work request"
                } else {
                    "a periodic request inside a long message, so the window keeps moving"
                };
                format!("AckReq 1: the responder must acknowledge this packet; {why}")
            }
            Some(i) if i.transport == Transport::Rc => {
                "AckReq 0: no ACK needed now; a later ACK will cover this PSN too (ACKs are cumulative)"
                    .to_string()
            }
            Some(_) => "AckReq 0 (unreliable service: never acknowledged)".to_string(),
        };
        out.field(at + 8, 1, ack_meaning, covered)?;
        out.field(
            at + 9,
            3,
            format_args!("PSN {} (24-bit packet sequence number)", self.psn),
            covered,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The BTH of rxe_rc_pingpong.pcap frame 12 (RC_SEND_FIRST, QP 0x11, PSN 0x2fa524).
    static BYTES: [u8; 12] = [
        0x00, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x2f, 0xa5, 0x24,
    ];

    #[test]
    fn parse_real_bth() {
        let repr = BthRepr::parse(&Bth::new_checked(&BYTES[..]).unwrap()).unwrap();
        assert_eq!(repr.opcode, Opcode::RC_SEND_FIRST);
        assert!(!repr.migreq && !repr.solicited && !repr.ack_req);
        assert_eq!(repr.pkey, 0xFFFF);
        assert_eq!(repr.dest_qp, 0x11);
        assert_eq!(repr.psn, Psn::new(0x2fa524));
        let mut out = [0xAAu8; 12];
        repr.emit(&mut Bth::new_unchecked(&mut out[..]));
        assert_eq!(out, BYTES);
    }

    #[test]
    fn rejects_short_and_bad_version() {
        assert_eq!(
            Bth::new_checked(&BYTES[..11]).unwrap_err(),
            WireError::Truncated {
                layer: Layer::Bth,
                need: 12,
                have: 11
            }
        );
        let mut b = BYTES;
        b[1] |= 0x01;
        assert_eq!(
            BthRepr::parse(&Bth::new_checked(&b[..]).unwrap()),
            Err(WireError::BadTver(1))
        );
    }
}
