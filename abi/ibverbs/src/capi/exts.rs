//! The extended verbs, reached through the `verbs_context` in front of the `ibv_context`:
//! `ibv_query_port` (52-byte attributes), `ibv_query_device_ex`, `ibv_create_cq_ex`,
//! `ibv_create_qp_ex` and `ibv_create_srq_ex`.

use std::ffi::{c_int, c_void};

use super::context::{check_query_input, device_attr_ex, port_attr_c, write_prefix, Context};
use super::resources::{create_cq_obj, create_qp_ex_args, create_qp_obj, create_srq_obj};
use super::{fail_int, set_errno};
use crate::objects::{
    ibv_context, ibv_cq_ex, ibv_cq_init_attr_ex, ibv_device_attr_ex, ibv_qp, ibv_qp_init_attr_ex,
    ibv_query_device_ex_input, ibv_srq, ibv_srq_init_attr_ex,
};
use crate::structs::ibv_port_attr;

/// `verbs_context::query_port`: writes `len` bytes of the port attributes.
pub(crate) unsafe extern "C" fn query_port_ex(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    if ctx.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // Safety: an open context.
    let context = unsafe { Context::from_c(ctx) };
    match context.port_attr(port) {
        Ok(p) => {
            let c = port_attr_c(&p);
            // Safety: attr holds len bytes (the caller's struct size).
            unsafe { write_prefix(attr as *mut c_void, &c, len) };
            0
        }
        Err(e) => fail_int("ibv_query_port", &e),
    }
}

/// `verbs_context::query_device_ex`.
pub(crate) unsafe extern "C" fn query_device_ex(
    ctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    if ctx.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // Safety: input null or valid.
    if let Err(e) = unsafe { check_query_input(input) } {
        return e;
    }
    // Safety: an open context.
    let ex = device_attr_ex(unsafe { Context::from_c(ctx) });
    // Safety: attr holds attr_size bytes.
    unsafe { write_prefix(attr as *mut c_void, &ex, attr_size) };
    0
}

/// `IBV_WC_EX_WITH_*` that the CQ can report: byte_len, imm, qp_num, src_qp, slid, sl,
/// dlid_path_bits (the plain `ibv_wc` fields), not timestamps, cvlan, flow tag or TM info.
const WC_FLAGS_SUPPORTED: u64 = 0x7f;

/// `verbs_context::create_cq_ex`.
pub(crate) unsafe extern "C" fn create_cq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    if ctx.is_null() || attr.is_null() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // Safety: attr valid.
    let a = unsafe { &*attr };
    // IBV_CQ_INIT_ATTR_MASK_FLAGS (flags: single-threaded is only a hint) and _PD.
    if a.comp_mask & !0x3 != 0 || a.wc_flags & !WC_FLAGS_SUPPORTED != 0 || a.flags & !1 != 0 {
        set_errno(libc::EOPNOTSUPP);
        return std::ptr::null_mut();
    }
    if a.cqe == 0 || a.cqe > i32::MAX as u32 {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // Safety: forwarded contract.
    unsafe {
        create_cq_obj(
            ctx,
            a.cqe as c_int,
            a.cq_context,
            a.channel,
            a.comp_vector,
            "ibv_create_cq_ex",
        ) as *mut ibv_cq_ex
    }
}

/// `verbs_context::create_qp_ex`.
pub(crate) unsafe extern "C" fn create_qp_ex(
    ctx: *mut ibv_context,
    init: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    if ctx.is_null() || init.is_null() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // Safety: init valid.
    match unsafe { create_qp_ex_args(init) } {
        // Safety: forwarded contract.
        Ok(args) => unsafe { create_qp_obj(args, "ibv_create_qp_ex") },
        Err(errno) => {
            set_errno(errno);
            std::ptr::null_mut()
        }
    }
}

/// `verbs_context::create_srq_ex`: basic SRQs (XRC and tag-matching SRQs are not).
pub(crate) unsafe extern "C" fn create_srq_ex(
    ctx: *mut ibv_context,
    init: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    if ctx.is_null() || init.is_null() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // Safety: init valid.
    let i = unsafe { &mut *init };
    const TYPE: u32 = 1;
    const PD: u32 = 2;
    if i.comp_mask & !(TYPE | PD) != 0 || (i.comp_mask & TYPE != 0 && i.srq_type != 0) {
        set_errno(libc::EOPNOTSUPP);
        return std::ptr::null_mut();
    }
    if i.comp_mask & PD == 0 {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // Safety: forwarded contract.
    unsafe { create_srq_obj(i.pd, i.srq_context, &mut i.attr) }
}

/// `verbs_context::advise_mr` (`ibv_advise_mr`): prefetch advice for on-demand regions. xroce
/// reaches the program's memory from its own process, where a page not present is faulted in
/// on first access, so there is nothing to prefetch: the advice is checked and taken.
pub(crate) unsafe extern "C" fn advise_mr(
    pd: *mut crate::objects::ibv_pd,
    advice: u32,
    _flags: u32,
    sg_list: *mut crate::structs::ibv_sge,
    num_sge: u32,
) -> c_int {
    // IBV_ADVISE_MR_ADVICE_PREFETCH, _PREFETCH_WRITE, _PREFETCH_NO_FAULT.
    if pd.is_null() || advice > 2 || num_sge == 0 || sg_list.is_null() {
        return libc::EINVAL;
    }
    0
}
