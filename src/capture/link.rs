//! Link-layer headers of captures (Linux cooked SLL/SLL2, raw IP) turned into the Ethernet
//! frame the wire parser reads. Pure byte work, no I/O.

/// Link type 1: Ethernet.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Link type 12: raw IP in old captures (DLT_RAW on most systems).
pub const LINKTYPE_RAW_12: u32 = 12;
/// Link type 14: raw IP in old captures (DLT_RAW on OpenBSD).
pub const LINKTYPE_RAW_14: u32 = 14;
/// Link type 101: raw IP, version told by the first nibble.
pub const LINKTYPE_RAW: u32 = 101;
/// Link type 113: Linux cooked capture v1 (`tcpdump -i any` before libpcap 1.10).
pub const LINKTYPE_LINUX_SLL: u32 = 113;
/// Link type 228: raw IPv4.
pub const LINKTYPE_IPV4: u32 = 228;
/// Link type 229: raw IPv6.
pub const LINKTYPE_IPV6: u32 = 229;
/// Link type 276: Linux cooked capture v2 (`tcpdump -i any` since libpcap 1.10).
pub const LINKTYPE_LINUX_SLL2: u32 = 276;

/// SLL header: packet type, ARPHRD type, address length, 8 address bytes, protocol.
const SLL_LEN: usize = 16;
/// SLL2 header: protocol, reserved, ifindex, ARPHRD type, packet type, address length,
/// 8 address bytes.
const SLL2_LEN: usize = 20;
const ARPHRD_ETHER: u16 = 1;

/// The name of a link type `xroce dump` knows, for messages.
pub fn link_type_name(link_type: u32) -> &'static str {
    match link_type {
        LINKTYPE_ETHERNET => "Ethernet",
        LINKTYPE_RAW | LINKTYPE_RAW_12 | LINKTYPE_RAW_14 => "raw IP",
        LINKTYPE_IPV4 => "raw IPv4",
        LINKTYPE_IPV6 => "raw IPv6",
        LINKTYPE_LINUX_SLL => "Linux cooked (SLL)",
        LINKTYPE_LINUX_SLL2 => "Linux cooked v2 (SLL2)",
        _ => "unknown",
    }
}

/// A captured frame as the Ethernet frame the wire parser reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EthernetView<'a> {
    /// The Ethernet frame: the captured bytes themselves for Ethernet captures; for other
    /// link types a 14-byte Ethernet header standing in for the link header (destination
    /// MAC zero, source MAC from a cooked header's address, EtherType from its protocol or
    /// the IP version), then the captured bytes after the link header.
    pub bytes: std::borrow::Cow<'a, [u8]>,
    /// Length of the captured link header the stand-in replaces (0 for Ethernet captures).
    pub link_header_len: usize,
}

impl EthernetView<'_> {
    /// Whether the Ethernet header was made up from another link header.
    pub fn is_stand_in(&self) -> bool {
        matches!(self.bytes, std::borrow::Cow::Owned(_))
    }
}

/// Why a captured frame cannot be turned into an Ethernet frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// A link type with no IP in it that xroce knows of.
    #[error("link type {0} (not decoded)")]
    UnknownLinkType(u32),
    /// The frame is shorter than its link header.
    #[error("{link} header cut short: {have} of {need} bytes")]
    Truncated {
        /// The link type's name.
        link: &'static str,
        /// Header length.
        need: usize,
        /// Bytes captured.
        have: usize,
    },
    /// Raw IP whose version nibble is neither 4 nor 6.
    #[error("raw IP with version {0} (not IPv4 or IPv6)")]
    NotIp(u8),
}

/// Turns a captured frame of `link_type` into an Ethernet frame (see [`EthernetView`]).
pub fn to_ethernet(link_type: u32, data: &[u8]) -> Result<EthernetView<'_>, LinkError> {
    let link = link_type_name(link_type);
    let need = |n: usize| {
        if data.len() < n {
            Err(LinkError::Truncated {
                link,
                need: n,
                have: data.len(),
            })
        } else {
            Ok(())
        }
    };
    let be16 = |at: usize| u16::from_be_bytes([data[at], data[at + 1]]);
    // (source MAC, EtherType, link header length)
    let (src, ether_type, header_len) = match link_type {
        LINKTYPE_ETHERNET => {
            return Ok(EthernetView {
                bytes: std::borrow::Cow::Borrowed(data),
                link_header_len: 0,
            })
        }
        LINKTYPE_LINUX_SLL => {
            need(SLL_LEN)?;
            let src = (be16(2) == ARPHRD_ETHER && be16(4) == 6).then(|| &data[6..12]);
            (src, be16(14), SLL_LEN)
        }
        LINKTYPE_LINUX_SLL2 => {
            need(SLL2_LEN)?;
            let src = (be16(8) == ARPHRD_ETHER && data[11] == 6).then(|| &data[12..18]);
            (src, be16(0), SLL2_LEN)
        }
        LINKTYPE_RAW | LINKTYPE_RAW_12 | LINKTYPE_RAW_14 | LINKTYPE_IPV4 | LINKTYPE_IPV6 => {
            need(1)?;
            let ether_type = match (link_type, data[0] >> 4) {
                (LINKTYPE_IPV4, _) | (LINKTYPE_RAW | LINKTYPE_RAW_12 | LINKTYPE_RAW_14, 4) => {
                    0x0800
                }
                (LINKTYPE_IPV6, _) | (_, 6) => 0x86DD,
                (_, v) => return Err(LinkError::NotIp(v)),
            };
            (None, ether_type, 0)
        }
        other => return Err(LinkError::UnknownLinkType(other)),
    };
    let mut bytes = Vec::with_capacity(14 + data.len() - header_len);
    bytes.extend_from_slice(&[0; 6]);
    bytes.extend_from_slice(src.unwrap_or(&[0; 6]));
    bytes.extend_from_slice(&ether_type.to_be_bytes());
    bytes.extend_from_slice(&data[header_len..]);
    Ok(EthernetView {
        bytes: std::borrow::Cow::Owned(bytes),
        link_header_len: header_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cooked_and_raw_headers_become_ethernet() {
        let ip = [0x45, 0, 0, 20];
        // SLL: incoming (0), ARPHRD_ETHER, 6-byte address, protocol IPv4.
        let mut sll = vec![0, 0, 0, 1, 0, 6, 1, 2, 3, 4, 5, 6, 0, 0, 0x08, 0x00];
        sll.extend_from_slice(&ip);
        let e = to_ethernet(LINKTYPE_LINUX_SLL, &sll).unwrap();
        assert_eq!(
            e.bytes[..],
            [&[0; 6][..], &[1, 2, 3, 4, 5, 6], &[8, 0], &ip].concat()[..]
        );
        assert!(e.is_stand_in());
        // SLL2: protocol IPv6, ifindex 3, ARPHRD_ETHER, outgoing (4), 6-byte address.
        let mut sll2 = vec![
            0x86, 0xdd, 0, 0, 0, 0, 0, 3, 0, 1, 4, 6, 9, 9, 9, 9, 9, 9, 0, 0,
        ];
        sll2.push(0x60);
        let e = to_ethernet(LINKTYPE_LINUX_SLL2, &sll2).unwrap();
        assert_eq!(e.bytes[6..], [9, 9, 9, 9, 9, 9, 0x86, 0xdd, 0x60]);
        assert_eq!(e.link_header_len, 20);
        // Raw IP by version nibble; a non-IP nibble is named.
        let e = to_ethernet(LINKTYPE_RAW, &[0x60, 0]).unwrap();
        assert_eq!(e.bytes[12..], [0x86, 0xdd, 0x60, 0]);
        assert_eq!(
            to_ethernet(LINKTYPE_RAW_12, &ip).unwrap().bytes[12..14],
            [8, 0]
        );
        assert_eq!(to_ethernet(LINKTYPE_RAW, &[0x50]), Err(LinkError::NotIp(5)));
        assert_eq!(to_ethernet(LINKTYPE_IPV4, &ip).unwrap().bytes.len(), 18);
        // Ethernet is passed through; short or unknown links are errors, not panics.
        assert!(!to_ethernet(LINKTYPE_ETHERNET, &ip).unwrap().is_stand_in());
        assert!(matches!(
            to_ethernet(LINKTYPE_LINUX_SLL2, &sll2[..19]),
            Err(LinkError::Truncated { need: 20, .. })
        ));
        assert_eq!(
            to_ethernet(LINKTYPE_RAW, &[]).unwrap_err().to_string(),
            "raw IP header cut short: 0 of 1 bytes"
        );
        assert_eq!(to_ethernet(147, &ip), Err(LinkError::UnknownLinkType(147)));
    }
}
