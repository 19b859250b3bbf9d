//! An rdma_cm id: an address, a route, at most one connection, maybe a QP.
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cm::{
    CmReq, ConnId, ConnectRequest, MadPeer, PathMtu, RejectReason, ReplyParams, SidrId, SidrReply,
    SidrRequest, SidrStatus, TransportType,
};
use crate::engine::{AddressVector, Mtu, QpAttr, QpAttrMask, QpState, QpType};
use crate::verbs::{Access, AhAttr, Pd, Qp, QpInitAttr};
use crate::wire::addr::{Gid, MacAddr};
use crate::wire::cma::{service_id, CmaHeader};

use super::registry::{
    after_call, cma_header, listens_anywhere, port_taken, send_mad, Cleanup, CmShared, CmState,
    IdData, IdInner, Port, Role, UD_QKEY,
};
use super::{lock, ChannelInner, ConnParam, EventChannel, EventKind, EventParam, IdState};
use super::{PathInfo, PortSpace, RdmaCmError, RdmaCmEvent, Result, UdParam};
use crate::cm::State as AgentState;
use crate::engine::Instant;

/// An rdma_cm id (`struct rdma_cm_id`). A handle: clones name the same id; equal when they
/// do. The id is destroyed by [`CmId::destroy`] or when its last handle is dropped (events
/// queued for it hold handles).
#[derive(Clone)]
pub struct CmId {
    pub(crate) inner: Arc<IdInner>,
}

impl PartialEq for CmId {
    fn eq(&self, other: &CmId) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}
impl Eq for CmId {}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = lock(&self.inner.data);
        f.debug_struct("CmId")
            .field("key", &self.inner.key)
            .field("ps", &self.inner.ps)
            .field("state", &d.state)
            .field("local", &d.local)
            .field("remote", &d.remote)
            .finish()
    }
}

/// Undoes what an id held in the CM: its connection (told to the peer as its state
/// requires), listeners, SIDR exchange, bound port.
pub(crate) fn bury(state: &mut CmState, c: Cleanup) {
    if let Some(b) = c.bound {
        state.bound.remove(&b);
    }
    for (port, listen) in c.listens {
        if let Some(p) = state.ports.get_mut(port) {
            super::relay_listen::unlisten(p, listen);
            p.listens.remove(&listen);
        }
    }
    let Some(index) = c.port else { return };
    let Some(p) = state.ports.get_mut(index) else {
        return;
    };
    let now = p.device.shared().now();
    if let Some(conn) = c.conn {
        // Only while the connection is still this id's: a comm id is handed out again once
        // its time wait is over (an entry whose id is gone is this one's).
        let mine = p
            .conns
            .get(&conn)
            .is_some_and(|w| w.upgrade().is_none_or(|id| id.key == c.key));
        if mine {
            p.conns.remove(&conn);
            let _ = p.agent.abandon(now, conn);
        }
    }
    if let Some(sidr) = c.sidr {
        match c.role {
            Role::Passive => {
                if p.sidr_children.remove(&sidr).is_some() {
                    let _ = p.agent.sidr_reply(
                        now,
                        sidr,
                        SidrReply {
                            status: SidrStatus::Reject,
                            qpn: 0,
                            qkey: 0,
                            private_data: Vec::new(),
                        },
                    );
                }
            }
            _ => {
                p.sidrs.remove(&sidr);
            }
        }
    }
    // The REJ, DREQ or DREP the agent queued for an abandoned connection.
    while let Some(out) = p.agent.poll_transmit() {
        send_mad(p, &out.to, &out.bytes);
    }
    p.kick();
}

impl Drop for IdInner {
    fn drop(&mut self) {
        let d = self.data.get_mut().unwrap_or_else(|p| p.into_inner());
        if d.state == IdState::Destroyed {
            return;
        }
        // A drop may run where the state lock is held: a port thread does the cleanup
        // (it looks at the graveyard at least once a second).
        let cleanup = take_cleanup(self.key, d);
        lock(&self.cm.graveyard).push(cleanup);
    }
}

fn take_cleanup(key: u64, d: &mut IdData) -> Cleanup {
    d.state = IdState::Destroyed;
    Cleanup {
        key,
        port: d.port,
        conn: d.conn.take(),
        listens: std::mem::take(&mut d.listens),
        sidr: d.sidr.take(),
        role: d.role,
        bound: d.bound.take(),
    }
}

fn path_mtu(mtu: Mtu) -> PathMtu {
    PathMtu::from_code(mtu as u8)
}

fn mtu_of(code: PathMtu) -> Option<Mtu> {
    Some(match code.bytes()? {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        1024 => Mtu::Mtu1024,
        2048 => Mtu::Mtu2048,
        _ => Mtu::Mtu4096,
    })
}

fn random_psn() -> u32 {
    rand::random::<u32>() & 0xff_ffff
}

impl IdData {
    /// A new id's data: nothing bound, nothing asked.
    fn new(channel: Arc<ChannelInner>, qp_type: QpType) -> IdData {
        IdData {
            state: IdState::Idle,
            channel,
            role: Role::None,
            port: None,
            local: None,
            remote: None,
            bound: None,
            path: None,
            qp: None,
            conn: None,
            listens: Vec::new(),
            sidr: None,
            req: None,
            peer: None,
            tos: 0,
            ack_timeout: None,
            reuse_addr: false,
            psn: random_psn(),
            agreed: ConnParam::default(),
            remote_qpn: 0,
            remote_psn: 0,
            remote_ack_timeout: 0,
            remote_qkey: if qp_type == QpType::Ud { UD_QKEY } else { 0 },
            mtu: Mtu::Mtu1024,
            established_reported: false,
            disconnect_reported: false,
        }
    }
}

/// What every request to `listener` tells about both ends: a child id's data, with the path
/// from the rdma_cm header and the MAD's sender; `None` when the listener does not take a
/// request to that address (bound to another, or not one of the device's).
fn passive_data(
    cm: &CmShared,
    listener: &IdInner,
    l: &IdData,
    device: &crate::verbs::Device,
    port: usize,
    from: MadPeer,
    header: &CmaHeader,
) -> Option<IdData> {
    let listen_addr = l.local?;
    if !listens_anywhere(listen_addr.ip()) && !same_ip(listen_addr.ip(), header.dst_addr) {
        return None;
    }
    let local_ip = header.dst_addr;
    let sgid_index = device.gid_index_of(local_ip)? as u8;
    let local = SocketAddr::new(local_ip, listen_addr.port());
    let remote = SocketAddr::new(header.src_addr, header.src_port);
    let mut d = IdData::new(l.channel.clone(), listener.qp_type);
    d.state = IdState::ConnectRequest;
    d.role = Role::Passive;
    d.port = Some(port);
    d.local = Some(local);
    d.remote = Some(remote);
    d.peer = Some(from);
    d.tos = l.tos;
    d.ack_timeout = l.ack_timeout;
    d.mtu = device.active_mtu();
    d.path = Some(PathInfo {
        local,
        remote,
        sgid: Gid::from_ip(local_ip),
        dgid: Gid::from_ip(header.src_addr),
        sgid_index,
        next_hop_mac: peer_mac(device, &from, header.src_addr),
        gateway: None,
        mtu: d.mtu,
        hop_limit: 64,
        traffic_class: l.tos,
        packet_life_time: cm.config.agent.packet_life_time,
    });
    Some(d)
}

impl IdInner {
    fn space(&self) -> u16 {
        self.ps.code()
    }

    pub(crate) fn set_state(&self, state: IdState) {
        let mut d = lock(&self.data);
        if d.state != IdState::Destroyed {
            d.state = state;
        }
    }

    pub(crate) fn push(self: &Arc<Self>, kind: EventKind, status: i32, param: EventParam) {
        let channel = {
            let d = lock(&self.data);
            if d.state == IdState::Destroyed {
                return;
            }
            d.channel.clone()
        };
        channel.push(RdmaCmEvent {
            id: CmId::from_inner(self.clone()),
            listen_id: None,
            kind,
            status,
            param,
        });
    }

    /// For a passive id whose REP is sent and whose QP is on the id: whether the QP has
    /// received from the peer (`Some(true)`), or not yet (`Some(false)`); `None` otherwise.
    pub(crate) fn awaiting_rtu(&self) -> Option<bool> {
        let d = lock(&self.data);
        if d.role != Role::Passive || d.state != IdState::Connecting {
            return None;
        }
        let qp = d.qp.as_ref()?;
        // Its receive PSN starts at ours (the PSN we announced is the one we receive first).
        let expected = qp.query().ok()?.0.rq_psn;
        Some(expected != d.psn)
    }

    /// The agent is done with the id's connection (rejected, timed out, out of time wait):
    /// its comm id may name another connection later.
    pub(crate) fn forget_conn(&self) {
        lock(&self.data).conn = None;
    }

    pub(crate) fn mark_established_reported(&self) {
        lock(&self.data).established_reported = true;
    }

    pub(crate) fn take_established_reported(&self) -> bool {
        std::mem::take(&mut lock(&self.data).established_reported)
    }

    pub(crate) fn mark_disconnect_reported(&self) {
        lock(&self.data).disconnect_reported = true;
    }

    pub(crate) fn take_disconnect_reported(&self) -> bool {
        std::mem::take(&mut lock(&self.data).disconnect_reported)
    }

    pub(crate) fn accepted_param(&self) -> ConnParam {
        let d = lock(&self.data);
        ConnParam {
            private_data: Vec::new(),
            qp_num: d.remote_qpn,
            ..d.agreed.clone()
        }
    }

    pub(crate) fn peer_ah(&self) -> Option<AhAttr> {
        let d = lock(&self.data);
        let path = d.path.as_ref()?;
        let mut ah = AhAttr::new(path.dgid, path.sgid_index);
        ah.hop_limit = path.hop_limit;
        ah.traffic_class = path.traffic_class;
        Some(ah)
    }

    /// Moves the id's QP (if any) to the error state: its WRs flush (rdma_disconnect, a
    /// REJ).
    pub(crate) fn qp_to_error(&self) {
        let qp = lock(&self.data).qp.clone();
        if let Some(qp) = qp {
            let _ = qp.modify(
                &QpAttr {
                    qp_state: QpState::Err,
                    ..QpAttr::default()
                },
                QpAttrMask::STATE,
            );
        }
    }

    /// The active side got the REP: moves the QP to RTR and RTS (then `Ok(true)`), or
    /// reports that the id has no QP (`Ok(false)`: the user calls establish).
    pub(crate) fn on_rep(&self, rep: &crate::cm::CmRep) -> Result<bool> {
        let mut d = lock(&self.data);
        d.remote_qpn = rep.local_qpn;
        d.remote_psn = rep.starting_psn;
        d.agreed.responder_resources = d.agreed.responder_resources.min(rep.initiator_depth);
        d.agreed.initiator_depth = d.agreed.initiator_depth.min(rep.responder_resources);
        d.agreed.rnr_retry_count = rep.rnr_retry_count;
        d.agreed.srq = rep.srq;
        let Some(qp) = d.qp.clone() else {
            return Ok(false);
        };
        let (rtr, rtr_mask) = qp_attr_for(&d, QpState::Rtr, &self.cm.config)?;
        let (rts, rts_mask) = qp_attr_for(&d, QpState::Rts, &self.cm.config)?;
        drop(d);
        qp.modify(&rtr, rtr_mask)?;
        qp.modify(&rts, rts_mask)?;
        Ok(true)
    }

    /// A child id for a REQ that came to `listener`, and the event's parameters; or the
    /// reason to refuse it.
    pub(crate) fn child_for_req(
        cm: &Arc<CmShared>,
        listener: &Arc<IdInner>,
        device: &crate::verbs::Device,
        port: usize,
        conn: ConnId,
        from: MadPeer,
        req: &CmReq,
    ) -> std::result::Result<(CmId, ConnParam), RejectReason> {
        let header =
            CmaHeader::parse(&req.private_data.0).map_err(|_| RejectReason::ConsumerDefined)?;
        if listener.qp_type != QpType::Rc || req.transport_type != TransportType::Rc {
            return Err(RejectReason::InvalidTransportType);
        }
        let l = lock(&listener.data);
        let mut data = passive_data(cm, listener, &l, device, port, from, &header)
            .ok_or(RejectReason::InvalidServiceId)?;
        drop(l);
        let received = ConnParam {
            private_data: CmaHeader::user_data(&req.private_data.0).to_vec(),
            responder_resources: req.initiator_depth,
            initiator_depth: req.responder_resources,
            flow_control: req.end_to_end_flow_control,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            srq: req.srq,
            qp_num: req.local_qpn,
        };
        // The REQ's path: no larger MTU than ours, its hop limit and class (IBTA 12.6.5).
        data.mtu = mtu_of(req.path_mtu).map_or(data.mtu, |m| m.min(data.mtu));
        if let Some(path) = data.path.as_mut() {
            path.mtu = data.mtu;
            path.hop_limit = req.primary_path.hop_limit.max(1);
            path.traffic_class = req.primary_path.traffic_class;
        }
        data.conn = Some(conn);
        data.req = Some(*req);
        data.agreed = received.clone();
        data.remote_qpn = req.local_qpn;
        data.remote_psn = req.starting_psn;
        data.remote_ack_timeout = req.primary_path.local_ack_timeout;
        data.remote_qkey = req.local_qkey;
        let child = CmId::from_data(cm.clone(), listener, data);
        Ok((child, received))
    }

    /// A child id for a SIDR_REQ that came to `listener` (UD), and the event's parameters.
    pub(crate) fn child_for_sidr(
        cm: &Arc<CmShared>,
        listener: &Arc<IdInner>,
        device: &crate::verbs::Device,
        port: usize,
        sidr: SidrId,
        from: MadPeer,
        private_data: &[u8],
    ) -> std::result::Result<(CmId, UdParam), SidrStatus> {
        let header = CmaHeader::parse(private_data).map_err(|_| SidrStatus::Reject)?;
        if listener.qp_type != QpType::Ud {
            return Err(SidrStatus::Unsupported);
        }
        let l = lock(&listener.data);
        let mut data = passive_data(cm, listener, &l, device, port, from, &header)
            .ok_or(SidrStatus::Unsupported)?;
        drop(l);
        data.sidr = Some(sidr);
        let path = data.path.as_ref().expect("passive_data makes the path");
        let mut ah_attr = AhAttr::new(path.dgid, path.sgid_index);
        ah_attr.traffic_class = path.traffic_class;
        let param = UdParam {
            private_data: CmaHeader::user_data(private_data).to_vec(),
            ah_attr,
            qp_num: 0,
            qkey: UD_QKEY,
        };
        Ok((CmId::from_data(cm.clone(), listener, data), param))
    }
}

/// A connection that is ending or over: disconnecting again is a no-op.
fn over(state: IdState) -> bool {
    matches!(state, IdState::Disconnecting | IdState::Closed)
}

fn same_ip(a: IpAddr, b: IpAddr) -> bool {
    let canon = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    canon(a) == canon(b)
}

/// The MAC frames to the peer of a request go to: the request's source MAC, or, where the
/// driver sees no Ethernet header (the UDP driver), the neighbour table's entry for it.
fn peer_mac(device: &crate::verbs::Device, from: &MadPeer, peer: std::net::IpAddr) -> MacAddr {
    match from.mac {
        Some(mac) => MacAddr(mac),
        None => device
            .resolve_route(peer)
            .map(|route| route.mac)
            .unwrap_or(MacAddr([0; 6])),
    }
}

/// The attributes that move an id's QP to `target` (rdma_init_qp_attr), from the path and
/// what the CM exchange agreed (IBTA 12.6.5, 12.6.8): a starting PSN is the first PSN its
/// sender receives, as Linux's CM uses it (RTR takes ours, RTS the peer's); the responder
/// depth is what the peer may have outstanding.
fn qp_attr_for(
    d: &IdData,
    target: QpState,
    config: &super::CmConfigRdma,
) -> Result<(QpAttr, QpAttrMask)> {
    let path = d.path.as_ref().ok_or(RdmaCmError::WrongState {
        call: "init_qp_attr",
        state: d.state,
        expected: "route resolved or connected",
    })?;
    let ud = d.remote_qkey == UD_QKEY && d.req.is_none() && d.conn.is_none();
    match target {
        QpState::Init => {
            let mut attr = QpAttr {
                qp_state: QpState::Init,
                pkey_index: 0,
                port_num: 1,
                ..QpAttr::default()
            };
            let mut mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
            if ud {
                attr.qkey = UD_QKEY;
                mask |= QpAttrMask::QKEY;
            } else {
                attr.qp_access_flags = Access::LOCAL_WRITE
                    | Access::REMOTE_WRITE
                    | Access::REMOTE_READ
                    | Access::REMOTE_ATOMIC;
                mask |= QpAttrMask::ACCESS_FLAGS;
            }
            Ok((attr, mask))
        }
        QpState::Rtr => {
            let mut av = AddressVector::new(path.next_hop_mac.0, path.dgid.to_ip());
            av.sgid_index = path.sgid_index;
            av.hop_limit = path.hop_limit;
            av.traffic_class = path.traffic_class;
            let attr = QpAttr {
                qp_state: QpState::Rtr,
                path_mtu: d.mtu,
                dest_qp_num: d.remote_qpn,
                // Each side's advertised starting PSN is the one it receives first (what
                // Linux's CM does, docs/cm.md "Starting PSNs"): ours here, the peer's on RTS.
                rq_psn: d.psn,
                max_dest_rd_atomic: d.agreed.responder_resources.max(1),
                min_rnr_timer: config.min_rnr_timer,
                ah_attr: Some(av),
                ..QpAttr::default()
            };
            let mask = QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER;
            Ok((attr, mask))
        }
        QpState::Rts => {
            let timeout = match d.role {
                Role::Passive => d.remote_ack_timeout,
                _ => d.ack_timeout.unwrap_or(config.local_ack_timeout),
            };
            let attr = QpAttr {
                qp_state: QpState::Rts,
                sq_psn: d.remote_psn,
                timeout,
                retry_cnt: d.agreed.retry_count.min(7),
                rnr_retry: d.agreed.rnr_retry_count.min(7),
                max_rd_atomic: d.agreed.initiator_depth.max(1),
                ..QpAttr::default()
            };
            let mask = QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC;
            Ok((attr, mask))
        }
        other => Err(RdmaCmError::InvalidArgument(format!(
            "init_qp_attr for {other:?}: only INIT, RTR and RTS have CM attributes"
        ))),
    }
}

impl CmId {
    pub(crate) fn new(
        cm: Arc<CmShared>,
        key: u64,
        ps: PortSpace,
        qp_type: QpType,
        channel: Arc<ChannelInner>,
    ) -> CmId {
        let data = IdData::new(channel, qp_type);
        CmId {
            inner: Arc::new(IdInner {
                cm,
                key,
                ps,
                qp_type,
                user_data: AtomicU64::new(0),
                data: Mutex::new(data),
            }),
        }
    }

    fn from_data(cm: Arc<CmShared>, listener: &Arc<IdInner>, data: IdData) -> CmId {
        let key = cm.next_key();
        CmId {
            inner: Arc::new(IdInner {
                cm,
                key,
                ps: listener.ps,
                qp_type: listener.qp_type,
                user_data: AtomicU64::new(listener.user_data.load(Ordering::Relaxed)),
                data: Mutex::new(data),
            }),
        }
    }

    pub(crate) fn from_inner(inner: Arc<IdInner>) -> CmId {
        CmId { inner }
    }

    /// A number naming the id for as long as it lives.
    pub fn key(&self) -> u64 {
        self.inner.key
    }

    /// The caller's word on the id (`rdma_cm_id::context`); a child id starts with its
    /// listener's.
    pub fn user_data(&self) -> u64 {
        self.inner.user_data.load(Ordering::Relaxed)
    }

    pub fn set_user_data(&self, value: u64) {
        self.inner.user_data.store(value, Ordering::Relaxed);
    }

    pub fn port_space(&self) -> PortSpace {
        self.inner.ps
    }

    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }

    pub fn state(&self) -> IdState {
        lock(&self.inner.data).state
    }

    /// Whether the id sent a DREQ that no DREP answered yet (a DREQ received instead waits
    /// for this side's own DREP, which nothing but the user or a destroy sends).
    pub fn awaits_drep(&self) -> bool {
        let state = lock(&self.inner.cm.state);
        let d = lock(&self.inner.data);
        let (Some(index), Some(conn)) = (d.port, d.conn) else {
            return false;
        };
        state
            .ports
            .get(index)
            .is_some_and(|p| p.agent.state(conn) == Some(AgentState::DreqSent))
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        lock(&self.inner.data).local
    }

    pub fn remote_addr(&self) -> Option<SocketAddr> {
        lock(&self.inner.data).remote
    }

    /// The path, once the route is resolved (or the request arrived).
    pub fn path(&self) -> Option<PathInfo> {
        lock(&self.inner.data).path.clone()
    }

    /// The device the id is bound to, once it is.
    pub fn device(&self) -> Option<crate::verbs::Device> {
        let port = lock(&self.inner.data).port?;
        let state = lock(&self.inner.cm.state);
        state.ports.get(port).map(|p| p.device.clone())
    }

    /// The QP on the id.
    pub fn qp(&self) -> Option<Qp> {
        lock(&self.inner.data).qp.clone()
    }

    /// The channel the id reports to.
    pub fn channel(&self) -> EventChannel {
        EventChannel::from_inner(lock(&self.inner.data).channel.clone())
    }

    /// Reports to `channel` from now on, with the events still queued for the id
    /// (`rdma_migrate_id`).
    pub fn migrate(&self, channel: &EventChannel) {
        let old = {
            let mut d = lock(&self.inner.data);
            std::mem::replace(&mut d.channel, channel.inner().clone())
        };
        for e in old.take_events_of(self) {
            channel.inner().push(e);
        }
    }

    /// IPv4 TOS / IPv6 traffic class of the connection (`RDMA_OPTION_ID_TOS`).
    pub fn set_tos(&self, tos: u8) {
        lock(&self.inner.data).tos = tos;
    }

    /// The local ACK timeout exponent (`RDMA_OPTION_ID_ACK_TIMEOUT`, 0..=31).
    pub fn set_ack_timeout(&self, exponent: u8) -> Result<()> {
        if exponent > 31 {
            return Err(RdmaCmError::InvalidArgument(format!(
                "ACK timeout exponent {exponent}: 0 to 31"
            )));
        }
        lock(&self.inner.data).ack_timeout = Some(exponent);
        Ok(())
    }

    /// Lets the id bind a port another id holds (`RDMA_OPTION_ID_REUSEADDR`).
    pub fn set_reuse_addr(&self, reuse: bool) {
        lock(&self.inner.data).reuse_addr = reuse;
    }

    /// Binds the id to a local address (`rdma_bind_addr`); port 0 picks a free one, the
    /// unspecified address binds every device (listeners only).
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let cm = self.inner.cm.clone();
        let mut state = lock(&cm.state);
        let mut d = lock(&self.inner.data);
        if d.state != IdState::Idle {
            return Err(RdmaCmError::WrongState {
                call: "bind_addr",
                state: d.state,
                expected: "new",
            });
        }
        // The wildcard and a loopback address take no device (Linux's rdma_bind_addr acquires
        // one only when !cma_any_addr): `verbs` stays NULL, which libfabric's verbs provider
        // reads as "use the devices' own addresses" instead of publishing 127.0.0.1.
        let port_index = if listens_anywhere(addr.ip()) {
            None
        } else {
            Some(cm.port_for_local(&mut state, addr.ip())?)
        };
        let space = self.inner.space();
        let port = if addr.port() == 0 {
            CmShared::ephemeral_port(&mut state, space, addr.ip())
        } else {
            if port_taken(&state, space, addr.port(), addr.ip()) && !d.reuse_addr {
                return Err(RdmaCmError::AddressInUse {
                    space: self.inner.ps.name(),
                    port: addr.port(),
                    addr: addr.ip(),
                });
            }
            addr.port()
        };
        let key = (space, port, addr.ip());
        state.bound.insert(key);
        d.bound = Some(key);
        d.local = Some(SocketAddr::new(addr.ip(), port));
        d.port = port_index;
        d.state = IdState::Bound;
        Ok(())
    }

    /// Finds the local address and device for `dst` (`rdma_resolve_addr`): the route's
    /// source (or `src`), its device, the next hop's MAC. Reported by an AddrResolved or
    /// AddrError event; resolution runs on its own thread for up to `timeout`.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        crate::verbs::end_this_threads_lease();
        if dst.ip().is_unspecified() {
            return Err(RdmaCmError::InvalidArgument(format!(
                "destination {dst}: not an address to connect to"
            )));
        }
        {
            let mut d = lock(&self.inner.data);
            match d.state {
                IdState::Idle | IdState::Bound | IdState::AddrResolved => {}
                state => {
                    return Err(RdmaCmError::WrongState {
                        call: "resolve_addr",
                        state,
                        expected: "new, bound or resolved",
                    })
                }
            }
            d.state = IdState::AddrQuery;
            d.remote = Some(dst);
        }
        if let Some(src) = src {
            if self.local_addr().is_none() {
                if let Err(e) = self.bind_any_state(src) {
                    self.inner.set_state(IdState::Idle);
                    return Err(e);
                }
            }
        }
        let id = self.clone();
        let wait = timeout;
        crate::verbs::threads::spawn_settled("xroce-cm-resolve".into(), move || {
            id.finish_resolve(dst, wait)
        })?;
        Ok(())
    }

    fn bind_any_state(&self, src: SocketAddr) -> Result<()> {
        // bind_addr wants Idle: resolve_addr set AddrQuery already.
        {
            let mut d = lock(&self.inner.data);
            d.state = IdState::Idle;
        }
        let r = self.bind_addr(src);
        self.inner.set_state(IdState::AddrQuery);
        r
    }

    fn finish_resolve(&self, dst: SocketAddr, timeout: Duration) {
        let outcome = self.resolve_now(dst, timeout);
        let status = match outcome {
            Ok(()) => {
                self.inner.set_state(IdState::AddrResolved);
                0
            }
            Err(e) => {
                tracing::debug!(error = %e, "address resolution failed");
                self.inner.set_state(IdState::Idle);
                -match e {
                    RdmaCmError::Verbs(crate::verbs::VerbsError::Netdev(
                        crate::netdev::NetdevError::NeighbourTimeout { .. },
                    )) => libc::ETIMEDOUT,
                    other => {
                        let n = other.errno();
                        if n == libc::EINVAL {
                            libc::EHOSTUNREACH
                        } else {
                            n
                        }
                    }
                }
            }
        };
        let kind = if status == 0 {
            EventKind::AddrResolved
        } else {
            EventKind::AddrError
        };
        self.inner.push(kind, status, EventParam::None);
    }

    /// The route to `dst` (the device's neighbour timeout bounds the MAC's resolution; the
    /// caller's `timeout` is librdmacm's and not needed beyond it).
    fn resolve_now(&self, dst: SocketAddr, _timeout: Duration) -> Result<()> {
        let cm = self.inner.cm.clone();
        let bound = lock(&self.inner.data).local;
        // The source: the bound address, else the kernel's route's choice.
        let (source, devices) = {
            let state = lock(&cm.state);
            let devices: Vec<_> = state.ports.iter().map(|p| p.device.clone()).collect();
            (
                bound.map(|b| b.ip()).filter(|ip| !ip.is_unspecified()),
                devices,
            )
        };
        let mut found = None;
        let mut last_err = None;
        if let Some(src) = source {
            let state = lock(&cm.state);
            if let Some(i) = state
                .ports
                .iter()
                .position(|p| p.device.gid_index_of(src).is_some())
            {
                let dev = state.ports[i].device.clone();
                drop(state);
                match dev.resolve_route(dst.ip()) {
                    Ok(route) => found = Some((i, route)),
                    Err(e) => last_err = Some(e.into()),
                }
            }
        } else {
            for (i, dev) in devices.iter().enumerate() {
                match dev.resolve_route(dst.ip()) {
                    Ok(route) => {
                        found = Some((i, route));
                        break;
                    }
                    Err(e) => last_err = Some(RdmaCmError::from(e)),
                }
            }
            if found.is_none() {
                // A device not opened yet: the kernel's route names the source address.
                if let Ok(route) = crate::netdev::route_to(dst.ip()) {
                    if let Some(src) = route.pref_source {
                        let index = {
                            let mut state = lock(&cm.state);
                            cm.port_for_local(&mut state, src)
                        };
                        match index {
                            Ok(i) => {
                                let dev = lock(&cm.state).ports[i].device.clone();
                                match dev.resolve_route(dst.ip()) {
                                    Ok(r) => found = Some((i, r)),
                                    Err(e) => last_err = Some(e.into()),
                                }
                            }
                            Err(e) => last_err = Some(e),
                        }
                    }
                }
            }
        }
        let Some((index, route)) = found else {
            return Err(last_err.unwrap_or(RdmaCmError::AddressNotAvailable(dst.ip())));
        };
        let mut state = lock(&cm.state);
        let device = state.ports[index].device.clone();
        let space = self.inner.space();
        let mut d = lock(&self.inner.data);
        let local = match d.local {
            Some(l) if !l.ip().is_unspecified() => l,
            Some(l) => SocketAddr::new(route.source, l.port()),
            None => {
                let port = CmShared::ephemeral_port(&mut state, space, route.source);
                let key = (space, port, route.source);
                state.bound.insert(key);
                d.bound = Some(key);
                SocketAddr::new(route.source, port)
            }
        };
        d.local = Some(local);
        d.port = Some(index);
        d.mtu = device.active_mtu();
        d.path = Some(PathInfo {
            local,
            remote: dst,
            sgid: Gid::from_ip(local.ip()),
            dgid: Gid::from_ip(dst.ip()),
            sgid_index: route.sgid_index.min(255) as u8,
            next_hop_mac: route.mac,
            gateway: route.gateway,
            mtu: device.active_mtu(),
            hop_limit: 64,
            traffic_class: d.tos,
            packet_life_time: cm.config.agent.packet_life_time,
        });
        Ok(())
    }

    /// `rdma_resolve_route`: RoCE has no SA; the path was built by [`CmId::resolve_addr`].
    /// Reports RouteResolved.
    pub fn resolve_route(&self, _timeout: Duration) -> Result<()> {
        let mut d = lock(&self.inner.data);
        if d.state != IdState::AddrResolved {
            return Err(RdmaCmError::WrongState {
                call: "resolve_route",
                state: d.state,
                expected: "address resolved",
            });
        }
        let tos = d.tos;
        if let Some(path) = d.path.as_mut() {
            path.traffic_class = tos;
        }
        d.state = IdState::RouteResolved;
        drop(d);
        self.inner
            .push(EventKind::RouteResolved, 0, EventParam::None);
        Ok(())
    }

    /// Creates a QP for the id on `pd` and brings it to INIT (UD: to RTS, with Q_Key
    /// RDMA_UDP_QKEY); the CM moves it on from there (`rdma_create_qp`).
    pub fn create_qp(&self, pd: &Pd, init: &QpInitAttr<'_>) -> Result<Qp> {
        if init.qp_type != self.inner.qp_type {
            return Err(RdmaCmError::InvalidArgument(format!(
                "a {:?} QP on an id of the {} port space (which takes {:?})",
                init.qp_type,
                self.inner.ps.name(),
                self.inner.qp_type
            )));
        }
        if lock(&self.inner.data).qp.is_some() {
            return Err(RdmaCmError::QpExists);
        }
        let qp = pd.create_qp(init)?;
        self.attach_qp(qp.clone())?;
        Ok(qp)
    }

    /// Puts a QP made elsewhere (in RESET) on the id, as [`CmId::create_qp`] does.
    pub fn attach_qp(&self, qp: Qp) -> Result<()> {
        let mut d = lock(&self.inner.data);
        if d.qp.is_some() {
            return Err(RdmaCmError::QpExists);
        }
        if d.port.is_none() {
            return Err(RdmaCmError::WrongState {
                call: "create_qp",
                state: d.state,
                expected: "bound to a device (address resolved or a connect request)",
            });
        }
        match self.inner.qp_type {
            QpType::Ud => qp.ready_ud(UD_QKEY, d.psn)?,
            _ => qp.to_init(
                Access::LOCAL_WRITE
                    | Access::REMOTE_WRITE
                    | Access::REMOTE_READ
                    | Access::REMOTE_ATOMIC,
                0,
            )?,
        }
        d.qp = Some(qp);
        Ok(())
    }

    /// Forgets the id's QP (`rdma_destroy_qp`: the caller drops its handle).
    pub fn detach_qp(&self) -> Option<Qp> {
        lock(&self.inner.data).qp.take()
    }

    /// The attributes that move a QP to `state` for this connection (`rdma_init_qp_attr`).
    pub fn init_qp_attr(&self, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        let d = lock(&self.inner.data);
        qp_attr_for(&d, state, &self.inner.cm.config)
    }

    /// Starts listening (`rdma_listen`) on the bound address: on its device, or on every
    /// device of the [`super::Cm`] for the unspecified or a loopback address (Linux's
    /// cma_any_addr). `backlog` is taken and not used, as the kernel's rdma_cm does on IB
    /// and RoCE (only iWARP passes it on).
    pub fn listen(&self, _backlog: i32) -> Result<()> {
        let cm = self.inner.cm.clone();
        let mut state = lock(&cm.state);
        let mut d = lock(&self.inner.data);
        if d.state != IdState::Bound {
            return Err(RdmaCmError::WrongState {
                call: "listen",
                state: d.state,
                expected: "bound",
            });
        }
        let local = d.local.expect("bound ids have an address");
        let sid = service_id(self.inner.ps, local.port());
        let ports: Vec<usize> = match d.port {
            Some(p) if !listens_anywhere(local.ip()) => vec![p],
            _ => (0..state.ports.len()).collect(),
        };
        if ports.is_empty() {
            return Err(RdmaCmError::AddressNotAvailable(local.ip()));
        }
        let mut made = Vec::new();
        for p in ports {
            match super::relay_listen::listen(&mut state.ports[p], sid) {
                Ok(listen) => {
                    state.ports[p]
                        .listens
                        .insert(listen, Arc::downgrade(&self.inner));
                    made.push((p, listen));
                }
                Err(e) => {
                    for (p, l) in made {
                        super::relay_listen::unlisten(&mut state.ports[p], l);
                        state.ports[p].listens.remove(&l);
                    }
                    return Err(match e {
                        RdmaCmError::Cm(crate::cm::CmError::ServiceIdInUse { .. }) => {
                            RdmaCmError::AddressInUse {
                                space: self.inner.ps.name(),
                                port: local.port(),
                                addr: local.ip(),
                            }
                        }
                        e => e,
                    });
                }
            }
        }
        let ports: Vec<usize> = made.iter().map(|&(p, _)| p).collect();
        d.listens = made;
        d.state = IdState::Listening;
        drop(d);
        // Requests that waited for a listener (CmConfig::listen_grace) are this id's now.
        let mut keep = Vec::new();
        for p in ports {
            keep.extend(after_call(&cm, &mut state, p));
        }
        drop(state);
        drop(keep);
        Ok(())
    }

    /// Runs a call that changes the id's connection: with the `Cm` and the id locked and the
    /// id in one of `allowed`, runs `f` on the id's port; then sends what the agent queued,
    /// delivers its events, and has the port's thread take the new timers.
    fn agent_call<R>(
        &self,
        call: &'static str,
        allowed: &[IdState],
        expected: &'static str,
        f: impl FnOnce(&CmShared, &mut Port, &mut IdData, Instant) -> Result<R>,
    ) -> Result<R> {
        // A connect, accept, reject or disconnect: what this thread's polls left (the ACK of
        // the message it just read) leaves before the CM's MAD.
        crate::verbs::end_this_threads_lease();
        let cm = self.inner.cm.clone();
        let mut state = lock(&cm.state);
        let mut d = lock(&self.inner.data);
        let wrong = |state| RdmaCmError::WrongState {
            call,
            state,
            expected,
        };
        if !allowed.contains(&d.state) {
            return Err(wrong(d.state));
        }
        let index = d.port.ok_or(wrong(d.state))?;
        let port = &mut state.ports[index];
        let now = port.device.shared().now();
        let outcome = f(&cm, port, &mut d, now)?;
        drop(d);
        let keep = after_call(&cm, &mut state, index);
        drop(state);
        drop(keep);
        Ok(outcome)
    }

    /// Sends the REQ (`rdma_connect`; UD ids: SIDR_REQ). Events follow: Established (or
    /// ConnectResponse without a QP), Rejected, Unreachable, ConnectError.
    pub fn connect(&self, param: &ConnParam) -> Result<()> {
        let me = Arc::downgrade(&self.inner);
        let ud = self.inner.qp_type == QpType::Ud;
        let ps = self.inner.ps;
        self.agent_call(
            "connect",
            &[IdState::RouteResolved],
            "route resolved",
            |cm, port, d, now| {
                let path = d.path.clone().expect("resolved ids have a path");
                let header = cma_header(path.local, path.remote);
                let to = MadPeer {
                    gid: path.dgid,
                    qpn: 1,
                    pkey_index: 0,
                    mac: Some(path.next_hop_mac.0),
                };
                let sid = service_id(ps, path.remote.port());
                let bad =
                    |e: crate::wire::mad::MadError| RdmaCmError::InvalidArgument(e.to_string());
                if ud {
                    let private_data = header
                        .private_data::<216>(&param.private_data)
                        .map_err(bad)?;
                    let sidr = port.agent.sidr_request(
                        now,
                        SidrRequest {
                            to,
                            service_id: sid,
                            pkey: 0xffff,
                            timeout: cm.config.cm_response_timeout,
                            max_retries: cm.config.max_cm_retries.min(15),
                            private_data: private_data.0.to_vec(),
                        },
                    )?;
                    port.sidrs.insert(sidr, me);
                    d.sidr = Some(sidr);
                } else {
                    let qpn = match &d.qp {
                        Some(qp) => qp.qp_num(),
                        None if param.qp_num != 0 => param.qp_num,
                        None => {
                            return Err(RdmaCmError::InvalidArgument(
                                "connect without a QP on the id needs conn_param.qp_num".into(),
                            ))
                        }
                    };
                    let private_data = header
                        .private_data::<92>(&param.private_data)
                        .map_err(bad)?;
                    let ack_timeout = d.ack_timeout.unwrap_or(cm.config.local_ack_timeout);
                    let request = ConnectRequest {
                        to,
                        service_id: sid,
                        local_gid: path.sgid,
                        remote_gid: path.dgid,
                        qpn,
                        starting_psn: d.psn,
                        qkey: 0,
                        transport: TransportType::Rc,
                        responder_resources: param.responder_resources,
                        initiator_depth: param.initiator_depth,
                        retry_count: param.retry_count.min(7),
                        rnr_retry_count: param.rnr_retry_count.min(7),
                        path_mtu: path_mtu(d.mtu),
                        pkey: 0xffff,
                        traffic_class: d.tos,
                        hop_limit: path.hop_limit,
                        flow_label: 0,
                        sl: 0,
                        local_ack_timeout: ack_timeout,
                        cm_response_timeout: cm.config.cm_response_timeout,
                        max_cm_retries: cm.config.max_cm_retries.min(15),
                        srq: param.srq,
                        private_data: private_data.0.to_vec(),
                    };
                    let conn = port.agent.connect(now, request)?;
                    port.conns.insert(conn, me);
                    d.conn = Some(conn);
                    d.agreed = ConnParam {
                        private_data: Vec::new(),
                        qp_num: 0,
                        ..param.clone()
                    };
                    d.ack_timeout = Some(ack_timeout);
                }
                d.role = Role::Active;
                d.peer = Some(to);
                d.state = IdState::Connecting;
                Ok(())
            },
        )
    }

    /// Accepts a ConnectRequest (`rdma_accept`): moves the id's QP to RTR and RTS, sends
    /// the REP (UD: the SIDR_REP with the QP and RDMA_UDP_QKEY). Established follows the
    /// peer's RTU.
    pub fn accept(&self, param: &ConnParam) -> Result<()> {
        let ud = self.inner.qp_type == QpType::Ud;
        self.agent_call(
            "accept",
            &[IdState::ConnectRequest],
            "a connect request",
            |cm, port, d, now| {
                let qpn = d.qp.as_ref().map_or(param.qp_num, Qp::qp_num);
                if ud {
                    let sidr = d.sidr.take().expect("UD requests are SIDR");
                    port.sidr_children.remove(&sidr);
                    port.agent.sidr_reply(
                        now,
                        sidr,
                        SidrReply {
                            status: SidrStatus::Success,
                            qpn,
                            qkey: UD_QKEY,
                            private_data: param.private_data.clone(),
                        },
                    )?;
                    d.state = IdState::Established;
                    return Ok(());
                }
                let conn = d.conn.expect("RC requests have a connection");
                // What this side agrees to: no more than the peer asked for (IBTA 12.6.8).
                d.agreed.responder_resources =
                    param.responder_resources.min(d.agreed.responder_resources);
                d.agreed.initiator_depth = param.initiator_depth.min(d.agreed.initiator_depth);
                if let Some(qp) = d.qp.clone() {
                    let (rtr, rtr_mask) = qp_attr_for(d, QpState::Rtr, &cm.config)?;
                    let (rts, rts_mask) = qp_attr_for(d, QpState::Rts, &cm.config)?;
                    qp.modify(&rtr, rtr_mask)?;
                    qp.modify(&rts, rts_mask)?;
                }
                port.agent.accept(
                    now,
                    conn,
                    ReplyParams {
                        qpn,
                        starting_psn: d.psn,
                        qkey: 0,
                        responder_resources: d.agreed.responder_resources,
                        initiator_depth: d.agreed.initiator_depth,
                        target_ack_delay: cm.config.target_ack_delay,
                        end_to_end_flow_control: param.flow_control,
                        rnr_retry_count: param.rnr_retry_count.min(7),
                        srq: param.srq,
                        private_data: param.private_data.clone(),
                    },
                )?;
                d.state = IdState::Connecting;
                Ok(())
            },
        )
    }

    /// Refuses a ConnectRequest (`rdma_reject`): REJ "consumer defined" with
    /// `private_data` (UD: SIDR_REP "rejected").
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        self.agent_call(
            "reject",
            &[IdState::ConnectRequest],
            "a connect request",
            |_, port, d, now| {
                if let Some(sidr) = d.sidr.take() {
                    port.sidr_children.remove(&sidr);
                    let reply = SidrReply {
                        status: SidrStatus::Reject,
                        qpn: 0,
                        qkey: 0,
                        private_data: private_data.to_vec(),
                    };
                    port.agent.sidr_reply(now, sidr, reply)?;
                } else if let Some(conn) = d.conn.take() {
                    port.conns.remove(&conn);
                    let reason = RejectReason::ConsumerDefined;
                    port.agent.reject(now, conn, reason, &[], private_data)?;
                }
                d.state = IdState::Closed;
                Ok(())
            },
        )
    }

    /// Active side without a QP on the id, after ConnectResponse: sends the RTU
    /// (`rdma_establish`). No Established event follows, as with librdmacm: the caller
    /// knows (rping -q counts events and fails on an extra one).
    pub fn establish(&self) -> Result<()> {
        self.agent_call(
            "establish",
            &[IdState::ConnectResponse],
            "connect response",
            |_, port, d, now| {
                let conn = d.conn.expect("connect response has a connection");
                port.agent.send_rtu(now, conn, &[])?;
                d.state = IdState::Established;
                d.established_reported = true;
                Ok(())
            },
        )
    }

    /// Ends the connection (`rdma_disconnect`): the QP to ERR, then DREQ (or, after the
    /// peer's DREQ, DREP; a REP not yet answered by RTU: REJ). Disconnected follows the DREP
    /// (or came already with the peer's DREQ).
    pub fn disconnect(&self) -> Result<()> {
        self.inner.qp_to_error();
        {
            let mut d = lock(&self.inner.data);
            if self.inner.qp_type == QpType::Ud && d.state == IdState::Established {
                d.state = IdState::Closed;
                return Ok(());
            }
            // Already ending or over (the peer's DREQ answered, a REJ, time wait): nothing
            // to send, and not an error (the kernel's rdma_disconnect returns 0 then too;
            // ucmatose and rping disconnect after DISCONNECTED).
            if over(d.state) && d.conn.is_none() {
                return Ok(());
            }
        }
        let connected = [
            IdState::Connecting,
            IdState::ConnectResponse,
            IdState::Established,
            IdState::Disconnecting,
            IdState::Closed,
        ];
        self.agent_call("disconnect", &connected, "connected", |_, port, d, now| {
            let wrong = RdmaCmError::WrongState {
                call: "disconnect",
                state: d.state,
                expected: "connected",
            };
            let Some(conn) = d.conn else {
                return if over(d.state) { Ok(()) } else { Err(wrong) };
            };
            match port.agent.state(conn) {
                Some(AgentState::Established | AgentState::DreqRcvd) => {
                    port.agent.disconnect(now, conn, &[])?;
                }
                Some(AgentState::RepSent | AgentState::MraRepRcvd) => {
                    let reason = RejectReason::ConsumerDefined;
                    port.agent.reject(now, conn, reason, &[], &[])?;
                }
                _ if over(d.state) => return Ok(()),
                _ => return Err(wrong),
            }
            d.state = IdState::Disconnecting;
            Ok(())
        })
    }

    /// Destroys the id (`rdma_destroy_id`): its connection ends as its state requires (REJ,
    /// DREQ, DREP: [`crate::cm::CmAgent::abandon`]), listeners and port are released. The QP
    /// is not touched (it is the caller's; [`CmId::detach_qp`] hands it over).
    pub fn destroy(&self) {
        let cm = self.inner.cm.clone();
        let mut state = lock(&cm.state);
        let cleanup = {
            let mut d = lock(&self.inner.data);
            if d.state == IdState::Destroyed {
                return;
            }
            take_cleanup(self.inner.key, &mut d)
        };
        bury(&mut state, cleanup);
    }
}
