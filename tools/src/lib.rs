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
//! This crate is the tools' side of xroce: the `xroce` command (`tools/src/main.rs`, arguments in
//! `tools/src/cli/`) and its logic here, over the provider library `xroce`, which depends on none of
//! it. `analysis` is what `xroce dump` makes of a capture; `conform` the conformance suite.
#![forbid(unsafe_code)]

pub mod analysis;
pub mod bench;
pub mod conform;
pub mod demo;
pub mod endpoint;
pub mod file;
pub mod json_line;
pub mod mr_check;
pub mod mw_check;
pub mod options;
pub mod perf;
pub mod perftest_cm;
pub mod perftest_oob;
pub mod pingpong;
pub mod pingpong_oob;
pub mod report;
pub mod setup;
pub mod srq_pingpong;
pub mod stats;
pub mod tcp_streams;
pub mod verbs_endpoint;
