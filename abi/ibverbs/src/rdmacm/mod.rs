//! RDMA CM inside `libibverbs.so.1`: the C structs of `<rdma/rdma_cma.h>` (the calls
//! follow).
//!
//! Why here and not in librdmacm itself: an id's `verbs`, `pd` and `qp` are objects of this
//! library (the program calls `ibv_alloc_pd(id->verbs)` and `ibv_post_send(id->qp)`), and
//! the CM must drive the very xroce `Device` and `Qp` behind them. Each shared object links
//! its own copy of the xroce crate, so only code in this library can share them.
//!
//! The objects (docs/rdmacm-abi.md §6): an id is a box beginning with its `rdma_cm_id`,
//! followed by the `CmId`; an event is a box beginning with its `rdma_cm_event` and
//! holding its private data until `rdma_ack_cm_event`; a channel begins with its
//! `rdma_event_channel` (the fd of the `EventChannel`). Devices are opened lazily, once
//! per process, and shared by every id on them together with one PD each, as librdmacm does.

mod structs;

pub use structs::*;

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
