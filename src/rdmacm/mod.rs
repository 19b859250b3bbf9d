//! The RDMA communication manager (librdmacm's model) over the CM protocol of [`crate::cm`].
//!
//! | librdmacm | xroce |
//! |---|---|
//! | `rdma_create_event_channel` | [`EventChannel::new`] (a pollable fd: readable while an event is queued) |
//! | `rdma_create_id(ch, ctx, ps)` | [`Cm::create_id`]`(&channel, PortSpace::Tcp)` → [`CmId`] |
//! | `rdma_bind_addr`, `rdma_listen` | [`CmId::bind_addr`], [`CmId::listen`] |
//! | `rdma_resolve_addr`, `rdma_resolve_route` | [`CmId::resolve_addr`], [`CmId::resolve_route`] (events AddrResolved, RouteResolved) |
//! | `rdma_create_qp` | [`CmId::create_qp`] (or [`CmId::attach_qp`] for a QP made elsewhere) |
//! | `rdma_connect`, `rdma_accept`, `rdma_reject`, `rdma_establish`, `rdma_disconnect` | [`CmId::connect`], [`CmId::accept`], [`CmId::reject`], [`CmId::establish`], [`CmId::disconnect`] |
//! | `rdma_get_cm_event` | [`EventChannel::get_event`] → [`RdmaCmEvent`] (no ack: events are values) |
//! | `rdma_init_qp_attr` | [`CmId::init_qp_attr`] |
//! | `rdma_set_option` (TOS, ACK timeout, REUSEADDR) | [`CmId::set_tos`], [`CmId::set_ack_timeout`], [`CmId::set_reuse_addr`] |
//! | `rdma_destroy_id` | [`CmId::destroy`] (or dropping the last handle) |
//!
//! A [`Cm`] serves a set of devices; each device gets one GSI (QP1) and one
//! [`crate::cm::CmAgent`], run by a thread of the `Cm` that sleeps on QP1's completion
//! channel and the agent's next timer. What rdma_cm adds to the CM protocol (docs/cm.md):
//! service ids from port spaces and ports (`0x0000_0000_0106_PPPP` for TCP), the 36-byte
//! private-data header with both IP addresses and the active side's port, RoCEv2 paths built
//! from the route and neighbour tables, and QP moves done for the user (INIT at
//! create, RTR/RTS when the REQ is accepted or the REP arrives, ERR on reject and
//! disconnect).
//!
//! Rooms, bottom up (tests/layers.rs, `RDMACM_FLOORS`): `types` (the public values);
//! `registry` (the CM's shared state: its ports, the ports bound, the ids' data; the service
//! hands it the two things only the service can do, running an agent's news and opening a
//! port, when the `Cm` is made); `relay_listen` (listening behind a relay); `id` (what a user
//! does with an id); `service` (the `Cm`, its port threads, the agent's events turned into
//! rdma_cm events).
mod id;
mod registry;
mod relay_listen;
mod service;
mod types;

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::wire::cma::PortSpace;
pub use id::CmId;
pub use registry::{CmConfigRdma, DeviceOpener};
pub use service::Cm;
pub use types::*;

/// The verbs runtime's lock helper (poisoning ignored: every critical section leaves its data
/// valid), one for the crate.
pub(crate) use crate::verbs::lock;

/// An event channel (`struct rdma_event_channel`): a queue of events for any number of ids,
/// behind a file descriptor that is readable exactly while an event is queued (register it
/// with poll/epoll, or block in [`EventChannel::get_event`]).
#[derive(Clone)]
pub struct EventChannel {
    inner: Arc<ChannelInner>,
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.inner.rx.as_raw_fd())
            .field("queued", &self.queued())
            .finish()
    }
}

pub(crate) struct ChannelInner {
    rx: UnixDatagram,
    tx: UnixDatagram,
    queue: Mutex<VecDeque<RdmaCmEvent>>,
}

impl ChannelInner {
    /// Queues an event; the fd turns readable with the first.
    pub(crate) fn push(&self, event: RdmaCmEvent) {
        let mut queue = lock(&self.queue);
        if queue.is_empty() {
            let _ = self.tx.send(&[1]);
        }
        queue.push_back(event);
    }

    /// Empties the fd. MSG_DONTWAIT, not the fd's O_NONBLOCK: a C program owns that flag
    /// (librdmacm's channel fd blocks until the program sets it).
    fn drain(&self) {
        let mut byte = [0u8; 16];
        while rustix::net::recv(&self.rx, &mut byte, rustix::net::RecvFlags::DONTWAIT).is_ok() {}
    }

    fn pop(&self) -> Option<RdmaCmEvent> {
        let mut queue = lock(&self.queue);
        let event = queue.pop_front()?;
        if queue.is_empty() {
            self.drain();
        }
        Some(event)
    }

    /// Moves the queued events of `id` to `to` (rdma_migrate_id).
    pub(crate) fn take_events_of(&self, id: &CmId) -> Vec<RdmaCmEvent> {
        let mut queue = lock(&self.queue);
        let mut taken = Vec::new();
        let mut kept = VecDeque::new();
        for e in queue.drain(..) {
            if e.id == *id {
                taken.push(e);
            } else {
                kept.push_back(e);
            }
        }
        *queue = kept;
        if queue.is_empty() {
            self.drain();
        }
        taken
    }
}

impl EventChannel {
    pub fn new() -> Result<EventChannel> {
        let (rx, tx) = UnixDatagram::pair()?;
        rx.set_nonblocking(true)?;
        tx.set_nonblocking(true)?;
        Ok(EventChannel {
            inner: Arc::new(ChannelInner {
                rx,
                tx,
                queue: Mutex::new(VecDeque::new()),
            }),
        })
    }

    pub(crate) fn inner(&self) -> &Arc<ChannelInner> {
        &self.inner
    }

    pub(crate) fn from_inner(inner: Arc<ChannelInner>) -> EventChannel {
        EventChannel { inner }
    }

    /// The next event, if one is queued (`rdma_get_cm_event` on a non-blocking channel).
    pub fn try_get_event(&self) -> Option<RdmaCmEvent> {
        self.inner.pop()
    }

    /// Waits for the next event; `None` waits forever. [`RdmaCmError::Timeout`] when none
    /// came in time.
    pub fn get_event(&self, timeout: Option<Duration>) -> Result<RdmaCmEvent> {
        crate::verbs::end_this_threads_lease();
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(event) = self.inner.pop() {
                return Ok(event);
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return Err(RdmaCmError::Timeout(timeout.unwrap_or_default()));
            }
            crate::driver::wait::wait_readable(&[self.inner.rx.as_fd()], left)?;
        }
    }

    /// Events waiting.
    pub fn queued(&self) -> usize {
        lock(&self.inner.queue).len()
    }

    /// Waits for an event of `kind` on this channel, failing on any other (a helper for
    /// programs that drive one id at a time, as rping does).
    pub fn expect(&self, kind: EventKind, timeout: Duration) -> Result<RdmaCmEvent> {
        let event = self.get_event(Some(timeout))?;
        if event.kind != kind {
            return Err(RdmaCmError::InvalidArgument(format!(
                "expected {}, got {} (status {})",
                kind.name(),
                event.kind.name(),
                event.status
            )));
        }
        Ok(event)
    }
}

impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.rx.as_fd()
    }
}

impl AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.rx.as_raw_fd()
    }
}
