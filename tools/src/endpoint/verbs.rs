//! [`ToolEndpoint`] over `xroce::verbs`: how the commands get real RDMA endpoints.

use std::time::Duration;

use crate::endpoint::{ConnectParams, LocalInfo, RemoteInfo, ToolEndpoint, ToolWc, ToolWr, WcKind};
use xroce::netdev::{Gid, GidEntry, NetdevInfo};
use xroce::verbs::{
    Access, AddressHandle, AhAttr, CompletionChannel, Cq, Device, DeviceConfig, DriverKind, Mr,
    Mtu, Pd, ProgressMode, Qp, QpCaps, QpInitAttr, QpType, RcOptions, RcPeer, SendFlags, SendWrRef,
    Sge, Srq, SrqAttr, UdDest, Wc, WcOpcode,
};

/// Which frame driver an endpoint uses. Its names (`xdp`, `udp`) are what `--driver`
/// takes: [`FromStr`](std::str::FromStr) parses them, `Display` prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverChoice {
    /// AF_XDP (needs root / CAP_NET_ADMIN + CAP_BPF).
    Xdp,
    /// A kernel UDP socket on port 4791 (no privileges; the ICRC of received packets
    /// cannot be checked).
    Udp,
    /// Through the interface's relay (`xroce relay -d IFACE`): several processes on one
    /// interface.
    Relay,
}

impl DriverChoice {
    /// Every driver, in the order `--help` lists them.
    pub const ALL: [DriverChoice; 3] = [DriverChoice::Xdp, DriverChoice::Udp, DriverChoice::Relay];

    /// The name `--driver` takes.
    pub fn name(self) -> &'static str {
        match self {
            DriverChoice::Xdp => "xdp",
            DriverChoice::Udp => "udp",
            DriverChoice::Relay => "relay",
        }
    }

    /// One line for `--help`: what the driver is and what it needs.
    pub fn about(self) -> &'static str {
        match self {
            DriverChoice::Xdp => "AF_XDP (needs root / CAP_NET_ADMIN + CAP_BPF)",
            DriverChoice::Udp => {
                "A kernel UDP socket on port 4791 (no privileges; the ICRC of received packets cannot be checked)"
            }
            DriverChoice::Relay => {
                "Through the interface's `xroce relay` (several processes on one interface)"
            }
        }
    }

    /// The verbs driver behind this choice.
    pub fn kind(self) -> DriverKind {
        match self {
            DriverChoice::Xdp => DriverKind::Xdp,
            DriverChoice::Udp => DriverKind::Udp,
            DriverChoice::Relay => DriverKind::Relay,
        }
    }
}

impl std::fmt::Display for DriverChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A `--driver` value that names no driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownDriver {
    /// What was given.
    pub typed: String,
}

impl std::fmt::Display for UnknownDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = DriverChoice::ALL.iter().map(|d| d.name()).collect();
        let (last, first) = names.split_last().expect("drivers");
        write!(
            f,
            "unknown driver {:?}: choose {} or {last}",
            self.typed,
            first.join(", ")
        )
    }
}

impl std::error::Error for UnknownDriver {}

impl std::str::FromStr for DriverChoice {
    type Err = UnknownDriver;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DriverChoice::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| UnknownDriver {
                typed: s.to_string(),
            })
    }
}

/// What the tool needs from its QPs.
#[derive(Debug, Clone)]
pub struct EndpointSpec {
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// Bytes of the registered buffer per QP.
    pub buf_len: usize,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Frame driver.
    pub driver: DriverChoice,
    /// Give the CQ a completion channel so [`ToolEndpoint::wait_completion`] can sleep.
    pub events: bool,
    /// `--pcap FILE`: write every frame the device sends and receives there.
    pub pcap: Option<std::path::PathBuf>,
    /// `--progress`: how the device's background progress thread waits.
    pub progress: ProgressMode,
    /// `--shards`: the device's engine shards ([`DeviceConfig::shards`]; 1 is one engine).
    /// With `xroce perf --threads T` one wants `--shards T` and at least T receive queues
    /// on the interface, so that no two threads share an engine lock.
    pub shards: u32,
}

/// One QP, its CQ and its registered buffer on a verbs [`Device`].
pub struct VerbsEndpoint {
    device: Device,
    pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    sgid_index: u8,
    gid: Gid,
    ud_dest: Option<(AddressHandle, u32, u32)>,
    channel: Option<CompletionChannel>,
    /// Completions taken while checking the CQ after arming it (`wait_completion`).
    early: std::collections::VecDeque<Wc>,
    /// Where [`ToolEndpoint::poll`] lets `Cq::poll` write: made once, not per poll (a
    /// latency test polls in a tight loop, and the poll that finds the completion is on the
    /// round trip's path).
    polled: Box<[Wc; POLL_BATCH]>,
    /// SENDs and WRITEs up to this many bytes go inline (`-I`; 0: none).
    inline_max: u32,
    /// The shared receive queue the QP takes its receives from (`perf --use-srq`): receives
    /// are posted there.
    srq: Option<Srq>,
}

/// Access the tools grant their peers: everything perftest and the file transfer need.
const PEER_ACCESS: Access = Access::ALL;

impl VerbsEndpoint {
    /// Creates one endpoint on an open device.
    pub fn create(
        device: &Device,
        pd: &Pd,
        sgid_index: u32,
        spec: &EndpointSpec,
    ) -> anyhow::Result<Self> {
        Self::create_on(device, pd, sgid_index, spec, None)
    }

    /// [`VerbsEndpoint::create`] with its CQ (and so its QP) on engine shard `shard`.
    pub fn create_on(
        device: &Device,
        pd: &Pd,
        sgid_index: u32,
        spec: &EndpointSpec,
        shard: Option<u32>,
    ) -> anyhow::Result<Self> {
        Self::create_with_srq(device, pd, sgid_index, spec, shard, None)
    }

    /// [`VerbsEndpoint::create_on`] with a QP that takes its receives from `srq`.
    pub fn create_with_srq(
        device: &Device,
        pd: &Pd,
        sgid_index: u32,
        spec: &EndpointSpec,
        shard: Option<u32>,
        srq: Option<&Srq>,
    ) -> anyhow::Result<Self> {
        let gid = device.query_gid(sgid_index)?;
        let depth = (spec.max_send_wr + spec.max_recv_wr + 16).max(64);
        let channel = if spec.events {
            Some(device.create_comp_channel()?)
        } else {
            None
        };
        let cq = match shard {
            Some(shard) => device.create_cq_on_shard(depth, channel.as_ref(), shard)?,
            None => device.create_cq(depth, channel.as_ref())?,
        };
        let mut init = match spec.qp_type {
            QpType::Rc => QpInitAttr::rc(&cq, &cq),
            QpType::Uc => QpInitAttr::uc(&cq, &cq),
            QpType::Ud => QpInitAttr::ud(&cq, &cq),
        };
        init.cap = QpCaps {
            max_send_wr: spec.max_send_wr.max(1),
            max_recv_wr: spec.max_recv_wr.max(1),
            max_send_sge: 1,
            max_recv_sge: 1,
            // The device's limit: `-I` may then pick any size up to it.
            max_inline_data: xroce::verbs::attr::limits::MAX_INLINE_DATA,
        };
        init.sq_sig_all = false;
        init.srq = srq;
        let qp = pd.create_qp(&init)?;
        let mr = pd.reg_mr(spec.buf_len.max(64), PEER_ACCESS)?;
        // Receives may be posted before connecting: INIT allows that (IBTA 10.3.1).
        qp.to_init(
            if spec.qp_type.is_connected() {
                PEER_ACCESS
            } else {
                Access::NONE
            },
            super::UD_QKEY,
        )?;
        Ok(VerbsEndpoint {
            device: device.clone(),
            pd: pd.clone(),
            cq,
            qp,
            mr,
            sgid_index: sgid_index as u8,
            gid,
            ud_dest: None,
            channel,
            early: Default::default(),
            polled: Box::new([Wc::EMPTY; POLL_BATCH]),
            inline_max: 0,
            srq: srq.cloned(),
        })
    }
}

/// Completions taken per `Cq::poll` by [`ToolEndpoint::poll`].
const POLL_BATCH: usize = 32;

fn tool_wc(wc: &Wc) -> ToolWc {
    let kind = match wc.opcode {
        WcOpcode::Send => WcKind::Send,
        WcOpcode::RdmaWrite => WcKind::Write,
        WcOpcode::RdmaRead => WcKind::Read,
        WcOpcode::CompSwap | WcOpcode::FetchAdd => WcKind::Atomic,
        WcOpcode::Recv => WcKind::Recv,
        WcOpcode::RecvRdmaWithImm => WcKind::RecvRdmaWithImm,
        WcOpcode::BindMw | WcOpcode::LocalInv => WcKind::Local,
    };
    ToolWc {
        wr_id: wc.wr_id,
        status: wc.status,
        kind,
        byte_len: wc.byte_len,
        imm: wc.imm_data,
    }
}

impl ToolEndpoint for VerbsEndpoint {
    fn local(&self) -> LocalInfo {
        let attr = self.device.query_device();
        LocalInfo {
            qpn: self.qp.qp_num(),
            gid: self.gid.0,
            buf_addr: self.mr.addr(),
            rkey: self.mr.rkey(),
            buf_len: self.mr.len(),
            active_mtu: self.device.active_mtu().bytes(),
            max_inline: xroce::verbs::attr::limits::MAX_INLINE_DATA,
            max_rd_atomic: attr.max_qp_rd_atom,
        }
    }

    fn connect(&mut self, remote: &RemoteInfo, params: &ConnectParams) -> anyhow::Result<()> {
        let mtu = Mtu::from_bytes(params.mtu)
            .ok_or_else(|| anyhow::anyhow!("path MTU {} is not an IB MTU", params.mtu))?;
        match self.qp.qp_type() {
            qp_type @ (QpType::Rc | QpType::Uc) => {
                let connect = match qp_type {
                    QpType::Uc => Qp::connect_uc,
                    _ => Qp::connect_rc,
                };
                connect(
                    &self.qp,
                    &RcPeer {
                        qpn: remote.qpn,
                        psn: remote.psn,
                        gid: Gid(remote.gid),
                    },
                    &RcOptions {
                        sgid_index: self.sgid_index,
                        path_mtu: mtu,
                        sq_psn: params.local_psn,
                        access: PEER_ACCESS,
                        timeout: params.timeout,
                        retry_cnt: params.retry_cnt,
                        rnr_retry: params.rnr_retry,
                        min_rnr_timer: params.min_rnr_timer,
                        max_rd_atomic: params.max_rd_atomic.max(1),
                        hop_limit: params.hop_limit,
                    },
                )?;
            }
            QpType::Ud => {
                self.qp.ready_ud(params.qkey, params.local_psn)?;
                let mut ah = AhAttr::new(Gid(remote.gid), self.sgid_index);
                ah.hop_limit = params.hop_limit;
                let ah = self.pd.create_ah(&ah)?;
                self.ud_dest = Some((ah, remote.qpn, params.qkey));
            }
        }
        Ok(())
    }

    fn post_send(&mut self, wr: &ToolWr) -> anyhow::Result<()> {
        let op = wr.op;
        // One SGE on the stack, borrowed by the post: nothing allocated per WR.
        let sge;
        let sg_list: &[Sge] = if wr.len > 0 {
            sge = [self.mr.sge(wr.offset, wr.len as u32)?];
            &sge
        } else {
            &[]
        };
        let ud = self.ud_dest.as_ref().map(|(ah, qpn, qkey)| UdDest {
            av: ah.av(),
            remote_qpn: *qpn,
            remote_qkey: *qkey,
        });
        let mut flags = if wr.signaled {
            SendFlags::SIGNALED
        } else {
            SendFlags::default()
        };
        if wr.len > 0 && wr.len <= self.inline_max as usize && !op.is_read_or_atomic() {
            flags |= SendFlags::INLINE;
        }
        let wr = SendWrRef {
            wr_id: wr.wr_id,
            op,
            sg_list,
            flags,
            ud,
        };
        self.qp.post_send_chain(|post| post(&wr, None))?;
        Ok(())
    }

    fn set_inline(&mut self, max: u32) -> anyhow::Result<()> {
        let (_, caps) = self.qp.query()?;
        if max > caps.max_inline_data {
            anyhow::bail!(
                "inline size {max} exceeds the QP's max_inline_data {}",
                caps.max_inline_data
            );
        }
        self.inline_max = max;
        Ok(())
    }

    fn post_recv(&mut self, wr_id: u64, offset: usize, len: usize) -> anyhow::Result<()> {
        let sge;
        let sg_list: &[Sge] = if len > 0 {
            sge = [self.mr.sge(offset, len as u32)?];
            &sge
        } else {
            &[]
        };
        match &self.srq {
            Some(srq) => srq.post_recv_chain(|post| post(wr_id, sg_list))?,
            None => self.qp.post_recv_chain(|post| post(wr_id, sg_list))?,
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<ToolWc>, max: usize) -> anyhow::Result<usize> {
        let mut n = 0;
        while n < max {
            let Some(wc) = self.early.pop_front() else {
                break;
            };
            out.push(tool_wc(&wc));
            n += 1;
        }
        // One poll for the rest: one progress round, however many completions it returns
        // (a round per completion would also send an ACK and kick the driver per message).
        let wcs = &mut self.polled;
        while n < max {
            let want = (max - n).min(POLL_BATCH);
            let got = self.cq.poll(&mut wcs[..want])?;
            out.extend(wcs[..got].iter().map(tool_wc));
            n += got;
            if got < want {
                break;
            }
        }
        Ok(n)
    }

    fn write_local(&mut self, offset: usize, data: &[u8]) -> anyhow::Result<()> {
        Ok(self.mr.write(offset, data)?)
    }

    fn wait_completion(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let Some(channel) = &self.channel else {
            return Ok(());
        };
        // Arm first, then wait: a completion that arrived before arming is found by the
        // caller's next poll; one after it raises the event.
        self.cq.req_notify(false)?;
        if let Some(wc) = self.cq.poll_one()? {
            // Arrived before the arm: no event will come for it.
            self.early.push_back(wc);
            return Ok(());
        }
        match channel.get_cq_event(Some(timeout)) {
            Ok(_) | Err(xroce::verbs::VerbsError::Timeout(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn read_local(&self, offset: usize, out: &mut [u8]) -> anyhow::Result<()> {
        Ok(self.mr.read(offset, out)?)
    }

    fn verbs_qp(&self) -> Option<(Qp, Device)> {
        Some((self.qp.clone(), self.device.clone()))
    }
}

/// Opens the device on `dev` and `count` endpoints on it, sharing one PD.
pub fn open(
    dev: &NetdevInfo,
    gid: &GidEntry,
    spec: &EndpointSpec,
    count: usize,
) -> anyhow::Result<Vec<Box<dyn ToolEndpoint>>> {
    open_with_srq(dev, gid, spec, count, None)
}

/// [`open`], the QPs sharing one SRQ of `srq_depth` receives when it is given
/// (`perf --use-srq`).
pub fn open_with_srq(
    dev: &NetdevInfo,
    gid: &GidEntry,
    spec: &EndpointSpec,
    count: usize,
    srq_depth: Option<u32>,
) -> anyhow::Result<Vec<Box<dyn ToolEndpoint>>> {
    let config = DeviceConfig {
        progress: spec.progress,
        shards: spec.shards,
        ..device_config(spec.driver, spec.pcap.clone())
    };
    let device = Device::open(&dev.name, config).map_err(|e| {
        anyhow::Error::new(e).context(format!(
            "opening {} with {} engine shard{}",
            dev.name,
            spec.shards,
            if spec.shards == 1 { "" } else { "s" }
        ))
    })?;
    open_on_with_srq(&device, gid.index, spec, count, srq_depth)
}

/// How the tools open a device: `driver`, the progress thread woken by the driver, three
/// seconds to resolve a neighbour, and `pcap` as the capture file.
pub fn device_config(driver: DriverChoice, pcap: Option<std::path::PathBuf>) -> DeviceConfig {
    DeviceConfig {
        driver: driver.kind(),
        progress: ProgressMode::Wakeup,
        neighbour_timeout: Duration::from_secs(3),
        pcap,
        ..DeviceConfig::default()
    }
}

/// `count` endpoints on an already open device (tests use a mem pair).
pub fn open_on(
    device: &Device,
    sgid_index: u32,
    spec: &EndpointSpec,
    count: usize,
) -> anyhow::Result<Vec<Box<dyn ToolEndpoint>>> {
    open_on_with_srq(device, sgid_index, spec, count, None)
}

/// [`open_on`], the QPs sharing one SRQ of `srq_depth` receives (one SGE each) when it is
/// given: every endpoint's `post_recv` posts to it, and a receive completes on the CQ of the
/// QP its message arrived on. The SRQ is shared across the device's shards.
pub fn open_on_with_srq(
    device: &Device,
    sgid_index: u32,
    spec: &EndpointSpec,
    count: usize,
    srq_depth: Option<u32>,
) -> anyhow::Result<Vec<Box<dyn ToolEndpoint>>> {
    let pd = device.alloc_pd()?;
    let srq = srq_depth
        .map(|max_wr| {
            pd.create_srq(&SrqAttr {
                max_wr,
                max_sge: 1,
                srq_limit: 0,
            })
        })
        .transpose()?;
    // Endpoints in blocks, one block per shard: `perf --threads T --shards T` gives thread t
    // (which owns the t-th block of QPs) shard t, and a peer that does the same receives
    // each flow on the shard that owns it.
    let shards = device.shard_count() as usize;
    (0..count)
        .map(|i| {
            let shard = (shards > 1).then(|| (i * shards / count.max(1)) as u32);
            VerbsEndpoint::create_with_srq(device, &pd, sgid_index, spec, shard, srq.as_ref())
                .map(|e| Box::new(e) as Box<dyn ToolEndpoint>)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names_parse_and_print_back() {
        for driver in DriverChoice::ALL {
            assert_eq!(driver.name().parse::<DriverChoice>(), Ok(driver));
            assert_eq!(driver.to_string(), driver.name());
        }
        assert_eq!("xdp".parse(), Ok(DriverChoice::Xdp));
        assert_eq!("udp".parse(), Ok(DriverChoice::Udp));
        for bad in ["", "XDP", "Udp", "sim", "xdp ", "af_xdp"] {
            let err = bad.parse::<DriverChoice>().unwrap_err();
            assert_eq!(err.typed, bad);
            assert_eq!(
                err.to_string(),
                format!("unknown driver {bad:?}: choose xdp, udp or relay")
            );
        }
    }

    #[test]
    fn each_choice_opens_its_verbs_driver() {
        assert_eq!(DriverChoice::Xdp.kind(), DriverKind::Xdp);
        assert_eq!(DriverChoice::Udp.kind(), DriverKind::Udp);
        assert_eq!(DriverChoice::Relay.kind(), DriverKind::Relay);
        let config = device_config(DriverChoice::Udp, None);
        assert_eq!(config.driver, DriverKind::Udp);
        assert_eq!(config.progress, ProgressMode::Wakeup);
    }
}
