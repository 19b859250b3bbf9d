//! Several processes on one interface: a relay owns the interface's driver, each process
//! connects to it with a [`RelayDriver`] and runs its own engine.
//!
//! An AF_XDP socket is bound to one (interface, queue), the XDP program can redirect a frame
//! only to a socket bound to the queue it arrived on, and xroce's program is attached once
//! per interface: so one process owns the interface. Sharing its UMEM and rings with other
//! processes would need the fds passed and the rings mapped in every process, with every
//! process trusting every other with the producer/consumer indices. The relay instead keeps
//! one owner of the socket (`xroce relay -d IFACE`, or [`Relay::spawn`] in-process) and
//! passes whole frames to and from its clients over a Unix `SOCK_SEQPACKET` socket, one
//! frame per message.
//!
//! # Steering
//! Every client gets a *slot* (1..=255) when it connects, and its engine numbers its QPs with
//! the slot in bits 16..23 of the 24-bit QPN ([`crate::engine::EngineConfig::qpn_prefix`],
//! which [`Driver::qpn_prefix`] hands the device). So the BTH destination QP of a frame names
//! its process:
//! - from the wire: to the client of slot `dest_qp >> 16`; no such client (QPN 0, a QPN
//!   below 2^16, a slot nobody holds, a frame too short for a BTH): dropped and counted.
//!   QP1, the GSI (management datagrams, the CM's), is dropped and counted apart
//!   (`dropped_gsi`): the GSI is one per port, and no client's engine holds QP1 (its QPNs are
//!   its slot's). Serving it behind a relay would take one designated client (or the relay
//!   itself) owning QP1 and passing MADs on; not done yet.
//! - from a client: to one of the interface's own addresses with another client's slot: to
//!   that client directly (two processes of one host talking to each other: the wire would
//!   not bring the frame back); to an own address with a slot nobody holds: dropped and
//!   counted; anything else: out of the driver.
//!
//! # The socket
//! The relay listens on the abstract Unix socket `xroce-relay-<ifname>` ([`socket_name`]):
//! abstract names belong to a network namespace, as interface names do, and vanish with the
//! relay (nothing to clean up). It accepts only peers of its own user id or root.
//!
//! When a client's connection ends (the process exited or was killed) its slot is freed;
//! frames still arriving for its QPNs are dropped and counted. When the relay ends, every
//! client's next `recv`/`send` fails with [`DriverError::RelayGone`], and the device stops
//! with that reason: verbs calls then fail instead of waiting.

use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketAddrUnix, SocketFlags, SocketType};

use super::{Driver, DriverError, DriverInfo, DriverMode, RxMeta};

/// The most clients a relay serves at once (slots 1..=255: a QPN has 8 bits above 16).
pub const MAX_SLOTS: usize = 255;

/// Frames moved per client and per direction before the relay looks at the others.
const BATCH: usize = 64;

/// Socket buffer asked for on both ends of a client connection: a burst of ~1000 full
/// frames (the kernel caps it at `net.core.wmem_max` unless the relay is privileged).
const SOCKET_BUFFER: usize = 4 << 20;

/// The first message of the relay on a new connection.
const HELLO_MAGIC: [u8; 4] = *b"XRL1";
const HELLO_LEN: usize = 16;

/// The abstract Unix socket name of the relay of interface `ifname`.
pub fn socket_name(ifname: &str) -> String {
    format!("xroce-relay-{ifname}")
}

/// The slot a QPN names (its bits 16..23); 0 for QPNs no client owns.
pub fn slot_of_qpn(qpn: u32) -> u8 {
    ((qpn >> 16) & 0xff) as u8
}

/// Where a frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Steer {
    /// To the client of this slot.
    Client(u8),
    /// Out of the relay's driver.
    Wire,
    /// Nowhere: counted under this reason.
    Drop(DropReason),
}

/// Why the relay dropped a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Not RoCEv2, or too short for a BTH.
    NotRoce,
    /// The destination QPN names no connected client.
    NoClient,
    /// To QP1, the GSI, which no client holds.
    Gsi,
}

/// Where a frame received from the wire goes: `connected(slot)` says which slots are held.
pub fn steer_from_wire(frame: &[u8], connected: impl Fn(u8) -> bool) -> Steer {
    match crate::wire::frame::frame_dest_qpn(frame) {
        None => Steer::Drop(DropReason::NotRoce),
        Some(crate::engine::GSI_QPN) => Steer::Drop(DropReason::Gsi),
        Some(qpn) => match slot_of_qpn(qpn) {
            0 => Steer::Drop(DropReason::NoClient),
            s if connected(s) => Steer::Client(s),
            _ => Steer::Drop(DropReason::NoClient),
        },
    }
}

/// Where a frame sent by a client goes: to another client when it is addressed to one of
/// `local_ips` (the interface's own addresses), else to the wire.
pub fn steer_from_client(
    frame: &[u8],
    local_ips: &[IpAddr],
    connected: impl Fn(u8) -> bool,
) -> Steer {
    let to_self =
        crate::wire::frame::frame_dest_ip(frame).is_some_and(|ip| local_ips.contains(&ip));
    if !to_self {
        return Steer::Wire;
    }
    steer_from_wire(frame, connected)
}

/// The slots of a relay: which are held, the lowest free one first.
#[derive(Debug)]
pub struct Slots {
    held: [bool; MAX_SLOTS + 1],
}

impl Default for Slots {
    fn default() -> Self {
        Slots {
            held: [false; MAX_SLOTS + 1],
        }
    }
}

impl Slots {
    /// Takes the lowest free slot (1..=255), or `None` when all are held.
    pub fn take(&mut self) -> Option<u8> {
        let slot = (1..=MAX_SLOTS).find(|&s| !self.held[s])?;
        self.held[slot] = true;
        Some(slot as u8)
    }

    /// Frees `slot` (nothing if it was free).
    pub fn free(&mut self, slot: u8) {
        self.held[slot as usize] = false;
    }

    /// Whether `slot` is held (never slot 0).
    pub fn is_held(&self, slot: u8) -> bool {
        slot != 0 && self.held[slot as usize]
    }

    /// How many are held.
    pub fn count(&self) -> usize {
        self.held.iter().filter(|&&h| h).count()
    }
}

/// A relay's counters.
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Clients that connected (ever).
    pub connected: AtomicU64,
    /// Clients whose connection ended.
    pub disconnected: AtomicU64,
    /// Connections refused: no free slot, or a peer of another user.
    pub refused: AtomicU64,
    /// Frames from the wire handed to a client.
    pub wire_to_client: AtomicU64,
    /// Frames of a client sent out of the driver.
    pub client_to_wire: AtomicU64,
    /// Frames of a client handed to another client (both on this interface).
    pub client_to_client: AtomicU64,
    /// Frames dropped: the destination QPN names no connected client.
    pub dropped_no_client: AtomicU64,
    /// Frames dropped: not RoCEv2.
    pub dropped_not_roce: AtomicU64,
    /// Frames dropped: to QP1 (the GSI), which no client holds.
    pub dropped_gsi: AtomicU64,
    /// Frames dropped: the client's socket buffer was full (it does not keep up).
    pub dropped_client_full: AtomicU64,
    /// Frames dropped: the driver refused them (transmit ring full after a flush, ...).
    pub dropped_wire_tx: AtomicU64,
}

impl RelayStats {
    fn count(&self, reason: DropReason) {
        match reason {
            DropReason::NoClient => &self.dropped_no_client,
            DropReason::NotRoce => &self.dropped_not_roce,
            DropReason::Gsi => &self.dropped_gsi,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    /// A one-line summary.
    pub fn summary(&self) -> String {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "clients connected {} disconnected {} refused {}; frames wire->client {} \
             client->wire {} client->client {}; dropped: no client {} not RoCE {} \
             QP1 {} client full {} wire tx {}",
            g(&self.connected),
            g(&self.disconnected),
            g(&self.refused),
            g(&self.wire_to_client),
            g(&self.client_to_wire),
            g(&self.client_to_client),
            g(&self.dropped_no_client),
            g(&self.dropped_not_roce),
            g(&self.dropped_gsi),
            g(&self.dropped_client_full),
            g(&self.dropped_wire_tx),
        )
    }
}

fn io_err(context: impl Into<String>, e: Errno) -> DriverError {
    DriverError::io(context, std::io::Error::from(e))
}

fn seqpacket() -> Result<OwnedFd, DriverError> {
    rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )
    .map_err(|e| io_err("creating a Unix seqpacket socket", e))
}

fn abstract_addr(name: &str) -> Result<SocketAddrUnix, DriverError> {
    SocketAddrUnix::new_abstract_name(name.as_bytes())
        .map_err(|e| io_err(format!("the socket name {name:?}"), e))
}

fn grow_buffers(fd: BorrowedFd<'_>) {
    // Best effort: the defaults (~200 KiB) still work, with more drops under bursts.
    let _ = rustix::net::sockopt::set_socket_send_buffer_size(fd, SOCKET_BUFFER);
    let _ = rustix::net::sockopt::set_socket_recv_buffer_size(fd, SOCKET_BUFFER);
}

struct Client {
    fd: OwnedFd,
    pid: u32,
}

/// The relay of one interface: its driver, its listening socket, its clients.
pub struct Relay {
    name: String,
    ifname: String,
    listener: OwnedFd,
    driver: Box<dyn Driver>,
    local_ips: Vec<IpAddr>,
    slots: Slots,
    clients: Vec<Option<Client>>,
    stats: Arc<RelayStats>,
    uid: Option<u32>,
    buf: Vec<u8>,
}

impl Relay {
    /// A relay over `driver` (already opened on interface `ifname`, whose own addresses are
    /// `local_ips`), listening on the abstract socket `name` ([`socket_name`] for the one
    /// clients find by themselves). Fails if another relay listens on that name.
    pub fn bind(
        name: &str,
        ifname: &str,
        driver: Box<dyn Driver>,
        local_ips: Vec<IpAddr>,
    ) -> Result<Relay, DriverError> {
        let listener = seqpacket()?;
        rustix::net::bind(&listener, &abstract_addr(name)?).map_err(|e| match e {
            Errno::ADDRINUSE => DriverError::Config {
                reason: format!(
                    "another relay already serves {ifname:?} (the socket @{name} is bound)"
                ),
            },
            e => io_err(format!("binding the relay socket @{name}"), e),
        })?;
        rustix::net::listen(&listener, 64)
            .map_err(|e| io_err(format!("listening on @{name}"), e))?;
        use std::os::unix::fs::MetadataExt;
        let uid = std::fs::metadata("/proc/self").ok().map(|m| m.uid());
        let max_frame = driver.info().max_frame;
        Ok(Relay {
            name: name.to_string(),
            ifname: ifname.to_string(),
            listener,
            driver,
            local_ips,
            slots: Slots::default(),
            clients: (0..=MAX_SLOTS).map(|_| None).collect(),
            stats: Arc::default(),
            uid,
            buf: vec![0; max_frame.max(64) + 1],
        })
    }

    /// The relay of interface `ifname` over its AF_XDP driver (every receive queue), on the
    /// socket [`socket_name`]`(ifname)`.
    #[cfg(feature = "xdp")]
    pub fn open_xdp(ifname: &str) -> Result<Relay, DriverError> {
        let net = crate::netdev::query(ifname).map_err(|e| DriverError::Config {
            reason: format!("{ifname}: {e}"),
        })?;
        let local_ips = net.gid_table().iter().map(|g| g.gid.to_ip()).collect();
        let driver = super::xdp::XdpDriver::open(&super::xdp::XdpConfig::new(ifname))?;
        Relay::bind(&socket_name(ifname), ifname, Box::new(driver), local_ips)
    }

    /// The counters (shared: they stay readable while the relay runs on its thread).
    pub fn stats(&self) -> Arc<RelayStats> {
        self.stats.clone()
    }

    /// The driver the relay moves frames through.
    pub fn driver_info(&self) -> DriverInfo {
        self.driver.info()
    }

    /// Serves clients until `stop` is set (checked at least every 100 ms) or the driver fails.
    pub fn run(&mut self, stop: &AtomicBool) -> Result<(), DriverError> {
        let mut idle = false;
        while !stop.load(Ordering::Relaxed) {
            if idle {
                self.sleep(Duration::from_millis(100))?;
            }
            let moved = self.round()?;
            idle = moved == 0;
        }
        Ok(())
    }

    /// Runs the relay on a thread of its own until the handle is stopped or dropped.
    pub fn spawn(mut self) -> RelayHandle {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = self.stats.clone();
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("xroce-relay".into())
            .spawn(move || self.run(&thread_stop))
            .expect("spawning the relay thread");
        RelayHandle {
            stop,
            stats,
            thread: Some(thread),
        }
    }

    fn sleep(&self, timeout: Duration) -> Result<(), DriverError> {
        let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(2 + self.slots.count());
        fds.push(PollFd::new(&self.listener, PollFlags::IN));
        if let Some(fd) = self.driver.wait_fd() {
            fds.push(PollFd::from_borrowed_fd(fd, PollFlags::IN));
        }
        for c in self.clients.iter().flatten() {
            fds.push(PollFd::new(&c.fd, PollFlags::IN));
        }
        let timeout = Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: timeout.subsec_nanos() as i64,
        };
        match poll(&mut fds, Some(&timeout)) {
            Ok(_) | Err(Errno::INTR) => Ok(()),
            Err(e) => Err(io_err("relay poll", e)),
        }
    }

    /// One pass: new clients, the wire's frames, every client's frames. Returns the frames
    /// moved (and connections handled).
    pub fn round(&mut self) -> Result<usize, DriverError> {
        let mut moved = self.accept_all();
        moved += self.relay_wire()?;
        for slot in 1..=MAX_SLOTS as u8 {
            if self.clients[slot as usize].is_some() {
                moved += self.relay_client(slot);
            }
        }
        self.driver.flush()?;
        Ok(moved)
    }

    fn accept_all(&mut self) -> usize {
        let mut n = 0;
        loop {
            let fd = match rustix::net::accept_with(
                &self.listener,
                SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            ) {
                Ok(fd) => fd,
                Err(Errno::INTR) => continue,
                Err(_) => return n,
            };
            n += 1;
            let cred = rustix::net::sockopt::socket_peercred(&fd).ok();
            let peer_uid = cred.map(|c| c.uid.as_raw());
            let allowed = match (peer_uid, self.uid) {
                (Some(peer), Some(me)) => peer == me || peer == 0,
                _ => false,
            };
            let slot = if allowed { self.slots.take() } else { None };
            let mut hello = [0u8; HELLO_LEN];
            hello[..4].copy_from_slice(&HELLO_MAGIC);
            hello[4] = slot.unwrap_or(0);
            let info = self.driver.info();
            hello[5] = u8::from(info.icrc_verifiable);
            hello[6] = u8::from(!allowed);
            hello[8..12].copy_from_slice(&(info.max_frame as u32).to_le_bytes());
            hello[12..16].copy_from_slice(&info.mtu.to_le_bytes());
            let _ = rustix::net::send(&fd, &hello, SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
            let Some(slot) = slot else {
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(relay = %self.name, ?peer_uid, allowed, "client refused");
                continue;
            };
            grow_buffers(fd.as_fd());
            let pid = cred.map_or(0, |c| c.pid.as_raw_nonzero().get() as u32);
            tracing::info!(relay = %self.name, slot, pid, "client connected");
            self.stats.connected.fetch_add(1, Ordering::Relaxed);
            self.clients[slot as usize] = Some(Client { fd, pid });
        }
    }

    fn drop_client(&mut self, slot: u8, why: &str) {
        if let Some(c) = self.clients[slot as usize].take() {
            tracing::info!(relay = %self.name, slot, pid = c.pid, why, "client gone");
            self.slots.free(slot);
            self.stats.disconnected.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Hands `frame` to the client of `slot`; a full socket drops the frame (the transport
    /// retries), a closed one ends the client.
    fn to_client(
        clients: &[Option<Client>],
        stats: &RelayStats,
        dead: &mut Vec<u8>,
        slot: u8,
        frame: &[u8],
    ) -> bool {
        let Some(c) = &clients[slot as usize] else {
            stats.count(DropReason::NoClient);
            return false;
        };
        match rustix::net::send(&c.fd, frame, SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
            Ok(_) => true,
            Err(Errno::AGAIN) => {
                stats.dropped_client_full.fetch_add(1, Ordering::Relaxed);
                false
            }
            Err(_) => {
                stats.count(DropReason::NoClient);
                dead.push(slot);
                false
            }
        }
    }

    fn relay_wire(&mut self) -> Result<usize, DriverError> {
        let mut dead = Vec::new();
        let (slots, clients, stats) = (&self.slots, &self.clients, &*self.stats);
        let n = self.driver.recv(
            BATCH,
            &mut |frame, _meta| match steer_from_wire(frame, |s| slots.is_held(s)) {
                Steer::Client(slot) => {
                    if Self::to_client(clients, stats, &mut dead, slot, frame) {
                        stats.wire_to_client.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Steer::Drop(reason) => stats.count(reason),
                Steer::Wire => unreachable!("steer_from_wire never sends back to the wire"),
            },
        )?;
        for slot in dead {
            self.drop_client(slot, "its socket is closed");
        }
        Ok(n)
    }

    fn relay_client(&mut self, slot: u8) -> usize {
        let mut dead = Vec::new();
        let mut moved = 0;
        let mut gone = None;
        for _ in 0..BATCH {
            let Some(c) = &self.clients[slot as usize] else {
                break;
            };
            let len = match rustix::net::recv(&c.fd, &mut self.buf[..], RecvFlags::DONTWAIT) {
                Ok((0, _)) => {
                    gone = Some("its connection ended");
                    break;
                }
                Ok((n, full)) if full > n => {
                    // Larger than the driver takes: not ours to cut.
                    self.stats.dropped_wire_tx.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Ok((n, _)) => n,
                Err(Errno::AGAIN) => break,
                Err(Errno::INTR) => continue,
                Err(_) => {
                    gone = Some("its socket failed");
                    break;
                }
            };
            moved += 1;
            let frame = &self.buf[..len];
            let slots = &self.slots;
            match steer_from_client(frame, &self.local_ips, |s| slots.is_held(s)) {
                Steer::Client(to) => {
                    if Self::to_client(&self.clients, &self.stats, &mut dead, to, frame) {
                        self.stats.client_to_client.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Steer::Drop(reason) => self.stats.count(reason),
                Steer::Wire => {
                    let sent = match self.driver.send(frame) {
                        Err(DriverError::TxBusy) => {
                            self.driver.flush().and_then(|()| self.driver.send(frame))
                        }
                        other => other,
                    };
                    match sent {
                        Ok(()) => self.stats.client_to_wire.fetch_add(1, Ordering::Relaxed),
                        Err(_) => self.stats.dropped_wire_tx.fetch_add(1, Ordering::Relaxed),
                    };
                }
            }
        }
        for s in dead {
            self.drop_client(s, "its socket is closed");
        }
        if let Some(why) = gone {
            self.drop_client(slot, why);
        }
        moved
    }

    /// The interface this relay serves.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }
}

/// A relay running on its own thread ([`Relay::spawn`]): stops it when dropped.
pub struct RelayHandle {
    stop: Arc<AtomicBool>,
    stats: Arc<RelayStats>,
    thread: Option<std::thread::JoinHandle<Result<(), DriverError>>>,
}

impl RelayHandle {
    /// The relay's counters.
    pub fn stats(&self) -> &RelayStats {
        &self.stats
    }

    /// Stops the relay (closing every client's connection) and returns how it ended.
    pub fn stop(mut self) -> Result<(), DriverError> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<(), DriverError> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|_| {
                Err(DriverError::Config {
                    reason: "the relay thread panicked".into(),
                })
            }),
            None => Ok(()),
        }
    }
}

impl Drop for RelayHandle {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

/// A process's end of a relay: the [`Driver`] of a device on an interface a relay owns.
#[derive(Debug)]
pub struct RelayDriver {
    fd: OwnedFd,
    ifname: String,
    name: String,
    slot: u8,
    info: DriverInfo,
    buf: Vec<u8>,
}

impl RelayDriver {
    /// Connects to the relay of `ifname` ([`socket_name`]).
    pub fn connect(ifname: &str) -> Result<RelayDriver, DriverError> {
        RelayDriver::connect_name(&socket_name(ifname), ifname)
    }

    /// Connects to the relay listening on the abstract socket `name`, serving `ifname`.
    pub fn connect_name(name: &str, ifname: &str) -> Result<RelayDriver, DriverError> {
        let fd = seqpacket()?;
        match rustix::net::connect(&fd, &abstract_addr(name)?) {
            Ok(()) | Err(Errno::INPROGRESS) => {}
            Err(Errno::CONNREFUSED | Errno::NOENT) => {
                return Err(DriverError::RelayMissing {
                    ifname: ifname.to_string(),
                    name: name.to_string(),
                })
            }
            Err(e) => return Err(io_err(format!("connecting to the relay @{name}"), e)),
        }
        let gone = |reason: &str| DriverError::RelayGone {
            ifname: ifname.to_string(),
            reason: reason.to_string(),
        };
        let mut hello = [0u8; HELLO_LEN];
        let readable = super::wait::poll_readable(fd.as_fd(), Some(Duration::from_secs(5)))
            .map_err(|e| DriverError::io("waiting for the relay's greeting", e))?;
        if !readable {
            return Err(gone("it did not greet within 5 s"));
        }
        let n = match rustix::net::recv(&fd, &mut hello[..], RecvFlags::DONTWAIT) {
            Ok((n, _)) => n,
            Err(e) => return Err(gone(&format!("reading its greeting: {e}"))),
        };
        if n != HELLO_LEN || hello[..4] != HELLO_MAGIC {
            return Err(gone(
                "its greeting is not an xroce relay's (another version?)",
            ));
        }
        if hello[6] != 0 {
            return Err(DriverError::Config {
                reason: format!(
                    "the relay of {ifname:?} refused this process: it serves only its own user \
                     and root"
                ),
            });
        }
        let slot = hello[4];
        if slot == 0 {
            return Err(DriverError::Config {
                reason: format!(
                    "the relay of {ifname:?} has no free slot ({MAX_SLOTS} processes use it)"
                ),
            });
        }
        grow_buffers(fd.as_fd());
        let max_frame = u32::from_le_bytes(hello[8..12].try_into().expect("4 bytes")) as usize;
        let mtu = u32::from_le_bytes(hello[12..16].try_into().expect("4 bytes"));
        let iface = super::iface::interface_info(ifname).ok();
        let info = DriverInfo {
            name: ifname.to_string(),
            mode: DriverMode::Relay,
            ifindex: iface.as_ref().map_or(0, |i| i.ifindex),
            mac: iface.as_ref().map_or([0; 6], |i| i.mac),
            mtu,
            max_frame,
            icrc_verifiable: hello[5] != 0,
            xdp_attach: None,
            note: Some(format!(
                "through the relay @{name}, slot {slot} (QPNs {:#08x}..={:#08x})",
                u32::from(slot) << 16,
                (u32::from(slot) << 16) | 0xffff
            )),
        };
        Ok(RelayDriver {
            fd,
            ifname: ifname.to_string(),
            name: name.to_string(),
            slot,
            info,
            buf: vec![0; max_frame.max(64)],
        })
    }

    /// The slot the relay gave this process (the prefix of its QPNs).
    pub fn slot(&self) -> u8 {
        self.slot
    }

    fn gone(&self, reason: impl Into<String>) -> DriverError {
        DriverError::RelayGone {
            ifname: self.ifname.clone(),
            reason: format!("{} (socket @{})", reason.into(), self.name),
        }
    }
}

impl Driver for RelayDriver {
    fn send(&mut self, frame: &[u8]) -> Result<(), DriverError> {
        if frame.len() > self.info.max_frame {
            return Err(DriverError::FrameTooLarge {
                len: frame.len(),
                max: self.info.max_frame,
            });
        }
        match rustix::net::send(&self.fd, frame, SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
            Ok(_) => Ok(()),
            Err(Errno::AGAIN) => Err(DriverError::TxBusy),
            Err(e @ (Errno::PIPE | Errno::CONNRESET | Errno::NOTCONN)) => {
                Err(self.gone(format!("sending: {e}")))
            }
            Err(e) => Err(io_err("sending to the relay", e)),
        }
    }

    fn flush(&mut self) -> Result<(), DriverError> {
        Ok(())
    }

    fn recv(
        &mut self,
        max: usize,
        on_frame: &mut dyn FnMut(&[u8], RxMeta),
    ) -> Result<usize, DriverError> {
        let meta = RxMeta {
            icrc_verifiable: self.info.icrc_verifiable,
        };
        let mut n = 0;
        while n < max {
            match rustix::net::recv(&self.fd, &mut self.buf[..], RecvFlags::DONTWAIT) {
                Ok((0, _)) => return Err(self.gone("it closed the connection (relay stopped?)")),
                Ok((len, _)) => {
                    n += 1;
                    on_frame(&self.buf[..len], meta);
                }
                Err(Errno::AGAIN) => break,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(self.gone(format!("receiving: {e}"))),
            }
        }
        Ok(n)
    }

    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.fd.as_fd())
    }

    fn info(&self) -> DriverInfo {
        self.info.clone()
    }

    fn qpn_prefix(&self) -> Option<u8> {
        Some(self.slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::mem::{MemDriver, MemLinkConfig};

    /// A RoCEv2 frame to `dst` for QPN `qpn`, as the engine's frame builder writes it.
    fn frame_to(dst: [u8; 4], qpn: u32) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8 + 12 + 4];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let ip = &mut f[14..34];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&((20 + 8 + 12 + 4) as u16).to_be_bytes());
        ip[8] = 64;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&[198, 18, 0, 9]);
        ip[16..20].copy_from_slice(&dst);
        let udp = &mut f[34..42];
        udp[0..2].copy_from_slice(&49152u16.to_be_bytes());
        udp[2..4].copy_from_slice(&4791u16.to_be_bytes());
        udp[4..6].copy_from_slice(&((8 + 12 + 4) as u16).to_be_bytes());
        let bth = &mut f[42..54];
        bth[0] = 0x04; // RC SEND only
        bth[1] = 0x40; // pad 0, version 0, migreq 1
        bth[2..4].copy_from_slice(&0xffffu16.to_be_bytes());
        bth[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        f
    }

    #[test]
    fn slots_are_taken_lowest_first_and_freed() {
        let mut s = Slots::default();
        assert_eq!(s.take(), Some(1));
        assert_eq!(s.take(), Some(2));
        assert!(s.is_held(1) && s.is_held(2) && !s.is_held(3) && !s.is_held(0));
        s.free(1);
        assert!(!s.is_held(1));
        assert_eq!(s.take(), Some(1));
        for _ in 3..=255 {
            assert!(s.take().is_some());
        }
        assert_eq!(s.count(), 255);
        assert_eq!(s.take(), None, "256 clients: no slot left");
    }

    #[test]
    fn wire_frames_go_to_the_slot_in_bits_16_to_23_of_the_dest_qpn() {
        let held = |s: u8| s == 1 || s == 7;
        assert_eq!(slot_of_qpn(0x07_0011), 7);
        assert_eq!(
            steer_from_wire(&frame_to([198, 18, 0, 1], 0x07_0011), held),
            Steer::Client(7)
        );
        assert_eq!(
            steer_from_wire(&frame_to([198, 18, 0, 1], 0x01_ffff), held),
            Steer::Client(1)
        );
        // QP1: dropped as the GSI's.
        assert_eq!(
            steer_from_wire(&frame_to([198, 18, 0, 1], 1), held),
            Steer::Drop(DropReason::Gsi)
        );
        // A slot nobody holds, QP0 and the QPNs of an unprefixed engine: no client.
        for qpn in [0x02_0011, 0, 0x11, 0xffff] {
            assert_eq!(
                steer_from_wire(&frame_to([198, 18, 0, 1], qpn), held),
                Steer::Drop(DropReason::NoClient),
                "{qpn:#x}"
            );
        }
        assert_eq!(
            steer_from_wire(&[0u8; 20], held),
            Steer::Drop(DropReason::NotRoce)
        );
    }

    #[test]
    fn client_frames_to_an_own_address_go_to_the_other_client_the_rest_to_the_wire() {
        let local: Vec<IpAddr> = vec![[198, 18, 0, 1].into()];
        let held = |s: u8| s == 1 || s == 2;
        assert_eq!(
            steer_from_client(&frame_to([198, 18, 0, 1], 0x02_0012), &local, held),
            Steer::Client(2)
        );
        assert_eq!(
            steer_from_client(&frame_to([198, 18, 0, 1], 0x03_0012), &local, held),
            Steer::Drop(DropReason::NoClient)
        );
        // To the peer: the wire, whatever the QPN says.
        assert_eq!(
            steer_from_client(&frame_to([198, 18, 0, 2], 0x02_0012), &local, held),
            Steer::Wire
        );
    }

    fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        let end = std::time::Instant::now() + Duration::from_secs(5);
        while !cond() {
            assert!(
                std::time::Instant::now() < end,
                "timed out waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn recv_one(d: &mut dyn Driver) -> Vec<u8> {
        let mut got = Vec::new();
        wait_for("a frame", || {
            d.recv(1, &mut |f, _| got = f.to_vec()).unwrap();
            !got.is_empty()
        });
        got
    }

    #[test]
    fn a_relay_over_a_mem_link_steers_counts_and_survives_its_clients() {
        let name = format!("xroce-relay-test-{}", std::process::id());
        let (wire_end, mut peer, _link) = MemDriver::pair(
            [2, 0, 0, 0, 0, 1],
            [2, 0, 0, 0, 0, 2],
            &MemLinkConfig::default(),
        )
        .unwrap();
        let relay = Relay::bind(
            &name,
            "mem0",
            Box::new(wire_end),
            vec![[198, 18, 0, 1].into()],
        )
        .unwrap();
        assert!(
            Relay::bind(
                &name,
                "mem0",
                Box::new(
                    MemDriver::pair([0; 6], [0; 6], &MemLinkConfig::default())
                        .unwrap()
                        .0
                ),
                vec![]
            )
            .is_err(),
            "a second relay on the same name"
        );
        let handle = relay.spawn();
        let mut a = RelayDriver::connect_name(&name, "mem0").unwrap();
        let mut b = RelayDriver::connect_name(&name, "mem0").unwrap();
        assert_eq!((a.slot(), b.slot()), (1, 2));
        assert_eq!(a.qpn_prefix(), Some(1));

        // Wire -> client by QPN.
        peer.send(&frame_to([198, 18, 0, 1], 0x02_0011)).unwrap();
        peer.flush().unwrap();
        assert_eq!(
            slot_of_qpn(crate::wire::frame::frame_dest_qpn(&recv_one(&mut b)).unwrap()),
            2
        );
        peer.send(&frame_to([198, 18, 0, 1], 0x01_0011)).unwrap();
        peer.flush().unwrap();
        recv_one(&mut a);
        // Client -> wire, and client -> client on the own address.
        a.send(&frame_to([198, 18, 0, 2], 0x11)).unwrap();
        assert_eq!(recv_one(&mut peer), frame_to([198, 18, 0, 2], 0x11));
        a.send(&frame_to([198, 18, 0, 1], 0x02_0020)).unwrap();
        assert_eq!(recv_one(&mut b), frame_to([198, 18, 0, 1], 0x02_0020));

        // A client that goes away frees its slot; its frames are dropped and counted.
        drop(a);
        wait_for("the disconnect", || {
            handle.stats().disconnected.load(Ordering::Relaxed) == 1
        });
        peer.send(&frame_to([198, 18, 0, 1], 0x01_0011)).unwrap();
        peer.flush().unwrap();
        wait_for("the drop", || {
            handle.stats().dropped_no_client.load(Ordering::Relaxed) == 1
        });
        // b still works, and the freed slot is given again.
        b.send(&frame_to([198, 18, 0, 2], 0x11)).unwrap();
        recv_one(&mut peer);
        let c = RelayDriver::connect_name(&name, "mem0").unwrap();
        assert_eq!(c.slot(), 1);
        assert_eq!(handle.stats().wire_to_client.load(Ordering::Relaxed), 2);
        assert_eq!(handle.stats().client_to_client.load(Ordering::Relaxed), 1);

        // The relay stops: the clients get an error, not silence.
        handle.stop().unwrap();
        let mut none = 0;
        let err = b.recv(8, &mut |_, _| none += 1).unwrap_err();
        assert!(matches!(err, DriverError::RelayGone { .. }), "{err}");
        assert!(err.to_string().contains("relay"), "{err}");
        let err = RelayDriver::connect_name(&name, "mem0").unwrap_err();
        assert!(matches!(err, DriverError::RelayMissing { .. }), "{err}");
        assert!(err.to_string().contains("xroce relay -d mem0"), "{err}");
    }
}
