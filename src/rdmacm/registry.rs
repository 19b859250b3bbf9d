//! The CM's shared state, below the ids and the service that drive it: the devices served
//! (a [`Port`] each: QP1, its CM agent, the ids it serves by connection, listen and SIDR
//! exchange), the ports bound, the ids' own data, and the helpers both sides use.
//!
//! Two things only the service knows how to do are handed to it when a `Cm` is made, so that
//! ids, which call them, need not know the service: running the agent's news (sends and
//! events, which create and address ids) after a user call, and opening a device's port (its
//! QP1 and thread) when an id binds an address no served device owns yet.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::cm::{CmAgent, CmConfig, CmReq, ConnId, ListenId, MadPeer, SidrId};
use crate::engine::{Mtu, QpType};
use crate::verbs::{Device, Gsi, MadAddress, Qp, MAD_LEN};
use crate::wire::addr::MacAddr;
use crate::wire::cma::CmaHeader;

use super::RDMA_UDP_QKEY;
use super::{ChannelInner, ConnParam, IdState, PathInfo, PortSpace, RdmaCmError, Result};

/// Finds (opening it if needed) the device that owns a local address; `Ok(None)`: no device
/// has it. What the drop-in librdmacm uses to open its interfaces lazily.
pub type DeviceOpener = dyn Fn(IpAddr) -> Result<Option<Device>> + Send + Sync;

/// Settings of a [`Cm`].
#[derive(Clone, Debug)]
pub struct CmConfigRdma {
    /// The CM protocol's settings for every device's agent (packet lifetime, retries, ...).
    pub agent: CmConfig,
    /// How long address resolution may wait for the next hop's MAC.
    pub resolve_timeout: Duration,
    /// The REQ's "Remote/Local CM Response Timeout" exponents (the kernel's
    /// CMA_CM_RESPONSE_TIMEOUT, 20: 4.3 s).
    pub cm_response_timeout: u8,
    /// How often a REQ is sent again (the kernel's CMA_MAX_CM_RETRIES, 15).
    pub max_cm_retries: u8,
    /// The local ACK timeout exponent of connections, unless an id sets its own
    /// (rxe's rdma_cm sends 19 in REQs, 2.1 s: docs/cm.md).
    pub local_ack_timeout: u8,
    /// The REP's target ACK delay exponent (rxe's: 15, 134 ms).
    pub target_ack_delay: u8,
    /// The RNR NAK timer our QPs advertise: the kernel's rdma_cm leaves it at 0 (655 ms,
    /// IBTA 9.7.5.2.8 table 45); xroce uses 12 (0.64 ms) unless told otherwise, as its
    /// pingpong tools do, so that a receiver that is late once does not stall 655 ms.
    pub min_rnr_timer: u8,
}

/// How long a connect that comes before its listener waits for it (see
/// [`CmConfig::listen_grace`]): perftest 4.5's `-R` server listens for its test QPs only once
/// the exchange before them is done, while its client connects at once; Linux's CM refuses
/// such a REQ, and perftest 4.5's retry then fails. A connect where nobody listens is refused
/// this much later than on Linux.
pub const LISTEN_GRACE: Duration = Duration::from_millis(100);

impl Default for CmConfigRdma {
    fn default() -> CmConfigRdma {
        CmConfigRdma {
            agent: CmConfig {
                first_comm_id: rand::random::<u32>() | 1,
                first_tid: rand::random::<u32>() as u64,
                local_ca_guid: 0,
                listen_grace: LISTEN_GRACE,
                ..CmConfig::default()
            },
            resolve_timeout: Duration::from_secs(2),
            cm_response_timeout: 20,
            max_cm_retries: 15,
            local_ack_timeout: 19,
            target_ack_delay: 15,
            min_rnr_timer: 12,
        }
    }
}

impl CmConfigRdma {
    /// Short CM timers, for links that lose nothing or lose on purpose (in-memory links,
    /// the simulator, tests): a wait for an answer is milliseconds instead of the seconds the
    /// defaults wait between resends, as rxe's kernel rdma_cm does.
    pub fn with_short_timers() -> CmConfigRdma {
        let default = CmConfigRdma::default();
        CmConfigRdma {
            agent: CmConfig {
                packet_life_time: 8,
                local_cm_response_timeout: 12,
                ..default.agent
            },
            cm_response_timeout: 12,
            ..default
        }
    }
}

/// What the service does with the news of a port's agent (see [`CmShared::agent_news`]).
pub(super) type AgentNews = fn(&Arc<CmShared>, &mut CmState, usize, &mut Vec<Arc<IdInner>>);

/// How the service opens a port on a device (see [`CmShared::open_port`]).
pub(super) type PortOpener = fn(&Arc<CmShared>, &mut CmState, &Device) -> Result<usize>;

/// Which side of a connection an id is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    None,
    Active,
    Passive,
}

pub(crate) struct IdInner {
    pub(crate) cm: Arc<CmShared>,
    pub(crate) key: u64,
    pub(crate) ps: PortSpace,
    pub(crate) qp_type: QpType,
    pub(super) user_data: AtomicU64,
    pub(crate) data: Mutex<IdData>,
}

pub(crate) struct IdData {
    pub(crate) state: IdState,
    pub(crate) channel: Arc<ChannelInner>,
    pub(super) role: Role,
    pub(super) port: Option<usize>,
    pub(super) local: Option<SocketAddr>,
    pub(super) remote: Option<SocketAddr>,
    pub(super) bound: Option<(u16, u16, IpAddr)>,
    pub(super) path: Option<PathInfo>,
    pub(super) qp: Option<Qp>,
    pub(super) conn: Option<ConnId>,
    pub(super) listens: Vec<(usize, ListenId)>,
    pub(super) sidr: Option<SidrId>,
    /// Passive: the REQ being answered; active: what our REQ asked.
    pub(super) req: Option<CmReq>,
    pub(super) peer: Option<MadPeer>,
    pub(super) tos: u8,
    pub(super) ack_timeout: Option<u8>,
    pub(super) reuse_addr: bool,
    /// The starting PSN we announce: the first PSN we receive.
    pub(super) psn: u32,
    /// What was agreed, seen from this side (for init_qp_attr and the Established event).
    pub(super) agreed: ConnParam,
    pub(super) remote_qpn: u32,
    pub(super) remote_psn: u32,
    pub(super) remote_ack_timeout: u8,
    pub(super) remote_qkey: u32,
    pub(super) mtu: Mtu,
    pub(super) established_reported: bool,
    pub(super) disconnect_reported: bool,
}

/// What is left to undo of an id dropped without [`CmId::destroy`].
pub(crate) struct Cleanup {
    pub(super) key: u64,
    pub(super) port: Option<usize>,
    pub(super) conn: Option<ConnId>,
    pub(super) listens: Vec<(usize, ListenId)>,
    pub(super) sidr: Option<SidrId>,
    pub(super) role: Role,
    pub(super) bound: Option<(u16, u16, IpAddr)>,
}

pub(crate) struct CmShared {
    pub(crate) state: Mutex<CmState>,
    pub(crate) config: CmConfigRdma,
    /// The service's handling of what the agent of a port has queued (sends, and events that
    /// create and address ids): run after every user call that changed the agent.
    pub(super) agent_news: AgentNews,
    /// The service's opening of a port on a device (its QP1, its agent, its thread).
    pub(super) open_port: PortOpener,
    pub(super) opener: Option<Box<DeviceOpener>>,
    /// Cleanups of ids dropped without [`CmId::destroy`], done by a port thread (a drop may
    /// happen where the state lock is held).
    pub(crate) graveyard: Mutex<Vec<Cleanup>>,
    pub(super) next_id_key: std::sync::atomic::AtomicU64,
}

impl CmShared {
    /// A fresh id key (created and child ids alike).
    pub(crate) fn next_key(&self) -> u64 {
        self.next_id_key
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for CmShared {
    /// Stops the port threads and waits for them, so that QP1 of each device is closed
    /// when the last handle is gone (a new `Cm` on the device may open it at once).
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for port in &state.ports {
            let _ = port.wake.send(b"x");
        }
        let me = std::thread::current().id();
        for port in &mut state.ports {
            if let Some(thread) = port.thread.take() {
                // The last handle may be dropped by a port thread itself.
                if thread.thread().id() != me {
                    let _ = thread.join();
                }
            }
        }
    }
}

pub(crate) struct CmState {
    pub(crate) ports: Vec<Port>,
    /// (port space, port, address) bound by ids; the unspecified address binds all.
    pub(crate) bound: HashSet<(u16, u16, IpAddr)>,
    pub(super) next_ephemeral: u16,
}

/// One device's CM: QP1, its agent, and the ids it serves by connection.
pub(crate) struct Port {
    pub(crate) device: Device,
    pub(crate) gsi: Arc<Gsi>,
    pub(crate) agent: CmAgent,
    pub(crate) conns: HashMap<ConnId, Weak<IdInner>>,
    pub(crate) listens: HashMap<ListenId, Weak<IdInner>>,
    pub(crate) sidrs: HashMap<SidrId, Weak<IdInner>>,
    /// Passive SIDR exchanges: the answering side's handle → the child id.
    pub(crate) sidr_children: HashMap<SidrId, Weak<IdInner>>,
    /// Behind a relay: the service id registration of each listener (`relay_listen`).
    pub(crate) relay_services: HashMap<ListenId, crate::driver::relay::ServiceRegistration>,
    pub(super) wake: UnixDatagram,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
}

impl Port {
    /// Makes the port's thread look at its timers again.
    pub(crate) fn kick(&self) {
        let _ = self.wake.send(b"k");
    }
}

impl CmShared {
    /// Finds the port of a device that owns local address `ip` (opening the device through
    /// the opener when none does yet).
    pub(crate) fn port_for_local(
        self: &Arc<Self>,
        state: &mut CmState,
        ip: IpAddr,
    ) -> Result<usize> {
        if let Some(i) = state
            .ports
            .iter()
            .position(|p| p.device.gid_index_of(ip).is_some())
        {
            return Ok(i);
        }
        // A loopback address binds to the first device, as Linux's rdma_cm does
        // (cma_bind_loopback): libfabric's verbs provider binds 127.0.0.1 to find a device.
        // The id keeps the loopback address, which listens like the wildcard
        // (`listens_anywhere`).
        if ip.is_loopback() && !state.ports.is_empty() {
            return Ok(0);
        }
        if let Some(open) = &self.opener {
            if let Some(device) = open(ip)? {
                return (self.open_port)(self, state, &device);
            }
        }
        Err(RdmaCmError::AddressNotAvailable(ip))
    }

    /// A free ephemeral port of `space` on `ip`.
    pub(crate) fn ephemeral_port(state: &mut CmState, space: u16, ip: IpAddr) -> u16 {
        for _ in 0..65536 {
            let port = state.next_ephemeral;
            state.next_ephemeral = if port >= 60999 { 32768 } else { port + 1 };
            if !port_taken(state, space, port, ip) {
                return port;
            }
        }
        0
    }
}

pub(crate) fn port_taken(state: &CmState, space: u16, port: u16, ip: IpAddr) -> bool {
    state.bound.iter().any(|&(s, p, a)| {
        s == space && p == port && (a == ip || listens_anywhere(a) || listens_anywhere(ip))
    })
}

/// An address that stands for every local address: the unspecified one, and, as Linux's
/// rdma_cm counts it (cma_any_addr: cma_zero_addr or cma_loopback_addr), a loopback one.
/// A listener bound there hears a REQ for any address of any device, and its port is
/// taken on all of them.
pub(crate) fn listens_anywhere(ip: IpAddr) -> bool {
    ip.is_unspecified() || ip.is_loopback()
}

pub(crate) fn send_mad(port: &Port, to: &MadPeer, bytes: &[u8]) {
    let Ok(mad) = <&[u8; MAD_LEN]>::try_from(bytes) else {
        return;
    };
    let sgid_index = port
        .device
        .gid_table()
        .iter()
        .find(|e| e.gid.is_ipv4() == to.gid.is_ipv4())
        .map_or(0, |e| e.index);
    let mut addr = MadAddress::gsi(to.gid, sgid_index.min(255) as u8);
    addr.qpn = to.qpn;
    addr.mac = to
        .mac
        .filter(|m| *m != [0; 6] && m[0] & 1 == 0)
        .map(MacAddr);
    if let Err(e) = port.gsi.send(&addr, mad) {
        tracing::debug!(device = port.device.name(), error = %e, "CM MAD not sent");
    }
}

/// Runs the agent of `index` after a user call changed it: sends, events, and makes the
/// port's thread take the new timers.
pub(crate) fn after_call(
    shared: &Arc<CmShared>,
    state: &mut CmState,
    index: usize,
) -> Vec<Arc<IdInner>> {
    let mut keep = Vec::new();
    (shared.agent_news)(shared, state, index, &mut keep);
    state.ports[index].kick();
    keep
}

/// The rdma_cm header a REQ or SIDR_REQ of `id` starts its private data with.
pub(crate) fn cma_header(local: SocketAddr, remote: SocketAddr) -> CmaHeader {
    CmaHeader::new(local.ip(), local.port(), remote.ip())
}

/// The Q_Key of UD ids: RDMA_UDP_QKEY.
pub(crate) const UD_QKEY: u32 = RDMA_UDP_QKEY;
