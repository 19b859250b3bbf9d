//! Reading frames from pcap and pcapng files (with the `pcap-file` crate), for `xroce dump`
//! and the golden tests. The format is chosen by the file's magic number, not its name.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;
use std::time::Duration;

use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::{PcapError, TsResolution};

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

/// One frame read from a capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedFrame {
    /// 1-based position among the file's packets (as Wireshark numbers them).
    pub number: usize,
    /// Capture time since the Unix epoch.
    pub timestamp: Duration,
    /// Link type of the interface it was captured on (1 = Ethernet; see [`to_ethernet`]).
    pub link_type: u32,
    /// Length on the wire (may exceed `data.len()` if the capture was cut at a snap length).
    pub orig_len: u32,
    /// The captured bytes.
    pub data: Vec<u8>,
}

/// Why a capture file cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The file could not be opened or read.
    #[error("cannot read {path}: {error}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        error: std::io::Error,
    },
    /// The file starts with neither a pcap nor a pcapng magic number.
    #[error("{path} is not a pcap or pcapng file (magic {magic:02x?})")]
    NotACapture {
        /// The file.
        path: String,
        /// Its first bytes.
        magic: Vec<u8>,
    },
    /// The file header or a record is malformed or cut short.
    #[error("{path} is malformed after {frames} frames: {}", describe(.error))]
    Malformed {
        /// The file.
        path: String,
        /// Frames read successfully before the damage.
        frames: usize,
        /// What the pcap reader reported.
        error: PcapError,
    },
}

/// The pcap error and its cause ("Error reading bytes: unexpected end of file").
fn describe(e: &PcapError) -> String {
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

enum Inner {
    Pcap(PcapReader<BufReader<File>>),
    PcapNg(PcapNgReader<BufReader<File>>),
}

/// Streams the frames of a pcap or pcapng file.
pub struct CaptureReader {
    path: String,
    inner: Inner,
    count: usize,
    failed: bool,
}

impl CaptureReader {
    /// Opens a capture, detecting pcap (either byte order, micro- or nanosecond) or pcapng.
    pub fn open(path: impl AsRef<Path>) -> Result<CaptureReader, CaptureError> {
        let path_str = path.as_ref().display().to_string();
        let io = |error| CaptureError::Io {
            path: path_str.clone(),
            error,
        };
        let mut magic = [0u8; 4];
        let mut f = File::open(path.as_ref()).map_err(io)?;
        let n = read_up_to(&mut f, &mut magic).map_err(io)?;
        let f = File::open(path.as_ref()).map_err(io)?;
        let reader = BufReader::new(f);
        let malformed = |error| CaptureError::Malformed {
            path: path_str.clone(),
            frames: 0,
            error,
        };
        let inner = match magic {
            [0x0a, 0x0d, 0x0d, 0x0a] => {
                Inner::PcapNg(PcapNgReader::new(reader).map_err(malformed)?)
            }
            [0xd4, 0xc3, 0xb2, 0xa1]
            | [0xa1, 0xb2, 0xc3, 0xd4]
            | [0x4d, 0x3c, 0xb2, 0xa1]
            | [0xa1, 0xb2, 0x3c, 0x4d] => Inner::Pcap(PcapReader::new(reader).map_err(malformed)?),
            _ => {
                return Err(CaptureError::NotACapture {
                    path: path_str,
                    magic: magic[..n].to_vec(),
                })
            }
        };
        Ok(CaptureReader {
            path: path_str,
            inner,
            count: 0,
            failed: false,
        })
    }

    fn next_frame(&mut self) -> Option<Result<CapturedFrame, PcapError>> {
        match &mut self.inner {
            Inner::Pcap(r) => {
                let header = r.header();
                let link_type = u32::from(header.datalink);
                // Raw records: pcap-file's checked `next_packet` refuses any record whose
                // original length exceeds the file's snaplen, which is every frame a
                // snaplen cut (`tcpdump -s 96`, a header-only capture).
                r.next_raw_packet().map(|p| {
                    p.and_then(|p| {
                        let nanos = match header.ts_resolution {
                            TsResolution::MicroSecond => u64::from(p.ts_frac) * 1000,
                            TsResolution::NanoSecond => u64::from(p.ts_frac),
                        };
                        if nanos >= 1_000_000_000 {
                            return Err(PcapError::InvalidField(
                                "PacketHeader ts_nanosecond >= 1_000_000_000",
                            ));
                        }
                        Ok(CapturedFrame {
                            number: 0,
                            timestamp: Duration::from_secs(u64::from(p.ts_sec))
                                + Duration::from_nanos(nanos),
                            link_type,
                            orig_len: p.orig_len,
                            data: p.data.into_owned(),
                        })
                    })
                })
            }
            Inner::PcapNg(r) => loop {
                let block = match r.next_block()? {
                    Ok(b) => b,
                    Err(e) => return Some(Err(e)),
                };
                let (iface, timestamp, orig_len, data) = match block {
                    Block::EnhancedPacket(p) => (
                        p.interface_id,
                        p.timestamp,
                        p.original_len,
                        p.data.into_owned(),
                    ),
                    Block::SimplePacket(p) => {
                        (0, Duration::ZERO, p.original_len, p.data.into_owned())
                    }
                    Block::Packet(p) => (
                        u32::from(p.interface_id),
                        Duration::from_micros(p.timestamp),
                        p.original_len,
                        p.data.into_owned(),
                    ),
                    _ => continue,
                };
                let Some(desc) = r.interfaces().get(iface as usize) else {
                    return Some(Err(PcapError::InvalidInterfaceId(iface)));
                };
                let link_type = u32::from(desc.linktype);
                return Some(Ok(CapturedFrame {
                    number: 0,
                    timestamp,
                    link_type,
                    orig_len,
                    data,
                }));
            },
        }
    }
}

impl Iterator for CaptureReader {
    type Item = Result<CapturedFrame, CaptureError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.next_frame()? {
            Ok(mut frame) => {
                self.count += 1;
                frame.number = self.count;
                Some(Ok(frame))
            }
            Err(error) => {
                self.failed = true;
                Some(Err(CaptureError::Malformed {
                    path: self.path.clone(),
                    frames: self.count,
                    error,
                }))
            }
        }
    }
}

/// Reads every frame of a capture.
pub fn read_capture(path: impl AsRef<Path>) -> Result<Vec<CapturedFrame>, CaptureError> {
    CaptureReader::open(path)?.collect()
}

fn read_up_to(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
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
