//! Whole RoCEv2 frames: Ethernet (optionally one 802.1Q tag), IPv4 or IPv6, UDP to port
//! 4791, the RoCE packet, pad and ICRC (RoCEv2 Annex A17.3).
//!
//! ```text
//! | Ethernet 14 | [802.1Q 4] | IPv4 20-60 / IPv6 40 | UDP 8 | BTH 12 | ext hdrs | payload | pad 0-3 | ICRC 4 |
//! ```
//! What is taken, and what is left to the kernel (`bpf/xroce_xdp.c` steers the same set):
//! - IPv4 options are legal IP and the ICRC covers the whole IPv4 header (only TOS, TTL and
//!   the checksum are masked), so a frame with options is parsed and verified. Options are
//!   never emitted.
//! - IPv6 extension headers are refused ([`WireError::Ipv6ExtensionHeaders`]): the ICRC's
//!   masks name only fixed IPv6 header fields, while hop-by-hop options and routing headers
//!   change in flight, so the ICRC cannot be verified over them.
//! - Stacked VLAN tags (QinQ) and 802.1ad service tags are refused: an address vector has
//!   one 802.1Q tag, so a reply could not go back the way the frame came.
//!
//! Ethernet, VLAN, IP and UDP headers are parsed and written with `etherparse`; the RoCE
//! headers with the views in this module's siblings.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use etherparse::{
    EtherType, Ethernet2Header, Ethernet2HeaderSlice, IpNumber, Ipv4HeaderSlice, Ipv6FlowLabel,
    Ipv6Header, Ipv6HeaderSlice, SingleVlanHeader, SingleVlanHeaderSlice, UdpHeader,
    UdpHeaderSlice, VlanId, VlanPcp,
};

use super::bth::BTH_LEN;
use super::error::{Layer, Result, WireError};
use super::icrc::{self, IcrcCheck, ICRC_LEN};
use super::opcode::Opcode;
use super::packet::PacketRepr;
use super::pretty::{Explainer, IcrcRole, PrettyPrint};
use super::psn::Psn;
use super::reth::RethRepr;

/// The IANA UDP port of RoCEv2.
pub const ROCEV2_UDP_PORT: u16 = 4791;
/// Ethernet II header length.
pub const ETH_LEN: usize = 14;
/// 802.1Q tag length.
pub const VLAN_LEN: usize = 4;
/// IPv4 header length without options.
pub const IPV4_LEN: usize = 20;
/// IPv6 header length.
pub const IPV6_LEN: usize = 40;
/// UDP header length.
pub const UDP_LEN: usize = 8;

/// An IEEE 802.1Q tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct VlanTag {
    /// Priority code point (3 bits); RoCE deployments map traffic classes onto it (PFC).
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN identifier (12 bits).
    pub vid: u16,
}

/// The Ethernet header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EthRepr {
    /// Destination MAC.
    pub dst: [u8; 6],
    /// Source MAC.
    pub src: [u8; 6],
    /// The 802.1Q tag, if the frame has one.
    pub vlan: Option<VlanTag>,
}

impl EthRepr {
    /// Header length: 14, or 18 with a VLAN tag.
    pub fn buffer_len(&self) -> usize {
        ETH_LEN + if self.vlan.is_some() { VLAN_LEN } else { 0 }
    }
}

/// The IP header of a frame, with the fields RoCEv2 lets a sender choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpRepr {
    /// IPv4, protocol UDP, never fragmented. Options a received frame carried are in
    /// [`ParsedFrame::ipv4_options`]; emit writes none.
    V4 {
        /// Source address.
        src: Ipv4Addr,
        /// Destination address.
        dst: Ipv4Addr,
        /// The whole TOS byte (DSCP << 2 | ECN). ICRC-masked.
        tos: u8,
        /// Time to live. ICRC-masked.
        ttl: u8,
        /// Identification. Covered by the ICRC (rxe varies it per packet).
        ident: u16,
        /// Don't Fragment (rxe sets it).
        dont_fragment: bool,
    },
    /// IPv6 without extension headers, next header UDP.
    V6 {
        /// Source address.
        src: Ipv6Addr,
        /// Destination address.
        dst: Ipv6Addr,
        /// Traffic class (DSCP << 2 | ECN). ICRC-masked.
        traffic_class: u8,
        /// Flow label (20 bits). ICRC-masked.
        flow_label: u32,
        /// Hop limit. ICRC-masked.
        hop_limit: u8,
    },
}

impl IpRepr {
    /// Header length [`FrameRepr::emit`] writes: 20 or 40.
    pub fn buffer_len(&self) -> usize {
        match self {
            IpRepr::V4 { .. } => IPV4_LEN,
            IpRepr::V6 { .. } => IPV6_LEN,
        }
    }
}

/// A whole RoCEv2 frame as plain fields. The UDP destination port is always 4791 and the
/// UDP checksum is emitted as 0 (RoCEv2 allows it; rxe does the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRepr<'a> {
    /// Ethernet header.
    pub eth: EthRepr,
    /// IP header fields.
    pub ip: IpRepr,
    /// UDP source port (any value; rxe derives it from the QP numbers, see
    /// [`rxe_udp_source_port`]).
    pub udp_src_port: u16,
    /// The RoCE packet (BTH to payload).
    pub roce: PacketRepr<'a>,
}

/// Where each part starts inside a parsed frame (byte offsets from the frame's start).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FrameOffsets {
    /// IP header.
    pub ip: usize,
    /// UDP header.
    pub udp: usize,
    /// BTH.
    pub bth: usize,
    /// First payload byte (after the extension headers).
    pub payload: usize,
    /// First pad byte.
    pub pad: usize,
    /// ICRC.
    pub icrc: usize,
    /// End of the IP packet; bytes after it are Ethernet padding/trailer.
    pub end: usize,
}

/// A frame as parsed, with what was found on the wire beyond the [`FrameRepr`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedFrame<'a> {
    /// The frame's fields.
    pub repr: FrameRepr<'a>,
    /// ICRC carried by the frame.
    pub icrc_received: u32,
    /// ICRC computed over the frame.
    pub icrc_computed: u32,
    /// UDP checksum as received (not validated: RoCEv2 senders often send 0, and over veth
    /// a kernel sender's checksum is only a partial sum).
    pub udp_checksum: u16,
    /// BTH byte 4 as received: FECN, BECN and the six reserved bits (which some hardware
    /// sets; the ICRC masks the whole byte, so they are not validated).
    pub bth_byte4: u8,
    /// IPv4 header checksum as received (`None` for IPv6).
    pub ipv4_checksum: Option<u16>,
    /// Whether the IPv4 header checksum is right (always true for IPv6).
    pub ipv4_checksum_ok: bool,
    /// IPv4 options as received (empty without options, and for IPv6).
    pub ipv4_options: &'a [u8],
    /// Offsets of the parts.
    pub offsets: FrameOffsets,
    /// Bytes after the IP packet (Ethernet minimum-size padding).
    pub trailer_len: usize,
}

impl<'a> ParsedFrame<'a> {
    /// True when the received ICRC is the computed one.
    pub fn icrc_ok(&self) -> bool {
        self.icrc_received == self.icrc_computed
    }

    /// Re-emits the frame exactly as received when it was well formed: the repr, the IPv4
    /// options, the received UDP checksum and BTH byte 4 (reserved bits included). The ICRC
    /// masks the last two, so apart from the options the emitted ICRC is the repr's.
    pub fn emit_as_received(&self, buf: &mut [u8]) -> Result<usize> {
        let n = self.repr.emit(buf)?;
        let ip = self.repr.eth.buffer_len();
        let opts = self.ipv4_options;
        let n = if opts.is_empty() {
            n
        } else {
            let len = n + opts.len();
            if buf.len() < len {
                return Err(WireError::BufferTooSmall {
                    need: len,
                    have: buf.len(),
                });
            }
            // Shift UDP onwards, put the options in, and fix IHL, total length, checksum.
            buf.copy_within(ip + IPV4_LEN..n, ip + IPV4_LEN + opts.len());
            buf[ip + IPV4_LEN..ip + IPV4_LEN + opts.len()].copy_from_slice(opts);
            let header_len = IPV4_LEN + opts.len();
            buf[ip] = 0x40 | (header_len / 4) as u8;
            let total = usize::from(u16::from_be_bytes([buf[ip + 2], buf[ip + 3]])) + opts.len();
            let total = u16::try_from(total).map_err(|_| WireError::TooLarge { len: total })?;
            buf[ip + 2..ip + 4].copy_from_slice(&total.to_be_bytes());
            buf[ip + 10..ip + 12].fill(0);
            let ck = ipv4_checksum_any(&buf[ip..ip + header_len]);
            buf[ip + 10..ip + 12].copy_from_slice(&ck.to_be_bytes());
            let icrc_at = len - ICRC_LEN;
            let crc = icrc::icrc_ipv4(&buf[ip..ip + header_len], &buf[ip + header_len..icrc_at]);
            buf[icrc_at..len].copy_from_slice(&icrc::to_wire(crc));
            len
        };
        let udp = self.offsets.udp;
        buf[udp + 6..udp + 8].copy_from_slice(&self.udp_checksum.to_be_bytes());
        buf[udp + UDP_LEN + 4] = self.bth_byte4;
        Ok(n)
    }
}

/// What [`locate`] finds below the RoCE packet.
struct Located<'a> {
    eth: EthRepr,
    ip: IpRepr,
    ip_header: &'a [u8],
    udp_datagram: &'a [u8], // UDP header .. before the ICRC
    udp_src_port: u16,
    udp_checksum: u16,
    ipv4_checksum: Option<u16>,
    icrc_received: u32,
    offsets: FrameOffsets,
    trailer_len: usize,
}

impl Located<'_> {
    fn icrc_computed(&self) -> u32 {
        match self.ip {
            IpRepr::V4 { .. } => icrc::icrc_ipv4(self.ip_header, self.udp_datagram),
            IpRepr::V6 { .. } => icrc::icrc_ipv6(self.ip_header, self.udp_datagram),
        }
    }
}

fn truncated(layer: Layer, need: usize, have: usize) -> WireError {
    WireError::Truncated { layer, need, have }
}

/// Parses Ethernet, VLAN, IP and UDP, and splits off the ICRC: one step per layer, each
/// checking the lengths it slices by.
///
/// Always inlined (as are `parse_frame_verified` and `PacketRepr::parse`) so the receive path
/// builds its reprs in place: returning them through `Result`s copied ~200 bytes per packet.
/// A hint is not enough: in the `xroce` binary, where `dump` and `conform` parse too, LLVM
/// kept them out of line even with LTO (the engine alone ran 7-8 % slower).
#[inline(always)]
fn locate(frame: &[u8]) -> Result<Located<'_>> {
    let (eth, ether_type, ip_start) = locate_ethernet(frame)?;
    let rest = &frame[ip_start..];
    let ip = match ether_type {
        EtherType::IPV4 => locate_ipv4(rest)?,
        EtherType::IPV6 => locate_ipv6(rest)?,
        other => {
            return Err(WireError::NotIp {
                ether_type: other.0,
            })
        }
    };
    let udp = locate_udp(ip.payload)?;
    let udp_off = ip_start + ip.header.len();
    let end = udp_off + ip.payload.len();
    Ok(Located {
        eth,
        ip: ip.repr,
        ip_header: ip.header,
        udp_datagram: &ip.payload[..udp.icrc_at],
        udp_src_port: udp.src_port,
        udp_checksum: udp.checksum,
        ipv4_checksum: ip.checksum,
        icrc_received: udp.icrc_received,
        offsets: FrameOffsets {
            ip: ip_start,
            udp: udp_off,
            bth: udp_off + UDP_LEN,
            payload: 0,
            pad: 0,
            icrc: udp_off + udp.icrc_at,
            end,
        },
        trailer_len: frame.len() - end,
    })
}

/// The Ethernet header and at most one 802.1Q tag: the repr, the EtherType they carry and
/// where the IP header starts. Service tags and stacked tags are refused.
#[inline]
fn locate_ethernet(frame: &[u8]) -> Result<(EthRepr, EtherType, usize)> {
    let eth = Ethernet2HeaderSlice::from_slice(frame)
        .map_err(|_| truncated(Layer::Ethernet, ETH_LEN, frame.len()))?;
    let mut ether_type = eth.ether_type();
    let mut at = ETH_LEN;
    let mut vlan = None;
    if is_service_tpid(ether_type) {
        return Err(WireError::ServiceVlanTag { tpid: ether_type.0 });
    }
    if ether_type == EtherType::VLAN_TAGGED_FRAME {
        let tag = SingleVlanHeaderSlice::from_slice(&frame[at..])
            .map_err(|_| truncated(Layer::Vlan, VLAN_LEN, frame.len() - at))?;
        vlan = Some(VlanTag {
            pcp: tag.priority_code_point().value(),
            dei: tag.drop_eligible_indicator(),
            vid: tag.vlan_identifier().value(),
        });
        ether_type = tag.ether_type();
        at += VLAN_LEN;
        if ether_type == EtherType::VLAN_TAGGED_FRAME || is_service_tpid(ether_type) {
            return Err(WireError::StackedVlan {
                ether_type: ether_type.0,
            });
        }
    }
    let repr = EthRepr {
        dst: eth.destination(),
        src: eth.source(),
        vlan,
    };
    Ok((repr, ether_type, at))
}

/// The IP layer of a frame as found: its repr, header and payload as on the wire, and the
/// IPv4 header checksum as received.
struct IpPart<'a> {
    repr: IpRepr,
    header: &'a [u8],
    /// From the end of the header to the IP total length (Ethernet padding cut off).
    payload: &'a [u8],
    checksum: Option<u16>,
}

/// An IPv4 header (options allowed) carrying a whole, unfragmented UDP datagram.
#[inline]
fn locate_ipv4(rest: &[u8]) -> Result<IpPart<'_>> {
    let hdr = Ipv4HeaderSlice::from_slice(rest).map_err(|e| {
        use etherparse::err::ipv4::{HeaderError, HeaderSliceError};
        match e {
            HeaderSliceError::Len(l) => truncated(Layer::Ipv4, l.required_len, l.len),
            HeaderSliceError::Content(HeaderError::UnexpectedVersion { version_number }) => {
                WireError::IpVersionMismatch {
                    version: version_number,
                    expected: 4,
                }
            }
            HeaderSliceError::Content(HeaderError::HeaderLengthSmallerThanHeader { ihl }) => {
                WireError::BadIpv4Ihl { ihl }
            }
        }
    })?;
    // IPv4 options (IHL 6-15) are legal IP; the ICRC covers them (see the module doc).
    let header_len = hdr.slice().len();
    let total = usize::from(hdr.total_len());
    if total < header_len {
        return Err(WireError::BadIpLength {
            ip_len: total,
            header_len,
        });
    }
    if total > rest.len() {
        return Err(truncated(Layer::Ipv4, total, rest.len()));
    }
    if hdr.more_fragments() || hdr.fragments_offset().value() != 0 {
        return Err(WireError::Fragmented {
            offset: hdr.fragments_offset().value(),
        });
    }
    if hdr.protocol() != IpNumber::UDP {
        return Err(WireError::NotUdp {
            protocol: hdr.protocol().0,
        });
    }
    Ok(IpPart {
        repr: IpRepr::V4 {
            src: hdr.source_addr(),
            dst: hdr.destination_addr(),
            tos: rest[1],
            ttl: hdr.ttl(),
            ident: hdr.identification(),
            dont_fragment: hdr.dont_fragment(),
        },
        header: hdr.slice(),
        payload: &rest[header_len..total],
        checksum: Some(hdr.header_checksum()),
    })
}

/// An IPv6 header whose next header is UDP (extension headers are refused, by name when
/// they lead to RoCEv2).
#[inline]
fn locate_ipv6(rest: &[u8]) -> Result<IpPart<'_>> {
    let hdr = Ipv6HeaderSlice::from_slice(rest).map_err(|e| {
        use etherparse::err::ipv6::{HeaderError, HeaderSliceError};
        match e {
            HeaderSliceError::Len(l) => truncated(Layer::Ipv6, l.required_len, l.len),
            HeaderSliceError::Content(HeaderError::UnexpectedVersion { version_number }) => {
                WireError::IpVersionMismatch {
                    version: version_number,
                    expected: 6,
                }
            }
        }
    })?;
    let total = IPV6_LEN + usize::from(hdr.payload_length());
    if total > rest.len() {
        return Err(truncated(Layer::Ipv6, total, rest.len()));
    }
    if hdr.next_header() != IpNumber::UDP {
        return Err(ipv6_not_udp(hdr.next_header().0, &rest[..total]));
    }
    Ok(IpPart {
        repr: IpRepr::V6 {
            src: hdr.source_addr(),
            dst: hdr.destination_addr(),
            traffic_class: hdr.traffic_class(),
            flow_label: hdr.flow_label().value(),
            hop_limit: hdr.hop_limit(),
        },
        header: hdr.slice(),
        payload: &rest[IPV6_LEN..total],
        checksum: None,
    })
}

/// The UDP header of a RoCEv2 datagram and its ICRC trailer.
struct UdpPart {
    src_port: u16,
    checksum: u16,
    icrc_received: u32,
    /// Where the ICRC starts in the datagram (after the UDP header, BTH onwards and pad).
    icrc_at: usize,
}

/// UDP to port 4791 filling the IP payload exactly, with room for a BTH and the ICRC.
#[inline]
fn locate_udp(datagram: &[u8]) -> Result<UdpPart> {
    let udp = UdpHeaderSlice::from_slice(datagram)
        .map_err(|_| truncated(Layer::Udp, UDP_LEN, datagram.len()))?;
    if udp.destination_port() != ROCEV2_UDP_PORT {
        return Err(WireError::NotRoce {
            dst_port: udp.destination_port(),
        });
    }
    if usize::from(udp.length()) != datagram.len() {
        return Err(WireError::BadUdpLength {
            udp_len: udp.length(),
            ip_payload_len: datagram.len(),
        });
    }
    let roce_len = datagram.len() - UDP_LEN;
    if roce_len < BTH_LEN {
        return Err(truncated(Layer::Bth, BTH_LEN, roce_len));
    }
    if roce_len < BTH_LEN + ICRC_LEN {
        return Err(truncated(Layer::Icrc, BTH_LEN + ICRC_LEN, roce_len));
    }
    let icrc_at = datagram.len() - ICRC_LEN;
    let mut icrc_bytes = [0u8; 4];
    icrc_bytes.copy_from_slice(&datagram[icrc_at..]);
    Ok(UdpPart {
        src_port: udp.source_port(),
        checksum: udp.checksum(),
        icrc_received: icrc::from_wire(icrc_bytes),
        icrc_at,
    })
}

/// TPIDs of 802.1ad service tags (0x88A8) and the pre-standard QinQ 0x9100.
fn is_service_tpid(t: EtherType) -> bool {
    t == EtherType::PROVIDER_BRIDGING || t == EtherType::VLAN_DOUBLE_TAGGED_FRAME
}

/// IPv6 extension headers that `bpf/xroce_xdp.c` walks (hop-by-hop, routing, destination
/// options), at most this many, as it does.
const IPV6_EXT_HEADERS: [u8; 3] = [0, 43, 60];
const IPV6_MAX_EXT_HEADERS: usize = 3;

/// The error for an IPv6 packet whose next header is not UDP: [`WireError::Ipv6ExtensionHeaders`]
/// when extension headers lead to UDP port 4791 (RoCEv2 that xroce leaves to the kernel),
/// else what the packet is. `packet` is the IPv6 packet (header and payload).
fn ipv6_not_udp(first: u8, packet: &[u8]) -> WireError {
    let mut next = first;
    let mut at = IPV6_LEN;
    for _ in 0..IPV6_MAX_EXT_HEADERS {
        if !IPV6_EXT_HEADERS.contains(&next) {
            break;
        }
        let Some(&[nh, len]) = packet
            .get(at..at + 2)
            .and_then(|b| <&[u8; 2]>::try_from(b).ok())
        else {
            return truncated(Layer::Ipv6, at + 2, packet.len());
        };
        next = nh;
        at += (usize::from(len) + 1) * 8;
    }
    if next != IpNumber::UDP.0 {
        return WireError::NotUdp { protocol: next };
    }
    let Some(udp) = packet.get(at..at + UDP_LEN) else {
        return truncated(Layer::Udp, UDP_LEN, packet.len().saturating_sub(at));
    };
    let dst_port = u16::from_be_bytes([udp[2], udp[3]]);
    if dst_port != ROCEV2_UDP_PORT {
        return WireError::NotRoce { dst_port };
    }
    WireError::Ipv6ExtensionHeaders {
        first,
        len: at - IPV6_LEN,
    }
}

/// The ICRC a frame carries and the one computed over it, needing only Ethernet/IP/UDP to
/// be well formed (the RoCE headers may be anything). `xroce dump` uses it to say whether a
/// frame that does not parse was damaged in transit.
pub fn frame_icrc(frame: &[u8]) -> Result<(u32, u32)> {
    let loc = locate(frame)?;
    Ok((loc.icrc_received, loc.icrc_computed()))
}

/// Parses a frame, computing but not enforcing the ICRC (see [`ParsedFrame::icrc_ok`]).
///
/// Errors: anything that is not Ethernet/IP/UDP to port 4791, and any malformed header or
/// length ([`WireError`]). A bad ICRC is not an error here.
pub fn parse_frame(frame: &[u8]) -> Result<ParsedFrame<'_>> {
    let loc = locate(frame)?;
    let icrc_computed = loc.icrc_computed();
    let roce = PacketRepr::parse(&loc.udp_datagram[UDP_LEN..])?;
    let mut offsets = loc.offsets;
    offsets.payload = offsets.bth + roce.header_len();
    offsets.pad = offsets.payload + roce.payload.len();
    Ok(ParsedFrame {
        repr: FrameRepr {
            eth: loc.eth,
            ip: loc.ip,
            udp_src_port: loc.udp_src_port,
            roce,
        },
        icrc_received: loc.icrc_received,
        icrc_computed,
        udp_checksum: loc.udp_checksum,
        bth_byte4: loc.udp_datagram[UDP_LEN + 4],
        ipv4_checksum: loc.ipv4_checksum,
        // Only checked here, for tools: the engine's receive path does not look at it.
        ipv4_checksum_ok: loc.ipv4_checksum.is_none_or(|c| {
            c == match <&[u8; IPV4_LEN]>::try_from(loc.ip_header) {
                Ok(h) => ipv4_header_checksum(h),
                Err(_) => ipv4_checksum_any(loc.ip_header),
            }
        }),
        ipv4_options: match loc.ip {
            IpRepr::V4 { .. } => loc.ip_header.get(IPV4_LEN..).unwrap_or(&[]),
            IpRepr::V6 { .. } => &[],
        },
        offsets,
        trailer_len: loc.trailer_len,
    })
}

/// The BTH destination QPN of a RoCEv2 frame, found without parsing the rest of the frame
/// or checking its ICRC: what a device with several engine shards steers by. `None` if the
/// frame is not RoCEv2 or too short for a BTH.
pub fn frame_dest_qpn(frame: &[u8]) -> Option<u32> {
    let loc = locate(frame).ok()?;
    let bth = crate::wire::bth::Bth::new_checked(loc.udp_datagram.get(UDP_LEN..)?).ok()?;
    Some(bth.dest_qp())
}

/// The destination IP address of an Ethernet frame carrying IPv4 or IPv6 (after at most one
/// 802.1Q tag), read at its fixed offset without parsing anything else: what the progress
/// round looks at, for every frame the engine emits, to keep frames to the device's own GIDs
/// (loopback). `None` for anything else or a frame too short.
#[inline]
pub fn frame_dest_ip(frame: &[u8]) -> Option<std::net::IpAddr> {
    let ether_type_at =
        |at: usize| Some(u16::from_be_bytes(frame.get(at..at + 2)?.try_into().ok()?));
    let mut ip = ETH_LEN;
    let mut ether_type = ether_type_at(ETH_LEN - 2)?;
    if ether_type == EtherType::VLAN_TAGGED_FRAME.0 {
        ether_type = ether_type_at(ETH_LEN + VLAN_LEN - 2)?;
        ip += VLAN_LEN;
    }
    match EtherType(ether_type) {
        EtherType::IPV4 => {
            let dst: [u8; 4] = frame.get(ip + 16..ip + 20)?.try_into().ok()?;
            Some(Ipv4Addr::from(dst).into())
        }
        EtherType::IPV6 => {
            let dst: [u8; 16] = frame.get(ip + 24..ip + 40)?.try_into().ok()?;
            Some(Ipv6Addr::from(dst).into())
        }
        _ => None,
    }
}

/// Parses a frame and rejects it with [`WireError::BadIcrc`] unless its ICRC verifies.
/// The ICRC is checked before the RoCE headers are parsed, so a damaged frame is reported
/// as damaged rather than as whatever its damaged headers look like.
#[inline(always)]
pub fn parse_frame_verified(frame: &[u8]) -> Result<FrameRepr<'_>> {
    let loc = locate(frame)?;
    let expected = loc.icrc_computed();
    if expected != loc.icrc_received {
        return Err(WireError::BadIcrc {
            expected,
            found: loc.icrc_received,
        });
    }
    let roce = PacketRepr::parse(&loc.udp_datagram[UDP_LEN..])?;
    Ok(FrameRepr {
        eth: loc.eth,
        ip: loc.ip,
        udp_src_port: loc.udp_src_port,
        roce,
    })
}

impl<'a> FrameRepr<'a> {
    /// An RC RDMA WRITE_ONLY frame over IPv4 to QP 0x11 (R_Key 7, VA 0x1000), the stand-in
    /// for a stream of engine traffic that the driver benchmarks and `xroce bench`'s raw
    /// AF_XDP ceiling send without an engine.
    pub fn rc_write_only_v4(
        eth: EthRepr,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        payload: &'a [u8],
        psn: u32,
    ) -> FrameRepr<'a> {
        let mut roce = PacketRepr::new(Opcode::RC_RDMA_WRITE_ONLY, 0x11);
        roce.reth = Some(RethRepr {
            va: 0x1000,
            rkey: 7,
            dma_len: payload.len() as u32,
        });
        roce.bth.psn = Psn::new(psn & 0xff_ffff);
        roce.payload = payload;
        FrameRepr {
            eth,
            ip: IpRepr::V4 {
                src,
                dst,
                tos: 0,
                ttl: 64,
                ident: 0,
                dont_fragment: true,
            },
            udp_src_port: 0xc000,
            roce,
        }
    }
}

impl FrameRepr<'_> {
    /// Total frame length [`emit`](Self::emit) writes.
    pub fn buffer_len(&self) -> usize {
        self.buffer_len_for(self.roce.payload.len())
    }

    /// [`buffer_len`](Self::buffer_len) with a payload of `payload_len` bytes in place of the
    /// repr's own.
    fn buffer_len_for(&self, payload_len: usize) -> usize {
        self.eth.buffer_len()
            + self.ip.buffer_len()
            + UDP_LEN
            + self.roce.buffer_len_for(payload_len)
            + ICRC_LEN
    }

    /// Writes the whole frame to the start of `buf` and returns its length: Ethernet (and
    /// VLAN), IP with total length and header checksum, UDP with length and checksum 0, the
    /// RoCE packet with PadCnt and zero pad, and the ICRC. Does not allocate.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        self.emit_with_payload(buf, self.roce.payload)
    }

    /// [`emit`](Self::emit) with `payload` in place of the repr's own: the engine lays the
    /// headers out once and fills the payload in under its region's lock, without copying
    /// the repr to change one field (that copy read back fields just stored, and stalled).
    pub(crate) fn emit_with_payload(&self, buf: &mut [u8], payload: &[u8]) -> Result<usize> {
        self.roce.check_with(payload)?;
        let len = self.buffer_len_for(payload.len());
        if buf.len() < len {
            return Err(WireError::BufferTooSmall {
                need: len,
                have: buf.len(),
            });
        }
        let udp_len = len - self.eth.buffer_len() - self.ip.buffer_len();
        let udp_len16 = u16::try_from(udp_len).map_err(|_| WireError::TooLarge { len: udp_len })?;
        let buf = &mut buf[..len];

        let ip_ether_type = match self.ip {
            IpRepr::V4 { .. } => EtherType::IPV4,
            IpRepr::V6 { .. } => EtherType::IPV6,
        };
        let mut at = 0;
        fn put(buf: &mut [u8], at: &mut usize, bytes: &[u8]) {
            buf[*at..*at + bytes.len()].copy_from_slice(bytes);
            *at += bytes.len();
        }
        let eth = Ethernet2Header {
            source: self.eth.src,
            destination: self.eth.dst,
            ether_type: match self.eth.vlan {
                None => ip_ether_type,
                Some(_) => EtherType::VLAN_TAGGED_FRAME,
            },
        };
        put(buf, &mut at, &eth.to_bytes());
        if let Some(tag) = self.eth.vlan {
            put(buf, &mut at, &vlan_header(tag, ip_ether_type)?.to_bytes());
        }
        let ip_start = at;
        match self.ip {
            IpRepr::V4 {
                src,
                dst,
                tos,
                ttl,
                ident,
                dont_fragment,
            } => {
                write_ipv4_header(
                    &mut buf[at..],
                    [src, dst],
                    tos,
                    ttl,
                    ident,
                    dont_fragment,
                    udp_len,
                )?;
                at += IPV4_LEN;
            }
            IpRepr::V6 {
                src,
                dst,
                traffic_class,
                flow_label,
                hop_limit,
            } => {
                let h = ipv6_header([src, dst], traffic_class, flow_label, hop_limit, udp_len16)?;
                put(buf, &mut at, &h.to_bytes());
            }
        }
        let udp_start = at;
        let udp = UdpHeader {
            source_port: self.udp_src_port,
            destination_port: ROCEV2_UDP_PORT,
            length: udp_len16,
            checksum: 0,
        };
        put(buf, &mut at, &udp.to_bytes());
        let roce_len = self.roce.emit_checked_with(&mut buf[at..], payload)?;
        let icrc_at = at + roce_len;
        let crc = icrc::icrc_in_place(&mut buf[ip_start..icrc_at], udp_start - ip_start);
        buf[icrc_at..icrc_at + ICRC_LEN].copy_from_slice(&icrc::to_wire(crc));
        Ok(len)
    }
}

/// The 802.1Q tag of an emitted frame, its fields checked against their widths.
#[inline]
fn vlan_header(tag: VlanTag, ether_type: EtherType) -> Result<SingleVlanHeader> {
    Ok(SingleVlanHeader {
        pcp: VlanPcp::try_new(tag.pcp).map_err(|_| WireError::FieldOutOfRange {
            field: "VLAN PCP",
            value: tag.pcp.into(),
        })?,
        drop_eligible_indicator: tag.dei,
        vlan_id: VlanId::try_new(tag.vid).map_err(|_| WireError::FieldOutOfRange {
            field: "VLAN VID",
            value: tag.vid.into(),
        })?,
        ether_type,
    })
}

/// Writes the 20-byte IPv4 header (no options) of a frame carrying `udp_len` bytes of UDP,
/// with its checksum, to the start of `out` (at least 20 bytes; [`IpRepr::V4`]'s fields;
/// `[src, dst]`).
///
/// Written by hand (as etherparse's `Ipv4Header` would lay it out; building that struct and
/// its general checksum cost more than the rest of the header) as three wide stores straight
/// into the frame: a header assembled byte by byte in a local array and then copied stalled on
/// store forwarding at every copy (the copy's wide loads read narrower stores still in flight),
/// a third of the frame emit's own time.
#[inline]
fn write_ipv4_header(
    out: &mut [u8],
    [src, dst]: [Ipv4Addr; 2],
    tos: u8,
    ttl: u8,
    ident: u16,
    dont_fragment: bool,
    udp_len: usize,
) -> Result<()> {
    let total = IPV4_LEN + udp_len;
    let total = u16::try_from(total).map_err(|_| WireError::TooLarge { len: total })?;
    let flags: u32 = if dont_fragment { 0x40 } else { 0 };
    // The checksum from the field values, not by reading the header back.
    let (s, d) = (u32::from(src), u32::from(dst));
    let sum = (0x4500 | u32::from(tos))
        + u32::from(total)
        + u32::from(ident)
        + (flags << 8)
        + (u32::from(ttl) << 8 | 17)
        + (s >> 16)
        + (s & 0xFFFF)
        + (d >> 16)
        + (d & 0xFFFF);
    // Version 4, IHL 5, TOS, total length, identification, flags (DF), fragment offset 0.
    let version_to_fragment = 0x45u64 << 56
        | u64::from(tos) << 48
        | u64::from(total) << 32
        | u64::from(ident) << 16
        | u64::from(flags) << 8;
    // TTL, protocol UDP, header checksum.
    let ttl_to_checksum = u32::from(ttl) << 24 | 17 << 16 | u32::from(ones_complement(sum));
    let addresses = u64::from(s) << 32 | u64::from(d);
    out[..8].copy_from_slice(&version_to_fragment.to_be_bytes());
    out[8..12].copy_from_slice(&ttl_to_checksum.to_be_bytes());
    out[12..IPV4_LEN].copy_from_slice(&addresses.to_be_bytes());
    Ok(())
}

/// The IPv6 header of a frame carrying `udp_len` bytes of UDP ([`IpRepr::V6`]'s fields;
/// `[src, dst]`).
#[inline]
fn ipv6_header(
    [src, dst]: [Ipv6Addr; 2],
    traffic_class: u8,
    flow_label: u32,
    hop_limit: u8,
    udp_len: u16,
) -> Result<Ipv6Header> {
    Ok(Ipv6Header {
        traffic_class,
        flow_label: Ipv6FlowLabel::try_new(flow_label).map_err(|_| WireError::FieldOutOfRange {
            field: "IPv6 flow label",
            value: flow_label.into(),
        })?,
        payload_length: udp_len,
        next_header: IpNumber::UDP,
        hop_limit,
        source: src.octets(),
        destination: dst.octets(),
    })
}

/// The IPv4 header checksum (RFC 791): the ones' complement of the ones' complement sum of
/// the header's 16-bit words, the checksum field (bytes 10-11) counted as zero.
/// Fixed at 20 bytes (options are never emitted) so that the loop unrolls.
fn ipv4_header_checksum(header: &[u8; IPV4_LEN]) -> u16 {
    let mut sum = 0u32;
    for (i, w) in header.chunks_exact(2).enumerate() {
        if i != 5 {
            sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
        }
    }
    ones_complement(sum)
}

/// The IPv4 header checksum of a header of any length (with options).
fn ipv4_checksum_any(header: &[u8]) -> u16 {
    let mut sum = 0u32;
    for (i, w) in header.chunks_exact(2).enumerate() {
        if i != 5 {
            sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
        }
    }
    ones_complement(sum)
}

/// Folds a sum of 16-bit words to 16 bits with end-around carry and complements it.
fn ones_complement(mut sum: u32) -> u16 {
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

/// The UDP source port rxe uses for a QP pair (`rxe_get_udp_sport`-equivalent): the 20-bit
/// fold of `src_qpn * dst_qpn`, squeezed into 0xC000..=0xFFFF. Any source port is valid on
/// the wire; this one spreads QPs over ECMP paths the way rxe does.
pub fn rxe_udp_source_port(src_qpn: u32, dst_qpn: u32) -> u16 {
    let mut v = u64::from(src_qpn) * u64::from(dst_qpn);
    v ^= v >> 20;
    v ^= v >> 40;
    let fl = (v & 0xF_FFFF) as u32;
    (0xC000 | ((fl & 0x3FFF) ^ ((fl & 0xF_C000) >> 14))) as u16
}

impl PrettyPrint for EthRepr {
    fn pretty_print(&self, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
        let mac = |m: &[u8; 6]| {
            let [a, b, c, d, e, f] = *m;
            format!("{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{f:02x}")
        };
        let none = IcrcRole::Outside;
        out.heading(format_args!("Ethernet [{at}..{}]", at + self.buffer_len()))?;
        out.field(
            at,
            6,
            format_args!("destination MAC {}", mac(&self.dst)),
            none,
        )?;
        out.field(
            at + 6,
            6,
            format_args!("source MAC {}", mac(&self.src)),
            none,
        )?;
        if let Some(v) = self.vlan {
            out.field(at + 12, 2, "TPID 0x8100: an 802.1Q VLAN tag follows", none)?;
            out.field(
                at + 14,
                2,
                format_args!(
                    "PCP {} (priority; PFC class), DEI {}, VLAN {}",
                    v.pcp,
                    u8::from(v.dei),
                    v.vid
                ),
                none,
            )?;
        }
        let ether_type_at = at + self.buffer_len() - 2;
        let name = match EtherType(out.be16(ether_type_at)) {
            EtherType::IPV4 => "IPv4".to_string(),
            EtherType::IPV6 => "IPv6".to_string(),
            other => format!("0x{:04x}", other.0),
        };
        out.field(ether_type_at, 2, format_args!("EtherType = {name}"), none)
    }
}

/// The IP header; what the repr does not hold (lengths, checksum, options) is read from the
/// explainer's frame.
/// The IP header; what the repr does not hold (lengths, checksum, options) is read from the
/// explainer's frame.
impl PrettyPrint for IpRepr {
    fn pretty_print(&self, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
        match self {
            IpRepr::V4 { .. } => explain_ipv4(self, at, out),
            IpRepr::V6 { .. } => explain_ipv6(self, at, out),
        }
    }
}

fn explain_ipv4(ip: &IpRepr, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
    let (covered, masked) = (IcrcRole::Covered, IcrcRole::Masked);
    let IpRepr::V4 {
        src,
        dst,
        tos,
        ttl,
        ident,
        dont_fragment,
    } = *ip
    else {
        return Ok(());
    };
    let header_len = usize::from(out.bytes(at, 1).first().map_or(5, |b| b & 0xF)) * 4;
    let header = out.bytes(at, header_len);
    out.heading(format_args!(
        "IPv4 [{at}..{}]  (the ICRC covers it, but sees the variant fields as 0xFF)",
        at + header_len
    ))?;
    let ihl = if header_len == IPV4_LEN {
        "version 4, IHL 5 (20-byte header, no options)".to_string()
    } else {
        format!(
            "version 4, IHL {} ({header_len}-byte header with options)",
            header_len / 4
        )
    };
    out.field(at, 1, ihl, covered)?;
    out.field(
        at + 1,
        1,
        format_args!(
            "TOS: DSCP {}, ECN {} (routers may rewrite it)",
            tos >> 2,
            tos & 3
        ),
        masked,
    )?;
    let total = out.be16(at + 2);
    out.field(at + 2, 2, format_args!("total length {total}"), covered)?;
    out.field(
        at + 4,
        2,
        format_args!("identification 0x{ident:04x}"),
        covered,
    )?;
    let df = if dont_fragment {
        "DF set (RoCE is never fragmented)"
    } else {
        "DF clear"
    };
    out.field(
        at + 6,
        2,
        format_args!("flags: {df}, fragment offset 0"),
        covered,
    )?;
    out.field(
        at + 8,
        1,
        format_args!("TTL {ttl} (decremented per hop)"),
        masked,
    )?;
    out.field(at + 9, 1, "protocol 17 = UDP", covered)?;
    let checksum = out.be16(at + 10);
    let ok = if checksum == ipv4_checksum_any(header) {
        "ok"
    } else {
        "WRONG"
    };
    out.field(
        at + 10,
        2,
        format_args!("header checksum 0x{checksum:04x} ({ok}; recomputed per hop)"),
        masked,
    )?;
    out.field(at + 12, 4, format_args!("source {src}"), covered)?;
    out.field(at + 16, 4, format_args!("destination {dst}"), covered)?;
    if header_len > IPV4_LEN {
        let options = header_len - IPV4_LEN;
        out.field(
            at + IPV4_LEN,
            options,
            format_args!("{options} bytes of IPv4 options"),
            covered,
        )?;
    }
    Ok(())
}

fn explain_ipv6(ip: &IpRepr, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
    let (covered, masked) = (IcrcRole::Covered, IcrcRole::Masked);
    let IpRepr::V6 {
        src,
        dst,
        traffic_class,
        flow_label,
        hop_limit,
    } = *ip
    else {
        return Ok(());
    };
    out.heading(format_args!(
        "IPv6 [{at}..{}]  (the ICRC covers it, but sees the variant fields as ones)",
        at + IPV6_LEN
    ))?;
    out.field(
        at,
        4,
        format_args!(
            "version 6, traffic class 0x{traffic_class:02x}, flow label 0x{flow_label:05x}"
        ),
        IcrcRole::Partly("TC and flow label masked"),
    )?;
    let payload_len = out.be16(at + 4);
    out.field(
        at + 4,
        2,
        format_args!("payload length {payload_len}"),
        covered,
    )?;
    out.field(at + 6, 1, "next header 17 = UDP", covered)?;
    out.field(at + 7, 1, format_args!("hop limit {hop_limit}"), masked)?;
    out.field(at + 8, 16, format_args!("source {src}"), covered)?;
    out.field(at + 24, 16, format_args!("destination {dst}"), covered)
}

/// The UDP header of a RoCEv2 frame (port 4791; the ICRC protects the packet, so the
/// checksum may be 0).
impl PrettyPrint for UdpHeader {
    fn pretty_print(&self, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
        let covered = IcrcRole::Covered;
        out.heading(format_args!("UDP [{at}..{}]", at + UDP_LEN))?;
        out.field(
            at,
            2,
            format_args!(
                "source port {} (any value; rxe hashes the QP numbers into it for ECMP)",
                self.source_port
            ),
            covered,
        )?;
        let dst = if self.destination_port == ROCEV2_UDP_PORT {
            "destination port 4791 = RoCEv2".to_string()
        } else {
            format!("destination port {}", self.destination_port)
        };
        out.field(at + 2, 2, dst, covered)?;
        out.field(
            at + 4,
            2,
            format_args!("length {} (UDP header + RoCE packet + ICRC)", self.length),
            covered,
        )?;
        let checksum = if self.checksum == 0 {
            "checksum 0 = not used (the ICRC protects the packet)".to_string()
        } else {
            format!("checksum 0x{:04x} (not validated)", self.checksum)
        };
        out.field(at + 6, 2, checksum, IcrcRole::Masked)
    }
}

/// Every header of the frame in wire order, then the ICRC and any Ethernet padding.
impl PrettyPrint for ParsedFrame<'_> {
    fn pretty_print(&self, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
        let o = &self.offsets;
        self.repr.eth.pretty_print(at, out)?;
        self.repr.ip.pretty_print(at + o.ip, out)?;
        let udp = UdpHeader {
            source_port: self.repr.udp_src_port,
            destination_port: ROCEV2_UDP_PORT,
            length: out.be16(at + o.udp + 4),
            checksum: self.udp_checksum,
        };
        udp.pretty_print(at + o.udp, out)?;
        self.repr.roce.pretty_print(at + o.bth, out)?;
        let icrc = IcrcCheck {
            received: self.icrc_received,
            computed: self.icrc_computed,
        };
        icrc.pretty_print(at + o.icrc, out)?;
        if self.trailer_len > 0 {
            out.heading(format_args!(
                "Ethernet padding: {} bytes after the IP packet",
                self.trailer_len
            ))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{AethRepr, Opcode, Psn, Syndrome};

    // rxe_rc_pingpong.pcap frame 16: an RC ACK from 198.18.0.11 to 198.18.0.12.
    static ACK: [u8; 62] = [
        0x52, 0x54, 0x00, 0x00, 0x00, 0x12, 0x52, 0x54, 0x00, 0x00, 0x00, 0x11, 0x08,
        0x00, // Ethernet
        0x45, 0x00, 0x00, 0x30, 0x53, 0xa5, 0x40, 0x00, 0x40, 0x11, 0x5a, 0xdc, 0xc6, 0x12, 0x00,
        0x0b, 0xc6, 0x12, 0x00, 0x0c, // IPv4
        0xc1, 0x21, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00, // UDP
        0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x2f, 0xa5, 0x27, // BTH
        0x1f, 0x00, 0x00, 0x01, // AETH
        0x0d, 0x78, 0x6f, 0xf0, // ICRC
    ];

    #[test]
    fn parse_real_ack() {
        let p = parse_frame(&ACK).unwrap();
        assert!(p.icrc_ok());
        assert!(p.ipv4_checksum_ok);
        let f = p.repr;
        assert_eq!(f.eth.dst, [0x52, 0x54, 0, 0, 0, 0x12]);
        assert_eq!(
            f.ip,
            IpRepr::V4 {
                src: Ipv4Addr::new(198, 18, 0, 11),
                dst: Ipv4Addr::new(198, 18, 0, 12),
                tos: 0,
                ttl: 64,
                ident: 0x53a5,
                dont_fragment: true
            }
        );
        assert_eq!(f.udp_src_port, 0xc121);
        assert_eq!(f.roce.bth.opcode, Opcode::RC_ACKNOWLEDGE);
        assert_eq!(f.roce.bth.psn, Psn::new(0x2fa527));
        assert_eq!(
            f.roce.aeth,
            Some(AethRepr {
                syndrome: Syndrome::ACK_UNLIMITED,
                msn: 1
            })
        );
        assert_eq!(p.offsets.icrc, 58);
        let mut out = [0u8; 62];
        assert_eq!(f.emit(&mut out), Ok(62));
        assert_eq!(out, ACK);
        assert_eq!(parse_frame_verified(&ACK), Ok(f));
    }

    #[test]
    fn a_payload_given_beside_the_headers_is_the_frames_own() {
        let eth = EthRepr {
            dst: [2, 0, 0, 0, 0, 2],
            src: [2, 0, 0, 0, 0, 1],
            vlan: None,
        };
        let (src, dst) = (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
        for len in [0, 1, 3, 64, 1021] {
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let whole = FrameRepr::rc_write_only_v4(eth, src, dst, &payload, 9);
            let headers = FrameRepr {
                roce: PacketRepr {
                    payload: &[],
                    ..whole.roce
                },
                ..whole
            };
            let mut want = vec![0u8; MAX_TEST_FRAME];
            let mut got = vec![0u8; MAX_TEST_FRAME];
            let n = whole.emit(&mut want).unwrap();
            assert_eq!(
                headers.emit_with_payload(&mut got, &payload),
                Ok(n),
                "{len} bytes"
            );
            assert_eq!(got[..n], want[..n], "{len} bytes");
        }
        // The payload beside the headers is checked as the repr's own would be.
        let ack = parse_frame(&ACK).unwrap().repr;
        let mut out = [0u8; 80];
        assert!(matches!(
            ack.emit_with_payload(&mut out, &[1, 2, 3, 4]),
            Err(WireError::UnexpectedPayload { len: 4, .. })
        ));
        let whole = FrameRepr::rc_write_only_v4(eth, src, dst, &[7; 64], 9);
        assert!(matches!(
            whole.emit_with_payload(&mut out, &[7; 64]),
            Err(WireError::BufferTooSmall { .. })
        ));
    }

    const MAX_TEST_FRAME: usize = 1200;

    #[test]
    fn bad_icrc_is_reported() {
        let mut bad = ACK;
        bad[56] ^= 0x01; // MSN
        let p = parse_frame(&bad).unwrap();
        assert!(!p.icrc_ok());
        assert_eq!(
            parse_frame_verified(&bad),
            Err(WireError::BadIcrc {
                expected: p.icrc_computed,
                found: 0xf06f_780d
            })
        );
    }

    #[test]
    fn lower_layer_errors() {
        assert!(matches!(
            parse_frame(&ACK[..10]),
            Err(WireError::Truncated {
                layer: Layer::Ethernet,
                ..
            })
        ));
        let mut v = ACK;
        v[37] = 0x50; // UDP dst 0x1250
        assert_eq!(
            parse_frame(&v),
            Err(WireError::NotRoce { dst_port: 0x1250 })
        );
        let mut v = ACK;
        v[39] = 0x1d;
        assert_eq!(
            parse_frame(&v),
            Err(WireError::BadUdpLength {
                udp_len: 0x1d,
                ip_payload_len: 28
            })
        );
        let mut v = ACK;
        v[23] = 6;
        assert_eq!(parse_frame(&v), Err(WireError::NotUdp { protocol: 6 }));
        let mut v = ACK;
        v[12] = 0x88;
        v[13] = 0x08;
        assert_eq!(
            parse_frame(&v),
            Err(WireError::NotIp { ether_type: 0x8808 })
        );
        assert!(matches!(
            parse_frame(&ACK[..61]),
            Err(WireError::Truncated {
                layer: Layer::Ipv4,
                ..
            })
        ));
        let mut v = ACK;
        v[20] = 0x20; // MF
        assert_eq!(parse_frame(&v), Err(WireError::Fragmented { offset: 0 }));
        let mut v = ACK;
        v[14] = 0x46; // IHL 6: UDP's first word is read as an option, UDP starts 4 later
        assert_eq!(parse_frame(&v), Err(WireError::NotRoce { dst_port: 0 }));
        let mut v = ACK;
        v[14] = 0x65;
        assert_eq!(
            parse_frame(&v),
            Err(WireError::IpVersionMismatch {
                version: 6,
                expected: 4
            })
        );
    }

    #[test]
    fn vlan_and_ipv6_round_trip() {
        let f = parse_frame(&ACK).unwrap().repr;
        let mut g = f;
        g.eth.vlan = Some(VlanTag {
            pcp: 3,
            dei: false,
            vid: 100,
        });
        g.ip = IpRepr::V6 {
            src: "fe80::1".parse().unwrap(),
            dst: "fe80::2".parse().unwrap(),
            traffic_class: 0x68,
            flow_label: 0x12345,
            hop_limit: 1,
        };
        let mut buf = [0u8; 128];
        let n = g.emit(&mut buf).unwrap();
        assert_eq!(n, 18 + 40 + 8 + 16 + 4);
        let p = parse_frame(&buf[..n]).unwrap();
        assert!(p.icrc_ok());
        assert_eq!(p.repr, g);
    }

    /// `ACK` with `options` inserted after its IPv4 header: IHL, total length, header
    /// checksum and ICRC made right for them.
    fn ack_with_options(options: &[u8]) -> Vec<u8> {
        let mut f = ACK[..34].to_vec();
        f.extend_from_slice(options);
        f.extend_from_slice(&ACK[34..]);
        let hl = 20 + options.len();
        f[14] = 0x40 | (hl / 4) as u8;
        let total = u16::from_be_bytes([f[16], f[17]]) + options.len() as u16;
        f[16..18].copy_from_slice(&total.to_be_bytes());
        let ck = ipv4_checksum_any(&f[14..14 + hl]);
        f[24..26].copy_from_slice(&ck.to_be_bytes());
        let icrc_at = f.len() - 4;
        let crc = icrc::icrc_ipv4(&f[14..14 + hl], &f[14 + hl..icrc_at]);
        f[icrc_at..].copy_from_slice(&icrc::to_wire(crc));
        f
    }

    #[test]
    fn ipv4_options_are_parsed_and_covered_by_the_icrc() {
        // Router Alert (RFC 2113) and NOP, EOL: 8 bytes, IHL 7.
        let options = [0x94, 0x04, 0x00, 0x00, 0x01, 0x01, 0x01, 0x00];
        let f = ack_with_options(&options);
        let plain = parse_frame(&ACK).unwrap();
        let p = parse_frame(&f).unwrap();
        assert!(p.icrc_ok() && p.ipv4_checksum_ok);
        assert_eq!(p.repr, plain.repr, "the same fields, options aside");
        assert_eq!(p.ipv4_options, options);
        assert_eq!((p.offsets.udp, p.offsets.bth, p.offsets.icrc), (42, 50, 66));
        assert_eq!(parse_frame_verified(&f), Ok(plain.repr));
        let mut out = [0u8; 128];
        let n = p.emit_as_received(&mut out).unwrap();
        assert_eq!(&out[..n], &f[..], "re-emitted with the options");
        // The ICRC covers the options (Annex A17.3.3: the whole IPv4 header, only TOS, TTL and
        // the checksum masked), so a changed option is caught.
        let mut bad = f.clone();
        bad[36] ^= 0x01;
        assert!(matches!(
            parse_frame_verified(&bad),
            Err(WireError::BadIcrc { .. })
        ));
        // The longest header (IHL 15, 40 bytes of options).
        let long = ack_with_options(&[0x01; 40]);
        assert_eq!(parse_frame_verified(&long), Ok(plain.repr));
        // Total length below the header length.
        let mut short = f.clone();
        short[16..18].copy_from_slice(&26u16.to_be_bytes());
        assert_eq!(
            parse_frame(&short),
            Err(WireError::BadIpLength {
                ip_len: 26,
                header_len: 28
            })
        );
        // IHL beyond the captured bytes.
        assert!(matches!(
            parse_frame(&f[..14 + 24]),
            Err(WireError::Truncated {
                layer: Layer::Ipv4,
                ..
            })
        ));
    }

    #[test]
    fn stacked_and_service_vlan_tags_are_refused() {
        let with_tags = |tags: &[[u8; 4]]| {
            let mut f = ACK[..12].to_vec();
            for t in tags {
                f.extend_from_slice(t);
            }
            f.extend_from_slice(&ACK[12..]);
            f
        };
        // One 802.1Q tag is taken.
        let one = with_tags(&[[0x81, 0x00, 0x00, 0x64]]);
        assert_eq!(parse_frame(&one).unwrap().repr.eth.vlan.unwrap().vid, 100);
        // QinQ: 802.1ad outer, 802.1Q inner.
        let qinq = with_tags(&[[0x88, 0xa8, 0x00, 0xc8], [0x81, 0x00, 0x01, 0x2c]]);
        assert_eq!(
            parse_frame(&qinq),
            Err(WireError::ServiceVlanTag { tpid: 0x88a8 })
        );
        // Two 802.1Q tags, and an 802.1Q tag holding an 802.1ad one.
        let two = with_tags(&[[0x81, 0x00, 0x00, 0xc8], [0x81, 0x00, 0x01, 0x2c]]);
        assert_eq!(
            parse_frame(&two),
            Err(WireError::StackedVlan { ether_type: 0x8100 })
        );
        let inner_s = with_tags(&[[0x81, 0x00, 0x00, 0xc8], [0x88, 0xa8, 0x01, 0x2c]]);
        assert_eq!(
            parse_frame(&inner_s),
            Err(WireError::StackedVlan { ether_type: 0x88a8 })
        );
        // A lone service tag, and the old 0x9100 QinQ TPID.
        let s_only = with_tags(&[[0x88, 0xa8, 0x00, 0xc8]]);
        assert_eq!(
            parse_frame(&s_only),
            Err(WireError::ServiceVlanTag { tpid: 0x88a8 })
        );
        let q9100 = with_tags(&[[0x91, 0x00, 0x00, 0xc8], [0x81, 0x00, 0x01, 0x2c]]);
        assert_eq!(
            parse_frame(&q9100),
            Err(WireError::ServiceVlanTag { tpid: 0x9100 })
        );
    }

    /// An IPv6 RoCE ACK with `ext` inserted between the IPv6 header (next header `first`)
    /// and UDP.
    fn ipv6_ack_with(first: u8, ext: &[u8]) -> Vec<u8> {
        let mut g = parse_frame(&ACK).unwrap().repr;
        g.ip = IpRepr::V6 {
            src: "fd00::1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        };
        let mut buf = [0u8; 160];
        let n = g.emit(&mut buf).unwrap();
        let mut f = buf[..54].to_vec();
        f.extend_from_slice(ext);
        f.extend_from_slice(&buf[54..n]);
        let plen = u16::from_be_bytes([f[18], f[19]]) + ext.len() as u16;
        f[18..20].copy_from_slice(&plen.to_be_bytes());
        f[20] = first;
        f
    }

    #[test]
    fn ipv6_extension_headers_are_refused_by_name() {
        // Hop-by-hop options (next header UDP, 8 bytes: PadN).
        let hbh = [17, 0, 0x01, 0x04, 0, 0, 0, 0];
        assert_eq!(
            parse_frame(&ipv6_ack_with(0, &hbh)),
            Err(WireError::Ipv6ExtensionHeaders { first: 0, len: 8 })
        );
        // Destination options then routing (16 bytes each way), then UDP.
        let mut chain = vec![43, 0, 0x01, 0x04, 0, 0, 0, 0];
        chain.extend_from_slice(&[17, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            parse_frame(&ipv6_ack_with(60, &chain)),
            Err(WireError::Ipv6ExtensionHeaders { first: 60, len: 24 })
        );
        // Not RoCE behind them: another port, another protocol, a fragment header.
        let mut other_port = ipv6_ack_with(0, &hbh);
        other_port[14 + 40 + 8 + 3] = 0x50;
        assert!(matches!(
            parse_frame(&other_port),
            Err(WireError::NotRoce { dst_port: 0x1250 })
        ));
        let to_tcp = [6, 0, 0x01, 0x04, 0, 0, 0, 0];
        assert_eq!(
            parse_frame(&ipv6_ack_with(0, &to_tcp)),
            Err(WireError::NotUdp { protocol: 6 })
        );
        let frag = [17, 0, 0, 0, 0, 0, 0, 1];
        assert_eq!(
            parse_frame(&ipv6_ack_with(44, &frag)),
            Err(WireError::NotUdp { protocol: 44 })
        );
        // An extension header running past the packet.
        let long = [17, 200, 0x01, 0x04, 0, 0, 0, 0];
        assert!(matches!(
            parse_frame(&ipv6_ack_with(0, &long)),
            Err(WireError::Truncated {
                layer: Layer::Udp,
                ..
            })
        ));
        let mut cut = ipv6_ack_with(0, &hbh);
        cut.truncate(14 + 41);
        cut[18..20].copy_from_slice(&1u16.to_be_bytes());
        assert!(matches!(
            parse_frame(&cut),
            Err(WireError::Truncated {
                layer: Layer::Ipv6,
                ..
            })
        ));
    }

    #[test]
    fn rxe_port_matches_capture() {
        // Both QPs of rxe_rc_pingpong.pcap are 0x11; rxe chose source port 0xc121.
        assert_eq!(rxe_udp_source_port(0x11, 0x11), 0xc121);
    }
}
