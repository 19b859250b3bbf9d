//! Writing frames to a pcap file (libpcap 2.4, link type Ethernet).

use std::io::Write;
use std::time::Duration;

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::{DataLink, PcapError};

/// Writes Ethernet frames to a pcap stream, each cut at the snap length.
pub struct EthernetPcapWriter<W: Write> {
    pcap: PcapWriter<W>,
    snaplen: u32,
}

impl<W: Write> EthernetPcapWriter<W> {
    /// Writes the file header (link type Ethernet, microsecond timestamps) to `out`.
    pub fn new(out: W, snaplen: u32) -> Result<EthernetPcapWriter<W>, PcapError> {
        let header = PcapHeader {
            datalink: DataLink::ETHERNET,
            snaplen,
            ..Default::default()
        };
        Ok(EthernetPcapWriter {
            pcap: PcapWriter::with_header(out, header)?,
            snaplen,
        })
    }

    /// Appends `frame` seen at `timestamp` (since the Unix epoch, or virtual time): at most
    /// the snap length of it, with its whole length as the original length.
    pub fn write_frame(&mut self, timestamp: Duration, frame: &[u8]) -> Result<(), PcapError> {
        let len = frame.len().min(self.snaplen as usize);
        let orig_len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
        self.pcap
            .write_packet(&PcapPacket::new(timestamp, orig_len, &frame[..len]))
            .map(drop)
    }

    /// The stream underneath (flush it if it buffers).
    pub fn into_inner(self) -> W {
        self.pcap.into_writer()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_read_back_with_their_cut_and_length() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.pcap");
        let mut w = EthernetPcapWriter::new(std::fs::File::create(&path).unwrap(), 8).unwrap();
        w.write_frame(Duration::from_micros(1_500_002), &[1, 2, 3])
            .unwrap();
        w.write_frame(Duration::from_secs(2), &[7; 20]).unwrap();
        drop(w.into_inner());
        let frames = super::super::read_capture(&path).unwrap();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].data, [1, 2, 3]);
        assert_eq!(frames[0].timestamp, Duration::from_micros(1_500_002));
        assert_eq!(frames[0].link_type, super::super::LINKTYPE_ETHERNET);
        assert_eq!((frames[1].data.len(), frames[1].orig_len), (8, 20));
    }
}
