//! Reading frames from pcap and pcapng files (with the `pcap-file` crate), for `xroce dump`
//! and the golden tests. The format is chosen by the file's magic number, not its name.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;
use std::time::Duration;

use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::{PcapError, TsResolution};

/// One frame read from a capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedFrame {
    /// 1-based position among the file's packets (as Wireshark numbers them).
    pub number: usize,
    /// Capture time since the Unix epoch.
    pub timestamp: Duration,
    /// Link type of the interface it was captured on (1 = Ethernet; see [`super::to_ethernet`]).
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
        let format = match inner {
            Inner::Pcap(_) => "pcap",
            Inner::PcapNg(_) => "pcapng",
        };
        tracing::debug!(path = %path_str, format, "capture opened");
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
