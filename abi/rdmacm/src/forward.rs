//! The forwarded calls: each exported `rdma_*` finds `xroce_rdmacm_rdma_*` in xroce's
//! libibverbs once and calls it with its own arguments.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The version node libibverbs exports the CM under.
const NODE: &CStr = c"XROCE_RDMACM_PRIVATE";

/// One forwarded function's target, looked up at its first call (0: not yet; 1: missing).
pub(crate) struct Slot(AtomicUsize);

impl Slot {
    pub(crate) const fn new() -> Slot {
        Slot(AtomicUsize::new(0))
    }

    /// The address of `xroce_rdmacm_<name>` (`symbol`, NUL-terminated), or `None` with the
    /// stub's behaviour (one line on stderr, errno EOPNOTSUPP).
    pub(crate) fn get(&self, name: &str, symbol: &CStr, said: &AtomicBool) -> Option<usize> {
        let mut addr = self.0.load(Ordering::Acquire);
        if addr == 0 {
            addr = lookup(symbol).unwrap_or(1);
            self.0.store(addr, Ordering::Release);
        }
        if addr == 1 {
            xroce_abi_export::stub::unsupported(
                said,
                name,
                "xroce's librdmacm.so.1 needs xroce's libibverbs.so.1, and the one loaded is not \
                 (xroce run puts both first on LD_LIBRARY_PATH)",
            );
            return None;
        }
        Some(addr)
    }
}

fn lookup(symbol: &CStr) -> Option<usize> {
    let soname = c"libibverbs.so.1";
    // Safety: dlopen/dlvsym with NUL-terminated names; the handle stays open (a reference
    // the process holds until exit, as the program's own NEEDED entry does).
    unsafe {
        let mut lib = libc::dlopen(soname.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if lib.is_null() {
            lib = libc::dlopen(soname.as_ptr(), libc::RTLD_NOW);
        }
        if lib.is_null() {
            return None;
        }
        let f = libc::dlvsym(lib, symbol.as_ptr(), NODE.as_ptr());
        (!f.is_null()).then_some(f as usize)
    }
}

/// Exports each `fn` under its version node; its body calls the twin, or returns `$fail`.
macro_rules! forward {
    ($version:literal; $(
        fn $name:ident ( $($arg:ident : $argty:ty),* ) -> $ret:ty = $fail:expr;
    )*) => {$(
        xroce_abi_export::c_export! { $version;
            #[doc = concat!("`", stringify!($name), "`, forwarded to xroce's libibverbs.")]
            #[allow(clippy::unused_unit)]
            pub unsafe extern "C" fn $name($($arg: $argty),*) -> $ret {
                static SLOT: Slot = Slot::new();
                static SAID: AtomicBool = AtomicBool::new(false);
                let symbol = concat!("xroce_rdmacm_", stringify!($name), "\0");
                let symbol = CStr::from_bytes_with_nul(symbol.as_bytes()).expect("NUL-terminated");
                match SLOT.get(stringify!($name), symbol, &SAID) {
                    Some(addr) => {
                        // Safety: the twin has this very signature (abi/ibverbs/src/rdmacm).
                        let f: unsafe extern "C" fn($($argty),*) -> $ret =
                            unsafe { std::mem::transmute::<usize, _>(addr) };
                        // Safety: the caller's arguments, passed on unchanged.
                        unsafe { f($($arg),*) }
                    }
                    None => $fail,
                }
            }
        }
    )*};
}

type Ptr = *mut c_void;

forward! { "RDMACM_1.0";
    fn rdma_create_event_channel() -> Ptr = std::ptr::null_mut();
    fn rdma_destroy_event_channel(channel: Ptr) -> () = ();
    fn rdma_create_id(channel: Ptr, id: *mut Ptr, context: Ptr, ps: u32) -> c_int = -1;
    fn rdma_destroy_id(id: Ptr) -> c_int = -1;
    fn rdma_bind_addr(id: Ptr, addr: Ptr) -> c_int = -1;
    fn rdma_resolve_addr(id: Ptr, src: Ptr, dst: Ptr, timeout_ms: c_int) -> c_int = -1;
    fn rdma_resolve_route(id: Ptr, timeout_ms: c_int) -> c_int = -1;
    fn rdma_create_qp(id: Ptr, pd: Ptr, attr: Ptr) -> c_int = -1;
    fn rdma_create_qp_ex(id: Ptr, attr: Ptr) -> c_int = -1;
    fn rdma_destroy_qp(id: Ptr) -> () = ();
    fn rdma_connect(id: Ptr, conn_param: Ptr) -> c_int = -1;
    fn rdma_listen(id: Ptr, backlog: c_int) -> c_int = -1;
    fn rdma_accept(id: Ptr, conn_param: Ptr) -> c_int = -1;
    fn rdma_reject(id: Ptr, private_data: *const c_void, len: u8) -> c_int = -1;
    fn rdma_disconnect(id: Ptr) -> c_int = -1;
    fn rdma_get_cm_event(channel: Ptr, event: *mut Ptr) -> c_int = -1;
    fn rdma_ack_cm_event(event: Ptr) -> c_int = -1;
    fn rdma_get_src_port(id: Ptr) -> u16 = 0;
    fn rdma_get_dst_port(id: Ptr) -> u16 = 0;
    fn rdma_get_devices(num_devices: *mut c_int) -> Ptr = std::ptr::null_mut();
    fn rdma_free_devices(list: Ptr) -> () = ();
    fn rdma_set_option(id: Ptr, level: c_int, optname: c_int, optval: Ptr, optlen: usize) -> c_int = -1;
    fn rdma_migrate_id(id: Ptr, channel: Ptr) -> c_int = -1;
    fn rdma_getaddrinfo(node: *const c_char, service: *const c_char, hints: Ptr, res: *mut Ptr) -> c_int = -1;
    fn rdma_freeaddrinfo(res: Ptr) -> () = ();
    fn rdma_create_ep(id: *mut Ptr, res: Ptr, pd: Ptr, qp_init_attr: Ptr) -> c_int = -1;
    fn rdma_destroy_ep(id: Ptr) -> () = ();
    fn rdma_get_request(listen: Ptr, id: *mut Ptr) -> c_int = -1;
}

forward! { "RDMACM_1.2";
    fn rdma_establish(id: Ptr) -> c_int = -1;
    fn rdma_init_qp_attr(id: Ptr, qp_attr: Ptr, qp_attr_mask: *mut c_int) -> c_int = -1;
}

/// `rdma_event_str`'s names, by `enum rdma_cm_event_type` value.
const EVENT_NAMES: [&CStr; 16] = [
    c"RDMA_CM_EVENT_ADDR_RESOLVED",
    c"RDMA_CM_EVENT_ADDR_ERROR",
    c"RDMA_CM_EVENT_ROUTE_RESOLVED",
    c"RDMA_CM_EVENT_ROUTE_ERROR",
    c"RDMA_CM_EVENT_CONNECT_REQUEST",
    c"RDMA_CM_EVENT_CONNECT_RESPONSE",
    c"RDMA_CM_EVENT_CONNECT_ERROR",
    c"RDMA_CM_EVENT_UNREACHABLE",
    c"RDMA_CM_EVENT_REJECTED",
    c"RDMA_CM_EVENT_ESTABLISHED",
    c"RDMA_CM_EVENT_DISCONNECTED",
    c"RDMA_CM_EVENT_DEVICE_REMOVAL",
    c"RDMA_CM_EVENT_MULTICAST_JOIN",
    c"RDMA_CM_EVENT_MULTICAST_ERROR",
    c"RDMA_CM_EVENT_ADDR_CHANGE",
    c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
];

xroce_abi_export::c_export! { "RDMACM_1.0";
    /// `rdma_event_str`: the event's name, "UNKNOWN EVENT" for a value rdma-core does not know.
    pub unsafe extern "C" fn rdma_event_str(event: c_int) -> *const c_char {
        usize::try_from(event)
            .ok()
            .and_then(|i| EVENT_NAMES.get(i))
            .map_or(c"UNKNOWN EVENT".as_ptr(), |name| name.as_ptr())
    }
}
