//! What a conformance case is and the context it runs in: the peer, the agent, an RC
//! connection between the peer's made-up QP and a real QP on the target, and the checks a
//! case records (each an IBTA expectation and what the target did).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::agent::{AgentClient, AgentError, Completion, ConnectParams, MrInfo, QpInfo};
use super::peer::{Heard, Peer, PeerError};
use xroce::wire::{AtomicEthRepr, DethRepr, Opcode, PacketRepr, Psn, RethRepr};

/// How a case ended.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every check held.
    Conforms,
    /// The target answered, and some answer is not what the rule says.
    Deviates,
    /// The case could not run (the agent refused a set-up step, the peer failed).
    Error,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Conforms => "conforms",
            Verdict::Deviates => "deviates",
            Verdict::Error => "error",
        })
    }
}

/// One check of a case: what the rule expects, what the target did, whether they agree.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Check {
    pub expected: String,
    pub observed: String,
    pub holds: bool,
}

/// Why a case could not run.
#[derive(Debug, thiserror::Error)]
pub enum CaseError {
    #[error("agent: {0}")]
    Agent(#[from] AgentError),
    #[error("{0}")]
    Peer(#[from] PeerError),
    #[error("{0}")]
    Setup(String),
}

/// A case of the catalogue.
pub struct Case {
    /// What it tests, in words a tester searches for (`duplicate_read_replay`).
    pub name: &'static str,
    /// The IBTA rule it checks (section, compliance statement).
    pub rule: &'static str,
    /// One sentence: the situation and the answer the rule asks for.
    pub summary: &'static str,
    pub run: fn(&mut Ctx<'_>) -> Result<(), CaseError>,
}

/// How long the peer waits for answers. The target may be a TCG guest: its answers take
/// milliseconds, not microseconds, so the windows are wide; timings are measured, not
/// assumed.
#[derive(Debug, Clone, Copy)]
pub struct Windows {
    /// For an answer that must come.
    pub answer: Duration,
    /// Silence that counts as "nothing was sent".
    pub quiet: Duration,
}

impl Default for Windows {
    fn default() -> Self {
        Windows {
            answer: Duration::from_secs(2),
            quiet: Duration::from_millis(300),
        }
    }
}

/// The bytes of each target MR.
pub const MR_LEN: usize = 64 * 1024;

/// An RC connection between a QP on the target and the peer's made-up QP.
#[derive(Debug, Clone)]
pub struct Rc {
    pub qp: QpInfo,
    pub mr: MrInfo,
    /// The peer's QPN (nothing behind it but the case).
    pub peer_qpn: u32,
    /// The next PSN of the peer's requests (what the target's responder expects).
    pub psn: u32,
    /// The first PSN of the target's requests.
    pub target_psn: u32,
    pub params: ConnectParams,
}

impl Rc {
    /// The target QP's number.
    pub fn qpn(&self) -> u32 {
        self.qp.qpn
    }

    /// The path MTU in bytes.
    pub fn mtu(&self) -> usize {
        self.params.mtu as usize
    }

    /// A request of `opcode` to the target's QP at `psn`, AckReq set, P_Key default.
    pub fn request<'p>(&self, opcode: Opcode, psn: u32, payload: &'p [u8]) -> PacketRepr<'p> {
        let mut p = PacketRepr::new(opcode, self.qpn());
        p.bth.psn = Psn::new(psn);
        p.bth.ack_req = true;
        p.bth.pad_count = ((4 - payload.len() % 4) % 4) as u8;
        p.payload = payload;
        if let Some(info) = opcode.info() {
            if info.has_immdt {
                p.immdt = Some(0x1234_5678);
            }
            if info.has_deth {
                p.deth = Some(DethRepr {
                    qkey: 0,
                    src_qp: self.peer_qpn,
                });
            }
        }
        p
    }

    /// A request carrying a RETH for `len` bytes at `offset` of the target's MR.
    pub fn rdma<'p>(
        &self,
        opcode: Opcode,
        psn: u32,
        offset: u64,
        len: u32,
        payload: &'p [u8],
    ) -> PacketRepr<'p> {
        let mut p = self.request(opcode, psn, payload);
        p.reth = Some(RethRepr {
            va: self.mr.addr + offset,
            rkey: self.mr.rkey,
            dma_len: len,
        });
        p
    }

    /// An atomic request on the 8 bytes at `offset` of the target's MR.
    pub fn atomic(
        &self,
        opcode: Opcode,
        psn: u32,
        offset: u64,
        swap_add: u64,
        compare: u64,
    ) -> PacketRepr<'static> {
        let mut p = self.request(opcode, psn, &[]);
        p.atomic_eth = Some(AtomicEthRepr {
            va: self.mr.addr + offset,
            rkey: self.mr.rkey,
            swap_add,
            compare,
        });
        p
    }
}

/// What a case works with.
pub struct Ctx<'a> {
    pub peer: &'a mut Peer,
    pub agent: &'a mut AgentClient,
    /// The target's GID (`::ffff:198.18.0.11`).
    pub target_gid: String,
    /// The peer's GID.
    pub peer_gid: String,
    pub windows: Windows,
    /// The target's largest READ depth (`max_qp_rd_atom`).
    pub target_rd_atom: u32,
    pub checks: Vec<Check>,
    pub measurements: BTreeMap<String, f64>,
    /// The next QPN the peer makes up.
    pub next_peer_qpn: u32,
}

impl Ctx<'_> {
    /// Records a check.
    pub fn check(&mut self, holds: bool, expected: impl Into<String>, observed: impl Into<String>) {
        self.checks.push(Check {
            expected: expected.into(),
            observed: observed.into(),
            holds,
        });
    }

    /// Records a measurement (milliseconds, counts).
    pub fn measure(&mut self, name: &str, value: f64) {
        self.measurements.insert(name.to_string(), value);
    }

    /// A target QP with a 64 KiB MR (all remote access), connected to a fresh peer QPN;
    /// `tune` adjusts the connection's attributes first (PSNs, timeout, retries...).
    pub fn rc(&mut self, tune: impl FnOnce(&mut ConnectParams)) -> Result<Rc, CaseError> {
        self.rc_with_access(
            &[
                "local_write",
                "remote_write",
                "remote_read",
                "remote_atomic",
            ],
            tune,
        )
    }

    /// [`Ctx::rc`] with an MR of only the `access` rights named (the agent's names).
    pub fn rc_with_access(
        &mut self,
        access: &[&str],
        tune: impl FnOnce(&mut ConnectParams),
    ) -> Result<Rc, CaseError> {
        let peer_qpn = self.next_peer_qpn;
        self.next_peer_qpn += 1;
        let qp = self.agent.create_qp(false)?;
        let mr = self.agent.reg_mr(MR_LEN, access)?;
        let mut params = ConnectParams::new(peer_qpn, self.peer_gid.clone(), 0x10_0000, 0x20_0000);
        params.timeout = 14;
        tune(&mut params);
        self.agent.connect(&qp, &params)?;
        self.peer.drain()?;
        Ok(Rc {
            qp,
            mr,
            peer_qpn,
            psn: params.rq_psn,
            target_psn: params.sq_psn,
            params,
        })
    }

    /// Sends a composed packet.
    pub fn send(&mut self, p: &PacketRepr<'_>) -> Result<(), CaseError> {
        Ok(self.peer.send(p)?)
    }

    /// The next frame the target sends to the peer's QP of `rc`, within the answer window.
    pub fn answer(&mut self, rc: &Rc) -> Result<Option<Heard>, CaseError> {
        let deadline = Instant::now() + self.windows.answer;
        self.answer_until(rc, deadline)
    }

    /// The next frame to `rc`'s peer QP before `deadline`.
    pub fn answer_until(&mut self, rc: &Rc, deadline: Instant) -> Result<Option<Heard>, CaseError> {
        let qpn = rc.peer_qpn;
        Ok(self.peer.next_where(deadline, |h| h.dest_qp == qpn)?)
    }

    /// Everything the target sends to `rc`'s peer QP for `window`.
    pub fn gather(&mut self, rc: &Rc, window: Duration) -> Result<Vec<Heard>, CaseError> {
        let qpn = rc.peer_qpn;
        Ok(self
            .peer
            .collect_where(Instant::now() + window, |h| h.dest_qp == qpn)?)
    }

    /// What the target sends in the quiet window (a case expecting nothing wants it empty).
    pub fn quiet(&mut self, rc: &Rc) -> Result<Vec<Heard>, CaseError> {
        let window = self.windows.quiet;
        self.gather(rc, window)
    }

    /// The target's completions on `rc`'s QP: up to `max`, waiting up to the answer window.
    pub fn completions(&mut self, rc: &Rc, max: usize) -> Result<Vec<Completion>, CaseError> {
        Ok(self.agent.poll(&rc.qp, max, self.windows.answer)?)
    }

    /// The target's completions available within `wait`.
    pub fn completions_within(
        &mut self,
        rc: &Rc,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Completion>, CaseError> {
        Ok(self.agent.poll(&rc.qp, max, wait)?)
    }

    /// Bytes of the target's MR.
    pub fn memory(&mut self, rc: &Rc, offset: usize, len: usize) -> Result<Vec<u8>, CaseError> {
        Ok(self.agent.read_mem(&rc.mr, offset, len)?)
    }
}

/// Frames in a tester's words, `;`-separated (`nothing` for none).
pub fn describe_all(heard: &[Heard]) -> String {
    if heard.is_empty() {
        return "nothing".into();
    }
    heard
        .iter()
        .map(Heard::describe)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Completions in a tester's words.
pub fn describe_completions(wcs: &[Completion]) -> String {
    if wcs.is_empty() {
        return "no completion".into();
    }
    wcs.iter()
        .map(|w| format!("{} {} len={}", w.opcode, w.status_name, w.byte_len))
        .collect::<Vec<_>>()
        .join("; ")
}

/// `n` bytes of a recognisable pattern starting at `seed`.
pub fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| seed.wrapping_add((i * 7) as u8)).collect()
}
