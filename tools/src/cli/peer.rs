//! The arguments the two-sided checks and the file transfer (`mr-check`, `mw-check`, `file`)
//! take the same way: where the endpoint runs (`-d`, `-g`), how its frames move (`--driver`)
//! and where they are recorded (`--pcap`). Each command adds its own exchange port, sizes and
//! MTU rule.
use std::path::PathBuf;

use xroce::netdev::{GidEntry, NetdevInfo};
use xroce_tools::endpoint::verbs::DriverChoice;
use xroce_tools::setup;

/// Where the endpoint runs and how its frames move.
#[derive(clap::Args, Debug, Clone)]
pub struct PeerArgs {
    /// Network interface.
    #[arg(short = 'd', long = "ib-dev")]
    pub ib_dev: Option<String>,
    /// GID index (default: the first IPv4 GID).
    #[arg(short = 'g', long = "gid-idx")]
    pub gid_idx: Option<u32>,
    /// Frame driver.
    #[arg(long = "driver", value_parser = super::values::driver(), default_value_t = DriverChoice::Xdp)]
    pub driver: DriverChoice,
    /// Write every frame this endpoint sends and receives to FILE (pcap, Ethernet link
    /// type): over AF_XDP, tcpdump on the interface sees no RoCE frames.
    #[arg(long = "pcap", value_name = "FILE")]
    pub pcap: Option<PathBuf>,
}

impl PeerArgs {
    /// The interface (`-d`, or the only one that carries RoCE) and its GID (`-g`, or the
    /// first IPv4 one).
    pub fn device_and_gid(&self) -> anyhow::Result<(NetdevInfo, GidEntry)> {
        let dev = setup::pick_device(self.ib_dev.as_deref())?;
        let gid = setup::pick_gid(&dev, self.gid_idx, "-g")?;
        Ok((dev, gid))
    }
}

/// `server` or `client HOST` of a two-sided check, each with the check's own options `C`;
/// the check says what each side does (`mut_subcommand` on its `Args`).
#[derive(clap::Subcommand, Debug)]
pub enum Side<C: clap::Args> {
    /// Answer one client.
    Server {
        #[command(flatten)]
        common: C,
    },
    /// Connect to a server.
    Client {
        /// The server's address.
        host: String,
        #[command(flatten)]
        common: C,
    },
}

impl<C: clap::Args> Side<C> {
    /// The options, whichever the side.
    pub fn common(&self) -> &C {
        match self {
            Side::Server { common } | Side::Client { common, .. } => common,
        }
    }
}
