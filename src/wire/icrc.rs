//! The invariant CRC (IBTA Vol. 1 7.8.1, as RoCEv2 Annex A17.3.3 "ICRC for
//! RoCEv2 packets" applies it to IP/UDP): a CRC-32 over the parts of a packet that no switch
//! or router may change.
//!
//! Input, in order:
//! 1. eight `0xFF` bytes, standing in for the InfiniBand LRH that RoCEv2 does not have;
//! 2. the IP header with its *variant* fields set to all ones: IPv4 TOS (DSCP+ECN), TTL and
//!    header checksum; IPv6 traffic class, flow label and hop limit;
//! 3. the UDP header with its checksum set to all ones;
//! 4. the BTH with byte 4 (FECN, BECN, resv6) set to all ones;
//! 5. everything after the BTH up to the ICRC: extension headers, payload, pad.
//!
//! The CRC is the IEEE 802.3 CRC-32 (reflected polynomial 0xEDB88320, register starts at
//! all ones, result complemented): what `crc32fast` and zlib compute. It is sent least
//! significant byte first, unlike every other RoCE field.
//!
//! Masking copies the headers (and, for a small packet, all of it: at most 128 bytes) to the
//! stack; the rest of the payload is hashed in place, so computing an ICRC never allocates.

use std::fmt;

use crc32fast::Hasher;

use super::pretty::{Explainer, IcrcRole, PrettyPrint};

/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// The CRC-32 value (as `crc32fast` reports it) after hashing eight `0xFF` bytes. The CRC
/// register at that point is its complement, 0xDEBB20E3 (the facts file's shortcut).
pub const CRC_OF_LRH_STANDIN: u32 = !0xDEBB_20E3;

/// Offsets inside an IPv4 header that the ICRC sees as all ones: TOS, TTL, checksum.
pub const IPV4_VARIANT_BYTES: [usize; 4] = [1, 8, 10, 11];
/// Offsets inside the UDP header + BTH (counted from the UDP header) seen as all ones: the
/// UDP checksum and BTH byte 4.
pub const UDP_BTH_VARIANT_BYTES: [usize; 3] = [6, 7, 8 + 4];

/// A hasher that has already consumed the eight `0xFF` LRH stand-in bytes. Cloned from one
/// made once: `Hasher::new_with_initial` detects the CPU's CRC instructions on every call,
/// which cost as much as masking the headers.
fn start() -> Hasher {
    static PROTOTYPE: std::sync::OnceLock<Hasher> = std::sync::OnceLock::new();
    PROTOTYPE
        .get_or_init(|| Hasher::new_with_initial(CRC_OF_LRH_STANDIN))
        .clone()
}

/// Bytes from the IP header on that are copied to the stack and masked before hashing: the
/// largest IP header (60) plus the UDP header and BTH (20), rounded up so that a whole small
/// packet (an ACK, a READ request, a 64-byte SEND) fits. Such a packet is then hashed in one
/// CRC call; each call ends in a fixed-cost reduction that dominates at these sizes.
const HEAD_LEN: usize = 128;

/// ICRC over the IP header (at most 60 bytes), masked by `mask_ip`, followed by
/// `udp_datagram` with the UDP checksum and BTH byte 4 masked. The headers (and as much of the
/// datagram as fits, all of a small packet) are copied once into a stack buffer and masked
/// there; the rest is hashed in place, so this never allocates.
fn icrc_masked(ip_header: &[u8], mask_ip: fn(&mut [u8]), udp_datagram: &[u8]) -> u32 {
    let mut head = [0u8; HEAD_LEN];
    let ip_len = ip_header.len();
    head[..ip_len].copy_from_slice(ip_header);
    mask_ip(&mut head[..ip_len]);
    let udp_head = udp_datagram.len().min(HEAD_LEN - ip_len);
    head[ip_len..ip_len + udp_head].copy_from_slice(&udp_datagram[..udp_head]);
    for i in UDP_BTH_VARIANT_BYTES {
        if i < udp_head {
            head[ip_len + i] = 0xFF;
        }
    }
    let mut h = start();
    h.update(&head[..ip_len + udp_head]);
    h.update(&udp_datagram[udp_head..]);
    h.finalize()
}

/// ICRC of a RoCEv2 packet carried over IPv4.
///
/// `ip_header` is the IPv4 header (20-60 bytes, as on the wire); `udp_datagram` is the UDP
/// header and everything after it up to, but not including, the ICRC.
pub fn icrc_ipv4(ip_header: &[u8], udp_datagram: &[u8]) -> u32 {
    fn mask(ip: &mut [u8]) {
        for i in IPV4_VARIANT_BYTES {
            if let Some(b) = ip.get_mut(i) {
                *b = 0xFF;
            }
        }
    }
    icrc_masked(&ip_header[..ip_header.len().min(60)], mask, udp_datagram)
}

/// ICRC of a RoCEv2 packet carried over IPv6.
///
/// `ip_header` is the 40-byte IPv6 header; `udp_datagram` as for [`icrc_ipv4`].
pub fn icrc_ipv6(ip_header: &[u8], udp_datagram: &[u8]) -> u32 {
    fn mask(ip: &mut [u8]) {
        // Version (high nibble of byte 0) stays; traffic class and flow label (the next 28
        // bits) and the hop limit (byte 7) become ones.
        if let Some(b) = ip.first_mut() {
            *b |= 0x0F;
        }
        for i in [1, 2, 3, 7] {
            if let Some(b) = ip.get_mut(i) {
                *b = 0xFF;
            }
        }
    }
    icrc_masked(&ip_header[..ip_header.len().min(40)], mask, udp_datagram)
}

/// ICRC of a packet being built: `packet` runs from the IP header (IPv4 without options or
/// IPv6, told apart by `ip_len`, 20 or 40) to just before the ICRC. The variant bytes are set
/// to ones, the whole packet is hashed in one pass with no copy, and the bytes are put back.
pub(crate) fn icrc_in_place(packet: &mut [u8], ip_len: usize) -> u32 {
    // Offsets from the IP header of the bytes seen as all ones (IPv6 byte 0 is handled
    // apart: only its low nibble is variant).
    const V4: [usize; 7] = [1, 8, 10, 11, 20 + 6, 20 + 7, 20 + 8 + 4];
    const V6: [usize; 7] = [1, 2, 3, 7, 40 + 6, 40 + 7, 40 + 8 + 4];
    let (positions, v6) = if ip_len == 20 {
        (V4, false)
    } else {
        (V6, true)
    };
    // One bounds check for all the variant bytes (the last is the furthest), not one each.
    let head = &mut packet[..positions[6] + 1];
    let byte0 = head[0];
    let saved = positions.map(|i| head[i]);
    for i in positions {
        head[i] = 0xFF;
    }
    if v6 {
        head[0] = byte0 | 0x0F;
    }
    let mut h = start();
    h.update(packet);
    let head = &mut packet[..positions[6] + 1];
    for (s, i) in saved.into_iter().zip(positions) {
        head[i] = s;
    }
    head[0] = byte0;
    h.finalize()
}

/// The ICRC as it appears on the wire (least significant byte first).
pub const fn to_wire(icrc: u32) -> [u8; 4] {
    icrc.to_le_bytes()
}

/// Reads a wire ICRC (least significant byte first).
pub const fn from_wire(bytes: [u8; 4]) -> u32 {
    u32::from_le_bytes(bytes)
}

/// A packet's ICRC as received, with the one computed over it: the trailer explaining
/// itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcrcCheck {
    /// The ICRC the frame carries.
    pub received: u32,
    /// The ICRC computed over the frame.
    pub computed: u32,
}

impl PrettyPrint for IcrcCheck {
    fn pretty_print(&self, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
        out.heading(format_args!("ICRC [{at}..{}]", at + ICRC_LEN))?;
        let verdict = if self.received == self.computed {
            "matches".to_string()
        } else {
            format!(
                "DOES NOT MATCH the computed 0x{:08x}: the packet was damaged",
                self.computed
            )
        };
        out.field(
            at,
            ICRC_LEN,
            format_args!(
                "ICRC 0x{:08x}, sent least significant byte first; {verdict}. Computed as CRC-32 over 8 x 0xFF, then IP header .. pad with the [masked] bytes set to 0xFF",
                self.received
            ),
            IcrcRole::Outside,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lrh_standin_shortcut() {
        let mut h = Hasher::new();
        h.update(&[0xFF; 8]);
        assert_eq!(h.finalize(), CRC_OF_LRH_STANDIN);
    }

    // rxe_rc_pingpong.pcap frame 16: an RC ACK, from the IP header to the end.
    static ACK_IP: [u8; 48] = [
        0x45, 0x00, 0x00, 0x30, 0x53, 0xa5, 0x40, 0x00, 0x40, 0x11, 0x5a, 0xdc, 0xc6, 0x12, 0x00,
        0x0b, 0xc6, 0x12, 0x00, 0x0c, // IPv4
        0xc1, 0x21, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00, // UDP
        0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x2f, 0xa5, 0x27, // BTH
        0x1f, 0x00, 0x00, 0x01, // AETH
        0x0d, 0x78, 0x6f, 0xf0, // ICRC, LSB first
    ];

    #[test]
    fn real_ack_icrc() {
        let crc = icrc_ipv4(&ACK_IP[..20], &ACK_IP[20..44]);
        assert_eq!(to_wire(crc), [0x0d, 0x78, 0x6f, 0xf0]);
        assert_eq!(from_wire([0x0d, 0x78, 0x6f, 0xf0]), crc);
        // The masked fields do not matter; anything else does.
        let mut v = ACK_IP;
        v[1] = 0x02; // TOS
        v[8] = 1; // TTL
        v[10] ^= 0x55; // IP checksum
        v[26] = 0x12; // UDP checksum
        v[20 + 8 + 4] = 0xC0; // FECN + BECN
        assert_eq!(icrc_ipv4(&v[..20], &v[20..44]), crc);
        v[4] ^= 1; // IP ID is covered
        assert_ne!(icrc_ipv4(&v[..20], &v[20..44]), crc);
    }

    #[test]
    fn in_place_matches_copying() {
        let mut v = ACK_IP;
        let crc = icrc_in_place(&mut v[..44], 20);
        assert_eq!(crc, icrc_ipv4(&ACK_IP[..20], &ACK_IP[20..44]));
        assert_eq!(v, ACK_IP, "the variant bytes are put back");
        // IPv6: any 40-byte header, a UDP header, BTH and 300 bytes of payload.
        let mut p6: Vec<u8> = (0..40 + 8 + 12 + 300).map(|i| (i * 7 + 3) as u8).collect();
        p6[0] = 0x6A;
        let copy = p6.clone();
        let crc = icrc_in_place(&mut p6, 40);
        assert_eq!(crc, icrc_ipv6(&copy[..40], &copy[40..]));
        assert_eq!(p6, copy);
    }

    #[test]
    fn short_input_does_not_panic() {
        let _ = icrc_ipv4(&[], &[]);
        let _ = icrc_ipv6(&[0x60], &[1, 2, 3]);
        let _ = icrc_ipv4(&[0u8; 70], &[0u8; 9]);
    }
}
