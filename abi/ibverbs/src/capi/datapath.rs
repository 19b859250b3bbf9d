//! The data path: `post_send`, `post_recv`, `post_srq_recv`, `poll_cq`, `req_notify_cq` and
//! `bind_mw` (called inline through `ibv_context::ops`), the `wr_*` work-request interface of
//! `ibv_qp_ex`, and the `start_poll`/`next_poll`/`read_*` interface of `ibv_cq_ex`.
//!
//! No system call happens here: each call runs on the verbs layer, whose poller makes the
//! progress (a thread polling a CQ drives the engine itself; the background thread covers the
//! rest).

use std::ffi::{c_int, c_uint, c_void};

use xroce::engine::{MwBindInfo, SendFlags, SendWr, SendWrRef, Sge, UdDest, Wc, WrOp};
use xroce::verbs::VerbsError;

use super::errors::errno_of;
use super::resources::{access_from_c, AhObj, CqObj, MrObj, MwObj, QpObj, SrqObj};
use super::{errors, lock};
use crate::objects::{
    ibv_ah, ibv_comp_channel, ibv_context, ibv_cq, ibv_cq_ex, ibv_data_buf, ibv_mw, ibv_mw_bind,
    ibv_mw_bind_info, ibv_pd, ibv_poll_cq_attr, ibv_qp, ibv_qp_ex, ibv_recv_wr, ibv_send_wr,
    ibv_srq,
};
use crate::structs::{ibv_sge, ibv_wc};

// `enum ibv_wr_opcode`.
const IBV_WR_RDMA_WRITE: u32 = 0;
const IBV_WR_RDMA_WRITE_WITH_IMM: u32 = 1;
const IBV_WR_SEND: u32 = 2;
const IBV_WR_SEND_WITH_IMM: u32 = 3;
const IBV_WR_RDMA_READ: u32 = 4;
const IBV_WR_ATOMIC_CMP_AND_SWP: u32 = 5;
const IBV_WR_ATOMIC_FETCH_AND_ADD: u32 = 6;
const IBV_WR_LOCAL_INV: u32 = 7;
const IBV_WR_BIND_MW: u32 = 8;
const IBV_WR_SEND_WITH_INV: u32 = 9;

/// `IBV_SEND_INLINE`.
const IBV_SEND_INLINE: u32 = 8;
/// The send flags xroce knows (FENCE, SIGNALED, SOLICITED, INLINE); IP_CSUM is for raw
/// packet QPs only.
const SEND_FLAGS_KNOWN: u32 = 0xf;

/// Completions copied per call into the verbs layer.
const POLL_CHUNK: usize = 16;

fn invalid(text: String) -> VerbsError {
    VerbsError::InvalidArgument(text)
}

/// The gather/scatter list of a C work request, checked: `num_sge` not negative, a list
/// behind a non-zero count.
///
/// # Safety
/// `sg_list` holds `num_sge` entries (or `num_sge` is 0), valid for `'a`.
unsafe fn c_sges<'a>(sg_list: *const ibv_sge, num_sge: c_int) -> Result<&'a [ibv_sge], VerbsError> {
    if num_sge < 0 {
        return Err(invalid(format!("num_sge {num_sge} is negative")));
    }
    if num_sge == 0 {
        return Ok(&[]);
    }
    if sg_list.is_null() {
        return Err(invalid(format!("num_sge {num_sge} with a null sg_list")));
    }
    // Safety: per the contract.
    Ok(unsafe { std::slice::from_raw_parts(sg_list, num_sge as usize) })
}

fn sge_of(s: &ibv_sge) -> Sge {
    Sge {
        addr: s.addr,
        length: s.length,
        lkey: s.lkey,
    }
}

/// The gather/scatter list of a C work request, copied.
///
/// # Safety
/// As [`c_sges`].
unsafe fn sges_from_c(sg_list: *const ibv_sge, num_sge: c_int) -> Result<Vec<Sge>, VerbsError> {
    // Safety: per the contract.
    Ok(unsafe { c_sges(sg_list, num_sge) }?
        .iter()
        .map(sge_of)
        .collect())
}

/// A C work request's SGE list, copied onto the stack when it fits (always, up to the
/// device's `max_sge`): no allocation per WR. A longer list (which the engine refuses
/// with its own error) goes to the heap.
// Large on purpose: it lives on the stack, and boxing it is the allocation it avoids.
#[allow(clippy::large_enum_variant)]
enum SgeList {
    Stack([Sge; SgeList::STACK], usize),
    Heap(Vec<Sge>),
}

impl SgeList {
    const STACK: usize = xroce::engine::limits::MAX_SGE as usize;

    fn as_slice(&self) -> &[Sge] {
        match self {
            SgeList::Stack(sges, len) => &sges[..*len],
            SgeList::Heap(sges) => sges,
        }
    }

    /// # Safety
    /// As [`c_sges`].
    unsafe fn from_c(sg_list: *const ibv_sge, num_sge: c_int) -> Result<SgeList, VerbsError> {
        // Safety: per the contract.
        let list = unsafe { c_sges(sg_list, num_sge) }?;
        if list.len() > SgeList::STACK {
            return Ok(SgeList::Heap(list.iter().map(sge_of).collect()));
        }
        let mut sges = [Sge {
            addr: 0,
            length: 0,
            lkey: 0,
        }; SgeList::STACK];
        for (to, from) in sges.iter_mut().zip(list) {
            *to = sge_of(from);
        }
        Ok(SgeList::Stack(sges, list.len()))
    }
}

/// A C send WR translated, its SGEs on the stack.
struct CSendWr {
    wr_id: u64,
    op: WrOp,
    flags: SendFlags,
    ud: Option<UdDest>,
    sges: SgeList,
}

impl CSendWr {
    fn borrowed(&self) -> SendWrRef<'_> {
        SendWrRef {
            wr_id: self.wr_id,
            op: self.op,
            sg_list: self.sges.as_slice(),
            flags: self.flags,
            ud: self.ud,
        }
    }
}

/// The bytes of an inline send: the program's memory the SGEs point at, copied now (the
/// lkeys are not checked, as libibverbs providers read inline data themselves).
///
/// # Safety
/// Each SGE names `length` readable bytes at `addr` (the contract of `IBV_SEND_INLINE`).
unsafe fn inline_bytes(sges: &[Sge]) -> Vec<u8> {
    let mut data = Vec::with_capacity(sges.iter().map(|s| s.length as usize).sum());
    for s in sges {
        if s.length == 0 {
            continue;
        }
        // Safety: per the contract.
        data.extend_from_slice(unsafe {
            std::slice::from_raw_parts(s.addr as *const u8, s.length as usize)
        });
    }
    data
}

/// The largest inline payload a QP takes (`max_inline_data`).
const INLINE_STACK: usize = xroce::engine::limits::MAX_INLINE_DATA as usize;

/// Copies the bytes of an inline send into `to` (at least their total length).
///
/// # Safety
/// As [`inline_bytes`].
unsafe fn copy_inline(sges: &[Sge], to: &mut [u8]) {
    let mut at = 0;
    for s in sges.iter().filter(|s| s.length > 0) {
        let len = s.length as usize;
        // Safety: per the contract.
        let from = unsafe { std::slice::from_raw_parts(s.addr as *const u8, len) };
        to[at..at + len].copy_from_slice(from);
        at += len;
    }
}

/// The verbs layer's send WR for a C one.
///
/// # Safety
/// `w` is a valid WR whose pointers (SGE list, MW, MR, and on a UD QP the AH) are valid or
/// objects of ours.
unsafe fn send_wr_from_c(w: &ibv_send_wr, is_ud: bool) -> Result<CSendWr, VerbsError> {
    if w.send_flags & !SEND_FLAGS_KNOWN != 0 {
        return Err(invalid(format!(
            "send_flags {:#x}: {:#x} not supported",
            w.send_flags,
            w.send_flags & !SEND_FLAGS_KNOWN
        )));
    }
    let flags = SendFlags::from_bits_truncate(w.send_flags);
    // Safety: union reads: the opcode says which member the program filled; every member
    // is plain integers or pointers, so reading another is still defined.
    let (rdma, atomic, ud) = unsafe { (w.wr.rdma, w.wr.atomic, w.wr.ud) };
    let op = match w.opcode {
        IBV_WR_SEND => WrOp::Send,
        IBV_WR_SEND_WITH_IMM => WrOp::SendWithImm {
            imm: u32::from_be(w.imm_data),
        },
        IBV_WR_SEND_WITH_INV => WrOp::SendWithInv { rkey: w.imm_data },
        IBV_WR_RDMA_WRITE => WrOp::Write {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        IBV_WR_RDMA_WRITE_WITH_IMM => WrOp::WriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
            imm: u32::from_be(w.imm_data),
        },
        IBV_WR_RDMA_READ => WrOp::Read {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        IBV_WR_ATOMIC_CMP_AND_SWP => WrOp::CompareSwap {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        IBV_WR_ATOMIC_FETCH_AND_ADD => WrOp::FetchAdd {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            add: atomic.compare_add,
        },
        IBV_WR_LOCAL_INV => WrOp::LocalInv { rkey: w.imm_data },
        IBV_WR_BIND_MW => {
            let b = w.bind_mw;
            if b.mw.is_null() {
                return Err(invalid("BIND_MW without a window".into()));
            }
            // Safety: a window of ours.
            let mw = unsafe { &*(b.mw as *mut MwObj) };
            WrOp::BindMw {
                mw: mw.mw.id(),
                rkey: b.rkey,
                // Safety: the bind info's MR is ours or null.
                bind: unsafe { bind_info_from_c(&b.bind_info) }?,
            }
        }
        other => {
            return Err(VerbsError::InvalidArgument(format!(
                "opcode {other}: not supported (TSO, atomic write and driver opcodes are not)"
            )))
        }
    };
    // Safety: per the contract.
    let sges = unsafe { SgeList::from_c(w.sg_list, w.num_sge) }?;
    // `wr.ud` shares its bytes with `wr.rdma`: only a UD QP's WR names an AH.
    let ud = if !is_ud {
        None
    } else if ud.ah.is_null() {
        return Err(invalid(
            "a UD send without an address handle (wr.ud.ah)".into(),
        ));
    } else {
        // Safety: an AH of ours.
        let ah = unsafe { &*(ud.ah as *mut AhObj) };
        Some(UdDest {
            av: ah.ah.av(),
            remote_qpn: ud.remote_qpn,
            remote_qkey: ud.remote_qkey,
        })
    };
    Ok(CSendWr {
        wr_id: w.wr_id,
        op,
        flags,
        ud,
        sges,
    })
}

/// # Safety
/// `info.mr` is null or an MR of ours.
unsafe fn bind_info_from_c(info: &ibv_mw_bind_info) -> Result<MwBindInfo, VerbsError> {
    let mr_lkey = if info.mr.is_null() {
        // A zero-length bind (unbind) names no region.
        0
    } else {
        // Safety: an MR of ours.
        unsafe { (*(info.mr as *mut MrObj)).c.lkey }
    };
    // A window grants remote rights only; programs (and pyverbs' tests) pass the region's
    // LOCAL_WRITE along, which rxe and the kernel ignore for a bind: so do we.
    const LOCAL_WRITE: u32 = 1;
    Ok(MwBindInfo {
        mr_lkey,
        addr: info.addr,
        length: info.length,
        access: access_from_c(info.mw_access_flags & !LOCAL_WRITE)?,
    })
}

/// `ops.post_send`: the whole chain under one engine lock, in one progress round.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // Safety: a QP of ours.
    let q = unsafe { &*(qp as *mut QpObj) };
    let is_ud = q.c.qp_base.qp_type == super::resources::IBV_QPT_UD;
    let mut cur = wr;
    let result = q.qp.post_send_chain(|post| {
        while !cur.is_null() {
            // Safety: the program's list of valid WRs.
            let w = unsafe { &*cur };
            // Safety: per the contract of post_send.
            let swr = unsafe { send_wr_from_c(w, is_ud) }?;
            let mut wr = swr.borrowed();
            if w.send_flags & IBV_SEND_INLINE != 0 {
                wr.flags.remove(SendFlags::INLINE);
                let len: usize = wr.sg_list.iter().map(|s| s.length as usize).sum();
                if len <= INLINE_STACK {
                    // Up to the device's max_inline_data: on the stack.
                    let mut data = [0u8; INLINE_STACK];
                    // Safety: inline SGEs name the program's readable memory.
                    unsafe { copy_inline(wr.sg_list, &mut data) };
                    post(&wr, Some(&data[..len]))?;
                } else {
                    // More than the engine takes (it refuses it, with its own error).
                    // Safety: inline SGEs name the program's readable memory.
                    post(&wr, Some(&unsafe { inline_bytes(wr.sg_list) }))?;
                }
            } else {
                post(&wr, None)?;
            }
            cur = w.next;
        }
        Ok(())
    });
    if let Err(e) = result {
        if !bad_wr.is_null() {
            // Safety: a valid out-pointer.
            unsafe { *bad_wr = cur };
        }
        return errors_on_post("ibv_post_send", &e);
    }
    0
}

fn errors_on_post(call: &str, e: &VerbsError) -> c_int {
    let errno = errno_of(e);
    // A full queue is routine for a program that posts until it is told to stop.
    if errno != libc::ENOMEM {
        errors::log_failure(call, errno, e);
    }
    errno
}

/// Posts a C receive list through `chain` (a QP's or an SRQ's): the whole list under one
/// engine lock.
///
/// # Safety
/// `wr` is the program's valid list; `bad_wr` null or valid.
unsafe fn post_recv_list(
    call: &str,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    chain: impl FnOnce(
        &mut dyn FnMut(
            &mut dyn FnMut(u64, &[Sge]) -> Result<(), VerbsError>,
        ) -> Result<(), VerbsError>,
    ) -> Result<(), VerbsError>,
) -> c_int {
    let mut cur = wr;
    let result = chain(&mut |post| {
        while !cur.is_null() {
            // Safety: per the contract.
            let w = unsafe { &*cur };
            // Safety: per the contract.
            let sges = unsafe { SgeList::from_c(w.sg_list, w.num_sge) }?;
            post(w.wr_id, sges.as_slice())?;
            cur = w.next;
        }
        Ok(())
    });
    if let Err(e) = result {
        if !bad_wr.is_null() {
            // Safety: a valid out-pointer.
            unsafe { *bad_wr = cur };
        }
        return errors_on_post(call, &e);
    }
    0
}

/// `ops.post_recv`.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // Safety: a QP of ours.
    let q = unsafe { &*(qp as *mut QpObj) };
    // Safety: forwarded contract.
    unsafe {
        post_recv_list("ibv_post_recv", wr, bad_wr, |walk| {
            q.qp.post_recv_chain(walk)
        })
    }
}

/// `ops.post_srq_recv`.
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    if srq.is_null() {
        return libc::EINVAL;
    }
    // Safety: an SRQ of ours.
    let s = unsafe { &*(srq as *mut SrqObj) };
    // Safety: forwarded contract.
    unsafe {
        post_recv_list("ibv_post_srq_recv", wr, bad_wr, |walk| {
            s.srq.post_recv_chain(walk)
        })
    }
}

/// `ops.poll_cq`: up to `num_entries` completions; a negative value on error.
pub(crate) unsafe extern "C" fn poll_cq(
    cq: *mut ibv_cq,
    num_entries: c_int,
    wc: *mut ibv_wc,
) -> c_int {
    if cq.is_null() || num_entries < 0 || (num_entries > 0 && wc.is_null()) {
        return -libc::EINVAL;
    }
    // Safety: a CQ of ours.
    let c = unsafe { &*(cq as *mut CqObj) };
    let mut buf = [Wc::EMPTY; POLL_CHUNK];
    let mut done = 0usize;
    let want = num_entries as usize;
    while done < want {
        let chunk = (want - done).min(POLL_CHUNK);
        let n = match c.cq.poll(&mut buf[..chunk]) {
            Ok(n) => n,
            Err(e) => {
                if done > 0 {
                    break;
                }
                errors::log_failure("ibv_poll_cq", errno_of(&e), &e);
                return -errno_of(&e);
            }
        };
        for (i, w) in buf[..n].iter().enumerate() {
            // Safety: wc holds num_entries records; done + i < num_entries.
            unsafe { *wc.add(done + i) = ibv_wc::from(w) };
        }
        done += n;
        if n < chunk {
            break;
        }
    }
    done as c_int
}

/// `ops.req_notify_cq`.
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    // Safety: a CQ of ours.
    let c = unsafe { &*(cq as *mut CqObj) };
    match c.cq.req_notify(solicited_only != 0) {
        Ok(()) => 0,
        Err(e) => super::fail_int("ibv_req_notify_cq", &e),
    }
}

/// `ops.bind_mw` (type 1 windows): the window's new R_Key is written to `mw->rkey`.
pub(crate) unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    bind: *mut ibv_mw_bind,
) -> c_int {
    if qp.is_null() || mw.is_null() || bind.is_null() {
        return libc::EINVAL;
    }
    // Safety: objects of ours; bind valid.
    let (q, m, b) = unsafe { (&*(qp as *mut QpObj), &mut *(mw as *mut MwObj), &*bind) };
    let result = (|| {
        // Safety: the bind info's MR is ours or null.
        let info = unsafe { bind_info_from_c(&b.bind_info) }?;
        let flags = SendFlags::from_bits_truncate(b.send_flags & SEND_FLAGS_KNOWN);
        q.qp.bind_mw(&m.mw, b.wr_id, flags, info)
    })();
    match result {
        Ok(rkey) => {
            m.c.rkey = rkey;
            0
        }
        Err(e) => super::fail_int("ibv_bind_mw", &e),
    }
}

// ---------------------------------------------------------------------------------------
// ibv_cq_ex

/// The completion `start_poll`/`next_poll` stand on.
#[derive(Default)]
pub(crate) struct CqPoll {
    current: Option<Wc>,
}

unsafe fn cq_obj<'a>(cq: *mut ibv_cq_ex) -> &'a CqObj {
    // Safety: a CQ of ours (the caller's contract).
    unsafe { &*(cq as *mut CqObj) }
}

/// Takes the next completion into the CQ's current one; `ENOENT` when there is none.
unsafe fn advance(cq: *mut ibv_cq_ex) -> c_int {
    // Safety: a CQ of ours.
    let c = unsafe { cq_obj(cq) };
    let mut buf = [Wc::EMPTY; 1];
    match c.cq.poll(&mut buf) {
        Ok(1) => {
            let w = buf[0];
            // Safety: the program reads status/wr_id from the struct; we own it.
            unsafe {
                (*cq).status = crate::values::ibv_wc_status::from(w.status).0;
                (*cq).wr_id = w.wr_id;
            }
            lock(&c.poll).current = Some(w);
            0
        }
        Ok(_) => libc::ENOENT,
        Err(e) => super::fail_int("ibv_start_poll", &e),
    }
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    // Safety: attr is null or valid.
    if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
        return libc::EINVAL;
    }
    // Safety: a CQ of ours.
    unsafe { advance(cq) }
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // Safety: a CQ of ours.
    unsafe { advance(cq) }
}

unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
    // Safety: a CQ of ours.
    lock(&unsafe { cq_obj(cq) }.poll).current = None;
}

/// The current completion in C's spelling (zero if there is none).
unsafe fn current(cq: *mut ibv_cq_ex) -> ibv_wc {
    // Safety: a CQ of ours.
    let c = unsafe { cq_obj(cq) };
    lock(&c.poll)
        .current
        .as_ref()
        .map(ibv_wc::from)
        .unwrap_or_default()
}

unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> u32 {
    // Safety: forwarded.
    unsafe { current(cq) }.opcode.0
}
unsafe extern "C" fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    // Safety: forwarded.
    unsafe { current(cq) }.vendor_err
}
unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    // Safety: forwarded.
    unsafe { current(cq) }.byte_len
}
unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    // Safety: forwarded.
    unsafe { current(cq) }.imm_data
}
unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    // Safety: forwarded.
    unsafe { current(cq) }.qp_num
}
unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    // Safety: forwarded.
    unsafe { current(cq) }.src_qp
}
unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> c_uint {
    // Safety: forwarded.
    unsafe { current(cq) }.wc_flags
}
unsafe extern "C" fn read_slid(cq: *mut ibv_cq_ex) -> u32 {
    // Safety: forwarded.
    unsafe { current(cq) }.slid as u32
}
unsafe extern "C" fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
    // Safety: forwarded.
    unsafe { current(cq) }.sl
}
unsafe extern "C" fn read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
    // Safety: forwarded.
    unsafe { current(cq) }.dlid_path_bits
}
unsafe extern "C" fn read_zero_u64(_cq: *mut ibv_cq_ex) -> u64 {
    0
}
unsafe extern "C" fn read_zero_u16(_cq: *mut ibv_cq_ex) -> u16 {
    0
}
unsafe extern "C" fn read_zero_u32(_cq: *mut ibv_cq_ex) -> u32 {
    0
}

/// The C struct of a new CQ, with the extended polling interface filled in.
pub(crate) fn cq_ex_struct(
    context: *mut ibv_context,
    channel: *mut ibv_comp_channel,
    cq_context: *mut c_void,
    handle: u32,
    cqe: c_int,
) -> ibv_cq_ex {
    ibv_cq_ex {
        cq: ibv_cq {
            context,
            channel,
            cq_context,
            handle,
            cqe,
            mutex: Default::default(),
            cond: Default::default(),
            comp_events_completed: 0,
            async_events_completed: 0,
        },
        comp_mask: 0,
        status: 0,
        wr_id: 0,
        start_poll: Some(start_poll),
        next_poll: Some(next_poll),
        end_poll: Some(end_poll),
        read_opcode: Some(read_opcode),
        read_vendor_err: Some(read_vendor_err),
        read_byte_len: Some(read_byte_len),
        read_imm_data: Some(read_imm_data),
        read_qp_num: Some(read_qp_num),
        read_src_qp: Some(read_src_qp),
        read_wc_flags: Some(read_wc_flags),
        read_slid: Some(read_slid),
        read_sl: Some(read_sl),
        read_dlid_path_bits: Some(read_dlid_path_bits),
        // No completion timestamps, VLANs, flow tags or tag matching: creating a CQ that
        // asks for them fails (ibv_create_cq_ex checks wc_flags), so these are never read.
        read_completion_ts: Some(read_zero_u64),
        read_cvlan: Some(read_zero_u16),
        read_flow_tag: Some(read_zero_u32),
        read_tm_info: None,
        read_completion_wallclock_ns: Some(read_zero_u64),
    }
}

// ---------------------------------------------------------------------------------------
// ibv_qp_ex: wr_start, wr_<opcode>, wr_set_*, wr_complete / wr_abort

/// The work requests a program builds between `wr_start` and `wr_complete`.
#[derive(Default)]
pub(crate) struct WrBuilder {
    wrs: Vec<(SendWr, Option<Vec<u8>>)>,
    /// The first problem in the batch (reported by `wr_complete`).
    error: Option<VerbsError>,
}

unsafe fn qp_obj<'a>(qp: *mut ibv_qp_ex) -> &'a QpObj {
    // Safety: a QP of ours (the caller's contract).
    unsafe { &*(qp as *mut QpObj) }
}

/// Starts a new WR with the QP's current `wr_id` and `wr_flags`.
unsafe fn push_op(qp: *mut ibv_qp_ex, op: WrOp) {
    // Safety: a QP of ours.
    let (q, id, flags) = unsafe { (qp_obj(qp), (*qp).wr_id, (*qp).wr_flags) };
    let mut b = lock(&q.wr);
    let inline = flags & IBV_SEND_INLINE != 0;
    let wr = SendWr {
        wr_id: id,
        op,
        sg_list: Vec::new(),
        flags: SendFlags::from_bits_truncate(flags & SEND_FLAGS_KNOWN & !IBV_SEND_INLINE),
        ud: None,
    };
    b.wrs.push((wr, inline.then(Vec::new)));
}

/// Applies `f` to the WR being built (an error if there is none).
unsafe fn with_last(
    qp: *mut ibv_qp_ex,
    what: &str,
    f: impl FnOnce(&mut (SendWr, Option<Vec<u8>>)),
) {
    // Safety: a QP of ours.
    let q = unsafe { qp_obj(qp) };
    let mut b = lock(&q.wr);
    match b.wrs.last_mut() {
        Some(last) => f(last),
        None => {
            if b.error.is_none() {
                b.error = Some(invalid(format!("{what} before a wr_<opcode> call")));
            }
        }
    }
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    // Safety: a QP of ours.
    let mut b = lock(&unsafe { qp_obj(qp) }.wr);
    b.wrs.clear();
    b.error = None;
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    // Safety: forwarded.
    unsafe { wr_start(qp) };
}

unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    // Safety: a QP of ours.
    let q = unsafe { qp_obj(qp) };
    let (wrs, error) = {
        let mut b = lock(&q.wr);
        (std::mem::take(&mut b.wrs), b.error.take())
    };
    if let Some(e) = error {
        return super::fail_int("ibv_wr_complete", &e);
    }
    for (wr, inline) in &wrs {
        let result = match inline {
            Some(data) => q.qp.post_send_inline(wr, data),
            None => q.qp.post_send(wr),
        };
        if let Err(e) = result {
            return errors_on_post("ibv_wr_complete", &e);
        }
    }
    0
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    // Safety: forwarded.
    unsafe { push_op(qp, WrOp::Send) }
}
unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm: u32) {
    // Safety: forwarded.
    unsafe {
        push_op(
            qp,
            WrOp::SendWithImm {
                imm: u32::from_be(imm),
            },
        )
    }
}
unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, rkey: u32) {
    // Safety: forwarded.
    unsafe { push_op(qp, WrOp::SendWithInv { rkey }) }
}
unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // Safety: forwarded.
    unsafe { push_op(qp, WrOp::Write { remote_addr, rkey }) }
}
unsafe extern "C" fn wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm: u32) {
    // Safety: forwarded.
    unsafe {
        push_op(
            qp,
            WrOp::WriteWithImm {
                remote_addr,
                rkey,
                imm: u32::from_be(imm),
            },
        )
    }
}
unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // Safety: forwarded.
    unsafe { push_op(qp, WrOp::Read { remote_addr, rkey }) }
}
unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    // Safety: forwarded.
    unsafe {
        push_op(
            qp,
            WrOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            },
        )
    }
}
unsafe extern "C" fn wr_atomic_fetch_add(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    // Safety: forwarded.
    unsafe {
        push_op(
            qp,
            WrOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            },
        )
    }
}
unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, rkey: u32) {
    // Safety: forwarded.
    unsafe { push_op(qp, WrOp::LocalInv { rkey }) }
}
unsafe extern "C" fn wr_bind_mw(
    qp: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    if mw.is_null() || info.is_null() {
        // Safety: a QP of ours.
        let mut b = lock(&unsafe { qp_obj(qp) }.wr);
        b.error
            .get_or_insert(invalid("wr_bind_mw with a null window or bind info".into()));
        return;
    }
    // Safety: objects of ours; info valid.
    let (m, i) = unsafe { (&*(mw as *mut MwObj), &*info) };
    // Safety: the bind info's MR is ours or null.
    match unsafe { bind_info_from_c(i) } {
        // Safety: forwarded.
        Ok(bind) => unsafe {
            push_op(
                qp,
                WrOp::BindMw {
                    mw: m.mw.id(),
                    rkey,
                    bind,
                },
            )
        },
        Err(e) => {
            // Safety: a QP of ours.
            let mut b = lock(&unsafe { qp_obj(qp) }.wr);
            b.error.get_or_insert(e);
        }
    }
}
unsafe extern "C" fn wr_send_tso(qp: *mut ibv_qp_ex, _hdr: *mut c_void, _hdr_sz: u16, _mss: u16) {
    // Safety: a QP of ours.
    let mut b = lock(&unsafe { qp_obj(qp) }.wr);
    b.error.get_or_insert(invalid(
        "wr_send_tso: TSO is for raw packet QPs, which xroce has not".into(),
    ));
}
unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut ibv_qp_ex, _srqn: u32) {
    // Safety: a QP of ours.
    let mut b = lock(&unsafe { qp_obj(qp) }.wr);
    b.error
        .get_or_insert(invalid("wr_set_xrc_srqn: xroce has no XRC".into()));
}
unsafe extern "C" fn wr_set_ud_addr(
    qp: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    if ah.is_null() {
        // Safety: a QP of ours.
        let mut b = lock(&unsafe { qp_obj(qp) }.wr);
        b.error
            .get_or_insert(invalid("wr_set_ud_addr with a null AH".into()));
        return;
    }
    // Safety: an AH of ours.
    let av = unsafe { &*(ah as *mut AhObj) }.ah.av();
    // Safety: forwarded.
    unsafe {
        with_last(qp, "wr_set_ud_addr", |(wr, _)| {
            wr.ud = Some(UdDest {
                av,
                remote_qpn,
                remote_qkey,
            })
        })
    }
}
unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    let sge = Sge { addr, length, lkey };
    // Safety: forwarded; inline WRs copy the bytes now (the program may reuse them).
    unsafe {
        with_last(qp, "wr_set_sge", |(wr, inline)| match inline {
            Some(data) => data.extend_from_slice(&inline_bytes(&[sge])),
            None => wr.sg_list = vec![sge],
        })
    }
}
unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: usize, list: *const ibv_sge) {
    // Safety: list holds num_sge entries.
    let sges = match unsafe { sges_from_c(list, num_sge.min(i32::MAX as usize) as c_int) } {
        Ok(s) => s,
        Err(e) => {
            // Safety: a QP of ours.
            lock(&unsafe { qp_obj(qp) }.wr).error.get_or_insert(e);
            return;
        }
    };
    // Safety: forwarded.
    unsafe {
        with_last(qp, "wr_set_sge_list", |(wr, inline)| match inline {
            Some(data) => data.extend_from_slice(&inline_bytes(&sges)),
            None => wr.sg_list = sges,
        })
    }
}
unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    // Safety: addr names length readable bytes (the program's contract); copied now.
    let bytes = if length == 0 {
        Vec::new()
    } else {
        unsafe { std::slice::from_raw_parts(addr as *const u8, length) }.to_vec()
    };
    // Safety: forwarded.
    unsafe {
        with_last(qp, "wr_set_inline_data", |(_, inline)| {
            *inline = Some(bytes)
        })
    }
}
unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    num_buf: usize,
    list: *const ibv_data_buf,
) {
    let mut bytes = Vec::new();
    if num_buf > 0 && !list.is_null() {
        // Safety: list holds num_buf buffers, each naming readable bytes.
        for b in unsafe { std::slice::from_raw_parts(list, num_buf) } {
            if b.length > 0 {
                // Safety: as above.
                bytes.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(b.addr as *const u8, b.length)
                });
            }
        }
    }
    // Safety: forwarded.
    unsafe {
        with_last(qp, "wr_set_inline_data_list", |(_, inline)| {
            *inline = Some(bytes)
        })
    }
}
unsafe extern "C" fn wr_atomic_write(
    qp: *mut ibv_qp_ex,
    _rkey: u32,
    _addr: u64,
    _wr: *const c_void,
) {
    // Safety: a QP of ours.
    lock(&unsafe { qp_obj(qp) }.wr).error.get_or_insert(invalid(
        "wr_atomic_write: atomic write (IBTA 1.5) is not supported".into(),
    ));
}

/// The pointers of a new QP's C struct.
pub(crate) struct QpStructArgs {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub qp_num: u32,
    pub qp_type: u32,
}

/// The C struct of a new QP, with the `wr_*` interface filled in.
pub(crate) fn qp_ex_struct(a: QpStructArgs) -> ibv_qp_ex {
    ibv_qp_ex {
        qp_base: ibv_qp {
            context: a.context,
            qp_context: a.qp_context,
            pd: a.pd,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            handle: a.qp_num,
            qp_num: a.qp_num,
            state: 0,
            qp_type: a.qp_type,
            mutex: Default::default(),
            cond: Default::default(),
            events_completed: 0,
        },
        comp_mask: 0,
        wr_id: 0,
        wr_flags: 0,
        wr_atomic_cmp_swp: Some(wr_atomic_cmp_swp),
        wr_atomic_fetch_add: Some(wr_atomic_fetch_add),
        wr_bind_mw: Some(wr_bind_mw),
        wr_local_inv: Some(wr_local_inv),
        wr_rdma_read: Some(wr_rdma_read),
        wr_rdma_write: Some(wr_rdma_write),
        wr_rdma_write_imm: Some(wr_rdma_write_imm),
        wr_send: Some(wr_send),
        wr_send_imm: Some(wr_send_imm),
        wr_send_inv: Some(wr_send_inv),
        wr_send_tso: Some(wr_send_tso),
        wr_set_ud_addr: Some(wr_set_ud_addr),
        wr_set_xrc_srqn: Some(wr_set_xrc_srqn),
        wr_set_inline_data: Some(wr_set_inline_data),
        wr_set_inline_data_list: Some(wr_set_inline_data_list),
        wr_set_sge: Some(wr_set_sge),
        wr_set_sge_list: Some(wr_set_sge_list),
        wr_start: Some(wr_start),
        wr_complete: Some(wr_complete),
        wr_abort: Some(wr_abort),
        wr_atomic_write: Some(wr_atomic_write),
    }
}
