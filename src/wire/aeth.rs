//! ACK Extended Transport Header (IBTA 9.3, 4 bytes) and its syndrome (ACKs and NAKs:
//! IBTA 9.7.5.1-9.7.5.2).
//!
//! ```text
//! +---------------+-----------------------------------------------+
//! |   Syndrome    |        Message Sequence Number (24 bits)      |
//! +---------------+-----------------------------------------------+
//!
//! Syndrome: bit 7 = 0 | bits 6:5 type | bits 4:0 value
//!   00 ACK      value = credit code (0x1F: no flow-control credits / unlimited)
//!   01 RNR NAK  value = RNR timer code (how long to wait before retrying)
//!   10 reserved
//!   11 NAK      value = 0 PSN sequence error, 1 invalid request, 2 remote access error,
//!                       3 remote operational error, 4 invalid RD request
//! ```

use core::fmt;
use core::time::Duration;

use super::bytes::{get_u24, set_u24};
use super::error::{check_len, Layer, Result};
use super::pretty::{Explainer, IcrcRole, PrettyPrint};

/// Byte offsets of the AETH fields.
pub mod field {
    /// Syndrome byte.
    pub const SYNDROME: usize = 0;
    /// MSN (3 bytes).
    pub const MSN: usize = 1;
}

/// Length of the AETH in bytes.
pub const AETH_LEN: usize = 4;

/// The error code of a NAK syndrome (`011x_xxxx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: the responder expected another PSN (go-back-N from the NAK's PSN).
    PsnSequenceError,
    /// 1: malformed or unsupported request (e.g. bad length or opcode sequence).
    InvalidRequest,
    /// 2: R_Key, access rights or bounds check failed.
    RemoteAccessError,
    /// 3: the responder could not complete the operation (e.g. a local error there).
    RemoteOperationalError,
    /// 4: invalid RD request (Reliable Datagram only).
    InvalidRdRequest,
    /// Any other 5-bit code (reserved).
    Reserved(u8),
}

impl NakCode {
    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(c) => c & 0x1F,
        }
    }
    /// From a 5-bit code (higher bits ignored).
    pub const fn from_code(code: u8) -> NakCode {
        match code & 0x1F {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            c => NakCode::Reserved(c),
        }
    }
}

impl fmt::Display for NakCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NakCode::PsnSequenceError => f.write_str("PSN sequence error"),
            NakCode::InvalidRequest => f.write_str("invalid request"),
            NakCode::RemoteAccessError => f.write_str("remote access error"),
            NakCode::RemoteOperationalError => f.write_str("remote operational error"),
            NakCode::InvalidRdRequest => f.write_str("invalid RD request"),
            NakCode::Reserved(c) => write!(f, "reserved NAK code {c}"),
        }
    }
}

/// The decoded AETH syndrome byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive acknowledgement with an end-to-end credit code (0x1F = unlimited).
    Ack {
        /// Credit code, 5 bits (see [`credit_count`]).
        credit: u8,
    },
    /// Receiver not ready: retry after the time of the RNR timer code.
    RnrNak {
        /// RNR timer code, 5 bits (see [`rnr_timer`]).
        timer: u8,
    },
    /// Negative acknowledgement with an error code.
    Nak(NakCode),
    /// A syndrome with bit 7 set or type `10`: reserved; the whole byte is kept.
    Reserved(u8),
}

impl Syndrome {
    /// Decodes a syndrome byte. Every byte decodes; `to_byte` gives it back unchanged.
    pub const fn from_byte(b: u8) -> Syndrome {
        if b & 0x80 != 0 {
            return Syndrome::Reserved(b);
        }
        match (b >> 5) & 0x3 {
            0 => Syndrome::Ack { credit: b & 0x1F },
            1 => Syndrome::RnrNak { timer: b & 0x1F },
            3 => Syndrome::Nak(NakCode::from_code(b)),
            _ => Syndrome::Reserved(b),
        }
    }

    /// Encodes the syndrome byte (5-bit values are masked).
    pub const fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credit } => credit & 0x1F,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1F),
            Syndrome::Nak(code) => 0x60 | code.code(),
            Syndrome::Reserved(b) => b,
        }
    }

    /// An ACK carrying "unlimited credits" (0x1F), what rxe sends.
    pub const ACK_UNLIMITED: Syndrome = Syndrome::Ack { credit: 0x1F };

    /// True for `Ack`.
    pub const fn is_ack(self) -> bool {
        matches!(self, Syndrome::Ack { .. })
    }
}

impl fmt::Display for Syndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Syndrome::Ack { credit: 0x1F } => f.write_str("ACK (credits unlimited)"),
            Syndrome::Ack { credit } => match credit_count(credit) {
                Some(n) => write!(f, "ACK (credit code {credit}: {n} receive WQEs)"),
                None => write!(f, "ACK (credit code {credit})"),
            },
            Syndrome::RnrNak { timer } => {
                write!(f, "RNR NAK (retry after {} ms)", rnr_timer_ms_text(timer))
            }
            Syndrome::Nak(code) => write!(f, "NAK ({code})"),
            Syndrome::Reserved(b) => write!(f, "reserved syndrome 0x{b:02x}"),
        }
    }
}

/// Receive WQEs advertised by credit codes 0..=30 (IBTA 9.7.7.2). Code 31
/// means the responder does not limit by credits.
const CREDITS: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

/// Receive WQEs a credit code stands for; `None` for 31 (unlimited) and invalid codes.
pub fn credit_count(code: u8) -> Option<u32> {
    CREDITS.get(code as usize).copied()
}

/// RNR NAK timer codes in units of 10 microseconds (IBTA 9.7.5.2.8, Table 45).
/// Code 0 is the longest, 655.36 ms.
const RNR_TIMER_10US: [u32; 32] = [
    65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
];

/// How long an RNR NAK with this timer code asks the requester to wait (code & 0x1F).
pub fn rnr_timer(code: u8) -> Duration {
    Duration::from_micros(u64::from(RNR_TIMER_10US[(code & 0x1F) as usize]) * 10)
}

fn rnr_timer_ms_text(code: u8) -> String {
    let us = RNR_TIMER_10US[(code & 0x1F) as usize] * 10;
    format!("{}.{:02}", us / 1000, (us % 1000) / 10)
}

/// A zero-copy view of an AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aeth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Aeth<T> {
    /// Wraps a buffer without checking its length; accessors panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> Aeth<T> {
        Aeth { buffer }
    }
    /// Wraps a buffer after checking it holds a whole AETH.
    pub fn new_checked(buffer: T) -> Result<Aeth<T>> {
        let v = Self::new_unchecked(buffer);
        v.check_len()?;
        Ok(v)
    }
    /// Checks that the buffer holds at least [`AETH_LEN`] bytes.
    pub fn check_len(&self) -> Result<()> {
        check_len(Layer::Aeth, AETH_LEN, self.buffer.as_ref().len())
    }
    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    /// The raw syndrome byte.
    pub fn syndrome_byte(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }
    /// The decoded syndrome.
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from_byte(self.syndrome_byte())
    }
    /// Message Sequence Number: requests the responder has completed (24 bits).
    pub fn msn(&self) -> u32 {
        get_u24(self.buffer.as_ref(), field::MSN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Aeth<T> {
    /// Sets the syndrome.
    pub fn set_syndrome(&mut self, s: Syndrome) {
        self.buffer.as_mut()[field::SYNDROME] = s.to_byte();
    }
    /// Sets the MSN (low 24 bits).
    pub fn set_msn(&mut self, v: u32) {
        set_u24(self.buffer.as_mut(), field::MSN, v);
    }
}

/// The AETH as plain fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// ACK / RNR NAK / NAK and its code.
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// Reads an AETH.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(v: &Aeth<T>) -> Result<AethRepr> {
        v.check_len()?;
        Ok(AethRepr {
            syndrome: v.syndrome(),
            msn: v.msn(),
        })
    }
    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        AETH_LEN
    }
    /// Writes both fields.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, v: &mut Aeth<T>) {
        v.set_syndrome(self.syndrome);
        v.set_msn(self.msn);
    }
}

impl PrettyPrint for AethRepr {
    fn pretty_print(&self, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
        out.heading(format_args!("AETH [{at}..{}]  ACK ETH", at + AETH_LEN))?;
        let meaning = match self.syndrome {
            Syndrome::Ack { credit: 0x1F } => {
                "ACK; credit code 31 = the responder does not limit by receive credits (what rxe sends)".into()
            }
            Syndrome::Ack { credit } => format!(
                "ACK; credit code {credit} = {} receive WQEs available at the responder",
                credit_count(credit).map_or("?".to_string(), |n| n.to_string())
            ),
            Syndrome::RnrNak { timer } => format!(
                "RNR NAK: receiver not ready (no receive WQE); retry this PSN after {:?} (timer code {timer})",
                rnr_timer(timer)
            ),
            Syndrome::Nak(code) => {
                format!("NAK: {code}; the requester must act on the PSN in this BTH")
            }
            Syndrome::Reserved(b) => format!("reserved syndrome 0x{b:02x}"),
        };
        out.field(
            at,
            1,
            format_args!("syndrome 0x{:02x}: {meaning}", self.syndrome.to_byte()),
            IcrcRole::Covered,
        )?;
        out.field(
            at + 1,
            3,
            format_args!(
                "MSN {}: messages the responder has completed (mod 2^24)",
                self.msn
            ),
            IcrcRole::Covered,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_ack_and_nak() {
        // rxe_rc_pingpong.pcap frame 16: ACK, unlimited credits, MSN 1.
        let ack = [0x1f, 0x00, 0x00, 0x01];
        let r = AethRepr::parse(&Aeth::new_checked(&ack[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            AethRepr {
                syndrome: Syndrome::ACK_UNLIMITED,
                msn: 1
            }
        );
        // rxe_host_peer_loss.pcap frame 28: NAK PSN sequence error, MSN 1.
        let nak = [0x60, 0x00, 0x00, 0x01];
        let r = AethRepr::parse(&Aeth::new_checked(&nak[..]).unwrap()).unwrap();
        assert_eq!(r.syndrome, Syndrome::Nak(NakCode::PsnSequenceError));
        let mut out = [0u8; 4];
        r.emit(&mut Aeth::new_unchecked(&mut out[..]));
        assert_eq!(out, nak);
    }

    #[test]
    fn every_syndrome_byte_round_trips() {
        for b in 0..=255u8 {
            assert_eq!(Syndrome::from_byte(b).to_byte(), b);
        }
        assert_eq!(Syndrome::from_byte(0x2c), Syndrome::RnrNak { timer: 12 });
        assert_eq!(
            Syndrome::from_byte(0x62),
            Syndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(Syndrome::from_byte(0x45), Syndrome::Reserved(0x45));
        assert_eq!(
            Syndrome::from_byte(0x65),
            Syndrome::Nak(NakCode::Reserved(5))
        );
    }

    #[test]
    fn timer_and_credit_tables() {
        assert_eq!(rnr_timer(0), Duration::from_micros(655_360));
        assert_eq!(rnr_timer(1), Duration::from_micros(10));
        assert_eq!(rnr_timer(12), Duration::from_micros(640));
        assert_eq!(rnr_timer(31), Duration::from_micros(491_520));
        assert_eq!(credit_count(5), Some(6));
        assert_eq!(credit_count(30), Some(32768));
        assert_eq!(credit_count(31), None);
        assert_eq!(
            Syndrome::RnrNak { timer: 14 }.to_string(),
            "RNR NAK (retry after 1.28 ms)"
        );
    }
}
