//! `xroce mr-check server|client`: RDMA READ, WRITE and READ-back of a peer's registered
//! buffer, checked byte for byte. Speaks `lab-mr.py`'s exchange, so it pairs with itself or
//! with the rxe lab's guests (`lab-mr.py server|client`).
use std::time::Duration;

use super::peer::{PeerArgs, Side};
use rand::RngCore;
use xroce_tools::checks::mr::{self as mr_check, MrCheckOptions};
use xroce_tools::endpoint::verbs::{self as verbs_endpoint, EndpointSpec};
use xroce_tools::options;
use xroce_tools::setup;

const EXAMPLES: &str = "\
Examples:
  # xroce exposes 4 MiB, another xroce checks it:
  xroce mr-check server -d veth0 --size 4194304
  xroce mr-check client -d veth1 --size 4194304 198.18.0.1
  # against rxe in the lab (guest 1 runs pyverbs' lab-mr.py):
  xroce lab exec 1 'lab-bg mr lab-mr.py server --size 4194304'
  ip netns exec xroce-lab-host xroce mr-check client -d eth0 -g 1 --size 4194304 198.18.0.11";

/// Options both sides take.
#[derive(clap::Args, Debug)]
pub struct Common {
    #[command(flatten)]
    pub peer: PeerArgs,
    /// TCP port of the exchange (lab-mr.py's default).
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,
    /// Bytes to READ and WRITE (both sides must agree).
    #[arg(long, default_value_t = 4 << 20)]
    pub size: usize,
    /// Path MTU: 256, 512, 1024, 2048 or 4096; both sides must use the same (lab-mr.py's
    /// default is 1024).
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    pub mtu: u32,
    /// Bytes per work request (client).
    #[arg(long, default_value_t = 1 << 20)]
    pub chunk: usize,
    /// Work requests in flight (client).
    #[arg(long, default_value_t = 4)]
    pub depth: usize,
    /// Seconds without progress before giving up.
    #[arg(long = "stall-timeout", default_value_t = 30)]
    pub stall_timeout: u64,
}

/// Arguments.
#[derive(clap::Args, Debug)]
#[command(
    mut_subcommand("server", |side| side.about("Expose an MR of --size random bytes and answer one client").after_help(EXAMPLES)),
    mut_subcommand("client", |side| side.about("READ the server's MR, WRITE fresh random bytes into it, READ them back; check each").after_help(EXAMPLES))
)]
pub struct Args {
    #[command(subcommand)]
    pub role: Side<Common>,
}

fn mb_per_s(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64().max(1e-9) / 1e6
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let common = args.role.common();
    let opts = MrCheckOptions {
        size: common.size,
        chunk: common.chunk,
        depth: common.depth,
        mtu: common.mtu,
        stall_timeout: Duration::from_secs(common.stall_timeout),
    };
    opts.validate()?;
    options::tcp_port("-p/--port", common.port)?;
    let (dev, gid) = common.peer.device_and_gid()?;
    // Validates -m against the link (a path MTU above it would be dropped on the wire).
    setup::pick_mtu(&dev, Some(opts.mtu))?;
    let spec = EndpointSpec {
        qp_type: xroce::engine::QpType::Rc,
        buf_len: opts.size,
        max_send_wr: opts.depth as u32 + 1,
        max_recv_wr: 1,
        driver: common.peer.driver,
        events: false,
        pcap: common.peer.pcap.clone(),
        progress: Default::default(),
        shards: 1,
    };
    let mut eps = verbs_endpoint::open(&dev, &gid, &spec, 1)?;
    let mut data = vec![0u8; opts.size];
    rand::thread_rng().fill_bytes(&mut data);
    match &args.role {
        Side::Server { common } => {
            let mut stream = setup::accept_one(common.port)?;
            // The client READs and WRITEs between its lines; give it the RDMA timeout many
            // times over before deciding it is gone.
            stream.set_read_timeout(Some(opts.stall_timeout * 10))?;
            let done = mr_check::server(
                eps[0].as_mut(),
                &mut stream,
                &opts,
                setup::random_psn(),
                &data,
            )?;
            println!(
                "mr-check server: {} bytes exposed (sha256 {}), {} WRITE digest(s) reported, peer finished",
                done.size,
                done.initial_sha256,
                done.written_sha256.len()
            );
            Ok(0)
        }
        Side::Client { host, common } => {
            let mut stream = setup::connect(host, common.port, Duration::from_secs(10))?;
            stream.set_read_timeout(Some(opts.stall_timeout * 2))?;
            let done = mr_check::client(
                eps[0].as_mut(),
                &mut stream,
                &opts,
                setup::random_psn(),
                &data,
            )?;
            let n = done.size;
            println!(
                "mr-check client: READ {n} B ok ({:.1} MB/s), WRITE {n} B ok, server digest matches ({:.1} MB/s), READ back ok, byte for byte ({:.1} MB/s)",
                mb_per_s(n, done.read),
                mb_per_s(n, done.write),
                mb_per_s(n, done.read_back),
            );
            Ok(0)
        }
    }
}
