//! `xroce rping`: the arguments of librdmacm's `rping` (its getopt letters), handed to
//! [`xroce_tools::rping`], which does what rping does.
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use anyhow::{bail, Context as _};
use xroce::rdmacm::Cm;
use xroce::verbs::Device;
use xroce_tools::endpoint::verbs::{self as verbs_endpoint, DriverChoice};
use xroce_tools::rping::{
    pick_interface, resolve_host, run_client, run_server, RpingOptions, DEFAULT_PORT,
};

const EXAMPLES: &str = "\
Examples:
  # server on the address of eth0 (or every address without -a), then the client:
  xroce rping -s -v -C 10 -a 198.18.0.2
  xroce rping -c -v -V -C 10 -a 198.18.0.2
  # against the C rping on an rxe host (rdmacm-utils):  rping -s -v -C 10
  xroce rping -c -v -V -C 10 -S 4096 -a 198.18.0.11
  # a server that stays for client after client:
  xroce rping -s -P -v";

/// Arguments: rping's (single letters, as its getopt string \"a:I:Pp:C:S:t:scvVdq\"), plus
/// xroce's interface and driver choice.
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES, disable_version_flag = true)]
pub struct Args {
    /// Server side.
    #[arg(short = 's', conflicts_with = "client")]
    pub server: bool,
    /// Client side.
    #[arg(short = 'c')]
    pub client: bool,
    /// Server: the address to bind to (default: every address); client: the server's.
    #[arg(short = 'a', value_name = "ADDR")]
    pub addr: Option<String>,
    /// Client: the source address to bind to.
    #[arg(short = 'I', value_name = "ADDR")]
    pub source: Option<String>,
    /// Port (the server listens on it, the client connects to it).
    #[arg(short = 'p', value_name = "PORT", default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Pings per connection (0: forever).
    #[arg(short = 'C', value_name = "COUNT", default_value_t = 0)]
    pub count: u64,
    /// Ping size in bytes.
    #[arg(short = 'S', value_name = "SIZE", default_value_t = 64)]
    pub size: usize,
    /// Print the ping data.
    #[arg(short = 'v', action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Validate the ping data (client).
    #[arg(short = 'V')]
    pub validate: bool,
    /// Debug lines.
    #[arg(short = 'd', action = clap::ArgAction::Count)]
    pub debug: u8,
    /// Persistent server: serve clients until killed.
    #[arg(short = 'P', requires = "server")]
    pub persistent: bool,
    /// Create and move the QP in the program (rdma_init_qp_attr, rdma_establish) instead
    /// of letting the CM do it.
    #[arg(short = 'q')]
    pub self_create_qp: bool,
    /// Type of service of the connection (rdma_set_option RDMA_OPTION_ID_TOS).
    #[arg(short = 't', value_name = "TOS")]
    pub tos: Option<u8>,
    /// Network interface (the RDMA device); default: the one holding -I / -a (server), the
    /// one the route to -a leaves by (client), else the first one up with an IPv4 address.
    #[arg(short = 'D', long = "ib-dev", value_name = "IFACE")]
    pub ib_dev: Option<String>,
    /// Frame driver: AF_XDP (root), a kernel UDP socket, or the interface's relay.
    #[arg(long = "driver", value_parser = super::values::driver(), default_value_t = DriverChoice::Xdp)]
    pub driver: DriverChoice,
    /// Write every frame this endpoint sends and receives to FILE (pcap).
    #[arg(long = "pcap", value_name = "FILE")]
    pub pcap: Option<std::path::PathBuf>,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<i32> {
    if !args.server && !args.client {
        bail!("give -s (server) or -c (client); see xroce rping --help");
    }
    let opts = RpingOptions {
        count: args.count,
        size: args.size,
        verbose: args.verbose > 0,
        validate: args.validate,
        debug: args.debug > 0,
        self_create_qp: args.self_create_qp,
        tos: args.tos,
    };
    opts.check()?;
    let addr = args.addr.as_deref().map(resolve_host).transpose()?;
    let source = args.source.as_deref().map(resolve_host).transpose()?;
    let info = if args.server {
        pick_interface(
            args.ib_dev.as_deref(),
            addr.filter(|a| !a.is_unspecified()),
            None,
        )?
    } else {
        let Some(dst) = addr else {
            bail!("the client needs the server's address: -a ADDR");
        };
        pick_interface(args.ib_dev.as_deref(), source, Some(dst))?
    };
    opts.debug(|| format!("device {} (driver {})", info.name, args.driver.name()));
    let device = Device::open(
        &info.name,
        verbs_endpoint::device_config(args.driver, args.pcap.clone()),
    )
    .with_context(|| format!("opening {}", info.name))?;
    let cm = Cm::new(std::slice::from_ref(&device)).context("starting the RDMA CM")?;
    if args.server {
        let ip = addr.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        run_server(&cm, SocketAddr::new(ip, args.port), args.persistent, &opts)?;
    } else {
        let dst = SocketAddr::new(addr.expect("checked above"), args.port);
        run_client(&cm, source.map(|s| SocketAddr::new(s, 0)), dst, &opts)?;
    }
    Ok(0)
}
