//! An in-process loopback pair: two [`LoopbackDriver`] ends joined by a Unix datagram socket
//! pair, so each frame stays one datagram and the wait fd works with poll/epoll exactly like
//! an AF_XDP socket's. For unit tests of anything that drives a [`Driver`].

use std::io::ErrorKind;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixDatagram;

use super::{Driver, DriverError, DriverInfo, DriverMode, RxMeta};

/// Largest frame a loopback end carries: a 9000-byte MTU plus Ethernet and two VLAN tags.
pub const LOOPBACK_MAX_FRAME: usize = 9000 + 14 + 8;

/// One end of an in-process loopback link.
#[derive(Debug)]
pub struct LoopbackDriver {
    sock: UnixDatagram,
    mac: [u8; 6],
    mtu: u32,
    buf: Vec<u8>,
    queued: Vec<Vec<u8>>,
}

impl LoopbackDriver {
    /// Two connected ends with the given MACs and link MTU: what one sends, the other receives.
    pub fn pair(mac_a: [u8; 6], mac_b: [u8; 6], mtu: u32) -> Result<(Self, Self), DriverError> {
        if !(576..=9000).contains(&mtu) {
            return Err(DriverError::Config {
                reason: format!("loopback MTU {mtu} outside 576..=9000"),
            });
        }
        let (a, b) =
            UnixDatagram::pair().map_err(|e| DriverError::io("creating a socket pair", e))?;
        for s in [&a, &b] {
            s.set_nonblocking(true)
                .map_err(|e| DriverError::io("making the socket pair non-blocking", e))?;
        }
        let end = |sock, mac| LoopbackDriver {
            sock,
            mac,
            mtu,
            buf: vec![0; LOOPBACK_MAX_FRAME + 1],
            queued: Vec::new(),
        };
        Ok((end(a, mac_a), end(b, mac_b)))
    }

    fn max_frame(&self) -> usize {
        self.mtu as usize + 14 + 8
    }
}

impl Driver for LoopbackDriver {
    fn send(&mut self, frame: &[u8]) -> Result<(), DriverError> {
        if frame.len() > self.max_frame() {
            return Err(DriverError::FrameTooLarge {
                len: frame.len(),
                max: self.max_frame(),
            });
        }
        if self.queued.len() >= 1024 {
            return Err(DriverError::TxBusy);
        }
        self.queued.push(frame.to_vec());
        Ok(())
    }

    fn flush(&mut self) -> Result<(), DriverError> {
        let mut sent = 0;
        for frame in &self.queued {
            match self.sock.send(frame) {
                Ok(_) => sent += 1,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                    return Err(DriverError::PeerGone)
                }
                Err(e) => return Err(DriverError::io("loopback send", e)),
            }
        }
        self.queued.drain(..sent);
        Ok(())
    }

    fn recv(
        &mut self,
        max: usize,
        on_frame: &mut dyn FnMut(&[u8], RxMeta),
    ) -> Result<usize, DriverError> {
        let mut n = 0;
        while n < max {
            match self.sock.recv(&mut self.buf) {
                Ok(len) => {
                    on_frame(
                        &self.buf[..len],
                        RxMeta {
                            icrc_verifiable: true,
                        },
                    );
                    n += 1;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(DriverError::io("loopback recv", e)),
            }
        }
        Ok(n)
    }

    fn wait_fd(&self) -> Option<RawFd> {
        Some(self.sock.as_raw_fd())
    }

    fn info(&self) -> DriverInfo {
        DriverInfo {
            name: "loopback".into(),
            mode: DriverMode::Loopback,
            ifindex: 0,
            mac: self.mac,
            mtu: self.mtu,
            max_frame: self.max_frame(),
            icrc_verifiable: true,
            xdp_attach: None,
            note: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 2];

    fn collect(d: &mut LoopbackDriver, max: usize) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        d.recv(max, &mut |f, meta| {
            assert!(meta.icrc_verifiable);
            got.push(f.to_vec())
        })
        .unwrap();
        got
    }

    #[test]
    fn frames_cross_in_order_and_byte_for_byte() {
        let (mut a, mut b) = LoopbackDriver::pair(A, B, 1500).unwrap();
        let frames: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 60 + i as usize]).collect();
        for f in &frames {
            a.send(f).unwrap();
        }
        assert!(collect(&mut b, 64).is_empty(), "nothing before flush");
        a.flush().unwrap();
        assert_eq!(collect(&mut b, 4), frames[..4]);
        assert_eq!(collect(&mut b, 64), frames[4..]);
        assert!(collect(&mut a, 64).is_empty(), "nothing echoes back");
    }

    #[test]
    fn oversized_frame_is_refused() {
        let (mut a, _b) = LoopbackDriver::pair(A, B, 1500).unwrap();
        let err = a.send(&[0u8; 1523]).unwrap_err();
        assert!(matches!(
            err,
            DriverError::FrameTooLarge {
                len: 1523,
                max: 1522
            }
        ));
        a.send(&[0u8; 1522]).unwrap();
    }

    #[test]
    fn dropped_peer_is_reported() {
        let (mut a, b) = LoopbackDriver::pair(A, B, 1500).unwrap();
        drop(b);
        a.send(&[1, 2, 3]).unwrap();
        assert!(matches!(a.flush(), Err(DriverError::PeerGone)));
    }

    #[test]
    fn info_describes_the_end() {
        let (a, b) = LoopbackDriver::pair(A, B, 4200).unwrap();
        assert_eq!(a.info().mac, A);
        assert_eq!(b.info().mac, B);
        assert_eq!(a.info().mode.as_str(), "loopback");
        assert!(a.wait_fd().is_some());
        assert!(LoopbackDriver::pair(A, B, 100).is_err());
    }
}
