//! The rdma_cm calls where librdmacm's own rules decide (rdma-core's addrinfo.c and cma.c),
//! called as a C program calls them. Ids need an event channel, which needs an interface
//! xroce could offer; no device is opened.

use std::cell::RefCell;
use std::sync::mpsc;

use super::*;

thread_local! {
    /// The last failure line this thread's calls printed (or would have, when quiet).
    pub(super) static LAST_FAILURE: RefCell<Option<String>> = const { RefCell::new(None) };
}

fn last_failure() -> String {
    LAST_FAILURE
        .with(|last| last.borrow_mut().take())
        .unwrap_or_default()
}

fn sockaddr_in(ip: [u8; 4], port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip),
        },
        sin_zero: [0; 8],
    }
}

fn no_hints() -> rdma_addrinfo {
    // Safety: all-zero is a valid rdma_addrinfo (null pointers, zero numbers).
    unsafe { std::mem::zeroed() }
}

/// An event channel, or `None` (with a note) where xroce offers no interface.
fn channel_or_skip(test: &str) -> Option<*mut rdma_event_channel> {
    // Safety: no arguments.
    let ch = unsafe { rdma_create_event_channel() };
    if ch.is_null() {
        eprintln!(
            "{test}: skipped, xroce offers no interface here ({})",
            last_failure()
        );
        return None;
    }
    Some(ch)
}

/// Runs `f` on another thread; panics if it does not return within 5 s (a call that hangs).
fn within_5s<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(5))
        .unwrap_or_else(|_| panic!("{what} did not return within 5 s"))
}

#[test]
fn getaddrinfo_without_node_or_service_answers_from_the_hints() {
    // libfabric's verbs provider asks so; rdma-core's addrinfo.c copies the hints' flags,
    // family, QP type and port space, and their destination and source addresses.
    let dst = sockaddr_in([198, 18, 5, 2], 7471);
    let src = sockaddr_in([198, 18, 5, 1], 0);
    let mut hints = no_hints();
    hints.ai_flags = RAI_NUMERICHOST;
    hints.ai_family = libc::AF_INET;
    hints.ai_qp_type = crate::capi::resources::IBV_QPT_RC as c_int;
    hints.ai_port_space = RDMA_PS_TCP as c_int;
    hints.ai_dst_addr = &dst as *const _ as *mut libc::sockaddr;
    hints.ai_dst_len = std::mem::size_of_val(&dst) as libc::socklen_t;
    hints.ai_src_addr = &src as *const _ as *mut libc::sockaddr;
    hints.ai_src_len = std::mem::size_of_val(&src) as libc::socklen_t;
    let mut res: *mut rdma_addrinfo = std::ptr::null_mut();
    // Safety: valid hints and out-pointer.
    let rc = unsafe { rdma_getaddrinfo(std::ptr::null(), std::ptr::null(), &hints, &mut res) };
    assert_eq!(rc, 0, "{}", last_failure());
    // Safety: a list rdma_getaddrinfo made.
    let r = unsafe { &*res };
    assert_eq!(
        (r.ai_flags, r.ai_family, r.ai_qp_type, r.ai_port_space),
        (
            hints.ai_flags,
            hints.ai_family,
            hints.ai_qp_type,
            hints.ai_port_space
        )
    );
    assert!(r.ai_next.is_null());
    for (addr, len, want) in [
        (r.ai_dst_addr, r.ai_dst_len, &dst),
        (r.ai_src_addr, r.ai_src_len, &src),
    ] {
        assert_eq!(len as usize, std::mem::size_of::<libc::sockaddr_in>());
        assert_ne!(
            addr as *const libc::sockaddr_in, want as *const _,
            "a copy, not the hint's"
        );
        // Safety: a sockaddr_in copy, malloc'ed.
        let got = unsafe { &*(addr as *const libc::sockaddr_in) };
        assert_eq!(
            (got.sin_port, got.sin_addr.s_addr),
            (want.sin_port, want.sin_addr.s_addr)
        );
    }
    // Safety: ours.
    unsafe { rdma_freeaddrinfo(res) };

    // Nothing but a QP type (no addresses at all) still succeeds.
    let mut bare = no_hints();
    bare.ai_qp_type = crate::capi::resources::IBV_QPT_UD as c_int;
    // Safety: as above.
    let rc = unsafe { rdma_getaddrinfo(std::ptr::null(), std::ptr::null(), &bare, &mut res) };
    assert_eq!(rc, 0, "{}", last_failure());
    // Safety: as above.
    let r = unsafe { &*res };
    assert_eq!(
        (r.ai_qp_type, r.ai_port_space, r.ai_flags),
        (bare.ai_qp_type, 0, 0)
    );
    assert!(r.ai_dst_addr.is_null() && r.ai_src_addr.is_null());
    assert_eq!((r.ai_dst_len, r.ai_src_len), (0, 0));
    // Safety: ours.
    unsafe { rdma_freeaddrinfo(res) };
}

#[test]
fn getaddrinfo_without_node_service_or_hints_is_einval() {
    let mut res: *mut rdma_addrinfo = std::ptr::null_mut();
    // Safety: a valid out-pointer.
    let rc = unsafe {
        rdma_getaddrinfo(
            std::ptr::null(),
            std::ptr::null(),
            std::ptr::null(),
            &mut res,
        )
    };
    assert_eq!((rc, crate::capi::errno()), (-1, libc::EINVAL));
    // A hint length without its address is refused rather than read.
    let mut hints = no_hints();
    hints.ai_dst_len = 16;
    // Safety: as above.
    let rc = unsafe { rdma_getaddrinfo(std::ptr::null(), std::ptr::null(), &hints, &mut res) };
    assert_eq!((rc, crate::capi::errno()), (-1, libc::EINVAL));
}

#[test]
fn failure_lines_name_the_errno_the_call_sets() {
    let mut res: *mut rdma_addrinfo = std::ptr::null_mut();
    // Safety: a valid out-pointer.
    unsafe {
        rdma_getaddrinfo(
            std::ptr::null(),
            std::ptr::null(),
            std::ptr::null(),
            &mut res,
        )
    };
    let line = last_failure();
    assert!(line.contains("(Invalid argument"), "{line}");
    // AF_IB: EAFNOSUPPORT, not an I/O error.
    let mut ib: libc::sockaddr_storage =
        // Safety: all-zero is a valid sockaddr_storage.
        unsafe { std::mem::zeroed() };
    ib.ss_family = AF_IB as libc::sa_family_t;
    // Safety: a valid address of its family's size.
    let rc = unsafe { socket_addr("rdma_bind_addr", &ib as *const _ as *const libc::sockaddr) };
    assert!(rc.is_err());
    assert_eq!(crate::capi::errno(), libc::EAFNOSUPPORT);
    let line = last_failure();
    assert!(
        line.contains("(Address family not supported by protocol"),
        "{line}"
    );
    assert!(!line.contains("Input/output error"), "{line}");
    // An error of the CM keeps its own errno in the line too.
    fail(
        "rdma_get_cm_event",
        &RdmaCmError::Timeout(Duration::from_millis(5)),
    );
    assert_eq!(crate::capi::errno(), libc::ETIMEDOUT);
    assert!(last_failure().contains("(Connection timed out"));
}

#[test]
fn migrating_a_synchronous_id_acks_its_held_event_and_makes_it_asynchronous() {
    let test = "migrating_a_synchronous_id_acks_its_held_event_and_makes_it_asynchronous";
    let Some(ch) = channel_or_skip(test) else {
        return;
    };
    let mut id: *mut rdma_cm_id = std::ptr::null_mut();
    // Safety: a NULL channel makes a synchronous id.
    let rc = unsafe {
        rdma_create_id(
            std::ptr::null_mut(),
            &mut id,
            std::ptr::null_mut(),
            RDMA_PS_TCP,
        )
    };
    assert_eq!(rc, 0, "{}", last_failure());
    // Safety: a live id of ours.
    let obj = unsafe { &mut *(id as *mut IdObj) };
    let own_channel = obj.c.channel;
    // What a synchronous call leaves in id->event (here an ADDR_ERROR), unacked.
    let held = c_event(RdmaCmEvent {
        id: obj.id.clone(),
        listen_id: None,
        kind: EventKind::AddrError,
        status: -libc::EHOSTUNREACH,
        param: EventParam::None,
    })
    .expect("the id is live");
    obj.c.event = held;
    let (id_addr, ch_addr) = (id as usize, ch as usize);
    // Safety: both live; the call's own thread is the only user meanwhile.
    let rc = within_5s("rdma_migrate_id of a synchronous id", move || unsafe {
        rdma_migrate_id(
            id_addr as *mut rdma_cm_id,
            ch_addr as *mut rdma_event_channel,
        )
    });
    assert_eq!(rc, 0, "{}", last_failure());
    assert!(obj.c.event.is_null(), "the held event is acked");
    assert!(!is_live(Handed::Event, held));
    assert_eq!(obj.c.channel, ch);
    assert!(!obj.synchronous);
    assert!(
        !is_live(Handed::Channel, own_channel),
        "its own channel is freed"
    );
    // Safety: ours.
    unsafe {
        assert_eq!(rdma_destroy_id(id), 0);
        rdma_destroy_event_channel(ch);
    }
}

#[test]
fn migrating_to_no_channel_makes_the_id_synchronous() {
    let Some(ch) = channel_or_skip("migrating_to_no_channel_makes_the_id_synchronous") else {
        return;
    };
    let mut id: *mut rdma_cm_id = std::ptr::null_mut();
    // Safety: a live channel.
    let rc = unsafe { rdma_create_id(ch, &mut id, std::ptr::null_mut(), RDMA_PS_TCP) };
    assert_eq!(rc, 0, "{}", last_failure());
    // Safety: live.
    let rc = unsafe { rdma_migrate_id(id, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "{}", last_failure());
    // Safety: a live id of ours.
    let obj = unsafe { &*(id as *mut IdObj) };
    assert!(obj.synchronous);
    assert_ne!(obj.c.channel, ch);
    assert!(is_live(Handed::Channel, obj.c.channel));
    // rdma-core: a synchronous id cannot be made synchronous again.
    // Safety: live.
    let rc = unsafe { rdma_migrate_id(id, std::ptr::null_mut()) };
    assert_eq!((rc, crate::capi::errno()), (-1, libc::EINVAL));
    let own = obj.c.channel;
    // Safety: ours; destroying the id frees its own channel.
    unsafe {
        assert_eq!(rdma_destroy_id(id), 0);
        assert!(!is_live(Handed::Channel, own));
        rdma_destroy_event_channel(ch);
    }
}
