//! The rest of libibverbs' exported functions: the strings, fork support, sysfs helpers,
//! `ibv_create_ah_from_wc`, and what xroce does not have, which fails with `EOPNOTSUPP`
//! (multicast, device memory import, ECE, dma-buf regions) and a line on stderr saying so.
//!
//! `IBVERBS_PRIVATE_34` is the interface between rdma-core's libibverbs and its provider
//! libraries (libmlx5, libefa, ...). Nothing of xroce's uses it, but those libraries are
//! loaded by perftest and pyverbs at start-up and bind to it, and their constructors call
//! `verbs_register_driver_34`: so each symbol exists, the registration is a no-op, and every
//! other entry point refuses.

use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Mutex, OnceLock};

use xroce::netdev::Gid;
use xroce::verbs::AhAttr;

use super::resources::PdObj;
use super::{lock, set_errno};
use crate::objects::{ibv_ah, ibv_context, ibv_pd};
use crate::structs::{ibv_ah_attr, ibv_wc};
use crate::values::wc_flags;

/// Says once per function that it is not supported.
fn unsupported(name: &str, why: &str) {
    static SAID: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let first = lock(SAID.get_or_init(|| Mutex::new(HashSet::new()))).insert(name.to_string());
    if first && !super::config::quiet() {
        eprintln!("xroce: {name} is not supported: {why}");
    }
    set_errno(libc::EOPNOTSUPP);
}

fn static_str(text: &'static CStr) -> *const c_char {
    text.as_ptr()
}

xroce_abi_export::c_export! { "IBVERBS_1.1";
    /// `ibv_wc_status_str`.
    pub unsafe extern "C" fn ibv_wc_status_str(status: u32) -> *const c_char {
        const NAMES: [&CStr; 22] = [
            c"success", c"local length error", c"local QP operation error",
            c"local EE context operation error", c"local protection error",
            c"Work Request Flushed Error", c"memory management operation error",
            c"bad response error", c"local access error", c"remote invalid request error",
            c"remote access error", c"remote operation error", c"transport retry counter exceeded",
            c"RNR retry counter exceeded", c"local RDD violation error",
            c"remote invalid RD request", c"aborted error", c"invalid EE context number",
            c"invalid EE context state", c"fatal error", c"response timeout error",
            c"general error",
        ];
        static_str(NAMES.get(status as usize).copied().unwrap_or(c"unknown"))
    }

    /// `ibv_node_type_str`.
    pub unsafe extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
        static_str(match node_type {
            1 => c"InfiniBand channel adapter",
            2 => c"InfiniBand switch",
            3 => c"InfiniBand router",
            4 => c"iWARP NIC",
            5 => c"usNIC",
            6 => c"usNIC UDP",
            _ => c"unknown",
        })
    }

    /// `ibv_port_state_str`.
    pub unsafe extern "C" fn ibv_port_state_str(state: u32) -> *const c_char {
        static_str(match state {
            0 => c"no state change (NOP)",
            1 => c"down",
            2 => c"init",
            3 => c"armed",
            4 => c"active",
            5 => c"active defer",
            _ => c"unknown",
        })
    }

    /// `ibv_event_type_str`.
    pub unsafe extern "C" fn ibv_event_type_str(event: u32) -> *const c_char {
        const NAMES: [&CStr; 20] = [
            c"CQ error", c"local work queue catastrophic error",
            c"invalid request local work queue error", c"local access violation work queue error",
            c"communication established", c"send queue drained", c"path migrated",
            c"path migration request error", c"local catastrophic error", c"port active",
            c"port error", c"LID change", c"P_Key change", c"SM change", c"SRQ catastrophic error",
            c"SRQ limit reached", c"last WQE reached", c"client reregistration",
            c"GID table change", c"WQ fatal",
        ];
        static_str(NAMES.get(event as usize).copied().unwrap_or(c"unknown"))
    }

    /// `ibv_fork_init`: nothing to do. xroce's memory regions are not pinned by a kernel
    /// driver, so a child process after fork(2) sees ordinary copy-on-write memory.
    pub unsafe extern "C" fn ibv_fork_init() -> c_int {
        0
    }

    /// `ibv_dontfork_range`: see `ibv_fork_init`.
    pub unsafe extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
        0
    }

    /// `ibv_dofork_range`: see `ibv_fork_init`.
    pub unsafe extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
        0
    }

    /// `ibv_attach_mcast`: xroce has no multicast.
    pub unsafe extern "C" fn ibv_attach_mcast(_qp: *mut c_void, _gid: *const c_void, _lid: u16) -> c_int {
        unsupported("ibv_attach_mcast", "xroce has no multicast groups");
        libc::EOPNOTSUPP
    }

    /// `ibv_detach_mcast`: xroce has no multicast.
    pub unsafe extern "C" fn ibv_detach_mcast(_qp: *mut c_void, _gid: *const c_void, _lid: u16) -> c_int {
        unsupported("ibv_detach_mcast", "xroce has no multicast groups");
        libc::EOPNOTSUPP
    }

    /// `ibv_resolve_eth_l2_from_gid`: used by rdma-core's providers only.
    pub unsafe extern "C" fn ibv_resolve_eth_l2_from_gid(
        _ctx: *mut ibv_context,
        _attr: *mut c_void,
        _eth_mac: *mut u8,
        _vid: *mut u16,
    ) -> c_int {
        unsupported("ibv_resolve_eth_l2_from_gid", "xroce resolves neighbours itself");
        libc::EOPNOTSUPP
    }

    /// `ibv_copy_ah_attr_from_kern`: for rdma-core's librdmacm, which needs a kernel.
    pub unsafe extern "C" fn ibv_copy_ah_attr_from_kern(_dst: *mut c_void, _src: *const c_void) {
        unsupported("ibv_copy_ah_attr_from_kern", "there is no kernel RDMA stack");
    }

    /// `ibv_init_ah_from_wc`: the address to answer the sender of a UD receive.
    pub unsafe extern "C" fn ibv_init_ah_from_wc(
        ctx: *mut ibv_context,
        port: u8,
        wc: *mut ibv_wc,
        grh: *mut u8,
        ah_attr: *mut ibv_ah_attr,
    ) -> c_int {
        if ctx.is_null() || wc.is_null() || ah_attr.is_null() || port != 1 {
            return libc::EINVAL;
        }
        // Safety: valid pointers (contract); grh holds the 40 bytes of a UD receive's GRH.
        match unsafe { ah_attr_from_wc(ctx, &*wc, grh) } {
            Ok(a) => {
                // Safety: a valid out-pointer.
                unsafe { *ah_attr = a };
                0
            }
            Err(errno) => errno,
        }
    }

    /// `ibv_create_ah_from_wc`.
    pub unsafe extern "C" fn ibv_create_ah_from_wc(
        pd: *mut ibv_pd,
        wc: *mut ibv_wc,
        grh: *mut u8,
        port: u8,
    ) -> *mut ibv_ah {
        if pd.is_null() || wc.is_null() || port != 1 {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // Safety: a PD of ours.
        let ctx = unsafe { (*(pd as *mut PdObj)).c.context };
        // Safety: as for ibv_init_ah_from_wc.
        let mut attr = match unsafe { ah_attr_from_wc(ctx, &*wc, grh) } {
            Ok(a) => a,
            Err(errno) => {
                set_errno(errno);
                return std::ptr::null_mut();
            }
        };
        // Safety: forwarded contract.
        unsafe { super::resources::create_ah(pd, &mut attr) }
    }
}

/// The reply address of a UD receive: its GRH's source (RoCE v2 over IPv4 puts the IPv4
/// header in the GRH's last 20 bytes, as rxe and hardware do), from the local GID the
/// receive arrived on.
///
/// # Safety
/// `ctx` is an open context; `grh` null or 40 readable bytes.
unsafe fn ah_attr_from_wc(
    ctx: *mut ibv_context,
    wc: &ibv_wc,
    grh: *mut u8,
) -> Result<ibv_ah_attr, c_int> {
    if wc.wc_flags & wc_flags::IBV_WC_GRH == 0 || grh.is_null() {
        // RoCE always carries a GRH; without one there is no address to answer.
        return Err(libc::EINVAL);
    }
    // Safety: per the contract.
    let g = unsafe { std::slice::from_raw_parts(grh as *const u8, 40) };
    let ipv4 = g[20] >> 4 == 4;
    let (src, dst) = if ipv4 {
        let ip = |o: usize| std::net::Ipv4Addr::new(g[o], g[o + 1], g[o + 2], g[o + 3]);
        (Gid::from_ip(ip(32).into()), Gid::from_ip(ip(36).into()))
    } else {
        let gid = |o: usize| Gid(g[o..o + 16].try_into().expect("16 bytes"));
        (gid(8), gid(24))
    };
    // Safety: an open context.
    let context = unsafe { super::context::Context::from_c(ctx) };
    let sgid_index = context
        .gid_table()
        .iter()
        .find(|e| e.gid == dst)
        .map(|e| e.index as u8)
        .ok_or(libc::EINVAL)?;
    let ah = AhAttr {
        dgid: src,
        sgid_index,
        hop_limit: 64,
        traffic_class: 0,
        flow_label: 0,
    };
    let mut c = ibv_ah_attr::from(ah);
    c.port_num = 1;
    Ok(c)
}

xroce_abi_export::c_export! { "IBVERBS_1.0";
    /// `ibv_get_sysfs_path`.
    pub unsafe extern "C" fn ibv_get_sysfs_path() -> *const c_char {
        c"/sys".as_ptr()
    }

    /// `ibv_read_sysfs_file`: reads a sysfs attribute without its trailing newline;
    /// returns its length, or -1.
    pub unsafe extern "C" fn ibv_read_sysfs_file(dir: *const c_char, file: *const c_char, buf: *mut c_char, size: usize) -> c_int {
        if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
            return -1;
        }
        // Safety: NUL-terminated strings (contract).
        let (d, f) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
        let path = format!("{}/{}", d.to_string_lossy(), f.to_string_lossy());
        let Ok(text) = std::fs::read(&path) else { return -1 };
        let mut n = text.len().min(size - 1);
        if n > 0 && text[n - 1] == b'\n' {
            n -= 1;
        }
        // Safety: buf holds size bytes; n < size.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf as *mut u8, n);
            *buf.add(n) = 0;
        }
        n as c_int
    }

    /// `ibv_copy_qp_attr_from_kern`: for rdma-core's librdmacm, which needs a kernel.
    pub unsafe extern "C" fn ibv_copy_qp_attr_from_kern(_dst: *mut c_void, _src: *const c_void) {
        unsupported("ibv_copy_qp_attr_from_kern", "there is no kernel RDMA stack");
    }

    /// `ibv_copy_path_rec_from_kern`: for rdma-core's librdmacm, which needs a kernel.
    pub unsafe extern "C" fn ibv_copy_path_rec_from_kern(_dst: *mut c_void, _src: *const c_void) {
        unsupported("ibv_copy_path_rec_from_kern", "there is no kernel RDMA stack");
    }
}

xroce_abi_export::c_export! { "IBVERBS_1.10";
    /// `ibv_import_device`: contexts cannot be shared through a kernel fd.
    pub unsafe extern "C" fn ibv_import_device(_cmd_fd: c_int) -> *mut ibv_context {
        unsupported("ibv_import_device", "there is no kernel context to import");
        std::ptr::null_mut()
    }

    /// `ibv_import_pd`.
    pub unsafe extern "C" fn ibv_import_pd(_ctx: *mut ibv_context, _handle: u32) -> *mut ibv_pd {
        unsupported("ibv_import_pd", "there is no kernel object to import");
        std::ptr::null_mut()
    }

    /// `ibv_unimport_pd`.
    pub unsafe extern "C" fn ibv_unimport_pd(_pd: *mut ibv_pd) {
        unsupported("ibv_unimport_pd", "nothing is imported");
    }

    /// `ibv_import_mr`.
    pub unsafe extern "C" fn ibv_import_mr(_pd: *mut ibv_pd, _handle: u32) -> *mut c_void {
        unsupported("ibv_import_mr", "there is no kernel object to import");
        std::ptr::null_mut()
    }

    /// `ibv_unimport_mr`.
    pub unsafe extern "C" fn ibv_unimport_mr(_mr: *mut c_void) {
        unsupported("ibv_unimport_mr", "nothing is imported");
    }

    /// `ibv_query_ece`: no enhanced connection establishment.
    pub unsafe extern "C" fn ibv_query_ece(_qp: *mut c_void, _ece: *mut c_void) -> c_int {
        unsupported("ibv_query_ece", "no enhanced connection establishment (ECE)");
        libc::EOPNOTSUPP
    }

    /// `ibv_set_ece`: no enhanced connection establishment.
    pub unsafe extern "C" fn ibv_set_ece(_qp: *mut c_void, _ece: *mut c_void) -> c_int {
        unsupported("ibv_set_ece", "no enhanced connection establishment (ECE)");
        libc::EOPNOTSUPP
    }
}

xroce_abi_export::c_export! { "IBVERBS_1.12";
    /// `ibv_reg_dmabuf_mr`: no dma-buf regions (device memory of other drivers).
    pub unsafe extern "C" fn ibv_reg_dmabuf_mr(_pd: *mut ibv_pd, _offset: u64, _length: usize, _iova: u64, _fd: c_int, _access: c_int) -> *mut c_void {
        unsupported("ibv_reg_dmabuf_mr", "no dma-buf memory regions");
        std::ptr::null_mut()
    }
}

xroce_abi_export::c_export! { "IBVERBS_1.13";
    /// `ibv_import_dm`.
    pub unsafe extern "C" fn ibv_import_dm(_ctx: *mut ibv_context, _handle: u32) -> *mut c_void {
        unsupported("ibv_import_dm", "no device memory");
        std::ptr::null_mut()
    }

    /// `ibv_unimport_dm`.
    pub unsafe extern "C" fn ibv_unimport_dm(_dm: *mut c_void) {
        unsupported("ibv_unimport_dm", "no device memory");
    }

    /// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED` (see `ibv_fork_init`).
    pub unsafe extern "C" fn ibv_is_fork_initialized() -> c_int {
        2
    }
}

xroce_abi_export::c_export! { "IBVERBS_1.14";
    /// `ibv_query_qp_data_in_order`: 0, data is not promised to land in order (a WRITE's
    /// packets are placed as they arrive, retransmissions included).
    pub unsafe extern "C" fn ibv_query_qp_data_in_order(_qp: *mut c_void, _op: u32, _flags: u32) -> c_int {
        0
    }
}

/// Stubs of libibverbs' provider interface that refuse with `EOPNOTSUPP`.
macro_rules! provider_stubs {
    ($($name:ident),* $(,)?) => {$(
        xroce_abi_export::c_export! { "IBVERBS_PRIVATE_34";
            /// A provider-interface entry point: refused (see the module doc).
            pub unsafe extern "C" fn $name() -> c_int {
                unsupported(stringify!($name), "xroce has no kernel verbs interface for provider libraries");
                libc::EOPNOTSUPP
            }
        }
    )*};
}

provider_stubs!(
    ibv_cmd_advise_mr,
    ibv_cmd_alloc_dm,
    ibv_cmd_alloc_mw,
    ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd,
    ibv_cmd_create_ah,
    ibv_cmd_create_counters,
    ibv_cmd_create_cq,
    ibv_cmd_create_cq_ex,
    ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp,
    ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex,
    ibv_cmd_create_wq,
    ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr,
    ibv_cmd_destroy_ah,
    ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action,
    ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast,
    ibv_cmd_free_dm,
    ibv_cmd_get_context,
    ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp,
    ibv_cmd_modify_qp,
    ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq,
    ibv_cmd_modify_wq,
    ibv_cmd_open_qp,
    ibv_cmd_open_xrcd,
    ibv_cmd_query_context,
    ibv_cmd_query_device_any,
    ibv_cmd_query_mr,
    ibv_cmd_query_port,
    ibv_cmd_query_qp,
    ibv_cmd_query_srq,
    ibv_cmd_read_counters,
    ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr,
    ibv_cmd_reg_mr,
    ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
    ibv_cmd_query_device,
    ibv_cmd_req_notify_cq,
    ibv_cmd_post_send,
    ibv_cmd_post_recv,
    ibv_cmd_post_srq_recv,
    ibv_cmd_poll_cq,
    ibv_cmd_create_ah_ex,
    ibv_cmd_alloc_async_fd,
    ibv_cmd_query_gid_table,
    ibv_cmd_query_device_ex,
    execute_ioctl,
    verbs_init_cq,
    ibv_cmd_bind_mw,
);

xroce_abi_export::c_export! { "IBVERBS_PRIVATE_34";
    /// Provider registration (a provider library's constructor calls it at load time): a
    /// no-op, so loading libmlx5 or libefa beside this library is harmless.
    pub unsafe extern "C" fn verbs_register_driver_34(_ops: *const c_void) {}

    /// Provider logging: dropped.
    pub unsafe extern "C" fn __verbs_log() {}

    /// Provider context allocation: refused.
    pub unsafe extern "C" fn _verbs_init_and_alloc_context() -> *mut c_void {
        unsupported("_verbs_init_and_alloc_context", "provider libraries cannot open xroce devices");
        std::ptr::null_mut()
    }

    /// Provider device open: refused.
    pub unsafe extern "C" fn verbs_open_device() -> *mut c_void {
        unsupported("verbs_open_device", "provider libraries cannot open xroce devices");
        std::ptr::null_mut()
    }

    /// Provider ops: ignored (no provider context exists).
    pub unsafe extern "C" fn verbs_set_ops(_ctx: *mut c_void, _ops: *const c_void) {}

    /// Provider context teardown: nothing to do.
    pub unsafe extern "C" fn verbs_uninit_context(_ctx: *mut c_void) {}

    /// Whether destroy may proceed on a disassociated device: never disassociated.
    pub unsafe extern "C" fn verbs_allow_disassociate_destroy() -> bool {
        false
    }
}
