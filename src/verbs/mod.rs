//! The libibverbs object model in safe Rust, on top of the sans-IO engine.
//!
//! | libibverbs | xroce |
//! |---|---|
//! | `ibv_open_device` | [`Device::open`]`(ifname, DeviceConfig { driver, progress, .. })` |
//! | `ibv_query_device` / `_port` / `_gid` | [`Device::query_device`], [`Device::query_port`], [`Device::query_gid`] |
//! | `ibv_alloc_pd` | [`Device::alloc_pd`] → [`Pd`] |
//! | `ibv_reg_mr` | [`Pd::reg_mr`] → [`Mr`] (`addr`, `lkey`, `rkey`, `read`, `write`) |
//! | `ibv_reg_mr` on the application's buffer | [`Pd::reg_user_mr`]`(`[`UserMemory`]`, access)`: read and written in place |
//! | `ibv_rereg_mr` | [`Mr::rereg`]`(&`[`MrRereg`]` { memory, pd, access })` |
//! | `ibv_alloc_mw` / `ibv_bind_mw` | [`Pd::alloc_mw`] → [`Mw`], [`Qp::bind_mw`] (type 1); type 2 by [`WrOp::BindMw`] |
//! | `ibv_create_comp_channel` | [`Device::create_comp_channel`] → [`CompletionChannel`] (an fd) |
//! | `ibv_create_cq` / `ibv_poll_cq` / `ibv_req_notify_cq` | [`Device::create_cq`] → [`Cq::poll`], [`Cq::req_notify`] |
//! | `ibv_resize_cq` | [`Cq::resize`] |
//! | `ibv_create_qp` / `_modify_qp` / `_query_qp` | [`Pd::create_qp`] → [`Qp::modify`], [`Qp::query`] |
//! | `ibv_post_send` / `ibv_post_recv` | [`Qp::post_send`], [`Qp::post_recv`] (and batches) |
//! | `ibv_post_send` with `IBV_SEND_INLINE` | [`Qp::post_send`] with [`SendFlags::INLINE`], or [`Qp::post_send_inline`] from a slice |
//! | `ibv_create_ah` | [`Pd::create_ah`] → [`AddressHandle`] |
//! | `ibv_create_srq` / `_modify_srq` / `_query_srq` / `ibv_post_srq_recv` | [`Pd::create_srq`] → [`Srq::modify`], [`Srq::query`], [`Srq::post_recv`]; QPs on it: [`QpInitAttr::srq`] |
//! | QP1, the GSI (`ib_mad` in the kernel) | [`Device::open_gsi`] → [`Gsi::send`]`(&`[`MadAddress`]`, &[u8; 256])`, [`Gsi::poll_recv`] → [`ReceivedMad`] |
//! | `ibv_get_async_event`, `ibv_context::async_fd` | [`Device::get_async_event`], [`Device::poll_async_event`], [`Device::async_fd`] ([`Event`]: QP fatal, CQ error, port active/error, ...) |
//!
//! Objects are reference-counted handles: a QP keeps its PD, CQs and SRQ alive, an MR its PD,
//! everything its device. A memory region's bytes are the device's, or the application's
//! handed over as a [`UserMemory`] (the one `unsafe` step, `UserMemory::new` from a raw
//! pointer, is in the driver layer with its contract), so safe code cannot free memory the
//! wire still targets. Every call is safe from
//! any thread. Errors are [`VerbsError`]s naming the attribute or limit at fault; remote
//! failures are completion statuses.
//!
//! # Progress
//! A thread that polls a CQ (or reads an MR, or posts) moves frames between the driver and
//! the engine itself when no other thread is doing so: it holds the device's progress token
//! for one round (see `progress.rs` and `docs/performance.md`). A background thread per
//! device does the same for what nobody polls (the responder, timers, sleepers on completion
//! channels), so the responder side works even if the application never polls. In
//! [`ProgressMode::Wakeup`] that thread sleeps in poll(2) between events; in
//! [`ProgressMode::BusyPoll`] it spins while nobody polls.
//!
//! # Example (two devices joined in memory)
//! ```
//! use std::time::Duration;
//! use xroce::verbs::*;
//!
//! let (a, b, _link) = Device::mem_pair(&mem_link_config(1500, 0.0, 1), DeviceConfig::default())?;
//! let setup = |dev: &Device| -> Result<_, VerbsError> {
//!     let pd = dev.alloc_pd()?;
//!     let cq = dev.create_cq(64, None)?;
//!     let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq))?;
//!     let mr = pd.reg_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
//!     Ok((pd, cq, qp, mr))
//! };
//! let (_pda, cqa, qpa, mra) = setup(&a)?;
//! let (_pdb, _cqb, qpb, mrb) = setup(&b)?;
//! let opts = RcOptions::default();
//! qpa.connect_rc(&RcPeer { qpn: qpb.qp_num(), psn: 0, gid: b.query_gid(1)? }, &RcOptions { sgid_index: 1, ..opts })?;
//! qpb.connect_rc(&RcPeer { qpn: qpa.qp_num(), psn: 0, gid: a.query_gid(1)? }, &RcOptions { sgid_index: 1, ..opts })?;
//! mra.write(0, b"hello")?;
//! qpa.post_send(&SendWr {
//!     wr_id: 1,
//!     op: WrOp::Write { remote_addr: mrb.addr(), rkey: mrb.rkey() },
//!     sg_list: vec![mra.sge(0, 5)?],
//!     flags: SendFlags::SIGNALED,
//!     ud: None,
//! })?;
//! let wcs = cqa.wait(1, Duration::from_secs(5))?;
//! assert_eq!(wcs[0].status, WcStatus::Success);
//! assert_eq!(mrb.to_vec(0, 5)?, b"hello");
//! # Ok::<(), VerbsError>(())
//! ```
pub mod attr;
mod cq;
mod device;
mod error;
mod gsi;
mod pd;
mod qp;
mod runtime;
mod srq;
pub(crate) mod threads;

/// See [`runtime::Runtime::end_this_threads_lease`].
pub(crate) fn end_this_threads_lease() {
    runtime::Runtime::end_this_threads_lease();
}

pub use attr::{DeviceAttr, LinkLayer, PortAttr, PortState};
pub use cq::{CompletionChannel, Cq};
pub use device::{
    mem_link_config, Device, DeviceConfig, DeviceIdentity, DeviceRoute, DriverKind, MAX_SHARDS,
};
pub use error::{Result, VerbsError};
pub use gsi::{Gsi, GsiStats, MadAddress, ReceivedMad, MAD_LEN};
pub use pd::{AddressHandle, AhAttr, Mr, MrRereg, Mw, Pd};
pub use qp::{Qp, QpInitAttr, RcOptions, RcPeer};
pub(crate) use runtime::lock;
/// With no poller, how many posts of a burst transmit themselves before the rest leave in
/// batches (see `Qp::post_send`).
pub use runtime::progress::{BURST_POSTS_SENT_AT_ONCE, POST_BURST_GAP};
pub use runtime::{ProgressMode, ProgressStats, TracedFrame};
pub use srq::Srq;

pub use crate::dma::{DmaError, UserMemory};
pub use crate::driver::mem::{MemLink, MemLinkConfig};
pub use crate::engine::{
    inc_rkey, Access, AddressVector, CqId, Event, MrMemory, Mtu, MwBindInfo, MwId, MwInfo, MwType,
    QpAttr, QpAttrMask, QpCaps, QpState, QpType, RecvWr, SendFlags, SendWr, SendWrRef, Sge,
    SrqAttr, SrqAttrMask, SrqId, UdDest, Wc, WcOpcode, WcStatus, WrOp,
};
pub use crate::netdev::{Gid, GidEntry, GidType, MacAddr};
