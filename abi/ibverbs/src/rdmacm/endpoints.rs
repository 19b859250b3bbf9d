//! The `rdma_create_ep` family (synchronous ids with their QPs), ports, devices and
//! `rdma_getaddrinfo`.
#![allow(clippy::missing_safety_doc)]
use super::*;

rdmacm_export! {
    /// `rdma_create_ep`: a synchronous id for `res` (`rdma_getaddrinfo`'s answer). Passive
    /// (`RAI_PASSIVE`): bound to `ai_src_addr`, `pd` and the QP attributes kept for the
    /// connections `rdma_get_request` returns. Active: the address and route resolved
    /// (2000 ms each, as librdmacm) and, given attributes, the QP made on the id.
    pub unsafe extern "C" fn rdma_create_ep(
        id: *mut *mut rdma_cm_id,
        res: *mut rdma_addrinfo,
        pd: *mut ibv_pd,
        qp_init_attr: *mut ibv_qp_init_attr,
    ) -> c_int {
        const CALL: &str = "rdma_create_ep";
        if id.is_null() || res.is_null() {
            return fail_with(CALL, libc::EINVAL, "no place for the id or no address info");
        }
        // Safety: valid (contract).
        let r = unsafe { &*res };
        let mut ep: *mut rdma_cm_id = std::ptr::null_mut();
        // Safety: a NULL channel makes a synchronous id.
        let rc = unsafe {
            rdma_create_id(std::ptr::null_mut(), &mut ep, std::ptr::null_mut(), r.ai_port_space as u32)
        };
        if rc != 0 {
            return rc;
        }
        // Safety: just made; the addresses and attributes are the program's (contract).
        let rc = unsafe {
            if r.ai_flags & RAI_PASSIVE != 0 {
                passive_ep(ep, r, pd, qp_init_attr)
            } else {
                active_ep(ep, r, pd, qp_init_attr)
            }
        };
        if rc != 0 {
            let errno = crate::capi::errno();
            // Safety: ours, not handed to the program.
            unsafe { rdma_destroy_ep(ep) };
            set_errno(errno);
            return rc;
        }
        // Safety: a valid out-pointer.
        unsafe { *id = ep };
        0
    }

    /// `rdma_destroy_ep`: the id's QP (if any), then the id.
    pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
        if !is_live(Handed::Id, id) {
            not_live("rdma_destroy_ep", "rdma_cm id", id as usize);
            return;
        }
        // Safety: a live id of ours.
        unsafe {
            if !(*id).qp.is_null() {
                rdma_destroy_qp(id);
            }
            rdma_destroy_id(id);
        }
    }

    /// `rdma_get_request`: on a synchronous listener, waits for the next CONNECT_REQUEST
    /// and returns its new (synchronous) id, with a QP of the listener's `rdma_create_ep`
    /// attributes when it had some; the event stays in `(*id)->event` until `rdma_accept`.
    pub unsafe extern "C" fn rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int {
        const CALL: &str = "rdma_get_request";
        // Safety: the program's id, not destroyed meanwhile (contract).
        let l = match unsafe { IdObj::checked(CALL, listen) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        if !l.synchronous {
            return fail_with(
                CALL,
                libc::EINVAL,
                "the listener has an event channel: take CONNECT_REQUEST from rdma_get_cm_event",
            );
        }
        if id.is_null() {
            return fail_with(CALL, libc::EINVAL, "no place for the id");
        }
        l.ack_held_event();
        // Safety: a synchronous id's channel is its own.
        let ch = unsafe { &*(l.c.channel as *const ChannelObj) };
        let event = loop {
            match ch.ch.get_event(None) {
                Ok(ev) => {
                    if let Some(c) = c_event(ev) {
                        break c;
                    }
                }
                Err(e) => return fail(CALL, &e),
            }
        };
        // Safety: just made.
        let e = unsafe { &*event };
        if e.event != EventKind::ConnectRequest.code() || e.status != 0 {
            l.c.event = event;
            let name = EVENT_NAMES.get(e.event as usize).copied().unwrap_or("an event");
            let errno = if e.status != 0 { e.status.saturating_abs() } else { libc::EINVAL };
            return fail_with(CALL, errno, &format!("{name} (status {}) on the listener", e.status));
        }
        let child = e.id;
        if let Some(saved) = l.ep_qp_init.as_ref() {
            // Safety: plain data (pointers and numbers), copied as librdmacm does.
            let mut attr = unsafe { std::ptr::read(saved) };
            // Safety: the new id is ours; the attributes a copy.
            let rc = unsafe { rdma_create_qp(child, l.c.pd, &mut attr) };
            if rc != 0 {
                let errno = crate::capi::errno();
                // Safety: the request refused and its id freed: the program never saw it.
                unsafe {
                    rdma_reject(child, std::ptr::null(), 0);
                    rdma_ack_cm_event(event);
                    rdma_destroy_id(child);
                }
                set_errno(errno);
                return rc;
            }
        }
        // Safety: the new id is live; the out-pointer valid.
        unsafe {
            (*child).event = event;
            *id = child;
        }
        0
    }

    /// `rdma_get_src_port`: the local port, network order.
    pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
        // Safety: the program's id, not destroyed meanwhile (contract).
        let Ok(obj) = (unsafe { IdObj::checked("rdma_get_src_port", id) }) else {
            return 0;
        };
        obj.id.local_addr().map_or(0, |a| a.port().to_be())
    }

    /// `rdma_get_dst_port`: the remote port, network order.
    pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
        // Safety: the program's id, not destroyed meanwhile (contract).
        let Ok(obj) = (unsafe { IdObj::checked("rdma_get_dst_port", id) }) else {
            return 0;
        };
        obj.id.remote_addr().map_or(0, |a| a.port().to_be())
    }

    /// `rdma_get_devices`: every device's shared context, NULL-terminated.
    pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
        let mut list: Vec<*mut ibv_context> = Vec::new();
        for name in crate::capi::device_list::interfaces() {
            match shared_device(&name) {
                Ok((ctx, _)) => list.push(ctx),
                Err(e) => {
                    fail("rdma_get_devices", &e);
                }
            }
        }
        if !num_devices.is_null() {
            // Safety: a valid out-pointer.
            unsafe { *num_devices = list.len() as c_int };
        }
        list.push(std::ptr::null_mut());
        Box::into_raw(list.into_boxed_slice()) as *mut *mut ibv_context
    }

    /// `rdma_free_devices`: the array only (the contexts stay, shared).
    pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
        if list.is_null() {
            return;
        }
        let mut len = 0;
        // Safety: NULL-terminated (made by rdma_get_devices).
        while !unsafe { *list.add(len) }.is_null() {
            len += 1;
        }
        // Safety: a boxed slice of len + 1.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, len + 1)) });
    }

    /// `rdma_getaddrinfo`: libc's getaddrinfo, in rdma_cm's terms (TCP: RC, UDP: UD).
    pub unsafe extern "C" fn rdma_getaddrinfo(
        node: *const c_char,
        service: *const c_char,
        hints: *const rdma_addrinfo,
        res: *mut *mut rdma_addrinfo,
    ) -> c_int {
        // Safety: per the contract.
        unsafe { getaddrinfo(node, service, hints, res) }
    }

    /// `rdma_freeaddrinfo`.
    pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
        let mut next = res;
        while !next.is_null() {
            // Safety: entries made by rdma_getaddrinfo with malloc.
            unsafe {
                let ai = &*next;
                let after = ai.ai_next;
                libc::free(ai.ai_src_addr as *mut c_void);
                libc::free(ai.ai_dst_addr as *mut c_void);
                libc::free(ai.ai_src_canonname as *mut c_void);
                libc::free(ai.ai_dst_canonname as *mut c_void);
                libc::free(next as *mut c_void);
                next = after;
            }
        }
    }
}

/// `rdma_create_ep` with `RAI_PASSIVE`.
///
/// # Safety
/// `ep` is a new id of ours; `r`'s address and `qp_init_attr` valid or null.
pub(super) unsafe fn passive_ep(
    ep: *mut rdma_cm_id,
    r: &rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    // Safety: per the contract.
    let rc = unsafe { rdma_bind_addr(ep, r.ai_src_addr) };
    if rc != 0 {
        return rc;
    }
    // Safety: a live id of ours.
    let obj = unsafe { &mut *(ep as *mut IdObj) };
    if !pd.is_null() {
        obj.c.pd = pd;
    }
    if !qp_init_attr.is_null() {
        // Safety: valid (contract); plain data, copied.
        let mut attr = unsafe { std::ptr::read(qp_init_attr) };
        attr.qp_type = r.ai_qp_type as u32;
        obj.ep_qp_init = Some(attr);
    }
    0
}

/// `rdma_create_ep` without `RAI_PASSIVE`.
///
/// # Safety
/// As [`passive_ep`].
pub(super) unsafe fn active_ep(
    ep: *mut rdma_cm_id,
    r: &rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    // Safety: per the contract; the id is synchronous, so each call waits for its event.
    unsafe {
        let rc = rdma_resolve_addr(ep, r.ai_src_addr, r.ai_dst_addr, 2000);
        if rc != 0 {
            return rc;
        }
        let rc = rdma_resolve_route(ep, 2000);
        if rc != 0 || qp_init_attr.is_null() {
            return rc;
        }
        (*qp_init_attr).qp_type = r.ai_qp_type as u32;
        rdma_create_qp(ep, pd, qp_init_attr)
    }
}

/// A malloc'ed copy of `bytes`.
pub(super) fn malloc_copy(bytes: &[u8]) -> *mut c_void {
    // Safety: malloc of a nonzero size; copy within both buffers.
    unsafe {
        let p = libc::malloc(bytes.len().max(1));
        if !p.is_null() {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), p as *mut u8, bytes.len());
        }
        p
    }
}

pub(super) fn sockaddr_bytes(addr: SocketAddr) -> (Vec<u8>, libc::socklen_t) {
    let s = storage_of(Some(addr));
    let len = match addr {
        SocketAddr::V4(_) => std::mem::size_of::<libc::sockaddr_in>(),
        SocketAddr::V6(_) => std::mem::size_of::<libc::sockaddr_in6>(),
    };
    // Safety: s is at least len bytes.
    let bytes = unsafe { std::slice::from_raw_parts(&s as *const _ as *const u8, len) }.to_vec();
    (bytes, len as libc::socklen_t)
}

/// `rdma_getaddrinfo`'s body: one entry per address libc finds.
///
/// # Safety
/// The strings are null or NUL-terminated; `hints` null or valid; `res` valid.
pub(super) unsafe fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    const CALL: &str = "rdma_getaddrinfo";
    if res.is_null() {
        return fail_with(CALL, libc::EINVAL, "no place for the answer");
    }
    // Safety: per the contract.
    let h = (!hints.is_null()).then(|| unsafe { &*hints });
    if node.is_null() && service.is_null() {
        return match h {
            // Safety: per the contract.
            Some(h) => unsafe { answer_from_hints(h, res) },
            None => fail_with(CALL, libc::EINVAL, "no node, no service and no hints"),
        };
    }
    let flags = h.map_or(0, |h| h.ai_flags);
    let ps = match h.map_or(0, |h| h.ai_port_space) {
        0 => match h.map_or(0, |h| h.ai_qp_type) as u32 {
            resources::IBV_QPT_UD => RDMA_PS_UDP,
            _ => RDMA_PS_TCP,
        },
        p => p as u32,
    };
    if ps != RDMA_PS_TCP && ps != RDMA_PS_UDP {
        return refuse(CALL, "port spaces other than RDMA_PS_TCP and RDMA_PS_UDP");
    }
    let family = h.map_or(0, |h| h.ai_family);
    if family == AF_IB {
        return refuse(CALL, "AF_IB addresses");
    }
    // Safety: all-zero addrinfo hints are valid.
    let mut lh: libc::addrinfo = unsafe { std::mem::zeroed() };
    lh.ai_family = if family == 0 { libc::AF_UNSPEC } else { family };
    lh.ai_socktype = if ps == RDMA_PS_UDP {
        libc::SOCK_DGRAM
    } else {
        libc::SOCK_STREAM
    };
    if flags & RAI_PASSIVE != 0 {
        lh.ai_flags |= libc::AI_PASSIVE;
    }
    if flags & RAI_NUMERICHOST != 0 {
        lh.ai_flags |= libc::AI_NUMERICHOST;
    }
    let mut found: *mut libc::addrinfo = std::ptr::null_mut();
    // Safety: per the contract; found is freed below.
    let rc = unsafe { libc::getaddrinfo(node, service, &lh, &mut found) };
    if rc != 0 {
        // Safety: gai_strerror returns a static string.
        let why = unsafe { CStr::from_ptr(libc::gai_strerror(rc)) }
            .to_string_lossy()
            .into_owned();
        let errno = match rc {
            libc::EAI_NONAME => libc::ENODEV,
            libc::EAI_MEMORY => libc::ENOMEM,
            _ => libc::EADDRNOTAVAIL,
        };
        // rdma-core returns getaddrinfo's own code; programs print it with gai_strerror.
        fail_with(CALL, errno, &why);
        return rc;
    }
    let mut first: *mut rdma_addrinfo = std::ptr::null_mut();
    let mut last: *mut rdma_addrinfo = std::ptr::null_mut();
    let mut cur = found;
    while !cur.is_null() {
        // Safety: a list libc made.
        let ai = unsafe { &*cur };
        cur = ai.ai_next;
        // Safety: libc's addresses are valid for their family.
        let Ok(addr) = (unsafe { socket_addr_quiet(ai.ai_addr) }) else {
            continue;
        };
        let (bytes, len) = sockaddr_bytes(addr);
        // Safety: calloc'ed, zeroed: a valid rdma_addrinfo.
        let entry =
            unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) } as *mut rdma_addrinfo;
        if entry.is_null() {
            break;
        }
        // Safety: just allocated.
        let e = unsafe { &mut *entry };
        e.ai_flags = flags;
        e.ai_family = ai.ai_family;
        e.ai_qp_type = if ps == RDMA_PS_UDP {
            resources::IBV_QPT_UD as c_int
        } else {
            resources::IBV_QPT_RC as c_int
        };
        e.ai_port_space = ps as c_int;
        if flags & RAI_PASSIVE != 0 {
            e.ai_src_addr = malloc_copy(&bytes) as *mut libc::sockaddr;
            e.ai_src_len = len;
        } else {
            e.ai_dst_addr = malloc_copy(&bytes) as *mut libc::sockaddr;
            e.ai_dst_len = len;
            if let Some(h) = h.filter(|h| !h.ai_src_addr.is_null() && h.ai_src_len > 0) {
                let n = h.ai_src_len as usize;
                // Safety: the hint's source is valid for its length.
                let src = unsafe { std::slice::from_raw_parts(h.ai_src_addr as *const u8, n) };
                e.ai_src_addr = malloc_copy(src) as *mut libc::sockaddr;
                e.ai_src_len = h.ai_src_len;
            }
        }
        if last.is_null() {
            first = entry;
        } else {
            // Safety: the previous entry.
            unsafe { (*last).ai_next = entry };
        }
        last = entry;
    }
    // Safety: libc's list.
    unsafe { libc::freeaddrinfo(found) };
    if first.is_null() {
        return fail_with(CALL, libc::EADDRNOTAVAIL, "no IPv4 or IPv6 address");
    }
    // Safety: a valid out-pointer.
    unsafe { *res = first };
    0
}

/// `rdma_getaddrinfo` without node and service (libfabric's verbs provider asks so): one
/// entry made of the hints alone, as rdma-core's addrinfo.c does: their flags, family, QP
/// type and port space as given, and copies of their destination and source addresses.
///
/// # Safety
/// The hints' addresses are null or valid for their lengths; `res` is valid.
pub(super) unsafe fn answer_from_hints(h: &rdma_addrinfo, res: *mut *mut rdma_addrinfo) -> c_int {
    const CALL: &str = "rdma_getaddrinfo";
    // A length without an address would be a read of nothing (rdma-core would crash on it).
    let given = |addr: *mut libc::sockaddr, len: libc::socklen_t| -> Result<Option<&[u8]>, ()> {
        match (addr.is_null(), len) {
            (_, 0) => Ok(None),
            (true, _) => Err(()),
            // Safety: valid for its length (contract).
            (false, n) => Ok(Some(unsafe {
                std::slice::from_raw_parts(addr as *const u8, n as usize)
            })),
        }
    };
    let (Ok(dst), Ok(src)) = (
        given(h.ai_dst_addr, h.ai_dst_len),
        given(h.ai_src_addr, h.ai_src_len),
    ) else {
        return fail_with(
            CALL,
            libc::EINVAL,
            "a hint address length without an address",
        );
    };
    let copy = |bytes: Option<&[u8]>| {
        bytes.map_or((std::ptr::null_mut(), 0), |b| {
            (malloc_copy(b), b.len() as libc::socklen_t)
        })
    };
    let ((dst_addr, dst_len), (src_addr, src_len)) = (copy(dst), copy(src));
    // Safety: calloc'ed, zeroed: a valid rdma_addrinfo.
    let entry =
        unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) } as *mut rdma_addrinfo;
    if entry.is_null()
        || (dst.is_some() && dst_addr.is_null())
        || (src.is_some() && src_addr.is_null())
    {
        // Safety: malloc'ed above, or null.
        unsafe {
            libc::free(dst_addr);
            libc::free(src_addr);
            libc::free(entry as *mut c_void);
        }
        return fail_with(CALL, libc::ENOMEM, "no memory for the answer");
    }
    // Safety: just allocated.
    let e = unsafe { &mut *entry };
    e.ai_flags = h.ai_flags;
    e.ai_family = h.ai_family;
    e.ai_qp_type = h.ai_qp_type;
    e.ai_port_space = h.ai_port_space;
    e.ai_dst_addr = dst_addr as *mut libc::sockaddr;
    e.ai_dst_len = dst_len;
    e.ai_src_addr = src_addr as *mut libc::sockaddr;
    e.ai_src_len = src_len;
    // Safety: a valid out-pointer.
    unsafe { *res = entry };
    0
}

/// [`socket_addr`] without the message.
///
/// # Safety
/// As for [`socket_addr`].
pub(super) unsafe fn socket_addr_quiet(addr: *const libc::sockaddr) -> Result<SocketAddr, ()> {
    if addr.is_null() {
        return Err(());
    }
    // Safety: per the contract.
    match unsafe { (*addr).sa_family } as c_int {
        libc::AF_INET | libc::AF_INET6 => {
            // Safety: per the contract; these families never fail.
            unsafe { socket_addr("rdma_getaddrinfo", addr) }.map_err(|_| ())
        }
        _ => Err(()),
    }
}
