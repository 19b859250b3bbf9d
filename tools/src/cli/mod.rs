//! One module per subcommand. Each has `Args` (clap) and `run(Args) -> anyhow::Result<i32>`
//! returning the process exit status.
pub mod bench;
pub mod conform;
pub mod demo;
pub mod devinfo;
pub mod dump;
pub mod file;
pub mod lab;
pub mod mr_check;
pub mod mw_check;
pub mod peer;
pub mod perf;
pub mod pingpong;
pub mod relay;
pub mod rping;
pub mod run;
pub mod sim;
pub mod values;
