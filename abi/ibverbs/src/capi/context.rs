//! `ibv_open_device` / `ibv_close_device` and the queries of a context: device, port, GIDs,
//! P_Keys.
//!
//! A context opens its xroce [`Device`] (the AF_XDP socket and the engine) on the first call
//! that needs it, not in `ibv_open_device`: programs such as `ibv_devinfo` open a device only
//! to query it, and a query needs nothing but the interface. With the UDP driver the device
//! is opened at once (its GID table depends on the socket's address).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Mutex, OnceLock};

use xroce::engine::{CqId, SrqId};
use xroce::netdev::{self, GidEntry, NetdevInfo};
use xroce::verbs::{Device, DeviceAttr, DriverKind, PortAttr, VerbsError};

use super::config::LibraryConfig;
use super::device_list::{device_name, ifname_of};
use super::{fail_ptr, lock, set_errno, RawObj, ABI_IS_EXTENDED};
use crate::objects::{
    ibv_context, ibv_context_ops, ibv_device, ibv_device_attr_ex, ibv_query_device_ex_input,
    verbs_context,
};
use crate::structs::{ibv_device_attr, ibv_gid, ibv_gid_entry, ibv_port_attr};
use crate::translate::gid_entry;

/// The C objects a context has handed out that events name, by xroce id.
#[derive(Default)]
pub(crate) struct Registry {
    pub cqs: HashMap<CqId, RawObj>,
    pub qps: HashMap<u32, RawObj>,
    pub srqs: HashMap<SrqId, RawObj>,
}

/// An open context: the `verbs_context` first (so `ibv_context*` minus its offset is this).
#[repr(C)]
pub(crate) struct Context {
    pub vctx: verbs_context,
    pub ifname: String,
    pub name: String,
    /// The interface as it was at open time (queries before the device exists).
    pub net: NetdevInfo,
    device: OnceLock<Device>,
    /// Why opening the device failed, so every later call says the same.
    open_error: Mutex<Option<String>>,
    pub registry: Mutex<Registry>,
    /// `cmd_fd`: /dev/null.
    _cmd_fd: OwnedFd,
    /// `async_fd`: an epoll set that holds the device's event fd once the device opens.
    async_fd: OwnedFd,
}

// Safety: the raw pointers in the C structs are plain addresses the library hands out and
// the program shares between its threads as it likes; all mutable state behind them is in
// Mutex/OnceLock or the thread-safe verbs handles.
unsafe impl Send for Context {}
// Safety: see Send.
unsafe impl Sync for Context {}

impl Context {
    /// The context of a C `ibv_context*`.
    ///
    /// # Safety
    /// `ctx` must be a context this library opened and not yet closed.
    pub(crate) unsafe fn from_c<'a>(ctx: *mut ibv_context) -> &'a Context {
        let offset = std::mem::offset_of!(verbs_context, context);
        // Safety: per the contract, ctx is the `context` member of a Context's vctx, which
        // is the Context's first field.
        unsafe { &*((ctx as *mut u8).sub(offset) as *const Context) }
    }

    /// The C pointer of this context.
    pub(crate) fn c_ptr(&self) -> *mut ibv_context {
        &self.vctx.context as *const ibv_context as *mut ibv_context
    }

    /// The xroce device, opened on first use.
    pub(crate) fn device(&self) -> Result<&Device, VerbsError> {
        if let Some(d) = self.device.get() {
            return Ok(d);
        }
        let mut error = lock(&self.open_error);
        if let Some(d) = self.device.get() {
            return Ok(d);
        }
        if let Some(e) = &*error {
            return Err(VerbsError::InvalidArgument(e.clone()));
        }
        match shared_device(&self.ifname) {
            Ok(device) => {
                if let Err(e) = watch_device_events(&self.async_fd, device.async_fd().as_raw_fd()) {
                    eprintln!("xroce: {}: cannot watch the async event fd: {e}", self.name);
                }
                let _ = self.device.set(device);
                Ok(self.device.get().expect("just set"))
            }
            Err(e) => {
                let text = format!("opening {} on {}: {e}", self.name, self.ifname);
                *error = Some(text);
                Err(e)
            }
        }
    }

    /// The device if it is open already.
    pub(crate) fn opened(&self) -> Option<&Device> {
        self.device.get()
    }

    pub(crate) fn device_attr(&self) -> DeviceAttr {
        match self.opened() {
            Some(d) => d.query_device(),
            None => DeviceAttr::for_netdev(&self.net),
        }
    }

    pub(crate) fn port_attr(&self, port: u8) -> Result<PortAttr, VerbsError> {
        if port != 1 {
            return Err(VerbsError::NoSuchPort(port));
        }
        match self.opened() {
            Some(d) => d.query_port(port),
            None => {
                let net = netdev::query(&self.ifname).unwrap_or_else(|_| self.net.clone());
                Ok(PortAttr::for_netdev(&net))
            }
        }
    }

    pub(crate) fn gid_table(&self) -> Vec<GidEntry> {
        match self.opened() {
            Some(d) => d.gid_table().to_vec(),
            None => self.net.gid_table(),
        }
    }
}

/// The process's devices, by interface, with the number of open contexts on each. Contexts
/// of one process on one interface share one xroce device (one AF_XDP socket and engine):
/// a program may open a device several times (rdma-core's test suite opens a server and a
/// client context side by side), and one interface takes one AF_XDP owner.
fn devices() -> &'static Mutex<HashMap<String, (Device, usize)>> {
    static DEVICES: OnceLock<Mutex<HashMap<String, (Device, usize)>>> = OnceLock::new();
    DEVICES.get_or_init(|| Mutex::new(HashMap::new()))
}

fn shared_device(ifname: &str) -> Result<Device, VerbsError> {
    let mut all = lock(devices());
    if let Some((device, contexts)) = all.get_mut(ifname) {
        *contexts += 1;
        return Ok(device.clone());
    }
    let device = Device::open(ifname, LibraryConfig::get().device.clone())?;
    all.insert(ifname.to_string(), (device.clone(), 1));
    Ok(device)
}

/// A context with an open device closes: the last one lets the device go (once the
/// program's objects on it are gone too).
fn release_device(ifname: &str) {
    let mut all = lock(devices());
    if let Some((_, contexts)) = all.get_mut(ifname) {
        *contexts -= 1;
        if *contexts == 0 {
            all.remove(ifname);
        }
    }
}

fn dev_null() -> std::io::Result<OwnedFd> {
    Ok(OwnedFd::from(std::fs::File::open("/dev/null")?))
}

/// The context's `async_fd`: an epoll set, empty until the device opens and then holding
/// the device's event fd, so it is readable exactly when an asynchronous event waits. The fd
/// number and its file never change: a program (UCX) registers it with its own epoll at
/// open, before the device exists, and that registration must keep working and be removable.
fn async_event_set() -> std::io::Result<OwnedFd> {
    // Safety: epoll_create1 has no pointer arguments; a non-negative result is a new fd.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Safety: fd was just returned by epoll_create1 and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Puts the device's event fd into the context's epoll set.
fn watch_device_events(set: &OwnedFd, device_fd: c_int) -> std::io::Result<()> {
    let mut interest = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: 0,
    };
    // Safety: both fds are open; `interest` is a valid epoll_event for the call's duration.
    let rc = unsafe {
        libc::epoll_ctl(
            set.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            device_fd,
            &mut interest,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn ops_table() -> ibv_context_ops {
    use super::datapath as dp;
    use super::resources as res;
    ibv_context_ops {
        _compat_query_device: None,
        _compat_query_port: None,
        _compat_alloc_pd: None,
        _compat_dealloc_pd: None,
        _compat_reg_mr: None,
        _compat_rereg_mr: None,
        _compat_dereg_mr: None,
        alloc_mw: Some(res::alloc_mw),
        bind_mw: Some(dp::bind_mw),
        dealloc_mw: Some(res::dealloc_mw),
        _compat_create_cq: None,
        poll_cq: Some(dp::poll_cq),
        req_notify_cq: Some(dp::req_notify_cq),
        _compat_cq_event: None,
        _compat_resize_cq: None,
        _compat_destroy_cq: None,
        _compat_create_srq: None,
        _compat_modify_srq: None,
        _compat_query_srq: None,
        _compat_destroy_srq: None,
        post_srq_recv: Some(dp::post_srq_recv),
        _compat_create_qp: None,
        _compat_query_qp: None,
        _compat_modify_qp: None,
        _compat_destroy_qp: None,
        post_send: Some(dp::post_send),
        post_recv: Some(dp::post_recv),
        _compat_create_ah: None,
        _compat_destroy_ah: None,
        _compat_attach_mcast: None,
        _compat_detach_mcast: None,
        _compat_async_event: None,
    }
}

fn verbs_context_for(device: *mut ibv_device, cmd_fd: c_int, async_fd: c_int) -> verbs_context {
    use super::exts;
    verbs_context {
        query_port: Some(exts::query_port_ex),
        advise_mr: Some(exts::advise_mr),
        alloc_null_mr: None,
        read_counters: None,
        attach_counters_point_flow: None,
        create_counters: None,
        destroy_counters: None,
        reg_dm_mr: None,
        alloc_dm: None,
        free_dm: None,
        modify_flow_action_esp: None,
        destroy_flow_action: None,
        create_flow_action_esp: None,
        modify_qp_rate_limit: None,
        alloc_parent_domain: None,
        dealloc_td: None,
        alloc_td: None,
        modify_cq: None,
        post_srq_ops: None,
        destroy_rwq_ind_table: None,
        create_rwq_ind_table: None,
        destroy_wq: None,
        modify_wq: None,
        create_wq: None,
        query_rt_values: None,
        create_cq_ex: Some(exts::create_cq_ex),
        priv_: std::ptr::null_mut(),
        query_device_ex: Some(exts::query_device_ex),
        ibv_destroy_flow: None,
        abi_placeholder2: None,
        ibv_create_flow: None,
        abi_placeholder1: None,
        open_qp: None,
        create_qp_ex: Some(exts::create_qp_ex),
        get_srq_num: None,
        create_srq_ex: Some(exts::create_srq_ex),
        open_xrcd: None,
        close_xrcd: None,
        abi_placeholder3: 0,
        // Every op from query_port on exists (rdma-core's verbs_get_ctx_op checks this).
        sz: std::mem::size_of::<verbs_context>(),
        context: ibv_context {
            device,
            ops: ops_table(),
            cmd_fd,
            async_fd,
            num_comp_vectors: 1,
            mutex: Default::default(),
            abi_compat: ABI_IS_EXTENDED,
        },
    }
}

/// Copies `value`'s first `len` bytes (at most its size) to `dst`.
///
/// # Safety
/// `dst` must be valid for `len` bytes.
pub(crate) unsafe fn write_prefix<T: Copy>(dst: *mut c_void, value: &T, len: usize) {
    let len = len.min(std::mem::size_of::<T>());
    // Safety: value is len bytes or more; dst is valid for len bytes (contract).
    unsafe { std::ptr::copy_nonoverlapping(value as *const T as *const u8, dst as *mut u8, len) };
}

pub(crate) fn port_attr_c(attr: &PortAttr) -> ibv_port_attr {
    let mut c = ibv_port_attr::from(attr);
    // IBV_PORT_CM_SUP is not claimed until RDMA CM exists; GIDs are in the table.
    c.gid_tbl_len = attr.gid_tbl_len as i32;
    c
}

xroce_abi_export::c_export! { "IBVERBS_1.1";
    /// `ibv_open_device`.
    pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
        // Safety: the caller passes a device pointer of ours (or garbage we reject).
        let Some(ifname) = (unsafe { ifname_of(device) }) else {
            set_errno(libc::ENODEV);
            return std::ptr::null_mut();
        };
        // Safety: checked above to be ours.
        let name = unsafe { device_name(device) };
        let net = match netdev::query(&ifname) {
            Ok(n) => n,
            Err(e) => return fail_ptr("ibv_open_device", &VerbsError::Netdev(e)),
        };
        let (cmd_fd, async_fd) = match (dev_null(), async_event_set()) {
            (Ok(c), Ok(a)) => (c, a),
            (Err(e), _) | (_, Err(e)) => {
                return fail_ptr(
                    "ibv_open_device",
                    &VerbsError::Io { context: "creating the context's fds", source: e },
                )
            }
        };
        let context = Box::new(Context {
            vctx: verbs_context_for(device, cmd_fd.as_raw_fd(), async_fd.as_raw_fd()),
            ifname,
            name,
            net,
            device: OnceLock::new(),
            open_error: Mutex::new(None),
            registry: Mutex::new(Registry::default()),
            _cmd_fd: cmd_fd,
            async_fd,
        });
        if LibraryConfig::get().device.driver == DriverKind::Udp {
            if let Err(e) = context.device() {
                return fail_ptr("ibv_open_device", &e);
            }
        }
        let context = Box::leak(context);
        context.c_ptr()
    }

    /// `ibv_close_device`.
    pub unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
        if ctx.is_null() {
            return libc::EINVAL;
        }
        let offset = std::mem::offset_of!(verbs_context, context);
        // Safety: ctx is a context of ours (contract of ibv_close_device); it was leaked
        // from a Box<Context> whose first field holds it at `offset`.
        let context = unsafe { Box::from_raw((ctx as *mut u8).sub(offset) as *mut Context) };
        let had_device = context.opened().is_some();
        let ifname = context.ifname.clone();
        drop(context);
        if had_device {
            release_device(&ifname);
        }
        0
    }

    /// `ibv_query_device`.
    pub unsafe extern "C" fn ibv_query_device(ctx: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
        if ctx.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        // Safety: ctx is ours; attr is a valid out-pointer (contract).
        unsafe { *attr = ibv_device_attr::from(&Context::from_c(ctx).device_attr()) };
        0
    }

    /// `ibv_query_port` (the exported fallback; programs built against rdma-core ≥ 17 call
    /// the extended op): writes the 48-byte compat struct, without `port_cap_flags2`.
    pub unsafe extern "C" fn ibv_query_port(ctx: *mut ibv_context, port: u8, attr: *mut ibv_port_attr) -> c_int {
        // Safety: forwarded contract.
        unsafe { super::exts::query_port_ex(ctx, port, attr, 48) }
    }

    /// `ibv_query_gid`.
    pub unsafe extern "C" fn ibv_query_gid(ctx: *mut ibv_context, port: u8, index: c_int, gid: *mut ibv_gid) -> c_int {
        if ctx.is_null() || gid.is_null() || port != 1 || index < 0 {
            return -1;
        }
        // Safety: ctx is ours.
        let table = unsafe { Context::from_c(ctx) }.gid_table();
        match table.get(index as usize) {
            Some(entry) => {
                // Safety: gid is a valid out-pointer.
                unsafe { *gid = entry.gid.into() };
                0
            }
            None => -1,
        }
    }

    /// `ibv_query_pkey`: the one P_Key, 0xFFFF at index 0 (network order).
    pub unsafe extern "C" fn ibv_query_pkey(ctx: *mut ibv_context, port: u8, index: c_int, pkey: *mut u16) -> c_int {
        if ctx.is_null() || pkey.is_null() || port != 1 || index != 0 {
            return -1;
        }
        // Safety: pkey is a valid out-pointer.
        unsafe { *pkey = 0xffffu16.to_be() };
        0
    }
}

xroce_abi_export::c_export! { "IBVERBS_1.5";
    /// `ibv_get_pkey_index`: the index of a P_Key (network order) in the table.
    pub unsafe extern "C" fn ibv_get_pkey_index(ctx: *mut ibv_context, port: u8, pkey: u16) -> c_int {
        if ctx.is_null() || port != 1 {
            return -1;
        }
        if u16::from_be(pkey) == 0xffff { 0 } else { -1 }
    }
}

xroce_abi_export::c_export! { "IBVERBS_1.11";
    /// `ibv_query_gid_ex`: one GID entry with its type.
    pub unsafe extern "C" fn _ibv_query_gid_ex(
        ctx: *mut ibv_context,
        port: u32,
        index: u32,
        entry: *mut ibv_gid_entry,
        flags: u32,
        entry_size: usize,
    ) -> c_int {
        if ctx.is_null() || entry.is_null() || flags != 0 {
            return libc::EINVAL;
        }
        if port != 1 {
            return libc::EINVAL;
        }
        // Safety: ctx is ours.
        let context = unsafe { Context::from_c(ctx) };
        let table = context.gid_table();
        let Some(found) = table.get(index as usize) else {
            return libc::ENODATA;
        };
        let c = gid_entry(found, 1, context.net.ifindex);
        // Safety: entry is valid for entry_size bytes (the caller's struct size).
        unsafe { write_prefix(entry as *mut c_void, &c, entry_size) };
        0
    }

    /// `ibv_query_gid_table`: the whole table; returns the number of entries written.
    pub unsafe extern "C" fn _ibv_query_gid_table(
        ctx: *mut ibv_context,
        entries: *mut ibv_gid_entry,
        max_entries: usize,
        flags: u32,
        entry_size: usize,
    ) -> isize {
        if ctx.is_null() || entries.is_null() || flags != 0 || entry_size == 0 {
            return -(libc::EINVAL as isize);
        }
        // Safety: ctx is ours.
        let context = unsafe { Context::from_c(ctx) };
        let table = context.gid_table();
        if table.len() > max_entries {
            return -(libc::EINVAL as isize);
        }
        for (i, e) in table.iter().enumerate() {
            let c = gid_entry(e, 1, context.net.ifindex);
            // Safety: entries holds max_entries records of entry_size bytes; i < max_entries.
            unsafe { write_prefix((entries as *mut u8).add(i * entry_size) as *mut c_void, &c, entry_size) };
        }
        table.len() as isize
    }
}

xroce_abi_export::c_export! { "IBVERBS_PRIVATE_34";
    /// `ibv_query_gid_type` (private, used by ibv_devinfo): the type of a GID entry.
    pub unsafe extern "C" fn ibv_query_gid_type(ctx: *mut ibv_context, port: u8, index: u32, gid_type: *mut u32) -> c_int {
        if ctx.is_null() || gid_type.is_null() || port != 1 {
            return libc::EINVAL;
        }
        // Safety: ctx is ours.
        let context = unsafe { Context::from_c(ctx) };
        match context.gid_table().get(index as usize) {
            Some(e) => {
                let c = gid_entry(e, 1, context.net.ifindex);
                // ibv_devinfo passes enum ibv_gid_type_sysfs: 0 = IB/RoCE v1, 1 = RoCE v2,
                // the same order as IBV_GID_TYPE_{IB,ROCE_V1,ROCE_V2} minus the IB entry.
                let sysfs = if c.gid_type.0 >= 2 { 1 } else { 0 };
                // Safety: gid_type is a valid out-pointer.
                unsafe { *gid_type = sysfs };
                0
            }
            None => libc::EINVAL,
        }
    }
}

/// `query_device_ex` body, shared with the extended op.
pub(crate) fn device_attr_ex(context: &Context) -> ibv_device_attr_ex {
    // Safety (of zeroed): every field is an integer or an array of them.
    let mut ex: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
    ex.orig_attr = ibv_device_attr::from(&context.device_attr());
    ex.phys_port_cnt_ex = 1;
    // Explicit on-demand paging (see resources::ACCESS_ON_DEMAND): IBV_ODP_SUPPORT, and per
    // transport what its QPs do: RC send, receive, write, read, atomic, SRQ receive; UC send,
    // receive, write; UD send, receive, SRQ receive.
    ex.odp_caps.general_caps = 1;
    ex.odp_caps.rc_odp_caps = 0x3f;
    ex.odp_caps.uc_odp_caps = 0x07;
    ex.odp_caps.ud_odp_caps = 0x23;
    ex
}

/// Checks the input of `ibv_query_device_ex`.
///
/// # Safety
/// `input` is null or valid.
pub(crate) unsafe fn check_query_input(
    input: *const ibv_query_device_ex_input,
) -> Result<(), c_int> {
    // Safety: per the contract.
    if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// The counters of the device a name stands for (`xroce_eth0` or `eth0`), as
/// `name value` lines: the engine's counters under rxe's `hw_counters` names, then the drops by
/// reason as `drops.REASON`. `None` while no context of this process has the device open.
pub(crate) fn counters_text(name: &str) -> Option<String> {
    let ifname = name.strip_prefix("xroce_").unwrap_or(name);
    let counters = lock(devices()).get(ifname)?.0.counters();
    let mut text = String::new();
    for (field, value) in counters.fields() {
        text.push_str(&format!("{field} {value}\n"));
    }
    for (reason, value) in counters.drops.fields() {
        text.push_str(&format!("drops.{reason} {value}\n"));
    }
    Some(text)
}

xroce_abi_export::c_export! { "XROCE_1.0";
    /// xroce's own call (rdma-core has none like it): the counters of an open device, what
    /// rxe shows in sysfs `hw_counters`, for tools that read them through `dlsym` or ctypes
    /// (the conformance agent). Writes `name value` lines into `buf` (NUL-terminated,
    /// truncated to `len`) and returns the whole text's length, as `snprintf`; -1 with errno
    /// ENODEV when no context of this process has the device open, EINVAL for a NULL name.
    pub unsafe extern "C" fn xroce_read_counters(
        device_name: *const std::ffi::c_char,
        buf: *mut std::ffi::c_char,
        len: usize,
    ) -> isize {
        if device_name.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // Safety: the caller passes a NUL-terminated name (checked non-null above).
        let name = unsafe { std::ffi::CStr::from_ptr(device_name) }.to_string_lossy();
        let Some(text) = counters_text(&name) else {
            set_errno(libc::ENODEV);
            return -1;
        };
        if !buf.is_null() && len > 0 {
            let n = text.len().min(len - 1);
            // Safety: the caller's buffer holds `len` bytes; n + 1 <= len.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf as *mut u8, n);
                *buf.add(n) = 0;
            }
        }
        text.len() as isize
    }
}
