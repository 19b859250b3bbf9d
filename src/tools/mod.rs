//! The tools RDMA users already know, in Rust: the out-of-band exchanges of rdma-core's
//! `ibv_rc_pingpong`/`ibv_ud_pingpong` and of perftest, perftest's statistics and output
//! layout, a TCP stream extractor for checking all of it against real captures, and the
//! story `xroce demo` tells.
//!
//! Everything here is plain logic over `Read + Write` streams and numbers, so it is tested
//! without RDMA: `tests/tools_oob_replay.rs` replays the client's bytes recorded from real
//! rxe runs to the server-side logic and compares the reply field by field.
//! See `docs/tools.md`.

pub mod bench;
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
