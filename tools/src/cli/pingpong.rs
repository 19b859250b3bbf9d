//! `xroce pingpong`: rdma-core's `ibv_rc_pingpong` (with `--uc`, `ibv_uc_pingpong`; with
//! `--ud`, `ibv_ud_pingpong`; with `--srq`, `ibv_srq_pingpong`), same options, same TCP
//! exchange, same output. Interoperates with the C tools.
use std::time::Duration;

use xroce::verbs::attr::limits;
use xroce::verbs::ProgressMode;
use xroce_tools::endpoint::verbs::{self as verbs_endpoint, DriverChoice, EndpointSpec};
use xroce_tools::options;
use xroce_tools::perftest::oob::Role;
use xroce_tools::pingpong::oob::DEFAULT_PORT;
use xroce_tools::pingpong::{self, PingpongOptions};
use xroce_tools::setup;

const EXAMPLES: &str = "\
Examples:
  # server (in one namespace / host), then the client pointing at it:
  xroce pingpong -d veth0 -g 1
  xroce pingpong -d veth1 -g 1 198.18.0.1
  # against rdma-core on an rxe host: ibv_rc_pingpong -g 1 -d rxe0 <xroce host>
  xroce pingpong -d eth0 -g 1 -s 65536 -n 100 198.18.0.11
  # UC, like ibv_uc_pingpong (no ACKs: a lost message stalls the exchange):
  xroce pingpong --uc -d eth0 -g 1 198.18.0.11
  # UD, like ibv_ud_pingpong (messages up to the path MTU):
  xroce pingpong --ud -d eth0 -g 1 -s 1024
  # 16 RC QPs sharing one receive queue, like ibv_srq_pingpong (same -q on both sides):
  xroce pingpong --srq -q 16 -d eth0 -g 1 198.18.0.11";

/// Arguments (rdma-core's names; `-i` must be 1: an xroce device has one port).
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// Server to connect to; without it, wait for a client (server mode).
    pub host: Option<String>,
    /// Listen on / connect to this TCP port.
    #[arg(short = 'p', long = "port", default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Network interface (the "IB device"); default: the first one up with an IPv4 address.
    #[arg(short = 'd', long = "ib-dev")]
    pub ib_dev: Option<String>,
    /// Port of the device (xroce devices have port 1 only).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u32,
    /// Message size in bytes (default 4096; 1024 with --ud).
    #[arg(short = 's', long = "size")]
    pub size: Option<usize>,
    /// Path MTU: 256, 512, 1024, 2048 or 4096 (RC and UC).
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    pub mtu: u32,
    /// Receives to post at a time (default 500; 1000 with --uc, as ibv_uc_pingpong).
    #[arg(short = 'r', long = "rx-depth")]
    pub rx_depth: Option<u32>,
    /// Number of exchanges.
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    pub iters: u64,
    /// Service level.
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    pub sl: u8,
    /// Sleep on CQ events (completion channel) instead of busy polling.
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// Local GID index (RoCE needs one; default: the first IPv4 GID, usually 1).
    #[arg(short = 'g', long = "gid-idx")]
    pub gid_idx: Option<u32>,
    /// Validate the received buffer (server side).
    #[arg(short = 'c', long = "chk")]
    pub chk: bool,
    /// Unreliable datagram, as ibv_ud_pingpong (Q_Key 0x11111111, GRH space in receives).
    #[arg(long = "ud", conflicts_with = "uc")]
    pub ud: bool,
    /// Unreliable connected, as ibv_uc_pingpong (SENDs without ACKs or retries).
    #[arg(long = "uc", conflicts_with = "srq")]
    pub uc: bool,
    /// Several RC QPs on one shared receive queue and one CQ, as ibv_srq_pingpong (-q QPs;
    /// -r is the SRQ's depth; -n counts the exchanges of all QPs together).
    #[arg(long = "srq", conflicts_with = "ud")]
    pub srq: bool,
    /// Number of QPs with --srq (ibv_srq_pingpong's -q, default 16; at most 256 and -r).
    #[arg(short = 'q', long = "num-qp", requires = "srq")]
    pub num_qp: Option<usize>,
    /// Frame driver: AF_XDP (root), a kernel UDP socket, or the interface's relay.
    #[arg(long = "driver", value_parser = super::values::driver(), default_value_t = DriverChoice::Xdp)]
    pub driver: DriverChoice,
    /// Write every frame this endpoint sends and receives to FILE (pcap, Ethernet link
    /// type): over AF_XDP, tcpdump on the interface sees no RoCE frames.
    #[arg(long = "pcap", value_name = "FILE")]
    pub pcap: Option<std::path::PathBuf>,
    /// How the device's background progress thread waits (a thread polling its CQ makes
    /// progress itself either way; docs/performance.md says when each is right).
    #[arg(long = "progress", value_parser = super::values::progress(), default_value_t = ProgressMode::Wakeup)]
    pub progress: ProgressMode,
    /// Engine shards of the device (1..=64; AF_XDP needs at least as many receive queues).
    #[arg(long = "shards", default_value_t = 1)]
    pub shards: u32,
}

impl Args {
    /// The QP type the flags choose.
    fn qp_type(&self) -> xroce::engine::QpType {
        use xroce::engine::QpType;
        match (self.ud, self.uc) {
            (true, _) => QpType::Ud,
            (_, true) => QpType::Uc,
            _ => QpType::Rc,
        }
    }
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<i32> {
    if args.ib_port != 1 {
        anyhow::bail!(
            "-i {}: xroce devices have a single port; use -i 1",
            args.ib_port
        );
    }
    if !args.ud && ![256, 512, 1024, 2048, 4096].contains(&args.mtu) {
        anyhow::bail!(
            "-m {}: path MTU must be 256, 512, 1024, 2048 or 4096",
            args.mtu
        );
    }
    options::tcp_port("-p/--port", args.port)?;
    let rx_depth = args.rx_depth.unwrap_or(if args.uc { 1000 } else { 500 });
    options::in_range(
        "--shards",
        args.shards,
        1,
        xroce::verbs::MAX_SHARDS,
        "engine shards of the device",
    )?;
    options::in_range(
        "-r/--rx-depth",
        rx_depth,
        2,
        limits::MAX_QP_WR,
        "receives are re-posted when one is left; the device's max_qp_wr",
    )?;
    options::in_range(
        "-n/--iters",
        args.iters,
        1,
        i32::MAX as u64,
        "ibv_rc_pingpong's int",
    )?;
    // The SL field is 4 bits (the SL of the address vector; perftest's MAX_SL is 15 too).
    options::in_range("-l/--sl", args.sl, 0, 15, "a service level is 4 bits")?;
    if let Some(size) = args.size {
        options::in_range(
            "-s/--size",
            size,
            1,
            limits::MAX_MR_SIZE as usize,
            "the message buffer is one memory region, at most 1 GiB",
        )?;
    }
    let dev = setup::pick_device(args.ib_dev.as_deref())?;
    let gid = setup::pick_gid(&dev, args.gid_idx, "-g")?;
    let mtu = setup::pick_mtu(
        &dev,
        Some(if args.ud {
            dev.active_mtu().map(|m| m.bytes()).unwrap_or(1024)
        } else {
            args.mtu
        }),
    )?;
    if args.srq {
        return run_srq(&args, &dev, &gid, rx_depth, mtu);
    }
    let opts = PingpongOptions {
        size: args.size.unwrap_or(if args.ud { 1024 } else { 4096 }),
        iters: args.iters,
        rx_depth,
        mtu,
        sl: args.sl,
        validate: args.chk,
        ud: args.ud,
        events: args.events,
        stall_timeout: Duration::from_secs(30),
    };
    let spec = EndpointSpec {
        qp_type: args.qp_type(),
        buf_len: pingpong::buffer_len(&opts),
        max_send_wr: 1,
        max_recv_wr: rx_depth,
        driver: args.driver,
        events: args.events,
        pcap: args.pcap.clone(),
        progress: args.progress,
        shards: args.shards,
    };
    let mut eps = verbs_endpoint::open(&dev, &gid, &spec, 1)?;
    let ep = eps[0].as_mut();
    let role = if args.host.is_some() {
        Role::Client
    } else {
        Role::Server
    };
    let open_stream = || match &args.host {
        Some(host) => setup::connect(host, args.port, Duration::from_secs(10)),
        None => setup::accept_one(args.port),
    };
    let mut stdout = std::io::stdout();
    pingpong::run(
        ep,
        open_stream,
        role,
        &opts,
        setup::random_psn(),
        &mut stdout,
    )?;
    Ok(0)
}

/// `--srq`: ibv_srq_pingpong.
fn run_srq(
    args: &Args,
    dev: &xroce::netdev::NetdevInfo,
    gid: &xroce::netdev::GidEntry,
    rx_depth: u32,
    mtu: u32,
) -> anyhow::Result<i32> {
    use xroce_tools::pingpong::srq::{SrqPingpong, SrqPingpongOptions};
    if args.chk {
        anyhow::bail!("-c/--chk: ibv_srq_pingpong has no validation option; drop -c");
    }
    let opts = SrqPingpongOptions {
        size: args.size.unwrap_or(4096),
        iters: args.iters,
        rx_depth,
        num_qp: args.num_qp.unwrap_or(16),
        mtu,
        sl: args.sl,
        events: args.events,
        stall_timeout: Duration::from_secs(30),
    };
    opts.validate()?;
    let config = xroce::verbs::DeviceConfig {
        progress: args.progress,
        shards: args.shards,
        ..verbs_endpoint::device_config(args.driver, args.pcap.clone())
    };
    let device = xroce::verbs::Device::open(&dev.name, config)?;
    let mut pp = SrqPingpong::create(&device, gid.index, &opts)?;
    let role = if args.host.is_some() {
        Role::Client
    } else {
        Role::Server
    };
    let open_stream = || match &args.host {
        Some(host) => setup::connect(host, args.port, Duration::from_secs(10)),
        None => setup::accept_one(args.port),
    };
    let mut stdout = std::io::stdout();
    pp.run(open_stream, role, &opts, setup::random_psn, &mut stdout)?;
    Ok(0)
}
