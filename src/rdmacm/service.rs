//! The per-device CM service: QP1, a [`CmAgent`], and the thread that runs them; and how the
//! agent's events become rdma_cm events on the ids.
use std::collections::{HashMap, HashSet};
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::cm::{CmAgent, CmEvent, MadPeer, RejectReason, SidrStatus};
use crate::verbs::{AhAttr, Device, Gsi, ReceivedMad};
use crate::wire::addr::Gid;

use super::id::CmId;
use super::registry::{send_mad, CmConfigRdma, CmShared, CmState, DeviceOpener, IdInner, Port};
use super::UdParam;
use super::{lock, ConnParam, EventKind, EventParam, IdState, RdmaCmError, RdmaCmEvent, Result};

/// The RDMA CM of a process, or of a part of it: ids on a set of devices. Clone to share.
#[derive(Clone)]
pub struct Cm {
    pub(crate) shared: Arc<CmShared>,
}

impl std::fmt::Debug for Cm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = lock(&self.shared.state);
        f.debug_struct("Cm")
            .field(
                "devices",
                &state
                    .ports
                    .iter()
                    .map(|p| p.device.name().to_string())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Cm {
    /// A CM over `devices` (each gets its GSI, QP1, now: a device whose QP1 is taken is
    /// [`crate::engine::EngineError::GsiExists`]).
    pub fn new(devices: &[Device]) -> Result<Cm> {
        Cm::with_config(devices, CmConfigRdma::default(), None)
    }

    /// A CM with settings, and an opener for devices not in `devices` yet.
    pub fn with_config(
        devices: &[Device],
        config: CmConfigRdma,
        opener: Option<Box<DeviceOpener>>,
    ) -> Result<Cm> {
        let cm = Cm {
            shared: Arc::new(CmShared {
                state: Mutex::new(CmState {
                    ports: Vec::new(),
                    bound: HashSet::new(),
                    next_ephemeral: 32768 + (rand::random::<u16>() % 28000),
                }),
                config,
                agent_news: pump,
                open_port: add_port,
                opener,
                graveyard: Mutex::new(Vec::new()),
                next_id_key: std::sync::atomic::AtomicU64::new(1),
            }),
        };
        for device in devices {
            cm.add_device(device)?;
        }
        Ok(cm)
    }

    /// Serves one more device; its index. Adding a device twice returns the first index.
    pub fn add_device(&self, device: &Device) -> Result<usize> {
        let mut state = lock(&self.shared.state);
        add_port(&self.shared, &mut state, device)
    }

    /// The devices served.
    pub fn devices(&self) -> Vec<Device> {
        lock(&self.shared.state)
            .ports
            .iter()
            .map(|p| p.device.clone())
            .collect()
    }

    /// The CM agent counters of each device (what was sent, resent, dropped and why).
    pub fn stats(&self) -> Vec<(String, crate::cm::CmStats)> {
        lock(&self.shared.state)
            .ports
            .iter()
            .map(|p| (p.device.name().to_string(), p.agent.stats().clone()))
            .collect()
    }

    /// A new id (`rdma_create_id`) reporting to `channel`, in port space `ps`: TCP for RC,
    /// UDP for UD (IB and IPoIB have no meaning on RoCE).
    pub fn create_id(&self, channel: &super::EventChannel, ps: super::PortSpace) -> Result<CmId> {
        // Entering the connection manager: what this thread's polls left goes out now, as
        // early as it would have without them (a peer may wait for that ACK before it
        // listens: perftest's server).
        crate::verbs::end_this_threads_lease();
        let qp_type = match ps {
            super::PortSpace::Tcp => crate::engine::QpType::Rc,
            super::PortSpace::Udp => crate::engine::QpType::Ud,
            super::PortSpace::Ib => return Err(RdmaCmError::Unsupported("the IB port space")),
            super::PortSpace::Ipoib => {
                return Err(RdmaCmError::Unsupported("the IPoIB port space"))
            }
        };
        let key = self.shared.next_key();
        Ok(CmId::new(
            self.shared.clone(),
            key,
            ps,
            qp_type,
            channel.inner().clone(),
        ))
    }
}

fn add_port(shared: &Arc<CmShared>, state: &mut CmState, device: &Device) -> Result<usize> {
    if let Some(i) = state
        .ports
        .iter()
        .position(|p| Arc::ptr_eq(&p.device.core, &device.core))
    {
        return Ok(i);
    }
    let gsi = Arc::new(open_gsi(device)?);
    let (wake_rx, wake_tx) = UnixDatagram::pair()?;
    wake_rx.set_nonblocking(true)?;
    wake_tx.set_nonblocking(true)?;
    let mut config = shared.config.agent.clone();
    if config.local_ca_guid == 0 {
        config.local_ca_guid = ca_guid(device);
    }
    super::relay_listen::agent_config(device, &mut config);
    let index = state.ports.len();
    state.ports.push(Port {
        device: device.clone(),
        gsi: gsi.clone(),
        agent: CmAgent::new(config),
        conns: HashMap::new(),
        listens: HashMap::new(),
        sidrs: HashMap::new(),
        sidr_children: HashMap::new(),
        relay_services: HashMap::new(),
        wake: wake_tx,
        thread: None,
    });
    let weak = Arc::downgrade(shared);
    let thread =
        crate::verbs::threads::spawn_settled(format!("xroce-cm-{}", device.name()), move || {
            port_thread(weak, index, gsi, wake_rx)
        });
    match thread {
        Ok(t) => state.ports[index].thread = Some(t),
        Err(e) => {
            state.ports.pop();
            return Err(e.into());
        }
    }
    Ok(index)
}

/// Opens the device's QP1. A `Cm` dropped while its port thread held it for a moment
/// frees QP1 when that thread ends, which is at once: wait that long before calling QP1
/// taken.
fn open_gsi(device: &Device) -> Result<Gsi> {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        match device.open_gsi() {
            Err(crate::verbs::VerbsError::Engine(crate::engine::EngineError::GsiExists))
                if std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            other => return Ok(other?),
        }
    }
}

/// The CA GUID of a device: EUI-64 from its MAC (what rxe uses, IBTA 13.4.2 "GUID").
fn ca_guid(device: &Device) -> u64 {
    let m = device.netdev().mac.0;
    u64::from_be_bytes([m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]])
}

/// Sends what the agent of `port` has queued and turns its events into rdma_cm events.
/// Called with the state lock held; ids whose last handle must not drop under the lock are
/// returned to be dropped by the caller after unlocking.
pub(crate) fn pump(
    shared: &Arc<CmShared>,
    state: &mut CmState,
    index: usize,
    keep: &mut Vec<Arc<IdInner>>,
) {
    loop {
        let port = &mut state.ports[index];
        let mut sent_any = false;
        while let Some(out) = port.agent.poll_transmit() {
            sent_any = true;
            send_mad(port, &out.to, &out.bytes);
        }
        let Some(event) = port.agent.poll_event() else {
            if !sent_any {
                return;
            }
            continue;
        };
        handle_event(shared, state, index, event, keep);
    }
}

fn handle_event(
    shared: &Arc<CmShared>,
    state: &mut CmState,
    index: usize,
    event: CmEvent,
    keep: &mut Vec<Arc<IdInner>>,
) {
    let device = state.ports[index].device.clone();
    let now = device.shared().now();
    match event {
        CmEvent::ReqReceived {
            conn,
            listen,
            from,
            req,
        } => {
            let listener = state.ports[index]
                .listens
                .get(&listen)
                .and_then(Weak::upgrade);
            let Some(listener) = listener else {
                let _ = state.ports[index].agent.reject(
                    now,
                    conn,
                    RejectReason::InvalidServiceId,
                    &[],
                    &[],
                );
                return;
            };
            keep.push(listener.clone());
            match IdInner::child_for_req(shared, &listener, &device, index, conn, from, &req) {
                Ok((child, param)) => {
                    let children = &mut state.ports[index].conns;
                    children.insert(conn, Arc::downgrade(&child.inner));
                    report_request(&listener, child, EventParam::Conn(param));
                }
                Err(reason) => {
                    let _ = state.ports[index].agent.reject(now, conn, reason, &[], &[]);
                }
            }
        }
        CmEvent::RepReceived { conn, rep } => {
            let Some(id) = live(&mut state.ports[index].conns, &conn, false, keep) else {
                let _ = state.ports[index].agent.abandon(now, conn);
                return;
            };
            let param = ConnParam {
                private_data: rep.private_data.0.to_vec(),
                responder_resources: rep.initiator_depth,
                initiator_depth: rep.responder_resources,
                flow_control: rep.end_to_end_flow_control,
                retry_count: 0,
                rnr_retry_count: rep.rnr_retry_count,
                srq: rep.srq,
                qp_num: rep.local_qpn,
            };
            let outcome = id.on_rep(&rep);
            let port = &mut state.ports[index];
            match outcome {
                Ok(true) => {
                    // The QP is at RTS: RTU, then Established (IBTA 12.6.9).
                    let _ = port.agent.send_rtu(now, conn, &[]);
                    id.set_state(IdState::Established);
                    id.push(EventKind::Established, 0, EventParam::Conn(param));
                    // The agent's own Established event follows; it is not reported twice.
                    id.mark_established_reported();
                }
                Ok(false) => {
                    id.set_state(IdState::ConnectResponse);
                    id.push(EventKind::ConnectResponse, 0, EventParam::Conn(param));
                }
                Err(e) => {
                    tracing::debug!(error = %e, "QP could not take the REP's attributes");
                    let _ = port
                        .agent
                        .reject(now, conn, RejectReason::ConsumerDefined, &[], &[]);
                    id.qp_to_error();
                    id.set_state(IdState::Closed);
                    id.push(EventKind::ConnectError, -e.errno(), EventParam::None);
                }
            }
        }
        CmEvent::MraReceived { .. } => {}
        CmEvent::Established { conn } => {
            let Some(id) = live(&mut state.ports[index].conns, &conn, false, keep) else {
                return;
            };
            if id.take_established_reported() {
                return;
            }
            id.set_state(IdState::Established);
            id.push(
                EventKind::Established,
                0,
                EventParam::Conn(id.accepted_param()),
            );
        }
        CmEvent::Rejected {
            conn,
            reason,
            private_data,
            ..
        } => {
            let Some(id) = live(&mut state.ports[index].conns, &conn, true, keep) else {
                return;
            };
            id.forget_conn();
            id.qp_to_error();
            id.set_state(IdState::Closed);
            id.push(
                EventKind::Rejected,
                reason.code() as i32,
                EventParam::Conn(ConnParam {
                    private_data,
                    ..ConnParam::default()
                }),
            );
        }
        CmEvent::Timeout { conn } => {
            let Some(id) = live(&mut state.ports[index].conns, &conn, true, keep) else {
                return;
            };
            id.forget_conn();
            id.qp_to_error();
            id.set_state(IdState::Closed);
            id.push(EventKind::Unreachable, -libc::ETIMEDOUT, EventParam::None);
        }
        CmEvent::DisconnectRequested { conn, private_data } => {
            let Some(id) = live(&mut state.ports[index].conns, &conn, false, keep) else {
                return;
            };
            id.set_state(IdState::Disconnecting);
            id.mark_disconnect_reported();
            id.push(
                EventKind::Disconnected,
                0,
                EventParam::Conn(ConnParam {
                    private_data,
                    ..ConnParam::default()
                }),
            );
        }
        CmEvent::Disconnected { conn, .. } => {
            let Some(id) = live(&mut state.ports[index].conns, &conn, false, keep) else {
                return;
            };
            id.set_state(IdState::Closed);
            if !id.take_disconnect_reported() {
                id.push(EventKind::Disconnected, 0, EventParam::None);
            }
        }
        CmEvent::TimewaitExit { conn } => {
            let Some(id) = live(&mut state.ports[index].conns, &conn, true, keep) else {
                return;
            };
            id.forget_conn();
            id.push(EventKind::TimewaitExit, 0, EventParam::None);
        }
        CmEvent::SidrReqReceived {
            sidr,
            listen,
            from,
            private_data,
            ..
        } => {
            let listener = state.ports[index]
                .listens
                .get(&listen)
                .and_then(Weak::upgrade);
            let reply_refused = |state: &mut CmState, status| {
                let _ = state.ports[index].agent.sidr_reply(
                    now,
                    sidr,
                    crate::cm::SidrReply {
                        status,
                        qpn: 0,
                        qkey: 0,
                        private_data: Vec::new(),
                    },
                );
            };
            let Some(listener) = listener else {
                reply_refused(state, SidrStatus::Unsupported);
                return;
            };
            keep.push(listener.clone());
            match IdInner::child_for_sidr(
                shared,
                &listener,
                &device,
                index,
                sidr,
                from,
                &private_data,
            ) {
                Ok((child, param)) => {
                    let children = &mut state.ports[index].sidr_children;
                    children.insert(sidr, Arc::downgrade(&child.inner));
                    report_request(&listener, child, EventParam::Ud(param));
                }
                Err(status) => reply_refused(state, status),
            }
        }
        CmEvent::SidrRepReceived {
            sidr,
            status,
            qpn,
            qkey,
            private_data,
            ..
        } => {
            let Some(id) = live(&mut state.ports[index].sidrs, &sidr, true, keep) else {
                return;
            };
            if status == SidrStatus::Success {
                let ah_attr = id
                    .peer_ah()
                    .unwrap_or_else(|| AhAttr::new(Gid::default(), 0));
                id.set_state(IdState::Established);
                id.push(
                    EventKind::Established,
                    0,
                    EventParam::Ud(UdParam {
                        private_data,
                        ah_attr,
                        qp_num: qpn,
                        qkey,
                    }),
                );
            } else {
                id.set_state(IdState::Closed);
                id.push(
                    EventKind::Unreachable,
                    status.code() as i32,
                    EventParam::Ud(UdParam {
                        private_data,
                        ah_attr: AhAttr::new(Gid::default(), 0),
                        qp_num: 0,
                        qkey: 0,
                    }),
                );
            }
        }
        CmEvent::SidrTimeout { sidr } => {
            let Some(id) = live(&mut state.ports[index].sidrs, &sidr, true, keep) else {
                return;
            };
            id.set_state(IdState::Closed);
            id.push(EventKind::Unreachable, -libc::ETIMEDOUT, EventParam::None);
        }
    }
}

/// ConnectRequest on the listener's channel, about its new child id.
fn report_request(listener: &Arc<IdInner>, child: CmId, param: EventParam) {
    let channel = lock(&listener.data).channel.clone();
    channel.push(RdmaCmEvent {
        id: child,
        listen_id: Some(CmId::from_inner(listener.clone())),
        kind: EventKind::ConnectRequest,
        status: 0,
        param,
    });
}

/// The live id `map` names for `key` (`remove`: the agent is done with it), kept alive in
/// `keep` so that its last handle is not dropped under the lock.
fn live<K: std::hash::Hash + Eq>(
    map: &mut HashMap<K, Weak<IdInner>>,
    key: &K,
    remove: bool,
    keep: &mut Vec<Arc<IdInner>>,
) -> Option<Arc<IdInner>> {
    let weak = if remove {
        map.remove(key)?
    } else {
        map.get(key)?.clone()
    };
    let id = weak.upgrade()?;
    keep.push(id.clone());
    Some(id)
}

/// The peer of a received MAD, as the agent takes it.
fn mad_peer(mad: &ReceivedMad) -> MadPeer {
    MadPeer {
        gid: mad.src_gid,
        qpn: mad.src_qpn,
        pkey_index: mad.pkey_index,
        mac: (mad.src_mac.0 != [0; 6]).then_some(mad.src_mac.0),
    }
}

/// Runs one device's CM: MADs in, timers, cleanups of dropped ids. Ends when the [`Cm`] is
/// gone.
fn port_thread(weak: Weak<CmShared>, index: usize, gsi: Arc<Gsi>, wake: UnixDatagram) {
    let mut received: Vec<ReceivedMad> = Vec::new();
    loop {
        let Some(shared) = weak.upgrade() else {
            return;
        };
        loop {
            match gsi.poll_recv_quietly() {
                Ok(Some(mad)) => received.push(mad),
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "GSI receive failed; CM thread ends");
                    return;
                }
            }
        }
        let mut keep = Vec::new();
        let next = {
            let mut state = lock(&shared.state);
            let graves: Vec<_> = std::mem::take(&mut *lock(&shared.graveyard));
            for grave in graves {
                super::id::bury(&mut state, grave);
            }
            let port = &mut state.ports[index];
            let now = port.device.shared().now();
            for mad in received.drain(..) {
                port.agent.handle_mad(now, mad_peer(&mad), &mad.mad[..]);
            }
            if port.agent.poll_timeout().is_some_and(|t| t <= now) {
                port.agent.handle_timeout(now);
            }
            let waiting_for_rtu = establish_on_data(port, now);
            for i in 0..state.ports.len() {
                pump(&shared, &mut state, i, &mut keep);
            }
            let port = &state.ports[index];
            let timer = port
                .agent
                .poll_timeout()
                .map(|t| t.saturating_duration_since(port.device.shared().now()));
            // While a REP waits for its RTU, look for data on the QP often.
            match waiting_for_rtu {
                true => Some(timer.map_or(RTU_WATCH, |t| t.min(RTU_WATCH))),
                false => timer,
            }
        };
        drop(keep);
        drop(shared);
        if weak.strong_count() == 0 {
            // The Cm went away while this thread held it: QP1 is freed with `gsi` now.
            return;
        }
        if gsi.arm().is_err() {
            return;
        }
        // A MAD that came before the arming raised no event.
        match gsi.poll_recv_quietly() {
            Ok(Some(mad)) => {
                received.push(mad);
                continue;
            }
            Ok(None) => {}
            Err(_) => return,
        }
        // Wake at least once a second: a Cm dropped while this thread sleeps ends it.
        let timeout = next
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        let _ = crate::driver::wait::wait_readable(&[gsi.as_fd(), wake.as_fd()], Some(timeout));
        let mut byte = [0u8; 16];
        while wake.recv(&mut byte).is_ok() {}
    }
}

/// How often a passive side whose REP is not answered yet looks for data on its QP.
const RTU_WATCH: Duration = Duration::from_millis(5);

/// The passive side of a connection whose RTU is lost or late but whose QP already
/// received from the peer is established (IBTA 12.9.6: the "communication established"
/// event stands in for the RTU). The QP's expected PSN tells: it moved past the peer's
/// starting PSN. Returns whether some REP still waits.
fn establish_on_data(port: &mut Port, now: crate::engine::Instant) -> bool {
    let mut waiting = false;
    let mut arrived = Vec::new();
    for (conn, weak) in &port.conns {
        let Some(id) = weak.upgrade() else { continue };
        match id.awaiting_rtu() {
            Some(true) => arrived.push(*conn),
            Some(false) => waiting = true,
            None => {}
        }
    }
    for conn in arrived {
        let _ = port.agent.establish(now, conn);
    }
    waiting
}
