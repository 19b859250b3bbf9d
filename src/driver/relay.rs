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
//! - from a client: to one of the interface's own addresses with another client's slot: to
//!   that client directly (two processes of one host talking to each other: the wire would
//!   not bring the frame back); to an own address with a slot nobody holds: dropped and
//!   counted; anything else: out of the driver.
//!
//! # QP1: the CM's MADs
//! The GSI is one per port, but every client's engine holds its own QP1 (outside its
//! slot's QPNs), and the relay plays the part of Linux's CM, which owns QP1 of the port and
//! finds the process a CM MAD is for ([`gsi_route`]):
//! - REQ and SIDR_REQ by service id: to the client that registered it. A client's rdma_cm
//!   registers each service id it listens on ([`ServiceRegistration`]: a connection of its
//!   own to the socket [`cm_socket_name`], "slot S listens on X", held open while the
//!   listener lives, so the registration ends with the listener or the process). Two slots
//!   may not register overlapping ids (the second listener gets EADDRINUSE). A REQ for an
//!   id nobody registered goes to the lowest slot, whose CM answers REJ "invalid service
//!   id" (IBTA 12.6.7, reason 8) as a lone process would (`cm_unlistened`).
//! - MRA, REJ, REP, RTU, DREQ, DREP, LAP, APR by the receiver's comm id they echo, SIDR_REP
//!   by its request id: every client's CM puts its slot in bits 24..31 of its ids
//!   ([`crate::cm::CmConfig::comm_id_prefix`]). A REJ naming no id of ours (a REJ "timeout"
//!   of a side that never got our REP, IBTA 12.6.7.2) goes to every client.
//! - anything else to QP1 (another management class, a Get, a malformed or cut MAD, a CM
//!   attribute naming no id): dropped and counted (`dropped_gsi`); an id whose slot nobody
//!   holds: `dropped_no_client`.
//!
//! Frames to QP1 between two clients of one host (to an own address) follow the same rules.
//! The relay only routes: each client's CM checks what it gets (a peer's MAD is untrusted).
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
    /// A CM MAD to QP1: to the client(s) its route names ([`gsi_route`]).
    Gsi(GsiRoute),
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
    /// The destination QPN (or the comm id of a CM MAD) names no connected client.
    NoClient,
    /// To QP1, the GSI, and not a CM MAD the relay can route: another management class, a
    /// malformed MAD, a CM attribute that names no connection.
    Gsi,
}

/// Which client a CM MAD to QP1 is for. On Linux the kernel's CM owns QP1 of the port and
/// finds the MAD's owner: a REQ or SIDR_REQ by service id (cm_find_listen), everything else
/// by the communication id it echoes (cm_acquire_id). The relay does the same, the slot of
/// a client being bits 24..31 of every comm id and SIDR request id its CM hands out
/// ([`crate::cm::CmConfig::comm_id_prefix`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GsiRoute {
    /// REQ or SIDR_REQ (IBTA 12.6.5, 12.11.1): to the client listening on this service id.
    Service(u64),
    /// A message echoing the receiver's id: the remote comm id of MRA, REJ, REP, RTU, DREQ,
    /// DREP, LAP, APR (IBTA 12.6.6-12.6.11, 12.8: bytes 4..8 of the CM data), the request
    /// id of SIDR_REP (IBTA 12.11.2: bytes 0..4). Its bits 24..31 are the slot.
    CommId(u32),
    /// A REJ that names no id of ours (remote comm id 0): IBTA 12.6.7.2's REJ "timeout" of
    /// a side that never got our REP, which only our CM can match (by the sender's comm id
    /// and CA GUID). To every client; those it is not for drop it.
    AnyClient,
}

/// Where a frame to QP1 goes: `Ok` for a CM MAD (management class 0x07, version 2, method
/// Send, IBTA 13.4.3, 12.6.1) in a UD SEND ONLY, `Err` for anything else. Reads only fixed
/// offsets of what it checks; never panics on a short or garbled frame.
pub fn gsi_route(frame: &[u8]) -> Result<GsiRoute, DropReason> {
    use crate::wire::cm::attr;
    use crate::wire::mad::{CM_CLASS_VERSION, MAD_BASE_VERSION, MAD_HEADER_LEN, MAD_LEN};
    let Ok(parsed) = crate::wire::frame::parse_frame(frame) else {
        return Err(DropReason::Gsi);
    };
    let roce = &parsed.repr.roce;
    if roce.bth.opcode != crate::wire::opcode::Opcode::UD_SEND_ONLY || roce.payload.len() < MAD_LEN
    {
        return Err(DropReason::Gsi);
    }
    let mad = &roce.payload[..MAD_LEN];
    if mad[0] != MAD_BASE_VERSION
        || mad[1] != crate::wire::mad::MGMT_CLASS_CM
        || mad[2] != CM_CLASS_VERSION
        || mad[3] != crate::wire::mad::method::SEND
    {
        return Err(DropReason::Gsi);
    }
    let data = &mad[MAD_HEADER_LEN..];
    let be32 = |at: usize| u32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]);
    let attribute = u16::from_be_bytes([mad[16], mad[17]]);
    match attribute {
        attr::REQ | attr::SIDR_REQ => Ok(GsiRoute::Service(
            (u64::from(be32(8)) << 32) | u64::from(be32(12)),
        )),
        attr::SIDR_REP => match be32(0) {
            0 => Err(DropReason::Gsi),
            id => Ok(GsiRoute::CommId(id)),
        },
        attr::MRA
        | attr::REJ
        | attr::REP
        | attr::RTU
        | attr::DREQ
        | attr::DREP
        | attr::LAP
        | attr::APR => match be32(4) {
            0 if attribute == attr::REJ => Ok(GsiRoute::AnyClient),
            0 => Err(DropReason::Gsi),
            id => Ok(GsiRoute::CommId(id)),
        },
        _ => Err(DropReason::Gsi),
    }
}

/// Where a frame received from the wire goes: `connected(slot)` says which slots are held.
/// A frame to QP1 is [`Steer::Gsi`] (the relay resolves its route) or dropped.
pub fn steer_from_wire(frame: &[u8], connected: impl Fn(u8) -> bool) -> Steer {
    match crate::wire::frame::frame_dest_qpn(frame) {
        None => Steer::Drop(DropReason::NotRoce),
        Some(crate::wire::mad::GSI_QPN) => match gsi_route(frame) {
            Ok(route) => Steer::Gsi(route),
            Err(reason) => Steer::Drop(reason),
        },
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
    /// Frames dropped: to QP1 (the GSI) and not a CM MAD the relay routes (another
    /// management class, malformed, a CM attribute naming no connection).
    pub dropped_gsi: AtomicU64,
    /// CM MADs (to QP1) handed to a client: by service id, by comm id, or to every client.
    pub cm_routed: AtomicU64,
    /// REQs and SIDR_REQs for a service id nobody behind the relay listens on, handed to
    /// the lowest slot (whose CM answers REJ "invalid service id", IBTA 12.6.7 reason 8).
    pub cm_unlistened: AtomicU64,
    /// Service ids registered by clients (ever) and registrations refused (overlapping
    /// another client's, or not from the slot's process).
    pub services_registered: AtomicU64,
    pub services_refused: AtomicU64,
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
             client->wire {} client->client {}; CM MADs routed {} (unlistened {}), services \
             registered {} refused {}; dropped: no client {} not RoCE {} QP1 {} client full {} \
             wire tx {}",
            g(&self.connected),
            g(&self.disconnected),
            g(&self.refused),
            g(&self.wire_to_client),
            g(&self.client_to_wire),
            g(&self.client_to_client),
            g(&self.cm_routed),
            g(&self.cm_unlistened),
            g(&self.services_registered),
            g(&self.services_refused),
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

/// A service id a client listens on: REQs and SIDR_REQs for it go to its slot while the
/// registration's connection stays open.
struct Service {
    fd: OwnedFd,
    slot: u8,
    /// Already masked.
    service_id: u64,
    mask: u64,
}

impl Service {
    fn matches(&self, service_id: u64) -> bool {
        service_id & self.mask == self.service_id
    }

    fn overlaps(&self, service_id: u64, mask: u64) -> bool {
        let common = self.mask & mask;
        self.service_id & common == service_id & common
    }

    /// Whether the client closed the registration (its listener or its process ended).
    fn closed(&self) -> bool {
        let mut byte = [0u8; 1];
        !matches!(
            rustix::net::recv(&self.fd, &mut byte[..], RecvFlags::DONTWAIT),
            Err(Errno::AGAIN | Errno::INTR)
        )
    }
}

/// A registration connection accepted and not yet read.
struct PendingService {
    fd: OwnedFd,
    pid: Option<u32>,
    uid: Option<u32>,
    deadline: std::time::Instant,
}

/// The abstract socket where clients register the service ids they listen on: the relay's
/// own name with `/cm` (a `/` is in no interface name, so no relay's name ends so).
pub fn cm_socket_name(relay_socket: &str) -> String {
    format!("{relay_socket}/cm")
}

/// What a relay client needs to register its services: the relay's socket and its slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayEndpoint {
    /// The relay's abstract socket name ([`socket_name`] for `xroce relay`).
    pub socket: String,
    pub slot: u8,
}

/// A registration: "XRS1", the slot, 3 zero bytes, the service id and the mask (LE).
const SERVICE_MAGIC: [u8; 4] = *b"XRS1";
const SERVICE_LEN: usize = 24;
/// The answer: "XRA1", a status ([`SERVICE_OK`] ...), the slot holding an overlapping id.
const SERVICE_ANSWER_MAGIC: [u8; 4] = *b"XRA1";
const SERVICE_ANSWER_LEN: usize = 8;
const SERVICE_OK: u8 = 0;
const SERVICE_IN_USE: u8 = 1;
const SERVICE_REFUSED: u8 = 2;
/// How often the relay looks for registrations whose connection ended.
const SERVICE_CHECK: Duration = Duration::from_millis(100);

/// The relay of one interface: its driver, its listening socket, its clients.
pub struct Relay {
    name: String,
    ifname: String,
    listener: OwnedFd,
    driver: Box<dyn Driver>,
    local_ips: Vec<IpAddr>,
    slots: Slots,
    clients: Vec<Option<Client>>,
    /// Where clients register their services ([`cm_socket_name`]).
    cm_listener: OwnedFd,
    pending_services: Vec<PendingService>,
    services: Vec<Service>,
    next_service_check: std::time::Instant,
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
        let listen_on = |name: &str| -> Result<OwnedFd, DriverError> {
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
            Ok(listener)
        };
        let listener = listen_on(name)?;
        let cm_listener = listen_on(&cm_socket_name(name))?;
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
            cm_listener,
            pending_services: Vec::new(),
            services: Vec::new(),
            next_service_check: std::time::Instant::now(),
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
        let mut fds: Vec<PollFd<'_>> =
            Vec::with_capacity(3 + self.slots.count() + self.pending_services.len());
        fds.push(PollFd::new(&self.listener, PollFlags::IN));
        fds.push(PollFd::new(&self.cm_listener, PollFlags::IN));
        for p in &self.pending_services {
            fds.push(PollFd::new(&p.fd, PollFlags::IN));
        }
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
        moved += self.serve_registrations();
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
            // Its listeners end with it (the next process in the slot registers its own).
            self.services.retain(|s| s.slot != slot);
            self.stats.disconnected.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// New registration connections, registrations that arrived, and (every
    /// [`SERVICE_CHECK`]) registrations whose connection ended.
    fn serve_registrations(&mut self) -> usize {
        let mut n = 0;
        let now = std::time::Instant::now();
        loop {
            let fd = match rustix::net::accept_with(
                &self.cm_listener,
                SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            ) {
                Ok(fd) => fd,
                Err(Errno::INTR) => continue,
                Err(_) => break,
            };
            n += 1;
            let cred = rustix::net::sockopt::socket_peercred(&fd).ok();
            self.pending_services.push(PendingService {
                fd,
                pid: cred.map(|c| c.pid.as_raw_nonzero().get() as u32),
                uid: cred.map(|c| c.uid.as_raw()),
                deadline: now + Duration::from_secs(5),
            });
        }
        let mut i = 0;
        while i < self.pending_services.len() {
            let mut msg = [0u8; SERVICE_LEN + 1];
            let got = rustix::net::recv(
                &self.pending_services[i].fd,
                &mut msg[..],
                RecvFlags::DONTWAIT,
            );
            match got {
                Err(Errno::AGAIN | Errno::INTR) if now < self.pending_services[i].deadline => {
                    i += 1;
                }
                Ok((len, _)) => {
                    n += 1;
                    let p = self.pending_services.swap_remove(i);
                    self.register(p, &msg[..len.min(msg.len())]);
                }
                _ => {
                    self.pending_services.swap_remove(i);
                }
            }
        }
        if now >= self.next_service_check {
            self.next_service_check = now + SERVICE_CHECK;
            self.services.retain(|s| !s.closed());
        }
        n
    }

    /// Takes (or refuses) one registration: only the process holding the slot may register
    /// for it, and no two slots may listen on overlapping service ids (the kernel's CM
    /// refuses a second listener of a service id too: ib_cm_listen, -EBUSY).
    fn register(&mut self, p: PendingService, msg: &[u8]) {
        let mut answer = [0u8; SERVICE_ANSWER_LEN];
        answer[..4].copy_from_slice(&SERVICE_ANSWER_MAGIC);
        let parsed = (msg.len() == SERVICE_LEN && msg[..4] == SERVICE_MAGIC).then(|| {
            let le64 = |at: usize| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&msg[at..at + 8]);
                u64::from_le_bytes(b)
            };
            (msg[4], le64(8), le64(16))
        });
        let owner = parsed.and_then(|(slot, _, _)| {
            let c = self.clients.get(slot as usize)?.as_ref()?;
            let same_user = match (p.uid, self.uid) {
                (Some(peer), Some(me)) => peer == me || peer == 0,
                _ => false,
            };
            (p.pid == Some(c.pid) && same_user).then_some(slot)
        });
        let status = match (parsed, owner) {
            (Some((slot, service_id, mask)), Some(_)) => {
                // A registration whose listener just ended may not be reaped yet.
                self.services
                    .retain(|s| !(s.slot != slot && s.overlaps(service_id, mask) && s.closed()));
                match self
                    .services
                    .iter()
                    .find(|s| s.slot != slot && s.overlaps(service_id, mask))
                {
                    Some(holder) => {
                        answer[5] = holder.slot;
                        SERVICE_IN_USE
                    }
                    None => SERVICE_OK,
                }
            }
            _ => SERVICE_REFUSED,
        };
        answer[4] = status;
        // Counted before the answer: the client may look at the counters once it has it.
        match (status, parsed) {
            (SERVICE_OK, Some((slot, service_id, mask))) => {
                tracing::info!(relay = %self.name, slot, service_id, mask, "service registered");
                self.stats
                    .services_registered
                    .fetch_add(1, Ordering::Relaxed);
                let sent =
                    rustix::net::send(&p.fd, &answer, SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
                if sent.is_ok() {
                    self.services.push(Service {
                        fd: p.fd,
                        slot,
                        service_id: service_id & mask,
                        mask,
                    });
                }
            }
            _ => {
                tracing::info!(relay = %self.name, status, pid = ?p.pid, "service refused");
                self.stats.services_refused.fetch_add(1, Ordering::Relaxed);
                let _ =
                    rustix::net::send(&p.fd, &answer, SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
            }
        }
    }

    /// The slots a CM MAD goes to; none: counted as dropped.
    fn gsi_targets(
        route: GsiRoute,
        slots: &Slots,
        services: &[Service],
        stats: &RelayStats,
    ) -> Vec<u8> {
        let lowest = || (1..=MAX_SLOTS as u8).find(|&s| slots.is_held(s));
        let targets: Vec<u8> = match route {
            GsiRoute::CommId(id) => {
                let slot = (id >> 24) as u8;
                if slots.is_held(slot) {
                    vec![slot]
                } else {
                    Vec::new()
                }
            }
            GsiRoute::Service(sid) => {
                match services
                    .iter()
                    .find(|s| s.matches(sid) && slots.is_held(s.slot))
                {
                    Some(s) => vec![s.slot],
                    // Nobody listens: one CM answers REJ "invalid service id" (IBTA 12.6.7,
                    // reason 8), as the kernel's does (cm_req_handler: IB_CM_REJ_INVALID_
                    // SERVICE_ID) when no listener matches.
                    None => {
                        stats.cm_unlistened.fetch_add(1, Ordering::Relaxed);
                        lowest().into_iter().collect()
                    }
                }
            }
            GsiRoute::AnyClient => (1..=MAX_SLOTS as u8)
                .filter(|&s| slots.is_held(s))
                .collect(),
        };
        if targets.is_empty() {
            stats.count(DropReason::NoClient);
        }
        targets
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
        let services = &self.services;
        let n = self.driver.recv(
            BATCH,
            &mut |frame, _meta| match steer_from_wire(frame, |s| slots.is_held(s)) {
                Steer::Client(slot) => {
                    if Self::to_client(clients, stats, &mut dead, slot, frame) {
                        stats.wire_to_client.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Steer::Gsi(route) => {
                    for slot in Self::gsi_targets(route, slots, services, stats) {
                        if Self::to_client(clients, stats, &mut dead, slot, frame) {
                            stats.wire_to_client.fetch_add(1, Ordering::Relaxed);
                            stats.cm_routed.fetch_add(1, Ordering::Relaxed);
                        }
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
                Steer::Gsi(route) => {
                    let stats = &*self.stats;
                    for to in Self::gsi_targets(route, slots, &self.services, stats) {
                        if Self::to_client(&self.clients, stats, &mut dead, to, frame) {
                            stats.client_to_client.fetch_add(1, Ordering::Relaxed);
                            stats.cm_routed.fetch_add(1, Ordering::Relaxed);
                        }
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

    fn relay_endpoint(&self) -> Option<RelayEndpoint> {
        Some(RelayEndpoint {
            socket: self.name.clone(),
            slot: self.slot,
        })
    }
}

/// Why a service id could not be registered with the relay.
#[derive(Debug, thiserror::Error)]
pub enum ServiceRegistrationError {
    /// Another process on the interface listens on an overlapping service id.
    #[error("slot {holder} of the relay already listens on service id {service_id:#x}")]
    InUse { service_id: u64, holder: u8 },
    #[error(transparent)]
    Relay(#[from] DriverError),
}

/// A service id this process listens on, registered with its relay: REQs and SIDR_REQs for
/// it reach this process's QP1 until the registration is dropped (its connection closes,
/// as it does when the process ends).
#[derive(Debug)]
pub struct ServiceRegistration {
    _fd: OwnedFd,
}

impl ServiceRegistration {
    /// Registers `service_id` under `mask` for `relay.slot` (which this process must hold):
    /// waits for the relay's answer (at most 5 s).
    pub fn register(
        relay: &RelayEndpoint,
        service_id: u64,
        mask: u64,
    ) -> Result<ServiceRegistration, ServiceRegistrationError> {
        let name = cm_socket_name(&relay.socket);
        let failed = |why: String| DriverError::RelayGone {
            ifname: relay.socket.clone(),
            reason: format!("registering service id {service_id:#x} on @{name}: {why}"),
        };
        let fd = seqpacket()?;
        match rustix::net::connect(&fd, &abstract_addr(&name)?) {
            Ok(()) | Err(Errno::INPROGRESS) => {}
            Err(e) => {
                return Err(failed(format!("connect: {e} (a relay of another version?)")).into())
            }
        }
        let mut msg = [0u8; SERVICE_LEN];
        msg[..4].copy_from_slice(&SERVICE_MAGIC);
        msg[4] = relay.slot;
        msg[8..16].copy_from_slice(&service_id.to_le_bytes());
        msg[16..24].copy_from_slice(&mask.to_le_bytes());
        rustix::net::send(&fd, &msg, SendFlags::NOSIGNAL)
            .map_err(|e| failed(format!("send: {e}")))?;
        let readable = super::wait::poll_readable(fd.as_fd(), Some(Duration::from_secs(5)))
            .map_err(|e| failed(format!("poll: {e}")))?;
        if !readable {
            return Err(failed("no answer within 5 s".into()).into());
        }
        let mut answer = [0u8; SERVICE_ANSWER_LEN];
        let n = rustix::net::recv(&fd, &mut answer[..], RecvFlags::DONTWAIT)
            .map_err(|e| failed(format!("recv: {e}")))?
            .0;
        if n != SERVICE_ANSWER_LEN || answer[..4] != SERVICE_ANSWER_MAGIC {
            return Err(failed("the answer is not an xroce relay's".into()).into());
        }
        match answer[4] {
            SERVICE_OK => Ok(ServiceRegistration { _fd: fd }),
            SERVICE_IN_USE => Err(ServiceRegistrationError::InUse {
                service_id,
                holder: answer[5],
            }),
            _ => Err(failed(format!(
                "refused: slot {} is not this process's",
                relay.slot
            ))
            .into()),
        }
    }
}

#[cfg(test)]
mod tests_support {
    use super::*;

    /// A RoCEv2 frame to `dst` for QPN `qpn`, as the engine's frame builder writes it.
    pub fn frame_to(dst: [u8; 4], qpn: u32) -> Vec<u8> {
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

    /// A UD SEND ONLY frame to QP1 of `dst` carrying `mad`.
    pub fn mad_frame(dst: [u8; 4], mad: &[u8]) -> Vec<u8> {
        let mut f = frame_to(dst, 1);
        f.truncate(14 + 20 + 8 + 12);
        f[42] = 0x64; // UD SEND only
        f.extend_from_slice(&0x8001_0000u32.to_be_bytes()); // DETH: GSI Q_Key, source QP 1
        f.extend_from_slice(&1u32.to_be_bytes());
        f.extend_from_slice(mad);
        f.extend_from_slice(&[0; 4]); // ICRC (the relay does not check it)
        let ip_len = (f.len() - 14) as u16;
        f[16..18].copy_from_slice(&ip_len.to_be_bytes());
        f[38..40].copy_from_slice(&(ip_len - 20).to_be_bytes());
        f
    }

    /// A CM MAD (class 0x07, version 2, Send) of attribute `attr` with `fields` written at
    /// their offsets in the CM data.
    pub fn cm_mad(attr: u16, fields: &[(usize, &[u8])]) -> Vec<u8> {
        let mut mad = vec![0u8; 256];
        mad[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
        mad[16..18].copy_from_slice(&attr.to_be_bytes());
        for (at, bytes) in fields {
            mad[24 + at..24 + at + bytes.len()].copy_from_slice(bytes);
        }
        mad
    }

    pub const HOST: [u8; 4] = [198, 18, 0, 1];

    pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        let end = std::time::Instant::now() + Duration::from_secs(5);
        while !cond() {
            assert!(
                std::time::Instant::now() < end,
                "timed out waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn recv_one(d: &mut dyn Driver) -> Vec<u8> {
        let mut got = Vec::new();
        wait_for("a frame", || {
            d.recv(1, &mut |f, _| got = f.to_vec()).unwrap();
            !got.is_empty()
        });
        got
    }

    /// Nothing arrives within 50 ms.
    pub fn recv_none(d: &mut dyn Driver) {
        std::thread::sleep(Duration::from_millis(50));
        let mut n = 0;
        d.recv(8, &mut |_, _| n += 1).unwrap();
        assert_eq!(n, 0, "an unexpected frame");
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::*;
    use super::*;
    use crate::driver::mem::{MemDriver, MemLinkConfig};

    #[test]
    fn cm_mads_route_by_service_id_or_by_the_id_they_echo() {
        use crate::wire::cm::attr;
        let sid = 0x0106_1c06u64;
        let route = |attr: u16, fields: &[(usize, &[u8])]| {
            steer_from_wire(&mad_frame(HOST, &cm_mad(attr, fields)), |_| true)
        };
        for a in [attr::REQ, attr::SIDR_REQ] {
            assert_eq!(
                route(a, &[(0, &[0xaa; 4]), (8, &sid.to_be_bytes())]),
                Steer::Gsi(GsiRoute::Service(sid))
            );
        }
        // The receiver's comm id at 4 (the sender's at 0 is not ours).
        for a in [
            attr::MRA,
            attr::REJ,
            attr::REP,
            attr::RTU,
            attr::DREQ,
            attr::DREP,
            attr::LAP,
            attr::APR,
        ] {
            assert_eq!(
                route(a, &[(0, &[0xaa; 4]), (4, &0x0200_0042u32.to_be_bytes())]),
                Steer::Gsi(GsiRoute::CommId(0x0200_0042)),
                "{a:#x}"
            );
        }
        assert_eq!(
            route(attr::SIDR_REP, &[(0, &0x0300_0007u32.to_be_bytes())]),
            Steer::Gsi(GsiRoute::CommId(0x0300_0007))
        );
        // A REJ "timeout" naming none of our ids: to every client.
        assert_eq!(
            route(attr::REJ, &[(0, &[0xaa; 4])]),
            Steer::Gsi(GsiRoute::AnyClient)
        );
        // Anything else to QP1: dropped as the GSI's.
        let gsi = Steer::Drop(DropReason::Gsi);
        assert_eq!(route(attr::RTU, &[]), gsi, "RTU naming no id");
        assert_eq!(route(attr::CLASS_PORT_INFO, &[]), gsi);
        let mut sa = cm_mad(attr::REQ, &[]);
        sa[1] = 0x03; // subnet administration: not the CM's
        assert_eq!(steer_from_wire(&mad_frame(HOST, &sa), |_| true), gsi);
        let mut get = cm_mad(attr::REQ, &[]);
        get[3] = 0x01; // a Get: CM messages are Sends
        assert_eq!(steer_from_wire(&mad_frame(HOST, &get), |_| true), gsi);
        // A MAD cut short, every length of it, and garbage: dropped, never a panic.
        let whole = mad_frame(HOST, &cm_mad(attr::REP, &[(4, &[2, 0, 0, 1])]));
        for len in 0..whole.len() - 4 {
            let mut cut = whole[..len].to_vec();
            if cut.len() >= 40 {
                let ip_len = (cut.len() - 14) as u16;
                cut[16..18].copy_from_slice(&ip_len.to_be_bytes());
                cut[38..40].copy_from_slice(&(ip_len - 20).to_be_bytes());
            }
            assert!(
                !matches!(
                    steer_from_wire(&cut, |_| true),
                    Steer::Gsi(_) | Steer::Client(_)
                ),
                "{len}"
            );
        }
        // The RC frame of the older test: not a UD SEND.
        assert_eq!(steer_from_wire(&frame_to(HOST, 1), |_| true), gsi);
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

#[cfg(test)]
mod cm_tests {
    use super::tests_support::*;
    use super::*;
    use crate::driver::mem::{MemDriver, MemLinkConfig};
    use crate::wire::cm::attr;

    const SID_A: u64 = 0x0106_1b59;
    const SID_B: u64 = 0x0106_1b5a;

    #[test]
    fn a_relay_hands_cm_mads_to_the_listener_or_to_the_slot_of_the_comm_id() {
        let name = format!("xroce-relay-cm-test-{}", std::process::id());
        let (wire_end, mut peer, _link) = MemDriver::pair(
            [2, 0, 0, 0, 0, 1],
            [2, 0, 0, 0, 0, 2],
            &MemLinkConfig::default(),
        )
        .unwrap();
        let relay = Relay::bind(&name, "mem0", Box::new(wire_end), vec![HOST.into()]).unwrap();
        let handle = relay.spawn();
        let stats = || handle.stats();
        let mut a = RelayDriver::connect_name(&name, "mem0").unwrap();
        let mut b = RelayDriver::connect_name(&name, "mem0").unwrap();
        let (ea, eb) = (a.relay_endpoint().unwrap(), b.relay_endpoint().unwrap());
        assert_eq!(
            (ea.slot, eb.slot, ea.socket.as_str()),
            (1, 2, name.as_str())
        );
        let reg_a = ServiceRegistration::register(&ea, SID_A, u64::MAX).unwrap();
        let _reg_b = ServiceRegistration::register(&eb, SID_B, u64::MAX).unwrap();
        // One listener per service id on the interface.
        match ServiceRegistration::register(&eb, SID_A, u64::MAX) {
            Err(ServiceRegistrationError::InUse { holder: 1, .. }) => {}
            other => panic!("{other:?}"),
        }
        // Only for a slot this process holds.
        let stranger = RelayEndpoint {
            socket: name.clone(),
            slot: 9,
        };
        assert!(matches!(
            ServiceRegistration::register(&stranger, 0x0106_0001, u64::MAX),
            Err(ServiceRegistrationError::Relay(_))
        ));
        assert_eq!(stats().services_refused.load(Ordering::Relaxed), 2);

        let mut from_peer = |mad: Vec<u8>| {
            peer.send(&mad_frame(HOST, &mad)).unwrap();
            peer.flush().unwrap();
        };
        let req = |sid: u64| cm_mad(attr::REQ, &[(0, &[0xaa; 4]), (8, &sid.to_be_bytes())]);
        // REQs by service id.
        from_peer(req(SID_A));
        assert_eq!(recv_one(&mut a), mad_frame(HOST, &req(SID_A)));
        recv_none(&mut b);
        from_peer(req(SID_B));
        recv_one(&mut b);
        recv_none(&mut a);
        // Nobody listens: the lowest slot, whose CM answers REJ "invalid service id".
        from_peer(req(0x0106_0063));
        recv_one(&mut a);
        recv_none(&mut b);
        assert_eq!(stats().cm_unlistened.load(Ordering::Relaxed), 1);
        // The rest by the receiver's comm id, whose bits 24..31 are the slot.
        from_peer(cm_mad(
            attr::RTU,
            &[(0, &[0xaa; 4]), (4, &0x0200_0011u32.to_be_bytes())],
        ));
        recv_one(&mut b);
        recv_none(&mut a);
        from_peer(cm_mad(
            attr::SIDR_REP,
            &[(0, &0x0100_0003u32.to_be_bytes())],
        ));
        recv_one(&mut a);
        // A REJ naming no id of ours: to both.
        from_peer(cm_mad(attr::REJ, &[(0, &[0xaa; 4])]));
        recv_one(&mut a);
        recv_one(&mut b);
        // A slot nobody holds; a MAD of another class: dropped and counted.
        from_peer(cm_mad(attr::DREQ, &[(4, &0x0500_0001u32.to_be_bytes())]));
        let mut sa = req(SID_A);
        sa[1] = 0x03;
        from_peer(sa);
        wait_for("the drops", || {
            stats().dropped_no_client.load(Ordering::Relaxed) == 1
                && stats().dropped_gsi.load(Ordering::Relaxed) == 1
        });
        recv_none(&mut a);
        recv_none(&mut b);
        assert_eq!(
            stats().cm_routed.load(Ordering::Relaxed),
            7,
            "the REJ counts twice"
        );

        // Between two clients of the host: the same rules.
        b.send(&mad_frame(HOST, &req(SID_A))).unwrap();
        recv_one(&mut a);
        assert_eq!(stats().client_to_client.load(Ordering::Relaxed), 1);
        // The listener ends: its service id is free for another process at once.
        drop(reg_a);
        let _reg = ServiceRegistration::register(&eb, SID_A, u64::MAX).unwrap();
        from_peer(req(SID_A));
        recv_one(&mut b);
        recv_none(&mut a);
        // A client that goes away takes its registrations along.
        drop(b);
        wait_for("the disconnect", || {
            stats().disconnected.load(Ordering::Relaxed) == 1
        });
        let _again = ServiceRegistration::register(&ea, SID_B, u64::MAX).unwrap();
        handle.stop().unwrap();
    }
}
