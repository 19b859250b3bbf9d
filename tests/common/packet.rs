//! A raw AF_PACKET socket on one interface, for the driver tests: inject any Ethernet frame
//! (VLAN-tagged RoCE, malformed headers) and capture every frame, incoming and outgoing, to
//! look at what a driver really sent. Include with
//! `#[path = "common/packet.rs"] mod packet;`.
//!
//! An XDP program sees received frames before packet sockets do: a frame that xroce's
//! program redirects to AF_XDP is not seen by a capture on the receiving interface.
//!
//! The socket, sends and waits go through rustix; binding to an interface and reading the
//! direction of a captured frame need a `sockaddr_ll`, which neither rustix nor std can
//! build or read safely, so those two calls are libc's.
#![allow(dead_code)]

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::net::{
    netdevice, send, socket_with, AddressFamily, SendFlags, SocketFlags, SocketType,
};

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
    /// Open and bind to `ifname` (in the calling thread's network namespace); needs
    /// CAP_NET_RAW.
    pub fn open(ifname: &str) -> io::Result<Self> {
        let fd = socket_with(
            AddressFamily::PACKET,
            SocketType::RAW,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            Some(rustix::net::eth::ALL),
        )?;
        let ifindex = netdevice::name_to_index(&fd, ifname)?;
        let addr = libc::sockaddr_ll {
            sll_family: libc::AF_PACKET as u16,
            sll_protocol: (libc::ETH_P_ALL as u16).to_be(),
            sll_ifindex: ifindex as i32,
            sll_hatype: 0,
            sll_pkttype: 0,
            sll_halen: 0,
            sll_addr: [0; 8],
        };
        // Safety: `addr` is a valid sockaddr_ll for the whole call and the length passed is
        // its size; bind(2) only reads it.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &addr as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(PacketSocket { fd, ifindex })
    }

    /// The interface index this socket is bound to.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Transmit `frame` exactly as given (Ethernet header first, no FCS).
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        let n = send(&self.fd, frame, SendFlags::empty())?;
        if n != frame.len() {
            return Err(io::Error::other(format!(
                "AF_PACKET sent {n} of {} bytes",
                frame.len()
            )));
        }
        Ok(())
    }

    /// Wait up to `timeout` for one frame; returns its length and direction.
    pub fn recv_timeout(
        &self,
        buf: &mut [u8],
        timeout: Duration,
    ) -> io::Result<Option<(usize, Direction)>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(got) = self.try_recv(buf)? {
                return Ok(Some(got));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            // At most a second, then look at the deadline again; the socket is non-blocking,
            // so whatever woke the wait (or an error it hit) is seen by the next receive.
            let ms = left.as_millis().min(1000) as i64 + 1;
            let wait = Timespec {
                tv_sec: ms / 1000,
                tv_nsec: ((ms % 1000) * 1_000_000) as _,
            };
            let _ = poll(&mut [PollFd::new(&self.fd, PollFlags::IN)], Some(&wait));
        }
    }

    /// One frame if one is waiting.
    fn try_recv(&self, buf: &mut [u8]) -> io::Result<Option<(usize, Direction)>> {
        let mut from = libc::sockaddr_ll {
            sll_family: 0,
            sll_protocol: 0,
            sll_ifindex: 0,
            sll_hatype: 0,
            sll_pkttype: 0,
            sll_halen: 0,
            sll_addr: [0; 8],
        };
        let mut from_len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // Safety: `buf` is writable for buf.len() bytes and `from`/`from_len` describe a
        // writable sockaddr_ll-sized buffer, all for the whole call; the kernel writes no
        // more than those lengths.
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
        if n < 0 {
            let err = io::Error::last_os_error();
            return match err.kind() {
                io::ErrorKind::WouldBlock => Ok(None),
                _ => Err(err),
            };
        }
        let dir = if from.sll_pkttype == libc::PACKET_OUTGOING {
            Direction::Outgoing
        } else {
            Direction::Incoming
        };
        Ok(Some(((n as usize).min(buf.len()), dir)))
    }
}
