//! The small slice of verbs the tools need: one QP, one registered buffer, one CQ.
//!
//! `xroce pingpong`, `xroce perf` and `xroce file` are written against [`ToolEndpoint`], so
//! their loops (iteration accounting, completion moderation, credit flow, measurements) are
//! tested in-process, and the real implementation over `xroce::verbs` is one small adapter.
//! Offsets are relative to the start of the endpoint's registered buffer; remote addresses
//! are the peer's virtual addresses as announced over TCP.

pub mod verbs;

/// The Q_Key of the tools' UD QPs, on the QP and in every send WR: `ibv_ud_pingpong`'s.
pub const UD_QKEY: u32 = 0x1111_1111;

/// What this side announces to the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalInfo {
    /// QP number.
    pub qpn: u32,
    /// The GID selected with `-g`/`-x` (raw bytes).
    pub gid: [u8; 16],
    /// Virtual address of the registered buffer.
    pub buf_addr: u64,
    /// R_Key of the registered buffer.
    pub rkey: u32,
    /// Length of the registered buffer.
    pub buf_len: usize,
    /// Path MTU the device offers (bytes).
    pub active_mtu: u32,
    /// Largest inline send.
    pub max_inline: u32,
    /// Max outstanding READ/atomic as responder (perftest's out_reads).
    pub max_rd_atomic: u32,
}

/// The peer's QP as learned over TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteInfo {
    /// Peer QP number.
    pub qpn: u32,
    /// Peer's first PSN (our RQ PSN).
    pub psn: u32,
    /// Peer GID.
    pub gid: [u8; 16],
}

/// Connection attributes (the RTR/RTS attributes the C tools set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectParams {
    /// Our first PSN (SQ PSN).
    pub local_psn: u32,
    /// Path MTU in bytes (256..4096).
    pub mtu: u32,
    /// Local ACK timeout exponent (14 = 67 ms).
    pub timeout: u8,
    /// Retries after timeout / sequence NAK.
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// RNR NAK timer code we advertise.
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomic we issue and accept.
    pub max_rd_atomic: u8,
    /// GRH hop limit (IPv4 TTL).
    pub hop_limit: u8,
    /// Service level (becomes nothing on RoCEv2 without DSCP mapping).
    pub sl: u8,
    /// Q_Key for UD.
    pub qkey: u32,
}

impl ConnectParams {
    /// `ibv_rc_pingpong`'s attributes.
    pub fn rc_pingpong(local_psn: u32, mtu: u32, sl: u8) -> Self {
        ConnectParams {
            local_psn,
            mtu,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            hop_limit: 1,
            sl,
            qkey: 0,
        }
    }
}

/// A work request's operation is the provider's own [`WrOp`]; an endpoint refuses, with an
/// error, what it cannot do.
pub use xroce::verbs::WrOp;

/// A send-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: WrOp,
    /// Local buffer offset (data source, or READ/atomic destination).
    pub offset: usize,
    /// Length in bytes (8 for atomics).
    pub len: usize,
    /// Ask for a completion.
    pub signaled: bool,
}

/// What completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcKind {
    /// A SEND finished.
    Send,
    /// A WRITE finished.
    Write,
    /// A READ finished.
    Read,
    /// An atomic finished.
    Atomic,
    /// A receive consumed a SEND.
    Recv,
    /// A receive consumed a WRITE_WITH_IMM.
    RecvRdmaWithImm,
    /// A local operation (memory window bind, local invalidate) finished.
    Local,
}

/// A work completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolWc {
    /// From the work request.
    pub wr_id: u64,
    /// The completion's status.
    pub status: xroce::verbs::WcStatus,
    /// Operation.
    pub kind: WcKind,
    /// Bytes received (receives).
    pub byte_len: u32,
    /// Immediate data, if any.
    pub imm: Option<u32>,
}

impl ToolWc {
    /// The status, unless the work request succeeded.
    pub fn failed(&self) -> Option<xroce::verbs::WcStatus> {
        (self.status != xroce::verbs::WcStatus::Success).then_some(self.status)
    }
}

/// One QP with its buffer and CQ. Implementations make progress in the background (the
/// verbs progress thread), so `poll` only reads completions.
pub trait ToolEndpoint: Send {
    /// What to announce to the peer.
    fn local(&self) -> LocalInfo;
    /// Move the QP to RTR and RTS (RC) or create the address handle (UD).
    fn connect(&mut self, remote: &RemoteInfo, params: &ConnectParams) -> anyhow::Result<()>;
    /// Post one send-queue work request.
    fn post_send(&mut self, wr: &ToolWr) -> anyhow::Result<()>;
    /// Posts SENDs and WRITEs of at most `max` bytes inline from now on (perftest's `-I`);
    /// 0 turns it off. An endpoint without inline sends refuses any other value.
    fn set_inline(&mut self, max: u32) -> anyhow::Result<()> {
        if max > 0 {
            anyhow::bail!("this endpoint cannot send inline");
        }
        Ok(())
    }
    /// Post one receive for `len` bytes at `offset`.
    fn post_recv(&mut self, wr_id: u64, offset: usize, len: usize) -> anyhow::Result<()>;
    /// Append up to `max` completions to `out`; returns how many.
    fn poll(&mut self, out: &mut Vec<ToolWc>, max: usize) -> anyhow::Result<usize>;
    /// Copy `data` into the local buffer at `offset`.
    fn write_local(&mut self, offset: usize, data: &[u8]) -> anyhow::Result<()>;
    /// Copy from the local buffer at `offset` into `out`.
    fn read_local(&self, offset: usize, out: &mut [u8]) -> anyhow::Result<()>;
    /// The verbs QP and device behind the endpoint, for connecting it through rdma_cm
    /// (`perf -R`); `None` for endpoints not over `xroce::verbs`.
    fn verbs_qp(&self) -> Option<(xroce::verbs::Qp, xroce::verbs::Device)> {
        None
    }
    /// Sleep until a completion may be ready or `timeout` passes (`-e`: the CQ is armed and
    /// its completion channel waited on, as `ibv_req_notify_cq` + `ibv_get_cq_event`).
    /// The default returns at once: callers then simply poll again.
    fn wait_completion(&mut self, timeout: std::time::Duration) -> anyhow::Result<()> {
        let _ = timeout;
        Ok(())
    }
}

/// Polls until one completion arrives or `deadline` passes (a stuck peer is an error, not
/// a hang). Between polls it waits in [`ToolEndpoint::wait_completion`], which sleeps when
/// the endpoint has a completion channel and returns at once otherwise.
pub fn poll_one(ep: &mut dyn ToolEndpoint, deadline: std::time::Instant) -> anyhow::Result<ToolWc> {
    /// Longest sleep between polls, so the deadline is checked often enough.
    const NAP: std::time::Duration = std::time::Duration::from_millis(100);
    let mut out = Vec::with_capacity(1);
    loop {
        if ep.poll(&mut out, 1)? > 0 {
            return Ok(out.remove(0));
        }
        let now = std::time::Instant::now();
        if now > deadline {
            anyhow::bail!("no completion before the deadline: is the peer still running?");
        }
        ep.wait_completion((deadline - now).min(NAP))?;
        std::hint::spin_loop();
    }
}
