//! [`PcapTap`]: a [`Driver`] wrapper that writes every frame it sends and receives to a pcap
//! file.
//!
//! Over AF_XDP the XDP program redirects RoCE frames to the socket before the kernel's packet
//! taps see them, and frames sent from the socket skip them too, so `tcpdump` on the
//! interface shows no RoCE traffic. The tap sits between the progress thread and the real
//! driver instead: what it writes is exactly what the engine sent and was handed, whatever
//! the driver (for the UDP driver the received frames' Ethernet/IP/UDP headers are the ones
//! the driver rebuilt; their ICRC cannot be checked, see [`super::RxMeta`]).
//!
//! The file is pcap (libpcap 2.4), link type Ethernet, microsecond wall-clock timestamps.
//! Frames are buffered in memory and written out at most [`WRITE_OUT_EVERY`] apart while
//! traffic flows, and when the tap is dropped (the device closed). A write error stops the
//! capture (with one warning naming the file) but never the device.
use std::fs::File;
use std::io::Write;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::capture::EthernetPcapWriter;

use super::{Driver, DriverError, DriverInfo, RxMeta, XdpStats};

/// Longest time frames stay buffered before they are written to the file.
pub const WRITE_OUT_EVERY: Duration = Duration::from_millis(100);
/// Buffered bytes that trigger a write-out before [`WRITE_OUT_EVERY`] is up.
const WRITE_OUT_BYTES: usize = 1 << 20;
/// Capture length: larger than any frame a driver carries (jumbo, multi-buffer).
const SNAPLEN: u32 = 262_144;

/// The in-memory side of the file: the pcap writer appends here, the tap empties it into
/// the file.
#[derive(Clone, Default)]
struct Pending(Arc<Mutex<Vec<u8>>>);

impl Write for Pending {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Counts of what a [`PcapTap`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TapStats {
    /// Frames sent by the engine and accepted by the driver, written.
    pub sent: u64,
    /// Frames received from the driver, written.
    pub received: u64,
    /// Frames the device looped back to itself (never in the driver), written once.
    pub looped_back: u64,
}

/// Wraps driver `D`, writing each frame sent and received to a pcap file.
pub struct PcapTap<D: Driver> {
    inner: D,
    pcap: EthernetPcapWriter<Pending>,
    pending: Pending,
    file: Option<File>,
    path: PathBuf,
    last_write_out: Instant,
    stats: TapStats,
}

impl<D: Driver> PcapTap<D> {
    /// Creates (or truncates) `path` and wraps `inner`.
    pub fn create(inner: D, path: &Path) -> Result<PcapTap<D>, DriverError> {
        let file = File::create(path).map_err(|source| DriverError::Io {
            context: format!("creating the capture file {}", path.display()),
            source,
        })?;
        let pending = Pending::default();
        let pcap =
            EthernetPcapWriter::new(pending.clone(), SNAPLEN).map_err(|e| DriverError::Io {
                context: format!("writing the pcap header of {}", path.display()),
                source: std::io::Error::other(e.to_string()),
            })?;
        let mut tap = PcapTap {
            inner,
            pcap,
            pending,
            file: Some(file),
            path: path.to_path_buf(),
            last_write_out: Instant::now(),
            stats: TapStats::default(),
        };
        // The header reaches the file at once: an empty capture is still a valid one.
        tap.write_out();
        if tap.file.is_none() {
            return Err(DriverError::Io {
                context: format!("writing the capture file {}", path.display()),
                source: std::io::Error::other("write failed"),
            });
        }
        Ok(tap)
    }

    /// What was written so far.
    pub fn stats(&self) -> TapStats {
        self.stats
    }

    /// The driver underneath.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Moves the buffered bytes to the file. On error the capture stops.
    fn write_out(&mut self) {
        self.last_write_out = Instant::now();
        let bytes = std::mem::take(&mut *self.pending.0.lock().unwrap_or_else(|p| p.into_inner()));
        let Some(file) = self.file.as_mut() else {
            return;
        };
        if bytes.is_empty() {
            return;
        }
        if let Err(e) = file.write_all(&bytes) {
            tracing::warn!(
                "capture to {} stopped: {e} (the device goes on)",
                self.path.display()
            );
            self.file = None;
        }
    }

    fn buffered(&self) -> usize {
        self.pending.0.lock().map_or(0, |b| b.len())
    }
}

/// Appends one frame with the current wall-clock time.
fn record(pcap: &mut EthernetPcapWriter<Pending>, frame: &[u8]) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    // Writing into memory cannot fail (the writer cuts the frame at SNAPLEN).
    let _ = pcap.write_frame(now, frame);
}

impl<D: Driver> Driver for PcapTap<D> {
    fn send(&mut self, frame: &[u8]) -> Result<(), DriverError> {
        // Only frames the driver took: a refused one (TxBusy) is sent again later.
        self.inner.send(frame)?;
        if self.file.is_some() {
            record(&mut self.pcap, frame);
            self.stats.sent += 1;
        }
        Ok(())
    }

    fn send_with(
        &mut self,
        max_len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> Result<Option<usize>, DriverError> {
        let PcapTap {
            inner,
            pcap,
            file,
            stats,
            ..
        } = self;
        let capturing = file.is_some();
        // Recorded from the driver's own buffer as soon as it is written.
        inner.send_with(max_len, &mut |buf| {
            let len = fill(buf)?;
            if capturing {
                if let Some(frame) = buf.get(..len) {
                    record(pcap, frame);
                    stats.sent += 1;
                }
            }
            Some(len)
        })
    }

    fn send_with_room(&self) -> usize {
        self.inner.send_with_room()
    }

    fn flush(&mut self) -> Result<(), DriverError> {
        let result = self.inner.flush();
        if self.last_write_out.elapsed() >= WRITE_OUT_EVERY || self.buffered() >= WRITE_OUT_BYTES {
            self.write_out();
        }
        result
    }

    fn recv(
        &mut self,
        max: usize,
        on_frame: &mut dyn FnMut(&[u8], RxMeta),
    ) -> Result<usize, DriverError> {
        let PcapTap {
            inner,
            pcap,
            file,
            stats,
            ..
        } = self;
        let capturing = file.is_some();
        let n = inner.recv(max, &mut |frame, meta| {
            if capturing {
                record(pcap, frame);
                stats.received += 1;
            }
            on_frame(frame, meta)
        })?;
        if n > 0 && self.last_write_out.elapsed() >= WRITE_OUT_EVERY {
            self.write_out();
        }
        Ok(n)
    }

    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        self.inner.wait_fd()
    }

    fn note_looped_back(&mut self, frame: &[u8]) {
        if self.file.is_some() {
            record(&mut self.pcap, frame);
            self.stats.looped_back += 1;
        }
    }

    fn qpn_prefix(&self) -> Option<u8> {
        self.inner.qpn_prefix()
    }

    fn relay_endpoint(&self) -> Option<super::relay::RelayEndpoint> {
        self.inner.relay_endpoint()
    }

    fn info(&self) -> DriverInfo {
        self.inner.info()
    }

    fn xdp_stats(&self) -> Option<XdpStats> {
        self.inner.xdp_stats()
    }
}

impl<D: Driver> Drop for PcapTap<D> {
    fn drop(&mut self) {
        self.write_out();
        if let Some(file) = self.file.as_mut() {
            let _ = file.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::mem::{MemDriver, MemLinkConfig};

    fn mem_pair() -> (MemDriver, MemDriver) {
        let macs = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        let (a, b, _link) = MemDriver::pair(macs.0, macs.1, &MemLinkConfig::default()).unwrap();
        (a, b)
    }

    #[test]
    fn both_directions_land_in_the_file() {
        let dir = tempdir();
        let path = dir.join("tap.pcap");
        let (a, mut b) = mem_pair();
        let mut tap = PcapTap::create(a, &path).unwrap();
        let out = vec![0xaa; 60];
        tap.send(&out).unwrap();
        tap.flush().unwrap();
        let mut got = Vec::new();
        while b.recv(8, &mut |f, _| got.push(f.to_vec())).unwrap() == 0 {}
        b.send(&[0xbb; 64]).unwrap();
        b.flush().unwrap();
        let mut seen = 0;
        while seen == 0 {
            seen = tap.recv(8, &mut |_, _| {}).unwrap();
        }
        assert_eq!(
            tap.stats(),
            TapStats {
                sent: 1,
                received: 1,
                looped_back: 0
            }
        );
        drop(tap);
        let mut reader = pcap_file::pcap::PcapReader::new(File::open(&path).unwrap()).unwrap();
        assert_eq!(reader.header().datalink, pcap_file::DataLink::ETHERNET);
        let first = reader.next_packet().unwrap().unwrap().into_owned();
        assert_eq!(&first.data[..], &out[..]);
        let second = reader.next_packet().unwrap().unwrap();
        assert_eq!(&second.data[..], &[0xbb; 64][..]);
        assert!(second.timestamp >= first.timestamp);
        assert!(
            first.timestamp > Duration::from_secs(1_600_000_000),
            "wall clock"
        );
        assert!(reader.next_packet().is_none());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn an_unwritable_path_is_named() {
        let (a, _b) = mem_pair();
        let err = PcapTap::create(a, Path::new("/nonexistent-dir/x.pcap"))
            .err()
            .expect("cannot create");
        assert!(
            err.to_string()
                .starts_with("creating the capture file /nonexistent-dir/x.pcap:"),
            "{err}"
        );
    }

    fn tempdir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "xroce-tap-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
