//! The libibverbs binary interface of xroce: the `#[repr(C)]` structs that verbs programs read
//! and write directly, the C enum values they carry, and the translation from xroce's own
//! types to them.
//!
//! The layouts are those of rdma-core's `<infiniband/verbs.h>` (the tests check size,
//! alignment and every field offset against rdma-core 44, Debian bookworm). Only structs
//! without pointers live here; the objects that begin with a C struct and carry pointers
//! (`ibv_context`, `ibv_qp`, `ibv_cq`, ...) come with the drop-in `libibverbs.so.1`.
//!
//! Rules of this crate:
//! - Names are rdma-core's, so a reader can put this file next to `verbs.h`. Padding the C
//!   compiler inserts is spelled out as private `_pad` fields, which lets every struct derive
//!   [`bytemuck::Pod`]: any byte pattern is a valid value, so a struct can be read from or
//!   written to application memory as plain bytes.
//! - A C enum field is a `#[repr(transparent)]` `u32` newtype ([`ibv_wc_status`], ...), not
//!   a Rust enum: a C program may store any integer there, and reading it must not be
//!   undefined behaviour.
//! - The C layer only translates: xroce's engine and verbs types say what happened, the
//!   [`translate`] module says how C spells it (`From` one way, `TryFrom` back).
#![deny(unsafe_code)]
#![allow(clippy::missing_safety_doc)]
#![allow(non_camel_case_types)]
#![warn(missing_docs)]

pub mod objects;
mod structs;
pub mod translate;
mod values;

pub use structs::*;
pub use values::*;
pub mod capi;
pub mod rdmacm;
