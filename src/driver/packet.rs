//! A raw AF_PACKET socket on one interface: inject any Ethernet frame, capture every frame
//! (incoming and outgoing). Used by tests and diagnostics to put exactly chosen bytes on a
//! link (VLAN-tagged RoCE, malformed headers) and to look at what another driver really sent.
//!
//! Note that an XDP program sees received frames before packet sockets do: a frame that
//! xroce's program redirects to AF_XDP is not seen by a capture on the receiving interface.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use super::iface::interface_info;
use super::DriverError;

/// Whether a captured frame was sent or received by this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Sent by this host (PACKET_OUTGOING).
    Outgoing,
    /// Received (addressed to this host, broadcast, multicast or other host).
    Incoming,
}

/// A raw packet socket bound to one interface, receiving all protocols.
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: u32,
}

impl PacketSocket {
    /// Open and bind to `ifname` (in the calling thread's network namespace).
    pub fn open(ifname: &str) -> Result<Self, DriverError> {
        let info = interface_info(ifname)?;
        let proto_all = (libc::ETH_P_ALL as u16).to_be();
        // Safety: socket(2) with constant arguments has no memory-safety preconditions.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                proto_all as i32,
            )
        };
        if raw < 0 {
            return Err(DriverError::io(
                "opening an AF_PACKET socket (needs CAP_NET_RAW)",
                std::io::Error::last_os_error(),
            ));
        }
        // Safety: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // Safety: sockaddr_ll is plain integers and bytes; all-zero is valid.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = proto_all;
        addr.sll_ifindex = info.ifindex as i32;
        // Safety: `addr` is a valid sockaddr_ll and the length passed is its size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &addr as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(DriverError::io(
                format!("binding an AF_PACKET socket to {ifname}"),
                std::io::Error::last_os_error(),
            ));
        }
        Ok(PacketSocket {
            fd,
            ifindex: info.ifindex,
        })
    }

    /// The interface index this socket is bound to.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Transmit `frame` exactly as given (Ethernet header first, no FCS).
    pub fn send(&self, frame: &[u8]) -> Result<(), DriverError> {
        // Safety: `frame` is a valid readable buffer of frame.len() bytes for the call.
        let n = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                frame.as_ptr() as *const libc::c_void,
                frame.len(),
                0,
            )
        };
        if n < 0 {
            return Err(DriverError::io(
                "AF_PACKET send",
                std::io::Error::last_os_error(),
            ));
        }
        if n as usize != frame.len() {
            return Err(DriverError::InvalidFrame {
                reason: format!("AF_PACKET sent {n} of {} bytes", frame.len()),
            });
        }
        Ok(())
    }

    /// Wait up to `timeout` for one frame; returns its length and direction.
    pub fn recv_timeout(
        &self,
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<Option<(usize, Direction)>, DriverError> {
        let deadline = Instant::now() + timeout;
        loop {
            // Safety: sockaddr_ll is plain integers and bytes; all-zero is valid.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut from_len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // Safety: `buf` is writable for buf.len() bytes; `from`/`from_len` are valid and
            // describe a sockaddr_ll-sized buffer the kernel may fill.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr() as *mut libc::c_void,
                    buf.len(),
                    libc::MSG_TRUNC,
                    &mut from as *mut libc::sockaddr_ll as *mut libc::sockaddr,
                    &mut from_len,
                )
            };
            if n >= 0 {
                let dir = if from.sll_pkttype == libc::PACKET_OUTGOING {
                    Direction::Outgoing
                } else {
                    Direction::Incoming
                };
                return Ok(Some(((n as usize).min(buf.len()), dir)));
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::WouldBlock {
                return Err(DriverError::io("AF_PACKET recv", err));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // Safety: `pfd` is one valid pollfd for the duration of the call.
            unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(1000) as i32 + 1) };
        }
    }
}
