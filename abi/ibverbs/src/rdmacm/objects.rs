//! The objects handed to the program (ids, channels, events), each a box beginning with its
//! C struct, and the register of which are alive.
#![allow(clippy::missing_safety_doc)]
use super::*;

/// An event channel.
#[repr(C)]
pub(super) struct ChannelObj {
    pub(super) c: rdma_event_channel,
    pub(super) ch: EventChannel,
}

/// An id.
#[repr(C)]
pub(super) struct IdObj {
    pub(super) c: rdma_cm_id,
    pub(super) id: CmId,
    /// `route.path_rec` points here.
    pub(super) path: ibv_sa_path_rec,
    /// Events handed out and not yet acked.
    pub(super) unacked: Mutex<u32>,
    pub(super) acked: Condvar,
    /// The CQs and channels `rdma_create_qp` made (freed by `rdma_destroy_qp`).
    pub(super) own_cqs: bool,
    /// A synchronous id (`rdma_create_id` with a NULL channel, `rdma_create_ep`): the
    /// library's own channel, and the calls wait for their event ([`IdObj::complete`]).
    pub(super) synchronous: bool,
    /// A passive `rdma_create_ep`'s QP attributes: `rdma_get_request` makes each
    /// connection's QP with them.
    pub(super) ep_qp_init: Option<ibv_qp_init_attr>,
}

/// An event handed to the program.
#[repr(C)]
pub(super) struct EventObj {
    pub(super) c: rdma_cm_event,
    /// What `param.*.private_data` points to.
    pub(super) _data: Vec<u8>,
    /// The id whose ack count this event holds.
    pub(super) owner: *mut IdObj,
}

/// What kind of object a pointer handed to the program is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(super) enum Handed {
    Id,
    Channel,
    Event,
}

/// The ids, channels and events this library handed out and has not freed, by address. A
/// call with any other pointer (an id the program destroyed: perftest 4.5-0.17 retries a
/// rejected connect on the ids it has just destroyed) fails with EINVAL and a line instead
/// of reading freed memory.
pub(super) fn handed() -> &'static Mutex<HashSet<(Handed, usize)>> {
    static HANDED: OnceLock<Mutex<HashSet<(Handed, usize)>>> = OnceLock::new();
    HANDED.get_or_init(|| Mutex::new(HashSet::new()))
}

pub(super) fn hand_out<T>(kind: Handed, ptr: *mut T) -> *mut T {
    lock(handed()).insert((kind, ptr as usize));
    ptr
}

/// Forgets `ptr`; false if it was not handed out (or already taken back).
pub(super) fn take_back<T>(kind: Handed, ptr: *mut T) -> bool {
    lock(handed()).remove(&(kind, ptr as usize))
}

pub(super) fn is_live<T>(kind: Handed, ptr: *const T) -> bool {
    lock(handed()).contains(&(kind, ptr as usize))
}

/// -1/EINVAL for a pointer that is not a live object of this library.
pub(super) fn not_live(call: &str, what: &str, ptr: usize) -> c_int {
    if ptr == 0 {
        return fail_with(call, libc::EINVAL, &format!("no {what} (NULL)"));
    }
    fail_with(
        call,
        libc::EINVAL,
        &format!("{ptr:#x} is not a live {what} of this library (destroyed, or never made here)"),
    )
}

/// The channel behind `channel`, if it is one of ours and alive.
///
/// # Safety
/// No other thread destroys the channel during the call that uses it.
pub(super) unsafe fn channel_of<'a>(
    call: &str,
    channel: *mut rdma_event_channel,
) -> Result<&'a ChannelObj, c_int> {
    if !is_live(Handed::Channel, channel) {
        return Err(not_live(call, "event channel", channel as usize));
    }
    // Safety: live, so a boxed ChannelObj (whose first field is the C struct).
    Ok(unsafe { &*(channel as *const ChannelObj) })
}

/// Live ids by their [`CmId::key`], to find the C id of an event.
pub(super) fn ids() -> &'static Mutex<HashMap<u64, RawObj>> {
    static IDS: OnceLock<Mutex<HashMap<u64, RawObj>>> = OnceLock::new();
    IDS.get_or_init(|| Mutex::new(HashMap::new()))
}

pub(super) fn storage_of(addr: Option<SocketAddr>) -> libc::sockaddr_storage {
    // Safety: sockaddr_storage is plain integers; all zero is AF_UNSPEC.
    let mut s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        Some(SocketAddr::V4(a)) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // Safety: sockaddr_in fits in sockaddr_storage.
            unsafe { std::ptr::write(&mut s as *mut _ as *mut libc::sockaddr_in, sin) };
        }
        Some(SocketAddr::V6(a)) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo().to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // Safety: sockaddr_in6 fits in sockaddr_storage.
            unsafe { std::ptr::write(&mut s as *mut _ as *mut libc::sockaddr_in6, sin6) };
        }
        None => {}
    }
    s
}

/// A C socket address, or the errno for one xroce does not take.
///
/// # Safety
/// `addr` is null or a valid `sockaddr` of its family's size.
pub(super) unsafe fn socket_addr(
    call: &str,
    addr: *const libc::sockaddr,
) -> Result<SocketAddr, c_int> {
    if addr.is_null() {
        return Err(fail_with(call, libc::EINVAL, "no address"));
    }
    // Safety: per the contract.
    let family = unsafe { (*addr).sa_family } as c_int;
    match family {
        libc::AF_INET => {
            // Safety: an AF_INET address is a sockaddr_in.
            let sin = unsafe { &*(addr as *const libc::sockaddr_in) };
            Ok(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // Safety: an AF_INET6 address is a sockaddr_in6.
            let sin6 = unsafe { &*(addr as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            let port = u16::from_be(sin6.sin6_port);
            // A v4-mapped address is the IPv4 peer (IBTA A17: RoCEv2 over IPv4).
            Ok(match ip.to_ipv4_mapped() {
                Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
                None => SocketAddr::V6(SocketAddrV6::new(ip, port, 0, sin6.sin6_scope_id)),
            })
        }
        AF_IB => Err(fail_with(
            call,
            libc::EAFNOSUPPORT,
            "AF_IB addresses have no meaning on RoCE: use AF_INET or AF_INET6",
        )),
        other => Err(fail_with(
            call,
            libc::EAFNOSUPPORT,
            &format!("address family {other}: xroce takes AF_INET and AF_INET6"),
        )),
    }
}

impl IdObj {
    /// The id behind `id`, or -1/EINVAL (with a line) when it is not a live id of ours.
    ///
    /// # Safety
    /// No other thread destroys the id during the call that uses it.
    pub(super) unsafe fn checked<'a>(
        call: &str,
        id: *mut rdma_cm_id,
    ) -> Result<&'a mut IdObj, c_int> {
        if !is_live(Handed::Id, id) {
            return Err(not_live(call, "rdma_cm id", id as usize));
        }
        // Safety: live, so a boxed IdObj whose first field is the C struct.
        Ok(unsafe { &mut *(id as *mut IdObj) })
    }

    pub(super) fn new(
        id: CmId,
        channel: *mut rdma_event_channel,
        context: *mut c_void,
    ) -> *mut IdObj {
        let qp_type = match id.port_space() {
            PortSpace::Udp => resources::IBV_QPT_UD,
            _ => resources::IBV_QPT_RC,
        };
        let ps = id.port_space().code() as u32;
        let key = id.key();
        let obj = Box::into_raw(Box::new(IdObj {
            c: rdma_cm_id {
                verbs: std::ptr::null_mut(),
                channel,
                context,
                qp: std::ptr::null_mut(),
                route: rdma_route {
                    addr: rdma_addr {
                        src_storage: storage_of(None),
                        dst_storage: storage_of(None),
                        ibaddr: rdma_ib_addr::default(),
                    },
                    path_rec: std::ptr::null_mut(),
                    num_paths: 0,
                },
                ps,
                port_num: 0,
                event: std::ptr::null_mut(),
                send_cq_channel: std::ptr::null_mut(),
                send_cq: std::ptr::null_mut(),
                recv_cq_channel: std::ptr::null_mut(),
                recv_cq: std::ptr::null_mut(),
                srq: std::ptr::null_mut(),
                pd: std::ptr::null_mut(),
                qp_type,
            },
            id,
            path: ibv_sa_path_rec::default(),
            unacked: Mutex::new(0),
            acked: Condvar::new(),
            own_cqs: false,
            synchronous: false,
            ep_qp_init: None,
        }));
        lock(ids()).insert(key, RawObj::of(obj));
        hand_out(Handed::Id, obj)
    }

    /// Brings the C fields up to date with the id: addresses, GIDs, device, path.
    pub(super) fn sync(&mut self) {
        let local = self.id.local_addr();
        let remote = self.id.remote_addr();
        self.c.route.addr.src_storage = storage_of(local);
        self.c.route.addr.dst_storage = storage_of(remote);
        self.c.route.addr.ibaddr.pkey = 0xffffu16.to_be();
        if let Some(l) = local.filter(|l| !l.ip().is_unspecified()) {
            self.c.route.addr.ibaddr.sgid = Gid::from_ip(l.ip()).into();
        }
        if let Some(r) = remote {
            self.c.route.addr.ibaddr.dgid = Gid::from_ip(r.ip()).into();
        }
        if self.c.verbs.is_null() {
            if let Some(device) = self.id.device() {
                if let Ok((ctx, pd)) = shared_device(&device.netdev().name) {
                    self.c.verbs = ctx;
                    self.c.pd = pd;
                    self.c.port_num = 1;
                }
            }
        }
        let routed = !matches!(
            self.id.state(),
            IdState::Idle | IdState::Bound | IdState::AddrQuery | IdState::AddrResolved
        );
        if let (Some(path), true) = (self.id.path(), routed) {
            self.path = ibv_sa_path_rec {
                dgid: path.dgid.into(),
                sgid: path.sgid.into(),
                flow_label: 0,
                hop_limit: path.hop_limit,
                traffic_class: path.traffic_class,
                reversible: 1u32.to_be() as c_int,
                numb_path: 1,
                pkey: 0xffffu16.to_be(),
                mtu_selector: 2,
                mtu: path.mtu as u8,
                rate_selector: 2,
                packet_life_time_selector: 2,
                packet_life_time: path.packet_life_time,
                ..ibv_sa_path_rec::default()
            };
            self.c.route.path_rec = &mut self.path;
            self.c.route.num_paths = 1;
        }
        // `qp->state` after the CM moved the QP; only while the QP is alive (rping destroys
        // it with ibv_destroy_qp and may still take events for the id).
        if let (false, Some(qp)) = (self.c.qp.is_null() || self.c.verbs.is_null(), self.id.qp()) {
            // Safety: a shared context, open for the process.
            let context = unsafe { Context::from_c(self.c.verbs) };
            if let Ok((attr, _)) = qp.query() {
                // ibv_destroy_qp unregisters the QP under this lock before freeing it.
                let registry = lock(&context.registry);
                if registry.qps.get(&qp.qp_num()) == Some(&RawObj::of(self.c.qp)) {
                    let o = self.c.qp as *mut QpObj;
                    // Safety: registered in its context, so not destroyed.
                    unsafe {
                        (*o).c.qp_base.state = crate::values::ibv_qp_state::from(attr.qp_state).0
                    };
                }
            }
        }
    }

    pub(super) fn wait_acks(&self) {
        let mut n = lock(&self.unacked);
        while *n > 0 {
            n = self.acked.wait(n).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Acks the event a synchronous call left in `id->event`, if any.
    pub(super) fn ack_held_event(&mut self) {
        let held = std::mem::replace(&mut self.c.event, std::ptr::null_mut());
        if !held.is_null() {
            // Safety: an event of ours the program got through a synchronous call.
            unsafe { rdma_ack_cm_event(held) };
        }
    }

    /// For a synchronous id: waits for the event that ends `call` on the id's own channel
    /// and keeps it in `id->event` (until the next call, or `rdma_destroy_id`); -1 with
    /// errno from its status (REJECTED: ECONNREFUSED), as librdmacm. An asynchronous id:
    /// 0 at once, the event comes on its channel. With `unless_idle`, 0 when no event is
    /// queued (an `rdma_disconnect` of a connection already over has none to wait for).
    pub(super) fn complete(&mut self, call: &str, unless_idle: bool) -> c_int {
        if !self.synchronous {
            return 0;
        }
        self.ack_held_event();
        // Safety: a synchronous id's channel is its own, alive until the id is destroyed.
        let ch = unsafe { &*(self.c.channel as *const ChannelObj) };
        let event = loop {
            let next = if unless_idle {
                match ch.ch.try_get_event() {
                    Some(ev) => ev,
                    None => return 0,
                }
            } else {
                match ch.ch.get_event(None) {
                    Ok(ev) => ev,
                    Err(e) => return fail(call, &e),
                }
            };
            if let Some(c) = c_event(next) {
                break c;
            }
        };
        self.c.event = event;
        // Safety: just made.
        let (kind, status) = unsafe { ((*event).event, (*event).status) };
        if status == 0 {
            return 0;
        }
        let errno = if kind == EventKind::Rejected.code() {
            libc::ECONNREFUSED
        } else {
            status.saturating_abs()
        };
        let name = EVENT_NAMES
            .get(kind as usize)
            .copied()
            .unwrap_or("an event");
        fail_with(call, errno, &format!("{name}, status {status}"))
    }
}

/// A new event channel, handed out, or -1 with a line.
pub(super) fn new_channel(call: &str) -> Result<*mut rdma_event_channel, c_int> {
    if let Err(e) = cm() {
        return Err(fail(call, &e));
    }
    if crate::capi::device_list::interfaces().is_empty() {
        return Err(fail_with(
            call,
            libc::ENODEV,
            "no xroce device (XROCE_NETDEV)",
        ));
    }
    let ch = EventChannel::new().map_err(|e| fail(call, &e))?;
    let fd = ch.as_raw_fd();
    // The fd blocks until the program says otherwise (libfabric sets O_NONBLOCK and
    // expects EAGAIN): the CM reads it with MSG_DONTWAIT itself.
    // Safety: fcntl on our own fd.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    let obj = Box::into_raw(Box::new(ChannelObj {
        c: rdma_event_channel { fd },
        ch,
    }));
    Ok(hand_out(Handed::Channel, obj) as *mut rdma_event_channel)
}

/// Frees a channel of ours (false, with a line, for any other pointer).
pub(super) fn destroy_channel(call: &str, channel: *mut rdma_event_channel) -> bool {
    if !take_back(Handed::Channel, channel) {
        not_live(call, "event channel", channel as usize);
        return false;
    }
    // Safety: handed out by new_channel, boxed there, now taken back.
    drop(unsafe { Box::from_raw(channel as *mut ChannelObj) });
    true
}

/// The device maximum for `RDMA_MAX_*` (0xFF) and a cap for the rest.
pub(super) fn depth(value: u8, max: u32) -> u8 {
    let max = max.min(255) as u8;
    if value == RDMA_MAX_RESP_RES {
        max
    } else {
        value
    }
}

/// A C `rdma_conn_param` (null: librdmacm's defaults) as xroce's.
///
/// # Safety
/// `param` is null or valid, its private data valid for its length.
pub(super) unsafe fn conn_param(param: *const rdma_conn_param, id: &IdObj) -> ConnParam {
    let (max_resp, max_init) = if id.c.verbs.is_null() {
        (16, 16)
    } else {
        // Safety: a shared context, open for the process.
        let attr = unsafe { Context::from_c(id.c.verbs) }.device_attr();
        (attr.max_qp_rd_atom, attr.max_qp_init_rd_atom)
    };
    if param.is_null() {
        return ConnParam {
            responder_resources: depth(RDMA_MAX_RESP_RES, max_resp),
            initiator_depth: depth(RDMA_MAX_RESP_RES, max_init),
            ..ConnParam::default()
        };
    }
    // Safety: per the contract.
    let p = unsafe { &*param };
    let private_data = if p.private_data.is_null() || p.private_data_len == 0 {
        Vec::new()
    } else {
        // Safety: per the contract.
        unsafe {
            std::slice::from_raw_parts(p.private_data as *const u8, p.private_data_len as usize)
        }
        .to_vec()
    };
    ConnParam {
        private_data,
        responder_resources: depth(p.responder_resources, max_resp),
        initiator_depth: depth(p.initiator_depth, max_init),
        flow_control: p.flow_control != 0,
        retry_count: p.retry_count.min(7),
        rnr_retry_count: p.rnr_retry_count.min(7),
        srq: p.srq != 0,
        qp_num: p.qp_num & 0xff_ffff,
    }
}
