//! RDMA CM inside `libibverbs.so.1`: the `rdma_*` calls of librdmacm over
//! [`xroce::rdmacm`], exported as `xroce_rdmacm_<name>@@XROCE_RDMACM_PRIVATE` for xroce's
//! `librdmacm.so.1` (abi/rdmacm) to forward to.
//!
//! Why here and not in librdmacm itself: an id's `verbs`, `pd` and `qp` are objects of this
//! library (the program calls `ibv_alloc_pd(id->verbs)` and `ibv_post_send(id->qp)`), and
//! the CM must drive the very xroce `Device` and `Qp` behind them. Each shared object links
//! its own copy of the xroce crate, so only code in this library can share them.
//!
//! The objects (docs/rdmacm-abi.md §6): an id is a box beginning with its `rdma_cm_id`,
//! followed by the [`CmId`]; an event is a box beginning with its `rdma_cm_event` and
//! holding its private data until `rdma_ack_cm_event`; a channel begins with its
//! `rdma_event_channel` (the fd of the [`EventChannel`]). Devices are opened lazily, once
//! per process, and shared by every id on them together with one PD each, as librdmacm does.
#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)]

mod structs;
#[cfg(test)]
mod tests;

pub use structs::*;

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsRawFd;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

use xroce::netdev::Gid;
use xroce::rdmacm::{
    Cm, CmConfigRdma, CmId, ConnParam, EventChannel, EventKind, EventParam, IdState, PortSpace,
    RdmaCmError, RdmaCmEvent,
};
use xroce::verbs::Device;

use crate::capi::context::Context;
use crate::capi::resources::{self, QpObj};
use crate::capi::{lock, set_errno, RawObj};
use crate::objects::{ibv_comp_channel, ibv_context, ibv_cq, ibv_pd, ibv_qp_init_attr};
use crate::objects::{ibv_qp_init_attr_ex, ibv_srq};
use crate::structs::{ibv_ah_attr, ibv_qp_attr};

/// `rdma_event_str`'s names, by `enum rdma_cm_event_type` value.
pub const EVENT_NAMES: [&str; 16] = [
    "RDMA_CM_EVENT_ADDR_RESOLVED",
    "RDMA_CM_EVENT_ADDR_ERROR",
    "RDMA_CM_EVENT_ROUTE_RESOLVED",
    "RDMA_CM_EVENT_ROUTE_ERROR",
    "RDMA_CM_EVENT_CONNECT_REQUEST",
    "RDMA_CM_EVENT_CONNECT_RESPONSE",
    "RDMA_CM_EVENT_CONNECT_ERROR",
    "RDMA_CM_EVENT_UNREACHABLE",
    "RDMA_CM_EVENT_REJECTED",
    "RDMA_CM_EVENT_ESTABLISHED",
    "RDMA_CM_EVENT_DISCONNECTED",
    "RDMA_CM_EVENT_DEVICE_REMOVAL",
    "RDMA_CM_EVENT_MULTICAST_JOIN",
    "RDMA_CM_EVENT_MULTICAST_ERROR",
    "RDMA_CM_EVENT_ADDR_CHANGE",
    "RDMA_CM_EVENT_TIMEWAIT_EXIT",
];

/// Exports `fn name` as `xroce_rdmacm_name@@XROCE_RDMACM_PRIVATE` (and, unversioned, as
/// `xroce_rdmacm_impl_name`): the names xroce's librdmacm looks up with `dlvsym`.
macro_rules! rdmacm_export {
    ($(
        $(#[$meta:meta])*
        pub unsafe extern "C" fn $name:ident ( $($arg:ident : $argty:ty),* $(,)? ) $(-> $ret:ty)? $body:block
    )*) => {$(
        $(#[$meta])*
        #[export_name = concat!("xroce_rdmacm_impl_", stringify!($name))]
        pub unsafe extern "C" fn $name($($arg: $argty),*) $(-> $ret)? $body

        ::core::arch::global_asm!(concat!(
            ".symver xroce_rdmacm_impl_", stringify!($name), ", xroce_rdmacm_",
            stringify!($name), "@@XROCE_RDMACM_PRIVATE"
        ));
    )*};
}

// ---------------------------------------------------------------------------------------
// Errors

/// -1 with errno, and one line on stderr saying why (unless `XROCE_LOG=off`).
fn fail(call: &str, err: &RdmaCmError) -> c_int {
    fail_with(call, err.errno(), &err.to_string())
}

/// -1 with errno `errno`, and a line whose reason is that errno's text (the value the call
/// returns, not one of its own: a caller reading the line and `errno` sees one story).
fn fail_with(call: &str, errno: c_int, why: &str) -> c_int {
    let line = format!(
        "xroce: {call} failed ({}): {why}",
        std::io::Error::from_raw_os_error(errno)
    );
    #[cfg(test)]
    tests::LAST_FAILURE.with(|last| *last.borrow_mut() = Some(line.clone()));
    if !crate::capi::config::quiet() {
        eprintln!("{line}");
    }
    set_errno(errno);
    -1
}

fn refuse(call: &str, what: &'static str) -> c_int {
    fail(call, &RdmaCmError::Unsupported(what))
}

// ---------------------------------------------------------------------------------------
// The process's CM and devices

/// A device as librdmacm shares it: one context and one PD per interface, for the process.
struct SharedDevice {
    ctx: RawObj,
    pd: RawObj,
}

fn shared_devices() -> &'static Mutex<HashMap<String, SharedDevice>> {
    static DEVICES: OnceLock<Mutex<HashMap<String, SharedDevice>>> = OnceLock::new();
    DEVICES.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The shared context (opened with its device) and PD of interface `ifname`.
fn shared_device(ifname: &str) -> Result<(*mut ibv_context, *mut ibv_pd), RdmaCmError> {
    let mut all = lock(shared_devices());
    if let Some(d) = all.get(ifname) {
        return Ok((d.ctx.ptr(), d.pd.ptr()));
    }
    let entry = crate::capi::device_list::entry_for(ifname);
    // Safety: entry is a device of this library, alive for the process.
    let ctx = unsafe { crate::capi::context::ibv_open_device(entry as *mut _) };
    if ctx.is_null() {
        return Err(RdmaCmError::Io(std::io::Error::last_os_error()));
    }
    // Safety: just opened.
    if let Err(e) = unsafe { Context::from_c(ctx) }.device() {
        // Safety: ours, unused.
        unsafe { crate::capi::context::ibv_close_device(ctx) };
        return Err(e.into());
    }
    // Safety: an open context.
    let pd = unsafe { resources::ibv_alloc_pd(ctx) };
    if pd.is_null() {
        return Err(RdmaCmError::Io(std::io::Error::last_os_error()));
    }
    all.insert(
        ifname.to_string(),
        SharedDevice {
            ctx: RawObj::of(ctx),
            pd: RawObj::of(pd),
        },
    );
    Ok((ctx, pd))
}

/// The interface (offered by this library) that has address `ip`.
fn interface_with(ip: IpAddr) -> Option<String> {
    let gid = Gid::from_ip(ip);
    crate::capi::device_list::interfaces()
        .into_iter()
        .find(|name| {
            xroce::netdev::query(name)
                .is_ok_and(|info| info.gid_table().iter().any(|e| e.gid == gid))
        })
}

/// The device for `ip`; for a loopback address the first interface offered (see
/// `CmShared::port_for_local`).
fn open_for(ip: IpAddr) -> Result<Option<Device>, RdmaCmError> {
    let ifname = if ip.is_loopback() {
        crate::capi::device_list::interfaces().into_iter().next()
    } else {
        interface_with(ip)
    };
    let Some(ifname) = ifname else {
        return Ok(None);
    };
    let (ctx, _) = shared_device(&ifname)?;
    // Safety: a shared context stays open for the process.
    let device = unsafe { Context::from_c(ctx) }.device()?.clone();
    Ok(Some(device))
}

/// Serves every device (an id bound to the unspecified address listens on all of them).
fn open_all(cm: &Cm) {
    for name in crate::capi::device_list::interfaces() {
        let device = shared_device(&name).and_then(|(ctx, _)| {
            // Safety: a shared context stays open for the process.
            Ok(unsafe { Context::from_c(ctx) }.device()?.clone())
        });
        match device.and_then(|d| cm.add_device(&d)) {
            Ok(_) => {}
            Err(e) => {
                fail("rdma_listen", &e);
            }
        }
    }
}

/// The process's CM, made at the first call that needs it.
fn cm() -> Result<&'static Cm, RdmaCmError> {
    static CM: OnceLock<Result<Cm, String>> = OnceLock::new();
    let made = CM.get_or_init(|| {
        Cm::with_config(&[], CmConfigRdma::default(), Some(Box::new(open_for)))
            .map_err(|e| e.to_string())
    });
    made.as_ref()
        .map_err(|e| RdmaCmError::InvalidArgument(format!("the RDMA CM did not start: {e}")))
}

// ---------------------------------------------------------------------------------------
// Objects

/// An event channel.
#[repr(C)]
struct ChannelObj {
    c: rdma_event_channel,
    ch: EventChannel,
}

/// An id.
#[repr(C)]
struct IdObj {
    c: rdma_cm_id,
    id: CmId,
    /// `route.path_rec` points here.
    path: ibv_sa_path_rec,
    /// Events handed out and not yet acked.
    unacked: Mutex<u32>,
    acked: Condvar,
    /// The CQs and channels `rdma_create_qp` made (freed by `rdma_destroy_qp`).
    own_cqs: bool,
    /// A synchronous id (`rdma_create_id` with a NULL channel, `rdma_create_ep`): the
    /// library's own channel, and the calls wait for their event ([`IdObj::complete`]).
    synchronous: bool,
    /// A passive `rdma_create_ep`'s QP attributes: `rdma_get_request` makes each
    /// connection's QP with them.
    ep_qp_init: Option<ibv_qp_init_attr>,
}

/// An event handed to the program.
#[repr(C)]
struct EventObj {
    c: rdma_cm_event,
    /// What `param.*.private_data` points to.
    _data: Vec<u8>,
    /// The id whose ack count this event holds.
    owner: *mut IdObj,
}

/// What kind of object a pointer handed to the program is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Handed {
    Id,
    Channel,
    Event,
}

/// The ids, channels and events this library handed out and has not freed, by address. A
/// call with any other pointer (an id the program destroyed: perftest 4.5-0.17 retries a
/// rejected connect on the ids it has just destroyed) fails with EINVAL and a line instead
/// of reading freed memory.
fn handed() -> &'static Mutex<HashSet<(Handed, usize)>> {
    static HANDED: OnceLock<Mutex<HashSet<(Handed, usize)>>> = OnceLock::new();
    HANDED.get_or_init(|| Mutex::new(HashSet::new()))
}

fn hand_out<T>(kind: Handed, ptr: *mut T) -> *mut T {
    lock(handed()).insert((kind, ptr as usize));
    ptr
}

/// Forgets `ptr`; false if it was not handed out (or already taken back).
fn take_back<T>(kind: Handed, ptr: *mut T) -> bool {
    lock(handed()).remove(&(kind, ptr as usize))
}

fn is_live<T>(kind: Handed, ptr: *const T) -> bool {
    lock(handed()).contains(&(kind, ptr as usize))
}

/// -1/EINVAL for a pointer that is not a live object of this library.
fn not_live(call: &str, what: &str, ptr: usize) -> c_int {
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
unsafe fn channel_of<'a>(
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
fn ids() -> &'static Mutex<HashMap<u64, RawObj>> {
    static IDS: OnceLock<Mutex<HashMap<u64, RawObj>>> = OnceLock::new();
    IDS.get_or_init(|| Mutex::new(HashMap::new()))
}

fn storage_of(addr: Option<SocketAddr>) -> libc::sockaddr_storage {
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
unsafe fn socket_addr(call: &str, addr: *const libc::sockaddr) -> Result<SocketAddr, c_int> {
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
    unsafe fn checked<'a>(call: &str, id: *mut rdma_cm_id) -> Result<&'a mut IdObj, c_int> {
        if !is_live(Handed::Id, id) {
            return Err(not_live(call, "rdma_cm id", id as usize));
        }
        // Safety: live, so a boxed IdObj whose first field is the C struct.
        Ok(unsafe { &mut *(id as *mut IdObj) })
    }

    fn new(id: CmId, channel: *mut rdma_event_channel, context: *mut c_void) -> *mut IdObj {
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
    fn sync(&mut self) {
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

    fn wait_acks(&self) {
        let mut n = lock(&self.unacked);
        while *n > 0 {
            n = self.acked.wait(n).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Acks the event a synchronous call left in `id->event`, if any.
    fn ack_held_event(&mut self) {
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
    fn complete(&mut self, call: &str, unless_idle: bool) -> c_int {
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
fn new_channel(call: &str) -> Result<*mut rdma_event_channel, c_int> {
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
fn destroy_channel(call: &str, channel: *mut rdma_event_channel) -> bool {
    if !take_back(Handed::Channel, channel) {
        not_live(call, "event channel", channel as usize);
        return false;
    }
    // Safety: handed out by new_channel, boxed there, now taken back.
    drop(unsafe { Box::from_raw(channel as *mut ChannelObj) });
    true
}

/// The device maximum for `RDMA_MAX_*` (0xFF) and a cap for the rest.
fn depth(value: u8, max: u32) -> u8 {
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
unsafe fn conn_param(param: *const rdma_conn_param, id: &IdObj) -> ConnParam {
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

// ---------------------------------------------------------------------------------------
// Events

/// The C event for an xroce event; `None` if it is for an id the program destroyed.
fn c_event(ev: RdmaCmEvent) -> Option<*mut rdma_cm_event> {
    let (id_obj, listen_obj, owner) = if ev.kind == EventKind::ConnectRequest {
        let listener = ev.listen_id.as_ref()?;
        let Some(l) = lock(ids()).get(&listener.key()).copied() else {
            // The listener is gone: refuse the request (IBTA 12.6.7, consumer reject).
            let _ = ev.id.reject(&[]);
            ev.id.destroy();
            return None;
        };
        let l: *mut IdObj = l.ptr();
        // Safety: a live id (in the registry).
        let (channel, context, synchronous) =
            unsafe { ((*l).c.channel, (*l).c.context, (*l).synchronous) };
        // A synchronous listener's connections are synchronous ids too, each on a channel
        // of its own (librdmacm migrates them so).
        let child = if synchronous {
            let Ok(own) = new_channel("rdma_get_request") else {
                let _ = ev.id.reject(&[]);
                ev.id.destroy();
                return None;
            };
            // Safety: just made and handed out.
            ev.id.migrate(unsafe { &(*(own as *const ChannelObj)).ch });
            let child = IdObj::new(ev.id.clone(), own, context);
            // Safety: just made.
            unsafe { (*child).synchronous = true };
            child
        } else {
            IdObj::new(ev.id.clone(), channel, context)
        };
        (child, l, l)
    } else {
        let obj: *mut IdObj = lock(ids()).get(&ev.id.key())?.ptr();
        (obj, std::ptr::null_mut(), obj)
    };
    // Safety: live ids.
    unsafe {
        (*id_obj).sync();
        *lock(&(*owner).unacked) += 1;
    }
    let mut data = Vec::new();
    // Safety: all-zero is a valid param (null pointers, zero numbers).
    let mut param: rdma_cm_event_param = unsafe { std::mem::zeroed() };
    match &ev.param {
        EventParam::None => {}
        EventParam::Conn(p) => {
            data = p.private_data.clone();
            param.conn = rdma_conn_param {
                private_data: std::ptr::null(),
                private_data_len: data.len().min(255) as u8,
                responder_resources: p.responder_resources,
                initiator_depth: p.initiator_depth,
                flow_control: p.flow_control as u8,
                retry_count: p.retry_count,
                rnr_retry_count: p.rnr_retry_count,
                srq: p.srq as u8,
                _pad: 0,
                qp_num: p.qp_num,
            };
        }
        EventParam::Ud(p) => {
            data = p.private_data.clone();
            let mut ah = ibv_ah_attr::from(p.ah_attr);
            ah.port_num = 1;
            param.ud = rdma_ud_param {
                private_data: std::ptr::null(),
                private_data_len: data.len().min(255) as u8,
                _pad: [0; 7],
                ah_attr: ah,
                qp_num: p.qp_num,
                qkey: p.qkey,
            };
        }
    }
    let mut obj = Box::new(EventObj {
        c: rdma_cm_event {
            id: id_obj as *mut rdma_cm_id,
            listen_id: listen_obj as *mut rdma_cm_id,
            event: ev.kind.code(),
            status: ev.status,
            param,
        },
        _data: data,
        owner,
    });
    if !obj._data.is_empty() {
        // Both union members start with private_data (the Vec's heap buffer does not move).
        obj.c.param.conn.private_data = obj._data.as_ptr() as *const c_void;
    }
    Some(hand_out(Handed::Event, Box::into_raw(obj)) as *mut rdma_cm_event)
}

fn nonblocking(fd: c_int) -> bool {
    // Safety: F_GETFL on an fd has no memory arguments.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK != 0
}

// ---------------------------------------------------------------------------------------
// The calls

rdmacm_export! {
    /// `rdma_create_event_channel`: a channel whose fd is readable while events wait
    /// (blocking unless the program sets `O_NONBLOCK` on it).
    pub unsafe extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
        new_channel("rdma_create_event_channel").unwrap_or(std::ptr::null_mut())
    }

    /// `rdma_destroy_event_channel`.
    pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
        destroy_channel("rdma_destroy_event_channel", channel);
    }

    /// `rdma_create_id`.
    pub unsafe extern "C" fn rdma_create_id(
        channel: *mut rdma_event_channel,
        id: *mut *mut rdma_cm_id,
        context: *mut c_void,
        ps: u32,
    ) -> c_int {
        const CALL: &str = "rdma_create_id";
        if id.is_null() {
            return fail_with(CALL, libc::EINVAL, "no place for the id");
        }
        let space = match ps {
            RDMA_PS_TCP => PortSpace::Tcp,
            RDMA_PS_UDP => PortSpace::Udp,
            RDMA_PS_IB => return refuse(CALL, "the RDMA_PS_IB port space (IB addressing)"),
            RDMA_PS_IPOIB => return refuse(CALL, "the RDMA_PS_IPOIB port space"),
            _ => return fail_with(CALL, libc::EINVAL, &format!("port space {ps:#x}")),
        };
        let cm = match cm() {
            Ok(cm) => cm,
            Err(e) => return fail(CALL, &e),
        };
        // A NULL channel makes a synchronous id, with a channel of its own.
        let synchronous = channel.is_null();
        let channel = if synchronous {
            match new_channel(CALL) {
                Ok(ch) => ch,
                Err(rc) => return rc,
            }
        } else {
            channel
        };
        // Safety: the program's channel (or the id's own), not destroyed meanwhile.
        let ch = match unsafe { channel_of(CALL, channel) } {
            Ok(ch) => ch,
            Err(rc) => return rc,
        };
        match cm.create_id(&ch.ch, space) {
            Ok(cm_id) => {
                let obj = IdObj::new(cm_id, channel, context);
                // Safety: just made; id is a valid out-pointer.
                unsafe {
                    (*obj).synchronous = synchronous;
                    *id = obj as *mut rdma_cm_id;
                }
                0
            }
            Err(e) => {
                if synchronous {
                    destroy_channel(CALL, channel);
                }
                fail(CALL, &e)
            }
        }
    }

    /// `rdma_destroy_id`: waits until the id's events are acked; the QP (if the program
    /// did not destroy it) is the program's.
    pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {

        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked("rdma_destroy_id", id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        obj.ack_held_event();
        obj.wait_acks();
        // The kernel's CM keeps resending a DREQ after the process is gone; ours lives in
        // the process, so give the peer's DREP a moment (rping's client disconnects,
        // destroys and exits at once, and a lost DREQ would leave the server waiting).
        // Only for a DREQ we sent: one we received waits for our DREP, which the destroy
        // below sends.
        let until = std::time::Instant::now() + Duration::from_secs(1);
        while obj.id.awaits_drep() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(2));
        }
        let connected = matches!(
            obj.id.state(),
            IdState::Closed | IdState::Disconnecting | IdState::Established
        );
        lock(ids()).remove(&obj.id.key());
        take_back(Handed::Id, id);
        // The connection's last MAD (DREQ, DREP, REJ) is queued here, for the device's
        // background thread; a program that exits right after rdma_destroy_id (perftest's
        // server) would take it along, and the peer would resend its DREQ to nobody
        // (IBTA 12.9.6 wants every DREQ answered). xroce's verbs have no "wait until
        // sent", so give the thread a moment.
        obj.id.destroy();
        if connected {
            std::thread::sleep(Duration::from_millis(50));
        }
        if obj.synchronous {
            destroy_channel("rdma_destroy_id", obj.c.channel);
        }
        // Safety: boxed by IdObj::new; nobody uses it any more (contract).
        drop(unsafe { Box::from_raw(obj as *mut IdObj) });
        0
    }

    /// `rdma_bind_addr`.
    pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
        const CALL: &str = "rdma_bind_addr";
        // Safety: per the contract.
        let addr = match unsafe { socket_addr(CALL, addr) } {
            Ok(a) => a,
            Err(rc) => return rc,
        };
        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked(CALL, id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        // A listener there hears every device (Linux's cma_any_addr: zero or loopback).
        if addr.ip().is_unspecified() || addr.ip().is_loopback() {
            if let Ok(cm) = cm() {
                open_all(cm);
            }
        }
        match obj.id.bind_addr(addr) {
            Ok(()) => {
                obj.sync();
                0
            }
            Err(e) => fail(CALL, &e),
        }
    }

    /// `rdma_resolve_addr`: ADDR_RESOLVED or ADDR_ERROR follows.
    pub unsafe extern "C" fn rdma_resolve_addr(
        id: *mut rdma_cm_id,
        src_addr: *mut libc::sockaddr,
        dst_addr: *mut libc::sockaddr,
        timeout_ms: c_int,
    ) -> c_int {
        const CALL: &str = "rdma_resolve_addr";
        // Safety: per the contract.
        let dst = match unsafe { socket_addr(CALL, dst_addr) } {
            Ok(a) => a,
            Err(rc) => return rc,
        };
        let src = if src_addr.is_null() {
            None
        } else {
            // Safety: per the contract.
            match unsafe { socket_addr(CALL, src_addr) } {
                Ok(a) => Some(a),
                Err(rc) => return rc,
            }
        };
        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked(CALL, id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        let timeout = Duration::from_millis(timeout_ms.max(0) as u64);
        match obj.id.resolve_addr(src, dst, timeout) {
            Ok(()) => obj.complete(CALL, false),
            Err(e) => fail(CALL, &e),
        }
    }

    /// `rdma_resolve_route`: ROUTE_RESOLVED follows (RoCE has no SA: the path is built
    /// from the route and the neighbour table).
    pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int {

        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked("rdma_resolve_route", id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        match obj.id.resolve_route(Duration::from_millis(timeout_ms.max(0) as u64)) {
            Ok(()) => obj.complete("rdma_resolve_route", false),
            Err(e) => fail("rdma_resolve_route", &e),
        }
    }

    /// `rdma_listen`.
    pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {

        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked("rdma_listen", id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        // A loopback listener hears every device, as the wildcard's (Linux's cma_any_addr);
        // its bind opened only the first, which is all a bind without listen needs.
        if obj.id.local_addr().is_some_and(|a| a.ip().is_loopback()) {
            if let Ok(cm) = cm() {
                open_all(cm);
            }
        }
        match obj.id.listen(backlog) {
            Ok(()) => {
                obj.sync();
                0
            }
            Err(e) => fail("rdma_listen", &e),
        }
    }

    /// `rdma_get_cm_event`: the next event of the channel (blocking unless the fd is
    /// `O_NONBLOCK`: then -1/EAGAIN when none waits).
    pub unsafe extern "C" fn rdma_get_cm_event(
        channel: *mut rdma_event_channel,
        event: *mut *mut rdma_cm_event,
    ) -> c_int {
        const CALL: &str = "rdma_get_cm_event";
        if event.is_null() {
            return fail_with(CALL, libc::EINVAL, "no place for the event");
        }
        // Safety: the program's channel, not destroyed meanwhile (contract).
        let ch = match unsafe { channel_of(CALL, channel) } {
            Ok(ch) => ch,
            Err(rc) => return rc,
        };
        loop {
            let ev = if nonblocking(ch.c.fd) {
                match ch.ch.try_get_event() {
                    Some(ev) => ev,
                    None => {
                        set_errno(libc::EAGAIN);
                        return -1;
                    }
                }
            } else {
                match ch.ch.get_event(None) {
                    Ok(ev) => ev,
                    Err(e) => return fail(CALL, &e),
                }
            };
            if let Some(c) = c_event(ev) {
                // Safety: a valid out-pointer.
                unsafe { *event = c };
                return 0;
            }
        }
    }

    /// `rdma_ack_cm_event`: frees the event (and its private data).
    pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
        if !take_back(Handed::Event, event) {
            return not_live("rdma_ack_cm_event", "event (acked already?)", event as usize);
        }
        // Safety: handed out by rdma_get_cm_event, boxed there, now taken back.
        let obj = unsafe { Box::from_raw(event as *mut EventObj) };
        // Safety: the owner waits in rdma_destroy_id for this ack, so it is alive.
        let owner = unsafe { &*obj.owner };
        let mut n = lock(&owner.unacked);
        *n = n.saturating_sub(1);
        owner.acked.notify_all();
        0
    }

    /// `rdma_create_qp`: a QP on the id (of the id's PD when `pd` is NULL, with CQs of the
    /// library's when the attributes name none), in INIT (UD: RTS); the CM moves it on.
    pub unsafe extern "C" fn rdma_create_qp(
        id: *mut rdma_cm_id,
        pd: *mut ibv_pd,
        qp_init_attr: *mut ibv_qp_init_attr,
    ) -> c_int {
        const CALL: &str = "rdma_create_qp";
        if id.is_null() || qp_init_attr.is_null() {
            return fail_with(CALL, libc::EINVAL, "no id or no attributes");
        }
        // Safety: valid (contract).
        let i = unsafe { &mut *qp_init_attr };
        let args = resources::CreateQp {
            pd,
            qp_context: i.qp_context,
            send_cq: i.send_cq,
            recv_cq: i.recv_cq,
            srq: i.srq,
            cap: &mut i.cap,
            qp_type: i.qp_type,
            sq_sig_all: i.sq_sig_all != 0,
        };
        // Safety: per the contract.
        let rc = unsafe { create_qp(CALL, id, args) };
        if rc == 0 {
            // rdma-core writes back the CQs it made.
            // Safety: an id of ours.
            let c = unsafe { &(*id) };
            i.send_cq = c.send_cq;
            i.recv_cq = c.recv_cq;
        }
        rc
    }

    /// `rdma_create_qp_ex`.
    pub unsafe extern "C" fn rdma_create_qp_ex(id: *mut rdma_cm_id, attr: *mut ibv_qp_init_attr_ex) -> c_int {
        const CALL: &str = "rdma_create_qp_ex";
        if id.is_null() || attr.is_null() {
            return fail_with(CALL, libc::EINVAL, "no id or no attributes");
        }
        // Safety: valid (contract).
        let args = match unsafe { resources::create_qp_ex_args(attr) } {
            Ok(a) => a,
            Err(errno) => return fail_with(CALL, errno, "attributes xroce's QPs do not take"),
        };
        // Safety: per the contract.
        unsafe { create_qp(CALL, id, args) }
    }

    /// `rdma_destroy_qp`: the QP, and the CQs the library made for it.
    pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
        // Safety: the program's id, not destroyed meanwhile (contract).
        let Ok(obj) = (unsafe { IdObj::checked("rdma_destroy_qp", id) }) else {
            return;
        };
        obj.id.detach_qp();
        if !obj.c.qp.is_null() {
            // Safety: the id's QP (contract: not destroyed by the program).
            unsafe { crate::capi::resources::ibv_destroy_qp(obj.c.qp) };
            obj.c.qp = std::ptr::null_mut();
        }
        if obj.own_cqs {
            // Safety: the library's own CQs and channels, now without a QP.
            unsafe { destroy_own_cqs(obj) };
        }
    }

    /// `rdma_connect`: REQ (UD: SIDR_REQ); ESTABLISHED follows (CONNECT_RESPONSE when the
    /// id has no QP), or REJECTED / UNREACHABLE / CONNECT_ERROR.
    pub unsafe extern "C" fn rdma_connect(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int {

        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked("rdma_connect", id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        // Safety: per the contract.
        let param = unsafe { conn_param_checked(conn_param, obj) };
        match obj.id.connect(&param) {
            Ok(()) => obj.complete("rdma_connect", false),
            Err(e) => fail("rdma_connect", &e),
        }
    }

    /// `rdma_accept`: REP (UD: SIDR_REP); the QP goes to RTR and RTS.
    pub unsafe extern "C" fn rdma_accept(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int {

        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked("rdma_accept", id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        // Safety: per the contract.
        let param = unsafe { conn_param_checked(conn_param, obj) };
        let rc = match obj.id.accept(&param) {
            Ok(()) => 0,
            Err(e) => fail("rdma_accept", &e),
        };
        obj.sync();
        if rc != 0 {
            return rc;
        }
        // A UD accept (SIDR_REP) has no event to wait for.
        if obj.id.port_space() == PortSpace::Udp {
            obj.ack_held_event();
            return 0;
        }
        let rc = obj.complete("rdma_accept", false);
        obj.sync();
        rc
    }

    /// `rdma_reject`: REJ "consumer defined" (IBTA 12.6.7) with the private data.
    pub unsafe extern "C" fn rdma_reject(id: *mut rdma_cm_id, private_data: *const c_void, len: u8) -> c_int {

        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked("rdma_reject", id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        let data = if private_data.is_null() || len == 0 {
            &[][..]
        } else {
            // Safety: valid for len bytes (contract).
            unsafe { std::slice::from_raw_parts(private_data as *const u8, len as usize) }
        };
        match obj.id.reject(data) {
            Ok(()) => 0,
            Err(e) => fail("rdma_reject", &e),
        }
    }

    /// `rdma_disconnect`: the QP to ERR, then DREQ (or DREP after the peer's DREQ).
    pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {

        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked("rdma_disconnect", id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        let was_over = matches!(obj.id.state(), IdState::Closed | IdState::Idle);
        let rc = match obj.id.disconnect() {
            Ok(()) => 0,
            Err(e) => fail("rdma_disconnect", &e),
        };
        obj.sync();
        if rc != 0 || obj.id.port_space() == PortSpace::Udp {
            return rc;
        }
        // DISCONNECTED follows the DREP (or came with the peer's DREQ).
        obj.complete("rdma_disconnect", was_over)
    }

    /// `rdma_establish` (RDMACM_1.2): the RTU after CONNECT_RESPONSE, for an id without QP.
    pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {

        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked("rdma_establish", id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        match obj.id.establish() {
            Ok(()) => 0,
            Err(e) => fail("rdma_establish", &e),
        }
    }

    /// `rdma_init_qp_attr` (RDMACM_1.2): the attributes that move the program's own QP to
    /// `qp_attr->qp_state` (INIT, RTR or RTS) for this connection.
    pub unsafe extern "C" fn rdma_init_qp_attr(
        id: *mut rdma_cm_id,
        qp_attr: *mut ibv_qp_attr,
        qp_attr_mask: *mut c_int,
    ) -> c_int {
        const CALL: &str = "rdma_init_qp_attr";
        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked(CALL, id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        if qp_attr.is_null() || qp_attr_mask.is_null() {
            return fail_with(CALL, libc::EINVAL, "no attributes or mask");
        }
        // Safety: valid (contract).
        let a = unsafe { &mut *qp_attr };
        let Ok(state) = xroce::verbs::QpState::try_from(a.qp_state) else {
            return fail_with(CALL, libc::EINVAL, &format!("qp_state {}", a.qp_state.0));
        };
        match obj.id.init_qp_attr(state) {
            Ok((attr, mask)) => {
                *a = crate::capi::resources::qp_attr_to_c(
                    &attr,
                    &xroce::verbs::QpCaps {
                        max_send_wr: 0,
                        max_recv_wr: 0,
                        max_send_sge: 0,
                        max_recv_sge: 0,
                        max_inline_data: 0,
                    },
                );
                // Safety: a valid out-pointer.
                unsafe { *qp_attr_mask = mask.bits() as c_int };
                0
            }
            Err(e) => fail(CALL, &e),
        }
    }

    /// `rdma_set_option`: TOS, ACK timeout, REUSEADDR, AFONLY; IB paths are refused.
    pub unsafe extern "C" fn rdma_set_option(
        id: *mut rdma_cm_id,
        level: c_int,
        optname: c_int,
        optval: *mut c_void,
        optlen: usize,
    ) -> c_int {
        const CALL: &str = "rdma_set_option";
        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked(CALL, id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        if optval.is_null() {
            return fail_with(CALL, libc::EINVAL, "no value");
        }
        let int_opt = || {
            (optlen == std::mem::size_of::<c_int>())
                // Safety: optval holds an int (length checked).
                .then(|| unsafe { *(optval as *const c_int) })
        };
        let u8_opt = || {
            (optlen == 1)
                // Safety: optval holds a byte.
                .then(|| unsafe { *(optval as *const u8) })
        };
        match (level, optname) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) => match u8_opt() {
                Some(tos) => {
                    obj.id.set_tos(tos);
                    0
                }
                None => fail_with(CALL, libc::EINVAL, "RDMA_OPTION_ID_TOS takes a uint8_t"),
            },
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => match u8_opt() {
                Some(t) => match obj.id.set_ack_timeout(t) {
                    Ok(()) => 0,
                    Err(e) => fail(CALL, &e),
                },
                None => fail_with(CALL, libc::EINVAL, "RDMA_OPTION_ID_ACK_TIMEOUT takes a uint8_t"),
            },
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR) => match int_opt() {
                Some(v) => {
                    obj.id.set_reuse_addr(v != 0);
                    0
                }
                None => fail_with(CALL, libc::EINVAL, "RDMA_OPTION_ID_REUSEADDR takes an int"),
            },
            // IPv6 ids bound to the unspecified address: xroce binds each family by itself
            // already, so AFONLY changes nothing.
            (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) => match int_opt() {
                Some(_) => 0,
                None => fail_with(CALL, libc::EINVAL, "RDMA_OPTION_ID_AFONLY takes an int"),
            },
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => {
                refuse(CALL, "RDMA_OPTION_IB_PATH (IB SA path records have no meaning on RoCE)")
            }
            _ => fail_with(CALL, libc::ENOSYS, &format!("level {level} option {optname}")),
        }
    }

    /// `rdma_migrate_id`: the id and its queued events to another channel, once the events
    /// it handed out are acked. As rdma-core's cma.c: a synchronous id's held event is acked
    /// here (only the library can) and its own channel freed, so it becomes asynchronous;
    /// a NULL channel makes the id synchronous on a new channel of its own (EINVAL for an id
    /// that is synchronous already).
    pub unsafe extern "C" fn rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int {
        const CALL: &str = "rdma_migrate_id";
        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked(CALL, id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        let to_synchronous = channel.is_null();
        if to_synchronous && obj.synchronous {
            return fail_with(CALL, libc::EINVAL, "the id is synchronous already (NULL channel)");
        }
        let target = if to_synchronous {
            match new_channel(CALL) {
                Ok(own) => own,
                Err(rc) => return rc,
            }
        } else {
            channel
        };
        // Safety: the program's channel (or the new one), not destroyed meanwhile.
        let ch = match unsafe { channel_of(CALL, target) } {
            Ok(ch) => ch,
            Err(rc) => return rc,
        };
        let (old_channel, was_synchronous) = (obj.c.channel, obj.synchronous);
        if was_synchronous {
            obj.ack_held_event();
        }
        obj.id.migrate(&ch.ch);
        obj.c.channel = target;
        obj.synchronous = to_synchronous;
        if was_synchronous && old_channel != target {
            destroy_channel(CALL, old_channel);
        }
        obj.wait_acks();
        0
    }

    /// `rdma_create_ep`: a synchronous id for `res` (`rdma_getaddrinfo`'s answer). Passive
    /// (`RAI_PASSIVE`): bound to `ai_src_addr`, `pd` and the QP attributes kept for the
    /// connections `rdma_get_request` returns. Active: the address and route resolved
    /// (2000 ms each, as librdmacm) and, given attributes, the QP made on the id.
    pub unsafe extern "C" fn rdma_create_ep(
        id: *mut *mut rdma_cm_id,
        res: *mut rdma_addrinfo,
        pd: *mut ibv_pd,
        qp_init_attr: *mut ibv_qp_init_attr,
    ) -> c_int {
        const CALL: &str = "rdma_create_ep";
        if id.is_null() || res.is_null() {
            return fail_with(CALL, libc::EINVAL, "no place for the id or no address info");
        }
        // Safety: valid (contract).
        let r = unsafe { &*res };
        let mut ep: *mut rdma_cm_id = std::ptr::null_mut();
        // Safety: a NULL channel makes a synchronous id.
        let rc = unsafe {
            rdma_create_id(std::ptr::null_mut(), &mut ep, std::ptr::null_mut(), r.ai_port_space as u32)
        };
        if rc != 0 {
            return rc;
        }
        // Safety: just made; the addresses and attributes are the program's (contract).
        let rc = unsafe {
            if r.ai_flags & RAI_PASSIVE != 0 {
                passive_ep(ep, r, pd, qp_init_attr)
            } else {
                active_ep(ep, r, pd, qp_init_attr)
            }
        };
        if rc != 0 {
            let errno = crate::capi::errno();
            // Safety: ours, not handed to the program.
            unsafe { rdma_destroy_ep(ep) };
            set_errno(errno);
            return rc;
        }
        // Safety: a valid out-pointer.
        unsafe { *id = ep };
        0
    }

    /// `rdma_destroy_ep`: the id's QP (if any), then the id.
    pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
        if !is_live(Handed::Id, id) {
            not_live("rdma_destroy_ep", "rdma_cm id", id as usize);
            return;
        }
        // Safety: a live id of ours.
        unsafe {
            if !(*id).qp.is_null() {
                rdma_destroy_qp(id);
            }
            rdma_destroy_id(id);
        }
    }

    /// `rdma_get_request`: on a synchronous listener, waits for the next CONNECT_REQUEST
    /// and returns its new (synchronous) id, with a QP of the listener's `rdma_create_ep`
    /// attributes when it had some; the event stays in `(*id)->event` until `rdma_accept`.
    pub unsafe extern "C" fn rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int {
        const CALL: &str = "rdma_get_request";
        // Safety: the program's id, not destroyed meanwhile (contract).
        let l = match unsafe { IdObj::checked(CALL, listen) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        if !l.synchronous {
            return fail_with(
                CALL,
                libc::EINVAL,
                "the listener has an event channel: take CONNECT_REQUEST from rdma_get_cm_event",
            );
        }
        if id.is_null() {
            return fail_with(CALL, libc::EINVAL, "no place for the id");
        }
        l.ack_held_event();
        // Safety: a synchronous id's channel is its own.
        let ch = unsafe { &*(l.c.channel as *const ChannelObj) };
        let event = loop {
            match ch.ch.get_event(None) {
                Ok(ev) => {
                    if let Some(c) = c_event(ev) {
                        break c;
                    }
                }
                Err(e) => return fail(CALL, &e),
            }
        };
        // Safety: just made.
        let e = unsafe { &*event };
        if e.event != EventKind::ConnectRequest.code() || e.status != 0 {
            l.c.event = event;
            let name = EVENT_NAMES.get(e.event as usize).copied().unwrap_or("an event");
            let errno = if e.status != 0 { e.status.saturating_abs() } else { libc::EINVAL };
            return fail_with(CALL, errno, &format!("{name} (status {}) on the listener", e.status));
        }
        let child = e.id;
        if let Some(saved) = l.ep_qp_init.as_ref() {
            // Safety: plain data (pointers and numbers), copied as librdmacm does.
            let mut attr = unsafe { std::ptr::read(saved) };
            // Safety: the new id is ours; the attributes a copy.
            let rc = unsafe { rdma_create_qp(child, l.c.pd, &mut attr) };
            if rc != 0 {
                let errno = crate::capi::errno();
                // Safety: the request refused and its id freed: the program never saw it.
                unsafe {
                    rdma_reject(child, std::ptr::null(), 0);
                    rdma_ack_cm_event(event);
                    rdma_destroy_id(child);
                }
                set_errno(errno);
                return rc;
            }
        }
        // Safety: the new id is live; the out-pointer valid.
        unsafe {
            (*child).event = event;
            *id = child;
        }
        0
    }

    /// `rdma_get_src_port`: the local port, network order.
    pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
        // Safety: the program's id, not destroyed meanwhile (contract).
        let Ok(obj) = (unsafe { IdObj::checked("rdma_get_src_port", id) }) else {
            return 0;
        };
        obj.id.local_addr().map_or(0, |a| a.port().to_be())
    }

    /// `rdma_get_dst_port`: the remote port, network order.
    pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
        // Safety: the program's id, not destroyed meanwhile (contract).
        let Ok(obj) = (unsafe { IdObj::checked("rdma_get_dst_port", id) }) else {
            return 0;
        };
        obj.id.remote_addr().map_or(0, |a| a.port().to_be())
    }

    /// `rdma_get_devices`: every device's shared context, NULL-terminated.
    pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
        let mut list: Vec<*mut ibv_context> = Vec::new();
        for name in crate::capi::device_list::interfaces() {
            match shared_device(&name) {
                Ok((ctx, _)) => list.push(ctx),
                Err(e) => {
                    fail("rdma_get_devices", &e);
                }
            }
        }
        if !num_devices.is_null() {
            // Safety: a valid out-pointer.
            unsafe { *num_devices = list.len() as c_int };
        }
        list.push(std::ptr::null_mut());
        Box::into_raw(list.into_boxed_slice()) as *mut *mut ibv_context
    }

    /// `rdma_free_devices`: the array only (the contexts stay, shared).
    pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
        if list.is_null() {
            return;
        }
        let mut len = 0;
        // Safety: NULL-terminated (made by rdma_get_devices).
        while !unsafe { *list.add(len) }.is_null() {
            len += 1;
        }
        // Safety: a boxed slice of len + 1.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, len + 1)) });
    }

    /// `rdma_getaddrinfo`: libc's getaddrinfo, in rdma_cm's terms (TCP: RC, UDP: UD).
    pub unsafe extern "C" fn rdma_getaddrinfo(
        node: *const c_char,
        service: *const c_char,
        hints: *const rdma_addrinfo,
        res: *mut *mut rdma_addrinfo,
    ) -> c_int {
        // Safety: per the contract.
        unsafe { getaddrinfo(node, service, hints, res) }
    }

    /// `rdma_freeaddrinfo`.
    pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
        let mut next = res;
        while !next.is_null() {
            // Safety: entries made by rdma_getaddrinfo with malloc.
            unsafe {
                let ai = &*next;
                let after = ai.ai_next;
                libc::free(ai.ai_src_addr as *mut c_void);
                libc::free(ai.ai_dst_addr as *mut c_void);
                libc::free(ai.ai_src_canonname as *mut c_void);
                libc::free(ai.ai_dst_canonname as *mut c_void);
                libc::free(next as *mut c_void);
                next = after;
            }
        }
    }
}

/// A `conn_param` for connect/accept.
///
/// # Safety
/// As [`conn_param`].
unsafe fn conn_param_checked(p: *const rdma_conn_param, obj: &IdObj) -> ConnParam {
    // Safety: forwarded.
    unsafe { conn_param(p, obj) }
}

/// The QP of `rdma_create_qp(_ex)`.
///
/// # Safety
/// `id` is ours; the pointers in `args` are null or objects of this library.
unsafe fn create_qp(call: &str, id: *mut rdma_cm_id, mut args: resources::CreateQp) -> c_int {
    // Safety: the program's id, not destroyed meanwhile (contract).
    let obj = match unsafe { IdObj::checked(call, id) } {
        Ok(obj) => obj,
        Err(rc) => return rc,
    };
    if !obj.c.qp.is_null() {
        return fail(call, &RdmaCmError::QpExists);
    }
    if obj.c.verbs.is_null() {
        return fail_with(
            call,
            libc::EINVAL,
            "the id has no device yet (resolve its address or take it from a connect request)",
        );
    }
    if args.pd.is_null() {
        args.pd = obj.c.pd;
    }
    // Safety: a PD of ours.
    if unsafe { (*args.pd).context } != obj.c.verbs {
        return fail_with(
            call,
            libc::EINVAL,
            "the PD is not on the id's device (id->verbs)",
        );
    }
    if args.send_cq.is_null() || args.recv_cq.is_null() {
        // Safety: args.cap is valid (contract).
        let cap = unsafe { &*args.cap };
        // Safety: the id's context is open.
        if let Err(rc) = unsafe { make_own_cqs(call, obj, cap.max_send_wr, cap.max_recv_wr) } {
            return rc;
        }
        if args.send_cq.is_null() {
            args.send_cq = obj.c.send_cq;
        }
        if args.recv_cq.is_null() {
            args.recv_cq = obj.c.recv_cq;
        }
    } else {
        obj.c.send_cq = args.send_cq;
        obj.c.recv_cq = args.recv_cq;
    }
    if args.qp_context.is_null() {
        args.qp_context = id as *mut c_void;
    }
    let srq: *mut ibv_srq = args.srq;
    // Safety: per the contract.
    let qp = unsafe { resources::create_qp_obj(args, call) };
    if qp.is_null() {
        return -1;
    }
    let qp_obj = qp as *mut QpObj;
    // Safety: just made.
    let handle = unsafe { (*qp_obj).qp.clone() };
    if let Err(e) = obj.id.attach_qp(handle) {
        // Safety: ours, unused.
        unsafe { resources::ibv_destroy_qp(qp) };
        return fail(call, &e);
    }
    obj.c.qp = qp;
    obj.c.srq = srq;
    obj.sync();
    0
}

/// CQs (each with its completion channel, `cq_context` the id) for a QP whose attributes
/// name none, as librdmacm makes them (rdma_server/rdma_client rely on them).
///
/// # Safety
/// The id's context is open.
unsafe fn make_own_cqs(call: &str, obj: &mut IdObj, send: u32, recv: u32) -> Result<(), c_int> {
    let ctx = obj.c.verbs;
    let id_ptr = obj as *mut IdObj as *mut c_void;
    let make = |depth: u32| -> Result<(*mut ibv_comp_channel, *mut ibv_cq), c_int> {
        // Safety: an open context.
        let ch = unsafe { resources::ibv_create_comp_channel(ctx) };
        if ch.is_null() {
            return Err(fail_with(call, libc::ENOMEM, "a completion channel"));
        }
        // Safety: as above.
        let cq =
            unsafe { resources::create_cq_obj(ctx, depth.max(1) as c_int, id_ptr, ch, 0, call) };
        if cq.is_null() {
            // Safety: ours, unused.
            unsafe { resources::ibv_destroy_comp_channel(ch) };
            return Err(-1);
        }
        Ok((ch, cq as *mut ibv_cq))
    };
    let (sch, scq) = make(send)?;
    let (rch, rcq) = match make(recv) {
        Ok(x) => x,
        Err(rc) => {
            // Safety: ours, unused.
            unsafe {
                resources::ibv_destroy_cq(scq);
                resources::ibv_destroy_comp_channel(sch);
            }
            return Err(rc);
        }
    };
    obj.c.send_cq_channel = sch;
    obj.c.send_cq = scq;
    obj.c.recv_cq_channel = rch;
    obj.c.recv_cq = rcq;
    obj.own_cqs = true;
    Ok(())
}

/// # Safety
/// The id's own CQs and channels exist and no QP uses them.
unsafe fn destroy_own_cqs(obj: &mut IdObj) {
    // Safety: per the contract.
    unsafe {
        resources::ibv_destroy_cq(obj.c.send_cq);
        resources::ibv_destroy_cq(obj.c.recv_cq);
        resources::ibv_destroy_comp_channel(obj.c.send_cq_channel);
        resources::ibv_destroy_comp_channel(obj.c.recv_cq_channel);
    }
    obj.c.send_cq = std::ptr::null_mut();
    obj.c.recv_cq = std::ptr::null_mut();
    obj.c.send_cq_channel = std::ptr::null_mut();
    obj.c.recv_cq_channel = std::ptr::null_mut();
    obj.own_cqs = false;
}

/// `rdma_create_ep` with `RAI_PASSIVE`.
///
/// # Safety
/// `ep` is a new id of ours; `r`'s address and `qp_init_attr` valid or null.
unsafe fn passive_ep(
    ep: *mut rdma_cm_id,
    r: &rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    // Safety: per the contract.
    let rc = unsafe { rdma_bind_addr(ep, r.ai_src_addr) };
    if rc != 0 {
        return rc;
    }
    // Safety: a live id of ours.
    let obj = unsafe { &mut *(ep as *mut IdObj) };
    if !pd.is_null() {
        obj.c.pd = pd;
    }
    if !qp_init_attr.is_null() {
        // Safety: valid (contract); plain data, copied.
        let mut attr = unsafe { std::ptr::read(qp_init_attr) };
        attr.qp_type = r.ai_qp_type as u32;
        obj.ep_qp_init = Some(attr);
    }
    0
}

/// `rdma_create_ep` without `RAI_PASSIVE`.
///
/// # Safety
/// As [`passive_ep`].
unsafe fn active_ep(
    ep: *mut rdma_cm_id,
    r: &rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    // Safety: per the contract; the id is synchronous, so each call waits for its event.
    unsafe {
        let rc = rdma_resolve_addr(ep, r.ai_src_addr, r.ai_dst_addr, 2000);
        if rc != 0 {
            return rc;
        }
        let rc = rdma_resolve_route(ep, 2000);
        if rc != 0 || qp_init_attr.is_null() {
            return rc;
        }
        (*qp_init_attr).qp_type = r.ai_qp_type as u32;
        rdma_create_qp(ep, pd, qp_init_attr)
    }
}

/// A malloc'ed copy of `bytes`.
fn malloc_copy(bytes: &[u8]) -> *mut c_void {
    // Safety: malloc of a nonzero size; copy within both buffers.
    unsafe {
        let p = libc::malloc(bytes.len().max(1));
        if !p.is_null() {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), p as *mut u8, bytes.len());
        }
        p
    }
}

fn sockaddr_bytes(addr: SocketAddr) -> (Vec<u8>, libc::socklen_t) {
    let s = storage_of(Some(addr));
    let len = match addr {
        SocketAddr::V4(_) => std::mem::size_of::<libc::sockaddr_in>(),
        SocketAddr::V6(_) => std::mem::size_of::<libc::sockaddr_in6>(),
    };
    // Safety: s is at least len bytes.
    let bytes = unsafe { std::slice::from_raw_parts(&s as *const _ as *const u8, len) }.to_vec();
    (bytes, len as libc::socklen_t)
}

/// `rdma_getaddrinfo`'s body: one entry per address libc finds.
///
/// # Safety
/// The strings are null or NUL-terminated; `hints` null or valid; `res` valid.
unsafe fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    const CALL: &str = "rdma_getaddrinfo";
    if res.is_null() {
        return fail_with(CALL, libc::EINVAL, "no place for the answer");
    }
    // Safety: per the contract.
    let h = (!hints.is_null()).then(|| unsafe { &*hints });
    if node.is_null() && service.is_null() {
        return match h {
            // Safety: per the contract.
            Some(h) => unsafe { answer_from_hints(h, res) },
            None => fail_with(CALL, libc::EINVAL, "no node, no service and no hints"),
        };
    }
    let flags = h.map_or(0, |h| h.ai_flags);
    let ps = match h.map_or(0, |h| h.ai_port_space) {
        0 => match h.map_or(0, |h| h.ai_qp_type) as u32 {
            resources::IBV_QPT_UD => RDMA_PS_UDP,
            _ => RDMA_PS_TCP,
        },
        p => p as u32,
    };
    if ps != RDMA_PS_TCP && ps != RDMA_PS_UDP {
        return refuse(CALL, "port spaces other than RDMA_PS_TCP and RDMA_PS_UDP");
    }
    let family = h.map_or(0, |h| h.ai_family);
    if family == AF_IB {
        return refuse(CALL, "AF_IB addresses");
    }
    // Safety: all-zero addrinfo hints are valid.
    let mut lh: libc::addrinfo = unsafe { std::mem::zeroed() };
    lh.ai_family = if family == 0 { libc::AF_UNSPEC } else { family };
    lh.ai_socktype = if ps == RDMA_PS_UDP {
        libc::SOCK_DGRAM
    } else {
        libc::SOCK_STREAM
    };
    if flags & RAI_PASSIVE != 0 {
        lh.ai_flags |= libc::AI_PASSIVE;
    }
    if flags & RAI_NUMERICHOST != 0 {
        lh.ai_flags |= libc::AI_NUMERICHOST;
    }
    let mut found: *mut libc::addrinfo = std::ptr::null_mut();
    // Safety: per the contract; found is freed below.
    let rc = unsafe { libc::getaddrinfo(node, service, &lh, &mut found) };
    if rc != 0 {
        // Safety: gai_strerror returns a static string.
        let why = unsafe { CStr::from_ptr(libc::gai_strerror(rc)) }
            .to_string_lossy()
            .into_owned();
        let errno = match rc {
            libc::EAI_NONAME => libc::ENODEV,
            libc::EAI_MEMORY => libc::ENOMEM,
            _ => libc::EADDRNOTAVAIL,
        };
        // rdma-core returns getaddrinfo's own code; programs print it with gai_strerror.
        fail_with(CALL, errno, &why);
        return rc;
    }
    let mut first: *mut rdma_addrinfo = std::ptr::null_mut();
    let mut last: *mut rdma_addrinfo = std::ptr::null_mut();
    let mut cur = found;
    while !cur.is_null() {
        // Safety: a list libc made.
        let ai = unsafe { &*cur };
        cur = ai.ai_next;
        // Safety: libc's addresses are valid for their family.
        let Ok(addr) = (unsafe { socket_addr_quiet(ai.ai_addr) }) else {
            continue;
        };
        let (bytes, len) = sockaddr_bytes(addr);
        // Safety: calloc'ed, zeroed: a valid rdma_addrinfo.
        let entry =
            unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) } as *mut rdma_addrinfo;
        if entry.is_null() {
            break;
        }
        // Safety: just allocated.
        let e = unsafe { &mut *entry };
        e.ai_flags = flags;
        e.ai_family = ai.ai_family;
        e.ai_qp_type = if ps == RDMA_PS_UDP {
            resources::IBV_QPT_UD as c_int
        } else {
            resources::IBV_QPT_RC as c_int
        };
        e.ai_port_space = ps as c_int;
        if flags & RAI_PASSIVE != 0 {
            e.ai_src_addr = malloc_copy(&bytes) as *mut libc::sockaddr;
            e.ai_src_len = len;
        } else {
            e.ai_dst_addr = malloc_copy(&bytes) as *mut libc::sockaddr;
            e.ai_dst_len = len;
            if let Some(h) = h.filter(|h| !h.ai_src_addr.is_null() && h.ai_src_len > 0) {
                let n = h.ai_src_len as usize;
                // Safety: the hint's source is valid for its length.
                let src = unsafe { std::slice::from_raw_parts(h.ai_src_addr as *const u8, n) };
                e.ai_src_addr = malloc_copy(src) as *mut libc::sockaddr;
                e.ai_src_len = h.ai_src_len;
            }
        }
        if last.is_null() {
            first = entry;
        } else {
            // Safety: the previous entry.
            unsafe { (*last).ai_next = entry };
        }
        last = entry;
    }
    // Safety: libc's list.
    unsafe { libc::freeaddrinfo(found) };
    if first.is_null() {
        return fail_with(CALL, libc::EADDRNOTAVAIL, "no IPv4 or IPv6 address");
    }
    // Safety: a valid out-pointer.
    unsafe { *res = first };
    0
}

/// `rdma_getaddrinfo` without node and service (libfabric's verbs provider asks so): one
/// entry made of the hints alone, as rdma-core's addrinfo.c does: their flags, family, QP
/// type and port space as given, and copies of their destination and source addresses.
///
/// # Safety
/// The hints' addresses are null or valid for their lengths; `res` is valid.
unsafe fn answer_from_hints(h: &rdma_addrinfo, res: *mut *mut rdma_addrinfo) -> c_int {
    const CALL: &str = "rdma_getaddrinfo";
    // A length without an address would be a read of nothing (rdma-core would crash on it).
    let given = |addr: *mut libc::sockaddr, len: libc::socklen_t| -> Result<Option<&[u8]>, ()> {
        match (addr.is_null(), len) {
            (_, 0) => Ok(None),
            (true, _) => Err(()),
            // Safety: valid for its length (contract).
            (false, n) => Ok(Some(unsafe {
                std::slice::from_raw_parts(addr as *const u8, n as usize)
            })),
        }
    };
    let (Ok(dst), Ok(src)) = (
        given(h.ai_dst_addr, h.ai_dst_len),
        given(h.ai_src_addr, h.ai_src_len),
    ) else {
        return fail_with(
            CALL,
            libc::EINVAL,
            "a hint address length without an address",
        );
    };
    let copy = |bytes: Option<&[u8]>| {
        bytes.map_or((std::ptr::null_mut(), 0), |b| {
            (malloc_copy(b), b.len() as libc::socklen_t)
        })
    };
    let ((dst_addr, dst_len), (src_addr, src_len)) = (copy(dst), copy(src));
    // Safety: calloc'ed, zeroed: a valid rdma_addrinfo.
    let entry =
        unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) } as *mut rdma_addrinfo;
    if entry.is_null()
        || (dst.is_some() && dst_addr.is_null())
        || (src.is_some() && src_addr.is_null())
    {
        // Safety: malloc'ed above, or null.
        unsafe {
            libc::free(dst_addr);
            libc::free(src_addr);
            libc::free(entry as *mut c_void);
        }
        return fail_with(CALL, libc::ENOMEM, "no memory for the answer");
    }
    // Safety: just allocated.
    let e = unsafe { &mut *entry };
    e.ai_flags = h.ai_flags;
    e.ai_family = h.ai_family;
    e.ai_qp_type = h.ai_qp_type;
    e.ai_port_space = h.ai_port_space;
    e.ai_dst_addr = dst_addr as *mut libc::sockaddr;
    e.ai_dst_len = dst_len;
    e.ai_src_addr = src_addr as *mut libc::sockaddr;
    e.ai_src_len = src_len;
    // Safety: a valid out-pointer.
    unsafe { *res = entry };
    0
}

/// [`socket_addr`] without the message.
///
/// # Safety
/// As for [`socket_addr`].
unsafe fn socket_addr_quiet(addr: *const libc::sockaddr) -> Result<SocketAddr, ()> {
    if addr.is_null() {
        return Err(());
    }
    // Safety: per the contract.
    match unsafe { (*addr).sa_family } as c_int {
        libc::AF_INET | libc::AF_INET6 => {
            // Safety: per the contract; these families never fail.
            unsafe { socket_addr("rdma_getaddrinfo", addr) }.map_err(|_| ())
        }
        _ => Err(()),
    }
}
