//! The tools RDMA users already know, in Rust: the out-of-band exchanges of rdma-core's
//! `ibv_rc_pingpong`/`ibv_ud_pingpong` and of perftest, perftest's statistics and output
//! layout, a TCP stream extractor for checking all of it against real captures, and the
//! story `xroce demo` tells.
//!
//! Everything here is plain logic over `Read + Write` streams and numbers, so it is tested
//! without RDMA: `tools/tests/tools_oob_replay.rs` replays the client's bytes recorded from real
//! rxe runs to the server-side logic and compares the reply field by field.
//! See `docs/tools.md`.
//!
//! This crate is the tools' side of xroce: the `xroce` command (`tools/src/main.rs`, arguments
//! in `tools/src/cli/`) and its logic here, over the provider library `xroce`, which depends
//! on none of it. The logic, by family:
//! - [`perftest`]: perftest's eight tests (`xroce perf`): their out-of-band exchange (`oob`,
//!   and the RDMA CM's `cm`), the run, statistics and report layout;
//! - [`pingpong`]: rdma-core's `ibv_*_pingpong` (`xroce pingpong`), its exchange and the SRQ
//!   variant;
//! - [`checks`]: `xroce mr-check` and `xroce mw-check`, a peer's memory checked byte for byte;
//! - [`rping`]: librdmacm's `rping` (`xroce rping`) over xroce's RDMA CM;
//! - [`launch`] (`xroce run`: a program on the drop-in libraries), [`file`], [`demo`] (its
//!   story, and where its endpoints run), [`simulate`] (`xroce sim`), [`bench`] (`xroce bench`), [`analysis`] (what `xroce dump` makes of
//!   a capture), [`conform`] (the conformance suite), [`lab`] (the rxe lab's scripts);
//! - what they share: [`endpoint`] (the slice of verbs a tool needs, and its verbs
//!   implementation), [`setup`], [`options`], [`json_line`], [`tcp_streams`].
#![forbid(unsafe_code)]

pub mod analysis;
pub mod bench;
pub mod checks;
pub mod conform;
pub mod demo;
pub mod endpoint;
pub mod file;
pub mod json_line;
pub mod lab;
pub mod launch;
pub mod options;
pub mod perftest;
pub mod pingpong;
pub mod rping;
pub mod setup;
pub mod simulate;
pub mod tcp_streams;
