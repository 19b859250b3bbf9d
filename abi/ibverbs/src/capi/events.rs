//! Completion events (`ibv_get_cq_event`, `ibv_ack_cq_events`) and asynchronous events
//! (`ibv_get_async_event`, `ibv_ack_async_event`).
//!
//! Both channels are real fds a program can poll: a completion channel's `fd` is readable
//! while an event is queued, and so is `ibv_context::async_fd` (an epoll set holding the
//! device's event fd).
//! Both start blocking, as rdma-core's do: `ibv_get_cq_event` and `ibv_get_async_event`
//! wait, and once the program sets `O_NONBLOCK` on the fd they return EAGAIN instead.

use std::ffi::{c_int, c_void};
use std::time::Duration;

use xroce::engine::Event;
use xroce::verbs::VerbsError;

use super::context::Context;
use super::resources::{ChannelObj, CqObj, QpObj, SrqObj};
use super::{errors, lock, set_errno, RawObj};
use crate::objects::{ibv_async_event, ibv_comp_channel, ibv_context, ibv_cq};

// `enum ibv_event_type`.
const IBV_EVENT_CQ_ERR: u32 = 0;
const IBV_EVENT_QP_FATAL: u32 = 1;
const IBV_EVENT_SQ_DRAINED: u32 = 5;
const IBV_EVENT_PORT_ACTIVE: u32 = 9;
const IBV_EVENT_PORT_ERR: u32 = 10;
const IBV_EVENT_SRQ_LIMIT_REACHED: u32 = 15;
const IBV_EVENT_QP_LAST_WQE_REACHED: u32 = 16;

/// Whether the program set `O_NONBLOCK` on an fd it was handed (`fcntl(F_SETFL)`).
fn fd_is_nonblocking(fd: c_int) -> bool {
    // Safety: F_GETFL only reads the flags of the fd; a closed fd gives -1.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK != 0
}

xroce_abi_export::c_export! { "IBVERBS_1.1";
    /// `ibv_get_cq_event`: waits for the next completion event on the channel.
    pub unsafe extern "C" fn ibv_get_cq_event(
        channel: *mut ibv_comp_channel,
        cq: *mut *mut ibv_cq,
        cq_context: *mut *mut c_void,
    ) -> c_int {
        if channel.is_null() || cq.is_null() || cq_context.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // Safety: a channel of ours; its context is open.
        let (ch, context) = unsafe {
            let ch = &*(channel as *mut ChannelObj);
            (ch, Context::from_c(ch.c.context))
        };
        // A program that made the channel's fd O_NONBLOCK drains it until EAGAIN (UCX and
        // libfabric do, before arming), as with rdma-core, whose call is a read() of that fd.
        let wait = if fd_is_nonblocking(ch.c.fd) { Some(Duration::ZERO) } else { None };
        loop {
            let id = match ch.ch.get_cq_event(wait) {
                Ok(id) => id,
                Err(VerbsError::Timeout(_)) => {
                    set_errno(libc::EAGAIN);
                    return -1;
                }
                Err(e) => {
                    let errno = errors::errno_of(&e);
                    errors::log_failure("ibv_get_cq_event", errno, &e);
                    set_errno(errno);
                    return -1;
                }
            };
            // An event of a CQ destroyed meanwhile is dropped (the program cannot ack it).
            let Some(obj) = lock(&context.registry).cqs.get(&id).copied() else {
                continue;
            };
            let obj: *mut CqObj = obj.ptr();
            // Safety: the registry holds live CQs only; out-pointers valid.
            unsafe {
                *cq = obj as *mut ibv_cq;
                *cq_context = (*obj).c.cq.cq_context;
            }
            return 0;
        }
    }

    /// `ibv_ack_cq_events`.
    pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
        if cq.is_null() {
            return;
        }
        // Safety: a CQ of ours.
        let c = unsafe { &mut *(cq as *mut CqObj) };
        c.c.cq.comp_events_completed = c.c.cq.comp_events_completed.wrapping_add(nevents);
    }

    /// `ibv_get_async_event`: waits for the next asynchronous event of the context.
    pub unsafe extern "C" fn ibv_get_async_event(ctx: *mut ibv_context, event: *mut ibv_async_event) -> c_int {
        if ctx.is_null() || event.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // Safety: an open context.
        let context = unsafe { Context::from_c(ctx) };
        let device = match context.device() {
            Ok(d) => d,
            Err(e) => {
                set_errno(super::fail_int("ibv_get_async_event", &e));
                return -1;
            }
        };
        let wait = if fd_is_nonblocking(context.vctx.context.async_fd) {
            Some(Duration::ZERO)
        } else {
            None
        };
        loop {
            let ev = match device.get_async_event(wait) {
                Ok(ev) => ev,
                Err(VerbsError::Timeout(_)) => {
                    set_errno(libc::EAGAIN);
                    return -1;
                }
                Err(e) => {
                    set_errno(super::fail_int("ibv_get_async_event", &e));
                    return -1;
                }
            };
            let reg = lock(&context.registry);
            let element = |raw: Option<&RawObj>| raw.map(|r| r.ptr::<c_void>());
            let (element, event_type) = match ev {
                Event::CqError(id) => (element(reg.cqs.get(&id)), IBV_EVENT_CQ_ERR),
                Event::QpFatal(qpn) => (element(reg.qps.get(&qpn)), IBV_EVENT_QP_FATAL),
                Event::SqDrained(qpn) => (element(reg.qps.get(&qpn)), IBV_EVENT_SQ_DRAINED),
                Event::QpLastWqeReached(qpn) => {
                    (element(reg.qps.get(&qpn)), IBV_EVENT_QP_LAST_WQE_REACHED)
                }
                Event::SrqLimitReached(id) => {
                    (element(reg.srqs.get(&id)), IBV_EVENT_SRQ_LIMIT_REACHED)
                }
                Event::PortActive(port) => (Some(port as usize as *mut c_void), IBV_EVENT_PORT_ACTIVE),
                Event::PortError(port) => (Some(port as usize as *mut c_void), IBV_EVENT_PORT_ERR),
                // Completion notifications go to completion channels, not here.
                Event::CqNotify(_) => (None, 0),
            };
            // An event of an object destroyed meanwhile has nobody to go to.
            let Some(element) = element else { continue };
            // Safety: a valid out-pointer.
            unsafe { *event = ibv_async_event { element, event_type } };
            return 0;
        }
    }

    /// `ibv_ack_async_event`: counts the event on its object.
    pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
        if event.is_null() {
            return;
        }
        // Safety: an event ibv_get_async_event filled in; its element is ours.
        unsafe {
            let e = &*event;
            match e.event_type {
                IBV_EVENT_CQ_ERR => {
                    let c = &mut *(e.element as *mut CqObj);
                    c.c.cq.async_events_completed = c.c.cq.async_events_completed.wrapping_add(1);
                }
                IBV_EVENT_QP_FATAL | IBV_EVENT_SQ_DRAINED | IBV_EVENT_QP_LAST_WQE_REACHED => {
                    let q = &mut *(e.element as *mut QpObj);
                    q.c.qp_base.events_completed = q.c.qp_base.events_completed.wrapping_add(1);
                }
                IBV_EVENT_SRQ_LIMIT_REACHED => {
                    let s = &mut *(e.element as *mut SrqObj);
                    s.c.events_completed = s.c.events_completed.wrapping_add(1);
                }
                _ => {}
            }
        }
    }
}
