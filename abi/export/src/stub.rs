//! The run-time half of [`c_stubs!`](crate::c_stubs): what a stub does when a program calls it.

use std::ffi::{c_int, c_void};
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

/// The error every stub reports, in `errno` and (for the functions whose convention is to
/// return an error number) as its return value.
pub const ERROR: c_int = libc::EOPNOTSUPP;

/// Says once per symbol, on stderr, `xroce: <name> is not supported: <why>`, and sets `errno`
/// to [`ERROR`]. `said` is the symbol's own flag (one `static` per stub).
pub fn unsupported(said: &AtomicBool, name: &str, why: &str) {
    if !said.swap(true, Ordering::Relaxed) {
        // One write call, so lines of concurrent first calls do not interleave; a closed or
        // full stderr is not the caller's problem.
        let line = format!("xroce: {name} is not supported: {why}\n");
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
    set_errno(ERROR);
}

fn set_errno(value: c_int) {
    // Safety: glibc's `__errno_location` returns this thread's errno slot, valid for the
    // thread's lifetime and written only by this thread.
    unsafe { *libc::__errno_location() = value };
}

/// The return kinds of `c_stubs!`'s table: each names a C return type and the value a call
/// returns, the failure value that the function's documentation gives for it.
#[doc(hidden)]
#[macro_export]
macro_rules! __stub_kind {
    // A pointer: NULL (and errno).
    (ty Null) => { *mut ::core::ffi::c_void };
    (val Null) => { ::core::ptr::null_mut() };
    // `int` whose convention is "0 or the value of errno": EOPNOTSUPP.
    (ty Errno) => { ::core::ffi::c_int };
    (val Errno) => { $crate::stub::ERROR };
    // `int` whose convention is "-errno".
    (ty NegErrno) => { ::core::ffi::c_int };
    (val NegErrno) => { -$crate::stub::ERROR };
    // `int` whose convention is "-1 and errno".
    (ty MinusOne) => { ::core::ffi::c_int };
    (val MinusOne) => { -1 };
    // `ssize_t`, `size_t` or `off_t` whose convention is "-1 and errno".
    (ty SsizeMinusOne) => { isize };
    (val SsizeMinusOne) => { -1 };
    // `bool`: false.
    (ty False) => { bool };
    (val False) => { false };
    // A question about the device whose answer for a device that is not the vendor's is
    // "no", silently, as rdma-core's library answers it for another vendor's device
    // (`mlx5dv_is_supported`: false; `efadv_query_device`: EOPNOTSUPP). UCX and libfabric ask
    // it of every device they see.
    (ty NotThisVendorFalse) => { bool };
    (val NotThisVendorFalse) => { false };
    (ty NotThisVendorErrno) => { ::core::ffi::c_int };
    (val NotThisVendorErrno) => { $crate::stub::ERROR };
    // `uint16_t` (a port number in network order): 0, no port.
    (ty Zero16) => { u16 };
    (val Zero16) => { 0 };
    // `void`.
    (ty Void) => { () };
    (val Void) => { () };
}

/// Whether a stub of this kind says on stderr that it was called.
#[doc(hidden)]
#[macro_export]
macro_rules! __stub_says {
    (NotThisVendorFalse) => {
        false
    };
    (NotThisVendorErrno) => {
        false
    };
    ($other:ident) => {
        true
    };
}

/// Sets `errno` to [`ERROR`] without a word (a stub whose kind answers silently).
pub fn quietly_unsupported() {
    set_errno(ERROR);
}

/// A `const char *` to a static string (for functions that return a name and have no NULL
/// case), as the stub's return value.
#[doc(hidden)]
pub fn static_str(s: &'static [u8]) -> *const c_void {
    debug_assert_eq!(s.last(), Some(&0));
    s.as_ptr().cast()
}
