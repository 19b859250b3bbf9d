//! Which steps a test's conversation has, in order ([`script`]), and the eight tests
//! ([`TestKind`]).

use super::*;

/// One step of a perftest conversation; [`script`] lists them in order for a test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The 16-byte version strings.
    Versions,
    /// Page size and cache-line size.
    SysData,
    /// The MTU string.
    Mtu,
    /// perftest >= 6.28's parameter block (skipped unless both sides are that new).
    Negotiate,
    /// One QP-address round for QP `i`.
    HandShake(usize),
    /// Connect the QPs (RTR/RTS) with the addresses learned so far; no bytes on TCP.
    /// With `-R` the QPs are already connected ([`Step::CmConnect`]): only the peer's
    /// addresses (R_Key, VA) are taken.
    Connect,
    /// `-R`: a QP-address round of an all-zero address, perftest's sync before and after
    /// it connects the test QPs through rdma_cm (`create_rdma_cm_connection`).
    SyncHandShake,
    /// `-R`: connect the test QPs through rdma_cm, one id per QP
    /// ([`PerftestRunner::cm_connect`]).
    CmConnect,
    /// Run the measurement for one message size; no bytes on TCP.
    Run(u64),
    /// Bandwidth report exchange.
    BwReports,
    /// `-b`: bandwidth report exchange, then the runner prints the sum of both
    /// directions ([`PerftestRunner::duplex_report`]).
    DuplexReports,
    /// Final QP-address round and `"done\0"`.
    Close,
}

/// The script of `-R` (perftest's `--rdma_cm`): every main calls
/// `create_rdma_cm_connection` right after the version/MTU steps, before any address round:
/// a zero-address round, the CM connection of the test QPs, another zero-address round.
/// The rest is unchanged; [`Step::Connect`] then only takes the peer's addresses.
pub fn with_rdma_cm(steps: &[Step]) -> Vec<Step> {
    let at = steps
        .iter()
        .position(|s| {
            !matches!(
                s,
                Step::Versions | Step::SysData | Step::Mtu | Step::Negotiate
            )
        })
        .unwrap_or(steps.len());
    let mut out = steps[..at].to_vec();
    out.extend([Step::SyncHandShake, Step::CmConnect, Step::SyncHandShake]);
    out.extend_from_slice(&steps[at..]);
    out
}

/// A test name that is none of the eight.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown test {typed:?}: one of send_bw, write_bw, read_bw, atomic_bw, send_lat, write_lat, read_lat, atomic_lat")]
pub struct UnknownTest {
    /// What was typed.
    pub typed: String,
}

impl std::str::FromStr for TestKind {
    type Err = UnknownTest;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TestKind::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| UnknownTest {
                typed: s.to_string(),
            })
    }
}

/// The eight tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TestKind {
    /// `ib_send_bw`
    SendBw,
    /// `ib_write_bw`
    WriteBw,
    /// `ib_read_bw`
    ReadBw,
    /// `ib_atomic_bw`
    AtomicBw,
    /// `ib_send_lat`
    SendLat,
    /// `ib_write_lat`
    WriteLat,
    /// `ib_read_lat`
    ReadLat,
    /// `ib_atomic_lat`
    AtomicLat,
}

impl TestKind {
    /// All tests, in the order of the command's help.
    pub const ALL: [TestKind; 8] = [
        TestKind::SendBw,
        TestKind::WriteBw,
        TestKind::ReadBw,
        TestKind::AtomicBw,
        TestKind::SendLat,
        TestKind::WriteLat,
        TestKind::ReadLat,
        TestKind::AtomicLat,
    ];

    /// The perftest binary this test mirrors.
    pub fn perftest_binary(self) -> &'static str {
        match self {
            TestKind::SendBw => "ib_send_bw",
            TestKind::WriteBw => "ib_write_bw",
            TestKind::ReadBw => "ib_read_bw",
            TestKind::AtomicBw => "ib_atomic_bw",
            TestKind::SendLat => "ib_send_lat",
            TestKind::WriteLat => "ib_write_lat",
            TestKind::ReadLat => "ib_read_lat",
            TestKind::AtomicLat => "ib_atomic_lat",
        }
    }

    /// The test's name on the command line (`xroce perf send_bw`), as in JSON.
    pub fn name(self) -> &'static str {
        match self {
            TestKind::SendBw => "send_bw",
            TestKind::WriteBw => "write_bw",
            TestKind::ReadBw => "read_bw",
            TestKind::AtomicBw => "atomic_bw",
            TestKind::SendLat => "send_lat",
            TestKind::WriteLat => "write_lat",
            TestKind::ReadLat => "read_lat",
            TestKind::AtomicLat => "atomic_lat",
        }
    }

    /// One line of help: what the test measures, and the perftest program it mirrors.
    pub fn about(self) -> &'static str {
        match self {
            TestKind::SendBw => "SEND bandwidth (ib_send_bw)",
            TestKind::WriteBw => "RDMA WRITE bandwidth (ib_write_bw)",
            TestKind::ReadBw => "RDMA READ bandwidth (ib_read_bw)",
            TestKind::AtomicBw => "Atomic bandwidth (ib_atomic_bw)",
            TestKind::SendLat => "SEND latency, ping-pong (ib_send_lat)",
            TestKind::WriteLat => "RDMA WRITE latency, ping-pong through memory (ib_write_lat)",
            TestKind::ReadLat => "RDMA READ latency (ib_read_lat)",
            TestKind::AtomicLat => "Atomic latency (ib_atomic_lat)",
        }
    }

    /// Bandwidth (true) or latency (false).
    pub fn is_bw(self) -> bool {
        matches!(
            self,
            TestKind::SendBw | TestKind::WriteBw | TestKind::ReadBw | TestKind::AtomicBw
        )
    }

    /// perftest's `VerbType` number.
    pub fn verb(self) -> i32 {
        match self {
            TestKind::SendBw | TestKind::SendLat => enums::VERB_SEND,
            TestKind::WriteBw | TestKind::WriteLat => enums::VERB_WRITE,
            TestKind::ReadBw | TestKind::ReadLat => enums::VERB_READ,
            TestKind::AtomicBw | TestKind::AtomicLat => enums::VERB_ATOMIC,
        }
    }

    /// The verb as perftest prints it in the header ("Send", "RDMA_Write", ...).
    pub fn verb_name(self) -> &'static str {
        match self.verb() {
            enums::VERB_SEND => "Send",
            enums::VERB_WRITE => "RDMA_Write",
            enums::VERB_READ => "RDMA_Read",
            _ => "Atomic",
        }
    }

    /// True for tests that READ or use atomics (they report outstanding reads and, for
    /// latency, count the whole round trip as one sample).
    pub fn is_read_like(self) -> bool {
        matches!(self.verb(), enums::VERB_READ | enums::VERB_ATOMIC)
    }

    /// perftest's default message size (`DEF_SIZE_BW` 65536, `DEF_SIZE_LAT` 2, atomics 8).
    pub fn default_size(self) -> u64 {
        match self {
            TestKind::AtomicBw | TestKind::AtomicLat => 8,
            k if k.is_bw() => 65536,
            _ => 2,
        }
    }

    /// Sizes `-a` runs: 2^1 .. 2^23 (2 B .. 8 MiB) as perftest; atomics only 8 B; UD sends
    /// up to the MTU.
    pub fn run_all_sizes(self, ud_mtu: Option<u32>) -> Vec<u64> {
        if self.verb() == enums::VERB_ATOMIC {
            return vec![8];
        }
        let max_pow = match ud_mtu {
            Some(mtu) if self.verb() == enums::VERB_SEND => mtu.trailing_zeros() + 1,
            _ => 24,
        };
        (1..max_pow).map(|i| 1u64 << i).collect()
    }
}

/// The conversation of one test for one role, as perftest 6.06's main() does it
/// (non-duplex, `RUN_REGULAR` for one size or `RUN_ALL` for several).
pub fn script(kind: TestKind, role: Role, sizes: &[u64], num_qps: usize) -> Vec<Step> {
    script_with(kind, role, sizes, num_qps, false)
}

/// [`script`], or with `duplex` (`-b`) the bidirectional conversation of write_bw, read_bw
/// and atomic_bw (perftest's main() with `user_param.duplex`): both roles run every size,
/// each run between a handshake before (and with several sizes one after, perftest >= 4.6),
/// each followed by the report exchange; no final report round.
pub fn script_with(
    kind: TestKind,
    role: Role,
    sizes: &[u64],
    num_qps: usize,
    duplex: bool,
) -> Vec<Step> {
    if duplex
        && matches!(
            kind,
            TestKind::WriteBw | TestKind::ReadBw | TestKind::AtomicBw
        )
    {
        let mut steps = vec![Step::Versions, Step::SysData, Step::Mtu, Step::Negotiate];
        steps.extend((0..num_qps).map(Step::HandShake));
        steps.push(Step::Connect);
        steps.extend((0..num_qps).map(Step::HandShake));
        steps.push(Step::HandShake(0)); // "additional handshake after moving qp to RTR"
        for &size in sizes {
            steps.extend([Step::HandShake(0), Step::Run(size)]);
            if sizes.len() > 1 {
                steps.push(Step::HandShake(0));
            }
            steps.push(Step::DuplexReports);
        }
        steps.push(Step::Close);
        return steps;
    }
    let mut steps = vec![Step::Versions, Step::SysData, Step::Mtu, Step::Negotiate];
    let per_qp = |steps: &mut Vec<Step>| steps.extend((0..num_qps).map(Step::HandShake));
    let run_all = sizes.len() > 1;
    match kind {
        TestKind::WriteBw | TestKind::ReadBw | TestKind::AtomicBw => {
            per_qp(&mut steps);
            steps.push(Step::Connect);
            per_qp(&mut steps);
            steps.push(Step::HandShake(0)); // "additional handshake after moving qp to RTR"
            if role == Role::Client {
                steps.extend(sizes.iter().map(|&s| Step::Run(s)));
            }
            steps.extend([Step::HandShake(0), Step::BwReports, Step::Close]);
        }
        TestKind::SendBw | TestKind::SendLat => {
            per_qp(&mut steps);
            steps.push(Step::Connect);
            steps.push(Step::HandShake(0));
            per_qp(&mut steps);
            for &size in sizes {
                steps.push(Step::HandShake(0));
                steps.push(Step::Run(size));
                if kind == TestKind::SendBw && run_all {
                    steps.push(Step::HandShake(0));
                }
            }
            steps.push(Step::Close);
        }
        TestKind::WriteLat => {
            steps.push(Step::HandShake(0));
            per_qp(&mut steps);
            steps.push(Step::Connect);
            per_qp(&mut steps);
            steps.push(Step::HandShake(0));
            // ib_write_lat closes its socket without a final round or "done".
            steps.extend(sizes.iter().map(|&s| Step::Run(s)));
        }
        TestKind::ReadLat | TestKind::AtomicLat => {
            steps.push(Step::HandShake(0));
            per_qp(&mut steps);
            steps.push(Step::Connect);
            per_qp(&mut steps);
            steps.push(Step::HandShake(0));
            if role == Role::Client {
                steps.extend(sizes.iter().map(|&s| Step::Run(s)));
            }
            steps.push(Step::Close);
        }
    }
    steps
}
