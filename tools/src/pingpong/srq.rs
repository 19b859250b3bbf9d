//! `ibv_srq_pingpong` (`xroce pingpong --srq`): `-q` RC QPs that share one completion queue
//! and one shared receive queue, the same exchange (256 addresses each way), the same
//! discipline and the same output lines as rdma-core's example.
//!
//! The discipline (rdma-core `srq_pingpong.c`): `rx_depth` receives are posted to the SRQ;
//! the client sends once on every QP. Each QP keeps a `pending` set {RECV, SEND}; when both
//! its last send and a receive on it completed, it sends again while fewer than `iters` sends
//! completed in all (`-n` counts the exchanges of all QPs together, as the C loop does). When
//! at most `num_qp` receives are left in the SRQ it is refilled to `rx_depth`. One buffer of
//! `size` bytes serves every send and every receive, as in the C tool.
//!
//! It runs over `xroce::verbs` directly (several QPs on one CQ do not fit the one-QP
//! [`crate::endpoint::ToolEndpoint`]); tests drive it over `Device::mem_pair`.
use std::io::Write;
use std::time::{Duration, Instant};

use crate::pingpong::oob::{self, PingpongDest, SRQ_MAX_QP};
use crate::setup::OobStream;
use crate::setup::Role;
use xroce::engine::SrqAttr;
use xroce::netdev::Gid;
use xroce::verbs::{
    Access, CompletionChannel, Cq, Device, Mr, Mtu, Qp, QpCaps, QpInitAttr, RcOptions, RcPeer,
    RecvWr, SendFlags, SendWr, Srq, Wc, WcOpcode, WcStatus, WrOp,
};

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

/// Options of `ibv_srq_pingpong` (`-s -m -q -r -n -l -e`).
#[derive(Debug, Clone)]
pub struct SrqPingpongOptions {
    /// Message size (`-s`, default 4096).
    pub size: usize,
    /// Exchanges of all QPs together (`-n`, default 1000).
    pub iters: u64,
    /// Receives posted to the SRQ at a time, its `max_wr` (`-r`, default 500).
    pub rx_depth: u32,
    /// QPs (`-q`, default 16; 1..=256, at most `rx_depth`).
    pub num_qp: usize,
    /// Path MTU in bytes (`-m`, default 1024).
    pub mtu: u32,
    /// Service level (`-l`).
    pub sl: u8,
    /// Sleep on the completion channel instead of busy polling (`-e`).
    pub events: bool,
    /// How long to wait for any completion before giving up.
    pub stall_timeout: Duration,
}

impl Default for SrqPingpongOptions {
    fn default() -> Self {
        SrqPingpongOptions {
            size: 4096,
            iters: 1000,
            rx_depth: 500,
            num_qp: 16,
            mtu: 1024,
            sl: 0,
            events: false,
            stall_timeout: Duration::from_secs(30),
        }
    }
}

impl SrqPingpongOptions {
    /// The checks `srq_pingpong.c` makes (and the bound of its fixed arrays).
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.num_qp == 0 || self.num_qp > SRQ_MAX_QP {
            anyhow::bail!(
                "-q {}: ibv_srq_pingpong uses 1 to {SRQ_MAX_QP} QPs",
                self.num_qp
            );
        }
        if self.num_qp as u64 > u64::from(self.rx_depth) {
            anyhow::bail!(
                "rx_depth {} is too small for {} QPs -- must have at least one receive per QP.",
                self.rx_depth,
                self.num_qp
            );
        }
        if self.rx_depth > xroce::engine::limits::MAX_SRQ_WR {
            anyhow::bail!(
                "-r {}: the SRQ holds at most {} receives (the device's max_srq_wr)",
                self.rx_depth,
                xroce::engine::limits::MAX_SRQ_WR
            );
        }
        Ok(())
    }
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct SrqPingpongOutcome {
    /// Our addresses, one per QP.
    pub local: Vec<PingpongDest>,
    /// The peer's, one per QP.
    pub remote: Vec<PingpongDest>,
    /// Elapsed microseconds of the ping-pong loop.
    pub usec: f64,
    /// Receive completions per QP (the SRQ hands its WQEs to whichever QP a SEND arrives on).
    pub recvs_per_qp: Vec<u64>,
}

/// The QPs, their SRQ, CQ and buffer on one device.
pub struct SrqPingpong {
    cq: Cq,
    srq: Srq,
    qps: Vec<Qp>,
    mr: Mr,
    channel: Option<CompletionChannel>,
    sgid_index: u8,
    gid: Gid,
}

impl SrqPingpong {
    /// `pp_init_ctx`: PD, a `size`-byte buffer (LOCAL_WRITE), a CQ of `rx_depth + num_qp`,
    /// an SRQ of `rx_depth` WRs with one SGE, and `num_qp` RC QPs on it (one send WR each)
    /// moved to INIT with no remote access.
    pub fn create(
        device: &Device,
        sgid_index: u32,
        opts: &SrqPingpongOptions,
    ) -> anyhow::Result<Self> {
        opts.validate()?;
        let gid = device.query_gid(sgid_index)?;
        let channel = if opts.events {
            Some(device.create_comp_channel()?)
        } else {
            None
        };
        let pd = device.alloc_pd()?;
        let mr = pd.reg_mr(opts.size.max(1), Access::LOCAL_WRITE)?;
        let cq = device.create_cq(opts.rx_depth + opts.num_qp as u32, channel.as_ref())?;
        let srq = pd.create_srq(&SrqAttr {
            max_wr: opts.rx_depth,
            max_sge: 1,
            srq_limit: 0,
        })?;
        let mut qps = Vec::with_capacity(opts.num_qp);
        for _ in 0..opts.num_qp {
            let qp = pd.create_qp(&QpInitAttr {
                cap: QpCaps {
                    max_send_wr: 1,
                    max_send_sge: 1,
                    max_recv_wr: 0,
                    max_recv_sge: 0,
                    max_inline_data: 0,
                },
                srq: Some(&srq),
                ..QpInitAttr::rc(&cq, &cq)
            })?;
            qp.to_init(Access::NONE, 0)?;
            qps.push(qp);
        }
        Ok(SrqPingpong {
            cq,
            srq,
            qps,
            mr,
            channel,
            sgid_index: sgid_index as u8,
            gid,
        })
    }

    /// The shared receive queue.
    pub fn srq(&self) -> &Srq {
        &self.srq
    }

    fn post_recvs(&self, n: u32) -> anyhow::Result<()> {
        let sge = self.mr.sge(0, self.mr.len() as u32)?;
        for _ in 0..n {
            self.srq.post_recv(&RecvWr {
                wr_id: RECV_WRID,
                sg_list: vec![sge],
            })?;
        }
        Ok(())
    }

    fn post_send(&self, qp: usize, size: usize) -> anyhow::Result<()> {
        self.qps[qp].post_send(&SendWr {
            wr_id: SEND_WRID,
            op: WrOp::Send,
            sg_list: vec![self.mr.sge(0, size as u32)?],
            flags: SendFlags::SIGNALED,
            ud: None,
        })?;
        Ok(())
    }

    /// `pp_connect_ctx`: each QP to its peer QP (RTR: path MTU, max_dest_rd_atomic 1, RNR
    /// timer 12; RTS: timeout 14, retry 7, RNR retry 7, max_rd_atomic 1; hop limit 1).
    fn connect(
        &self,
        opts: &SrqPingpongOptions,
        mine: &[PingpongDest],
        remote: &[PingpongDest],
    ) -> anyhow::Result<()> {
        let mtu = Mtu::from_bytes(opts.mtu)
            .ok_or_else(|| anyhow::anyhow!("-m {}: not an IB MTU", opts.mtu))?;
        for (i, qp) in self.qps.iter().enumerate() {
            qp.connect_rc(
                &RcPeer {
                    qpn: remote[i].qpn,
                    psn: remote[i].psn,
                    gid: Gid(remote[i].gid),
                },
                &RcOptions {
                    sgid_index: self.sgid_index,
                    path_mtu: mtu,
                    sq_psn: mine[i].psn,
                    access: Access::NONE,
                    timeout: 14,
                    retry_cnt: 7,
                    rnr_retry: 7,
                    min_rnr_timer: 12,
                    max_rd_atomic: 1,
                    hop_limit: 1,
                },
            )
            .map_err(|e| anyhow::anyhow!("Failed to modify QP[{i}] to RTR/RTS: {e}"))?;
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut [Wc], opts: &SrqPingpongOptions) -> anyhow::Result<usize> {
        let n = self.cq.poll(out)?;
        if n > 0 || !opts.events {
            return Ok(n);
        }
        let Some(channel) = &self.channel else {
            return Ok(0);
        };
        // Arm, look once more (a completion before the arm raises no event), then sleep.
        self.cq.req_notify(false)?;
        let n = self.cq.poll(out)?;
        if n > 0 {
            return Ok(n);
        }
        match channel.get_cq_event(Some(Duration::from_millis(100))) {
            Ok(_) | Err(xroce::verbs::VerbsError::Timeout(_)) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// Runs one side: `psn` gives each QP's first PSN; `open_stream` connects (client) or
    /// accepts (server) after the local address lines are printed; `out` gets the lines the
    /// C tool prints.
    pub fn run<S: OobStream, F: FnOnce() -> anyhow::Result<S>>(
        &mut self,
        open_stream: F,
        role: Role,
        opts: &SrqPingpongOptions,
        mut psn: impl FnMut() -> u32,
        out: &mut dyn Write,
    ) -> anyhow::Result<SrqPingpongOutcome> {
        let num_qp = self.qps.len();
        let rx_depth = opts.rx_depth;
        self.post_recvs(rx_depth)?;
        let mut routs = rx_depth;
        let mut mine = vec![
            PingpongDest {
                lid: 0,
                qpn: 0,
                psn: 0,
                gid: [0; 16],
            };
            SRQ_MAX_QP
        ];
        for (i, qp) in self.qps.iter().enumerate() {
            mine[i] = PingpongDest {
                lid: 0,
                qpn: qp.qp_num(),
                psn: psn() & 0xFF_FFFF,
                gid: self.gid.0,
            };
            writeln!(out, "{}", mine[i].address_line("local address: ", false))?;
        }
        out.flush()?;
        let mut stream = open_stream()?;
        let remote = match role {
            Role::Server => oob::server_exchange_all(&mut stream, &mine, |remote| {
                self.connect(opts, &mine, remote)
            })?,
            Role::Client => oob::client_exchange_all(&mut stream, &mine)?,
        };
        for r in &remote[..num_qp] {
            writeln!(out, "{}", r.address_line("remote address:", false))?;
        }
        if role == Role::Client {
            self.connect(opts, &mine, &remote)?;
        }

        let mut pending = vec![RECV_WRID; num_qp];
        if role == Role::Client {
            for (i, p) in pending.iter_mut().enumerate() {
                self.post_send(i, opts.size)?;
                *p = RECV_WRID | SEND_WRID;
            }
        }
        let start = Instant::now();
        let (mut rcnt, mut scnt) = (0u64, 0u64);
        let mut recvs_per_qp = vec![0u64; num_qp];
        let mut wcs = vec![Wc::EMPTY; num_qp + rx_depth as usize];
        let mut last_progress = Instant::now();
        while rcnt < opts.iters || scnt < opts.iters {
            let ne = self.poll(&mut wcs, opts)?;
            if ne == 0 {
                if last_progress.elapsed() > opts.stall_timeout {
                    anyhow::bail!(
                        "no completion for {:?} after {scnt} sends and {rcnt} receives: the peer stopped or packets are lost (check the peer's output and the link)",
                        opts.stall_timeout
                    );
                }
                std::hint::spin_loop();
                continue;
            }
            last_progress = Instant::now();
            for wc in &wcs[..ne] {
                if wc.status != WcStatus::Success {
                    anyhow::bail!(
                        "Failed status {} ({:?}) for wr_id {}",
                        wc.status.as_str(),
                        wc.status,
                        wc.wr_id
                    );
                }
                let Some(qp_ind) = self.qps.iter().position(|q| q.qp_num() == wc.qp_num) else {
                    anyhow::bail!("Couldn't find QPN {:06x}", wc.qp_num);
                };
                match (wc.wr_id, wc.opcode) {
                    (SEND_WRID, WcOpcode::Send) => scnt += 1,
                    (RECV_WRID, WcOpcode::Recv) => {
                        routs -= 1;
                        if routs <= num_qp as u32 {
                            self.post_recvs(rx_depth - routs)?;
                            routs = rx_depth;
                        }
                        rcnt += 1;
                        recvs_per_qp[qp_ind] += 1;
                    }
                    (id, op) => anyhow::bail!("Completion for unknown wr_id {id} ({op:?})"),
                }
                pending[qp_ind] &= !wc.wr_id;
                if scnt < opts.iters && pending[qp_ind] == 0 {
                    self.post_send(qp_ind, opts.size)?;
                    pending[qp_ind] = RECV_WRID | SEND_WRID;
                }
            }
        }
        let usec = start.elapsed().as_secs_f64() * 1e6;
        for line in oob::result_lines(opts.size as u64, opts.iters, usec) {
            writeln!(out, "{line}")?;
        }
        // The peer's last SEND may still need its ACK (see `PEER_LINGER`).
        std::thread::sleep(super::PEER_LINGER);
        Ok(SrqPingpongOutcome {
            local: mine[..num_qp].to_vec(),
            remote: remote[..num_qp].to_vec(),
            usec,
            recvs_per_qp,
        })
    }
}
