//! A connected pair of engines with one RC (or UC) QP each, memory and CQs: the fixture of the
//! scenario tests, the engine benchmark, the `engine_frames` fuzz target and `hostile.rs`
//! beside it, and a compact example of the set-up calls. Test scaffolding, so not in the
//! library: include with `#[path = "common/pair.rs"] mod pair;` (from `benches/` and
//! `fuzz/`, with the path to this file).
#![allow(dead_code)]
use std::net::IpAddr;
use std::time::Duration;

use xroce::engine::{
    Access, CqId, Engine, EngineConfig, MrInfo, Mtu, QpCaps, QpInit, QpType, RecvWr, SendFlags,
    SendWr, Sge, Wc, WrOp,
};
use xroce::sim::workload::{connect, WorkloadConfig, IP_A, IP_B, MAC_A, MAC_B};
use xroce::sim::{LinkConfig, Network};

/// Options of [`Pair::new`].
#[derive(Clone, Debug)]
pub struct PairOptions {
    /// Path MTU.
    pub mtu: Mtu,
    /// A's first send PSN (B's expected PSN).
    pub psn_a: u32,
    /// B's first send PSN.
    pub psn_b: u32,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries.
    pub rnr_retry: u8,
    /// B's (and A's) RNR timer code.
    pub min_rnr_timer: u8,
    /// max_rd_atomic and max_dest_rd_atomic.
    pub max_rd_atomic: u8,
    /// Bytes of memory per side.
    pub mr_len: usize,
    /// Link (no random faults by default).
    pub link: LinkConfig,
    /// Send queue depth.
    pub depth: u32,
    /// Seed of the link's random faults.
    pub seed: u64,
    /// RC (the default) or UC.
    pub qp_type: QpType,
}

impl Default for PairOptions {
    fn default() -> PairOptions {
        PairOptions {
            mtu: Mtu::Mtu1024,
            psn_a: 100,
            psn_b: 5000,
            timeout: 10,
            retry_cnt: 6,
            rnr_retry: 6,
            min_rnr_timer: 1,
            max_rd_atomic: 4,
            mr_len: 1 << 20,
            link: LinkConfig::default(),
            depth: 256,
            seed: 1,
            qp_type: QpType::Rc,
        }
    }
}

/// Two engines over a simulated link, QP `qa` on A connected to QP `qb` on B.
pub struct Pair {
    /// The network (A = engines[0], B = engines[1]).
    pub net: Network,
    /// A's QPN.
    pub qa: u32,
    /// B's QPN.
    pub qb: u32,
    /// A's memory (LOCAL_WRITE | REMOTE_*).
    pub mr_a: MrInfo,
    /// B's memory (LOCAL_WRITE | REMOTE_*).
    pub mr_b: MrInfo,
    /// A's CQ (send and receive).
    pub cq_a: CqId,
    /// B's CQ (send and receive).
    pub cq_b: CqId,
}

impl Pair {
    /// Build and connect.
    pub fn new(o: PairOptions) -> Pair {
        let mut a = Engine::new(EngineConfig::new(MAC_A, IpAddr::V4(IP_A)));
        let mut b = Engine::new(EngineConfig::new(MAC_B, IpAddr::V4(IP_B)));
        let caps = QpCaps {
            max_send_wr: o.depth,
            max_recv_wr: o.depth,
            ..QpCaps::default()
        };
        let side = |e: &mut Engine| {
            let pd = e.alloc_pd();
            let cq = e.create_cq(4096).expect("cq");
            let qp = e
                .create_qp(QpInit {
                    qp_type: o.qp_type,
                    pd,
                    send_cq: cq,
                    recv_cq: cq,
                    caps,
                    sq_sig_all: false,
                    srq: None,
                })
                .expect("qp");
            let mr = e.reg_mr(pd, o.mr_len, Access::ALL).expect("mr");
            (cq, qp, mr)
        };
        let (cq_a, qa, mr_a) = side(&mut a);
        let (cq_b, qb, mr_b) = side(&mut b);
        let wc = WorkloadConfig {
            mtu: o.mtu,
            timeout: o.timeout,
            retry_cnt: o.retry_cnt,
            rnr_retry: o.rnr_retry,
            min_rnr_timer: o.min_rnr_timer,
            max_rd_atomic: o.max_rd_atomic,
            ..WorkloadConfig::default()
        };
        connect(&mut a, qa, qb, MAC_B, IP_B, o.psn_a, o.psn_b, &wc).expect("connect A");
        connect(&mut b, qb, qa, MAC_A, IP_A, o.psn_b, o.psn_a, &wc).expect("connect B");
        Pair {
            net: Network::new(a, b, o.link, o.seed),
            qa,
            qb,
            mr_a,
            mr_b,
            cq_a,
            cq_b,
        }
    }

    /// Engine A.
    pub fn a(&mut self) -> &mut Engine {
        &mut self.net.engines[0]
    }

    /// Engine B.
    pub fn b(&mut self) -> &mut Engine {
        &mut self.net.engines[1]
    }

    /// An SGE over A's memory.
    pub fn sge_a(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.mr_a.addr + offset,
            length: len,
            lkey: self.mr_a.lkey,
        }
    }

    /// An SGE over B's memory.
    pub fn sge_b(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.mr_b.addr + offset,
            length: len,
            lkey: self.mr_b.lkey,
        }
    }

    /// Post a signaled send WR on A.
    pub fn post_a(&mut self, wr_id: u64, op: WrOp, sges: Vec<Sge>) {
        let qa = self.qa;
        self.a()
            .post_send(
                qa,
                &SendWr {
                    wr_id,
                    op,
                    sg_list: sges,
                    flags: SendFlags::SIGNALED,
                    ud: None,
                },
            )
            .expect("post_send");
    }

    /// Post a receive WR on B over `[offset, offset+len)` of B's memory.
    pub fn post_recv_b(&mut self, wr_id: u64, offset: u64, len: u32) {
        let (qb, sge) = (self.qb, self.sge_b(offset, len));
        self.b()
            .post_recv(
                qb,
                &RecvWr {
                    wr_id,
                    sg_list: vec![sge],
                },
            )
            .expect("post_recv");
    }

    /// Run until `n` completions are in A's CQ (or `limit` of virtual time passes, or the
    /// network is idle) and return all of A's completions.
    pub fn run_for_completions(&mut self, n: usize, limit: Duration) -> Vec<Wc> {
        let cq = self.cq_a;
        let deadline = self.net.now() + limit;
        self.net
            .run_until(deadline, |net| net.engines[0].cq_len(cq).unwrap_or(0) >= n);
        drain(&mut self.net.engines[0], cq)
    }

    /// Run until the network is idle or `limit` passes.
    pub fn run_idle(&mut self, limit: Duration) {
        let deadline = self.net.now() + limit;
        self.net.run_until(deadline, |_| false);
    }
}

/// Every completion in a CQ.
pub fn drain(e: &mut Engine, cq: CqId) -> Vec<Wc> {
    let mut out = Vec::new();
    while let Ok(Some(wc)) = e.poll_cq_one(cq) {
        out.push(wc);
    }
    out
}
