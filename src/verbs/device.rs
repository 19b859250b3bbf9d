//! `Device`: one xroce RDMA device on one network interface, with its progress thread.
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::driver::mem::{MemDriver, MemLink, MemLinkConfig};
use crate::driver::{Driver, DriverInfo, XdpStats};
use crate::engine::Mtu;
use crate::engine::{Engine, EngineConfig, Event};
use crate::netdev::{self, Gid, GidEntry, IfAddr, MacAddr, NetdevInfo, OperState};

use super::attr::{DeviceAttr, PortAttr};
use super::cq::{CompletionChannel, Cq};
use super::error::{Result, VerbsError};
use super::pd::Pd;
use super::runtime::events::AsyncQueue;
use super::runtime::{
    self, lock, panic_text, progress, ProgressMode, ProgressStats, Runtime, Shard, TracedFrame,
};

/// Which driver moves the device's frames.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum DriverKind {
    /// AF_XDP: an XDP program steers UDP 4791 to an AF_XDP socket; needs root.
    #[default]
    Xdp,
    /// A kernel UDP socket on port 4791 (no privileges; ICRC of received frames unchecked).
    Udp,
    /// Through the interface's relay (`xroce relay -d IFACE`, see
    /// [`crate::driver::relay`]), which owns its AF_XDP driver: for several processes on
    /// one interface. The QPNs of the device carry the relay's slot in bits 16..23.
    /// ([`DriverKind::Xdp`] falls back to it by itself when the interface is taken and a
    /// relay serves it.)
    Relay,
}

/// How to open a [`Device`].
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// The driver.
    pub driver: DriverKind,
    /// The progress mode.
    pub progress: ProgressMode,
    /// AF_XDP: receive queue to bind.
    pub xdp_queue: u32,
    /// AF_XDP: UMEM chunks (a power of two; half receive, half transmit; 4 KiB each). A
    /// burst larger than the receive half (e.g. the responses of one multi-MiB RDMA READ
    /// arriving faster than they are drained) is dropped by the kernel and recovered by
    /// the transport's retry, at the cost of a local ACK timeout.
    pub xdp_frame_count: u32,
    /// How long neighbour (ARP/ND) resolution may take when an address handle or a QP's
    /// address vector is resolved.
    pub neighbour_timeout: Duration,
    /// Keep the last this many frames (both directions) for [`Device::take_trace`]; 0 = off.
    pub trace_frames: usize,
    /// UDP driver: the address to bind on port 4791. `None`: the interface's first IPv4
    /// address. Any 127.0.0.0/8 address works on `lo` (two endpoints on one host).
    pub udp_local_ip: Option<IpAddr>,
    /// Write every frame the driver sends and receives to this pcap file (Ethernet link
    /// type; see [`crate::driver::tap::PcapTap`]). Over AF_XDP this is the only way to
    /// capture: tcpdump on the interface does not see the redirected frames.
    pub pcap: Option<std::path::PathBuf>,
    /// Engine shards (1..=[`MAX_SHARDS`]): each has its own engine, lock, progress token,
    /// progress thread and AF_XDP sockets (on the receive queues `q` with
    /// `q % shards == shard`), so threads that each own a CQ and its QPs do not share a lock.
    /// A CQ is placed on the shards in turn; a QP lives on its send CQ's shard. AF_XDP
    /// needs at least this many receive queues (`ethtool -L`); other drivers take only 1.
    pub shards: u32,
}

/// Most engine shards a device can have.
pub const MAX_SHARDS: u32 = 64;

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            driver: DriverKind::Xdp,
            progress: ProgressMode::Wakeup,
            xdp_queue: 0,
            xdp_frame_count: 8192,
            neighbour_timeout: Duration::from_secs(3),
            trace_frames: 0,
            udp_local_ip: None,
            pcap: None,
            shards: 1,
        }
    }
}

/// The kinds of object the device limits ([`DeviceAttr`]'s `max_pd`, `max_mr`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ObjectKind {
    Pd = 0,
    Mr = 1,
    Cq = 2,
    Qp = 3,
    Ah = 4,
    Srq = 5,
    Mw = 6,
}

impl ObjectKind {
    fn limit(self) -> (&'static str, u32) {
        use super::attr::limits;
        match self {
            ObjectKind::Pd => ("max_pd", limits::MAX_PD),
            ObjectKind::Mr => ("max_mr", limits::MAX_MR),
            ObjectKind::Cq => ("max_cq", limits::MAX_CQ),
            ObjectKind::Qp => ("max_qp", limits::MAX_QP),
            ObjectKind::Ah => ("max_ah", limits::MAX_AH),
            ObjectKind::Srq => ("max_srq", limits::MAX_SRQ),
            ObjectKind::Mw => ("max_mw", limits::MAX_MW),
        }
    }
}

/// One counted object: taken at creation (or a typed error when the device limit is
/// reached), given back when dropped.
pub(crate) struct ObjectSlot {
    core: Arc<Core>,
    kind: ObjectKind,
}

impl ObjectSlot {
    pub fn take(core: &Arc<Core>, kind: ObjectKind) -> Result<ObjectSlot> {
        let (what, max) = kind.limit();
        let counter = &core.runtime.objects[kind as usize];
        let before = counter.fetch_add(1, Ordering::SeqCst);
        if before >= max {
            counter.fetch_sub(1, Ordering::SeqCst);
            return Err(VerbsError::LimitExceeded {
                what,
                requested: before as u64 + 1,
                max: max as u64,
            });
        }
        Ok(ObjectSlot {
            core: core.clone(),
            kind,
        })
    }
}

impl Drop for ObjectSlot {
    fn drop(&mut self) {
        self.core.runtime.objects[self.kind as usize].fetch_sub(1, Ordering::SeqCst);
    }
}

/// Owns the progress thread: when the last handle on the device (the [`Device`] and every
/// object created from it) is dropped, the thread is stopped and joined.
pub(crate) struct Core {
    pub runtime: Arc<Runtime>,
    /// One background progress thread per shard, and the link watcher.
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Writing a byte stops the link watcher (when there is one).
    link_watch_stop: Mutex<Option<UnixDatagram>>,
}

impl Drop for Core {
    fn drop(&mut self) {
        self.runtime.stop.store(true, Ordering::SeqCst);
        for shard in &self.runtime.shards {
            let _ = shard.waker.send(&[1]);
        }
        if let Some(stop) = lock(&self.link_watch_stop).as_ref() {
            let _ = stop.send(&[1]);
        }
        for thread in lock(&self.threads).drain(..) {
            let _ = thread.join();
        }
    }
}

/// An RDMA device: one RoCE v2 port on one network interface (`ibv_context`).
///
/// Cheap to clone (a handle). Every object created from it keeps it alive; the progress
/// thread runs until the last of them is dropped. All methods may be called from any thread.
#[derive(Clone)]
pub struct Device {
    pub(crate) core: Arc<Core>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.core.runtime.name)
            .field("driver", &self.core.runtime.driver_info.mode)
            .finish()
    }
}

/// Who the device is on the network when it is not opened on a kernel interface.
#[derive(Clone, Debug)]
pub struct DeviceIdentity {
    /// A name for messages ("mem0").
    pub name: String,
    /// Its MAC address.
    pub mac: MacAddr,
    /// Link MTU.
    pub mtu: u32,
    /// Its IP addresses (the GID table is built from them).
    pub addrs: Vec<IpAddr>,
}

impl Device {
    /// Opens the device on network interface `ifname` with the driver of `config`.
    ///
    /// Errors name the cause: a missing or down interface, missing privileges for AF_XDP,
    /// another XDP program attached, no IPv4 address for the UDP driver, ...
    pub fn open(ifname: &str, config: DeviceConfig) -> Result<Device> {
        check_shards(config.shards)?;
        let mut net = netdev::query(ifname)?;
        if !net.admin_up {
            return Err(crate::driver::DriverError::InterfaceDown {
                ifname: ifname.to_string(),
            }
            .into());
        }
        let shards = config.shards;
        let (drivers, fixed_ip_ident): (Vec<Box<dyn Driver>>, Option<u16>) = match config.driver {
            #[cfg(not(feature = "xdp"))]
            DriverKind::Xdp => return Err(crate::driver::DriverError::XdpNotBuilt.into()),
            #[cfg(feature = "xdp")]
            DriverKind::Xdp => {
                let mut xcfg = crate::driver::xdp::XdpConfig::new(ifname);
                xcfg.queue = config.xdp_queue;
                xcfg.frame_count = config.xdp_frame_count;
                let drivers: Vec<Box<dyn Driver>> = if shards == 1 {
                    match crate::driver::xdp::XdpDriver::open(&xcfg) {
                        Ok(d) => vec![Box::new(d)],
                        // Another xroce owns the interface: share it through its relay if
                        // one serves it, else say how to.
                        Err(
                            e @ (crate::driver::DriverError::XroceAlreadyAttached { .. }
                            | crate::driver::DriverError::BindBusy { .. }),
                        ) => match crate::driver::relay::RelayDriver::connect(ifname) {
                            Ok(relay) => {
                                tracing::info!(
                                    ifname,
                                    slot = relay.slot(),
                                    "interface taken: using its relay"
                                );
                                vec![Box::new(relay)]
                            }
                            Err(crate::driver::DriverError::RelayMissing { .. }) => {
                                return Err(e.into())
                            }
                            Err(relay_error) => return Err(relay_error.into()),
                        },
                        Err(e) => return Err(e.into()),
                    }
                } else {
                    // One program; shard i owns the receive queues q % shards == i and
                    // transmits on queue i (docs/xdp.md, "Sharded drivers").
                    crate::driver::xdp::XdpDriver::open_shards(&xcfg, shards)?
                        .into_iter()
                        .map(|d| Box::new(d) as Box<dyn Driver>)
                        .collect()
                };
                (drivers, None)
            }
            DriverKind::Relay => {
                if shards > 1 {
                    return Err(VerbsError::InvalidArgument(format!(
                        "shards {shards}: a relay client has one connection, so one shard"
                    )));
                }
                let relay = crate::driver::relay::RelayDriver::connect(ifname)?;
                (vec![Box::new(relay) as Box<dyn Driver>], None)
            }
            DriverKind::Udp => {
                if shards > 1 {
                    return Err(VerbsError::InvalidArgument(format!(
                        "shards {shards}: the UDP driver has one socket, so one shard"
                    )));
                }
                let ip = match config.udp_local_ip {
                    Some(ip) => ip,
                    None => IpAddr::V4(net.first_ipv4().ok_or_else(|| {
                        VerbsError::InvalidArgument(format!(
                            "{ifname} has no IPv4 address for the UDP driver to bind; add one \
                             (ip addr add ... dev {ifname}) or set udp_local_ip"
                        ))
                    })?),
                };
                // The socket receives only what is sent to the bound address, so that is the
                // device's one IP GID (index 1, after the link-local one, as on rxe). It need
                // not be listed on the interface: loopback answers for all of 127.0.0.0/8.
                let prefix_len = net
                    .addrs
                    .iter()
                    .find(|a| a.ip == ip)
                    .map_or(32, |a| a.prefix_len);
                net.addrs.retain(|a| match a.ip {
                    IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80 && ip.is_ipv6(),
                    IpAddr::V4(_) => false,
                });
                net.addrs.push(IfAddr { ip, prefix_len });
                let ucfg = crate::driver::udp::UdpConfig::new(ifname, ip);
                // The kernel sends DF=1 and IP ID 0 for this socket: the ICRC must cover that.
                (
                    vec![Box::new(crate::driver::udp::UdpDriver::open(&ucfg)?)],
                    Some(0),
                )
            }
        };
        let udp_source = match config.driver {
            DriverKind::Udp => config
                .udp_local_ip
                .or_else(|| net.first_ipv4().map(IpAddr::V4)),
            DriverKind::Xdp | DriverKind::Relay => None,
        };
        Device::start(net, drivers, fixed_ip_ident, udp_source, config)
    }

    /// A device over any driver, with an identity given by the caller (tests, the mem link).
    pub fn with_driver(
        driver: Box<dyn Driver>,
        identity: DeviceIdentity,
        config: DeviceConfig,
    ) -> Result<Device> {
        if config.shards != 1 {
            return Err(VerbsError::InvalidArgument(format!(
                "shards {}: one driver makes one shard (Device::with_drivers takes one per shard)",
                config.shards
            )));
        }
        Device::with_drivers(vec![driver], identity, config)
    }

    /// A device with one shard per driver (`config.shards` is ignored: the drivers say how
    /// many), with an identity given by the caller (tests, the mem link's lanes).
    pub fn with_drivers(
        drivers: Vec<Box<dyn Driver>>,
        identity: DeviceIdentity,
        config: DeviceConfig,
    ) -> Result<Device> {
        check_shards(drivers.len() as u32)?;
        let driver = &drivers[0];
        let net = NetdevInfo {
            name: identity.name.clone(),
            ifindex: 0,
            mac: identity.mac,
            mtu: identity.mtu,
            max_mtu: Some(identity.mtu),
            oper_state: OperState::Up,
            admin_up: true,
            carrier: Some(true),
            link_type: "ether".into(),
            driver: Some(driver.info().mode.to_string()),
            num_rx_queues: Some(1),
            addrs: identity
                .addrs
                .iter()
                .map(|&ip| IfAddr {
                    ip,
                    prefix_len: if ip.is_ipv4() { 24 } else { 64 },
                })
                .collect(),
            xdp: None,
        };
        Device::start(net, drivers, None, None, config)
    }

    /// Two devices joined by an in-memory link (no kernel, no privileges): addresses
    /// 198.18.0.1 and 198.18.0.2, MACs 02:00:00:00:00:01 and :02, each other's neighbour.
    /// `config.pcap` captures the first device's frames (both directions).
    /// `config.shards` must be 1 (see [`Device::mem_pair_sharded`]).
    pub fn mem_pair(
        link: &MemLinkConfig,
        config: DeviceConfig,
    ) -> Result<(Device, Device, MemLink)> {
        if config.shards != 1 {
            return Err(VerbsError::InvalidArgument(format!(
                "shards {}: Device::mem_pair_sharded makes sharded mem pairs",
                config.shards
            )));
        }
        let (a, b, mut links) = Device::mem_pair_sharded(link, config)?;
        Ok((a, b, links.remove(0)))
    }

    /// Two devices of `config.shards` shards each, joined by one in-memory link per shard
    /// ("lanes", like the queues of a veth pair): what shard `i` of one sends, shard `i` of
    /// the other receives. Returns the lanes' handles, by shard.
    pub fn mem_pair_sharded(
        link: &MemLinkConfig,
        config: DeviceConfig,
    ) -> Result<(Device, Device, Vec<MemLink>)> {
        check_shards(config.shards)?;
        let macs = [MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2])];
        let ips: [IpAddr; 2] = [[198, 18, 0, 1].into(), [198, 18, 0, 2].into()];
        let (mut side_a, mut side_b, mut links) = (Vec::new(), Vec::new(), Vec::new());
        for lane in 0..config.shards as u64 {
            let lane_link = MemLinkConfig {
                seed: link.seed.wrapping_add(lane),
                ..link.clone()
            };
            let (a, b, handle) = MemDriver::pair(macs[0].0, macs[1].0, &lane_link)?;
            side_a.push(Box::new(a) as Box<dyn Driver>);
            side_b.push(Box::new(b) as Box<dyn Driver>);
            links.push(handle);
        }
        let identity = |i: usize| DeviceIdentity {
            name: format!("mem{i}"),
            mac: macs[i],
            mtu: link.mtu,
            addrs: vec![ips[i]],
        };
        let dev_a = Device::with_drivers(side_a, identity(0), config.clone())?;
        // One capture file holds one device's view: the first one's.
        let dev_b = Device::with_drivers(
            side_b,
            identity(1),
            DeviceConfig {
                pcap: None,
                ..config
            },
        )?;
        dev_a.add_static_neighbour(ips[1], macs[1]);
        dev_b.add_static_neighbour(ips[0], macs[0]);
        Ok((dev_a, dev_b, links))
    }

    fn start(
        net: NetdevInfo,
        drivers: Vec<Box<dyn Driver>>,
        fixed_ip_ident: Option<u16>,
        udp_source: Option<IpAddr>,
        config: DeviceConfig,
    ) -> Result<Device> {
        let mut drivers = drivers;
        if let Some(path) = &config.pcap {
            if drivers.len() > 1 {
                return Err(VerbsError::InvalidArgument(format!(
                    "a capture file with {} shards: one capture needs one shard (shards 1)",
                    drivers.len()
                )));
            }
            let driver = drivers.pop().expect("one driver");
            drivers.push(Box::new(crate::driver::tap::PcapTap::create(driver, path)?));
        }
        // Subscribed, then the link's state read once more: a change after that read is
        // notified, none falls between the two.
        let link_watch = match net.ifindex {
            0 => None,
            ifindex => {
                let watch = netdev::LinkWatch::open(ifindex)?;
                let active = netdev::query(&net.name).map_or(net.is_active(), |n| n.is_active());
                Some((watch, active))
            }
        };
        let gid_table = net.gid_table();
        let local_ips = gid_table.iter().map(|g| g.gid.to_ip()).collect();
        let mut engine_config = EngineConfig::new(
            net.mac.0,
            gid_table
                .first()
                .map(|g| g.gid.to_ip())
                .unwrap_or(IpAddr::from([0u8; 16])),
        );
        engine_config.gids = gid_table.iter().map(|g| g.gid.to_ip()).collect();
        engine_config.fixed_ip_ident = fixed_ip_ident;
        let qpn_prefix = drivers[0].qpn_prefix();
        let relay = drivers[0].relay_endpoint();
        engine_config.qpn_prefix = qpn_prefix;
        engine_config.port_mtu = net.active_mtu().unwrap_or(Mtu::Mtu256);
        let driver_info = drivers[0].info();
        let engines = Engine::new_shards(engine_config, drivers.len() as u32);
        let mut shards = Vec::with_capacity(drivers.len());
        let mut wakers = Vec::with_capacity(drivers.len());
        for (index, (engine, driver)) in engines.into_iter().zip(drivers).enumerate() {
            let (waker_rx, waker_tx) = UnixDatagram::pair().map_err(|source| VerbsError::Io {
                context: "creating the progress thread's wake-up socket",
                source,
            })?;
            for s in [&waker_rx, &waker_tx] {
                s.set_nonblocking(true).map_err(|source| VerbsError::Io {
                    context: "making the wake-up socket non-blocking",
                    source,
                })?;
            }
            wakers.push(waker_rx);
            shards.push(Shard {
                engine: Mutex::new(engine),
                progress: Mutex::new(progress::Progress::new(driver, index)),
                pending: AtomicBool::new(false),
                poller_seen: AtomicU64::new(0),
                posts_waiting: AtomicUsize::new(0),
                last_post: AtomicU64::new(0),
                burst_posts: AtomicUsize::new(0),
                transmit_deferred: AtomicBool::new(false),
                thread_wake_at: AtomicU64::new(progress::THREAD_AWAKE),
                waker: waker_tx,
                inbox: Mutex::new(progress::Inbox::default()),
                inbox_waiting: AtomicBool::new(false),
            });
        }
        let shared = Arc::new(Runtime {
            name: format!("xroce_{}", net.name),
            udp_source,
            shards,
            next_cq_shard: AtomicUsize::new(0),
            start: Instant::now(),
            progress_mode: config.progress,
            stop: AtomicBool::new(false),
            stopped: Mutex::new(None),
            stopped_flag: AtomicBool::new(false),
            gid_table,
            driver_info,
            netdev: net,
            neighbour_timeout: config.neighbour_timeout,
            static_neighbours: Mutex::new(HashMap::new()),
            channels: Mutex::new(HashMap::new()),
            all_channels: Mutex::new(Vec::new()),
            async_events: AsyncQueue::new()?,
            local_ips,
            qpn_prefix,
            relay,
            stats: ProgressStats::default(),
            xdp_stats: Mutex::new(None),
            xdp_stats_wanted: AtomicBool::new(false),
            xdp_stats_generation: AtomicU64::new(0),
            trace_limit: config.trace_frames,
            trace: Mutex::new(VecDeque::new()),
            objects: Default::default(),
        });
        // The Core first: if a spawn fails, dropping it stops the threads already started.
        let core = Arc::new(Core {
            runtime: shared.clone(),
            threads: Mutex::new(Vec::new()),
            link_watch_stop: Mutex::new(None),
        });
        for (index, waker_rx) in wakers.into_iter().enumerate() {
            let thread_shared = shared.clone();
            let name = match shared.shards.len() {
                1 => format!("xroce-progress-{}", shared.netdev.name),
                _ => format!("xroce-{}-{index}", shared.netdev.name),
            };
            let thread = super::threads::spawn_settled(name, move || {
                // A bug in the engine or a driver must not leave a device that silently
                // stops answering: record why, so every later verbs call says so.
                let shared = thread_shared.clone();
                let run =
                    std::panic::AssertUnwindSafe(|| progress::run(thread_shared, index, waker_rx));
                if let Err(panic) = std::panic::catch_unwind(run) {
                    let what = panic_text(&*panic);
                    progress::fail(&shared, format!("progress thread panicked: {what}"));
                }
            })
            .map_err(|source| VerbsError::Io {
                context: "spawning the progress thread",
                source,
            })?;
            lock(&core.threads).push(thread);
        }
        if let Some((watch, active)) = link_watch {
            let (stop_rx, stop_tx) = UnixDatagram::pair().map_err(|source| VerbsError::Io {
                context: "creating the link watcher's stop socket",
                source,
            })?;
            *lock(&core.link_watch_stop) = Some(stop_tx);
            let thread_shared = shared.clone();
            let thread = super::threads::spawn_settled(
                format!("xroce-link-{}", shared.netdev.name),
                move || runtime::events::watch_link(thread_shared, watch, stop_rx, active),
            )
            .map_err(|source| VerbsError::Io {
                context: "spawning the link watcher",
                source,
            })?;
            lock(&core.threads).push(thread);
        }
        Ok(Device { core })
    }

    pub(crate) fn shared(&self) -> &Runtime {
        &self.core.runtime
    }

    /// The device name, `xroce_<interface>`.
    pub fn name(&self) -> &str {
        &self.shared().name
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        DeviceAttr::for_netdev(&self.shared().netdev)
    }

    /// `ibv_query_port`; only port 1 exists. Reads the interface again for a fresh state.
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        if port != 1 {
            return Err(VerbsError::NoSuchPort(port));
        }
        let shared = self.shared();
        let net = if shared.netdev.ifindex != 0 {
            netdev::query(&shared.netdev.name).unwrap_or_else(|_| shared.netdev.clone())
        } else {
            shared.netdev.clone()
        };
        Ok(PortAttr::for_netdev(&net))
    }

    /// The active path MTU of port 1 (largest IB MTU fitting the link MTU minus 80).
    pub fn active_mtu(&self) -> Mtu {
        self.shared().netdev.active_mtu().unwrap_or(Mtu::Mtu256)
    }

    /// `ibv_query_gid` on port 1.
    pub fn query_gid(&self, index: u32) -> Result<Gid> {
        let table = &self.shared().gid_table;
        table
            .get(index as usize)
            .map(|e| e.gid)
            .ok_or_else(|| VerbsError::NoSuchGid {
                index,
                device: self.name().to_string(),
                len: table.len() as u32,
            })
    }

    /// The whole GID table (with types) of port 1.
    pub fn gid_table(&self) -> &[GidEntry] {
        &self.shared().gid_table
    }

    /// The index of the GID of `ip`, if it is one of the device's addresses.
    pub fn gid_index_of(&self, ip: IpAddr) -> Option<u32> {
        let gid = Gid::from_ip(ip);
        self.gid_table()
            .iter()
            .find(|e| e.gid == gid)
            .map(|e| e.index)
    }

    /// The first IPv4 GID's index (what rdma-core tools select with `-g 1` on rxe).
    pub fn ipv4_gid_index(&self) -> Option<u32> {
        self.gid_table()
            .iter()
            .find(|e| e.gid.is_ipv4())
            .map(|e| e.index)
    }

    /// The interface facts the device was opened with.
    pub fn netdev(&self) -> &NetdevInfo {
        &self.shared().netdev
    }

    /// The driver in use.
    pub fn driver_info(&self) -> &DriverInfo {
        &self.shared().driver_info
    }

    /// The relay the device shares its interface through, and the slot it holds (`None`:
    /// the device has its driver to itself).
    pub fn relay_endpoint(&self) -> Option<&crate::driver::relay::RelayEndpoint> {
        self.shared().relay.as_ref()
    }

    /// A snapshot of the engine's counters (rxe names, drops by reason).
    pub fn counters(&self) -> crate::engine::Counters {
        let mut sum = crate::engine::Counters::default();
        for shard in &self.shared().shards {
            sum.add(lock(&shard.engine).counters());
        }
        sum
    }

    /// How many engine shards the device has ([`DeviceConfig::shards`]).
    pub fn shard_count(&self) -> u32 {
        self.shared().shards.len() as u32
    }

    /// Why the last frame that could not be emitted or that the driver refused failed, with
    /// its QP (each is counted in `counters().emit_failed`).
    pub fn last_emit_error(&self) -> Option<String> {
        self.shared()
            .shards
            .iter()
            .find_map(|s| lock(&s.engine).last_emit_error().map(str::to_string))
    }

    /// The progress thread's counters.
    pub fn progress_stats(&self) -> &ProgressStats {
        &self.shared().stats
    }

    /// The XDP program's counters (AF_XDP driver only). Asks the progress thread (which
    /// owns the driver) for a fresh reading and waits up to 100 ms for it.
    pub fn xdp_stats(&self) -> Option<XdpStats> {
        let shared = self.shared();
        if shared.driver_info.xdp_attach.is_some()
            || shared.driver_info.mode.as_str().starts_with("xdp")
        {
            let generation = shared.xdp_stats_generation.load(Ordering::SeqCst);
            shared.xdp_stats_wanted.store(true, Ordering::SeqCst);
            // The program's counters are the interface's: shard 0 reads them.
            shared.wake(0);
            let deadline = Instant::now() + Duration::from_millis(100);
            while shared.xdp_stats_generation.load(Ordering::SeqCst) == generation
                && Instant::now() < deadline
                && lock(&shared.stopped).is_none()
            {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        *lock(&shared.xdp_stats)
    }

    /// Takes the frames traced so far (see [`DeviceConfig::trace_frames`]).
    pub fn take_trace(&self) -> Vec<TracedFrame> {
        lock(&self.shared().trace).drain(..).collect()
    }

    /// Next asynchronous event, if any, without blocking: QP fatal, CQ error after an
    /// overrun, SQ drained, SRQ limit reached, last WQE reached, port active / port error
    /// (the interface's link went up or down), and any other [`Event`] but
    /// [`Event::CqNotify`] (that goes to the CQ's completion channel).
    pub fn poll_async_event(&self) -> Option<Event> {
        self.shared().async_events.pop()
    }

    /// Waits for the next asynchronous event (`ibv_get_async_event`); `None` waits forever.
    /// Events queued before the device stopped are still returned; after them, a stopped
    /// device is [`VerbsError::DeviceStopped`] (at once, however long the timeout), and
    /// nothing within `timeout` is [`VerbsError::Timeout`].
    ///
    /// Unlike `ibv_get_async_event` there is nothing to acknowledge: the event is a value.
    pub fn get_async_event(&self, timeout: Option<Duration>) -> Result<Event> {
        let queue = &self.shared().async_events;
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(event) = queue.pop() {
                return Ok(event);
            }
            // `fail` records the cause before it wakes the queue's fd.
            self.shared().check_alive()?;
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return Err(VerbsError::Timeout(timeout.unwrap_or_default()));
            }
            queue.wait(left)?;
        }
    }

    /// The asynchronous event fd (`ibv_context::async_fd`): readable while an event waits
    /// for [`Device::poll_async_event`] / [`Device::get_async_event`]. Register it with
    /// epoll/mio/tokio (`AsyncFd`); it stays valid as long as the device.
    pub fn async_fd(&self) -> BorrowedFd<'_> {
        self.shared().async_events.fd()
    }

    /// Why the progress thread stopped, if it did (the driver failed).
    pub fn stopped_reason(&self) -> Option<String> {
        lock(&self.shared().stopped).clone()
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&self) -> Result<Pd> {
        Pd::alloc(self)
    }

    /// Creates a completion queue of `depth` entries (`ibv_create_cq`), optionally
    /// reporting to a completion channel.
    pub fn create_cq(&self, depth: u32, channel: Option<&CompletionChannel>) -> Result<Cq> {
        Cq::create(self, depth, channel, None)
    }

    /// [`Device::create_cq`] on engine shard `shard` (below [`Device::shard_count`]) instead of
    /// the next one in turn: for a program that knows which thread will own the CQ and its
    /// QPs, and whose peer places its QPs alike (so each flow stays on one shard at both ends).
    pub fn create_cq_on_shard(
        &self,
        depth: u32,
        channel: Option<&CompletionChannel>,
        shard: u32,
    ) -> Result<Cq> {
        Cq::create(self, depth, channel, Some(shard))
    }

    /// Creates a completion channel (`ibv_create_comp_channel`).
    pub fn create_comp_channel(&self) -> Result<CompletionChannel> {
        CompletionChannel::create(self)
    }

    /// Declares the MAC of a neighbour, bypassing the kernel's table (used by the in-memory
    /// link, where there is no kernel).
    pub fn add_static_neighbour(&self, ip: IpAddr, mac: MacAddr) {
        lock(&self.shared().static_neighbours).insert(ip, mac);
    }

    /// The MAC that frames to `ip` must carry: a static neighbour, else the kernel's
    /// neighbour table, resolving the address when missing (within the configured timeout).
    pub fn resolve_mac(&self, ip: IpAddr) -> Result<MacAddr> {
        let shared = self.shared();
        if let Some(mac) = lock(&shared.static_neighbours).get(&ip) {
            return Ok(*mac);
        }
        if shared.netdev.addrs.iter().any(|a| a.ip == ip) {
            return Ok(shared.netdev.mac);
        }
        if shared.netdev.ifindex == 0 {
            return Err(netdev::NetdevError::NeighbourTimeout {
                ifname: shared.netdev.name.clone(),
                ip,
                next_hop: None,
                timeout: Duration::ZERO,
            }
            .into());
        }
        Ok(netdev::resolve_neighbour(
            &shared.netdev.name,
            ip,
            shared.neighbour_timeout,
        )?)
    }
}

/// The route from a device to a destination ([`Device::resolve_route`]): what an RDMA CM
/// address resolution fills in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceRoute {
    /// The destination asked about.
    pub dest: IpAddr,
    /// The source address, one of the device's.
    pub source: IpAddr,
    /// Its GID index (the `sgid_index` of address vectors and [`super::MadAddress`]).
    pub sgid_index: u32,
    /// The router towards `dest`, `None` when it is on-link.
    pub gateway: Option<IpAddr>,
    /// The next hop's MAC (the destination MAC of frames to `dest`).
    pub mac: MacAddr,
}

impl Device {
    /// Resolves where frames to `dest` go from this device: the kernel's route (outgoing
    /// interface, source address, gateway) and the next hop's MAC from the neighbour table,
    /// resolved when missing within the device's neighbour timeout. Typed errors: no route
    /// ([`netdev::NetdevError::NoRoute`]), a route through another interface
    /// ([`netdev::NetdevError::RouteElsewhere`]), no answer from the next hop
    /// ([`netdev::NetdevError::NeighbourTimeout`] / `NeighbourFailed`), a source address
    /// that is not in the GID table ([`VerbsError::InvalidArgument`]).
    ///
    /// A device without a kernel interface (the in-memory link) takes its first GID of
    /// `dest`'s family as the source and its static neighbours for the MAC.
    pub fn resolve_route(&self, dest: IpAddr) -> Result<DeviceRoute> {
        let shared = self.shared();
        if shared.netdev.ifindex == 0 {
            let source = self
                .gid_table()
                .iter()
                .map(|e| e.gid.to_ip())
                .find(|ip| ip.is_ipv4() == dest.is_ipv4())
                .ok_or_else(|| {
                    VerbsError::InvalidArgument(format!(
                        "{} has no GID of the family of {dest}",
                        shared.name
                    ))
                })?;
            let sgid_index = self.gid_index_of(source).unwrap_or(0);
            let mac = self.resolve_mac(dest)?;
            return Ok(DeviceRoute {
                dest,
                source,
                sgid_index,
                gateway: None,
                mac,
            });
        }
        let route = netdev::resolve_route(dest, shared.neighbour_timeout)?;
        if !route.local && route.ifindex != shared.netdev.ifindex {
            return Err(netdev::NetdevError::RouteElsewhere {
                ip: dest,
                ifname: shared.netdev.name.clone(),
                via: route.ifname,
            }
            .into());
        }
        let source = if route.local { dest } else { route.source };
        let sgid_index = self.gid_index_of(source).ok_or_else(|| {
            VerbsError::InvalidArgument(format!(
                "the route to {dest} leaves from {source}, which is not in the GID table of {}",
                shared.name
            ))
        })?;
        let mac = if route.local {
            shared.netdev.mac
        } else {
            route.mac
        };
        Ok(DeviceRoute {
            dest,
            source,
            sgid_index,
            gateway: route.gateway,
            mac,
        })
    }
}

impl AsFd for Device {
    /// [`Device::async_fd`].
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.async_fd()
    }
}

impl AsRawFd for Device {
    /// [`Device::async_fd`].
    fn as_raw_fd(&self) -> RawFd {
        self.async_fd().as_raw_fd()
    }
}

/// A shard count out of range is a typed error.
fn check_shards(shards: u32) -> Result<()> {
    if !(1..=MAX_SHARDS).contains(&shards) {
        return Err(VerbsError::InvalidArgument(format!(
            "shards {shards}: a device has 1 to {MAX_SHARDS} engine shards"
        )));
    }
    Ok(())
}

/// The default in-memory link configuration, re-exported for convenience.
pub fn mem_link_config(mtu: u32, loss: f64, seed: u64) -> MemLinkConfig {
    MemLinkConfig { mtu, loss, seed }
}
