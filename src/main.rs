//! The `xroce` command: one subcommand per file under `src/cli/`; this file only dispatches.
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
    /// The rxe lab: QEMU guests running Linux soft-RoCE, endpoints attached to their bridge.
    Lab(cli::lab::Args),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Dump(args) => cli::dump::run(args),
        Command::Sim(args) => cli::sim::run(args),
        Command::Devinfo(args) => cli::devinfo::run(args),
        Command::Lab(args) => cli::lab::run(args),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            eprintln!("xroce: error: {err:#}");
            std::process::exit(1);
        }
    }
}
