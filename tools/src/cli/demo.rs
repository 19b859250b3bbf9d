//! `xroce demo`: two xroce endpoints doing every RDMA operation over a real (virtual) link,
//! explained for a newcomer, verified byte for byte. The arguments; where the endpoints run
//! is `xroce_tools::demo::stage`, what they do and say is the story in `xroce_tools::demo`.
use std::net::SocketAddr;

use anyhow::{bail, Context};

use xroce_tools::demo::stage::{self, DemoDriver, DemoOptions, PeerOptions};
use xroce_tools::demo::Side;

/// Two xroce endpoints run every RDMA operation over a virtual link, explained step by step.
///
/// Examples:
///   sudo xroce demo                   AF_XDP between two network namespaces
///   xroce demo --driver udp           kernel UDP sockets on loopback, no root needed
///   sudo xroce demo --mtu 9000        a 9000-byte link: path MTU 4096
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Driver (default: xdp as root, udp otherwise).
    #[arg(long, value_parser = super::values::demo_driver())]
    pub driver: Option<DemoDriver>,
    /// Link MTU of the veth pair (1500 gives path MTU 1024, 9000 gives 4096).
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u32).range(576..=9000))]
    pub mtu: u32,
    /// Message size in bytes of SEND, WRITE and READ.
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u32).range(0..=(64 << 20)))]
    pub size: u32,
    /// Most packets to show in the trace (0: no trace).
    #[arg(long, default_value_t = 40)]
    pub trace: usize,
    /// Write every frame the client endpoint sends and receives to FILE (pcap, Ethernet).
    #[arg(long = "pcap", value_name = "FILE")]
    pub pcap: Option<std::path::PathBuf>,
}

/// The endpoint process `xroce demo` starts in each namespace (not for direct use).
#[derive(clap::Args, Debug)]
pub struct PeerArgs {
    /// server or client.
    #[arg(long)]
    pub role: String,
    /// Interface to open.
    #[arg(long)]
    pub ifname: String,
    /// Driver.
    #[arg(long, value_parser = super::values::demo_driver())]
    pub driver: DemoDriver,
    /// Server: address to listen on; client: server address to connect to.
    #[arg(long)]
    pub addr: SocketAddr,
    /// Message size.
    #[arg(long)]
    pub size: u32,
    /// Most packets to show in the trace.
    #[arg(long, default_value_t = 40)]
    pub trace: usize,
    /// Write this endpoint's frames to FILE (pcap).
    #[arg(long = "pcap", value_name = "FILE")]
    pub pcap: Option<std::path::PathBuf>,
}

/// Runs `xroce demo`.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let driver = stage::choose_driver(args.driver)?;
    let exe = std::env::current_exe().context("locating the xroce binary")?;
    let opts = DemoOptions {
        mtu: args.mtu,
        size: args.size,
        trace: args.trace,
        pcap: args.pcap,
    };
    Ok(if stage::run_demo(driver, &opts, &exe)? {
        0
    } else {
        1
    })
}

/// Runs `xroce demo-peer` (one endpoint, inside a namespace).
pub fn run_peer(args: PeerArgs) -> anyhow::Result<i32> {
    let side = match args.role.as_str() {
        "server" => Side::Server,
        "client" => Side::Client,
        other => bail!("--role must be server or client, not {other:?}"),
    };
    let ok = stage::run_peer(PeerOptions {
        side,
        ifname: args.ifname,
        driver: args.driver,
        addr: args.addr,
        size: args.size,
        trace: args.trace,
        pcap: args.pcap,
    })?;
    Ok(if ok { 0 } else { 1 })
}
