//! The exported C functions of `libibverbs.so.1`.
#![allow(unsafe_code)]

use std::ffi::c_int;

xroce_abi_export::c_export! { "IBVERBS_1.1";
    /// Probe.
    pub unsafe extern "C" fn ibv_fork_init() -> c_int { 0 }
}
