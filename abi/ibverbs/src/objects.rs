//! The structs of `<infiniband/verbs.h>` that carry pointers: the objects a C program holds
//! (`ibv_context`, `ibv_qp`, `ibv_cq`, ...), the work requests it hands in, and the function
//! tables it calls through (`ibv_context_ops`, the `verbs_context` extension, the `wr_*` and
//! `start_poll`/`read_*` members of `ibv_qp_ex` and `ibv_cq_ex`).
//!
//! These are not `Pod` (pointers and function pointers are not plain bytes); they are filled
//! in by the library and read by the program. Layouts follow rdma-core 44's header, checked in
//! `tests/layout.rs`.
#![allow(missing_docs)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::structs::{ibv_device_attr, ibv_port_attr, ibv_qp_cap, ibv_sge, ibv_srq_attr, ibv_wc};

/// `pthread_mutex_t` (40 bytes on x86_64 glibc). All zero bytes is
/// `PTHREAD_MUTEX_INITIALIZER`; the library never locks it, programs do not either.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct pthread_mutex_t {
    bytes: [u8; 40],
}

/// `pthread_cond_t` (48 bytes on x86_64 glibc); zero is `PTHREAD_COND_INITIALIZER`.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct pthread_cond_t {
    bytes: [u8; 48],
}

impl Default for pthread_mutex_t {
    fn default() -> Self {
        pthread_mutex_t { bytes: [0; 40] }
    }
}

impl Default for pthread_cond_t {
    fn default() -> Self {
        pthread_cond_t { bytes: [0; 48] }
    }
}

/// `IBV_SYSFS_NAME_MAX`.
pub const IBV_SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX`.
pub const IBV_SYSFS_PATH_MAX: usize = 256;

/// `struct _ibv_device_ops`: two obsolete hooks, never called by today's programs.
#[repr(C)]
pub struct _ibv_device_ops {
    /// Obsolete.
    pub _dummy1: Option<unsafe extern "C" fn()>,
    /// Obsolete.
    pub _dummy2: Option<unsafe extern "C" fn()>,
}

/// `struct ibv_device`.
#[repr(C)]
pub struct ibv_device {
    /// Obsolete hooks.
    pub _ops: _ibv_device_ops,
    /// `IBV_NODE_CA` (1).
    pub node_type: u32,
    /// `IBV_TRANSPORT_IB` (0): RoCE is the IB transport over Ethernet.
    pub transport_type: u32,
    /// The device name (`xroce_<ifname>`).
    pub name: [c_char; IBV_SYSFS_NAME_MAX],
    /// The uverbs device name; xroce has none and names the interface.
    pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    /// A sysfs path; xroce's is the interface's.
    pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    /// A sysfs path; xroce's is the interface's.
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

/// A slot of a function table that this library leaves empty (an obsolete entry point).
pub type CompatFn = Option<unsafe extern "C" fn() -> *mut c_void>;

/// `struct ibv_context_ops`: the hot calls programs make inline through the context.
#[repr(C)]
pub struct ibv_context_ops {
    /// Obsolete.
    pub _compat_query_device: CompatFn,
    /// Obsolete.
    pub _compat_query_port: CompatFn,
    /// Obsolete.
    pub _compat_alloc_pd: CompatFn,
    /// Obsolete.
    pub _compat_dealloc_pd: CompatFn,
    /// Obsolete.
    pub _compat_reg_mr: CompatFn,
    /// Obsolete.
    pub _compat_rereg_mr: CompatFn,
    /// Obsolete.
    pub _compat_dereg_mr: CompatFn,
    /// `ibv_alloc_mw`.
    pub alloc_mw: Option<unsafe extern "C" fn(*mut ibv_pd, u32) -> *mut ibv_mw>,
    /// `ibv_bind_mw`.
    pub bind_mw: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int>,
    /// `ibv_dealloc_mw`.
    pub dealloc_mw: Option<unsafe extern "C" fn(*mut ibv_mw) -> c_int>,
    /// Obsolete.
    pub _compat_create_cq: CompatFn,
    /// `ibv_poll_cq`.
    pub poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
    /// `ibv_req_notify_cq`.
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    /// Obsolete.
    pub _compat_cq_event: CompatFn,
    /// Obsolete.
    pub _compat_resize_cq: CompatFn,
    /// Obsolete.
    pub _compat_destroy_cq: CompatFn,
    /// Obsolete.
    pub _compat_create_srq: CompatFn,
    /// Obsolete.
    pub _compat_modify_srq: CompatFn,
    /// Obsolete.
    pub _compat_query_srq: CompatFn,
    /// Obsolete.
    pub _compat_destroy_srq: CompatFn,
    /// `ibv_post_srq_recv`.
    pub post_srq_recv: Option<
        unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int,
    >,
    /// Obsolete.
    pub _compat_create_qp: CompatFn,
    /// Obsolete.
    pub _compat_query_qp: CompatFn,
    /// Obsolete.
    pub _compat_modify_qp: CompatFn,
    /// Obsolete.
    pub _compat_destroy_qp: CompatFn,
    /// `ibv_post_send`.
    pub post_send:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
    /// `ibv_post_recv`.
    pub post_recv:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    /// Obsolete.
    pub _compat_create_ah: CompatFn,
    /// Obsolete.
    pub _compat_destroy_ah: CompatFn,
    /// Obsolete.
    pub _compat_attach_mcast: CompatFn,
    /// Obsolete.
    pub _compat_detach_mcast: CompatFn,
    /// Obsolete.
    pub _compat_async_event: CompatFn,
}

/// `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    /// The device it was opened on.
    pub device: *mut ibv_device,
    /// The inline calls.
    pub ops: ibv_context_ops,
    /// The kernel command fd; xroce has no kernel side and gives an fd of /dev/null, so a
    /// program that polls or closes it does no harm.
    pub cmd_fd: c_int,
    /// The async event fd: readable when `ibv_get_async_event` has an event.
    pub async_fd: c_int,
    /// Completion vectors.
    pub num_comp_vectors: c_int,
    /// Unused by xroce.
    pub mutex: pthread_mutex_t,
    /// `UINTPTR_MAX`: the context is a `verbs_context` (the extended verbs exist).
    pub abi_compat: *mut c_void,
}

/// An extended-verbs slot this library leaves empty: the inline wrapper then fails with
/// `EOPNOTSUPP` (rdma-core's `verbs_get_ctx_op`).
pub type ExtFn = Option<unsafe extern "C" fn() -> c_int>;

/// `struct verbs_context`: the extended verbs, which live *before* the `ibv_context` a
/// program holds (at negative offsets from it).
#[repr(C)]
pub struct verbs_context {
    /// `ibv_query_port` (the 52-byte `ibv_port_attr`).
    pub query_port:
        Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int>,
    /// `ibv_advise_mr`.
    pub advise_mr: Option<unsafe extern "C" fn(*mut ibv_pd, u32, u32, *mut ibv_sge, u32) -> c_int>,
    /// `ibv_alloc_null_mr`.
    pub alloc_null_mr: ExtFn,
    /// `ibv_read_counters`.
    pub read_counters: ExtFn,
    /// `ibv_attach_counters_point_flow`.
    pub attach_counters_point_flow: ExtFn,
    /// `ibv_create_counters`.
    pub create_counters: ExtFn,
    /// `ibv_destroy_counters`.
    pub destroy_counters: ExtFn,
    /// `ibv_reg_dm_mr`.
    pub reg_dm_mr: ExtFn,
    /// `ibv_alloc_dm`.
    pub alloc_dm: ExtFn,
    /// `ibv_free_dm`.
    pub free_dm: ExtFn,
    /// `ibv_modify_flow_action_esp`.
    pub modify_flow_action_esp: ExtFn,
    /// `ibv_destroy_flow_action`.
    pub destroy_flow_action: ExtFn,
    /// `ibv_create_flow_action_esp`.
    pub create_flow_action_esp: ExtFn,
    /// `ibv_modify_qp_rate_limit`.
    pub modify_qp_rate_limit: ExtFn,
    /// `ibv_alloc_parent_domain`.
    pub alloc_parent_domain: ExtFn,
    /// `ibv_dealloc_td`.
    pub dealloc_td: ExtFn,
    /// `ibv_alloc_td`.
    pub alloc_td: ExtFn,
    /// `ibv_modify_cq`.
    pub modify_cq: ExtFn,
    /// `ibv_post_srq_ops`.
    pub post_srq_ops: ExtFn,
    /// `ibv_destroy_rwq_ind_table`.
    pub destroy_rwq_ind_table: ExtFn,
    /// `ibv_create_rwq_ind_table`.
    pub create_rwq_ind_table: ExtFn,
    /// `ibv_destroy_wq`.
    pub destroy_wq: ExtFn,
    /// `ibv_modify_wq`.
    pub modify_wq: ExtFn,
    /// `ibv_create_wq`.
    pub create_wq: ExtFn,
    /// `ibv_query_rt_values_ex`.
    pub query_rt_values: ExtFn,
    /// `ibv_create_cq_ex`.
    pub create_cq_ex:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex>,
    /// libibverbs' private part; unused.
    pub priv_: *mut c_void,
    /// `ibv_query_device_ex`.
    pub query_device_ex: Option<
        unsafe extern "C" fn(
            *mut ibv_context,
            *const ibv_query_device_ex_input,
            *mut ibv_device_attr_ex,
            usize,
        ) -> c_int,
    >,
    /// `ibv_destroy_flow`.
    pub ibv_destroy_flow: ExtFn,
    /// Unused.
    pub abi_placeholder2: ExtFn,
    /// `ibv_create_flow`.
    pub ibv_create_flow: ExtFn,
    /// Unused.
    pub abi_placeholder1: ExtFn,
    /// `ibv_open_qp`.
    pub open_qp: ExtFn,
    /// `ibv_create_qp_ex`.
    pub create_qp_ex:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp>,
    /// `ibv_get_srq_num`.
    pub get_srq_num: ExtFn,
    /// `ibv_create_srq_ex`.
    pub create_srq_ex:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq>,
    /// `ibv_open_xrcd`.
    pub open_xrcd: ExtFn,
    /// `ibv_close_xrcd`.
    pub close_xrcd: ExtFn,
    /// Unused.
    pub abi_placeholder3: u64,
    /// Size of this struct counted back from `context`: which extended ops exist.
    pub sz: usize,
    /// The context a program holds.
    pub context: ibv_context,
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    /// Its context.
    pub context: *mut ibv_context,
    /// A handle (xroce's PD id).
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    /// Its context.
    pub context: *mut ibv_context,
    /// Its PD.
    pub pd: *mut ibv_pd,
    /// Start of the registered memory (and of its iova range unless registered at another).
    pub addr: *mut c_void,
    /// Bytes registered.
    pub length: usize,
    /// A handle.
    pub handle: u32,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

/// `struct ibv_mw`.
#[repr(C)]
pub struct ibv_mw {
    /// Its context.
    pub context: *mut ibv_context,
    /// Its PD.
    pub pd: *mut ibv_pd,
    /// The window's current R_Key.
    pub rkey: u32,
    /// A handle.
    pub handle: u32,
    /// `IBV_MW_TYPE_1` or `_2`.
    pub type_: u32,
}

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    /// The region to bind to.
    pub mr: *mut ibv_mr,
    /// Start of the window.
    pub addr: u64,
    /// Its length.
    pub length: u64,
    /// `IBV_ACCESS_*`.
    pub mw_access_flags: c_uint,
}

/// `struct ibv_mw_bind` (`ibv_bind_mw`, type 1 windows).
#[repr(C)]
pub struct ibv_mw_bind {
    /// The completion's wr_id.
    pub wr_id: u64,
    /// `IBV_SEND_SIGNALED`, ...
    pub send_flags: c_uint,
    /// What to bind.
    pub bind_info: ibv_mw_bind_info,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    /// Its context.
    pub context: *mut ibv_context,
    /// Readable when a completion event is queued.
    pub fd: c_int,
    /// CQs using it.
    pub refcnt: c_int,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    /// Its context.
    pub context: *mut ibv_context,
    /// Its completion channel, or null.
    pub channel: *mut ibv_comp_channel,
    /// The program's pointer.
    pub cq_context: *mut c_void,
    /// A handle.
    pub handle: u32,
    /// Its depth.
    pub cqe: c_int,
    /// Guards the two counters (`ibv_ack_cq_events`).
    pub mutex: pthread_mutex_t,
    /// Signalled when the counters change.
    pub cond: pthread_cond_t,
    /// Completion events acknowledged.
    pub comp_events_completed: u32,
    /// Async events acknowledged.
    pub async_events_completed: u32,
}

/// `struct ibv_cq_ex`: an `ibv_cq`, then the polling interface of `ibv_create_cq_ex`. C
/// repeats the `ibv_cq` fields (`ibv_cq_ex_to_cq` is a cast); the layout is the same.
#[repr(C)]
pub struct ibv_cq_ex {
    /// The `ibv_cq` part.
    pub cq: ibv_cq,
    /// Unused.
    pub comp_mask: u32,
    /// The current completion's status.
    pub status: u32,
    /// The current completion's wr_id.
    pub wr_id: u64,
    /// `ibv_start_poll`.
    pub start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int>,
    /// `ibv_next_poll`.
    pub next_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
    /// `ibv_end_poll`.
    pub end_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex)>,
    /// `ibv_wc_read_opcode`.
    pub read_opcode: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_vendor_err`.
    pub read_vendor_err: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_byte_len`.
    pub read_byte_len: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_imm_data` (network byte order).
    pub read_imm_data: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_qp_num`.
    pub read_qp_num: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_src_qp`.
    pub read_src_qp: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_wc_flags`.
    pub read_wc_flags: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_uint>,
    /// `ibv_wc_read_slid`.
    pub read_slid: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_sl`.
    pub read_sl: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    /// `ibv_wc_read_dlid_path_bits`.
    pub read_dlid_path_bits: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    /// `ibv_wc_read_completion_ts`.
    pub read_completion_ts: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
    /// `ibv_wc_read_cvlan`.
    pub read_cvlan: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u16>,
    /// `ibv_wc_read_flow_tag`.
    pub read_flow_tag: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_tm_info`.
    pub read_tm_info: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut c_void)>,
    /// `ibv_wc_read_completion_wallclock_ns`.
    pub read_completion_wallclock_ns: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
}

/// `struct ibv_poll_cq_attr`.
#[repr(C)]
pub struct ibv_poll_cq_attr {
    /// Must be 0.
    pub comp_mask: u32,
}

/// `struct ibv_cq_init_attr_ex`.
#[repr(C)]
pub struct ibv_cq_init_attr_ex {
    /// Minimum depth.
    pub cqe: u32,
    /// The program's pointer.
    pub cq_context: *mut c_void,
    /// Completion channel, or null.
    pub channel: *mut ibv_comp_channel,
    /// Completion vector.
    pub comp_vector: u32,
    /// `IBV_WC_EX_WITH_*`: what the program will read.
    pub wc_flags: u64,
    /// `IBV_CQ_INIT_ATTR_MASK_*`.
    pub comp_mask: u32,
    /// `IBV_CREATE_CQ_ATTR_*`.
    pub flags: u32,
    /// A parent domain.
    pub parent_domain: *mut ibv_pd,
}

/// `struct ibv_srq`.
#[repr(C)]
pub struct ibv_srq {
    /// Its context.
    pub context: *mut ibv_context,
    /// The program's pointer.
    pub srq_context: *mut c_void,
    /// Its PD.
    pub pd: *mut ibv_pd,
    /// A handle.
    pub handle: u32,
    /// Unused by xroce.
    pub mutex: pthread_mutex_t,
    /// Unused by xroce.
    pub cond: pthread_cond_t,
    /// Async events acknowledged.
    pub events_completed: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
pub struct ibv_srq_init_attr {
    /// The program's pointer.
    pub srq_context: *mut c_void,
    /// Sizes and limit.
    pub attr: ibv_srq_attr,
}

/// `struct ibv_srq_init_attr_ex`.
#[repr(C)]
pub struct ibv_srq_init_attr_ex {
    /// The program's pointer.
    pub srq_context: *mut c_void,
    /// Sizes and limit.
    pub attr: ibv_srq_attr,
    /// `IBV_SRQ_INIT_ATTR_*`.
    pub comp_mask: u32,
    /// `IBV_SRQT_*`.
    pub srq_type: u32,
    /// Its PD.
    pub pd: *mut ibv_pd,
    /// XRC domain.
    pub xrcd: *mut c_void,
    /// XRC CQ.
    pub cq: *mut ibv_cq,
    /// Tag matching: `max_num_tags`, `max_ops`.
    pub tm_cap: [u32; 2],
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    /// Its context.
    pub context: *mut ibv_context,
    /// The program's pointer.
    pub qp_context: *mut c_void,
    /// Its PD.
    pub pd: *mut ibv_pd,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// Its SRQ, or null.
    pub srq: *mut ibv_srq,
    /// A handle.
    pub handle: u32,
    /// The QP number.
    pub qp_num: u32,
    /// The state as of the last modify or query.
    pub state: u32,
    /// `IBV_QPT_*`.
    pub qp_type: u32,
    /// Unused by xroce.
    pub mutex: pthread_mutex_t,
    /// Unused by xroce.
    pub cond: pthread_cond_t,
    /// Async events acknowledged.
    pub events_completed: u32,
}

/// One buffer of `ibv_wr_set_inline_data_list`.
#[repr(C)]
pub struct ibv_data_buf {
    /// Its bytes.
    pub addr: *mut c_void,
    /// Their count.
    pub length: usize,
}

/// `struct ibv_qp_ex`: an `ibv_qp`, then the `wr_*` work-request interface.
#[repr(C)]
pub struct ibv_qp_ex {
    /// The QP.
    pub qp_base: ibv_qp,
    /// Unused.
    pub comp_mask: u64,
    /// wr_id of the next work request.
    pub wr_id: u64,
    /// Send flags of the next work request.
    pub wr_flags: c_uint,
    /// `ibv_wr_atomic_cmp_swp`.
    pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64)>,
    /// `ibv_wr_atomic_fetch_add`.
    pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64)>,
    /// `ibv_wr_bind_mw`.
    pub wr_bind_mw:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_mw, u32, *const ibv_mw_bind_info)>,
    /// `ibv_wr_local_inv`.
    pub wr_local_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    /// `ibv_wr_rdma_read`.
    pub wr_rdma_read: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    /// `ibv_wr_rdma_write`.
    pub wr_rdma_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    /// `ibv_wr_rdma_write_imm`.
    pub wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    /// `ibv_wr_send`.
    pub wr_send: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    /// `ibv_wr_send_imm`.
    pub wr_send_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    /// `ibv_wr_send_inv`.
    pub wr_send_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    /// `ibv_wr_send_tso`.
    pub wr_send_tso: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u16, u16)>,
    /// `ibv_wr_set_ud_addr`.
    pub wr_set_ud_addr: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32)>,
    /// `ibv_wr_set_xrc_srqn`.
    pub wr_set_xrc_srqn: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    /// `ibv_wr_set_inline_data`.
    pub wr_set_inline_data: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, usize)>,
    /// `ibv_wr_set_inline_data_list`.
    pub wr_set_inline_data_list:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_data_buf)>,
    /// `ibv_wr_set_sge`.
    pub wr_set_sge: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    /// `ibv_wr_set_sge_list`.
    pub wr_set_sge_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_sge)>,
    /// `ibv_wr_start`.
    pub wr_start: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    /// `ibv_wr_complete`.
    pub wr_complete: Option<unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int>,
    /// `ibv_wr_abort`.
    pub wr_abort: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    /// `ibv_wr_atomic_write`.
    pub wr_atomic_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, *const c_void)>,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct ibv_qp_init_attr {
    /// The program's pointer.
    pub qp_context: *mut c_void,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ, or null.
    pub srq: *mut ibv_srq,
    /// Queue sizes (written back with what was granted).
    pub cap: ibv_qp_cap,
    /// `IBV_QPT_*`.
    pub qp_type: u32,
    /// Every send WR signalled.
    pub sq_sig_all: c_int,
}

/// `struct ibv_rx_hash_conf`.
#[repr(C)]
pub struct ibv_rx_hash_conf {
    /// Hash function.
    pub rx_hash_function: u8,
    /// Key length.
    pub rx_hash_key_len: u8,
    /// Key.
    pub rx_hash_key: *mut u8,
    /// Fields hashed.
    pub rx_hash_fields_mask: u64,
}

/// `struct ibv_qp_init_attr_ex`.
#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    /// The program's pointer.
    pub qp_context: *mut c_void,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ, or null.
    pub srq: *mut ibv_srq,
    /// Queue sizes.
    pub cap: ibv_qp_cap,
    /// `IBV_QPT_*`.
    pub qp_type: u32,
    /// Every send WR signalled.
    pub sq_sig_all: c_int,
    /// `IBV_QP_INIT_ATTR_*`.
    pub comp_mask: u32,
    /// The PD (`IBV_QP_INIT_ATTR_PD`).
    pub pd: *mut ibv_pd,
    /// XRC domain.
    pub xrcd: *mut c_void,
    /// `IBV_QP_CREATE_*`.
    pub create_flags: u32,
    /// TSO.
    pub max_tso_header: u16,
    /// RSS.
    pub rwq_ind_tbl: *mut c_void,
    /// RSS.
    pub rx_hash_conf: ibv_rx_hash_conf,
    /// `IBV_QP_CREATE_SOURCE_QPN`.
    pub source_qpn: u32,
    /// `IBV_QP_EX_WITH_*`: the `wr_*` calls the program will use.
    pub send_ops_flags: u64,
}

/// `struct ibv_ah`.
#[repr(C)]
pub struct ibv_ah {
    /// Its context.
    pub context: *mut ibv_context,
    /// Its PD.
    pub pd: *mut ibv_pd,
    /// A handle.
    pub handle: u32,
}

/// The `wr` union of `ibv_send_wr`: `rdma`, `atomic` or `ud`, by opcode.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    /// RDMA WRITE/READ.
    pub rdma: ibv_send_wr_rdma,
    /// Atomics.
    pub atomic: ibv_send_wr_atomic,
    /// UD sends.
    pub ud: ibv_send_wr_ud,
}

/// `wr.rdma`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_rdma {
    /// Remote address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// `wr.atomic`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_atomic {
    /// Remote address (8-byte aligned).
    pub remote_addr: u64,
    /// Compare (CMP_AND_SWP) or add (FETCH_AND_ADD).
    pub compare_add: u64,
    /// Swap value.
    pub swap: u64,
    /// Remote key.
    pub rkey: u32,
}

/// `wr.ud`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_ud {
    /// The address handle.
    pub ah: *mut ibv_ah,
    /// Destination QP.
    pub remote_qpn: u32,
    /// Q_Key.
    pub remote_qkey: u32,
}

/// `bind_mw` of `ibv_send_wr` (`IBV_WR_BIND_MW`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_bind_mw {
    /// The window.
    pub mw: *mut ibv_mw,
    /// Its new R_Key.
    pub rkey: u32,
    /// What to bind.
    pub bind_info: ibv_mw_bind_info,
}

/// `struct ibv_send_wr`.
#[repr(C)]
pub struct ibv_send_wr {
    /// The completion's wr_id.
    pub wr_id: u64,
    /// Next WR of the list, or null.
    pub next: *mut ibv_send_wr,
    /// Gather list.
    pub sg_list: *mut ibv_sge,
    /// Its length.
    pub num_sge: c_int,
    /// `IBV_WR_*`.
    pub opcode: u32,
    /// `IBV_SEND_*`.
    pub send_flags: c_uint,
    /// Immediate data (network order), or the rkey to invalidate.
    pub imm_data: u32,
    /// Per opcode.
    pub wr: ibv_send_wr_wr,
    /// XRC: `remote_srqn`.
    pub qp_type: u32,
    /// `bind_mw` (or TSO, which xroce does not have).
    pub bind_mw: ibv_send_wr_bind_mw,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct ibv_recv_wr {
    /// The completion's wr_id.
    pub wr_id: u64,
    /// Next WR of the list, or null.
    pub next: *mut ibv_recv_wr,
    /// Scatter list.
    pub sg_list: *mut ibv_sge,
    /// Its length.
    pub num_sge: c_int,
}

/// `struct ibv_async_event`.
#[repr(C)]
pub struct ibv_async_event {
    /// The CQ, QP or SRQ (as a pointer), or the port number.
    pub element: *mut c_void,
    /// `IBV_EVENT_*`.
    pub event_type: u32,
}

/// `struct ibv_query_device_ex_input`.
#[repr(C)]
pub struct ibv_query_device_ex_input {
    /// Must be 0.
    pub comp_mask: u32,
}

/// `struct ibv_odp_caps`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_odp_caps {
    /// `IBV_ODP_SUPPORT` (1), `IBV_ODP_SUPPORT_IMPLICIT` (2).
    pub general_caps: u64,
    /// `IBV_ODP_SUPPORT_*` of RC QPs.
    pub rc_odp_caps: u32,
    /// Of UC QPs.
    pub uc_odp_caps: u32,
    /// Of UD QPs.
    pub ud_odp_caps: u32,
    pub(crate) _pad: u32,
}

/// `struct ibv_device_attr_ex`: the classic attributes, then the extended ones (which xroce
/// reports as zero: no ODP, TSO, RSS, tag matching, device memory...).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr_ex {
    /// `ibv_query_device`'s attributes.
    pub orig_attr: ibv_device_attr,
    /// Unused.
    pub comp_mask: u32,
    pub(crate) _pad0: u32,
    /// On-demand paging.
    pub odp_caps: ibv_odp_caps,
    /// Timestamp mask.
    pub completion_timestamp_mask: u64,
    /// Clock, kHz.
    pub hca_core_clock: u64,
    /// `IBV_DEVICE_*` (extended).
    pub device_cap_flags_ex: u64,
    /// `max_tso`, `supported_qpts`.
    pub tso_caps: [u32; 2],
    /// `rss_caps`: three u32, a u64 mask, a u8 (32 bytes with padding).
    pub rss_caps: [u64; 4],
    /// Max WQs of type RQ.
    pub max_wq_type_rq: u32,
    /// `packet_pacing_caps`.
    pub packet_pacing_caps: [u32; 3],
    /// `IBV_RAW_PACKET_CAP_*`.
    pub raw_packet_caps: u32,
    /// `tm_caps`.
    pub tm_caps: [u32; 5],
    /// `cq_mod_caps`.
    pub cq_mod_caps: [u16; 2],
    pub(crate) _pad1: u32,
    /// Device memory.
    pub max_dm_size: u64,
    /// `pci_atomic_caps`.
    pub pci_atomic_caps: [u16; 3],
    pub(crate) _pad2: u16,
    /// XRC ODP caps.
    pub xrc_odp_caps: u32,
    /// Ports beyond 255.
    pub phys_port_cnt_ex: u32,
}
