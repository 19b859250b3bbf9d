//! [`ToolEndpoint`] over `xroce::verbs`: how the commands get real RDMA endpoints.

use crate::netdev::{GidEntry, NetdevInfo};
use crate::tools::endpoint::ToolEndpoint;

/// Which frame driver an endpoint uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DriverChoice {
    /// AF_XDP (needs root / CAP_NET_ADMIN + CAP_BPF).
    Xdp,
    /// A kernel UDP socket on port 4791 (no privileges; the ICRC of received packets
    /// cannot be checked).
    Udp,
}

/// What the tool needs from its QPs.
#[derive(Debug, Clone)]
pub struct EndpointSpec {
    /// RC (true) or UD.
    pub rc: bool,
    /// Bytes of the registered buffer per QP.
    pub buf_len: usize,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Frame driver.
    pub driver: DriverChoice,
}

/// Opens `count` QPs on `dev`, each with its own buffer and CQ, sharing one device.
pub fn open(
    dev: &NetdevInfo,
    gid: &GidEntry,
    spec: &EndpointSpec,
    count: usize,
) -> anyhow::Result<Vec<Box<dyn ToolEndpoint>>> {
    let _ = (dev, gid, spec, count);
    anyhow::bail!(
        "this build has no RDMA data path yet (xroce::verbs has not landed): the out-of-band exchange works, RDMA does not"
    )
}
