//! The `xroce` command: one subcommand per file under `tools/src/cli/`; this file only dispatches.
//! No `unsafe` in the tools: system calls go through the provider's driver layer.
#![forbid(unsafe_code)]

mod cli;

use clap::{Parser, Subcommand};

/// xroce: a userspace RoCEv2 endpoint over AF_XDP, and tools to look at RoCE on the wire.
#[derive(Parser)]
#[command(name = "xroce", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Decode RoCEv2 frames in a pcap/pcapng file and verify every ICRC.
    Dump(cli::dump::Args),
    /// Run a workload between two engines on a simulated lossy network.
    Sim(cli::sim::Args),
    /// Show the RDMA device on a network interface, like `ibv_devinfo -v`.
    Devinfo(cli::devinfo::Args),
    /// Two xroce endpoints run every RDMA operation over a virtual link, explained.
    Demo(cli::demo::Args),
    /// One endpoint of `xroce demo` (started by it inside a network namespace).
    #[command(hide = true)]
    DemoPeer(cli::demo::PeerArgs),
    /// The rxe lab: QEMU guests running Linux soft-RoCE, endpoints attached to their bridge.
    Lab(cli::lab::Args),
    /// ibv_rc_pingpong / ibv_ud_pingpong: RC (or --ud) SEND ping-pong, same options and TCP exchange.
    Pingpong(cli::pingpong::Args),
    /// rping (librdmacm): an RDMA CM connection, then RDMA READ/WRITE pings, same options and wire.
    Rping(cli::rping::Args),
    /// perftest: ib_{send,write,read,atomic}_{bw,lat} with perftest's options and TCP exchange.
    Perf(cli::perf::Args),
    /// RoCE conformance: put a target (rxe, a NIC, xroce) into exact protocol situations.
    Conform(cli::conform::Args),
    /// Own an interface's AF_XDP driver and share it with every local process on it.
    Relay(cli::relay::Args),
    /// Copy a file with RDMA WRITE + WRITE_WITH_IMM and verify its SHA-256.
    File(cli::file::Args),
    /// RDMA READ, WRITE and READ-back of a peer's buffer, checked byte for byte (lab-mr.py's exchange).
    MrCheck(cli::mr_check::Args),
    /// Memory windows used, invalidated and refused against a peer (lab-mw.py's exchange).
    MwCheck(cli::mw_check::Args),
    /// Run an unmodified verbs program (ibv_*, perftest, pyverbs) on xroce's libibverbs.so.1.
    Run(cli::run::Args),
    /// The raw AF_XDP ceiling, kernel UDP and xroce perf side by side on a veth pair (root).
    Bench(cli::bench::Args),
    /// One process of `xroce bench` (started by it inside a network namespace).
    #[command(hide = true)]
    BenchChild(cli::bench::ChildArgs),
}

fn main() {
    // A closed stdout (`xroce ... | head`) must end the process quietly, whichever of the
    // many print!/println! calls (and the sim's trace writer, on its own thread) hits it.
    // Restoring SIGPIPE covers all of them at once, as the C tools get it; a BrokenPipe-
    // mapping writer would have to replace every one of them and still miss the next one.
    xroce::driver::sigpipe::restore_default_sigpipe();
    init_tracing();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Dump(args) => cli::dump::run(args),
        Command::Sim(args) => cli::sim::run(args),
        Command::Devinfo(args) => cli::devinfo::run(args),
        Command::Demo(args) => cli::demo::run(args),
        Command::DemoPeer(args) => cli::demo::run_peer(args),
        Command::Lab(args) => cli::lab::run(args),
        Command::Pingpong(args) => cli::pingpong::run(args),
        Command::Rping(args) => cli::rping::run(args),
        Command::Perf(args) => cli::perf::run(args),
        Command::Conform(args) => cli::conform::run(args),
        Command::Relay(args) => cli::relay::run(args),
        Command::File(args) => cli::file::run(args),
        Command::MrCheck(args) => cli::mr_check::run(args),
        Command::MwCheck(args) => cli::mw_check::run(args),
        Command::Run(args) => cli::run::run(args),
        Command::Bench(args) => cli::bench::run(args),
        Command::BenchChild(args) => cli::bench::run_child(args),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            eprintln!("xroce: error: {}", xroce_tools::setup::error_text(&err));
            std::process::exit(1);
        }
    }
}

/// Sends the library's `tracing` events to stderr (stdout carries the tools' output and
/// JSON): warnings and errors by default, what `RUST_LOG` asks for when it is set (e.g.
/// `RUST_LOG=debug`, `RUST_LOG=xroce::verbs=trace`; an invalid directive is skipped).
fn init_tracing() {
    use std::io::IsTerminal as _;
    use tracing_subscriber::filter::{EnvFilter, LevelFilter};
    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::WARN.into())
        .from_env_lossy();
    // Only fails if a subscriber is already set, which nothing here does.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
