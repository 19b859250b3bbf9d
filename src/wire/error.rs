//! Typed errors of the wire layer: every way a frame can fail to be a well-formed RoCEv2
//! packet has its own variant, so a receiver can count drops by reason.

use super::opcode::Opcode;

/// The header (or trailer) a [`WireError::Truncated`] refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    /// Ethernet II header (14 bytes).
    Ethernet,
    /// IEEE 802.1Q VLAN tag (4 bytes).
    Vlan,
    /// IPv4 header (20..60 bytes) or the IPv4 packet its total length announces.
    Ipv4,
    /// IPv6 header (40 bytes) or the IPv6 payload its payload length announces.
    Ipv6,
    /// UDP header (8 bytes) or the datagram its length field announces.
    Udp,
    /// Base Transport Header (12 bytes).
    Bth,
    /// RDMA Extended Transport Header (16 bytes).
    Reth,
    /// ACK Extended Transport Header (4 bytes).
    Aeth,
    /// Atomic Extended Transport Header (28 bytes).
    AtomicEth,
    /// Atomic ACK Extended Transport Header (8 bytes).
    AtomicAckEth,
    /// Immediate data (4 bytes).
    ImmDt,
    /// Invalidate Extended Transport Header (4 bytes).
    Ieth,
    /// Datagram Extended Transport Header (8 bytes).
    Deth,
    /// The invariant CRC trailer (4 bytes).
    Icrc,
}

impl core::fmt::Display for Layer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let name = match self {
            Layer::Ethernet => "Ethernet",
            Layer::Vlan => "802.1Q",
            Layer::Ipv4 => "IPv4",
            Layer::Ipv6 => "IPv6",
            Layer::Udp => "UDP",
            Layer::Bth => "BTH",
            Layer::Reth => "RETH",
            Layer::Aeth => "AETH",
            Layer::AtomicEth => "AtomicETH",
            Layer::AtomicAckEth => "AtomicAckETH",
            Layer::ImmDt => "ImmDt",
            Layer::Ieth => "IETH",
            Layer::Deth => "DETH",
            Layer::Icrc => "ICRC",
        };
        f.write_str(name)
    }
}

/// Why a buffer is not a well-formed RoCEv2 packet or frame, or why one cannot be emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The buffer ends before the named header does.
    #[error("truncated {layer} header: need {need} bytes, have {have}")]
    Truncated {
        /// Which header is cut short.
        layer: Layer,
        /// Bytes the header needs.
        need: usize,
        /// Bytes that were there.
        have: usize,
    },
    /// The Ethernet (or inner VLAN) EtherType is neither IPv4 nor IPv6.
    #[error("not IP: EtherType 0x{ether_type:04x}")]
    NotIp {
        /// The EtherType found.
        ether_type: u16,
    },
    /// More than one VLAN tag (QinQ); xroce handles a single 802.1Q tag (its XDP program
    /// leaves these to the kernel).
    #[error(
        "stacked VLAN tags (EtherType 0x{ether_type:04x} inside a VLAN tag) are not supported"
    )]
    StackedVlan {
        /// The inner EtherType that announced a second tag.
        ether_type: u16,
    },
    /// The IP version nibble does not match the EtherType.
    #[error("IP version {version} where the EtherType announced IPv{expected}")]
    IpVersionMismatch {
        /// Version nibble found.
        version: u8,
        /// Version the EtherType announced (4 or 6).
        expected: u8,
    },
    /// IPv4 IHL below 5 (a header shorter than 20 bytes).
    #[error("IPv4 IHL {ihl} is below the minimum of 5")]
    BadIpv4Ihl {
        /// The IHL field (header length in 32-bit words).
        ihl: u8,
    },
    /// An 802.1ad service tag (or the older QinQ TPID 0x9100) as the outer tag; xroce
    /// sends and takes only a single 802.1Q tag (its XDP program leaves these to the kernel).
    #[error(
        "802.1ad service VLAN tag (TPID 0x{tpid:04x}) is not supported: \
         xroce takes a single 802.1Q tag"
    )]
    ServiceVlanTag {
        /// The outer TPID.
        tpid: u16,
    },
    /// RoCEv2 (UDP port 4791) behind IPv6 extension headers: the ICRC masks only fixed IPv6
    /// header fields, so it cannot be verified over headers that change in flight (hop-by-hop
    /// options, routing). xroce's XDP program leaves these to the kernel.
    #[error(
        "RoCEv2 behind {len} bytes of IPv6 extension headers (first: next header {first}): \
         not supported, the ICRC cannot be verified over them"
    )]
    Ipv6ExtensionHeaders {
        /// The first extension header's type (0 hop-by-hop, 43 routing, 60 destination).
        first: u8,
        /// Bytes of extension headers before the UDP header.
        len: usize,
    },
    /// The IP total length (IPv4) or payload length (IPv6) is smaller than the headers it must
    /// hold.
    #[error("IP length {ip_len} is smaller than its {header_len}-byte header")]
    BadIpLength {
        /// IPv4 total length, or IPv6 header + payload length.
        ip_len: usize,
        /// IP header length.
        header_len: usize,
    },
    /// The packet is an IP fragment; RoCEv2 packets are never fragmented (rxe sets DF).
    #[error("IP fragment (more-fragments set or offset {offset}); RoCEv2 is never fragmented")]
    Fragmented {
        /// Fragment offset in 8-byte units.
        offset: u16,
    },
    /// The IP payload is not UDP (for IPv6 this includes any extension header).
    #[error("IP protocol / next header {protocol} is not UDP (17)")]
    NotUdp {
        /// The IP protocol number found.
        protocol: u8,
    },
    /// UDP destination port is not 4791 (the RoCEv2 port, IANA).
    #[error("UDP destination port {dst_port} is not the RoCEv2 port 4791")]
    NotRoce {
        /// The destination port found.
        dst_port: u16,
    },
    /// The UDP length field disagrees with the IP payload length.
    #[error("UDP length {udp_len} does not match the IP payload length {ip_payload_len}")]
    BadUdpLength {
        /// The UDP length field.
        udp_len: u16,
        /// What the IP header says the UDP datagram occupies.
        ip_payload_len: usize,
    },
    /// The opcode is not in xroce's table (reserved, RD, or a manufacturer opcode).
    #[error("unknown or unsupported opcode 0x{0:02x}")]
    UnknownOpcode(u8),
    /// The BTH transport header version is not 0 (IBTA 9.2: TVer must be 0; rxe drops these).
    #[error("BTH TVer {0} is not 0")]
    BadTver(u8),
    /// PadCnt says more pad bytes than the packet has after its headers.
    #[error("PadCnt {pad} exceeds the {available} bytes after the headers")]
    PadExceedsPayload {
        /// PadCnt from the BTH.
        pad: u8,
        /// Bytes after the transport headers (payload + pad).
        available: usize,
    },
    /// Payload + pad is not a multiple of 4 bytes (IBTA 9.2: packets are whole 32-bit words,
    /// so PadCnt must be `(-payload_len) & 3`).
    #[error("payload {payload} + pad {pad} bytes is not a multiple of 4")]
    Misaligned {
        /// Payload bytes.
        payload: usize,
        /// Pad bytes (PadCnt).
        pad: u8,
    },
    /// An opcode that carries no payload (ACK, READ request, atomics, ...) has payload bytes.
    #[error("{opcode} carries no payload but has {len} bytes after its headers")]
    UnexpectedPayload {
        /// The opcode.
        opcode: Opcode,
        /// Bytes found after the headers (payload + pad).
        len: usize,
    },
    /// A CNP whose body is not the 16 reserved bytes of RoCEv2 Annex A17.9.3.
    #[error("CNP body is {len} bytes, expected 16")]
    BadCnpLength {
        /// Body length found.
        len: usize,
    },
    /// The ICRC in the frame is not the one computed over it.
    #[error("bad ICRC: computed 0x{expected:08x}, frame carries 0x{found:08x}")]
    BadIcrc {
        /// The ICRC computed over the frame.
        expected: u32,
        /// The ICRC the frame carries.
        found: u32,
    },
    /// On emit: the extension headers present do not match what the opcode carries.
    #[error("{opcode}: extension headers do not match the opcode table ({detail})")]
    HeaderMismatch {
        /// The opcode.
        opcode: Opcode,
        /// Which header is missing or extra.
        detail: &'static str,
    },
    /// On emit: a field value does not fit its wire width.
    #[error("field {field} value {value} does not fit its wire width")]
    FieldOutOfRange {
        /// Field name.
        field: &'static str,
        /// The value given.
        value: u64,
    },
    /// On emit: the frame would exceed the 16-bit IP/UDP length fields.
    #[error("frame too large: {len} bytes of IP payload")]
    TooLarge {
        /// The IP payload length that did not fit.
        len: usize,
    },
    /// On emit: the caller's buffer is smaller than the frame.
    #[error("buffer too small: need {need} bytes, have {have}")]
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
}

/// Result type of the wire layer.
pub type Result<T> = core::result::Result<T, WireError>;

/// Returns `Truncated` unless `buf_len >= need`.
pub(crate) fn check_len(layer: Layer, need: usize, buf_len: usize) -> Result<()> {
    if buf_len < need {
        Err(WireError::Truncated {
            layer,
            need,
            have: buf_len,
        })
    } else {
        Ok(())
    }
}
