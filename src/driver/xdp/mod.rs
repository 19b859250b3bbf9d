//! The AF_XDP driver: RoCEv2 frames go straight between the NIC and a UMEM that xroce owns.
//!
//! Opening an [`XdpDriver`]:
//! 1. check the interface exists and is up, and that the process is privileged;
//! 2. load `bpf/xroce_xdp.c` (embedded) with libbpf and attach it through a BPF link
//!    (native mode, else generic), so it leaves the interface when the driver is dropped or
//!    the process dies; an XDP program already there is reported, never replaced;
//! 3. create a UMEM ([`XdpConfig::frame_count`] chunks of [`XdpConfig::frame_size`] bytes)
//!    and bind an AF_XDP socket through it to every receive queue of the interface (at most
//!    [`XSKMAP_SLOTS`]), or with [`XdpConfig::all_queues`] off to the one
//!    [`XdpConfig::queue`]. The sockets share the UMEM and the first one also transmits.
//!    libxdp is told not to load a program of its own (`XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD`);
//!    a bind that fails with EBUSY (the queue is still held by a socket closed a moment ago)
//!    is retried until [`XdpConfig::bind_timeout`];
//! 4. put each socket into the program's XSKMAP at its queue's index, and share the first
//!    half of the chunks out between the sockets' fill rings (the second half transmits).
//!
//! The kernel copies received frames into the fill rings' chunks; the transmit half is a
//! free list, and completed transmissions come back to it through the completion ring. With
//! more than one socket, [`Driver::wait_fd`] is an epoll set of all of them. See
//! `docs/xdp.md` for the whole picture.
//!
//! # Engine shards
//! [`XdpDriver::open_shards`] opens N independent drivers on one interface, one per engine
//! shard, behind one XDP program (step 2 once, shared, detached with the last driver):
//! driver `i` does steps 3 and 4 for the receive queues `q % N == i` only, with a UMEM,
//! rings and epoll set of its own, and transmits on queue `i`. [`XdpDriver::open`] is the
//! one-shard case.
//!
//! # Frames larger than a chunk
//! A chunk holds 4096 - 256 (kernel headroom) = 3840 bytes, but a path-MTU-4096 RoCE frame is
//! about 4170 bytes, and the kernel accepts chunks larger than a page only for hugepage-backed
//! UMEMs. When the link MTU allows frames over 3840 bytes the socket is bound with
//! `XDP_USE_SG` (multi-buffer, Linux 6.6+): the kernel spreads a received frame over several
//! chunks marked `XDP_PKT_CONTD`, which [`XdpDriver::recv`] joins; `send` splits the same way.

pub mod bpf;

use std::io::Write;
use std::num::NonZeroU32;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::epoll;
use rustix::io::Errno;

use xsk_rs::config::{
    BindFlags, FrameSize, Interface, LibxdpFlags, QueueSize, SocketConfig, UmemConfig,
};
use xsk_rs::{CompQueue, FillQueue, FrameDesc, RxQueue, TxQueue, Umem};

pub use bpf::{AttachMode, XdpProgram};

use super::iface::{interface_info, InterfaceInfo};
use super::{Driver, DriverError, DriverInfo, DriverMode, RxMeta, XdpStats};

/// Bytes the kernel reserves in front of each received frame in a UMEM chunk.
pub const XDP_PACKET_HEADROOM: usize = 256;

/// Slots of the program's XSKMAP (`max_entries` in bpf/xroce_xdp.c).
pub const XSKMAP_SLOTS: u32 = 64;

/// Descriptor option: the frame continues in the next descriptor (multi-buffer).
const XDP_PKT_CONTD: u32 = 1;

/// Whether to ask for zero-copy AF_XDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ZeroCopy {
    /// Copy mode only (works everywhere, veth included).
    #[default]
    Never,
    /// Try zero-copy, fall back to copy mode when the NIC driver cannot do it.
    Try,
    /// Zero-copy or fail with [`DriverError::ZeroCopyUnsupported`].
    Require,
}

/// How to open an [`XdpDriver`].
#[derive(Debug, Clone)]
pub struct XdpConfig {
    /// The interface to attach to.
    pub ifname: String,
    /// Bind a socket on every receive queue of the interface (default), so RoCE is received
    /// whichever queue the NIC's hashing puts it on.
    pub all_queues: bool,
    /// With `all_queues` off: the one receive queue to bind (RoCE arriving on other queues
    /// goes to the kernel and is counted as `no_socket`).
    pub queue: u32,
    /// Zero-copy policy.
    pub zero_copy: ZeroCopy,
    /// XDP attach mode.
    pub attach: AttachMode,
    /// UMEM chunk size: 2048 or 4096 (the kernel caps chunks at a page without hugepages).
    pub frame_size: u32,
    /// Multi-buffer frames (`XDP_USE_SG`); `None`: on when the link MTU needs it.
    pub multi_buffer: Option<bool>,
    /// Number of UMEM chunks (a power of two >= 4); half receive, half transmit.
    pub frame_count: u32,
    /// How long to keep retrying a bind that fails with EBUSY.
    pub bind_timeout: Duration,
}

impl XdpConfig {
    /// Defaults for `ifname`: a socket on every receive queue, copy mode, auto attach,
    /// 4096 chunks of 4096 bytes, multi-buffer when the MTU needs it, 3 s of EBUSY retries.
    pub fn new(ifname: impl Into<String>) -> Self {
        XdpConfig {
            ifname: ifname.into(),
            all_queues: true,
            queue: 0,
            zero_copy: ZeroCopy::Never,
            attach: AttachMode::Auto,
            frame_size: 4096,
            multi_buffer: None,
            frame_count: 4096,
            bind_timeout: Duration::from_secs(3),
        }
    }
}

/// Largest RoCEv2 frame: path MTU 4096 payload + Ethernet, two VLAN tags, IPv6, UDP, BTH,
/// the largest extension headers (AtomicETH, 28 B), pad and ICRC; rounded up.
pub const MAX_ROCE_FRAME: usize = 4096 + 14 + 8 + 40 + 8 + 12 + 28 + 3 + 4;

/// Chunks one multi-buffer frame may span (enough for a 9000-byte MTU in 4096 chunks).
pub const MAX_CHUNKS_PER_FRAME: usize = 4;

/// Whether a full-MTU frame (Ethernet plus two VLAN tags) overflows one chunk of `frame_size`.
pub fn needs_multi_buffer(mtu: u32, frame_size: u32) -> bool {
    mtu as usize + 14 + 8 > frame_size as usize - XDP_PACKET_HEADROOM
}

/// Capability bits (see capabilities(7)).
const CAP_NET_ADMIN: u32 = 12;
const CAP_NET_RAW: u32 = 13;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_BPF: u32 = 39;

fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// `Err(NotPermitted)` unless the process may load XDP programs and open AF_XDP sockets.
pub fn check_privileges() -> Result<(), DriverError> {
    let caps = effective_caps();
    let has = |bit: u32| caps & (1u64 << bit) != 0;
    if has(CAP_NET_ADMIN) && has(CAP_NET_RAW) && (has(CAP_BPF) || has(CAP_SYS_ADMIN)) {
        Ok(())
    } else {
        Err(DriverError::NotPermitted {
            what: "opening the AF_XDP driver".into(),
        })
    }
}

/// The receive side of one bound AF_XDP socket.
struct RxPath {
    queue: u32,
    rx_q: RxQueue,
    fill_q: FillQueue,
    /// Received chunks waiting to go back on this socket's fill ring.
    fill_pending: Vec<FrameDesc>,
    /// A multi-buffer frame being joined (its pieces arrive on one socket, in order).
    partial: Vec<u8>,
    /// Skipping the remaining pieces of an oversized frame.
    discarding: bool,
    /// The transmit side of a socket other than the first: unused, but it keeps the
    /// socket open (xsk-rs closes a socket when its last ring handle is dropped).
    _tx_side: Option<(TxQueue, CompQueue)>,
}

/// AF_XDP sockets on the interface's receive queues, sharing one UMEM, plus the XDP program
/// that feeds them. The first socket also transmits.
///
/// One of the drivers of [`XdpDriver::open_shards`] owns the sockets of its shard's queues
/// only, with a UMEM of its own; the XDP program is shared by all of them.
pub struct XdpDriver {
    // Field order is drop order: first the program leaves the interface (when this is the
    // last driver holding it), then the sockets (their rings) close, then the UMEM is
    // unmapped.
    program: Arc<XdpProgram>,
    /// epoll set of all sockets, when there is more than one (the wait fd).
    epoll: Option<OwnedFd>,
    tx_q: TxQueue,
    comp_q: CompQueue,
    rx: Vec<RxPath>,
    umem: Umem,
    /// Transmit frames we own and may write.
    tx_free: Vec<FrameDesc>,
    /// Written frames not yet on the TX ring.
    tx_pending: Vec<FrameDesc>,
    /// Scratch descriptors for ring consumption.
    scratch: Vec<FrameDesc>,
    tx_ring_size: u32,
    iface: InterfaceInfo,
    mode: DriverMode,
    max_frame: usize,
    frame_size: u32,
    /// Bytes of frame data per chunk.
    chunk_room: usize,
    multi_buffer: bool,
    /// Multi-buffer frames dropped because they grew beyond `max_frame`.
    rx_oversized: u64,
    /// Receive path to look at first next time (round robin between queues).
    next_rx: usize,
    /// This driver's shard and the number of shards on the interface (0 of 1 for `open`).
    shard: u32,
    shards: u32,
}

impl std::fmt::Debug for XdpDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpDriver")
            .field("iface", &self.iface)
            .field("mode", &self.mode)
            .field("frame_size", &self.frame_size)
            .field("shard", &self.shard)
            .field("shards", &self.shards)
            .finish_non_exhaustive()
    }
}

/// What [`XdpDriver::open_shards`] settled for one driver from the configuration and the
/// interface, before it touches the kernel.
struct Plan {
    /// The receive queues to bind a socket to.
    queues: Vec<u32>,
    /// Chunks per half of the UMEM (receive / transmit), also the size of each ring.
    half: u32,
    frame_size: u32,
    /// Multi-buffer wanted (it may still be dropped on kernels without it).
    multi_buffer: bool,
    ring: QueueSize,
    umem_cfg: UmemConfig,
}

/// The receive queues the drivers of an interface bind, all shards together: every queue up
/// to [`XSKMAP_SLOTS`], or the one [`XdpConfig::queue`].
fn planned_queues(cfg: &XdpConfig, iface: &InterfaceInfo) -> Result<Vec<u32>, DriverError> {
    let config = |reason: String| DriverError::Config { reason };
    if cfg.queue >= XSKMAP_SLOTS {
        return Err(config(format!(
            "queue {} out of range (the XSKMAP has {XSKMAP_SLOTS} slots)",
            cfg.queue
        )));
    }
    if cfg.queue >= iface.rx_queues {
        return Err(config(format!(
            "{} has {} receive queue(s); queue {} does not exist",
            cfg.ifname, iface.rx_queues, cfg.queue
        )));
    }
    Ok(if cfg.all_queues {
        (0..iface.rx_queues.min(XSKMAP_SLOTS)).collect()
    } else {
        vec![cfg.queue]
    })
}

/// Transmit queues of `ifname` (sysfs `tx-*`), `None` when sysfs does not show them.
fn tx_queue_count(ifname: &str) -> Option<u32> {
    let dir = std::fs::read_dir(format!("/sys/class/net/{ifname}/queues")).ok()?;
    let n = dir
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("tx-"))
        .count() as u32;
    (n > 0).then_some(n)
}

/// The receive queues of each of `shards` drivers: shard `i` gets the queues `q` with
/// `q % shards == i`, so its first queue, the one it transmits on, is `i`.
fn shard_queues(
    cfg: &XdpConfig,
    queues: &[u32],
    tx_queues: Option<u32>,
    shards: u32,
) -> Result<Vec<Vec<u32>>, DriverError> {
    if shards > 1 && !cfg.all_queues {
        return Err(DriverError::Config {
            reason: format!(
                "{shards} shards need a socket on every receive queue; all_queues is off \
                 (only queue {} would be bound)",
                cfg.queue
            ),
        });
    }
    // Shard i transmits on queue i: with one shard that is the first bound queue, which
    // exists; with more, the interface needs `shards` transmit queues too.
    let most = match tx_queues {
        Some(tx) if shards > 1 => (queues.len() as u32).min(tx),
        _ => queues.len() as u32,
    };
    if shards == 0 || shards > most {
        return Err(DriverError::ShardsOutOfRange {
            ifname: cfg.ifname.clone(),
            shards,
            queues: most,
        });
    }
    Ok((0..shards)
        .map(|i| queues.iter().copied().filter(|q| q % shards == i).collect())
        .collect())
}

impl Plan {
    /// Check the configuration against the interface for a driver on `queues`; every
    /// refusal names the value.
    fn new(cfg: &XdpConfig, iface: &InterfaceInfo, queues: Vec<u32>) -> Result<Plan, DriverError> {
        let config = |reason: String| DriverError::Config { reason };
        if cfg.frame_count < 4 || !cfg.frame_count.is_power_of_two() || cfg.frame_count > 1 << 20 {
            return Err(config(format!(
                "frame_count {} must be a power of two in 4..=1048576",
                cfg.frame_count
            )));
        }
        let half = cfg.frame_count / 2;
        if (half as usize) < queues.len() * 8 {
            return Err(config(format!(
                "frame_count {} is too small for {} receive queues (8 receive chunks each)",
                cfg.frame_count,
                queues.len()
            )));
        }
        let frame_size = cfg.frame_size;
        if frame_size != 2048 && frame_size != 4096 {
            return Err(config(format!(
                "frame_size {frame_size} must be 2048 or 4096"
            )));
        }
        let multi_buffer = cfg
            .multi_buffer
            .unwrap_or_else(|| needs_multi_buffer(iface.mtu, frame_size));
        let ring = QueueSize::new(half).map_err(|e| config(e.to_string()))?;
        let umem_cfg = UmemConfig::builder()
            .frame_size(FrameSize::new(frame_size).map_err(|e| config(e.to_string()))?)
            .fill_queue_size(ring)
            .comp_queue_size(ring)
            .build()
            .map_err(|e| config(e.to_string()))?;
        Ok(Plan {
            queues,
            half,
            frame_size,
            multi_buffer,
            ring,
            umem_cfg,
        })
    }
}

/// A UMEM with a socket bound on each planned queue.
struct Bound {
    umem: Umem,
    descs: Vec<FrameDesc>,
    tx_q: TxQueue,
    comp_q: CompQueue,
    rx: Vec<RxPath>,
    zero_copy: bool,
    multi_buffer: bool,
}

/// Why one binding attempt failed.
struct BindError {
    /// The OS error behind it, when there is one (it decides whether to retry).
    errno: Option<Errno>,
    /// The queue whose socket failed, when it got that far.
    queue: Option<u32>,
    what: String,
}

impl BindError {
    fn new(err: &(dyn std::error::Error + 'static), queue: Option<u32>, what: String) -> Self {
        BindError {
            errno: errno_of(err),
            queue,
            what,
        }
    }

    fn plain(what: &str) -> Self {
        BindError {
            errno: None,
            queue: None,
            what: what.to_string(),
        }
    }
}

/// The OS error somewhere in `err`'s chain of sources.
fn errno_of(err: &(dyn std::error::Error + 'static)) -> Option<Errno> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return Errno::from_io_error(io);
        }
        cur = e.source();
    }
    None
}

/// Create the UMEM and bind a socket through it on each planned queue, once.
fn bind_once(
    cfg: &XdpConfig,
    plan: &Plan,
    zero_copy: bool,
    multi_buffer: bool,
) -> Result<Bound, BindError> {
    let count = NonZeroU32::new(cfg.frame_count).expect("checked >= 4");
    let (umem, descs) = Umem::new(plan.umem_cfg, count, false)
        .map_err(|e| BindError::new(&e, None, format!("UMEM: {e}")))?;
    let mut mode = if zero_copy {
        BindFlags::XDP_ZEROCOPY
    } else {
        BindFlags::XDP_COPY
    };
    if multi_buffer {
        mode |= BindFlags::XDP_USE_SG;
    }
    // Sockets after the first bind with XDP_SHARED_UMEM (libxdp does that) and inherit the
    // first one's mode from the UMEM.
    let sock_cfg = SocketConfig::builder()
        .rx_queue_size(plan.ring)
        .tx_queue_size(plan.ring)
        .libxdp_flags(LibxdpFlags::XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD)
        .bind_flags(mode | BindFlags::XDP_USE_NEED_WAKEUP)
        .build();
    let ifname: Interface = cfg
        .ifname
        .parse()
        .map_err(|_| BindError::plain("interface name has a NUL byte"))?;
    let mut primary = None;
    let mut rx = Vec::with_capacity(plan.queues.len());
    for &queue in &plan.queues {
        // Safety: this UMEM was created just above and each (interface, queue) pair is bound
        // through it once; INHIBIT_PROG_LOAD is set, as xsk-rs requires for shared UMEMs, so
        // libxdp never touches XDP programs.
        let (tx_q, rx_q, rings) = unsafe { xsk_rs::Socket::new(sock_cfg, &umem, &ifname, queue) }
            .map_err(|e| {
            BindError::new(
                &e,
                Some(queue),
                format!("AF_XDP socket on queue {queue}: {e}"),
            )
        })?;
        let (fill_q, comp_q) =
            rings.ok_or_else(|| BindError::plain("libxdp returned no fill/completion ring"))?;
        let tx_side = if primary.is_none() {
            primary = Some((tx_q, comp_q));
            None
        } else {
            Some((tx_q, comp_q))
        };
        rx.push(RxPath {
            queue,
            rx_q,
            fill_q,
            fill_pending: Vec::new(),
            partial: Vec::new(),
            discarding: false,
            _tx_side: tx_side,
        });
    }
    let (tx_q, comp_q) = primary.ok_or_else(|| BindError::plain("no receive queue to bind"))?;
    Ok(Bound {
        umem,
        descs,
        tx_q,
        comp_q,
        rx,
        zero_copy,
        multi_buffer,
    })
}

/// Bind until it works: zero-copy first when asked, then copy mode; multi-buffer dropped on
/// kernels without it (unless asked for explicitly); EBUSY retried until `bind_timeout`.
fn bind_with_retries(cfg: &XdpConfig, plan: &Plan) -> Result<Bound, DriverError> {
    let deadline = Instant::now() + cfg.bind_timeout;
    let mut zero_copy = cfg.zero_copy != ZeroCopy::Never;
    let mut multi_buffer = plan.multi_buffer;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let err = match bind_once(cfg, plan, zero_copy, multi_buffer) {
            Ok(bound) => return Ok(bound),
            Err(err) => err,
        };
        match err.errno {
            // Kernels before 6.6 have no multi-buffer AF_XDP: carry what fits one chunk.
            Some(Errno::OPNOTSUPP | Errno::INVAL) if multi_buffer && cfg.multi_buffer.is_none() => {
                multi_buffer = false;
            }
            Some(Errno::OPNOTSUPP | Errno::INVAL) if zero_copy => {
                if cfg.zero_copy == ZeroCopy::Require {
                    return Err(DriverError::ZeroCopyUnsupported {
                        ifname: cfg.ifname.clone(),
                    });
                }
                zero_copy = false;
            }
            Some(Errno::BUSY) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Some(Errno::BUSY) => {
                return Err(DriverError::BindBusy {
                    ifname: cfg.ifname.clone(),
                    queue: err.queue.unwrap_or(cfg.queue),
                    attempts,
                })
            }
            Some(errno) => {
                return Err(DriverError::io(
                    format!("binding {} on {}", err.what, cfg.ifname),
                    errno.into(),
                ))
            }
            None => {
                return Err(DriverError::Io {
                    context: format!("binding on {}", cfg.ifname),
                    source: std::io::Error::other(err.what),
                })
            }
        }
    }
}

/// Split the UMEM: the first half of the chunks is shared out between the receive queues
/// and put on their fill rings; the second half, returned, is the transmit free list.
fn fill_receive_rings(rx: &mut [RxPath], mut descs: Vec<FrameDesc>, half: u32) -> Vec<FrameDesc> {
    let tx_free = descs.split_off(half as usize);
    let per_queue = descs.len() / rx.len();
    for (path, chunk) in rx.iter_mut().zip(descs.chunks(per_queue)) {
        // Safety: these descriptors come from this UMEM, are owned by nobody else, and
        // are not touched again until this socket's RX ring hands them back.
        let produced = unsafe { path.fill_q.produce(chunk) };
        if produced != chunk.len() {
            path.fill_pending.extend_from_slice(chunk);
        }
    }
    tx_free
}

/// The socket's descriptor, borrowed for as long as its RX ring is.
fn socket_fd(rx_q: &RxQueue) -> BorrowedFd<'_> {
    // Safety: xsk-rs hands out the socket's descriptor only as a raw fd; it stays open
    // until the socket's last ring handle is dropped, and this `rx_q` is one of them,
    // borrowed for the returned lifetime.
    unsafe { BorrowedFd::borrow_raw(rx_q.fd().as_raw_fd()) }
}

/// One epoll descriptor that is readable when any receive socket is.
fn epoll_of(rx: &[RxPath]) -> Result<OwnedFd, DriverError> {
    let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)
        .map_err(|e| DriverError::io("creating an epoll set", e.into()))?;
    for path in rx {
        // The socket outlives its registration: the driver drops the epoll set first.
        epoll::add(
            &epoll,
            socket_fd(&path.rx_q),
            epoll::EventData::new_u64(u64::from(path.queue)),
            epoll::EventFlags::IN,
        )
        .map_err(|e| DriverError::io("adding an AF_XDP socket to the epoll set", e.into()))?;
    }
    Ok(epoll)
}

impl XdpDriver {
    /// Open the driver on `cfg.ifname` (see the module docs for the steps): the one driver
    /// of [`XdpDriver::open_shards`] with one shard.
    pub fn open(cfg: &XdpConfig) -> Result<Self, DriverError> {
        let mut drivers = Self::open_shards(cfg, 1)?;
        Ok(drivers.pop().expect("one shard, one driver"))
    }

    /// Open `shards` independent drivers on `cfg.ifname`, one per engine shard, fed by one
    /// XDP program.
    ///
    /// Driver `i` owns the sockets of the receive queues `q` with `q % shards == i` (every
    /// queue of the interface up to [`XSKMAP_SLOTS`]), a UMEM of its own with
    /// [`XdpConfig::frame_count`] chunks (so each shard has the rings and transmit room of a
    /// lone driver), its own fill/completion rings and epoll set, and transmits on queue `i`
    /// (on veth the peer receives those frames on its queue `i`). The program is attached
    /// once, before the sockets are bound, and leaves the interface when the last of the
    /// drivers is dropped. One shard is exactly [`XdpDriver::open`].
    ///
    /// Zero shards, or more than the interface has receive (or transmit) queues, is
    /// [`DriverError::ShardsOutOfRange`], which says how to add queues.
    pub fn open_shards(cfg: &XdpConfig, shards: u32) -> Result<Vec<Self>, DriverError> {
        let iface = interface_info(&cfg.ifname)?;
        if !iface.up {
            return Err(DriverError::InterfaceDown {
                ifname: cfg.ifname.clone(),
            });
        }
        check_privileges()?;
        let queues = planned_queues(cfg, &iface)?;
        let plans = shard_queues(cfg, &queues, tx_queue_count(&cfg.ifname), shards)?
            .into_iter()
            .map(|queues| Plan::new(cfg, &iface, queues))
            .collect::<Result<Vec<_>, _>>()?;

        let mut program = XdpProgram::load()?;
        // Attach first: if another XDP program owns the interface we say so, rather than
        // failing later on a busy queue. Until a socket is in the XSKMAP, RoCE frames on its
        // queue are passed to the kernel and counted as no_socket.
        program.attach(iface.ifindex, &cfg.ifname, cfg.attach)?;
        let program = Arc::new(program);
        // A failure drops the drivers opened so far, and with the last one the program.
        plans
            .iter()
            .zip(0..)
            .map(|(plan, shard)| Self::bind(cfg, &iface, plan, Arc::clone(&program), shard, shards))
            .collect()
    }

    /// One driver: bind its planned queues and put their sockets into the program's XSKMAP.
    fn bind(
        cfg: &XdpConfig,
        iface: &InterfaceInfo,
        plan: &Plan,
        program: Arc<XdpProgram>,
        shard: u32,
        shards: u32,
    ) -> Result<Self, DriverError> {
        let Bound {
            umem,
            descs,
            tx_q,
            comp_q,
            mut rx,
            zero_copy,
            multi_buffer,
        } = bind_with_retries(cfg, plan)?;
        for path in &rx {
            program.register_socket(path.queue, path.rx_q.fd().as_raw_fd())?;
        }
        let tx_free = fill_receive_rings(&mut rx, descs, plan.half);
        let epoll = if rx.len() > 1 {
            Some(epoll_of(&rx)?)
        } else {
            None
        };

        let chunk_room = plan.frame_size as usize - XDP_PACKET_HEADROOM;
        let max_frame = if multi_buffer {
            chunk_room * MAX_CHUNKS_PER_FRAME
        } else {
            chunk_room
        };
        Ok(XdpDriver {
            program,
            epoll,
            tx_q,
            comp_q,
            rx,
            umem,
            tx_free,
            tx_pending: Vec::new(),
            scratch: vec![FrameDesc::default(); 256],
            tx_ring_size: plan.half,
            iface: iface.clone(),
            mode: if zero_copy {
                DriverMode::XdpZeroCopy
            } else {
                DriverMode::XdpCopy
            },
            max_frame,
            frame_size: plan.frame_size,
            chunk_room,
            multi_buffer,
            rx_oversized: 0,
            next_rx: 0,
            shard,
            shards,
        })
    }

    /// The XDP program's counters plus the socket's drop counters. The program's counters
    /// cover the whole interface (every shard's queues); the socket counters are this
    /// driver's own.
    pub fn xdp_stats(&self) -> Result<XdpStats, DriverError> {
        let mut stats = self.program.stats()?;
        stats.sock_rx_dropped = self.rx_oversized;
        for path in &self.rx {
            if let Ok(s) = path.rx_q.fd().xdp_statistics() {
                stats.sock_rx_dropped += s.rx_dropped();
                stats.sock_rx_ring_full += s.rx_ring_full();
                stats.sock_fill_ring_empty += s.rx_fill_ring_empty_descs();
                stats.sock_tx_invalid += s.tx_invalid_descs();
            }
        }
        Ok(stats)
    }

    /// UMEM chunk size in use.
    pub fn frame_size(&self) -> u32 {
        self.frame_size
    }

    /// The receive queues with a bound socket.
    pub fn queues(&self) -> Vec<u32> {
        self.rx.iter().map(|p| p.queue).collect()
    }

    /// The receive queue whose socket transmits (`shard()` when all queues are bound).
    pub fn tx_queue(&self) -> u32 {
        self.rx[0].queue
    }

    /// This driver's shard, in `0..shards()`.
    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// How many drivers [`XdpDriver::open_shards`] opened with this one (1 for `open`).
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// Whether frames may span several chunks (`XDP_USE_SG`).
    pub fn multi_buffer(&self) -> bool {
        self.multi_buffer
    }

    /// Take completed transmissions back into the free list.
    fn reclaim(&mut self) {
        loop {
            // Safety: the completion ring returns descriptors of this UMEM that the kernel
            // has finished sending; writing them into our scratch space is what consume does.
            let n = unsafe { self.comp_q.consume(&mut self.scratch) };
            self.tx_free.extend_from_slice(&self.scratch[..n]);
            if n < self.scratch.len() {
                break;
            }
        }
    }

    fn kick_tx(&mut self) -> Result<(), DriverError> {
        if self.tx_q.needs_wakeup() {
            self.tx_q
                .wakeup()
                .map_err(|e| DriverError::io("waking up AF_XDP transmission", e))?;
        }
        Ok(())
    }
}

impl RxPath {
    /// Give received chunks back to the kernel; wake it if it asked.
    fn refill(&mut self) -> Result<(), DriverError> {
        if !self.fill_pending.is_empty() {
            // Safety: these descriptors were consumed from this socket's RX ring and are
            // owned by us; after produce we do not touch them until the RX ring returns them.
            let n = unsafe { self.fill_q.produce(&self.fill_pending) };
            if n == self.fill_pending.len() {
                self.fill_pending.clear();
            }
        }
        if self.fill_q.needs_wakeup() {
            self.fill_q
                .wakeup(self.rx_q.fd_mut(), 0)
                .map_err(|e| DriverError::io("waking up the AF_XDP fill ring", e))?;
        }
        Ok(())
    }

    /// Deliver up to `max` frames from this socket; returns how many.
    #[allow(clippy::too_many_arguments)]
    fn recv(
        &mut self,
        umem: &Umem,
        scratch: &mut [FrameDesc],
        max: usize,
        max_frame: usize,
        oversized: &mut u64,
        on_frame: &mut dyn FnMut(&[u8], RxMeta),
    ) -> Result<usize, DriverError> {
        self.refill()?;
        let meta = RxMeta {
            icrc_verifiable: true,
        };
        let mut delivered = 0;
        while delivered < max && self.fill_pending.is_empty() {
            let want = (max - delivered).min(scratch.len());
            // Safety: the RX ring fills our scratch descriptors with frames of this UMEM that
            // the kernel has finished writing.
            let n = unsafe { self.rx_q.consume(&mut scratch[..want]) };
            if n == 0 {
                break;
            }
            for desc in &scratch[..n] {
                // Safety: the descriptor was just returned by the RX ring, so the kernel no
                // longer writes this chunk; it goes back on the fill ring only below.
                let data = unsafe { umem.data(desc) };
                let continues = desc.options() & XDP_PKT_CONTD != 0;
                if !continues && self.partial.is_empty() && !self.discarding {
                    on_frame(data.contents(), meta);
                    delivered += 1;
                    continue;
                }
                // A multi-buffer frame: join its pieces.
                if self.discarding {
                    self.discarding = continues;
                    continue;
                }
                if self.partial.len() + data.contents().len() > max_frame {
                    *oversized += 1;
                    self.partial.clear();
                    self.discarding = continues;
                    continue;
                }
                self.partial.extend_from_slice(data.contents());
                if !continues {
                    on_frame(&self.partial, meta);
                    delivered += 1;
                    self.partial.clear();
                }
            }
            self.fill_pending.extend_from_slice(&scratch[..n]);
            self.refill()?;
        }
        Ok(delivered)
    }
}

impl Driver for XdpDriver {
    fn send(&mut self, frame: &[u8]) -> Result<(), DriverError> {
        if frame.len() > self.max_frame {
            return Err(DriverError::FrameTooLarge {
                len: frame.len(),
                max: self.max_frame,
            });
        }
        let chunks = frame.len().div_ceil(self.chunk_room).max(1);
        if self.tx_free.len() < chunks {
            self.reclaim();
        }
        if self.tx_free.len() < chunks {
            self.flush()?;
            self.reclaim();
        }
        if self.tx_free.len() < chunks {
            return Err(DriverError::TxBusy);
        }
        let mut pieces = frame.chunks(self.chunk_room).peekable();
        if frame.is_empty() {
            return Err(DriverError::InvalidFrame {
                reason: "empty frame".into(),
            });
        }
        while let Some(piece) = pieces.next() {
            let mut desc = self.tx_free.pop().expect("checked above");
            // Safety: `desc` is a free TX descriptor of this UMEM (from the initial split or
            // the completion ring), so neither the kernel nor anything else uses its memory.
            let mut data = unsafe { self.umem.data_mut(&mut desc) };
            let mut cursor = data.cursor();
            cursor.set_pos(0);
            cursor
                .write_all(piece)
                .expect("a piece is at most one chunk's room");
            // All pieces but the last say "the frame continues in the next descriptor".
            desc.set_options(if pieces.peek().is_some() {
                XDP_PKT_CONTD
            } else {
                0
            });
            self.tx_pending.push(desc);
        }
        Ok(())
    }

    fn send_with(
        &mut self,
        max_len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> Result<Option<usize>, DriverError> {
        if max_len > self.chunk_room {
            // A frame that may span several chunks (multi-buffer) is split by `send`.
            return super::send_through_scratch(self, max_len, fill);
        }
        if self.tx_free.is_empty() {
            self.reclaim();
        }
        if self.tx_free.is_empty() {
            self.flush()?;
            self.reclaim();
        }
        let Some(mut desc) = self.tx_free.pop() else {
            return Err(DriverError::TxBusy);
        };
        // Safety: `desc` is a free TX descriptor of this UMEM (from the initial split or the
        // completion ring), so neither the kernel nor anything else uses its memory.
        let mut data = unsafe { self.umem.data_mut(&mut desc) };
        // The segment's length is the cursor's position: open `max_len` bytes (at most one
        // chunk's room, checked above) for `fill`, then cut them to the frame's length.
        data.cursor().set_pos(max_len);
        let written = fill(data.contents_mut());
        let len = match written {
            Some(len) if len > 0 && len <= max_len => len,
            Some(len) => {
                data.cursor().set_pos(0);
                self.tx_free.push(desc);
                return Err(DriverError::InvalidFrame {
                    reason: format!(
                        "the frame writer reported {len} bytes in a {max_len}-byte buffer"
                    ),
                });
            }
            None => {
                data.cursor().set_pos(0);
                self.tx_free.push(desc);
                return Ok(None);
            }
        };
        data.cursor().set_pos(len);
        desc.set_options(0);
        self.tx_pending.push(desc);
        Ok(Some(len))
    }

    fn send_with_room(&self) -> usize {
        self.chunk_room
    }

    fn flush(&mut self) -> Result<(), DriverError> {
        // Nothing written and nothing in the kernel's hands (most busy-poll rounds): no ring
        // to look at. The transmit half has one chunk per ring slot, so all of them free
        // means none is the kernel's.
        if self.tx_pending.is_empty() && self.tx_free.len() == self.tx_ring_size as usize {
            return Ok(());
        }
        if !self.tx_pending.is_empty() {
            // Safety: the pending descriptors were written by `send` and are not used again
            // until the completion ring returns them.
            let n = unsafe { self.tx_q.produce(&self.tx_pending) };
            if n == self.tx_pending.len() {
                self.tx_pending.clear();
            }
        }
        // In copy mode each sendto() transmits at most a small batch (32 on Linux), so kick
        // until the TX ring is drained (bounded, in case the device stops taking frames).
        for _ in 0..(self.tx_ring_size / 16).max(4) {
            if self.tx_q.nb_free_exact() >= self.tx_ring_size {
                break;
            }
            self.kick_tx()?;
            if !self.tx_q.needs_wakeup() {
                break;
            }
        }
        self.reclaim();
        Ok(())
    }

    fn recv(
        &mut self,
        max: usize,
        on_frame: &mut dyn FnMut(&[u8], RxMeta),
    ) -> Result<usize, DriverError> {
        let n = self.rx.len();
        let mut delivered = 0;
        for i in 0..n {
            let path = &mut self.rx[(self.next_rx + i) % n];
            delivered += path.recv(
                &self.umem,
                &mut self.scratch,
                max - delivered,
                self.max_frame,
                &mut self.rx_oversized,
                on_frame,
            )?;
        }
        self.next_rx = (self.next_rx + 1) % n;
        Ok(delivered)
    }

    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(match &self.epoll {
            Some(epoll) => epoll.as_fd(),
            None => socket_fd(&self.rx[0].rx_q),
        })
    }

    fn info(&self) -> DriverInfo {
        let note = if self.shards > 1 {
            // Measured on Linux 6.18: generic XDP on veth reads the sender's transmit queue
            // j as receive queue j - 1 (0 for j = 0), so peer shards do not line up.
            let generic = if self.program.attached_mode() == Some("generic") {
                "; generic XDP: on veth a frame from the peer's transmit queue j arrives on \
                 receive queue j-1 (0 for j=0), so the peer's shard i reaches shard i-1 here \
                 (native mode keeps them aligned)"
            } else {
                ""
            };
            Some(format!(
                "shard {} of {}: receive queues {:?}, transmits on queue {}{generic}",
                self.shard,
                self.shards,
                self.queues(),
                self.tx_queue()
            ))
        } else {
            (self.iface.rx_queues as usize > self.rx.len()).then(|| {
                format!(
                    "{} has {} receive queues; only {:?} bound: RoCE arriving on others is \
                     counted as no_socket and left to the kernel",
                    self.iface.name,
                    self.iface.rx_queues,
                    self.queues()
                )
            })
        };
        DriverInfo {
            name: self.iface.name.clone(),
            mode: self.mode,
            ifindex: self.iface.ifindex,
            mac: self.iface.mac,
            mtu: self.iface.mtu,
            max_frame: self.max_frame,
            icrc_verifiable: true,
            xdp_attach: self.program.attached_mode(),
            note,
        }
    }

    fn xdp_stats(&self) -> Option<XdpStats> {
        XdpDriver::xdp_stats(self).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_buffer_follows_the_mtu() {
        assert!(!needs_multi_buffer(1500, 4096));
        assert!(!needs_multi_buffer(3818, 4096)); // 3818 + 22 = 3840 = 4096 - 256
        assert!(needs_multi_buffer(3819, 4096));
        assert!(needs_multi_buffer(1900, 2048));
        const {
            assert!(
                MAX_ROCE_FRAME > 4096 - XDP_PACKET_HEADROOM,
                "path MTU 4096 needs it"
            )
        };
        const { assert!((4096 - XDP_PACKET_HEADROOM) * MAX_CHUNKS_PER_FRAME >= 9000 + 22) };
    }

    #[test]
    fn shard_i_gets_the_queues_congruent_to_i_and_transmits_on_queue_i() {
        let cfg = XdpConfig::new("veth0");
        let queues: Vec<u32> = (0..6).collect();
        assert_eq!(
            shard_queues(&cfg, &queues, Some(6), 1).unwrap(),
            vec![queues.clone()]
        );
        assert_eq!(
            shard_queues(&cfg, &queues, Some(6), 2).unwrap(),
            vec![vec![0, 2, 4], vec![1, 3, 5]]
        );
        let four = shard_queues(&cfg, &queues, None, 4).unwrap();
        assert_eq!(four, vec![vec![0, 4], vec![1, 5], vec![2], vec![3]]);
        for (i, q) in four.iter().enumerate() {
            assert_eq!(
                q[0], i as u32,
                "a shard's first queue, its transmit queue, is its index"
            );
        }
    }

    #[test]
    fn shard_counts_the_queues_cannot_carry_are_refused_with_the_fix() {
        let cfg = XdpConfig::new("veth0");
        let queues: Vec<u32> = (0..4).collect();
        for (shards, tx) in [(0, Some(4)), (5, Some(4)), (3, Some(2)), (5, None)] {
            let err = shard_queues(&cfg, &queues, tx, shards).unwrap_err();
            let most = tx.unwrap_or(4).min(4);
            assert!(
                matches!(err, DriverError::ShardsOutOfRange { shards: s, queues: q, .. }
                    if s == shards && q == most),
                "{err:?}"
            );
            let text = err.to_string();
            assert!(text.contains("ethtool -L veth0 combined N"), "{text}");
            assert!(text.contains("numtxqueues N numrxqueues N"), "{text}");
        }
        // One shard needs no second transmit queue: it is today's single driver.
        assert!(shard_queues(&cfg, &queues, Some(1), 1).is_ok());
        let single = XdpConfig {
            all_queues: false,
            ..XdpConfig::new("veth0")
        };
        let err = shard_queues(&single, &[0], Some(4), 2).unwrap_err();
        assert!(matches!(err, DriverError::Config { .. }), "{err:?}");
    }
}
