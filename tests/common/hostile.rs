//! Hostile frame sequences against a connected [`Pair`]: the driver behind the
//! `engine_sequences` fuzz target and the sequence property test in `tests/engine_fuzz.rs`.
//!
//! An input is a list of 8-byte steps. Each byte picks from a table of boundary values, so
//! every draw is an edge: VAs 0, 1, `u64::MAX`, around both ends of the MR and around
//! `u64::MAX`; lengths 0, 1, around the MTU, the MR size, 2^31 and `u32::MAX`; PSNs at the
//! receiver's expected PSN, just before it (duplicates), just after it, 2^23 away and at the
//! 2^24 wrap (the pair starts a few PSNs before it); R_Keys right, stale, foreign and absent.
//! A step forges a request or response with a valid ICRC, replays a frame seen on the link
//! (a duplicate or a retry), replays one with its RETH/AtomicETH swapped for boundary values
//! (same PSN, other address or length), posts a real WR, or lets virtual time pass (timers,
//! retries).
//!
//! [`run`] checks, besides "no panic" (the engine runs with overflow checks in tests):
//! - every frame handed to an engine is accounted for (received or a counted drop);
//! - the engines' transmit counters add up to what the link carried;
//! - no WR completes twice;
//! - afterwards both engines still serve new QPs: a WRITE, READ and FETCH_ADD over fresh
//!   QPs complete with the right data.
//!
//! Test scaffolding, so not in the library: include it with [`crate::pair`] beside it,
//! `#[path = "common/pair.rs"] mod pair; #[path = "common/hostile.rs"] mod hostile;` (from
//! `fuzz/`, with the path to these files).
#![allow(dead_code)]
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use crate::pair::{drain, Pair, PairOptions};
use xroce::engine::{
    Access, Counters, Engine, Mtu, QpAttr, QpAttrMask, QpCaps, QpInit, QpState, QpType, RecvWr,
    SendFlags, SendWr, Sge, WcStatus, WrOp,
};
use xroce::sim::workload::{connect, WorkloadConfig, IP_A, IP_B, MAC_A, MAC_B};
use xroce::sim::Verdict;
use xroce::wire::{
    self, AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, EthRepr, FrameRepr, IpRepr,
    Opcode, PacketRepr, Psn, RethRepr,
};

/// Bytes per step.
pub const STEP_LEN: usize = 8;

/// Steps taken from one input at most (the rest is ignored).
pub const MAX_STEPS: usize = 64;

/// Bytes of memory per side: small, so boundary lengths cross its ends.
pub const MR_LEN: usize = 1 << 16;

/// A's first PSN: five packets before the 2^24 wrap.
pub const PSN_A: u32 = 0xFF_FFFB;

/// B's first PSN: two packets before the wrap.
pub const PSN_B: u32 = 0xFF_FFFE;

const MTU: u32 = 256;

/// Opcodes a forged frame may carry: every RC opcode, and UD ones (wrong transport).
const OPCODES: &[Opcode] = &[
    Opcode::RC_SEND_FIRST,
    Opcode::RC_SEND_MIDDLE,
    Opcode::RC_SEND_LAST,
    Opcode::RC_SEND_LAST_WITH_IMMEDIATE,
    Opcode::RC_SEND_ONLY,
    Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
    Opcode::RC_RDMA_WRITE_FIRST,
    Opcode::RC_RDMA_WRITE_MIDDLE,
    Opcode::RC_RDMA_WRITE_LAST,
    Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
    Opcode::RC_RDMA_WRITE_ONLY,
    Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
    Opcode::RC_RDMA_READ_REQUEST,
    Opcode::RC_RDMA_READ_RESPONSE_FIRST,
    Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
    Opcode::RC_RDMA_READ_RESPONSE_LAST,
    Opcode::RC_RDMA_READ_RESPONSE_ONLY,
    Opcode::RC_ACKNOWLEDGE,
    Opcode::RC_ATOMIC_ACKNOWLEDGE,
    Opcode::RC_COMPARE_SWAP,
    Opcode::RC_FETCH_ADD,
    Opcode::RC_SEND_LAST_WITH_INVALIDATE,
    Opcode::RC_SEND_ONLY_WITH_INVALIDATE,
    Opcode::UD_SEND_ONLY,
];

/// AETH syndromes: ACK, RNR NAK (timer 0 and 31), each NAK code, reserved ones.
const SYNDROMES: &[u8] = &[
    0x1F, 0x00, 0x20, 0x3F, 0x60, 0x61, 0x62, 0x63, 0x64, 0x65, 0x40, 0x80,
];

/// Payload lengths around 0, the 4-byte pad and the MTU.
const PAYLOAD_LENS: &[usize] = &[0, 1, 3, 4, 8, 255, 256, 257];

/// 64-bit atomic operands.
const OPERANDS: &[u64] = &[0, 1, u64::MAX, 1 << 63];

/// Which memory region a boundary VA or key refers to.
#[derive(Clone, Copy)]
struct Region {
    addr: u64,
    len: u64,
    key: u32,
}

fn pick<T: Copy>(table: &[T], b: u8) -> T {
    table[b as usize % table.len()]
}

/// A boundary VA for byte `b`, around the target's MR and around the ends of the u64 space.
fn va_for(r: Region, b: u8) -> u64 {
    let end = r.addr.wrapping_add(r.len);
    pick(
        &[
            0,
            1,
            u64::MAX,
            u64::MAX - 1,
            u64::MAX - 7,
            u64::MAX - MTU as u64 + 1,
            u64::MAX - 4095,
            r.addr,
            r.addr + 1,
            r.addr + 4,
            r.addr.wrapping_sub(1),
            r.addr.wrapping_sub(8),
            end,
            end - 1,
            end - 8,
            end - MTU as u64,
            end.wrapping_add(MTU as u64),
            r.addr + r.len / 2,
            1 << 63,
        ],
        b,
    )
}

/// A boundary DMA length for byte `b`.
fn len_for(r: Region, b: u8) -> u32 {
    let mr = r.len as u32;
    pick(
        &[
            0,
            0,
            1,
            7,
            8,
            MTU - 1,
            MTU,
            MTU + 1,
            4 * MTU,
            mr - 1,
            mr,
            mr + 1,
            1 << 31,
            (1 << 31) + 1,
            u32::MAX,
            u32::MAX - 1,
            u32::MAX - MTU + 1,
        ],
        b,
    )
}

/// A boundary R_Key for byte `b`: right, a stale tag, another index, the other side's, 0, max.
fn key_for(r: Region, other: u32, b: u8) -> u32 {
    pick(
        &[
            r.key,
            r.key,
            r.key ^ 0x01,
            r.key.wrapping_add(0x100),
            other,
            0,
            u32::MAX,
            r.key | 0xFF00_0000,
        ],
        b,
    )
}

/// A PSN near `base` (the receiver's live expected PSN) or at the wrap, for byte `b`.
fn psn_for(base: u32, b: u8) -> u32 {
    let p = Psn::new(base);
    let v = match b % 16 {
        0..=3 => p,
        4 => p.wrapping_add(1),
        5 => p.wrapping_add(2),
        6 => p.wrapping_sub(1),
        7 => p.wrapping_sub(2),
        8 => p.wrapping_sub(128),
        9 => p.wrapping_add(127),
        10 => p.wrapping_add(1 << 23),
        11 => Psn::new(0),
        12 => Psn::MAX,
        13 => Psn::new(Psn::MASK - 1),
        14 => Psn::new(1),
        _ => p.wrapping_add(128),
    };
    v.value()
}

/// Fields of a forged packet.
#[derive(Clone, Copy, Debug)]
pub struct Forged {
    /// To B (as if from A) or to A (as if from B).
    pub to_b: bool,
    /// BTH destination QP.
    pub dest_qp: u32,
    /// BTH opcode; the extension headers follow from it.
    pub opcode: Opcode,
    /// BTH PSN (low 24 bits).
    pub psn: u32,
    /// BTH AckReq.
    pub ack_req: bool,
    /// BTH SE.
    pub solicited: bool,
    /// RETH / AtomicETH virtual address (AtomicAckETH original data).
    pub va: u64,
    /// RETH / AtomicETH R_Key (IETH key, DETH Q_Key).
    pub rkey: u32,
    /// RETH DMA length.
    pub dma_len: u32,
    /// AETH syndrome byte.
    pub syndrome: u8,
    /// AETH MSN.
    pub msn: u32,
    /// AtomicETH swap/add and compare.
    pub operands: (u64, u64),
    /// Payload bytes (pattern 0x5A).
    pub payload_len: usize,
}

impl Forged {
    /// A packet to `dest_qp` with no extension values set.
    pub fn new(to_b: bool, dest_qp: u32, opcode: Opcode, psn: u32) -> Forged {
        Forged {
            to_b,
            dest_qp,
            opcode,
            psn,
            ack_req: true,
            solicited: false,
            va: 0,
            rkey: 0,
            dma_len: 0,
            syndrome: 0x1F,
            msn: 0,
            operands: (0, 0),
            payload_len: 0,
        }
    }

    /// The Ethernet frame, addressed as the pair's peer would send it, with a valid ICRC.
    /// `None` if the opcode is unknown.
    pub fn frame(&self) -> Option<Vec<u8>> {
        let payload = vec![0x5Au8; self.payload_len];
        let info = self.opcode.info()?;
        let roce = PacketRepr {
            bth: BthRepr {
                opcode: self.opcode,
                solicited: self.solicited,
                migreq: false,
                pad_count: ((4 - self.payload_len % 4) % 4) as u8,
                tver: 0,
                pkey: 0xFFFF,
                fecn: false,
                becn: false,
                dest_qp: self.dest_qp,
                ack_req: self.ack_req,
                psn: Psn::new(self.psn),
            },
            reth: info.has_reth.then_some(RethRepr {
                va: self.va,
                rkey: self.rkey,
                dma_len: self.dma_len,
            }),
            aeth: info.has_aeth.then_some(AethRepr {
                syndrome: wire::Syndrome::from_byte(self.syndrome),
                msn: self.msn & Psn::MASK,
            }),
            atomic_eth: info.has_atomic_eth.then_some(AtomicEthRepr {
                va: self.va,
                rkey: self.rkey,
                swap_add: self.operands.0,
                compare: self.operands.1,
            }),
            atomic_ack_eth: info
                .has_atomic_ack_eth
                .then_some(AtomicAckEthRepr { orig_data: self.va }),
            immdt: info.has_immdt.then_some(0x1234_5678),
            ieth: info.has_ieth.then_some(self.rkey),
            deth: info.has_deth.then_some(DethRepr {
                qkey: self.rkey,
                src_qp: 3,
            }),
            payload: if info.has_payload { &payload } else { &[] },
        };
        emit(self.to_b, roce)
    }
}

fn emit(to_b: bool, roce: PacketRepr<'_>) -> Option<Vec<u8>> {
    let frame = FrameRepr {
        eth: EthRepr {
            dst: if to_b { MAC_B } else { MAC_A },
            src: if to_b { MAC_A } else { MAC_B },
            vlan: None,
        },
        ip: IpRepr::V4 {
            src: if to_b { IP_A } else { IP_B },
            dst: if to_b { IP_B } else { IP_A },
            tos: 0,
            ttl: 64,
            ident: 0,
            dont_fragment: true,
        },
        udp_src_port: 0xC000,
        roce,
    };
    let mut buf = vec![0; frame.buffer_len()];
    let n = frame.emit(&mut buf).ok()?;
    buf.truncate(n);
    Some(buf)
}

/// Every counter that records a received frame: each frame handed to an engine adds at least
/// one (it is received, or dropped for a named reason).
pub fn receive_trace(c: &Counters) -> u64 {
    c.rcvd_pkts
        + c.drops
            .fields()
            .filter(|&(name, _)| name != "tx_buffer_too_small")
            .map(|(_, v)| v)
            .sum::<u64>()
}

/// What a run did (for the fuzz target's statistics and the property test's messages).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Steps executed.
    pub steps: usize,
    /// Frames forged or replayed into an engine.
    pub frames_fed: u64,
    /// WRs posted on A.
    pub wrs_posted: u64,
    /// Completions polled from A's CQ.
    pub completions: u64,
    /// Times both QPs were reset and connected again after one entered ERR.
    pub revivals: u64,
}

/// Frames seen on the link or fed to an engine: (0 = towards B, 1 = towards A; the bytes).
type FrameLog = Rc<RefCell<Vec<(usize, Vec<u8>)>>>;

struct Run {
    p: Pair,
    seen: FrameLog,
    out: Outcome,
    next_wr_id: u64,
    completed: Vec<u64>,
}

impl Run {
    fn region(&self, b_side: bool) -> Region {
        let mr = if b_side { self.p.mr_b } else { self.p.mr_a };
        Region {
            addr: mr.addr,
            len: mr.length as u64,
            key: mr.rkey,
        }
    }

    fn engine(&mut self, b_side: bool) -> &mut Engine {
        if b_side {
            self.p.b()
        } else {
            self.p.a()
        }
    }

    /// Hand one frame to an engine and let the network carry what it answers.
    fn feed(&mut self, to_b: bool, frame: &[u8]) -> Result<(), String> {
        let now = self.p.net.now();
        let before = receive_trace(self.engine(to_b).counters());
        self.engine(to_b).handle_frame(now, frame);
        {
            let mut seen = self.seen.borrow_mut();
            if seen.len() < 256 {
                seen.push((if to_b { 0 } else { 1 }, frame.to_vec()));
            }
        }
        let after = receive_trace(self.engine(to_b).counters());
        self.out.frames_fed += 1;
        if after <= before {
            return Err(format!(
                "a frame to {} left no trace in the counters: {}",
                if to_b { "B" } else { "A" },
                xroce::sim::describe_frame(frame)
            ));
        }
        self.pump(Duration::from_micros(20));
        Ok(())
    }

    /// Let the network run for `d` of virtual time.
    fn pump(&mut self, d: Duration) {
        let limit = self.p.net.now() + d;
        self.p.net.run_until(limit, |_| false);
        let cq = self.p.cq_a;
        for wc in drain(self.p.a(), cq) {
            self.completed.push(wc.wr_id);
            self.out.completions += 1;
        }
    }

    fn step(&mut self, s: &[u8; STEP_LEN]) -> Result<(), String> {
        self.out.steps += 1;
        match s[0] % 8 {
            // A request to B at its expected PSN, then a duplicate of it with another DMA
            // length (a retry that asks for more, or for anything, of what was accepted).
            2 | 3 => {
                let target = self.region(true);
                let other = self.region(false).key;
                let qb = self.p.qb;
                let (attr, _) = self.p.b().query_qp(qb).map_err(|e| e.to_string())?;
                let opcode = pick(
                    &[
                        Opcode::RC_RDMA_READ_REQUEST,
                        Opcode::RC_RDMA_READ_REQUEST,
                        Opcode::RC_FETCH_ADD,
                        Opcode::RC_COMPARE_SWAP,
                        Opcode::RC_RDMA_WRITE_ONLY,
                        Opcode::RC_SEND_ONLY,
                        Opcode::RC_RDMA_WRITE_FIRST,
                    ],
                    s[1],
                );
                let mut f = Forged::new(true, qb, opcode, attr.rq_psn);
                f.va = va_for(target, s[3]);
                f.dma_len = len_for(target, s[4]);
                f.rkey = key_for(target, other, s[5]);
                f.payload_len = pick(PAYLOAD_LENS, s[6]);
                if let Some(frame) = f.frame() {
                    self.feed(true, &frame)?;
                }
                f.dma_len = len_for(target, s[7]);
                if let Some(frame) = f.frame() {
                    self.feed(true, &frame)?;
                }
            }
            // Forge a packet to B (mostly requests) or to A (mostly responses).
            0 | 1 => {
                let to_b = s[0] & 0x80 == 0;
                let target = self.region(to_b);
                let other = self.region(!to_b).key;
                let (qpn, base) = if to_b {
                    let qb = self.p.qb;
                    let (attr, _) = self.p.b().query_qp(qb).map_err(|e| e.to_string())?;
                    (qb, attr.rq_psn)
                } else {
                    let qa = self.p.qa;
                    let (attr, _) = self.p.a().query_qp(qa).map_err(|e| e.to_string())?;
                    // Responses are for PSNs A has sent: at and before its next PSN.
                    (qa, Psn::new(attr.sq_psn).wrapping_sub(1).value())
                };
                let mut f = Forged::new(to_b, qpn, pick(OPCODES, s[1]), psn_for(base, s[2]));
                f.va = va_for(target, s[3]);
                f.dma_len = len_for(target, s[4]);
                f.rkey = key_for(target, other, s[5]);
                f.payload_len = pick(PAYLOAD_LENS, s[6]);
                f.ack_req = s[7] & 1 != 0;
                f.solicited = s[7] & 2 != 0;
                f.syndrome = pick(SYNDROMES, s[7] >> 2);
                f.msn = base;
                f.operands = (pick(OPERANDS, s[6] >> 3), pick(OPERANDS, s[7] >> 5));
                if let Some(frame) = f.frame() {
                    self.feed(to_b, &frame)?;
                }
            }
            // Replay a frame seen on the link (duplicate, late retry), possibly with its
            // RETH / AtomicETH replaced by boundary values (same PSN, other range).
            4 | 5 => {
                let seen = self.seen.borrow().clone();
                if seen.is_empty() {
                    return Ok(());
                }
                // Mostly one of the last few frames (the duplicate a retry would send).
                let pos = if s[1] & 0x80 == 0 {
                    (s[1] & 3) as usize
                } else {
                    u16::from_le_bytes([s[1], s[2]]) as usize
                };
                let (from, frame) = &seen[seen.len() - 1 - pos % seen.len()];
                let to_b = *from == 0;
                if s[0] % 8 == 4 {
                    self.feed(to_b, frame)?;
                    return Ok(());
                }
                let Ok(parsed) = wire::parse_frame(frame) else {
                    return Ok(());
                };
                let mut roce = parsed.repr.roce;
                let target = self.region(to_b);
                let other = self.region(!to_b).key;
                // Bits of s[5] choose which fields change: VA, length, key.
                if let Some(reth) = roce.reth.as_mut() {
                    if s[5] & 1 != 0 {
                        reth.va = va_for(target, s[3]);
                    }
                    if s[5] & 2 != 0 {
                        reth.dma_len = len_for(target, s[4]);
                    }
                    if s[5] & 4 != 0 {
                        reth.rkey = key_for(target, other, s[5] >> 3);
                    }
                }
                if let Some(a) = roce.atomic_eth.as_mut() {
                    if s[5] & 1 != 0 {
                        a.va = va_for(target, s[3]);
                    }
                    if s[5] & 4 != 0 {
                        a.rkey = key_for(target, other, s[5] >> 3);
                    }
                }
                if let Some(frame) = emit(to_b, roce) {
                    self.feed(to_b, &frame)?;
                }
            }
            // Post a real WR on A: boundary sizes that are valid locally.
            6 => {
                let len = pick(&[0u32, 1, 8, MTU - 1, MTU, MTU + 1, 4 * MTU + 3], s[2]);
                let off = pick(&[0u64, 8, MR_LEN as u64 / 2], s[3]);
                let remote = self.region(true);
                let remote_off = pick(&[0u64, 8, MR_LEN as u64 - 8 * MTU as u64], s[4]);
                let remote_addr = remote.addr + remote_off;
                let rkey = if s[5] % 8 == 0 {
                    remote.key ^ 1
                } else {
                    remote.key
                };
                let (op, len) = match s[1] % 6 {
                    0 => (WrOp::Send, len),
                    1 => (WrOp::Write { remote_addr, rkey }, len),
                    2 => (WrOp::Read { remote_addr, rkey }, len),
                    3 => (
                        WrOp::FetchAdd {
                            remote_addr,
                            rkey,
                            add: pick(OPERANDS, s[6]),
                        },
                        8,
                    ),
                    4 => (
                        WrOp::CompareSwap {
                            remote_addr,
                            rkey,
                            compare: pick(OPERANDS, s[6]),
                            swap: pick(OPERANDS, s[7]),
                        },
                        8,
                    ),
                    _ => (WrOp::SendWithImm { imm: 7 }, len),
                };
                if matches!(op, WrOp::Send | WrOp::SendWithImm { .. }) {
                    let (qb, sge) = (self.p.qb, self.p.sge_b(0, 4096));
                    let _ = self.p.b().post_recv(
                        qb,
                        &RecvWr {
                            wr_id: 0,
                            sg_list: vec![sge],
                        },
                    );
                }
                let wr_id = self.next_wr_id;
                self.next_wr_id += 1;
                let (qa, sge) = (self.p.qa, self.p.sge_a(off, len));
                let posted = self.p.a().post_send(
                    qa,
                    &SendWr {
                        wr_id,
                        op,
                        sg_list: vec![sge],
                        flags: SendFlags::SIGNALED,
                        ud: None,
                    },
                );
                if posted.is_ok() {
                    self.out.wrs_posted += 1;
                }
                self.pump(Duration::from_micros(50));
            }
            // Let time pass: ACK timers fire, RNR waits end, retries go out.
            _ => {
                let d = pick(
                    &[
                        Duration::from_micros(10),
                        Duration::from_millis(1),
                        Duration::from_millis(5),
                        Duration::from_millis(50),
                    ],
                    s[1],
                );
                self.pump(d);
            }
        }
        Ok(())
    }

    /// If garbage moved either QP to ERR, reset both and connect them again (fresh PSNs at
    /// the wrap, receives posted), so the next steps meet live QPs again.
    fn revive(&mut self) -> Result<(), String> {
        let (qa, qb) = (self.p.qa, self.p.qb);
        let dead = |e: &Engine, q: u32| {
            e.query_qp(q)
                .map(|(a, _)| a.qp_state == QpState::Err)
                .unwrap_or(true)
        };
        if !dead(&self.p.net.engines[0], qa) && !dead(&self.p.net.engines[1], qb) {
            return Ok(());
        }
        self.out.revivals += 1;
        let wc = WorkloadConfig {
            mtu: Mtu::Mtu256,
            timeout: 8,
            retry_cnt: 3,
            rnr_retry: 2,
            max_rd_atomic: 4,
            ..WorkloadConfig::default()
        };
        let reset = QpAttr {
            qp_state: QpState::Reset,
            ..QpAttr::default()
        };
        let err = |e: xroce::engine::EngineError| e.to_string();
        self.p
            .a()
            .modify_qp(qa, &reset, QpAttrMask::STATE)
            .map_err(err)?;
        self.p
            .b()
            .modify_qp(qb, &reset, QpAttrMask::STATE)
            .map_err(err)?;
        connect(self.p.a(), qa, qb, MAC_B, IP_B, PSN_A, PSN_B, &wc).map_err(|e| e.to_string())?;
        connect(self.p.b(), qb, qa, MAC_A, IP_A, PSN_B, PSN_A, &wc).map_err(|e| e.to_string())?;
        for i in 0..4 {
            self.p.post_recv_b(i, 4096 * i, 4096);
        }
        let cq = self.p.cq_a;
        for wc in drain(self.p.a(), cq) {
            self.completed.push(wc.wr_id);
            self.out.completions += 1;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<Outcome, String> {
        self.pump(Duration::from_secs(2));
        let mut ids = self.completed.clone();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("WR {} completed twice", w[0]));
        }
        if self.out.completions > self.out.wrs_posted {
            return Err(format!(
                "{} completions for {} posted WRs",
                self.out.completions, self.out.wrs_posted
            ));
        }
        let sent = self.p.a().counters().sent_pkts + self.p.b().counters().sent_pkts;
        if sent != self.p.net.stats().frames_sent {
            return Err(format!(
                "the engines counted {sent} frames sent, the link carried {}",
                self.p.net.stats().frames_sent
            ));
        }
        let fed = self.out.frames_fed + self.p.net.stats().frames_delivered;
        let traced = receive_trace(self.p.a().counters()) + receive_trace(self.p.b().counters());
        if traced < fed {
            return Err(format!(
                "{fed} frames reached the engines, the counters account for {traced}"
            ));
        }
        still_serves(&mut self.p)?;
        Ok(self.out)
    }
}

/// Fresh QPs, CQs and MRs on both engines of `p` must work after whatever happened before:
/// a WRITE, a READ back and a FETCH_ADD, each checked.
pub fn still_serves(p: &mut Pair) -> Result<(), String> {
    let err = |e: xroce::engine::EngineError| e.to_string();
    let side = |e: &mut Engine| -> Result<_, String> {
        let pd = e.alloc_pd();
        let cq = e.create_cq(64).map_err(err)?;
        let qp = e
            .create_qp(QpInit {
                qp_type: QpType::Rc,
                pd,
                send_cq: cq,
                recv_cq: cq,
                caps: QpCaps::default(),
                sq_sig_all: false,
                srq: None,
            })
            .map_err(err)?;
        let mr = e.reg_mr(pd, 4096, Access::ALL).map_err(err)?;
        Ok((cq, qp, mr))
    };
    let (cq_a, qa, mr_a) = side(p.a())?;
    let (_, qb, mr_b) = side(p.b())?;
    let wc = WorkloadConfig {
        mtu: Mtu::Mtu256,
        ..WorkloadConfig::default()
    };
    connect(p.a(), qa, qb, MAC_B, IP_B, PSN_A, PSN_B, &wc).map_err(|e| e.to_string())?;
    connect(p.b(), qb, qa, MAC_A, IP_A, PSN_B, PSN_A, &wc).map_err(|e| e.to_string())?;
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
    p.a().mr_write(mr_a.lkey, mr_a.addr, &data).map_err(err)?;
    p.b()
        .mr_write(mr_b.lkey, mr_b.addr + 2048, &5u64.to_ne_bytes())
        .map_err(err)?;
    let sge = |addr: u64, length: u32| Sge {
        addr,
        length,
        lkey: mr_a.lkey,
    };
    let wrs = [
        (
            WrOp::Write {
                remote_addr: mr_b.addr,
                rkey: mr_b.rkey,
            },
            sge(mr_a.addr, 1000),
        ),
        (
            WrOp::Read {
                remote_addr: mr_b.addr,
                rkey: mr_b.rkey,
            },
            sge(mr_a.addr + 1024, 1000),
        ),
        (
            WrOp::FetchAdd {
                remote_addr: mr_b.addr + 2048,
                rkey: mr_b.rkey,
                add: 3,
            },
            sge(mr_a.addr + 3072, 8),
        ),
    ];
    for (i, (op, s)) in wrs.into_iter().enumerate() {
        let wr = SendWr {
            wr_id: 1000 + i as u64,
            op,
            sg_list: vec![s],
            flags: SendFlags::SIGNALED,
            ud: None,
        };
        p.a().post_send(qa, &wr).map_err(err)?;
    }
    let limit = p.net.now() + Duration::from_secs(1);
    p.net
        .run_until(limit, |net| net.engines[0].cq_len(cq_a).unwrap_or(0) >= 3);
    let wcs = drain(p.a(), cq_a);
    let got: Vec<(u64, WcStatus)> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    let want = vec![
        (1000, WcStatus::Success),
        (1001, WcStatus::Success),
        (1002, WcStatus::Success),
    ];
    if got != want {
        return Err(format!(
            "fresh QPs after the sequence: {got:?}, expected {want:?}"
        ));
    }
    let mut back = vec![0; 1000];
    p.a()
        .mr_read(mr_a.lkey, mr_a.addr + 1024, &mut back)
        .map_err(err)?;
    let mut orig = [0; 8];
    p.a()
        .mr_read(mr_a.lkey, mr_a.addr + 3072, &mut orig)
        .map_err(err)?;
    let mut now = [0; 8];
    p.b()
        .mr_read(mr_b.lkey, mr_b.addr + 2048, &mut now)
        .map_err(err)?;
    if back != data || u64::from_ne_bytes(orig) != 5 || u64::from_ne_bytes(now) != 8 {
        return Err("fresh QPs after the sequence moved the wrong bytes".into());
    }
    Ok(())
}

/// Run one input: a pair at the PSN wrap with receives posted, then one step per
/// [`STEP_LEN`] bytes (at most [`MAX_STEPS`]), then the checks of the module docs.
pub fn run(input: &[u8]) -> Result<Outcome, String> {
    let mut p = Pair::new(PairOptions {
        mtu: Mtu::Mtu256,
        psn_a: PSN_A,
        psn_b: PSN_B,
        mr_len: MR_LEN,
        timeout: 8,
        retry_cnt: 3,
        rnr_retry: 2,
        max_rd_atomic: 4,
        depth: 64,
        ..PairOptions::default()
    });
    for i in 0..4 {
        p.post_recv_b(i, 4096 * i, 4096);
    }
    let seen: FrameLog = Rc::new(RefCell::new(Vec::new()));
    let log = seen.clone();
    p.net.set_filter(move |f| {
        let mut log = log.borrow_mut();
        if log.len() < 256 {
            log.push((f.from, f.bytes.to_vec()));
        }
        Verdict::Pass
    });
    let mut run = Run {
        p,
        seen,
        out: Outcome::default(),
        next_wr_id: 1,
        completed: Vec::new(),
    };
    for chunk in input.chunks_exact(STEP_LEN).take(MAX_STEPS) {
        let mut s = [0u8; STEP_LEN];
        s.copy_from_slice(chunk);
        run.step(&s)?;
        run.revive()?;
    }
    run.finish()
}
