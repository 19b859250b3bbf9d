//! `xroce mw-check`: memory windows (IBTA 10.6.7) checked byte for byte against a peer. It
//! speaks the exchange of the lab's `lab-mw.py` (pyverbs), so either side can be xroce or
//! rxe. The server owns an MR of four quarters q0..q3 (random content, MW_BIND access), a
//! type 1 window W1 over q1 (bound by the bind verb) and a type 2 window W2 over q2 (bound by
//! a BIND_MW WR on QP 0), both REMOTE_READ|REMOTE_WRITE; four RC QPs a side, since every
//! refused access ends its QP (class C, IBTA 9.9.3.1.3).
//!
//! ```text
//! client                                           server
//!   | --- {qpns, psns, gid} ---------------------->  |  connect, bind W1 and W2
//!   | <-- {qpns, psns, gid, addr, len, quarters,     |
//!   |      w1 {rkey, addr, len}, w2 {...}} --------  |
//!   | QP0: READ W1 (digest of q1), WRITE W2 -------> |  {"op":"digests"} after each step:
//!   | QP0: SEND_WITH_INV(W2) --------------------->  |  {"op":"received"}: R_Key reported
//!   | QP0: WRITE W2: REM_ACCESS_ERR, nothing moves   |
//!   | {"op":"bind2"} ----------------------------->  |  W2 bound again on QP1
//!   | QP1: WRITE W2 ok; {"op":"local_inv"} ------->  |  LOCAL_INV
//!   | QP1: WRITE W2: REM_ACCESS_ERR, nothing moves   |
//!   | {"op":"bind1"} ----------------------------->  |  W1 rebound over q0, read only
//!   | QP2: READ W1 ok; WRITE old W1 R_Key: refused   |
//!   | QP3: WRITE read-only W1: refused               |
//!   | {"op":"done"} ------------------------------>  |
//! ```
//!
//! After every step the client asks for the digest of each quarter as the server's CPU
//! reads it and compares with what it expects: a refused access must leave all four as
//! they were.
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::json_line::{gid_from_hex, gid_hex, hex, recv_json, send_json};
use xroce::verbs::{
    inc_rkey, Access, Cq, Device, Gid, Mr, Mtu, Mw, MwBindInfo, MwType, Pd, Qp, QpCaps, QpInitAttr,
    RcOptions, RcPeer, RecvWr, SendFlags, SendWr, Wc, WcStatus, WrOp,
};

/// QPs per side.
const QPS: usize = 4;

/// The check's parameters (both sides).
#[derive(Debug, Clone)]
pub struct MwCheckOptions {
    /// Bytes of the server's MR (four quarters).
    pub size: usize,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// Give up when a completion does not come for this long.
    pub timeout: Duration,
}

impl Default for MwCheckOptions {
    fn default() -> Self {
        MwCheckOptions {
            size: 64 << 10,
            mtu: 1024,
            timeout: Duration::from_secs(30),
        }
    }
}

impl MwCheckOptions {
    /// Rejects values that cannot work.
    pub fn validate(&self) -> anyhow::Result<()> {
        let max = xroce::verbs::attr::limits::MAX_MR_SIZE as usize;
        if self.size % 4 != 0 || !(4096..=max).contains(&self.size) {
            anyhow::bail!(
                "--size {}: must be a multiple of 4 between 4096 and {max} bytes",
                self.size
            );
        }
        if Mtu::from_bytes(self.mtu).is_none() {
            anyhow::bail!("--mtu {}: must be 256, 512, 1024, 2048 or 4096", self.mtu);
        }
        Ok(())
    }
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct ClientHello {
    qpns: Vec<u32>,
    psns: Vec<u32>,
    gid: String,
}

#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
struct Window {
    rkey: u32,
    addr: u64,
    len: u64,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct ServerHello {
    qpns: Vec<u32>,
    psns: Vec<u32>,
    gid: String,
    addr: u64,
    len: u64,
    quarters: Vec<String>,
    w1: Window,
    w2: Window,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct OpLine {
    op: String,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Quarters {
    quarters: Vec<String>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Received {
    status: u32,
    invalidated: Option<u32>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Rebound {
    rkey: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    addr: Option<u64>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct LocalInvDone {
    ok: bool,
}

fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

/// One side: its PD, CQ, QPs and buffer.
struct Side {
    dev: Device,
    pd: Pd,
    cq: Cq,
    qps: Vec<Qp>,
    mr: Mr,
    psns: Vec<u32>,
    sgid_index: u32,
    timeout: Duration,
}

impl Side {
    fn new(dev: &Device, sgid_index: u32, size: usize, timeout: Duration) -> anyhow::Result<Side> {
        let pd = dev.alloc_pd()?;
        let cq = dev.create_cq(256, None)?;
        let caps = QpCaps {
            max_send_wr: 16,
            max_recv_wr: 4,
            ..QpCaps::default()
        };
        let qps = (0..QPS)
            .map(|_| {
                pd.create_qp(&QpInitAttr {
                    cap: caps,
                    sq_sig_all: false,
                    ..QpInitAttr::rc(&cq, &cq)
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let access =
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::MW_BIND;
        let mr = pd.reg_mr(size, access)?;
        let psns = (0..QPS).map(|_| crate::setup::random_psn()).collect();
        Ok(Side {
            dev: dev.clone(),
            pd,
            cq,
            qps,
            mr,
            psns,
            sgid_index,
            timeout,
        })
    }

    fn hello(&self) -> anyhow::Result<ClientHello> {
        Ok(ClientHello {
            qpns: self.qps.iter().map(|q| q.qp_num()).collect(),
            psns: self.psns.clone(),
            gid: gid_hex(&self.dev.query_gid(self.sgid_index)?.0),
        })
    }

    fn connect(&self, qpns: &[u32], psns: &[u32], gid: &str, mtu: u32) -> anyhow::Result<()> {
        if qpns.len() != QPS || psns.len() != QPS {
            anyhow::bail!("the peer offers {} QPs, the exchange has {QPS}", qpns.len());
        }
        let gid = Gid(gid_from_hex(gid)?);
        for (i, qp) in self.qps.iter().enumerate() {
            if qpns[i] == 0 || qpns[i] > 0xFF_FFFF {
                anyhow::bail!("peer QPN {:#x} is not a valid QP number", qpns[i]);
            }
            let opts = RcOptions {
                sgid_index: self.sgid_index as u8,
                path_mtu: Mtu::from_bytes(mtu).unwrap_or_default(),
                sq_psn: self.psns[i],
                access: Access::REMOTE_WRITE | Access::REMOTE_READ,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                min_rnr_timer: 12,
                max_rd_atomic: 1,
                hop_limit: 64,
            };
            let peer = RcPeer {
                qpn: qpns[i],
                psn: psns[i] & 0xFF_FFFF,
                gid,
            };
            qp.connect_rc(&peer, &opts)?;
        }
        Ok(())
    }

    /// The completion of `wr_id` (flushes of other WRs are skipped).
    fn wait(&self, wr_id: u64, what: &str) -> anyhow::Result<Wc> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                anyhow::bail!("{what}: no completion within {:?}", self.timeout);
            }
            for wc in self.cq.wait(1, left.min(Duration::from_millis(100)))? {
                if wc.wr_id == wr_id {
                    return Ok(wc);
                }
            }
        }
    }

    fn post(
        &self,
        qp: usize,
        wr_id: u64,
        op: WrOp,
        sg_list: Vec<xroce::verbs::Sge>,
    ) -> anyhow::Result<()> {
        self.qps[qp].post_send(&SendWr {
            wr_id,
            op,
            sg_list,
            flags: SendFlags::SIGNALED,
            ud: None,
        })?;
        Ok(())
    }

    fn quarters(&self) -> anyhow::Result<Vec<String>> {
        let q = self.mr.len() / 4;
        let data = self.mr.to_vec(0, self.mr.len())?;
        Ok(data.chunks(q).map(sha256_hex).collect())
    }

    /// Bind the type 2 window over `[addr, addr+len)` by a WR on `qp`; its new R_Key.
    fn bind_type2(
        &self,
        mw: &Mw,
        qp: usize,
        addr: u64,
        len: u64,
        wr_id: u64,
    ) -> anyhow::Result<u32> {
        let rkey = inc_rkey(mw.rkey()?);
        let bind = self.bind_info(addr, len, Access::REMOTE_WRITE | Access::REMOTE_READ);
        self.post(
            qp,
            wr_id,
            WrOp::BindMw {
                mw: mw.id(),
                rkey,
                bind,
            },
            vec![],
        )?;
        expect_success(self.wait(wr_id, "type 2 bind")?, "type 2 bind")?;
        Ok(rkey)
    }

    /// Bind the type 1 window through `qp` (the bind verb); its new R_Key.
    fn bind_type1(
        &self,
        mw: &Mw,
        qp: usize,
        addr: u64,
        len: u64,
        access: Access,
        wr_id: u64,
    ) -> anyhow::Result<u32> {
        let bind = self.bind_info(addr, len, access);
        let rkey = self.qps[qp].bind_mw(mw, wr_id, SendFlags::SIGNALED, bind)?;
        expect_success(self.wait(wr_id, "type 1 bind")?, "type 1 bind")?;
        Ok(rkey)
    }

    fn bind_info(&self, addr: u64, len: u64, access: Access) -> MwBindInfo {
        MwBindInfo {
            mr_lkey: self.mr.lkey(),
            addr,
            length: len,
            access,
        }
    }
}

fn expect_success(wc: Wc, what: &str) -> anyhow::Result<Wc> {
    if wc.status != WcStatus::Success {
        anyhow::bail!("{what} completed with {:?}", wc.status);
    }
    Ok(wc)
}

/// What the server did.
#[derive(Debug, Clone)]
pub struct ServerOutcome {
    /// Digest requests answered.
    pub digests: usize,
    /// The R_Key the client's SEND_WITH_INV invalidated.
    pub invalidated: Option<u32>,
}

/// The server: own the memory and the windows, answer the client until it says "done".
pub fn server<S: Read + Write>(
    dev: &Device,
    sgid_index: u32,
    stream: &mut S,
    opts: &MwCheckOptions,
    initial: &[u8],
) -> anyhow::Result<ServerOutcome> {
    opts.validate()?;
    if initial.len() != opts.size {
        anyhow::bail!(
            "the initial content has {} bytes, not {}",
            initial.len(),
            opts.size
        );
    }
    let side = Side::new(dev, sgid_index, opts.size, opts.timeout)?;
    side.mr.write(0, initial)?;
    let q = (opts.size / 4) as u64;
    let base = side.mr.addr();
    let peer: ClientHello = recv_json(stream, "client hello")?;
    side.connect(&peer.qpns, &peer.psns, &peer.gid, opts.mtu)?;
    let w1 = side.pd.alloc_mw(MwType::Type1)?;
    let w2 = side.pd.alloc_mw(MwType::Type2)?;
    let both = Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mut rkey1 = side.bind_type1(&w1, 0, base + q, q, both, 1)?;
    let mut rkey2 = side.bind_type2(&w2, 0, base + 2 * q, q, 2)?;
    // The receive the client's SEND_WITH_INV consumes, in a region of its own (the
    // quarters must change only by the client's WRITEs).
    let inbox = side.pd.reg_mr(64, Access::LOCAL_WRITE)?;
    side.qps[0].post_recv(&RecvWr {
        wr_id: 100,
        sg_list: vec![inbox.sge(0, 64)?],
    })?;
    let hello = side.hello()?;
    send_json(
        stream,
        &ServerHello {
            qpns: hello.qpns,
            psns: hello.psns,
            gid: hello.gid,
            addr: base,
            len: opts.size as u64,
            quarters: side.quarters()?,
            w1: Window {
                rkey: rkey1,
                addr: base + q,
                len: q,
            },
            w2: Window {
                rkey: rkey2,
                addr: base + 2 * q,
                len: q,
            },
        },
    )?;
    let mut out = ServerOutcome {
        digests: 0,
        invalidated: None,
    };
    loop {
        let line: OpLine = recv_json(stream, "client request")?;
        match line.op.as_str() {
            "digests" => {
                out.digests += 1;
                send_json(
                    stream,
                    &Quarters {
                        quarters: side.quarters()?,
                    },
                )?;
            }
            "received" => {
                let wc = side.wait(100, "the SEND_WITH_INV's receive")?;
                out.invalidated = wc.invalidated_rkey;
                let status = if wc.status == WcStatus::Success { 0 } else { 1 };
                send_json(
                    stream,
                    &Received {
                        status,
                        invalidated: wc.invalidated_rkey,
                    },
                )?;
            }
            "bind2" => {
                rkey2 = side.bind_type2(&w2, 1, base + 2 * q, q, 3)?;
                send_json(
                    stream,
                    &Rebound {
                        rkey: rkey2,
                        addr: None,
                    },
                )?;
            }
            "local_inv" => {
                side.post(1, 4, WrOp::LocalInv { rkey: rkey2 }, vec![])?;
                let wc = side.wait(4, "LOCAL_INV")?;
                send_json(
                    stream,
                    &LocalInvDone {
                        ok: wc.status == WcStatus::Success,
                    },
                )?;
            }
            "bind1" => {
                rkey1 = side.bind_type1(&w1, 2, base, q, Access::REMOTE_READ, 5)?;
                send_json(
                    stream,
                    &Rebound {
                        rkey: rkey1,
                        addr: Some(base),
                    },
                )?;
            }
            "done" => return Ok(out),
            other => anyhow::bail!("client sent an unknown request {other:?}"),
        }
    }
}

/// What the client checked (every check passed when this is returned).
#[derive(Debug, Clone)]
pub struct ClientOutcome {
    /// Accesses through windows that succeeded.
    pub accepted: usize,
    /// Accesses refused with REM_ACCESS_ERR, memory untouched.
    pub refused: usize,
}

struct Client<'a, S> {
    side: Side,
    stream: &'a mut S,
    expect: Vec<String>,
    next_id: u64,
    q: usize,
    out: ClientOutcome,
    fresh: &'a mut dyn FnMut(&mut [u8]),
}

impl<S: Read + Write> Client<'_, S> {
    fn ask<T: serde::de::DeserializeOwned>(&mut self, op: &str) -> anyhow::Result<T> {
        send_json(self.stream, &OpLine { op: op.into() })?;
        recv_json(self.stream, op)
    }

    fn rdma(&mut self, qp: usize, write: bool, rkey: u32, addr: u64) -> anyhow::Result<WcStatus> {
        self.next_id += 1;
        let op = if write {
            WrOp::Write {
                remote_addr: addr,
                rkey,
            }
        } else {
            WrOp::Read {
                remote_addr: addr,
                rkey,
            }
        };
        let sge = self.side.mr.sge(0, self.q as u32)?;
        self.side.post(qp, self.next_id, op, vec![sge])?;
        Ok(self.side.wait(self.next_id, "RDMA")?.status)
    }

    fn check_memory(&mut self, step: &str) -> anyhow::Result<()> {
        let got: Quarters = self.ask("digests")?;
        for i in 0..4 {
            if got.quarters.get(i) != self.expect.get(i) {
                anyhow::bail!(
                    "{step}: quarter {i} of the server's memory is not what it should be"
                );
            }
        }
        Ok(())
    }

    fn new_data(&mut self) -> anyhow::Result<Vec<u8>> {
        let mut data = vec![0u8; self.q];
        (self.fresh)(&mut data);
        self.side.mr.write(0, &data)?;
        Ok(data)
    }

    fn write_ok(&mut self, qp: usize, w: Window, quarter: usize, step: &str) -> anyhow::Result<()> {
        let data = self.new_data()?;
        let status = self.rdma(qp, true, w.rkey, w.addr)?;
        if status != WcStatus::Success {
            anyhow::bail!("{step}: WRITE through the window completed with {status:?}");
        }
        self.out.accepted += 1;
        self.expect[quarter] = sha256_hex(&data);
        self.check_memory(step)
    }

    fn write_refused(&mut self, qp: usize, w: Window, step: &str) -> anyhow::Result<()> {
        self.new_data()?;
        let status = self.rdma(qp, true, w.rkey, w.addr)?;
        if status != WcStatus::RemAccessErr {
            anyhow::bail!("{step}: WRITE completed with {status:?}, not RemAccessErr");
        }
        self.out.refused += 1;
        self.check_memory(step)
    }

    fn read_ok(&mut self, qp: usize, w: Window, quarter: usize, step: &str) -> anyhow::Result<()> {
        let status = self.rdma(qp, false, w.rkey, w.addr)?;
        if status != WcStatus::Success {
            anyhow::bail!("{step}: READ through the window completed with {status:?}");
        }
        self.out.accepted += 1;
        let got = self.side.mr.to_vec(0, self.q)?;
        if Some(&sha256_hex(&got)) != self.expect.get(quarter) {
            anyhow::bail!("{step}: READ returned other bytes than quarter {quarter} holds");
        }
        Ok(())
    }
}

/// The client: use the server's windows, invalidate one, and check that every refused
/// access left the server's memory as it was. `fresh` fills buffers with new bytes.
pub fn client<S: Read + Write>(
    dev: &Device,
    sgid_index: u32,
    stream: &mut S,
    opts: &MwCheckOptions,
    fresh: &mut dyn FnMut(&mut [u8]),
) -> anyhow::Result<ClientOutcome> {
    opts.validate()?;
    let q = opts.size / 4;
    let side = Side::new(dev, sgid_index, q, opts.timeout)?;
    send_json(stream, &side.hello()?)?;
    let peer: ServerHello = recv_json(stream, "server hello")?;
    if peer.len != opts.size as u64 || peer.quarters.len() != 4 {
        anyhow::bail!(
            "the server has {} bytes, we use --size {}: use the same on both sides",
            peer.len,
            opts.size
        );
    }
    side.connect(&peer.qpns, &peer.psns, &peer.gid, opts.mtu)?;
    let mut c = Client {
        side,
        stream,
        expect: peer.quarters.clone(),
        next_id: 10,
        q,
        out: ClientOutcome {
            accepted: 0,
            refused: 0,
        },
        fresh,
    };
    let (w1, w2) = (peer.w1, peer.w2);
    c.read_ok(0, w1, 1, "READ through W1")?;
    c.write_ok(0, w2, 2, "WRITE through W2")?;
    // SEND_WITH_INV: the server's receive reports W2's R_Key invalidated.
    c.next_id += 1;
    let id = c.next_id;
    let sge = c.side.mr.sge(0, 16)?;
    c.side
        .post(0, id, WrOp::SendWithInv { rkey: w2.rkey }, vec![sge])?;
    expect_success(c.side.wait(id, "SEND_WITH_INV")?, "SEND_WITH_INV")?;
    let got: Received = c.ask("received")?;
    if got.status != 0 || got.invalidated != Some(w2.rkey) {
        anyhow::bail!(
            "the server's receive reported {got:?}, not R_Key {:#x} invalidated",
            w2.rkey
        );
    }
    c.write_refused(0, w2, "WRITE through W2 after SEND_WITH_INV")?;
    let again: Rebound = c.ask("bind2")?;
    let w2 = Window {
        rkey: again.rkey,
        ..w2
    };
    c.write_ok(1, w2, 2, "WRITE through W2 bound again")?;
    let inv: LocalInvDone = c.ask("local_inv")?;
    if !inv.ok {
        anyhow::bail!("the server's LOCAL_INV failed");
    }
    c.write_refused(1, w2, "WRITE through W2 after LOCAL_INV")?;
    let moved: Rebound = c.ask("bind1")?;
    let w1_moved = Window {
        rkey: moved.rkey,
        addr: moved.addr.unwrap_or(peer.addr),
        len: w1.len,
    };
    c.read_ok(2, w1_moved, 0, "READ through W1 rebound")?;
    c.write_refused(2, w1, "WRITE through W1's old R_Key")?;
    c.write_refused(3, w1_moved, "WRITE through the read-only W1")?;
    send_json(c.stream, &OpLine { op: "done".into() })?;
    Ok(c.out)
}
