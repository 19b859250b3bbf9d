//! The UDP socket driver: the same engine over an ordinary kernel UDP socket on port 4791,
//! for machines where XDP is not allowed (no root, a container, a NIC with XDP in use).
//!
//! The engine still deals in whole Ethernet frames; this driver translates:
//!
//! - **send**: the frame is parsed ([`crate::wire::parse_frame`]), and its RoCE packet is
//!   re-emitted inside the IP/UDP header *the kernel will put on the wire*, so that the ICRC
//!   (which covers the IPv4 identification, flags, lengths, addresses and UDP ports; IBTA
//!   Annex A17.3.3) is right: source address = the bound address, UDP source port = the
//!   bound port, DF = 1 and IP ID = 0. Linux sends exactly that for an *unconnected* socket
//!   with `IP_MTU_DISCOVER = IP_PMTUDISC_DO`: DF packets of a socket with no connected
//!   destination get identification 0. Then the UDP payload (BTH .. ICRC) goes out with
//!   `sendto` to the frame's destination address, port 4791. TOS/TTL/UDP checksum are
//!   masked out of the ICRC, so whatever the kernel puts there is fine.
//! - **recv**: each datagram is wrapped in a synthesized Ethernet/IP/UDP header (source =
//!   the datagram's sender, destination = the bound address, MACs: ours as destination, all
//!   zero as source). The real IP header is hidden by the socket, so the ICRC of a received
//!   packet **cannot be verified**: every frame is delivered with
//!   `RxMeta { icrc_verifiable: false }`, and [`DriverInfo::icrc_verifiable`] is false.

use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};

use rustix::io::Errno;
use rustix::net::sockopt::{self, Ipv4PathMtuDiscovery, Ipv6PathMtuDiscovery};

use crate::wire::{parse_frame, FrameRepr, IpRepr, ROCEV2_UDP_PORT};

use super::iface::{interface_info, InterfaceInfo};
use super::{Driver, DriverError, DriverInfo, DriverMode, RxMeta};

/// How to open a [`UdpDriver`].
#[derive(Debug, Clone)]
pub struct UdpConfig {
    /// The interface whose MAC and MTU the driver reports (and whose address `local_ip` is).
    pub ifname: String,
    /// The address to bind (an IPv4 or IPv6 address of `ifname`).
    pub local_ip: IpAddr,
    /// The UDP port to bind; 4791 for interoperability (peers always send to 4791).
    pub port: u16,
}

impl UdpConfig {
    /// Bind `local_ip`:4791, reporting `ifname`'s MAC and MTU.
    pub fn new(ifname: impl Into<String>, local_ip: IpAddr) -> Self {
        UdpConfig {
            ifname: ifname.into(),
            local_ip,
            port: ROCEV2_UDP_PORT,
        }
    }
}

/// Counters of frames the UDP driver refused or dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdpDriverStats {
    /// Frames sent.
    pub sent: u64,
    /// Datagrams received.
    pub received: u64,
    /// Frames `send` refused (not RoCEv2 over IP/UDP, wrong family or source).
    pub send_invalid: u64,
    /// Received datagrams too short to be RoCE (< BTH + ICRC) and dropped.
    pub recv_runt: u64,
}

/// RoCE over a kernel UDP socket (see the module docs).
#[derive(Debug)]
pub struct UdpDriver {
    sock: UdpSocket,
    iface: InterfaceInfo,
    local_ip: IpAddr,
    port: u16,
    /// Rewritten frame (send) / synthesized frame (recv).
    scratch: Vec<u8>,
    rx_buf: Vec<u8>,
    stats: UdpDriverStats,
}

/// Largest UDP payload we accept or send.
const MAX_DATAGRAM: usize = 65535 - 8 - 20;
/// BTH + ICRC: nothing shorter can be RoCE.
const MIN_ROCE: usize = 12 + 4;

impl UdpDriver {
    /// Bind the socket. No privileges needed for port 4791 (> 1023).
    pub fn open(cfg: &UdpConfig) -> Result<Self, DriverError> {
        let iface = interface_info(&cfg.ifname)?;
        if !iface.up {
            return Err(DriverError::InterfaceDown {
                ifname: cfg.ifname.clone(),
            });
        }
        let sock = UdpSocket::bind(SocketAddr::new(cfg.local_ip, cfg.port)).map_err(|e| {
            let hint = match e.kind() {
                ErrorKind::AddrInUse => {
                    " (another RoCE endpoint, rxe or xroce, uses that address and port)"
                }
                ErrorKind::AddrNotAvailable => " (that address is not configured on this host)",
                _ => "",
            };
            DriverError::io(
                format!("binding UDP {}:{}{hint}", cfg.local_ip, cfg.port),
                e,
            )
        })?;
        sock.set_nonblocking(true)
            .map_err(|e| DriverError::io("making the UDP socket non-blocking", e))?;
        // DF on, and with it IP ID 0 on an unconnected socket: the header the ICRC assumes.
        match cfg.local_ip {
            IpAddr::V4(_) => sockopt::set_ip_mtu_discover(&sock, Ipv4PathMtuDiscovery::DO)
                .map_err(|e| DriverError::io("setting IP_MTU_DISCOVER", e.into()))?,
            IpAddr::V6(_) => sockopt::set_ipv6_mtu_discover(&sock, Ipv6PathMtuDiscovery::DO)
                .map_err(|e| DriverError::io("setting IPV6_MTU_DISCOVER", e.into()))?,
        }
        // Bursts of a large RDMA WRITE arrive faster than one poll loop; best effort.
        let _ = sockopt::set_socket_recv_buffer_size(&sock, 4 << 20);
        Ok(UdpDriver {
            sock,
            iface,
            local_ip: cfg.local_ip,
            port: cfg.port,
            scratch: Vec::with_capacity(MAX_DATAGRAM + 64),
            rx_buf: vec![0; MAX_DATAGRAM + 1],
            stats: UdpDriverStats::default(),
        })
    }

    /// Send/receive counters.
    pub fn stats(&self) -> UdpDriverStats {
        self.stats
    }

    /// The local address and port the socket is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        SocketAddr::new(self.local_ip, self.port)
    }

    fn invalid(&mut self, reason: String) -> DriverError {
        self.stats.send_invalid += 1;
        DriverError::InvalidFrame { reason }
    }

    /// Rewrite `frame` into `self.scratch` as the kernel will send it; returns the
    /// destination and the offset of the UDP payload in `scratch`.
    fn rewrite(&mut self, frame: &[u8]) -> Result<(SocketAddr, usize), DriverError> {
        let parsed = match parse_frame(frame) {
            Ok(p) => p,
            Err(e) => return Err(self.invalid(format!("not a RoCEv2 frame: {e}"))),
        };
        let repr = parsed.repr;
        let (ip, dst) = match (repr.ip, self.local_ip) {
            (IpRepr::V4 { dst, tos, ttl, .. }, IpAddr::V4(local)) => (
                IpRepr::V4 {
                    src: local,
                    dst,
                    tos,
                    ttl,
                    ident: 0,
                    dont_fragment: true,
                },
                IpAddr::V4(dst),
            ),
            (
                IpRepr::V6 {
                    dst,
                    traffic_class,
                    flow_label,
                    hop_limit,
                    ..
                },
                IpAddr::V6(local),
            ) => (
                IpRepr::V6 {
                    src: local,
                    dst,
                    traffic_class,
                    flow_label,
                    hop_limit,
                },
                IpAddr::V6(dst),
            ),
            _ => {
                return Err(self.invalid(format!(
                    "frame's IP version differs from the socket's ({})",
                    self.local_ip
                )))
            }
        };
        let out = FrameRepr {
            eth: repr.eth,
            ip,
            udp_src_port: self.port,
            roce: repr.roce,
        };
        let len = out.buffer_len();
        if len - repr.eth.buffer_len() - ip.buffer_len() - 8 > MAX_DATAGRAM {
            return Err(DriverError::FrameTooLarge {
                len: frame.len(),
                max: MAX_DATAGRAM,
            });
        }
        self.scratch.clear();
        self.scratch.resize(len, 0);
        if let Err(e) = out.emit(&mut self.scratch) {
            return Err(self.invalid(format!("cannot re-emit the frame: {e}")));
        }
        let payload_at = repr.eth.buffer_len() + ip.buffer_len() + 8;
        Ok((SocketAddr::new(dst, ROCEV2_UDP_PORT), payload_at))
    }

    /// Wrap a received datagram in Ethernet/IP/UDP headers (in `self.scratch`).
    fn synthesize(&mut self, from: SocketAddr, len: usize) {
        let payload = &self.rx_buf[..len];
        let builder = etherparse::PacketBuilder::ethernet2([0; 6], self.iface.mac);
        self.scratch.clear();
        let res = match (from.ip(), self.local_ip) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => builder
                .ipv4(src.octets(), dst.octets(), 64)
                .udp(from.port(), self.port)
                .write(&mut self.scratch, payload),
            (src, dst) => {
                let v6 = |a: IpAddr| match a {
                    IpAddr::V6(a) => a,
                    IpAddr::V4(a) => a.to_ipv6_mapped(),
                };
                builder
                    .ipv6(v6(src).octets(), v6(dst).octets(), 64)
                    .udp(from.port(), self.port)
                    .write(&mut self.scratch, payload)
            }
        };
        // Writing into a Vec cannot fail, and the length was bounded by the socket.
        debug_assert!(res.is_ok());
        if res.is_ok() && matches!(from.ip(), IpAddr::V4(_)) {
            // Mirror what a RoCE sender puts there (DF, ID 0), for readers of traces.
            self.scratch[14 + 6] |= 0x40;
            self.scratch[14 + 10] = 0;
            self.scratch[14 + 11] = 0;
            let sum = ipv4_header_checksum(&self.scratch[14..34]);
            self.scratch[14 + 10..14 + 12].copy_from_slice(&sum.to_be_bytes());
        }
    }
}

fn ipv4_header_checksum(hdr: &[u8]) -> u16 {
    let mut sum: u32 = hdr
        .chunks(2)
        .map(|c| u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)]) as u32)
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

impl Driver for UdpDriver {
    fn send(&mut self, frame: &[u8]) -> Result<(), DriverError> {
        let (dst, payload_at) = self.rewrite(frame)?;
        match self.sock.send_to(&self.scratch[payload_at..], dst) {
            Ok(_) => {
                self.stats.sent += 1;
                Ok(())
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => Err(DriverError::TxBusy),
            Err(e) if Errno::from_io_error(&e) == Some(Errno::MSGSIZE) => {
                Err(DriverError::FrameTooLarge {
                    len: frame.len(),
                    max: self.iface.mtu as usize + 14,
                })
            }
            Err(e) => Err(DriverError::io(format!("UDP send to {dst}"), e)),
        }
    }

    fn flush(&mut self) -> Result<(), DriverError> {
        // `send` hands each datagram to the kernel at once.
        Ok(())
    }

    fn recv(
        &mut self,
        max: usize,
        on_frame: &mut dyn FnMut(&[u8], RxMeta),
    ) -> Result<usize, DriverError> {
        let mut delivered = 0;
        while delivered < max {
            let (len, from) = match self.sock.recv_from(&mut self.rx_buf) {
                Ok(r) => r,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                // An ICMP error for an earlier send (port unreachable): not a frame.
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => continue,
                Err(e) => return Err(DriverError::io("UDP receive", e)),
            };
            self.stats.received += 1;
            if len < MIN_ROCE {
                self.stats.recv_runt += 1;
                continue;
            }
            self.synthesize(from, len);
            on_frame(
                &self.scratch,
                RxMeta {
                    icrc_verifiable: false,
                },
            );
            delivered += 1;
        }
        Ok(delivered)
    }

    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.sock.as_fd())
    }

    fn info(&self) -> DriverInfo {
        let ip_len = if self.local_ip.is_ipv4() { 20 } else { 40 };
        DriverInfo {
            name: self.iface.name.clone(),
            mode: DriverMode::Udp,
            ifindex: self.iface.ifindex,
            mac: self.iface.mac,
            mtu: self.iface.mtu,
            max_frame: (self.iface.mtu as usize + 14).min(MAX_DATAGRAM + 14 + ip_len + 8),
            icrc_verifiable: false,
            xdp_attach: None,
            note: Some(format!(
                "kernel UDP socket on {}: received ICRCs cannot be verified (the socket hides \
                 the IP header)",
                self.local_addr()
            )),
        }
    }
}

/// An IPv4 address on the loopback interface unique to this process and `slot`
/// (127.<pid hi>.<pid lo>.<slot>), so parallel tests and demos never share a UDP port.
pub fn unique_loopback_v4(slot: u8) -> Ipv4Addr {
    let pid = std::process::id();
    Ipv4Addr::new(
        127,
        ((pid >> 8) & 0xff) as u8 | 1,
        (pid & 0xff) as u8,
        slot.max(1),
    )
}
