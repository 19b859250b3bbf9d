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

mod connection;
mod endpoints;
mod events;
mod ids;
mod objects;
mod process;

pub use connection::*;
pub use endpoints::*;
use events::*;
pub use ids::*;
use objects::*;
use process::*;

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
