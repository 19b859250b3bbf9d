//! The exported C functions of `libibverbs.so.1` and the objects behind the pointers they
//! hand out.
//!
//! Every object a C program holds is a `Box` whose first field is the C struct (so the
//! pointer the program has is also the pointer to the box), followed by the xroce verbs
//! handle that does the work. The context is a [`Context`] that begins with the
//! `verbs_context`, whose last member is the `ibv_context` the program holds: the extended
//! verbs sit at negative offsets from it, as rdma-core lays them out.
//!
//! Nothing here decides transport behaviour: each call translates its C arguments, calls
//! `xroce::verbs`, and translates the result (an errno for what the verbs layer refused).
//! Panics cannot unwind into C: an `extern "C"` function that panics aborts the process
//! (Rust's rule since 1.81), with the panic message on stderr.
#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_int, c_void};
use std::sync::Mutex;

use xroce::verbs::VerbsError;

pub(crate) mod config;
pub(crate) mod context;
mod datapath;
pub(crate) mod device_list;
mod errors;
mod events;
mod exts;
mod misc;
pub(crate) mod resources;

pub use config::LibraryConfig;

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(value: c_int) {
    // Safety: __errno_location returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = value };
}

/// The calling thread's `errno`.
pub(crate) fn errno() -> c_int {
    // Safety: as in set_errno.
    unsafe { *libc::__errno_location() }
}

/// For a function returning a pointer: null with errno set, and the error logged.
pub(crate) fn fail_ptr<T>(call: &str, err: &VerbsError) -> *mut T {
    let errno = errors::errno_of(err);
    errors::log_failure(call, errno, err);
    set_errno(errno);
    std::ptr::null_mut()
}

/// For a function returning an errno: the errno, logged.
pub(crate) fn fail_int(call: &str, err: &VerbsError) -> c_int {
    let errno = errors::errno_of(err);
    errors::log_failure(call, errno, err);
    errno
}

/// A C pointer to a boxed object, as a plain integer so registries can be shared between
/// threads. The object's owner (the C program) keeps it alive until its destroy call.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct RawObj(pub usize);

impl RawObj {
    pub(crate) fn of<T>(ptr: *mut T) -> RawObj {
        RawObj(ptr as usize)
    }

    pub(crate) fn ptr<T>(self) -> *mut T {
        self.0 as *mut T
    }
}

/// Locks a mutex, surviving a poisoned one (a panic aborts the process anyway).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `(void *)UINTPTR_MAX`: `ibv_context::abi_compat` of an extended context.
pub(crate) const ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;
