//! The calls on channels and ids: create and destroy them, bind, resolve the address and
//! the route, listen, and get and ack events.
#![allow(clippy::missing_safety_doc)]
use super::*;

rdmacm_export! {
    /// `rdma_create_event_channel`: a channel whose fd is readable while events wait
    /// (blocking unless the program sets `O_NONBLOCK` on it).
    pub unsafe extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
        new_channel("rdma_create_event_channel").unwrap_or(std::ptr::null_mut())
    }

    /// `rdma_destroy_event_channel`.
    pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
        destroy_channel("rdma_destroy_event_channel", channel);
    }

    /// `rdma_create_id`.
    pub unsafe extern "C" fn rdma_create_id(
        channel: *mut rdma_event_channel,
        id: *mut *mut rdma_cm_id,
        context: *mut c_void,
        ps: u32,
    ) -> c_int {
        const CALL: &str = "rdma_create_id";
        if id.is_null() {
            return fail_with(CALL, libc::EINVAL, "no place for the id");
        }
        let space = match ps {
            RDMA_PS_TCP => PortSpace::Tcp,
            RDMA_PS_UDP => PortSpace::Udp,
            RDMA_PS_IB => return refuse(CALL, "the RDMA_PS_IB port space (IB addressing)"),
            RDMA_PS_IPOIB => return refuse(CALL, "the RDMA_PS_IPOIB port space"),
            _ => return fail_with(CALL, libc::EINVAL, &format!("port space {ps:#x}")),
        };
        let cm = match cm() {
            Ok(cm) => cm,
            Err(e) => return fail(CALL, &e),
        };
        // A NULL channel makes a synchronous id, with a channel of its own.
        let synchronous = channel.is_null();
        let channel = if synchronous {
            match new_channel(CALL) {
                Ok(ch) => ch,
                Err(rc) => return rc,
            }
        } else {
            channel
        };
        // Safety: the program's channel (or the id's own), not destroyed meanwhile.
        let ch = match unsafe { channel_of(CALL, channel) } {
            Ok(ch) => ch,
            Err(rc) => return rc,
        };
        match cm.create_id(&ch.ch, space) {
            Ok(cm_id) => {
                let obj = IdObj::new(cm_id, channel, context);
                // Safety: just made; id is a valid out-pointer.
                unsafe {
                    (*obj).synchronous = synchronous;
                    *id = obj as *mut rdma_cm_id;
                }
                0
            }
            Err(e) => {
                if synchronous {
                    destroy_channel(CALL, channel);
                }
                fail(CALL, &e)
            }
        }
    }

    /// `rdma_destroy_id`: waits until the id's events are acked; the QP (if the program
    /// did not destroy it) is the program's.
    pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {

        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked("rdma_destroy_id", id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        obj.ack_held_event();
        obj.wait_acks();
        // The kernel's CM keeps resending a DREQ after the process is gone; ours lives in
        // the process, so give the peer's DREP a moment (rping's client disconnects,
        // destroys and exits at once, and a lost DREQ would leave the server waiting).
        // Only for a DREQ we sent: one we received waits for our DREP, which the destroy
        // below sends.
        let until = std::time::Instant::now() + Duration::from_secs(1);
        while obj.id.awaits_drep() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(2));
        }
        let connected = matches!(
            obj.id.state(),
            IdState::Closed | IdState::Disconnecting | IdState::Established
        );
        lock(ids()).remove(&obj.id.key());
        take_back(Handed::Id, id);
        // The connection's last MAD (DREQ, DREP, REJ) is queued here, for the device's
        // background thread; a program that exits right after rdma_destroy_id (perftest's
        // server) would take it along, and the peer would resend its DREQ to nobody
        // (IBTA 12.9.6 wants every DREQ answered). xroce's verbs have no "wait until
        // sent", so give the thread a moment.
        obj.id.destroy();
        if connected {
            std::thread::sleep(Duration::from_millis(50));
        }
        if obj.synchronous {
            destroy_channel("rdma_destroy_id", obj.c.channel);
        }
        // Safety: boxed by IdObj::new; nobody uses it any more (contract).
        drop(unsafe { Box::from_raw(obj as *mut IdObj) });
        0
    }

    /// `rdma_bind_addr`.
    pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
        const CALL: &str = "rdma_bind_addr";
        // Safety: per the contract.
        let addr = match unsafe { socket_addr(CALL, addr) } {
            Ok(a) => a,
            Err(rc) => return rc,
        };
        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked(CALL, id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        // A listener there hears every device (Linux's cma_any_addr: zero or loopback).
        if addr.ip().is_unspecified() || addr.ip().is_loopback() {
            if let Ok(cm) = cm() {
                open_all(cm);
            }
        }
        match obj.id.bind_addr(addr) {
            Ok(()) => {
                obj.sync();
                0
            }
            Err(e) => fail(CALL, &e),
        }
    }

    /// `rdma_resolve_addr`: ADDR_RESOLVED or ADDR_ERROR follows.
    pub unsafe extern "C" fn rdma_resolve_addr(
        id: *mut rdma_cm_id,
        src_addr: *mut libc::sockaddr,
        dst_addr: *mut libc::sockaddr,
        timeout_ms: c_int,
    ) -> c_int {
        const CALL: &str = "rdma_resolve_addr";
        // Safety: per the contract.
        let dst = match unsafe { socket_addr(CALL, dst_addr) } {
            Ok(a) => a,
            Err(rc) => return rc,
        };
        let src = if src_addr.is_null() {
            None
        } else {
            // Safety: per the contract.
            match unsafe { socket_addr(CALL, src_addr) } {
                Ok(a) => Some(a),
                Err(rc) => return rc,
            }
        };
        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked(CALL, id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        let timeout = Duration::from_millis(timeout_ms.max(0) as u64);
        match obj.id.resolve_addr(src, dst, timeout) {
            Ok(()) => obj.complete(CALL, false),
            Err(e) => fail(CALL, &e),
        }
    }

    /// `rdma_resolve_route`: ROUTE_RESOLVED follows (RoCE has no SA: the path is built
    /// from the route and the neighbour table).
    pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int {

        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked("rdma_resolve_route", id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        match obj.id.resolve_route(Duration::from_millis(timeout_ms.max(0) as u64)) {
            Ok(()) => obj.complete("rdma_resolve_route", false),
            Err(e) => fail("rdma_resolve_route", &e),
        }
    }

    /// `rdma_listen`.
    pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {

        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked("rdma_listen", id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        // A loopback listener hears every device, as the wildcard's (Linux's cma_any_addr);
        // its bind opened only the first, which is all a bind without listen needs.
        if obj.id.local_addr().is_some_and(|a| a.ip().is_loopback()) {
            if let Ok(cm) = cm() {
                open_all(cm);
            }
        }
        match obj.id.listen(backlog) {
            Ok(()) => {
                obj.sync();
                0
            }
            Err(e) => fail("rdma_listen", &e),
        }
    }

    /// `rdma_get_cm_event`: the next event of the channel (blocking unless the fd is
    /// `O_NONBLOCK`: then -1/EAGAIN when none waits).
    pub unsafe extern "C" fn rdma_get_cm_event(
        channel: *mut rdma_event_channel,
        event: *mut *mut rdma_cm_event,
    ) -> c_int {
        const CALL: &str = "rdma_get_cm_event";
        if event.is_null() {
            return fail_with(CALL, libc::EINVAL, "no place for the event");
        }
        // Safety: the program's channel, not destroyed meanwhile (contract).
        let ch = match unsafe { channel_of(CALL, channel) } {
            Ok(ch) => ch,
            Err(rc) => return rc,
        };
        loop {
            let ev = if nonblocking(ch.c.fd) {
                match ch.ch.try_get_event() {
                    Some(ev) => ev,
                    None => {
                        set_errno(libc::EAGAIN);
                        return -1;
                    }
                }
            } else {
                match ch.ch.get_event(None) {
                    Ok(ev) => ev,
                    Err(e) => return fail(CALL, &e),
                }
            };
            if let Some(c) = c_event(ev) {
                // Safety: a valid out-pointer.
                unsafe { *event = c };
                return 0;
            }
        }
    }

    /// `rdma_ack_cm_event`: frees the event (and its private data).
    pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
        if !take_back(Handed::Event, event) {
            return not_live("rdma_ack_cm_event", "event (acked already?)", event as usize);
        }
        // Safety: handed out by rdma_get_cm_event, boxed there, now taken back.
        let obj = unsafe { Box::from_raw(event as *mut EventObj) };
        // Safety: the owner waits in rdma_destroy_id for this ack, so it is alive.
        let owner = unsafe { &*obj.owner };
        let mut n = lock(&owner.unacked);
        *n = n.saturating_sub(1);
        owner.acked.notify_all();
        0
    }
}
