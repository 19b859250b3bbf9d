//! Drivers: how whole Ethernet frames get from the engine to a wire and back.
//!
//! Every driver implements the one small [`Driver`] trait. The engine above it only ever sees
//! complete Ethernet frames (`Ethernet | IP | UDP 4791 | BTH | ... | ICRC`), whatever the
//! driver does underneath:
//!
//! | driver | mode | what it does | ICRC of received frames |
//! |---|---|---|---|
//! | [`xdp::XdpDriver`] | `xdp-copy`, `xdp-zerocopy` | an XDP program steers UDP 4791 to an AF_XDP socket; frames are sent raw | verifiable |
//! | [`udp::UdpDriver`] | `udp` | a kernel UDP socket on port 4791; frames are rewritten to what the kernel emits | not verifiable (the socket hides the IP header) |
//! | [`relay::RelayDriver`] | `relay` | frames to and from the interface's relay (`xroce relay`), which owns its AF_XDP driver: several processes on one interface | as the relay's driver |
//! | [`mem::MemDriver`] | `mem` | two in-process ends joined by queues, with seeded loss and a cut switch (tests, `xroce demo --driver sim`) | verifiable |
//!
//! [`tap::PcapTap`] wraps any of them and writes every frame sent and received to a pcap file
//! (`--pcap FILE` of the tools): over AF_XDP, `tcpdump` on the interface sees no RoCE frames.
//!
//! Beside the drivers: [`iface`] (an interface's index, MAC, MTU, queues), [`wait`] (sleeping
//! on file descriptors) and [`sigpipe`] (the command's SIGPIPE disposition). The
//! application's memory that memory regions are registered on is [`crate::dma`], the other
//! half of the driver layer, on the floor below the engine (which keeps it).
//!
//! This and [`crate::dma`] are the crate's only modules allowed `unsafe` code
//! (`#![deny(unsafe_code)]` holds everywhere else): the AF_XDP rings and UMEM of xsk-rs,
//! libbpf calls that have no safe wrapper, `signal(2)`. Every block carries a `// Safety:`
//! comment saying why it holds.
//! System calls go through rustix's safe API wherever it has one.
//!
//! # Calling order
//! A progress loop typically does: `send` each frame the engine produced, `flush` once,
//! `recv` a batch, and when there is nothing to do, wait for [`Driver::wait_fd`] to become
//! readable ([`wait::wait_readable`], with a timeout = the engine's next timer) before going
//! round again.
//!
//! To skip the copy from the engine's buffer into the driver's, transmit with
//! [`Driver::send_with`]: `driver.send_with(len, &mut |buf| engine.poll_transmit(now, buf))`
//! lets the engine emit the frame straight into an AF_XDP UMEM frame (for `len` up to
//! [`Driver::send_with_room`]; `len` = `engine::transmit_buffer_len` of the QPs' path MTU). Receiving
//! is copy-free already: `recv` hands `on_frame` the frame where the kernel put it (for
//! AF_XDP, in the UMEM), and the engine copies the payload from there into the MR once.
//! AF_XDP rings are batched both ways: `send`/`send_with` only queue descriptors and
//! `flush` submits them to the TX ring at once; `recv` consumes up to a batch of RX
//! descriptors per ring access and gives the batch back to the fill ring in one submit.

pub mod iface;
pub mod mem;
pub mod relay;
pub mod sigpipe;
pub mod tap;
pub mod udp;
pub mod wait;
#[cfg(feature = "xdp")]
pub mod xdp;

pub use wait::{poll_readable, wait_readable};

use std::fmt;
use std::os::fd::BorrowedFd;

use rustix::io::Errno;

/// A source and sink of whole Ethernet frames.
///
/// Implementations never block: `send` queues, `flush` kicks the kernel, `recv` returns what
/// is there now. Malformed or foreign frames are dropped and counted by the driver, never
/// handed to the engine half-parsed.
pub trait Driver: Send {
    /// Queue one complete Ethernet frame (without FCS) for transmission.
    ///
    /// Returns [`DriverError::TxBusy`] when no transmit slot is free even after reclaiming
    /// completed ones: call [`Driver::flush`] and retry later (back-pressure, not a failure).
    fn send(&mut self, frame: &[u8]) -> Result<(), DriverError>;

    /// Queue one frame written by `fill` straight into the driver's transmit buffer: `fill`
    /// gets a buffer of exactly `max_len` bytes, writes a frame at its start and returns the
    /// frame's length, or `None` when it has nothing to send (the slot stays free). Returns
    /// the length queued, or `None` if `fill` sent nothing.
    ///
    /// A driver that owns its transmit memory (AF_XDP: a UMEM frame) hands `fill` that
    /// memory, so the frame is never copied, and calls `fill` only once a slot is reserved:
    /// [`DriverError::TxBusy`] then means `fill` was not called. The default implementation
    /// lets `fill` write into a per-thread scratch buffer and passes the frame to
    /// [`Driver::send`]; if that is busy even after a [`Driver::flush`] the frame is lost
    /// (returned as `TxBusy`), like a frame lost on the wire.
    fn send_with(
        &mut self,
        max_len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> Result<Option<usize>, DriverError> {
        send_through_scratch(self, max_len, fill)
    }

    /// The largest `max_len` for which [`Driver::send_with`] hands `fill` the driver's own
    /// transmit memory; a larger one goes through a scratch buffer and a copy. AF_XDP: one
    /// UMEM chunk's room (3840 bytes with 4096-byte chunks: enough for path MTU 2048 frames,
    /// not for 4096, which span two chunks). `usize::MAX` for drivers with no such limit.
    fn send_with_room(&self) -> usize {
        usize::MAX
    }

    /// Push queued frames to the wire (AF_XDP: kick the kernel when it asked for a wakeup).
    fn flush(&mut self) -> Result<(), DriverError>;

    /// Deliver up to `max` received frames to `on_frame`, oldest first; returns how many.
    ///
    /// The slice passed to `on_frame` is only valid during the call (it may point into
    /// driver-owned memory that is recycled right after).
    fn recv(
        &mut self,
        max: usize,
        on_frame: &mut dyn FnMut(&[u8], RxMeta),
    ) -> Result<usize, DriverError>;

    /// A file descriptor that becomes readable when frames may be waiting (for poll/epoll).
    /// `None` means the driver must be polled (busy-poll).
    fn wait_fd(&self) -> Option<BorrowedFd<'_>>;

    /// What this driver is attached to and how.
    fn info(&self) -> DriverInfo;

    /// The XDP program's counters, for drivers that have one.
    fn xdp_stats(&self) -> Option<XdpStats> {
        None
    }

    /// A frame the device looped back to itself (addressed to its own GID) without handing
    /// it to any driver: seen here once, when it is received. Nothing to do but for a
    /// capture, which records it as the link it never crossed would have shown it.
    fn note_looped_back(&mut self, _frame: &[u8]) {}

    /// `Some(p)`: this driver carries only the QPNs with `p` in bits 16..23, and the device's
    /// engine must number its QPs so ([`crate::engine::EngineConfig::qpn_prefix`]): a
    /// [`relay::RelayDriver`]'s slot. `None` (every other driver): any QPN.
    fn qpn_prefix(&self) -> Option<u8> {
        None
    }

    /// The relay this driver goes through and the slot it holds: where the device's CM
    /// registers the service ids it listens on ([`relay::ServiceRegistration`]). `None` for
    /// every driver but [`relay::RelayDriver`].
    fn relay_endpoint(&self) -> Option<relay::RelayEndpoint> {
        None
    }
}

impl<D: Driver + ?Sized> Driver for Box<D> {
    fn send(&mut self, frame: &[u8]) -> Result<(), DriverError> {
        (**self).send(frame)
    }
    fn send_with(
        &mut self,
        max_len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> Result<Option<usize>, DriverError> {
        (**self).send_with(max_len, fill)
    }
    fn send_with_room(&self) -> usize {
        (**self).send_with_room()
    }
    fn flush(&mut self) -> Result<(), DriverError> {
        (**self).flush()
    }
    fn recv(
        &mut self,
        max: usize,
        on_frame: &mut dyn FnMut(&[u8], RxMeta),
    ) -> Result<usize, DriverError> {
        (**self).recv(max, on_frame)
    }
    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        (**self).wait_fd()
    }
    fn info(&self) -> DriverInfo {
        (**self).info()
    }
    fn xdp_stats(&self) -> Option<XdpStats> {
        (**self).xdp_stats()
    }
    fn note_looped_back(&mut self, frame: &[u8]) {
        (**self).note_looped_back(frame)
    }
    fn qpn_prefix(&self) -> Option<u8> {
        (**self).qpn_prefix()
    }
    fn relay_endpoint(&self) -> Option<relay::RelayEndpoint> {
        (**self).relay_endpoint()
    }
}

thread_local! {
    /// The frame buffer of [`send_through_scratch`], kept per thread so that sending
    /// through it does not allocate after the first frame.
    static TX_SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// [`Driver::send_with`] for drivers without their own transmit memory: `fill` writes into a
/// reused buffer and the frame goes to [`Driver::send`] (flushing once if that is busy).
pub fn send_through_scratch<D: Driver + ?Sized>(
    driver: &mut D,
    max_len: usize,
    fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
) -> Result<Option<usize>, DriverError> {
    // Taken out of the cell while in use: a nested call simply gets a new buffer.
    let mut buf = TX_SCRATCH.take();
    if buf.len() < max_len {
        buf.resize(max_len, 0);
    }
    let result = match fill(&mut buf[..max_len]) {
        None => Ok(None),
        Some(len) if len > max_len => Err(DriverError::InvalidFrame {
            reason: format!("the frame writer reported {len} bytes in a {max_len}-byte buffer"),
        }),
        Some(len) => match driver.send(&buf[..len]) {
            Err(DriverError::TxBusy) => driver
                .flush()
                .and_then(|()| driver.send(&buf[..len]))
                .map(|()| Some(len)),
            other => other.map(|()| Some(len)),
        },
    };
    TX_SCRATCH.set(buf);
    result
}

/// What the driver knows about one received frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxMeta {
    /// The frame carries the IP header that was really on the wire, so its ICRC can be
    /// checked. `false` for the UDP driver, which synthesizes the Ethernet/IP/UDP headers.
    pub icrc_verifiable: bool,
}

/// How a driver moves frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DriverMode {
    /// AF_XDP socket in copy mode (the kernel copies frames into the UMEM).
    XdpCopy,
    /// AF_XDP socket in zero-copy mode (the NIC DMAs straight into the UMEM).
    XdpZeroCopy,
    /// A kernel UDP socket on port 4791.
    Udp,
    /// The in-memory simulator.
    Mem,
    /// Through the interface's relay (`xroce relay`).
    Relay,
}

impl DriverMode {
    /// The short name shown by `xroce devinfo` ("xdp-copy", "xdp-zerocopy", "udp", ...).
    pub fn as_str(self) -> &'static str {
        match self {
            DriverMode::XdpCopy => "xdp-copy",
            DriverMode::XdpZeroCopy => "xdp-zerocopy",
            DriverMode::Udp => "udp",
            DriverMode::Mem => "mem",
            DriverMode::Relay => "relay",
        }
    }
}

impl fmt::Display for DriverMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where and how a driver is attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverInfo {
    /// Interface name (or a descriptive name for drivers without one).
    pub name: String,
    /// How frames are moved.
    pub mode: DriverMode,
    /// Kernel interface index (0 when there is no interface).
    pub ifindex: u32,
    /// The interface's MAC address: the source MAC of frames this endpoint sends.
    pub mac: [u8; 6],
    /// The link MTU (IP packet size) in bytes.
    pub mtu: u32,
    /// Largest Ethernet frame (headers included, no FCS) that `send` accepts and `recv`
    /// can deliver.
    pub max_frame: usize,
    /// Whether received frames carry the real wire IP header, so their ICRC can be checked.
    pub icrc_verifiable: bool,
    /// How the XDP program is attached ("native", "generic"), for XDP drivers.
    pub xdp_attach: Option<&'static str>,
    /// Anything a user should know about this driver (shown by `xroce devinfo`).
    pub note: Option<String>,
}

/// Counters of the XDP program, summed over all CPUs, plus the AF_XDP socket's own drops.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct XdpStats {
    /// Frames the XDP program looked at.
    pub seen: u64,
    /// UDP 4791 frames redirected to the AF_XDP socket.
    pub redirected: u64,
    /// Frames passed on to the kernel stack (not RoCE).
    pub passed: u64,
    /// Frames with a truncated or inconsistent header (passed to the kernel, which drops them).
    pub malformed: u64,
    /// UDP 4791 frames that arrived on a receive queue with no AF_XDP socket bound.
    pub no_socket: u64,
    /// UDP 4791 frames behind headers xroce does not take (stacked or 802.1ad VLAN tags,
    /// IPv6 extension headers), passed to the kernel.
    pub unsupported: u64,
    /// Frames dropped for the socket: by the kernel (e.g. larger than a UMEM chunk without
    /// multi-buffer, or no fill buffer) or by the driver (multi-buffer frame too large).
    pub sock_rx_dropped: u64,
    /// Frames lost because the socket's RX ring was full.
    pub sock_rx_ring_full: u64,
    /// Times the fill ring was empty when a frame arrived.
    pub sock_fill_ring_empty: u64,
    /// Invalid TX descriptors the kernel rejected.
    pub sock_tx_invalid: u64,
}

/// Why a driver could not be opened or could not move a frame.
///
/// Each message names the cause and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The process lacks the privileges the operation needs.
    #[error(
        "{what}: permission denied; AF_XDP and XDP need CAP_NET_ADMIN, CAP_BPF and \
         CAP_NET_RAW (run as root, or use the UDP driver: --driver udp)"
    )]
    NotPermitted {
        /// What was being done.
        what: String,
    },
    /// No interface of that name exists (in this network namespace).
    #[error("interface {ifname:?} does not exist in this network namespace (check `ip link`)")]
    InterfaceMissing {
        /// The interface name asked for.
        ifname: String,
    },
    /// The interface exists but is administratively down.
    #[error("interface {ifname:?} is down; bring it up with `ip link set dev {ifname} up`")]
    InterfaceDown {
        /// The interface name.
        ifname: String,
    },
    /// Another XDP program is already attached; xroce will not replace it.
    #[error(
        "another XDP program (id {prog_id}) is attached to {ifname:?}; xroce will not replace \
         it. Detach it (`ip link set dev {ifname} xdp off`, or stop the program that owns its \
         link) or use the UDP driver"
    )]
    XdpProgramAttached {
        /// The interface name.
        ifname: String,
        /// The kernel's id of the program already attached (0 if unknown).
        prog_id: u32,
    },
    /// xroce's own XDP program is attached already: another xroce process uses the
    /// interface (one xroce device per interface).
    #[error(
        "another xroce process already uses {ifname:?} (its XDP program, id {prog_id}, is \
         attached): one xroce device per interface. To share it, run `xroce relay -d {ifname}` \
         before the processes that use it (they connect to it by themselves, or with \
         --driver relay / XROCE_DRIVER=relay); else stop that process, or run this one on \
         another interface; do not detach the program, that would cut the other xroce off"
    )]
    XroceAlreadyAttached {
        /// The interface name.
        ifname: String,
        /// The kernel's id of the other xroce's program.
        prog_id: u32,
    },
    /// Binding the AF_XDP socket kept failing with EBUSY.
    #[error(
        "AF_XDP bind on {ifname:?} queue {queue} still busy after {attempts} attempts; another \
         AF_XDP socket is bound to that queue (or one was closed a moment ago): stop it and retry"
    )]
    BindBusy {
        /// The interface name.
        ifname: String,
        /// The receive queue.
        queue: u32,
        /// How many binds were tried.
        attempts: u32,
    },
    /// Engine shards asked for that the interface has no queues for (each shard needs its own
    /// receive and transmit queue), or zero shards.
    #[error(
        "{shards} AF_XDP shard(s) asked for on {ifname:?}, which has queues for 1 to {queues} \
         (each shard owns a receive queue and transmits on its own queue). Add queues with \
         `ethtool -L {ifname} combined N` (veth: create the pair with \
         `ip link add ... numtxqueues N numrxqueues N`), or ask for fewer shards"
    )]
    ShardsOutOfRange {
        /// The interface name.
        ifname: String,
        /// How many shards were asked for.
        shards: u32,
        /// The most shards the interface can take: its usable receive queues (at most the
        /// XSKMAP's slots), or fewer transmit queues.
        queues: u32,
    },
    /// The NIC driver cannot do zero-copy AF_XDP.
    #[error(
        "zero-copy AF_XDP is not supported on {ifname:?} (veth and most virtual NICs only do \
         copy mode); use copy mode"
    )]
    ZeroCopyUnsupported {
        /// The interface name.
        ifname: String,
    },
    /// A frame is larger than the driver can carry.
    #[error("frame of {len} bytes exceeds this driver's maximum of {max} bytes (lower the path MTU, or use larger UMEM chunks)")]
    FrameTooLarge {
        /// The frame's length.
        len: usize,
        /// The largest frame accepted.
        max: usize,
    },
    /// A frame handed to `send` is not something this driver can transmit.
    #[error("cannot send this frame: {reason}")]
    InvalidFrame {
        /// What is wrong with it.
        reason: String,
    },
    /// No transmit slot is free right now (back-pressure).
    #[error("transmit ring full; call flush() and retry")]
    TxBusy,
    /// No relay serves the interface (nobody listens on its socket).
    #[error(
        "no xroce relay serves {ifname:?} (nothing listens on the abstract socket @{name}): \
         start one with `xroce relay -d {ifname}` (as root), then the processes that share \
         the interface"
    )]
    RelayMissing {
        /// The interface name.
        ifname: String,
        /// The relay's socket name.
        name: String,
    },
    /// The relay this device went through ended its connection.
    #[error("the xroce relay of {ifname:?} is gone: {reason}; restart it and reopen the device")]
    RelayGone {
        /// The interface name.
        ifname: String,
        /// What was seen.
        reason: String,
    },
    /// AF_XDP was asked for, but this build has no AF_XDP driver.
    #[error(
        "the AF_XDP driver is not available: xroce was built without the `xdp` feature \
         (rebuild with default features for AF_XDP, or use the UDP driver: --driver udp)"
    )]
    XdpNotBuilt,
    /// Loading or attaching the XDP program failed for another reason.
    #[error("XDP program: {reason}")]
    Bpf {
        /// libbpf's or the kernel's explanation.
        reason: String,
    },
    /// A configuration value is out of range.
    #[error("invalid driver configuration: {reason}")]
    Config {
        /// Which value and why.
        reason: String,
    },
    /// Any other system call failure.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl DriverError {
    /// Wrap an I/O error, turning EPERM/EACCES into [`DriverError::NotPermitted`].
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        let context = context.into();
        match Errno::from_io_error(&source) {
            Some(Errno::PERM | Errno::ACCESS) => DriverError::NotPermitted { what: context },
            _ => DriverError::Io { context, source },
        }
    }

    /// Whether this error means "not privileged enough".
    pub fn is_not_permitted(&self) -> bool {
        matches!(self, DriverError::NotPermitted { .. })
    }
}
