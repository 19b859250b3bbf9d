//! `xroce mw-check server|client`: memory windows (type 1 and 2, LOCAL_INV, SEND_WITH_INV)
//! used and refused against a peer, its memory checked byte for byte after every step.
//! Speaks `lab-mw.py`'s exchange, so it pairs with itself or with the rxe lab's guests.
use std::time::Duration;

use super::peer::{PeerArgs, Side};
use rand::RngCore;
use xroce::verbs::Device;
use xroce_tools::checks::mw::{self as mw_check, MwCheckOptions};
use xroce_tools::endpoint::verbs::device_config;
use xroce_tools::options;
use xroce_tools::setup;

const EXAMPLES: &str = "\
Examples:
  xroce mw-check server -d veth0
  xroce mw-check client -d veth1 198.18.0.1
  # against rxe in the lab (guest 1 runs pyverbs' lab-mw.py):
  xroce lab exec 1 'lab-bg mw lab-mw.py server'
  ip netns exec xroce-lab-host xroce mw-check client -d eth0 -g 1 198.18.0.11";

/// Options both sides take.
#[derive(clap::Args, Debug)]
pub struct Common {
    #[command(flatten)]
    pub peer: PeerArgs,
    /// TCP port of the exchange (lab-mw.py's default).
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,
    /// Bytes of the server's MR, four quarters (both sides must agree).
    #[arg(long, default_value_t = 64 << 10)]
    pub size: usize,
    /// Path MTU: 256, 512, 1024, 2048 or 4096 (both sides).
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    pub mtu: u32,
    /// Seconds to wait for a completion or the peer.
    #[arg(long = "timeout", default_value_t = 30)]
    pub timeout: u64,
}

/// Arguments.
#[derive(clap::Args, Debug)]
#[command(
    mut_subcommand("server", |side| side.about("Own an MR of --size random bytes with two windows; answer one client").after_help(EXAMPLES)),
    mut_subcommand("client", |side| side.about("Use the server's windows, invalidate one, and check every refusal left its memory").after_help(EXAMPLES))
)]
pub struct Args {
    #[command(subcommand)]
    pub role: Side<Common>,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let common = args.role.common();
    if common.timeout == 0 || common.timeout > 3600 {
        anyhow::bail!(
            "--timeout {}: must be between 1 and 3600 seconds",
            common.timeout
        );
    }
    let opts = MwCheckOptions {
        size: common.size,
        mtu: common.mtu,
        timeout: Duration::from_secs(common.timeout),
    };
    opts.validate()?;
    options::tcp_port("-p/--port", common.port)?;
    let (netdev, gid) = common.peer.device_and_gid()?;
    setup::pick_mtu(&netdev, Some(opts.mtu))?;
    let dev = Device::open(
        &netdev.name,
        device_config(common.peer.driver, common.peer.pcap.clone()),
    )?;
    let mut fill = |buf: &mut [u8]| rand::thread_rng().fill_bytes(buf);
    match &args.role {
        Side::Server { common } => {
            let mut stream = setup::accept_one(common.port)?;
            stream.set_read_timeout(Some(opts.timeout * 4))?;
            let mut initial = vec![0u8; opts.size];
            fill(&mut initial);
            let done = mw_check::server(&dev, gid.index, &mut stream, &opts, &initial)?;
            let invalidated = done
                .invalidated
                .map_or("none".to_string(), |rkey| format!("{rkey:#x}"));
            println!(
                "mw-check server: {} bytes, windows bound, used and invalidated ({} digests sent, R_Key {invalidated} invalidated by the peer)",
                opts.size, done.digests
            );
            Ok(0)
        }
        Side::Client { host, common } => {
            let mut stream = setup::connect(host, common.port, Duration::from_secs(10))?;
            stream.set_read_timeout(Some(opts.timeout * 2))?;
            let done = mw_check::client(&dev, gid.index, &mut stream, &opts, &mut fill)?;
            println!(
                "mw-check client: {} accesses through windows ok, {} refused with REM_ACCESS_ERR, the server's memory unchanged by each",
                done.accepted, done.refused
            );
            Ok(0)
        }
    }
}
