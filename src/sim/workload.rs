//! The `xroce sim` workload: random RC operations from endpoint A to endpoint B over a
//! faulty simulated link, checked against a model.
//!
//! Every operation gets its own slot of memory (slots are reused only after the op that held
//! them completed), so the model knows exactly which bytes must land where:
//! - SEND / SEND_WITH_IMM: A's slot → the next receive buffer at B (checked on B's receive
//!   completion, with byte count and immediate);
//! - RDMA WRITE / WRITE_WITH_IMM: A's slot → B's slot (checked when A's completion arrives:
//!   an RC completion means the responder executed it);
//! - RDMA READ: B's slot (filled by the model at post time) → A's slot;
//! - CMP_SWAP / FETCH_ADD on one 64-bit counter per QP at B: the model applies them in
//!   posting order (RC executes them in order) and checks each returned original value and
//!   the final counter.
//!
//! Completions must arrive exactly once and in posting order per QP.
use std::collections::{BTreeMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::{LinkConfig, LinkStats, Network, SimError};
use crate::engine::{
    Access, AddressVector, Counters, CqId, Engine, EngineConfig, Instant, MrInfo, Mtu, QpAttr,
    QpAttrMask as M, QpCaps, QpInit, QpState, QpType, RecvWr, SendFlags, SendWr, Sge, Wc, WcStatus,
    WrOp,
};

/// MAC of simulated endpoint A.
pub const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
/// MAC of simulated endpoint B.
pub const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
/// IP of endpoint A (benchmarking range 198.18.0.0/15).
pub const IP_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// IP of endpoint B.
pub const IP_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

/// Operation mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum OpKind {
    /// SEND.
    Send,
    /// SEND with immediate.
    SendImm,
    /// RDMA WRITE.
    Write,
    /// RDMA WRITE with immediate.
    WriteImm,
    /// RDMA READ.
    Read,
    /// Compare and swap.
    Cas,
    /// Fetch and add.
    Fadd,
}

const ALL_OPS: [OpKind; 7] = [
    OpKind::Send,
    OpKind::SendImm,
    OpKind::Write,
    OpKind::WriteImm,
    OpKind::Read,
    OpKind::Cas,
    OpKind::Fadd,
];

/// A peer misbehaviour to provoke an error path.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scenario {
    /// B never posts receive WQEs: SENDs get RNR NAKs until rnr_retry runs out.
    pub no_recv: bool,
    /// B posts its receive WQEs only after this much virtual time (RNR NAKs, then success).
    pub recv_delay: Option<Duration>,
    /// Operation number N (0-based; or the next RDMA/atomic op after it) uses a wrong R_Key.
    pub wrong_rkey_at: Option<u64>,
}

/// Everything `xroce sim` can set.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    /// Operations to post in total.
    pub ops: u64,
    /// Largest message size in bytes.
    pub max_size: u32,
    /// Number of RC QP pairs.
    pub qps: u32,
    /// Outstanding operations per QP.
    pub depth: u32,
    /// Path MTU.
    pub mtu: Mtu,
    /// RNG seed (workload and link).
    pub seed: u64,
    /// Link properties.
    pub link: LinkConfig,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries.
    pub rnr_retry: u8,
    /// B's RNR NAK timer code.
    pub min_rnr_timer: u8,
    /// max_rd_atomic / max_dest_rd_atomic.
    pub max_rd_atomic: u8,
    /// Which operations to draw from (empty = all).
    pub op_mix: Vec<OpKind>,
    /// Peer misbehaviour.
    pub scenario: Scenario,
    /// Give up after this much virtual time.
    pub time_limit: Duration,
}

impl Default for WorkloadConfig {
    fn default() -> WorkloadConfig {
        WorkloadConfig {
            ops: 1000,
            max_size: 4096,
            qps: 2,
            depth: 16,
            mtu: Mtu::Mtu1024,
            seed: 1,
            link: LinkConfig::default(),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            op_mix: Vec::new(),
            scenario: Scenario::default(),
            time_limit: Duration::from_secs(3600),
        }
    }
}

/// The result of a run. `xroce sim --json` prints it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    /// Seed used.
    pub seed: u64,
    /// Operations posted.
    pub ops_posted: u64,
    /// Operations completed successfully (and verified).
    pub ops_completed: u64,
    /// Operations completed with an error status.
    pub ops_failed: u64,
    /// Bytes (and atomic results, 8 each) compared with the model.
    pub bytes_verified: u64,
    /// Operations whose data or atomic result differed from the model.
    pub data_mismatches: u64,
    /// Completions out of order, duplicated or unknown.
    pub order_violations: u64,
    /// Error statuses the scenario does not explain.
    pub unexpected_statuses: u64,
    /// Request packets sent more than once (both endpoints).
    pub retransmitted_packets: u64,
    /// Virtual time the run took.
    pub virtual_time_us: u64,
    /// True if the network went idle (or hit the time limit) with operations outstanding.
    pub stalled: bool,
    /// Completion statuses at A by name.
    pub statuses: BTreeMap<String, u64>,
    /// Operations posted by kind.
    pub ops_by_kind: BTreeMap<String, u64>,
    /// The link.
    pub link: LinkStats,
    /// Counters of endpoint A (requester).
    #[serde(serialize_with = "counters_json")]
    pub counters_a: Counters,
    /// Counters of endpoint B (responder).
    #[serde(serialize_with = "counters_json")]
    pub counters_b: Counters,
    /// The first few problems, described.
    pub problems: Vec<String>,
}

/// Engine counters as JSON: `{"sent_pkts": .., .., "drops": {"bad_icrc": .., ..}}`, in the
/// counters' declaration order.
fn counters_json<S: serde::Serializer>(c: &Counters, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    struct Drops<'a>(&'a crate::engine::DropCounters);
    impl Serialize for Drops<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut map = s.serialize_map(None)?;
            for (name, value) in self.0.fields() {
                map.serialize_entry(name, &value)?;
            }
            map.end()
        }
    }
    let mut map = s.serialize_map(None)?;
    for (name, value) in c.fields() {
        map.serialize_entry(name, &value)?;
    }
    map.serialize_entry("drops", &Drops(&c.drops))?;
    map.end()
}

impl Summary {
    /// True if the run is correct: no mismatch, no order violation, no unexplained status,
    /// no stall, and (without a scenario) every operation completed.
    pub fn ok(&self, scenario_active: bool) -> bool {
        self.data_mismatches == 0
            && self.order_violations == 0
            && self.unexpected_statuses == 0
            && !self.stalled
            && (scenario_active || self.ops_completed == self.ops_posted)
    }
}

struct PendingOp {
    wr_id: u64,
    kind: OpKind,
    slot: u32,
    len: u32,
    data: Vec<u8>,
    expected_orig: u64,
    imm: u32,
    wrong_rkey: bool,
}

struct ExpectedRecv {
    wr_id: u64,
    data: Option<Vec<u8>>,
    len: u32,
    imm: Option<u32>,
}

struct QpPair {
    qpn_a: u32,
    qpn_b: u32,
    a_mr: MrInfo,
    b_mr: MrInfo,
    b_recv_mr: MrInfo,
    outstanding: VecDeque<PendingOp>,
    expected_recvs: VecDeque<ExpectedRecv>,
    counter: u64,
    dead: bool,
    recv_posted: bool,
    next_recv_slot: u32,
    /// Operations posted on this QP (its slot counter).
    posted: u64,
}

struct Sides {
    cq_a: CqId,
    cq_b_send: CqId,
    cq_b_recv: CqId,
}

const ATOMIC_OFF: u64 = 0;

/// Set up two engines, connect `qps` RC pairs and return the network and the pairs.
fn setup(cfg: &WorkloadConfig) -> Result<(Network, Vec<QpPair>, Sides), SimError> {
    let mut a = Engine::new(EngineConfig::new(MAC_A, IpAddr::V4(IP_A)));
    let mut b = Engine::new(EngineConfig::new(MAC_B, IpAddr::V4(IP_B)));
    let depth = cfg.depth.max(1);
    let slot = cfg.max_size.max(8) as usize;
    let pd_a = a.alloc_pd();
    let pd_b = b.alloc_pd();
    // Room for every completion the run can have outstanding, within the device limit.
    let cq_depth = (cfg.qps * depth * 4).clamp(64, crate::engine::limits::MAX_CQE);
    let cq_a = a.create_cq(cq_depth)?;
    let cq_b_send = b.create_cq(cq_depth)?;
    let cq_b_recv = b.create_cq(cq_depth)?;
    let caps = QpCaps {
        max_send_wr: depth,
        max_recv_wr: depth * 2,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 256,
    };
    let mut pairs = Vec::new();
    for _ in 0..cfg.qps {
        let qpn_a = a.create_qp(QpInit {
            qp_type: QpType::Rc,
            pd: pd_a,
            send_cq: cq_a,
            recv_cq: cq_a,
            caps,
            sq_sig_all: true,
            srq: None,
        })?;
        let qpn_b = b.create_qp(QpInit {
            qp_type: QpType::Rc,
            pd: pd_b,
            send_cq: cq_b_send,
            recv_cq: cq_b_recv,
            caps,
            sq_sig_all: true,
            srq: None,
        })?;
        let len = slot * depth as usize;
        let a_mr = a.reg_mr(pd_a, len, Access::LOCAL_WRITE)?;
        let b_mr = b.reg_mr(
            pd_b,
            len + 8,
            Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC,
        )?;
        let b_recv_mr = b.reg_mr(pd_b, slot * depth as usize * 2, Access::LOCAL_WRITE)?;
        pairs.push(QpPair {
            qpn_a,
            qpn_b,
            a_mr,
            b_mr,
            b_recv_mr,
            outstanding: VecDeque::new(),
            expected_recvs: VecDeque::new(),
            counter: 0,
            dead: false,
            recv_posted: false,
            next_recv_slot: 0,
            posted: 0,
        });
    }
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x005E_ED0F);
    for p in &pairs {
        let psn_a: u32 = rng.gen_range(0..1 << 24);
        let psn_b: u32 = rng.gen_range(0..1 << 24);
        connect(&mut a, p.qpn_a, p.qpn_b, MAC_B, IP_B, psn_a, psn_b, cfg)?;
        connect(&mut b, p.qpn_b, p.qpn_a, MAC_A, IP_A, psn_b, psn_a, cfg)?;
    }
    let net = Network::new(a, b, cfg.link.clone(), cfg.seed);
    Ok((
        net,
        pairs,
        Sides {
            cq_a,
            cq_b_send,
            cq_b_recv,
        },
    ))
}

/// Move a local RC or UC QP through INIT, RTR, RTS towards `remote_qpn` (UC with the
/// connection attributes only).
#[allow(clippy::too_many_arguments)]
pub fn connect(
    e: &mut Engine,
    qpn: u32,
    remote_qpn: u32,
    remote_mac: [u8; 6],
    remote_ip: Ipv4Addr,
    sq_psn: u32,
    rq_psn: u32,
    cfg: &WorkloadConfig,
) -> Result<(), SimError> {
    let mut attr = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        ..QpAttr::default()
    };
    e.modify_qp(
        qpn,
        &attr,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )?;
    attr.qp_state = QpState::Rtr;
    attr.path_mtu = cfg.mtu;
    attr.dest_qp_num = remote_qpn;
    attr.rq_psn = rq_psn;
    attr.max_dest_rd_atomic = cfg.max_rd_atomic;
    attr.min_rnr_timer = cfg.min_rnr_timer;
    attr.ah_attr = Some(AddressVector::new(remote_mac, IpAddr::V4(remote_ip)));
    // UC takes the connection attributes only: no READ/ATOMIC depths, timers or retries.
    let rc = e.qp_type(qpn)? == QpType::Rc;
    let connection = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    let rtr = if rc {
        connection | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER
    } else {
        connection
    };
    e.modify_qp(qpn, &attr, rtr)?;
    attr.qp_state = QpState::Rts;
    attr.sq_psn = sq_psn;
    attr.timeout = cfg.timeout;
    attr.retry_cnt = cfg.retry_cnt;
    attr.rnr_retry = cfg.rnr_retry;
    attr.max_rd_atomic = cfg.max_rd_atomic;
    let rts = if rc {
        M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC
    } else {
        M::STATE | M::SQ_PSN
    };
    e.modify_qp(qpn, &attr, rts)?;
    Ok(())
}

/// Run the workload. `prepare` may set a pcap file or a trace on the network first.
pub fn run(
    cfg: &WorkloadConfig,
    prepare: impl FnOnce(&mut Network) -> Result<(), SimError>,
) -> Result<Summary, SimError> {
    let (mut net, mut pairs, sides) = setup(cfg)?;
    prepare(&mut net)?;
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 1);
    let mut sum = Summary {
        seed: cfg.seed,
        ..Summary::default()
    };
    let mix: Vec<OpKind> = if cfg.op_mix.is_empty() {
        ALL_OPS.to_vec()
    } else {
        cfg.op_mix.clone()
    };
    let slot_size = cfg.max_size.max(8) as u64;
    let depth = cfg.depth.max(1);
    let mut next_wr_id = 1u64;
    let mut wrong_rkey_pending = cfg.scenario.wrong_rkey_at;
    let mut wcs = vec![Wc::EMPTY; 64];
    loop {
        // B posts its receive WQEs (now, later, or never).
        let recv_ok = !cfg.scenario.no_recv
            && cfg
                .scenario
                .recv_delay
                .is_none_or(|d| net.now() >= Instant::ZERO + d);
        if recv_ok {
            for p in pairs.iter_mut().filter(|p| !p.recv_posted && !p.dead) {
                for _ in 0..depth * 2 {
                    post_recv_slot(&mut net.engines[1], p, slot_size, depth)?;
                }
                p.recv_posted = true;
            }
        }
        // A posts operations while there is room.
        let mut posted_any = false;
        for pair in pairs.iter_mut() {
            while sum.ops_posted < cfg.ops && !pair.dead && pair.outstanding.len() < depth as usize
            {
                let kind = mix[rng.gen_range(0..mix.len())];
                let wrong = match wrong_rkey_pending {
                    Some(n)
                        if sum.ops_posted >= n
                            && !matches!(kind, OpKind::Send | OpKind::SendImm) =>
                    {
                        wrong_rkey_pending = None;
                        true
                    }
                    _ => false,
                };
                post_op(
                    &mut net, pair, kind, wrong, &mut rng, cfg, next_wr_id, &mut sum,
                )?;
                next_wr_id += 1;
                posted_any = true;
                // Spread posts over QPs.
                if rng.gen_bool(0.5) {
                    break;
                }
            }
        }
        let outstanding: usize = pairs.iter().map(|p| p.outstanding.len()).sum();
        if outstanding == 0 && (sum.ops_posted >= cfg.ops || pairs.iter().all(|p| p.dead)) {
            break;
        }
        if !posted_any || outstanding > 0 {
            let stepped = net.step();
            drain_completions(
                &mut net, &mut pairs, &sides, &mut wcs, &mut sum, cfg, slot_size, depth,
            )?;
            if !stepped && !recv_pending(cfg, &net) {
                sum.stalled = true;
                problem(
                    &mut sum,
                    format!("network idle with {outstanding} operations outstanding"),
                );
                break;
            }
            if net.now() > Instant::ZERO + cfg.time_limit {
                sum.stalled = true;
                problem(&mut sum, "virtual time limit reached".into());
                break;
            }
        }
    }
    // Let the last ACKs and B's completions settle.
    let settle = net.now() + Duration::from_millis(1);
    while net.now() < settle && net.step() {
        drain_completions(
            &mut net, &mut pairs, &sides, &mut wcs, &mut sum, cfg, slot_size, depth,
        )?;
    }
    drain_completions(
        &mut net, &mut pairs, &sides, &mut wcs, &mut sum, cfg, slot_size, depth,
    )?;
    // Final atomic counters.
    for p in &pairs {
        if p.dead {
            continue;
        }
        let mut word = [0u8; 8];
        net.engines[1].mr_read(p.b_mr.lkey, p.b_mr.addr + ATOMIC_OFF, &mut word)?;
        sum.bytes_verified += 8;
        if u64::from_ne_bytes(word) != p.counter {
            sum.data_mismatches += 1;
            problem(
                &mut sum,
                format!("final atomic counter of QP {:#x} differs", p.qpn_b),
            );
        }
        if !p.expected_recvs.is_empty() && !cfg.scenario.no_recv {
            sum.order_violations += 1;
            problem(
                &mut sum,
                format!("{} receives never completed at B", p.expected_recvs.len()),
            );
        }
    }
    net.finish();
    sum.virtual_time_us = net.now().since_epoch().as_micros() as u64;
    sum.link = net.stats().clone();
    sum.counters_a = net.engines[0].counters().clone();
    sum.counters_b = net.engines[1].counters().clone();
    sum.retransmitted_packets =
        sum.counters_a.retransmitted_packets + sum.counters_b.retransmitted_packets;
    Ok(sum)
}

fn recv_pending(cfg: &WorkloadConfig, net: &Network) -> bool {
    cfg.scenario
        .recv_delay
        .is_some_and(|d| net.now() < Instant::ZERO + d)
}

fn problem(sum: &mut Summary, text: String) {
    if sum.problems.len() < 20 {
        sum.problems.push(text);
    }
}

fn post_recv_slot(
    b: &mut Engine,
    p: &mut QpPair,
    slot_size: u64,
    depth: u32,
) -> Result<(), SimError> {
    let slot = p.next_recv_slot % (depth * 2);
    p.next_recv_slot = p.next_recv_slot.wrapping_add(1);
    b.post_recv(
        p.qpn_b,
        &RecvWr {
            wr_id: slot as u64,
            sg_list: vec![Sge {
                addr: p.b_recv_mr.addr + slot as u64 * slot_size,
                length: slot_size as u32,
                lkey: p.b_recv_mr.lkey,
            }],
        },
    )?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn post_op(
    net: &mut Network,
    p: &mut QpPair,
    kind: OpKind,
    wrong_rkey: bool,
    rng: &mut ChaCha8Rng,
    cfg: &WorkloadConfig,
    wr_id: u64,
    sum: &mut Summary,
) -> Result<(), SimError> {
    let slot_size = cfg.max_size.max(8) as u64;
    // At most `depth` ops are outstanding per QP and they complete in order, so the slot of
    // the op posted `depth` posts ago on this QP is free again.
    let slot = (p.posted % cfg.depth.max(1) as u64) as u32;
    p.posted += 1;
    let a_addr = p.a_mr.addr + slot as u64 * slot_size;
    let b_addr = p.b_mr.addr + 8 + slot as u64 * slot_size;
    let rkey = if wrong_rkey {
        p.b_mr.rkey ^ 0x00FF_0000
    } else {
        p.b_mr.rkey
    };
    let len = match kind {
        OpKind::Cas | OpKind::Fadd => 8,
        // Mostly small, sometimes large, sometimes zero.
        _ => match rng.gen_range(0..10) {
            0 => 0,
            1..=5 => rng.gen_range(1..=cfg.max_size.clamp(1, 256)),
            _ => rng.gen_range(1..=cfg.max_size.max(1)),
        },
    };
    let mut data = vec![0u8; len as usize];
    rng.fill(&mut data[..]);
    let imm: u32 = rng.gen();
    let sge = Sge {
        addr: a_addr,
        length: len,
        lkey: p.a_mr.lkey,
    };
    let mut expected_orig = 0;
    let op = match kind {
        OpKind::Send | OpKind::SendImm | OpKind::Write | OpKind::WriteImm => {
            net.engines[0].mr_write(p.a_mr.lkey, a_addr, &data)?;
            match kind {
                OpKind::Send => WrOp::Send,
                OpKind::SendImm => WrOp::SendWithImm { imm },
                OpKind::Write => WrOp::Write {
                    remote_addr: b_addr,
                    rkey,
                },
                _ => WrOp::WriteWithImm {
                    remote_addr: b_addr,
                    rkey,
                    imm,
                },
            }
        }
        OpKind::Read => {
            // The "application" at B puts the data there before A reads it.
            net.engines[1].mr_write(p.b_mr.lkey, b_addr, &data)?;
            net.engines[0].mr_write(p.a_mr.lkey, a_addr, &vec![0xEE; len as usize])?;
            WrOp::Read {
                remote_addr: b_addr,
                rkey,
            }
        }
        OpKind::Cas => {
            let compare = if rng.gen_bool(0.5) {
                p.counter
            } else {
                rng.gen()
            };
            let swap: u64 = rng.gen();
            if !wrong_rkey {
                expected_orig = p.counter;
                if p.counter == compare {
                    p.counter = swap;
                }
            }
            WrOp::CompareSwap {
                remote_addr: p.b_mr.addr + ATOMIC_OFF,
                rkey,
                compare,
                swap,
            }
        }
        OpKind::Fadd => {
            let add: u64 = rng.gen_range(0..1 << 40);
            if !wrong_rkey {
                expected_orig = p.counter;
                p.counter = p.counter.wrapping_add(add);
            }
            WrOp::FetchAdd {
                remote_addr: p.b_mr.addr + ATOMIC_OFF,
                rkey,
                add,
            }
        }
    };
    let sg_list = if len == 0 { Vec::new() } else { vec![sge] };
    let flags = if len > 0
        && len <= 64
        && matches!(kind, OpKind::Send | OpKind::Write)
        && rng.gen_bool(0.3)
    {
        SendFlags::SIGNALED | SendFlags::INLINE
    } else {
        SendFlags::SIGNALED
    };
    net.engines[0].post_send(
        p.qpn_a,
        &SendWr {
            wr_id,
            op,
            sg_list,
            flags,
            ud: None,
        },
    )?;
    match kind {
        OpKind::Send | OpKind::SendImm => p.expected_recvs.push_back(ExpectedRecv {
            wr_id,
            data: Some(data.clone()),
            len,
            imm: (kind == OpKind::SendImm).then_some(imm),
        }),
        OpKind::WriteImm if !wrong_rkey => p.expected_recvs.push_back(ExpectedRecv {
            wr_id,
            data: None,
            len,
            imm: Some(imm),
        }),
        _ => {}
    }
    *sum.ops_by_kind.entry(format!("{kind:?}")).or_default() += 1;
    sum.ops_posted += 1;
    p.outstanding.push_back(PendingOp {
        wr_id,
        kind,
        slot,
        len,
        data,
        expected_orig,
        imm,
        wrong_rkey,
    });
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn drain_completions(
    net: &mut Network,
    pairs: &mut [QpPair],
    sides: &Sides,
    wcs: &mut [Wc],
    sum: &mut Summary,
    cfg: &WorkloadConfig,
    slot_size: u64,
    depth: u32,
) -> Result<(), SimError> {
    // B's receive completions: SEND data and WRITE_WITH_IMM notifications, in order.
    loop {
        let n = net.engines[1].poll_cq(sides.cq_b_recv, wcs)?;
        if n == 0 {
            break;
        }
        for wc in &wcs[..n] {
            let Some(p) = pairs.iter_mut().find(|p| p.qpn_b == wc.qp_num) else {
                continue;
            };
            if wc.status != WcStatus::Success {
                // B's QP failed (e.g. after a wrong R_Key); its flushed receives are expected.
                continue;
            }
            let Some(exp) = p.expected_recvs.pop_front() else {
                sum.order_violations += 1;
                problem(
                    sum,
                    format!("unexpected receive completion on QP {:#x}", wc.qp_num),
                );
                continue;
            };
            let mut bad = wc.imm_data != exp.imm || wc.byte_len != exp.len;
            if let Some(data) = &exp.data {
                let addr = p.b_recv_mr.addr + wc.wr_id * slot_size;
                let got = net.engines[1].mr_to_vec(p.b_recv_mr.lkey, addr, data.len())?;
                sum.bytes_verified += data.len() as u64;
                bad |= got != data[..];
            }
            if bad {
                sum.data_mismatches += 1;
                problem(
                    sum,
                    format!(
                        "receive for wr {} differs (len {} vs {}, imm {:?} vs {:?})",
                        exp.wr_id, wc.byte_len, exp.len, wc.imm_data, exp.imm
                    ),
                );
            }
            if !p.dead {
                post_recv_slot(&mut net.engines[1], p, slot_size, depth)?;
            }
        }
    }
    let _ = net.engines[1].poll_cq(sides.cq_b_send, wcs)?;
    // A's send completions, checked in posting order.
    loop {
        let n = net.engines[0].poll_cq(sides.cq_a, wcs)?;
        if n == 0 {
            break;
        }
        for wc in &wcs[..n] {
            let Some(p) = pairs.iter_mut().find(|p| p.qpn_a == wc.qp_num) else {
                sum.order_violations += 1;
                continue;
            };
            let Some(op) = p.outstanding.pop_front() else {
                sum.order_violations += 1;
                problem(
                    sum,
                    format!("completion for wr {} with nothing outstanding", wc.wr_id),
                );
                continue;
            };
            if op.wr_id != wc.wr_id {
                sum.order_violations += 1;
                problem(
                    sum,
                    format!(
                        "completion for wr {} while wr {} was the oldest",
                        wc.wr_id, op.wr_id
                    ),
                );
            }
            *sum.statuses
                .entry(wc.status.as_str().to_string())
                .or_default() += 1;
            if wc.status != WcStatus::Success {
                sum.ops_failed += 1;
                if !status_explained(cfg, &op, wc.status, p.dead) {
                    sum.unexpected_statuses += 1;
                    problem(
                        sum,
                        format!(
                            "wr {} ({:?}) completed with {:?}",
                            op.wr_id, op.kind, wc.status
                        ),
                    );
                }
                if !p.dead {
                    p.dead = true;
                    // Sends that will never arrive at B.
                    p.expected_recvs.retain(|r| r.wr_id < op.wr_id);
                }
                continue;
            }
            sum.ops_completed += 1;
            verify(net, p, &op, sum, slot_size)?;
        }
    }
    Ok(())
}

fn status_explained(cfg: &WorkloadConfig, op: &PendingOp, status: WcStatus, qp_dead: bool) -> bool {
    if qp_dead {
        return status == WcStatus::WrFlushErr;
    }
    match status {
        WcStatus::RemAccessErr => op.wrong_rkey,
        WcStatus::RnrRetryExcErr => {
            cfg.scenario.no_recv
                && matches!(op.kind, OpKind::Send | OpKind::SendImm | OpKind::WriteImm)
        }
        WcStatus::RetryExcErr => cfg.link.partition_after.is_some() || cfg.link.loss >= 0.5,
        _ => false,
    }
}

fn verify(
    net: &mut Network,
    p: &QpPair,
    op: &PendingOp,
    sum: &mut Summary,
    slot_size: u64,
) -> Result<(), SimError> {
    let a_addr = p.a_mr.addr + op.slot as u64 * slot_size;
    let b_addr = p.b_mr.addr + 8 + op.slot as u64 * slot_size;
    let n = op.len as usize;
    let ok = match op.kind {
        // SEND data is checked at B's receive completion.
        OpKind::Send | OpKind::SendImm => true,
        OpKind::Write | OpKind::WriteImm => {
            sum.bytes_verified += n as u64;
            net.engines[1].mr_to_vec(p.b_mr.lkey, b_addr, n)? == op.data[..]
        }
        OpKind::Read => {
            sum.bytes_verified += n as u64;
            net.engines[0].mr_to_vec(p.a_mr.lkey, a_addr, n)? == op.data[..]
        }
        OpKind::Cas | OpKind::Fadd => {
            let mut word = [0u8; 8];
            net.engines[0].mr_read(p.a_mr.lkey, a_addr, &mut word)?;
            sum.bytes_verified += 8;
            u64::from_ne_bytes(word) == op.expected_orig
        }
    };
    let _ = op.imm;
    if !ok {
        sum.data_mismatches += 1;
        problem(
            sum,
            format!(
                "wr {} ({:?}, {} bytes): data differs from the model",
                op.wr_id, op.kind, op.len
            ),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The summary's counters keep the JSON the engine's serde derive used to produce: names
    /// in declaration order, drops nested (the expected text was generated from the old
    /// derive's field order).
    #[test]
    fn counters_json_is_unchanged() {
        let c = Counters {
            sent_pkts: 1,
            rcvd_pkts: 2,
            read_response_faults: 15,
            drops: crate::engine::DropCounters {
                bad_icrc: 101,
                tx_buffer_too_small: 119,
                ..Default::default()
            },
            ..Counters::default()
        };
        let want = r#"{"sent_pkts":1,"rcvd_pkts":2,"duplicate_request":0,"out_of_seq_request":0,"rcvd_rnr_err":0,"send_rnr_err":0,"rcvd_seq_err":0,"retry_exceeded_err":0,"retry_rnr_exceeded_err":0,"completer_retry_err":0,"local_ack_timeout_err":0,"retransmitted_packets":0,"acks_coalesced":0,"emit_failed":0,"read_response_faults":15,"uc_messages_dropped":0,"gsi_sent":0,"gsi_rcvd":0,"drops":{"bad_icrc":101,"malformed":0,"unsupported_headers":0,"bad_dest_addr":0,"bad_source_addr":0,"unknown_qp":0,"bad_pkey":0,"bad_qkey":0,"bad_opcode":0,"bad_state":0,"out_of_seq_silent":0,"stale_duplicate":0,"bad_duplicate":0,"ghost_ack":0,"duplicate_ack":0,"unexpected_response":0,"uc_out_of_sequence":0,"ud_no_recv_wqe":0,"response_queue_full":0,"tx_buffer_too_small":119,"no_gsi":0,"gsi_bad_qkey":0}}"#;
        let mut out = Vec::new();
        counters_json(&c, &mut serde_json::Serializer::new(&mut out)).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), want);
    }
}
