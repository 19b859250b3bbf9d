//! perftest's eight tests (`ib_{send,write,read,atomic}_{bw,lat}`) as `xroce perf` runs them,
//! byte-compatible with Debian's perftest 4.5 on either side.
//! - [`oob`]: the out-of-band exchange over TCP (the `-R`-less set-up), byte for byte;
//! - [`cm`]: the same exchange when the connection is made through the RDMA CM (`-R`);
//! - [`run`]: the tests themselves over [`crate::endpoint::ToolEndpoint`]s;
//! - [`stats`]: latency and bandwidth computed as perftest computes them;
//! - [`report`]: perftest's text layout and the JSON form;
//! - [`command`]: one `xroce perf` side from its checked options to its report.
pub mod cm;
pub mod command;
pub mod oob;
pub mod report;
pub mod run;
pub mod stats;
