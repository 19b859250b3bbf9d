//! xroce: a pure-Rust userspace RoCEv2 provider over AF_XDP.
//!
//! Layers, bottom up (see `docs/architecture.md`):
//! - [`wire`]: zero-copy views and `Repr` structs for every RoCEv2 header, ICRC, whole frames.
//! - [`capture`]: reading and writing pcap/pcapng files around the wire layer.
//! - [`cm`]: the IB communication manager's protocol (IBTA chapter 12), sans-IO.
//! - [`engine`]: the sans-IO RC/UD transport (requester, responder, completer); time is an argument.
//! - [`sim`]: a deterministic simulated network that drives engines on a virtual clock.
//! - [`dma`]: the application's memory under a memory region (the engine keeps it).
//! - [`driver`]: moving frames: AF_XDP, kernel UDP socket, in-memory. With [`dma`], the only
//!   modules allowed `unsafe` code (`#![deny(unsafe_code)]` everywhere else), each block with
//!   a `// Safety:` comment (`clippy::undocumented_unsafe_blocks`).
//! - [`verbs`]: the libibverbs-like public API with a progress thread per device.
//! - [`netns`]: network namespaces and veth pairs (with Drop guards) for tests and the demo.
//! - [`rdmacm`]: the RDMA CM's connection ids and event channels over [`cm`] and [`verbs`].
//!
//! This crate is the provider: it depends on no CLI, terminal, hashing or temp-file crate, so
//! an application embedding it (and the C libraries built on it) carry none. The `xroce`
//! command and its tools are the `xroce-tools` crate in `tools/`.
#![forbid(unsafe_op_in_unsafe_fn)]
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod capture;
pub mod cm;
// The driver layer, the only code allowed `unsafe`: the application's memory (on the floor
// below the engine, which keeps it) and the drivers.
#[allow(unsafe_code)]
pub mod dma;
#[allow(unsafe_code)]
pub mod driver;
pub mod engine;
pub mod netdev;
pub mod netns;
pub mod rdmacm;
pub mod sim;
pub mod verbs;
pub mod wire;
