//! One end of the conversation over a stream ([`PerftestComm`]), and running a whole
//! script against a test runner ([`run_script`]).
use std::net::Ipv6Addr;
use std::time::Duration;

use crate::setup::{self, OobStream, PeerTool};

use super::*;

/// One end of the perftest TCP conversation. Generic over the stream so it can be
/// replayed against recorded bytes.
///
/// Until the QPs are connected every read waits at most the set-up bound
/// ([`setup::SETUP_TIMEOUT`] unless [`Self::with_setup_bound`] says otherwise): a peer that
/// runs another tool, or says nothing, is a [`PerftestOobError::Timeout`], not a hang.
/// After that the peer may be measuring for a long time, so reads block.
pub struct PerftestComm<S> {
    pub(super) stream: S,
    pub(super) role: Role,
    pub(super) local_version: String,
    pub(super) remote_version: Option<String>,
    pub(super) dont_xchg_versions: bool,
    pub(super) with_gid: bool,
    pub(super) setup_bound: Option<Duration>,
    pub(super) bound_applied: bool,
    pub(super) in_setup: bool,
    /// Bytes read ahead by [`PeerWatch::peer_has_spoken`], consumed first by the next read.
    pub(super) read_ahead: Vec<u8>,
    pub(super) peer_closed: bool,
    /// `-R`: the side channel is an rdma_cm connection (one SEND per message); addresses
    /// go as the binary `struct pingpong_dest` with this GID index, and no "done" closes.
    pub(super) rdma_cm_gid_index: Option<i32>,
}

/// What a runner may ask the conversation while it measures.
pub trait PeerWatch {
    /// True once the peer has written its next exchange message (or closed the stream):
    /// it has finished its part of the run. Never blocks.
    fn peer_has_spoken(&mut self) -> bool;
}

/// A watch for runners driven without a conversation (the peer never speaks).
pub struct Silent;

impl PeerWatch for Silent {
    fn peer_has_spoken(&mut self) -> bool {
        false
    }
}

impl<S: OobStream> PeerWatch for PerftestComm<S> {
    fn peer_has_spoken(&mut self) -> bool {
        if !self.read_ahead.is_empty() || self.peer_closed {
            return true;
        }
        if self.stream.nonblocking_reads(true).is_err() {
            return false;
        }
        let mut buf = [0u8; 256];
        let spoke = match self.stream.read(&mut buf) {
            Ok(0) => {
                self.peer_closed = true;
                true
            }
            Ok(n) => {
                self.read_ahead.extend_from_slice(&buf[..n]);
                true
            }
            Err(_) => false,
        };
        // If this fails, the next blocking read fails too and reports it.
        let _ = self.stream.nonblocking_reads(false);
        spoke
    }
}

impl<S: OobStream> PerftestComm<S> {
    /// A conversation on an established TCP stream. `local_version` is what we announce
    /// (normally [`BOOKWORM_VERSION`]); `with_gid` is perftest's `-x` (108-byte addresses).
    pub fn new(
        stream: S,
        role: Role,
        local_version: &str,
        dont_xchg_versions: bool,
        with_gid: bool,
    ) -> Self {
        PerftestComm {
            stream,
            role,
            local_version: local_version.to_string(),
            remote_version: None,
            dont_xchg_versions,
            with_gid,
            setup_bound: Some(setup::SETUP_TIMEOUT),
            bound_applied: false,
            in_setup: true,
            read_ahead: Vec::new(),
            peer_closed: false,
            rdma_cm_gid_index: None,
        }
    }

    /// `-R`: perftest then exchanges over rdma_cm ("Data ex. method : rdma_cm"), `stream`
    /// being one (a [`crate::perftest::cm::CmStream`]); `gid_index` is what our
    /// addresses announce.
    pub fn with_rdma_cm(mut self, gid_index: u32) -> Self {
        self.rdma_cm_gid_index = Some(gid_index as i32);
        self
    }

    /// perftest's sync rounds around `create_rdma_cm_connection`: `my_dest[0]` is still
    /// all zeros then, and what the peer sends is not looked at.
    pub fn sync_hand_shake(&mut self) -> Result<(), PerftestOobError> {
        let zero = PerftestDest {
            lid: 0,
            out_reads: 0,
            qpn: 0,
            psn: 0,
            rkey: 0,
            vaddr: 0,
            gid: Some([0; 16]),
            srqn: 0,
        };
        let (mine, len) = match self.rdma_cm_gid_index {
            Some(_) => (zero.encode_binary(0).to_vec(), DEST_BINARY_LEN),
            None => {
                let mut z = zero;
                if !self.with_gid {
                    z.gid = None;
                }
                (z.encode(), PerftestDest::wire_len(self.with_gid))
            }
        };
        self.xchg(&mine, len, "the sync round around the rdma_cm connection")?;
        Ok(())
    }

    /// Sets the set-up bound (`None`: wait forever, as perftest does).
    pub fn with_setup_bound(mut self, bound: Option<Duration>) -> Self {
        self.setup_bound = bound;
        self
    }

    /// The QPs are connected: from now on reads block without a bound.
    pub fn end_setup(&mut self) -> Result<(), PerftestOobError> {
        self.in_setup = false;
        if self.bound_applied {
            self.bound_applied = false;
            self.stream
                .bound_reads(None)
                .map_err(io("clearing the set-up timeout"))?;
        }
        Ok(())
    }

    /// Gives the stream back.
    pub fn into_inner(self) -> S {
        self.stream
    }

    /// The peer's version string (after [`Self::exchange_versions`]).
    pub fn remote_version(&self) -> Option<&str> {
        self.remote_version.as_deref()
    }

    /// The version number used for the peer's compatibility rules: what it announced,
    /// or ours when versions were not exchanged.
    pub fn remote_version_number(&self) -> f64 {
        version_number(
            self.remote_version
                .as_deref()
                .unwrap_or(&self.local_version),
        )
    }

    pub(super) fn exchanges(&self) -> bool {
        !self.dont_xchg_versions
    }

    /// Reads exactly `buf.len()` bytes, read-ahead first, within the set-up bound while
    /// it applies.
    pub(super) fn read_msg(
        &mut self,
        buf: &mut [u8],
        during: &'static str,
    ) -> Result<(), PerftestOobError> {
        if self.in_setup && !self.bound_applied {
            if let Some(bound) = self.setup_bound {
                self.stream
                    .bound_reads(Some(bound))
                    .map_err(io("setting the set-up timeout"))?;
                self.bound_applied = true;
            }
        }
        let ahead = self.read_ahead.len().min(buf.len());
        buf[..ahead].copy_from_slice(&self.read_ahead[..ahead]);
        self.read_ahead.drain(..ahead);
        if ahead == buf.len() {
            return Ok(());
        }
        match setup::read_full(&mut self.stream, &mut buf[ahead..]) {
            Ok(()) => Ok(()),
            Err((n, e)) if setup::is_timeout(&e) && self.bound_applied => {
                let got = &buf[..ahead + n];
                let mut hint = setup::peer_hint(got);
                if !self.exchanges()
                    && matches!(setup::identify_peer(got), Some(PeerTool::Perftest { .. }))
                {
                    hint.push_str(": it exchanges versions, we were told not to (--dont_xchg_versions); use that option on both sides or on neither");
                } else if got.is_empty() && self.role == Role::Server {
                    hint.push_str("; the peer connected but sent nothing (perftest clients write first; xroce file send, for one, waits to be spoken to)");
                }
                Err(PerftestOobError::Timeout {
                    during,
                    secs: self
                        .setup_bound
                        .map_or(0, |b| b.as_secs_f64().ceil() as u64),
                    expected: buf.len(),
                    got: got.len(),
                    hint,
                })
            }
            Err((_, e)) => Err(PerftestOobError::Io { during, source: e }),
        }
    }

    /// `ctx_xchg_data_ethernet`: the client writes then reads; the server reads then writes.
    pub fn xchg(
        &mut self,
        mine: &[u8],
        theirs_len: usize,
        during: &'static str,
    ) -> Result<Vec<u8>, PerftestOobError> {
        let mut theirs = vec![0u8; theirs_len];
        match self.role {
            Role::Client => {
                self.stream.write_all(mine).map_err(io(during))?;
                self.stream.flush().map_err(io(during))?;
                self.read_msg(&mut theirs, during)?;
            }
            Role::Server => {
                self.read_msg(&mut theirs, during)?;
                self.stream.write_all(mine).map_err(io(during))?;
                self.stream.flush().map_err(io(during))?;
            }
        }
        Ok(theirs)
    }

    /// `exchange_versions` + `check_version_compatibility`.
    pub fn exchange_versions(&mut self) -> Result<(), PerftestOobError> {
        if !self.exchanges() {
            return Ok(());
        }
        let mut mine = [0u8; VERSION_LEN];
        let bytes = self.local_version.as_bytes();
        let n = bytes.len().min(VERSION_LEN - 1);
        mine[..n].copy_from_slice(&bytes[..n]);
        let theirs = self.xchg(&mine, VERSION_LEN, "exchanging versions")?;
        let end = theirs.iter().position(|&b| b == 0).unwrap_or(VERSION_LEN);
        let remote = String::from_utf8_lossy(&theirs[..end]).into_owned();
        if version_number(&remote) < MIN_COMPATIBLE_VERSION {
            let advice = match setup::identify_peer(&theirs) {
                Some(PeerTool::Pingpong) => "run xroce pingpong (or ibv_rc_pingpong) on this side too, or xroce perf/perftest on the peer",
                Some(PeerTool::PerftestWithoutVersions) => "use --dont_xchg_versions on both sides or on neither",
                Some(PeerTool::JsonLines) => "run the same xroce command on both sides",
                Some(PeerTool::Perftest { .. }) | None => {
                    return Err(PerftestOobError::VersionTooOld(remote))
                }
            };
            let peer = setup::identify_peer(&theirs)
                .map(|p| p.describe())
                .unwrap_or_default();
            return Err(PerftestOobError::NotPerftest {
                text: remote,
                peer,
                advice,
            });
        }
        self.remote_version = Some(remote);
        Ok(())
    }

    /// `check_sys_data`: returns the larger page and cache-line sizes.
    pub fn exchange_sys_data(&mut self, local: SysData) -> Result<SysData, PerftestOobError> {
        if !self.exchanges() || self.remote_version_number() < 5.32 {
            return Ok(local);
        }
        let page = self.xchg(&local.page_size.to_be_bytes(), 4, "exchanging page size")?;
        let line = self.xchg(
            &local.cache_line.to_be_bytes(),
            4,
            "exchanging cache-line size",
        )?;
        let page = u32::from_be_bytes(page[..4].try_into().unwrap_or([0; 4]));
        let line = u32::from_be_bytes(line[..4].try_into().unwrap_or([0; 4]));
        Ok(SysData {
            page_size: local.page_size.max(page),
            cache_line: local.cache_line.max(line),
        })
    }

    /// `check_mtu`: sends our `ibv_mtu` enum as text and returns the smaller one (a
    /// peer's invalid value is ignored, as perftest does).
    pub fn exchange_mtu(&mut self, local_mtu_enum: u8) -> Result<u8, PerftestOobError> {
        let rem = self.remote_version_number();
        if !self.exchanges() || rem < 5.1 {
            return Ok(local_mtu_enum);
        }
        let len = if rem >= 5.31 { 2 } else { 4 };
        let mut mine = vec![0u8; len];
        let text = local_mtu_enum.to_string();
        mine[..1].copy_from_slice(&text.as_bytes()[..1]);
        let theirs = self.xchg(&mine, len, "exchanging MTU")?;
        let end = theirs.iter().position(|&b| b == 0).unwrap_or(len);
        let remote: i64 = std::str::from_utf8(&theirs[..end])
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        if (1..=5).contains(&remote) && (remote as u8) < local_mtu_enum {
            Ok(remote as u8)
        } else {
            Ok(local_mtu_enum)
        }
    }

    /// `negotiate_params` (perftest >= 6.28): only when both sides are that new. Returns
    /// the peer's block, after checking that the test parameters match.
    pub fn negotiate(
        &mut self,
        local: &NegotiateParams,
    ) -> Result<Option<NegotiateParams>, PerftestOobError> {
        if !self.exchanges()
            || version_number(&self.local_version) < NEGOTIATE_MIN_VERSION
            || self.remote_version_number() < NEGOTIATE_MIN_VERSION
        {
            return Ok(None);
        }
        let mine = local.encode();
        let theirs = self.xchg(&mine, mine.len(), "exchanging the parameter block")?;
        let remote = NegotiateParams::decode(&theirs).ok_or(PerftestOobError::ParamMismatch(
            "parameter block has an unexpected size".into(),
        ))?;
        local.check_matches(&remote)?;
        Ok(Some(remote))
    }

    /// `ctx_hand_shake`: one QP-address round.
    pub fn hand_shake(&mut self, mine: &PerftestDest) -> Result<PerftestDest, PerftestOobError> {
        if let Some(gid_index) = self.rdma_cm_gid_index {
            let theirs = self.xchg(
                &mine.encode_binary(gid_index),
                DEST_BINARY_LEN,
                "exchanging QP addresses",
            )?;
            return PerftestDest::decode_binary(&theirs);
        }
        let mut mine = *mine;
        if !self.with_gid {
            mine.gid = None;
        } else if mine.gid.is_none() {
            mine.gid = Some([0; 16]);
        }
        let theirs = self.xchg(
            &mine.encode(),
            PerftestDest::wire_len(self.with_gid),
            "exchanging QP addresses",
        )?;
        PerftestDest::decode(&theirs, self.with_gid)
    }

    /// `xchg_bw_reports`: five (plain) values, each its own exchange.
    pub fn exchange_bw_reports(&mut self, mine: &BwReport) -> Result<BwReport, PerftestOobError> {
        let iters_len = if self.remote_version_number() >= 5.33 {
            8
        } else {
            4
        };
        let size = self.xchg(&mine.size.to_be_bytes(), 8, "exchanging bw reports")?;
        let iters_bytes = if iters_len == 8 {
            mine.iters.to_be_bytes().to_vec()
        } else {
            (mine.iters as u32).to_be_bytes().to_vec()
        };
        let iters = self.xchg(&iters_bytes, iters_len, "exchanging bw reports")?;
        let peak = self.xchg(
            &mine.bw_peak.to_bits().to_be_bytes(),
            8,
            "exchanging bw reports",
        )?;
        let avg = self.xchg(
            &mine.bw_avg.to_bits().to_be_bytes(),
            8,
            "exchanging bw reports",
        )?;
        let rate = self.xchg(
            &mine.msg_rate_avg.to_bits().to_be_bytes(),
            8,
            "exchanging bw reports",
        )?;
        let u64_of = |b: &[u8]| u64::from_be_bytes(b[..8].try_into().unwrap_or([0; 8]));
        Ok(BwReport {
            size: u64_of(&size),
            iters: if iters_len == 8 {
                u64_of(&iters)
            } else {
                u32::from_be_bytes(iters[..4].try_into().unwrap_or([0; 4])) as u64
            },
            bw_peak: f64::from_bits(u64_of(&peak)),
            bw_avg: f64::from_bits(u64_of(&avg)),
            msg_rate_avg: f64::from_bits(u64_of(&rate)),
        })
    }

    /// `ctx_close_connection`: a last address round, then `"done\0"` from both sides. The
    /// peer's "done" is not waited for (perftest does not read it either).
    pub fn close(&mut self, mine: &PerftestDest) -> Result<(), PerftestOobError> {
        self.hand_shake(mine)?;
        if self.rdma_cm_gid_index.is_some() {
            // ctx_close_connection writes "done" on TCP only.
            return Ok(());
        }
        // The peer may already have written its own "done" and closed: that is success.
        let result = self
            .stream
            .write_all(b"done\0")
            .and_then(|_| self.stream.flush());
        match result {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                Ok(())
            }
            other => other.map_err(io("sending \"done\"")),
        }
    }
}

/// perftest's `ipv6_addr_v4mapped` (also accepts the IPv4 multicast form `ff0e::ffff:x`).
pub fn gid_is_v4_mapped(gid: &[u8; 16]) -> bool {
    let mapped_tail = gid[8..10] == [0, 0] && gid[10..12] == [0xff, 0xff];
    (gid[..8] == [0; 8] && mapped_tail)
        || (gid[..4] == [0xff, 0x0e, 0, 0] && gid[4..8] == [0; 4] && mapped_tail)
}

/// `ctx_check_gid_compatibility`: both GIDs IPv4-mapped, or neither.
pub fn check_gid_compatibility(
    local: &[u8; 16],
    remote: &[u8; 16],
) -> Result<(), PerftestOobError> {
    if gid_is_v4_mapped(local) != gid_is_v4_mapped(remote) {
        return Err(PerftestOobError::GidTypeMismatch {
            local: Ipv6Addr::from(*local),
            remote: Ipv6Addr::from(*remote),
        });
    }
    Ok(())
}

/// What a [`run_script`] caller supplies: the RDMA side of a test.
pub trait PerftestRunner {
    /// Connect our QPs to the peer's (RTR, RTS); called at [`Step::Connect`].
    fn connect(&mut self, remote: &[PerftestDest], mtu_enum: u8) -> anyhow::Result<()>;
    /// Run one message size; a bw test returns its report, a latency test `None`. `peer`
    /// tells whether the peer has finished its part (a receiver that waits for datagrams
    /// uses it to stop once no more can come).
    fn run(&mut self, size: u64, peer: &mut dyn PeerWatch) -> anyhow::Result<Option<BwReport>>;
    /// `-R`: connect the QPs through rdma_cm ([`Step::CmConnect`]).
    fn cm_connect(&mut self) -> anyhow::Result<()> {
        anyhow::bail!("this runner cannot connect through rdma_cm (-R)")
    }
    /// `-b`: both reports of the size just run are known ([`Step::DuplexReports`]).
    fn duplex_report(&mut self, _mine: &BwReport, _theirs: &BwReport) -> anyhow::Result<()> {
        Ok(())
    }
}

/// What a finished conversation learned.
#[derive(Debug, Clone, Default)]
pub struct ScriptOutcome {
    /// The peer's version (None with `--dont_xchg_versions`).
    pub remote_version: Option<String>,
    /// Page and cache-line size after taking the maximum.
    pub sys_data: Option<SysData>,
    /// The MTU enum both use.
    pub mtu_enum: u8,
    /// The peer's parameter block, if one was exchanged.
    pub remote_params: Option<NegotiateParams>,
    /// Peer addresses per QP (from the first rounds).
    pub remote_dests: Vec<PerftestDest>,
    /// Our reports, one per size run.
    pub local_reports: Vec<BwReport>,
    /// The report the peer sent (bw tests).
    pub remote_report: Option<BwReport>,
}

/// Error of [`run_script`]: the exchange itself, or the RDMA side.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    /// The TCP conversation failed.
    #[error(transparent)]
    Oob(#[from] PerftestOobError),
    /// The RDMA side failed.
    #[error("{0:#}")]
    Rdma(anyhow::Error),
}

/// Inputs of [`run_script`] that describe this side.
#[derive(Debug, Clone)]
pub struct LocalSide {
    /// Page/cache-line sizes to announce.
    pub sys_data: SysData,
    /// Our `ibv_mtu` enum.
    pub mtu_enum: u8,
    /// Our parameter block (sent only to new peers).
    pub params: NegotiateParams,
    /// One address per QP.
    pub dests: Vec<PerftestDest>,
}

/// Runs a whole [`script`] on `comm`, calling `runner` for the RDMA steps, and checks the
/// echo rule: every later address round must repeat what the peer said first.
pub fn run_script<S: OobStream, R: PerftestRunner>(
    comm: &mut PerftestComm<S>,
    steps: &[Step],
    local: &LocalSide,
    runner: &mut R,
) -> Result<ScriptOutcome, ScriptError> {
    let mut out = ScriptOutcome {
        mtu_enum: local.mtu_enum,
        ..Default::default()
    };
    let mut remote: Vec<Option<PerftestDest>> = vec![None; local.dests.len()];
    for step in steps {
        match *step {
            Step::Versions => {
                comm.exchange_versions()?;
                out.remote_version = comm.remote_version().map(str::to_string);
            }
            Step::SysData => out.sys_data = Some(comm.exchange_sys_data(local.sys_data)?),
            Step::Mtu => out.mtu_enum = comm.exchange_mtu(local.mtu_enum)?,
            Step::Negotiate => out.remote_params = comm.negotiate(&local.params)?,
            Step::HandShake(i) => {
                let theirs = comm.hand_shake(&local.dests[i])?;
                match &remote[i] {
                    None => remote[i] = Some(theirs),
                    Some(first) if same_qp(first, &theirs) => {}
                    Some(_) => {
                        return Err(PerftestOobError::MalformedDest {
                            reason: "peer changed its QP address between rounds",
                            text: String::from_utf8_lossy(&theirs.encode()).into_owned(),
                        }
                        .into())
                    }
                }
            }
            Step::Connect => {
                let dests: Vec<PerftestDest> = remote.iter().flatten().copied().collect();
                if let (Some(first), Some(mine)) = (dests.first(), local.dests.first()) {
                    if let (Some(a), Some(b)) = (mine.gid, first.gid) {
                        check_gid_compatibility(&a, &b)?;
                    }
                    check_same_test(&local.params, mine, first)?;
                }
                runner
                    .connect(&dests, out.mtu_enum)
                    .map_err(ScriptError::Rdma)?;
                out.remote_dests = dests;
                comm.end_setup()?;
            }
            Step::SyncHandShake => comm.sync_hand_shake()?,
            Step::CmConnect => runner.cm_connect().map_err(ScriptError::Rdma)?,
            Step::Run(size) => {
                if let Some(report) = runner.run(size, comm).map_err(ScriptError::Rdma)? {
                    out.local_reports.push(report);
                }
            }
            Step::BwReports => {
                let mine = out.local_reports.last().copied().unwrap_or_default();
                out.remote_report = Some(comm.exchange_bw_reports(&mine)?);
            }
            Step::DuplexReports => {
                let mine = out.local_reports.last().copied().unwrap_or_default();
                let theirs = comm.exchange_bw_reports(&mine)?;
                out.remote_report = Some(theirs);
                runner
                    .duplex_report(&mine, &theirs)
                    .map_err(ScriptError::Rdma)?;
            }
            Step::Close => comm.close(&local.dests[0])?,
        }
    }
    if out.remote_dests.is_empty() {
        out.remote_dests = remote.into_iter().flatten().collect();
    }
    Ok(out)
}

/// The test a parameter block describes, as perftest's binary name.
pub(super) fn test_name(params: &NegotiateParams) -> &'static str {
    let bw = params.tst == enums::TST_BW;
    match (params.verb, bw) {
        (enums::VERB_SEND, true) => "ib_send_bw",
        (enums::VERB_SEND, false) => "ib_send_lat",
        (enums::VERB_WRITE, true) => "ib_write_bw",
        (enums::VERB_WRITE, false) => "ib_write_lat",
        (enums::VERB_READ, true) => "ib_read_bw",
        (enums::VERB_READ, false) => "ib_read_lat",
        (_, true) => "ib_atomic_bw",
        (_, false) => "ib_atomic_lat",
    }
}

/// perftest 6.06 sends nothing that names its test; the QP address's outstanding-reads
/// field is the one thing that differs: the READ and atomic tests announce their `-o`
/// depth (the device maximum by default, 128 on rxe, 16 on xroce), the SEND and WRITE
/// tests always 1 (`perftest_parameters.c`). perftest >= 6.28 compares the whole
/// parameter block instead ([`NegotiateParams::check_matches`]).
pub fn check_same_test(
    local: &NegotiateParams,
    mine: &PerftestDest,
    theirs: &PerftestDest,
) -> Result<(), PerftestOobError> {
    let ours = test_name(local);
    let read_like = matches!(local.verb, enums::VERB_READ | enums::VERB_ATOMIC);
    if !read_like && theirs.out_reads > 1 {
        return Err(PerftestOobError::OtherTest(format!(
            "its QP address allows {} outstanding RDMA READs/atomics, which only the read and atomic tests announce (send and write tests send 1), and we run {ours}; run the same test on both sides",
            theirs.out_reads
        )));
    }
    if read_like && mine.out_reads > 1 && theirs.out_reads <= 1 {
        return Err(PerftestOobError::OtherTest(format!(
            "its QP address allows {} outstanding RDMA READs/atomics, as the send and write tests announce, and we run {ours} with -o {}; run the same test on both sides (if the peer runs {ours} with -o 1, give -o 1 here too)",
            theirs.out_reads, mine.out_reads
        )));
    }
    Ok(())
}

/// Rounds after the first repeat the same QP; perftest's server reuses its
/// `my_dest[0]` for the barrier rounds, so compare the QP identity fields.
pub(super) fn same_qp(a: &PerftestDest, b: &PerftestDest) -> bool {
    a.qpn == b.qpn && a.psn == b.psn && a.rkey == b.rkey && a.vaddr == b.vaddr && a.gid == b.gid
}
