//! Creating and destroying the objects: PD, MR, MW, AH, completion channel, CQ, SRQ, QP;
//! modify and query of QPs and SRQs.
//!
//! Each object is a box beginning with its C struct, followed by the xroce handle. A destroy
//! call that would leave another object dangling fails with `EBUSY`, as on a kernel device
//! (a PD with MRs or QPs, a CQ with QPs, a channel with CQs, an SRQ with QPs).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use xroce::engine::{QpAttrMask, SrqAttrMask};
use xroce::verbs::{
    Access, AddressHandle, AhAttr, CompletionChannel, Cq, Mr, MrRereg, Mw, MwType, Pd, Qp, QpAttr,
    QpCaps, QpInitAttr, QpState, QpType, Srq, SrqAttr, UserMemory, VerbsError,
};

use super::context::Context;
use super::datapath::{CqPoll, WrBuilder};
use super::{fail_int, fail_ptr, lock, set_errno, RawObj};
use crate::objects::{
    ibv_ah, ibv_comp_channel, ibv_context, ibv_cq, ibv_cq_ex, ibv_mr, ibv_mw, ibv_pd, ibv_qp,
    ibv_qp_ex, ibv_qp_init_attr, ibv_qp_init_attr_ex, ibv_srq, ibv_srq_init_attr,
};
use crate::structs::{ibv_ah_attr, ibv_qp_attr, ibv_qp_cap, ibv_srq_attr};
use crate::values::{ibv_mig_state, ibv_mtu, ibv_qp_state};

/// `IBV_QPT_RC`, `_UC`, `_UD`.
pub(crate) const IBV_QPT_RC: u32 = 2;
pub(crate) const IBV_QPT_UC: u32 = 3;
pub(crate) const IBV_QPT_UD: u32 = 4;

/// `IBV_ACCESS_*` bits xroce implements (the engine's `Access` uses the same values).
const ACCESS_KNOWN: u32 = 0x1f;
/// `IBV_ACCESS_ON_DEMAND`: explicit on-demand paging. xroce reads and writes the program's
/// memory from the program's own process, so a page not yet present is faulted in by the
/// kernel as for any access: every region is "on demand", nothing is pinned. (Implicit ODP,
/// a region of the whole address space, is not offered.)
const ACCESS_ON_DEMAND: u32 = 0x40;
/// `IBV_ACCESS_HUGETLB`: the region lies in huge pages (a hint for on-demand paging's page
/// size). xroce touches the memory through the process like any other, whatever its pages,
/// so the hint needs nothing (rdma-core's ODP tests pass it on machines with huge pages).
const ACCESS_HUGETLB: u32 = 0x80;
/// `IBV_ACCESS_RELAXED_ORDERING` and the other optional bits from bit 20 up: hints a
/// provider may ignore (rdma-core's rule for `IBV_ACCESS_OPTIONAL_RANGE`).
const ACCESS_OPTIONAL: u32 = 0x3ff0_0000;

pub(crate) fn access_from_c(flags: u32) -> Result<Access, VerbsError> {
    let required = flags & !ACCESS_OPTIONAL & !ACCESS_ON_DEMAND & !ACCESS_HUGETLB;
    if required & !ACCESS_KNOWN != 0 {
        return Err(VerbsError::InvalidArgument(format!(
            "access flags {flags:#x}: {:#x} not supported (zero-based regions and implicit \
             on-demand paging are not)",
            required & !ACCESS_KNOWN
        )));
    }
    Ok(Access::from_bits_truncate(required))
}

#[repr(C)]
pub(crate) struct PdObj {
    pub c: ibv_pd,
    pub pd: Pd,
    pub users: AtomicU32,
}

#[repr(C)]
pub(crate) struct MrObj {
    pub c: ibv_mr,
    pub mr: Mr,
    pub pd: *mut PdObj,
}

#[repr(C)]
pub(crate) struct MwObj {
    pub c: ibv_mw,
    pub mw: Mw,
    pub pd: *mut PdObj,
}

#[repr(C)]
pub(crate) struct AhObj {
    pub c: ibv_ah,
    pub ah: AddressHandle,
    pub pd: *mut PdObj,
}

#[repr(C)]
pub(crate) struct ChannelObj {
    pub c: ibv_comp_channel,
    pub ch: CompletionChannel,
}

#[repr(C)]
pub(crate) struct CqObj {
    /// An `ibv_cq_ex`, which begins with the `ibv_cq` (ibv_cq_ex_to_cq is a cast).
    pub c: ibv_cq_ex,
    pub cq: Cq,
    pub users: AtomicU32,
    pub poll: Mutex<CqPoll>,
}

#[repr(C)]
pub(crate) struct SrqObj {
    pub c: ibv_srq,
    pub srq: Srq,
    pub pd: *mut PdObj,
    pub users: AtomicU32,
}

#[repr(C)]
pub(crate) struct QpObj {
    /// An `ibv_qp_ex`, which begins with the `ibv_qp`.
    pub c: ibv_qp_ex,
    pub qp: Qp,
    pub pd: *mut PdObj,
    pub send_cq: *mut CqObj,
    pub recv_cq: *mut CqObj,
    pub srq: *mut SrqObj,
    pub sq_sig_all: bool,
    pub wr: Mutex<WrBuilder>,
}

/// The context of a C object's `context` pointer.
///
/// # Safety
/// `ctx` must be an open context of this library.
pub(crate) unsafe fn ctx<'a>(ctx: *mut ibv_context) -> &'a Context {
    // Safety: per the contract.
    unsafe { Context::from_c(ctx) }
}

fn boxed<T>(value: T) -> *mut T {
    Box::into_raw(Box::new(value))
}

// ---------------------------------------------------------------------------------------
// PD

xroce_abi_export::c_export! { "IBVERBS_1.1";
    /// `ibv_alloc_pd`.
    pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
        if context.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // Safety: an open context (contract).
        let c = unsafe { ctx(context) };
        let pd = match c.device().and_then(|d| d.alloc_pd()) {
            Ok(pd) => pd,
            Err(e) => return fail_ptr("ibv_alloc_pd", &e),
        };
        let handle = pd.id().0;
        boxed(PdObj { c: ibv_pd { context, handle }, pd, users: AtomicU32::new(0) }) as *mut ibv_pd
    }

    /// `ibv_dealloc_pd`: `EBUSY` while objects use it.
    pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
        if pd.is_null() {
            return libc::EINVAL;
        }
        let obj = pd as *mut PdObj;
        // Safety: a PD of ours, not yet freed (contract).
        if unsafe { (*obj).users.load(Ordering::SeqCst) } > 0 {
            return libc::EBUSY;
        }
        // Safety: as above; boxed by ibv_alloc_pd.
        drop(unsafe { Box::from_raw(obj) });
        0
    }
}

// ---------------------------------------------------------------------------------------
// MR

/// Registers `length` bytes at `addr` of the program's memory, at `iova`.
///
/// # Safety
/// `pd` is a PD of ours; `addr..addr+length` is the caller's memory, which it keeps mapped
/// until the region is deregistered (the contract of `ibv_reg_mr`).
unsafe fn reg_mr_at(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    if pd.is_null() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    let pd_obj = pd as *mut PdObj;
    let access = match access_from_c(access) {
        Ok(a) => a,
        Err(e) => return fail_ptr("ibv_reg_mr", &e),
    };
    // Safety: the caller's contract is UserMemory::new's: the bytes stay valid until the
    // region (which owns this handle) is deregistered.
    let memory = match unsafe { UserMemory::new(addr as *mut u8, length) } {
        Ok(m) => m,
        Err(e) => return fail_ptr("ibv_reg_mr", &VerbsError::InvalidArgument(e.to_string())),
    };
    // Safety: a PD of ours.
    let pdr = unsafe { &*pd_obj };
    let mr = match pdr.pd.reg_user_mr_at(memory, access, iova) {
        Ok(mr) => mr,
        Err(e) => return fail_ptr("ibv_reg_mr", &e),
    };
    pdr.users.fetch_add(1, Ordering::SeqCst);
    let c = ibv_mr {
        context: pdr.c.context,
        pd,
        addr,
        length,
        handle: mr.lkey(),
        lkey: mr.lkey(),
        rkey: mr.rkey(),
    };
    boxed(MrObj { c, mr, pd: pd_obj }) as *mut ibv_mr
}

xroce_abi_export::c_export! { "IBVERBS_1.1";
    /// `ibv_reg_mr`: the region sits at the buffer's address.
    pub unsafe extern "C" fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr {
        // Safety: ibv_reg_mr's contract.
        unsafe { reg_mr_at(pd, addr, length, addr as u64, access as u32) }
    }

    /// `ibv_dereg_mr`: `EBUSY` while memory windows are bound to it.
    pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
        if mr.is_null() {
            return libc::EINVAL;
        }
        let obj = mr as *mut MrObj;
        // Safety: an MR of ours, not yet freed.
        let o = unsafe { &*obj };
        match o.mr.bound_windows() {
            Ok(0) => {}
            Ok(_) => return libc::EBUSY,
            Err(e) => return fail_int("ibv_dereg_mr", &e),
        }
        // Safety: the PD outlives its MRs (dealloc_pd refuses while users > 0).
        unsafe { (*o.pd).users.fetch_sub(1, Ordering::SeqCst) };
        // Safety: boxed by reg_mr_at.
        drop(unsafe { Box::from_raw(obj) });
        0
    }

    /// `ibv_rereg_mr`: new memory (`IBV_REREG_MR_CHANGE_TRANSLATION`), PD or access.
    pub unsafe extern "C" fn ibv_rereg_mr(
        mr: *mut ibv_mr,
        flags: c_int,
        pd: *mut ibv_pd,
        addr: *mut c_void,
        length: usize,
        access: c_int,
    ) -> c_int {
        const CHANGE_TRANSLATION: c_int = 1;
        const CHANGE_PD: c_int = 2;
        const CHANGE_ACCESS: c_int = 4;
        // rdma-core's enum ibv_rereg_mr_err_code: IBV_REREG_MR_ERR_INPUT = -1.
        const ERR_INPUT: c_int = -1;
        if mr.is_null() || flags == 0 || flags & !7 != 0 {
            set_errno(libc::EINVAL);
            return ERR_INPUT;
        }
        let obj = mr as *mut MrObj;
        // Safety: an MR of ours.
        let o = unsafe { &mut *obj };
        let new_pd = if flags & CHANGE_PD != 0 {
            if pd.is_null() {
                set_errno(libc::EINVAL);
                return ERR_INPUT;
            }
            Some(pd as *mut PdObj)
        } else {
            None
        };
        let new_access = if flags & CHANGE_ACCESS != 0 {
            match access_from_c(access as u32) {
                Ok(a) => Some(a),
                Err(e) => {
                    set_errno(fail_int("ibv_rereg_mr", &e));
                    return ERR_INPUT;
                }
            }
        } else {
            None
        };
        let memory = if flags & CHANGE_TRANSLATION != 0 {
            // Safety: ibv_rereg_mr's contract, as for ibv_reg_mr.
            match unsafe { UserMemory::new(addr as *mut u8, length) } {
                Ok(m) => Some(xroce::verbs::MrMemory::User(m)),
                Err(e) => {
                    set_errno(fail_int("ibv_rereg_mr", &VerbsError::InvalidArgument(e.to_string())));
                    return ERR_INPUT;
                }
            }
        } else {
            None
        };
        // Safety: PDs of ours.
        let pd_ref = new_pd.map(|p| unsafe { &(*p).pd });
        let change = MrRereg { memory, pd: pd_ref, access: new_access };
        let iova = (flags & CHANGE_TRANSLATION != 0).then_some(addr as u64);
        if let Err(e) = o.mr.rereg_at(&change, iova) {
            set_errno(fail_int("ibv_rereg_mr", &e));
            return ERR_INPUT;
        }
        if let Some(p) = new_pd {
            // Safety: both PDs are ours and alive (the old one has this MR as a user).
            unsafe {
                (*o.pd).users.fetch_sub(1, Ordering::SeqCst);
                (*p).users.fetch_add(1, Ordering::SeqCst);
            }
            o.pd = p;
            o.c.pd = pd;
        }
        if flags & CHANGE_TRANSLATION != 0 {
            o.c.addr = addr;
            o.c.length = length;
        }
        0
    }
}

xroce_abi_export::c_export! { "IBVERBS_1.8";
    /// `ibv_reg_mr_iova2`: the region's addresses start at `iova` (perftest uses it always).
    pub unsafe extern "C" fn ibv_reg_mr_iova2(pd: *mut ibv_pd, addr: *mut c_void, length: usize, iova: u64, access: u32) -> *mut ibv_mr {
        // Safety: ibv_reg_mr's contract.
        unsafe { reg_mr_at(pd, addr, length, iova, access) }
    }
}

xroce_abi_export::c_export! { "IBVERBS_1.1";
    /// `ibv_reg_mr_iova` (older entry point of the same).
    pub unsafe extern "C" fn ibv_reg_mr_iova(pd: *mut ibv_pd, addr: *mut c_void, length: usize, iova: u64, access: c_int) -> *mut ibv_mr {
        // Safety: ibv_reg_mr's contract.
        unsafe { reg_mr_at(pd, addr, length, iova, access as u32) }
    }
}

// ---------------------------------------------------------------------------------------
// MW (through ops: alloc_mw / dealloc_mw)

/// `ops.alloc_mw`.
pub(crate) unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, mw_type: u32) -> *mut ibv_mw {
    if pd.is_null() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    let kind = match mw_type {
        1 => MwType::Type1,
        2 => MwType::Type2,
        _ => {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
    };
    let pd_obj = pd as *mut PdObj;
    // Safety: a PD of ours.
    let pdr = unsafe { &*pd_obj };
    let mw = match pdr.pd.alloc_mw(kind) {
        Ok(mw) => mw,
        Err(e) => return fail_ptr("ibv_alloc_mw", &e),
    };
    let rkey = mw.rkey().unwrap_or(0);
    pdr.users.fetch_add(1, Ordering::SeqCst);
    let c = ibv_mw {
        context: pdr.c.context,
        pd,
        rkey,
        handle: rkey >> 8,
        type_: mw_type,
    };
    boxed(MwObj { c, mw, pd: pd_obj }) as *mut ibv_mw
}

/// `ops.dealloc_mw`.
pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    if mw.is_null() {
        return libc::EINVAL;
    }
    let obj = mw as *mut MwObj;
    // Safety: a window of ours; its PD outlives it.
    unsafe { (*(*obj).pd).users.fetch_sub(1, Ordering::SeqCst) };
    // Safety: boxed by alloc_mw.
    drop(unsafe { Box::from_raw(obj) });
    0
}

// ---------------------------------------------------------------------------------------
// AH

pub(crate) fn ah_attr_from_c(c: &ibv_ah_attr) -> Result<AhAttr, VerbsError> {
    AhAttr::try_from(*c).map_err(|_| {
        VerbsError::InvalidArgument(
            "address without a GRH (is_global = 0): RoCE addresses peers by GID; set \
             is_global and grh.dgid"
                .into(),
        )
    })
}

/// `ibv_create_ah` (also for `ibv_create_ah_from_wc`).
///
/// # Safety
/// `pd` null or a PD of ours; `attr` null or valid.
pub(crate) unsafe fn create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    if pd.is_null() || attr.is_null() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    let pd_obj = pd as *mut PdObj;
    // Safety: a PD of ours; attr is valid (contract).
    let (pdr, attr) = unsafe { (&*pd_obj, &*attr) };
    let ah = match ah_attr_from_c(attr).and_then(|a| pdr.pd.create_ah(&a)) {
        Ok(ah) => ah,
        Err(e) => return fail_ptr("ibv_create_ah", &e),
    };
    pdr.users.fetch_add(1, Ordering::SeqCst);
    boxed(AhObj {
        c: ibv_ah {
            context: pdr.c.context,
            pd,
            handle: 0,
        },
        ah,
        pd: pd_obj,
    }) as *mut ibv_ah
}

xroce_abi_export::c_export! { "IBVERBS_1.1";
    /// `ibv_create_ah`.
    pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
        // Safety: forwarded contract.
        unsafe { create_ah(pd, attr) }
    }

    /// `ibv_destroy_ah`.
    pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
        if ah.is_null() {
            return libc::EINVAL;
        }
        let obj = ah as *mut AhObj;
        // Safety: an AH of ours; its PD outlives it.
        unsafe { (*(*obj).pd).users.fetch_sub(1, Ordering::SeqCst) };
        // Safety: boxed by ibv_create_ah.
        drop(unsafe { Box::from_raw(obj) });
        0
    }
}

// ---------------------------------------------------------------------------------------
// Completion channel and CQ

xroce_abi_export::c_export! { "IBVERBS_1.0";
    /// `ibv_create_comp_channel`: `fd` is readable while an event is queued.
    pub unsafe extern "C" fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel {
        if context.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // Safety: an open context.
        let c = unsafe { ctx(context) };
        let ch = match c.device().and_then(|d| d.create_comp_channel()) {
            Ok(ch) => ch,
            Err(e) => return fail_ptr("ibv_create_comp_channel", &e),
        };
        use std::os::fd::AsRawFd;
        let fd = ch.as_raw_fd();
        boxed(ChannelObj { c: ibv_comp_channel { context, fd, refcnt: 0 }, ch }) as *mut ibv_comp_channel
    }

    /// `ibv_destroy_comp_channel`: `EBUSY` while CQs use it.
    pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
        if channel.is_null() {
            return libc::EINVAL;
        }
        // Safety: a channel of ours.
        if unsafe { (*channel).refcnt } > 0 {
            return libc::EBUSY;
        }
        // Safety: boxed by ibv_create_comp_channel.
        drop(unsafe { Box::from_raw(channel as *mut ChannelObj) });
        0
    }
}

/// Creates a CQ object (both `ibv_create_cq` and `ibv_create_cq_ex`).
///
/// # Safety
/// `context` is an open context; `channel` null or a channel of ours.
pub(crate) unsafe fn create_cq_obj(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: u32,
    call: &str,
) -> *mut CqObj {
    // One completion vector (num_comp_vectors is 1).
    if context.is_null() || cqe <= 0 || comp_vector != 0 {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // Safety: an open context.
    let c = unsafe { ctx(context) };
    // Safety: a channel of ours or null.
    let ch = (!channel.is_null()).then(|| unsafe { &(*(channel as *mut ChannelObj)).ch });
    let cq = match c.device().and_then(|d| d.create_cq(cqe as u32, ch)) {
        Ok(cq) => cq,
        Err(e) => return fail_ptr(call, &e),
    };
    if !channel.is_null() {
        // Safety: a channel of ours.
        unsafe { (*channel).refcnt += 1 };
    }
    let depth = cq.depth() as c_int;
    let id = cq.id();
    let c_cq = super::datapath::cq_ex_struct(context, channel, cq_context, id.0, depth);
    let obj = boxed(CqObj {
        c: c_cq,
        cq,
        users: AtomicU32::new(0),
        poll: Mutex::new(CqPoll::default()),
    });
    lock(&c.registry).cqs.insert(id, RawObj::of(obj));
    obj
}

xroce_abi_export::c_export! { "IBVERBS_1.1";
    /// `ibv_create_cq`.
    pub unsafe extern "C" fn ibv_create_cq(
        context: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: c_int,
    ) -> *mut ibv_cq {
        // Safety: forwarded contract.
        unsafe {
            create_cq_obj(context, cqe, cq_context, channel, comp_vector as u32, "ibv_create_cq")
                as *mut ibv_cq
        }
    }

    /// `ibv_destroy_cq`: `EBUSY` while QPs use it.
    pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
        if cq.is_null() {
            return libc::EINVAL;
        }
        let obj = cq as *mut CqObj;
        // Safety: a CQ of ours.
        let o = unsafe { &*obj };
        if o.users.load(Ordering::SeqCst) > 0 {
            return libc::EBUSY;
        }
        // Safety: its context is open (contexts outlive their objects).
        let c = unsafe { ctx(o.c.cq.context) };
        lock(&c.registry).cqs.remove(&o.cq.id());
        if !o.c.cq.channel.is_null() {
            // Safety: the channel outlives its CQs (destroy refuses while refcnt > 0).
            unsafe { (*o.c.cq.channel).refcnt -= 1 };
        }
        // Safety: boxed by create_cq_obj.
        drop(unsafe { Box::from_raw(obj) });
        0
    }

    /// `ibv_resize_cq`.
    pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
        if cq.is_null() || cqe <= 0 {
            return libc::EINVAL;
        }
        let obj = cq as *mut CqObj;
        // Safety: a CQ of ours.
        let o = unsafe { &mut *obj };
        match o.cq.resize(cqe as u32) {
            Ok(()) => {
                o.c.cq.cqe = o.cq.depth() as c_int;
                0
            }
            Err(e) => fail_int("ibv_resize_cq", &e),
        }
    }
}

// ---------------------------------------------------------------------------------------
// SRQ

/// Creates an SRQ object.
///
/// # Safety
/// `pd` is a PD of ours; `attr` valid.
pub(crate) unsafe fn create_srq_obj(
    pd: *mut ibv_pd,
    srq_context: *mut c_void,
    attr: *mut ibv_srq_attr,
) -> *mut ibv_srq {
    if pd.is_null() || attr.is_null() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    let pd_obj = pd as *mut PdObj;
    // Safety: per the contract.
    let (pdr, a) = unsafe { (&*pd_obj, &mut *attr) };
    let want = SrqAttr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    };
    let srq = match pdr.pd.create_srq(&want) {
        Ok(s) => s,
        Err(e) => return fail_ptr("ibv_create_srq", &e),
    };
    if let Ok(got) = srq.query() {
        a.max_wr = got.max_wr;
        a.max_sge = got.max_sge;
    }
    pdr.users.fetch_add(1, Ordering::SeqCst);
    let id = srq.id();
    let c = ibv_srq {
        context: pdr.c.context,
        srq_context,
        pd,
        handle: id.0,
        mutex: Default::default(),
        cond: Default::default(),
        events_completed: 0,
    };
    let obj = boxed(SrqObj {
        c,
        srq,
        pd: pd_obj,
        users: AtomicU32::new(0),
    });
    // Safety: the PD's context is open.
    let context = unsafe { ctx(pdr.c.context) };
    lock(&context.registry).srqs.insert(id, RawObj::of(obj));
    obj as *mut ibv_srq
}

xroce_abi_export::c_export! { "IBVERBS_1.1";
    /// `ibv_create_srq`.
    pub unsafe extern "C" fn ibv_create_srq(pd: *mut ibv_pd, init: *mut ibv_srq_init_attr) -> *mut ibv_srq {
        if init.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // Safety: forwarded contract; init is valid.
        unsafe { create_srq_obj(pd, (*init).srq_context, &mut (*init).attr) }
    }

    /// `ibv_modify_srq`: `IBV_SRQ_MAX_WR` (1) resizes, `IBV_SRQ_LIMIT` (2) arms.
    pub unsafe extern "C" fn ibv_modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
        if srq.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        // Safety: an SRQ of ours; attr valid.
        let (o, a) = unsafe { (&*(srq as *mut SrqObj), &*attr) };
        let Some(mask) = SrqAttrMask::from_bits(mask as u32) else {
            return libc::EINVAL;
        };
        let want = SrqAttr { max_wr: a.max_wr, max_sge: a.max_sge, srq_limit: a.srq_limit };
        match o.srq.modify(&want, mask) {
            Ok(()) => 0,
            Err(e) => fail_int("ibv_modify_srq", &e),
        }
    }

    /// `ibv_query_srq`.
    pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
        if srq.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        // Safety: an SRQ of ours.
        let o = unsafe { &*(srq as *mut SrqObj) };
        match o.srq.query() {
            Ok(got) => {
                // Safety: attr is a valid out-pointer.
                unsafe {
                    *attr = ibv_srq_attr { max_wr: got.max_wr, max_sge: got.max_sge, srq_limit: got.srq_limit }
                };
                0
            }
            Err(e) => fail_int("ibv_query_srq", &e),
        }
    }

    /// `ibv_destroy_srq`: `EBUSY` while QPs use it.
    pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
        if srq.is_null() {
            return libc::EINVAL;
        }
        let obj = srq as *mut SrqObj;
        // Safety: an SRQ of ours.
        let o = unsafe { &*obj };
        if o.users.load(Ordering::SeqCst) > 0 {
            return libc::EBUSY;
        }
        // Safety: the context and PD outlive it.
        unsafe {
            lock(&ctx(o.c.context).registry).srqs.remove(&o.srq.id());
            (*o.pd).users.fetch_sub(1, Ordering::SeqCst);
        }
        // Safety: boxed by create_srq_obj.
        drop(unsafe { Box::from_raw(obj) });
        0
    }
}

// ---------------------------------------------------------------------------------------
// QP

fn qp_type_from_c(t: u32) -> Result<QpType, VerbsError> {
    match t {
        IBV_QPT_RC => Ok(QpType::Rc),
        IBV_QPT_UC => Ok(QpType::Uc),
        IBV_QPT_UD => Ok(QpType::Ud),
        other => Err(VerbsError::Unsupported(format!(
            "QP type {other}: xroce has RC (2), UC (3) and UD (4) QPs (no raw packet, XRC or \
             driver QPs)"
        ))),
    }
}

/// The arguments shared by `ibv_create_qp` and `ibv_create_qp_ex`.
pub(crate) struct CreateQp {
    pub pd: *mut ibv_pd,
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: *mut ibv_qp_cap,
    pub qp_type: u32,
    pub sq_sig_all: bool,
}

impl CreateQp {
    /// The arguments of `ibv_create_qp`-style calls: `pd` and the fields of `init` (its
    /// `cap` is written back with what the QP got).
    pub(crate) fn from_init(pd: *mut ibv_pd, init: &mut ibv_qp_init_attr) -> CreateQp {
        CreateQp {
            pd,
            qp_context: init.qp_context,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            cap: &mut init.cap,
            qp_type: init.qp_type,
            sq_sig_all: init.sq_sig_all != 0,
        }
    }
}

/// Creates a QP object.
///
/// # Safety
/// Every pointer in `args` is null or an object of this library; `cap` is valid.
pub(crate) unsafe fn create_qp_obj(args: CreateQp, call: &str) -> *mut ibv_qp {
    // The type first: a QP type xroce lacks is EOPNOTSUPP whatever else is asked.
    let qp_type = match qp_type_from_c(args.qp_type) {
        Ok(t) => t,
        Err(e) => return fail_ptr(call, &e),
    };
    if args.pd.is_null() || args.send_cq.is_null() || args.recv_cq.is_null() || args.cap.is_null() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    let pd_obj = args.pd as *mut PdObj;
    let (scq, rcq) = (args.send_cq as *mut CqObj, args.recv_cq as *mut CqObj);
    let srq_obj = args.srq as *mut SrqObj;
    // Safety: per the contract.
    let (pdr, s, r, cap) = unsafe { (&*pd_obj, &*scq, &*rcq, &mut *args.cap) };
    // Safety: per the contract.
    let srq = (!srq_obj.is_null()).then(|| unsafe { &(*srq_obj).srq });
    let init = QpInitAttr {
        qp_type,
        send_cq: &s.cq,
        recv_cq: &r.cq,
        cap: QpCaps {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            max_inline_data: cap.max_inline_data,
        },
        sq_sig_all: args.sq_sig_all,
        srq,
    };
    let qp = match pdr.pd.create_qp(&init) {
        Ok(qp) => qp,
        Err(e) => return fail_ptr(call, &e),
    };
    if let Ok((_, granted)) = qp.query() {
        cap.max_send_wr = granted.max_send_wr;
        cap.max_recv_wr = granted.max_recv_wr;
        cap.max_send_sge = granted.max_send_sge;
        cap.max_recv_sge = granted.max_recv_sge;
        cap.max_inline_data = granted.max_inline_data;
    }
    pdr.users.fetch_add(1, Ordering::SeqCst);
    s.users.fetch_add(1, Ordering::SeqCst);
    r.users.fetch_add(1, Ordering::SeqCst);
    if !srq_obj.is_null() {
        // Safety: per the contract.
        unsafe { (*srq_obj).users.fetch_add(1, Ordering::SeqCst) };
    }
    let qp_num = qp.qp_num();
    let c = super::datapath::qp_ex_struct(super::datapath::QpStructArgs {
        context: pdr.c.context,
        qp_context: args.qp_context,
        pd: args.pd,
        send_cq: args.send_cq,
        recv_cq: args.recv_cq,
        srq: args.srq,
        qp_num,
        qp_type: args.qp_type,
    });
    let obj = boxed(QpObj {
        c,
        qp,
        pd: pd_obj,
        send_cq: scq,
        recv_cq: rcq,
        srq: srq_obj,
        sq_sig_all: args.sq_sig_all,
        wr: Mutex::new(WrBuilder::default()),
    });
    // Safety: the PD's context is open.
    let context = unsafe { ctx(pdr.c.context) };
    lock(&context.registry).qps.insert(qp_num, RawObj::of(obj));
    obj as *mut ibv_qp
}

xroce_abi_export::c_export! { "IBVERBS_1.1";
    /// `ibv_create_qp`.
    pub unsafe extern "C" fn ibv_create_qp(pd: *mut ibv_pd, init: *mut ibv_qp_init_attr) -> *mut ibv_qp {
        if init.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // Safety: init is valid (contract).
        let i = unsafe { &mut *init };
        let args = CreateQp::from_init(pd, i);
        // Safety: forwarded contract.
        unsafe { create_qp_obj(args, "ibv_create_qp") }
    }

    /// `ibv_destroy_qp`.
    pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
        if qp.is_null() {
            return libc::EINVAL;
        }
        let obj = qp as *mut QpObj;
        // Safety: a QP of ours; the objects it uses outlive it (their destroy refuses).
        unsafe {
            let o = &*obj;
            lock(&ctx(o.c.qp_base.context).registry).qps.remove(&o.qp.qp_num());
            (*o.pd).users.fetch_sub(1, Ordering::SeqCst);
            (*o.send_cq).users.fetch_sub(1, Ordering::SeqCst);
            (*o.recv_cq).users.fetch_sub(1, Ordering::SeqCst);
            if !o.srq.is_null() {
                (*o.srq).users.fetch_sub(1, Ordering::SeqCst);
            }
        }
        // Safety: boxed by create_qp_obj.
        drop(unsafe { Box::from_raw(obj) });
        0
    }

    /// `ibv_modify_qp`.
    pub unsafe extern "C" fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
        if qp.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        let obj = qp as *mut QpObj;
        // Safety: a QP of ours; attr valid.
        let (o, a) = unsafe { (&mut *obj, &*attr) };
        let Some(mask) = QpAttrMask::from_bits(mask as u32) else {
            return fail_int(
                "ibv_modify_qp",
                &VerbsError::InvalidArgument(format!("attribute mask {mask:#x}: unknown bits")),
            );
        };
        // Safety: the QP's context is open.
        let device = match unsafe { ctx(o.c.qp_base.context) }.device() {
            Ok(d) => d,
            Err(e) => return fail_int("ibv_modify_qp", &e),
        };
        let attr = match qp_attr_from_c(a, mask, device) {
            Ok(x) => x,
            Err(e) => return fail_int("ibv_modify_qp", &e),
        };
        match o.qp.modify(&attr, mask) {
            Ok(()) => {
                if mask.contains(QpAttrMask::STATE) {
                    o.c.qp_base.state = ibv_qp_state::from(attr.qp_state).0;
                }
                0
            }
            Err(e) => fail_int("ibv_modify_qp", &e),
        }
    }

    /// `ibv_query_qp`.
    pub unsafe extern "C" fn ibv_query_qp(
        qp: *mut ibv_qp,
        attr: *mut ibv_qp_attr,
        _mask: c_int,
        init: *mut ibv_qp_init_attr,
    ) -> c_int {
        if qp.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        let obj = qp as *mut QpObj;
        // Safety: a QP of ours.
        let o = unsafe { &mut *obj };
        let (got, caps) = match o.qp.query() {
            Ok(x) => x,
            Err(e) => return fail_int("ibv_query_qp", &e),
        };
        let c = qp_attr_to_c(&got, &caps);
        o.c.qp_base.state = c.qp_state.0;
        // Safety: attr is a valid out-pointer.
        unsafe { *attr = c };
        if !init.is_null() {
            // Safety: init is a valid out-pointer.
            unsafe {
                *init = ibv_qp_init_attr {
                    qp_context: o.c.qp_base.qp_context,
                    send_cq: o.c.qp_base.send_cq,
                    recv_cq: o.c.qp_base.recv_cq,
                    srq: o.c.qp_base.srq,
                    cap: c.cap,
                    qp_type: o.c.qp_base.qp_type,
                    sq_sig_all: o.sq_sig_all as c_int,
                }
            };
        }
        0
    }
}

fn qp_attr_from_c(
    a: &ibv_qp_attr,
    mask: QpAttrMask,
    device: &xroce::verbs::Device,
) -> Result<QpAttr, VerbsError> {
    let mut attr = QpAttr::default();
    let state = |s: ibv_qp_state, what: &str| {
        QpState::try_from(s)
            .map_err(|v| VerbsError::InvalidArgument(format!("{what} {}: not a QP state", v.0)))
    };
    if mask.contains(QpAttrMask::STATE) {
        attr.qp_state = state(a.qp_state, "qp_state")?;
    }
    if mask.contains(QpAttrMask::CUR_STATE) {
        attr.cur_qp_state = state(a.cur_qp_state, "cur_qp_state")?;
    }
    if mask.contains(QpAttrMask::PATH_MTU) {
        attr.path_mtu = xroce::engine::Mtu::try_from(a.path_mtu)
            .map_err(|m| VerbsError::InvalidArgument(format!("path_mtu {}: not an IB MTU", m.0)))?;
    }
    attr.qkey = a.qkey;
    attr.rq_psn = a.rq_psn;
    attr.sq_psn = a.sq_psn;
    attr.dest_qp_num = a.dest_qp_num;
    if mask.contains(QpAttrMask::ACCESS_FLAGS) {
        attr.qp_access_flags = access_from_c(a.qp_access_flags)?;
    }
    if mask.contains(QpAttrMask::AV) {
        let ah = ah_attr_from_c(&a.ah_attr)?;
        attr.ah_attr = Some(device.resolve_av(&ah)?);
    }
    attr.pkey_index = a.pkey_index;
    attr.port_num = a.port_num;
    attr.timeout = a.timeout;
    attr.retry_cnt = a.retry_cnt;
    attr.rnr_retry = a.rnr_retry;
    attr.min_rnr_timer = a.min_rnr_timer;
    attr.max_rd_atomic = a.max_rd_atomic;
    attr.max_dest_rd_atomic = a.max_dest_rd_atomic;
    attr.en_sqd_async_notify = a.en_sqd_async_notify != 0;
    Ok(attr)
}

pub(crate) fn qp_attr_to_c(q: &QpAttr, caps: &QpCaps) -> ibv_qp_attr {
    let mut c = ibv_qp_attr {
        qp_state: q.qp_state.into(),
        cur_qp_state: q.qp_state.into(),
        path_mtu: ibv_mtu::from(q.path_mtu),
        path_mig_state: ibv_mig_state::MIGRATED,
        qkey: q.qkey,
        rq_psn: q.rq_psn,
        sq_psn: q.sq_psn,
        dest_qp_num: q.dest_qp_num,
        qp_access_flags: q.qp_access_flags.bits(),
        cap: ibv_qp_cap {
            max_send_wr: caps.max_send_wr,
            max_recv_wr: caps.max_recv_wr,
            max_send_sge: caps.max_send_sge,
            max_recv_sge: caps.max_recv_sge,
            max_inline_data: caps.max_inline_data,
        },
        pkey_index: q.pkey_index,
        port_num: q.port_num,
        timeout: q.timeout,
        retry_cnt: q.retry_cnt,
        rnr_retry: q.rnr_retry,
        min_rnr_timer: q.min_rnr_timer,
        max_rd_atomic: q.max_rd_atomic,
        max_dest_rd_atomic: q.max_dest_rd_atomic,
        en_sqd_async_notify: q.en_sqd_async_notify as u8,
        ..Default::default()
    };
    if let Some(av) = &q.ah_attr {
        c.ah_attr.is_global = 1;
        c.ah_attr.port_num = 1;
        c.ah_attr.grh.dgid = xroce::netdev::Gid::from_ip(av.dest_ip).into();
        c.ah_attr.grh.sgid_index = av.sgid_index;
        c.ah_attr.grh.hop_limit = av.hop_limit;
        c.ah_attr.grh.traffic_class = av.traffic_class;
        c.ah_attr.grh.flow_label = av.flow_label;
    }
    c
}

/// The create arguments of `ibv_create_qp_ex`.
///
/// # Safety
/// `init` is valid.
pub(crate) unsafe fn create_qp_ex_args(init: *mut ibv_qp_init_attr_ex) -> Result<CreateQp, c_int> {
    // Safety: per the contract.
    let i = unsafe { &mut *init };
    const PD: u32 = 1;
    const CREATE_FLAGS: u32 = 1 << 2;
    const SEND_OPS_FLAGS: u32 = 1 << 6;
    if i.comp_mask & PD == 0 || i.comp_mask & !(PD | CREATE_FLAGS | SEND_OPS_FLAGS) != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    if i.comp_mask & CREATE_FLAGS != 0 && i.create_flags != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    // IBV_QP_EX_WITH_*: everything but TSO (1 << 10) and atomic write (1 << 12).
    if i.comp_mask & SEND_OPS_FLAGS != 0 && i.send_ops_flags & !0x3ff != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    Ok(CreateQp {
        pd: i.pd,
        qp_context: i.qp_context,
        send_cq: i.send_cq,
        recv_cq: i.recv_cq,
        srq: i.srq,
        cap: &mut i.cap,
        qp_type: i.qp_type,
        sq_sig_all: i.sq_sig_all != 0,
    })
}

/// `ibv_qp_to_qp_ex`: every QP of this library is an `ibv_qp_ex`.
pub(crate) fn qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    qp as *mut ibv_qp_ex
}

xroce_abi_export::c_export! { "IBVERBS_1.6";
    /// `ibv_qp_to_qp_ex`.
    pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
        qp_to_qp_ex(qp)
    }
}
