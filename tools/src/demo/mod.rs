//! `xroce demo`'s story: two endpoints, seven RDMA operations, each explained to a newcomer
//! and checked by the side that can see its result.
//!
//! The endpoints set up an RC connection the way `ibv_rc_pingpong` does (QPN, PSN, GID, and
//! here also R_Key and address, exchanged as JSON lines over the set-up connection), then the
//! client runs SEND, SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ, FETCH_ADD and
//! CMP_SWAP ([`story`]). After each, the side that can see the result checks it: the client
//! what came back into its own buffer, the server (asked over the same connection) what
//! arrived in its memory or receive queue. The demo fails on the first difference.
//!
//! Each side is a [`ToolEndpoint`] on an open [`Device`] (`verbs_endpoint`); the exchange is
//! `json_line` over any [`OobStream`]. Where the devices come from (namespaces and a veth
//! pair, loopback, the in-memory link) is [`stage`].
//!
//! ```text
//! client                                         server [recv | write | read source | u64]
//!   | --- {qpn, psn, gid, rkey, addr, len, mtu} -->  |  3 receives posted
//!   | <-- {qpn, psn, gid, rkey, addr, len, mtu} ---  |  both QPs to RTS
//!   | == one RDMA operation ====================>    |  (the progress thread answers it)
//!   | --- {"cmd": "check_..."} ------------------>   |  checks its memory / its completion
//!   | <-- {ok, detail} ---------------------------   |  ... seven times
//!   | --- {"cmd": "done"} ----------------------->   |
//!   | <-- {ok, detail} ---------------------------   |  both print their counters
//! ```
pub mod stage;

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use serde::{Deserialize, Serialize};

use crate::analysis::frame_line;
use crate::endpoint::verbs::{self as verbs_endpoint, DriverChoice, EndpointSpec};
use crate::endpoint::{
    poll_one, ConnectParams, RemoteInfo, ToolEndpoint, ToolWc, ToolWr, WcKind, WrOp,
};
use crate::json_line::{gid_from_hex, gid_hex, recv_json, send_json};
use crate::setup::{random_psn, OobStream, SETUP_TIMEOUT};
use xroce::engine::Mtu;
use xroce::netdev::Gid;
use xroce::verbs::{Device, DeviceConfig, TracedFrame};
use xroce::wire::parse_frame;

/// How long one operation, or one of the server's receive completions, may take.
const WAIT: Duration = Duration::from_secs(10);

/// Frames each device keeps for the client's packet trace.
const TRACE_FRAMES: usize = 1 << 16;

/// The value the server's atomic target starts with.
pub const ATOMIC_INITIAL: u64 = 100;

/// How the demo opens a device on an interface: as the tools do, keeping the last frames
/// for the trace.
pub fn device_config(driver: DriverChoice, pcap: Option<std::path::PathBuf>) -> DeviceConfig {
    DeviceConfig {
        trace_frames: TRACE_FRAMES,
        ..verbs_endpoint::device_config(driver, pcap)
    }
}

/// What each side tells the other before connecting (ibv_rc_pingpong's exchange, plus the
/// memory region the other side may access).
#[derive(Serialize, Deserialize, Debug, Clone)]
struct Hello {
    qpn: u32,
    psn: u32,
    /// 32 hex digits.
    gid: String,
    rkey: u32,
    addr: u64,
    len: u64,
    /// Active path MTU of the port, bytes.
    mtu: u32,
}

/// Which receive completion the server expects.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RecvKind {
    /// A SEND (with or without immediate) consumed it.
    Recv,
    /// An RDMA WRITE_WITH_IMM consumed it.
    RecvRdmaWithImm,
}

impl RecvKind {
    fn wc_kind(self) -> WcKind {
        match self {
            RecvKind::Recv => WcKind::Recv,
            RecvKind::RecvRdmaWithImm => WcKind::RecvRdmaWithImm,
        }
    }
}

/// One request from the client to the server; the server answers each with a [`Reply`].
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// Wait for the next receive completion and check it and the bytes at `offset`.
    CheckRecv {
        /// Pattern seed of the expected bytes.
        seed: u8,
        /// Expected length.
        len: usize,
        /// Expected immediate data.
        imm: Option<u32>,
        /// Expected completion.
        opcode: RecvKind,
        /// Where the bytes are in the server's buffer.
        offset: usize,
    },
    /// Check a memory range of the server's buffer.
    CheckMem {
        /// Where.
        offset: usize,
        /// How many bytes.
        len: usize,
        /// Pattern seed of the expected bytes.
        seed: u8,
    },
    /// Check the atomic target.
    CheckU64 {
        /// The value it must hold.
        expect: u64,
    },
    /// Finished: report counters and exit.
    Done,
}

/// The server's verdict on a [`Request`].
#[derive(Serialize, Deserialize, Debug, Clone)]
struct Reply {
    ok: bool,
    detail: String,
}

/// The server's buffer: [recv area | write area | read source | atomic u64], each area
/// `size` bytes, the u64 8-byte aligned.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// Message size.
    pub size: usize,
}

impl Layout {
    /// Where SEND and SEND_WITH_IMM land.
    pub fn recv(&self) -> usize {
        0
    }
    /// Where RDMA WRITE and WRITE_WITH_IMM land.
    pub fn write(&self) -> usize {
        self.size
    }
    /// What RDMA READ fetches.
    pub fn read_src(&self) -> usize {
        2 * self.size
    }
    /// The atomic target.
    pub fn atomic(&self) -> usize {
        (3 * self.size).div_ceil(8) * 8
    }
    /// Bytes of the whole buffer.
    pub fn total(&self) -> usize {
        self.atomic() + 8
    }
}

/// The client's buffer: [data sent | READ destination | atomic result].
fn client_len(size: usize) -> usize {
    2 * size + 8
}

/// Which side of the demo an endpoint plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Runs the operations ([`client`]).
    Client,
    /// Is their target and checks what arrived ([`server`]).
    Server,
}

impl Side {
    /// Bytes of the side's registered buffer for `size`-byte messages.
    pub fn buf_len(self, size: usize) -> usize {
        match self {
            Side::Client => client_len(size),
            Side::Server => Layout { size }.total(),
        }
    }
}

/// The bytes numbered `seed`: every step carries a different pattern, so a stale buffer
/// never passes for a fresh one.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(seed | 1).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// How the client knows a step worked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// The server checks what arrived (its reply is the verdict).
    Server(Request),
    /// A READ: the bytes now at `offset` of our buffer are the server's read source.
    ReadInto {
        /// Where the READ put them.
        offset: usize,
        /// Pattern seed of the server's read source.
        seed: u8,
    },
    /// An atomic: it returned `old` into our buffer at `at`, and the server's target now
    /// holds `now`.
    Atomic {
        /// Where the old value was returned.
        at: usize,
        /// The value the target held before.
        old: u64,
        /// The value it must hold now.
        now: u64,
    },
}

/// One step of the story.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The operation's IBTA name.
    pub name: &'static str,
    /// What it does, for a newcomer.
    pub what: &'static str,
    /// Fill our buffer's first `len` bytes with this pattern first.
    pub fill: Option<u8>,
    /// The work request (signalled).
    pub op: WrOp,
    /// Our buffer's part in it: the data sent, or where the result lands.
    pub offset: usize,
    /// See `offset`.
    pub len: usize,
    /// How the result is checked.
    pub check: Check,
}

/// The seven steps, against a server whose buffer is at `remote_addr` with `rkey`.
pub fn story(size: usize, remote_addr: u64, rkey: u32) -> Vec<Step> {
    let server = Layout { size };
    let remote = |offset: usize| remote_addr + offset as u64;
    let read_dst = size;
    let result_at = 2 * size;
    vec![
        Step {
            name: "SEND",
            what: "copies our buffer into the next receive buffer the server posted; both sides get a completion",
            fill: Some(1),
            op: WrOp::Send,
            offset: 0,
            len: size,
            check: Check::Server(Request::CheckRecv {
                seed: 1,
                len: size,
                imm: None,
                opcode: RecvKind::Recv,
                offset: server.recv(),
            }),
        },
        Step {
            name: "SEND_WITH_IMM",
            what: "a SEND that also carries 32 bits of immediate data, delivered in the server's completion",
            fill: Some(2),
            op: WrOp::SendWithImm { imm: 0x1234_abcd },
            offset: 0,
            len: size,
            check: Check::Server(Request::CheckRecv {
                seed: 2,
                len: size,
                imm: Some(0x1234_abcd),
                opcode: RecvKind::Recv,
                offset: server.recv(),
            }),
        },
        Step {
            name: "RDMA_WRITE",
            what: "writes straight into the server's memory at an address + R_Key it gave us; the server's CPU is not involved",
            fill: Some(3),
            op: WrOp::Write {
                remote_addr: remote(server.write()),
                rkey,
            },
            offset: 0,
            len: size,
            check: Check::Server(Request::CheckMem {
                offset: server.write(),
                len: size,
                seed: 3,
            }),
        },
        Step {
            name: "RDMA_WRITE_WITH_IMM",
            what: "an RDMA WRITE whose last packet carries immediate data; it consumes a receive so the server learns it happened",
            fill: Some(5),
            op: WrOp::WriteWithImm {
                remote_addr: remote(server.write()),
                rkey,
                imm: 0xfeed_f00d,
            },
            offset: 0,
            len: size,
            check: Check::Server(Request::CheckRecv {
                seed: 5,
                len: size,
                imm: Some(0xfeed_f00d),
                opcode: RecvKind::RecvRdmaWithImm,
                offset: server.write(),
            }),
        },
        Step {
            name: "RDMA_READ",
            what: "fetches bytes from the server's memory into ours; the server answers with READ response packets",
            fill: None,
            op: WrOp::Read {
                remote_addr: remote(server.read_src()),
                rkey,
            },
            offset: read_dst,
            len: size,
            check: Check::ReadInto {
                offset: read_dst,
                seed: READ_SEED,
            },
        },
        Step {
            name: "FETCH_ADD",
            what: "atomically adds 23 to a 64-bit value in the server's memory and returns the old value",
            fill: None,
            op: WrOp::FetchAdd {
                remote_addr: remote(server.atomic()),
                rkey,
                add: 23,
            },
            offset: result_at,
            len: 8,
            check: Check::Atomic {
                at: result_at,
                old: ATOMIC_INITIAL,
                now: ATOMIC_INITIAL + 23,
            },
        },
        Step {
            name: "CMP_SWAP",
            what: "atomically replaces the value with 0xC0FFEE if it equals 123, and returns the old value",
            fill: None,
            op: WrOp::CompareSwap {
                remote_addr: remote(server.atomic()),
                rkey,
                compare: ATOMIC_INITIAL + 23,
                swap: 0xC0FFEE,
            },
            offset: result_at,
            len: 8,
            check: Check::Atomic {
                at: result_at,
                old: ATOMIC_INITIAL + 23,
                now: 0xC0FFEE,
            },
        },
    ]
}

/// Pattern seed of the server's read source.
const READ_SEED: u8 = 4;

/// The endpoint `side` needs for `size`-byte messages: one RC QP on `dev`, addressed by its
/// IPv4 GID, with a completion channel so that waiting for a completion sleeps.
pub fn open_endpoint(
    dev: &Device,
    side: Side,
    size: usize,
) -> anyhow::Result<Box<dyn ToolEndpoint>> {
    let gid_index = dev
        .ipv4_gid_index()
        .ok_or_else(|| anyhow!("{} has no IPv4 address (no IPv4 GID)", dev.name()))?;
    let spec = EndpointSpec {
        qp_type: xroce::engine::QpType::Rc,
        buf_len: side.buf_len(size),
        max_send_wr: 4,
        max_recv_wr: 4,
        // The device is open already: `open_on` does not look at the driver.
        driver: DriverChoice::Udp,
        events: true,
        pcap: None,
        progress: Default::default(),
        shards: 1,
    };
    let mut eps = verbs_endpoint::open_on(dev, gid_index, &spec, 1)?;
    Ok(eps.remove(0))
}

fn hello_of(ep: &dyn ToolEndpoint, psn: u32, len: usize) -> Hello {
    let local = ep.local();
    Hello {
        qpn: local.qpn,
        psn,
        gid: gid_hex(&local.gid),
        rkey: local.rkey,
        addr: local.buf_addr,
        len: len as u64,
        mtu: local.active_mtu,
    }
}

/// Connects `ep` to the peer that sent `peer`, at the smaller of both path MTUs, with the
/// verbs defaults (`RcOptions::default()`: ACK timeout 14, 7 retries, 7 RNR retries, RNR
/// timer 12, 16 READs/atomics in flight, hop limit 64). Returns the path MTU.
fn connect(ep: &mut dyn ToolEndpoint, me: &Hello, peer: &Hello) -> anyhow::Result<u32> {
    let remote = RemoteInfo {
        qpn: peer.qpn,
        psn: peer.psn,
        gid: gid_from_hex(&peer.gid)?,
    };
    let mtu = Mtu::from_bytes(me.mtu.min(peer.mtu)).map_or(1024, Mtu::bytes);
    let params = ConnectParams {
        local_psn: me.psn,
        mtu,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 12,
        max_rd_atomic: 16,
        hop_limit: 64,
        sl: 0,
        qkey: 0,
    };
    ep.connect(&remote, &params)?;
    Ok(mtu)
}

fn read_bytes(ep: &dyn ToolEndpoint, offset: usize, len: usize) -> anyhow::Result<Vec<u8>> {
    let mut data = vec![0u8; len];
    ep.read_local(offset, &mut data)?;
    Ok(data)
}

fn read_u64(ep: &dyn ToolEndpoint, offset: usize) -> anyhow::Result<u64> {
    let mut bytes = [0u8; 8];
    ep.read_local(offset, &mut bytes)?;
    Ok(u64::from_ne_bytes(bytes))
}

fn wait_one(ep: &mut dyn ToolEndpoint) -> anyhow::Result<ToolWc> {
    poll_one(ep, Instant::now() + WAIT)
}

fn mark(ok: bool) -> &'static str {
    if ok {
        "✓"
    } else {
        "✗"
    }
}

/// The server on `ep` (from [`open_endpoint`] with [`Side::Server`]) of device `device`:
/// answers RDMA from its progress thread; checks what the client asks it to. Returns after
/// the client's "done"; the caller then shows [`server_counters`].
pub fn server<S: OobStream>(
    ep: &mut dyn ToolEndpoint,
    oob: &mut S,
    size: usize,
    device: &str,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let layout = Layout { size };
    ep.write_local(layout.read_src(), &pattern(size, READ_SEED))?;
    ep.write_local(layout.atomic(), &ATOMIC_INITIAL.to_ne_bytes())?;
    // Receives for SEND, SEND_WITH_IMM (data into the receive area) and WRITE_WITH_IMM (no
    // data: the payload goes where the RETH says; the receive only carries the immediate).
    // The endpoint is in INIT, where receives may be posted (IBTA 10.3.1).
    for wr_id in 1..=2 {
        ep.post_recv(wr_id, layout.recv(), size.max(1))?;
    }
    ep.post_recv(3, 0, 0)?;
    oob.bound_reads(Some(SETUP_TIMEOUT))?;
    let client: Hello = recv_json(oob, "client hello")?;
    let me = hello_of(ep, random_psn(), layout.total());
    connect(ep, &me, &client)?;
    send_json(oob, &me)?;
    writeln!(
        out,
        "server {}: QP {:#x} connected to client QP {:#x}; it never polls for RDMA READ, WRITE \
         or atomics: its progress thread answers them",
        device, me.qpn, client.qpn
    )?;
    loop {
        let request: Request = recv_json(oob, "request")?;
        let reply = match request {
            Request::Done => {
                send_json(
                    oob,
                    &Reply {
                        ok: true,
                        detail: String::new(),
                    },
                )?;
                return Ok(());
            }
            request => check_request(ep, &layout, &request)?,
        };
        writeln!(out, "  server check: {} {}", mark(reply.ok), reply.detail)?;
        send_json(oob, &reply)?;
    }
}

/// The server's side of one check.
fn check_request(
    ep: &mut dyn ToolEndpoint,
    layout: &Layout,
    request: &Request,
) -> anyhow::Result<Reply> {
    Ok(match *request {
        Request::CheckRecv {
            seed,
            len,
            imm,
            opcode,
            offset,
        } => {
            let wc = wait_one(ep)?;
            let data_ok = read_bytes(ep, offset, len)? == pattern(len, seed);
            Reply {
                ok: wc.failed().is_none()
                    && wc.kind == opcode.wc_kind()
                    && wc.byte_len as usize == len
                    && wc.imm == imm
                    && data_ok,
                detail: format!(
                    // The status as the verbs name it (`Success`, `RemAccessErr`, ...).
                    "receive completion: {:?} {:?}, {} bytes, imm {}; data {}",
                    wc.status,
                    wc.kind,
                    wc.byte_len,
                    wc.imm.map_or("none".to_string(), |v| format!("{v:#x}")),
                    if data_ok { "matches" } else { "DIFFERS" }
                ),
            }
        }
        Request::CheckMem { offset, len, seed } => {
            let ok = read_bytes(ep, offset, len)? == pattern(len, seed);
            Reply {
                ok,
                detail: format!(
                    "{len} bytes at offset {offset} {}",
                    if ok { "match" } else { "DIFFER" }
                ),
            }
        }
        Request::CheckU64 { expect } => {
            let value = read_u64(ep, layout.atomic())?;
            Reply {
                ok: value == expect,
                detail: format!("atomic target now holds {value:#x} (expected {expect:#x})"),
            }
        }
        Request::Done => anyhow::bail!("\"done\" is not a check"),
    })
}

/// The client on `ep` (from [`open_endpoint`] with [`Side::Client`]) of device `device`
/// with driver `driver`: runs every step of the [`story`], explains it, verifies it. True
/// when every check passed; the caller then shows [`print_trace`] and [`client_counters`].
pub fn client<S: OobStream>(
    ep: &mut dyn ToolEndpoint,
    oob: &mut S,
    size: usize,
    device: &str,
    driver: &str,
    out: &mut dyn Write,
) -> anyhow::Result<bool> {
    oob.bound_reads(Some(SETUP_TIMEOUT))?;
    let me = hello_of(ep, random_psn(), client_len(size));
    send_json(oob, &me)?;
    let server: Hello = recv_json(oob, "server hello")?;
    let mtu = connect(ep, &me, &server)?;
    let gid = |hello: &Hello| Gid::from_hex(&hello.gid).unwrap_or_default();
    writeln!(
        out,
        "client {} (driver {}): QP {:#x}, GID {}\n\
         server: QP {:#x}, GID {}, memory region {:#x} (+{} bytes), R_Key {:#x}\n\
         connected: path MTU {} bytes, so a {}-byte message travels as {} packet(s)\n",
        device,
        driver,
        me.qpn,
        gid(&me),
        server.qpn,
        gid(&server),
        server.addr,
        server.len,
        server.rkey,
        mtu,
        size,
        size.div_ceil(mtu as usize).max(1)
    )?;
    let mut all_ok = true;
    for step in story(size, server.addr, server.rkey) {
        all_ok &= run_step(ep, oob, &step, out)?;
    }
    send_json(oob, &Request::Done)?;
    let _: Reply = recv_json(oob, "reply to done")?;
    Ok(all_ok)
}

/// Posts one step's work request, waits for its completion and checks the result.
fn run_step<S: OobStream>(
    ep: &mut dyn ToolEndpoint,
    oob: &mut S,
    step: &Step,
    out: &mut dyn Write,
) -> anyhow::Result<bool> {
    if let Some(seed) = step.fill {
        ep.write_local(step.offset, &pattern(step.len, seed))?;
    }
    writeln!(out, "{}: {}", step.name, step.what)?;
    let start = Instant::now();
    ep.post_send(&ToolWr {
        wr_id: 1,
        op: step.op,
        offset: step.offset,
        len: step.len,
        signaled: true,
    })?;
    let wc = wait_one(ep)?;
    let took = start.elapsed();
    let mut ask = |request: &Request| -> anyhow::Result<(bool, String)> {
        send_json(oob, request)?;
        let reply: Reply = recv_json(oob, "server's reply")?;
        Ok((reply.ok, format!("server says: {}", reply.detail)))
    };
    let (ok, detail) = if let Some(status) = wc.failed() {
        (false, format!("completion status {status:?}"))
    } else {
        match &step.check {
            Check::Server(request) => ask(request)?,
            Check::ReadInto { offset, seed } => {
                let ok = read_bytes(ep, *offset, step.len)? == pattern(step.len, *seed)
                    && wc.kind == WcKind::Read;
                let verdict = if ok { "match" } else { "DIFFER" };
                (ok, format!("{} bytes read {verdict}", step.len))
            }
            Check::Atomic { at, old, now } => {
                let returned = read_u64(ep, *at)?;
                let (server_ok, detail) = ask(&Request::CheckU64 { expect: *now })?;
                (
                    server_ok && returned == *old,
                    format!("returned old value {returned} (expected {old}); {detail}"),
                )
            }
        }
    };
    writeln!(
        out,
        "  {} completed in {:.0} us; {}",
        mark(ok),
        took.as_secs_f64() * 1e6,
        detail
    )?;
    Ok(ok)
}

/// The client's counters, and what its XDP program saw.
pub fn client_counters(dev: &Device, out: &mut dyn Write) -> anyhow::Result<()> {
    let c = dev.counters();
    writeln!(
        out,
        "\nclient counters: sent_pkts {} rcvd_pkts {} retransmitted_packets {} rcvd_seq_err {} \
         retry_exceeded_err {} emit_failed {}; drops: bad_icrc {} malformed {} unknown_qp {}",
        c.sent_pkts,
        c.rcvd_pkts,
        c.retransmitted_packets,
        c.rcvd_seq_err,
        c.retry_exceeded_err,
        c.emit_failed,
        c.drops.bad_icrc,
        c.drops.malformed,
        c.drops.unknown_qp
    )?;
    if let Some(x) = dev.xdp_stats() {
        writeln!(
            out,
            "client XDP program: {} frames seen, {} RoCE frames redirected to AF_XDP, {} passed \
             to the kernel (ARP and the TCP set-up connection)",
            x.seen, x.redirected, x.passed
        )?;
    }
    Ok(())
}

/// The server's counters, and what its XDP program saw.
pub fn server_counters(dev: &Device, out: &mut dyn Write) -> anyhow::Result<()> {
    let c = dev.counters();
    writeln!(
        out,
        "server counters: sent_pkts {} rcvd_pkts {} duplicate_request {} \
         out_of_seq_request {} send_rnr_err {}",
        c.sent_pkts, c.rcvd_pkts, c.duplicate_request, c.out_of_seq_request, c.send_rnr_err
    )?;
    if let Some(x) = dev.xdp_stats() {
        writeln!(
            out,
            "server XDP program: {} frames seen, {} RoCE frames redirected to AF_XDP, \
             {} passed to the kernel",
            x.seen, x.redirected, x.passed
        )?;
    }
    Ok(())
}

/// The client's packet trace, at most `limit` lines, with a key to what it shows. Each frame
/// is the line `xroce dump` prints for it ([`frame_line`]), numbered as `xroce dump` numbers
/// the frames of the demo's `--pcap` file and timed from the first.
pub fn print_trace(
    frames: &[TracedFrame],
    limit: usize,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    writeln!(out, "\nPacket trace (client side; → sent, ← received):")?;
    writeln!(
        out,
        "  Each line is what `xroce dump` shows of the frame: number, seconds since the first,\n  \
         addresses, opcode, destination QP and PSN (packet sequence number, 24 bits). A message\n  \
         longer than the path MTU is split into FIRST, MIDDLE..., LAST packets; flags=A (AckReq)\n  \
         asks the responder to acknowledge. The ACK's AETH says ACK (or NAK) and the MSN, the\n  \
         count of messages the responder has completed. A RETH (va, rkey, dma_len) carries the\n  \
         remote address, R_Key and length of an RDMA WRITE or READ; an AtomicETH the operands\n  \
         of an atomic, orig_data the value it found."
    )?;
    let lines = trace_lines(frames);
    let shown = lines.len().min(limit);
    for line in &lines[..shown] {
        writeln!(out, "  {line}")?;
    }
    if lines.len() > shown {
        writeln!(
            out,
            "  ... {} more lines ({} frames in all)",
            lines.len() - shown,
            frames.len()
        )?;
    }
    Ok(())
}

/// One line per frame, each run of MIDDLE packets in one direction folded into one line.
fn trace_lines(frames: &[TracedFrame]) -> Vec<String> {
    let first_at = frames.first().map_or(Duration::ZERO, |f| f.at);
    let middle_name = |f: &TracedFrame| {
        parse_frame(&f.bytes)
            .ok()
            .map(|p| p.repr.roce.bth.opcode.name())
            .filter(|name| name.contains("MIDDLE"))
    };
    let mut lines = Vec::new();
    let mut i = 0;
    while i < frames.len() {
        let f = &frames[i];
        let arrow = if f.outgoing { "→" } else { "←" };
        let number = i + 1;
        let Ok(parsed) = parse_frame(&f.bytes) else {
            lines.push(format!(
                "{arrow} #{number:<5} (not a RoCE frame, {} bytes)",
                f.bytes.len()
            ));
            i += 1;
            continue;
        };
        let bth = &parsed.repr.roce.bth;
        if let Some(name) = middle_name(f) {
            let run = frames[i..]
                .iter()
                .take_while(|g| g.outgoing == f.outgoing && middle_name(g) == Some(name))
                .count();
            if run > 1 {
                let last = &frames[i + run - 1];
                let last_psn = parse_frame(&last.bytes).map_or(bth.psn, |p| p.repr.roce.bth.psn);
                let numbers = format!("#{number}..#{}", number + run - 1);
                lines.push(format!(
                    "{arrow} {numbers:<6} {:>10.6}  {run} x {name}  qp=0x{:x} psn={}..{last_psn} payload={} each",
                    f.at.saturating_sub(first_at).as_secs_f64(),
                    bth.dest_qp,
                    bth.psn,
                    parsed.repr.roce.payload.len()
                ));
                i += run;
                continue;
            }
        }
        let line = frame_line(number, f.at.saturating_sub(first_at), &parsed);
        lines.push(format!("{arrow} {}", line.trim_end()));
        i += 1;
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_areas_do_not_overlap_and_the_atomic_is_aligned() {
        for size in [0, 1, 7, 8, 8192, 20000, 100_001] {
            let l = Layout { size };
            assert!(l.recv() + size <= l.write());
            assert!(l.write() + size <= l.read_src());
            assert!(l.read_src() + size <= l.atomic());
            assert_eq!(l.atomic() % 8, 0, "size {size}");
            assert_eq!(l.total(), l.atomic() + 8);
        }
    }

    #[test]
    fn every_step_fits_both_buffers() {
        for size in [0, 1, 8192, 100_000] {
            let base = 0x7f00_0000_0000;
            let server = Layout { size };
            let steps = story(size, base, 0x135);
            let names: Vec<_> = steps.iter().map(|s| s.name).collect();
            assert_eq!(
                names,
                [
                    "SEND",
                    "SEND_WITH_IMM",
                    "RDMA_WRITE",
                    "RDMA_WRITE_WITH_IMM",
                    "RDMA_READ",
                    "FETCH_ADD",
                    "CMP_SWAP"
                ]
            );
            for step in &steps {
                assert!(step.offset + step.len <= client_len(size), "{}", step.name);
                let (remote, len) = match step.op {
                    WrOp::Write { remote_addr, .. }
                    | WrOp::WriteWithImm { remote_addr, .. }
                    | WrOp::Read { remote_addr, .. } => (remote_addr, step.len),
                    WrOp::FetchAdd { remote_addr, .. } | WrOp::CompareSwap { remote_addr, .. } => {
                        assert_eq!(remote_addr % 8, 0, "{}", step.name);
                        (remote_addr, 8)
                    }
                    _ => continue,
                };
                assert!(remote >= base && remote - base + len as u64 <= server.total() as u64);
            }
        }
    }

    #[test]
    fn trace_lines_are_dump_lines_with_middle_runs_folded() {
        // rxe's ib_write_bw: TCP set-up frames, then 4 KiB WRITEs as FIRST, 2 x MIDDLE, LAST.
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/rxe_write_bw.pcap"
        );
        let captured = xroce::capture::read_capture(path).unwrap();
        let sender = "198.18.0.12";
        let t0 = captured[0].timestamp;
        let frames: Vec<TracedFrame> = captured
            .iter()
            .map(|c| TracedFrame {
                at: c.timestamp - t0 + Duration::from_secs(5),
                outgoing: parse_frame(&c.data).map_or(true, |p| match p.repr.ip {
                    xroce::wire::IpRepr::V4 { src, .. } => src.to_string() == sender,
                    xroce::wire::IpRepr::V6 { .. } => false,
                }),
                bytes: c.data.clone(),
            })
            .collect();
        let lines = trace_lines(&frames);
        let mut number = 1;
        let mut folded = 0;
        for line in &lines {
            let (arrow, rest) = line.split_once(' ').unwrap();
            let f = &frames[number - 1];
            assert_eq!(arrow, if f.outgoing { "→" } else { "←" }, "{line}");
            if let Some((range, _)) = rest.split_once(' ').filter(|(r, _)| r.contains("..")) {
                let run = number..=(number + 1);
                assert_eq!(range, format!("#{}..#{}", run.start(), run.end()), "{line}");
                assert!(
                    rest.contains(" 2 x RC_RDMA_WRITE_MIDDLE  qp=0x13 psn="),
                    "{line}"
                );
                folded += 1;
                number += 2;
                continue;
            }
            match parse_frame(&f.bytes) {
                Ok(p) => {
                    let rel = f.at - frames[0].at;
                    assert_eq!(rest, frame_line(number, rel, &p).trim_end());
                }
                Err(_) => assert_eq!(
                    rest,
                    format!("#{number:<5} (not a RoCE frame, {} bytes)", f.bytes.len())
                ),
            }
            number += 1;
        }
        assert_eq!(number - 1, frames.len(), "every frame is on a line");
        // 20 WRITEs of two MIDDLEs each; in 4 of them an ACK or a TCP segment comes between
        // the two (as `xroce dump` of the file shows), so those stay two lines.
        assert_eq!(folded, 16);
        assert!(lines
            .iter()
            .any(|l| l.starts_with("← ") && l.contains("RC_ACKNOWLEDGE")));
        assert!(lines
            .iter()
            .any(|l| l.starts_with("→ ") && l.contains("RC_RDMA_WRITE_FIRST")));
    }

    #[test]
    fn patterns_differ_by_seed_and_requests_keep_their_json() {
        assert_ne!(pattern(64, 1), pattern(64, 2));
        assert_eq!(pattern(300, 3).len(), 300);
        let line = serde_json::to_string(&Request::CheckRecv {
            seed: 5,
            len: 8,
            imm: Some(7),
            opcode: RecvKind::RecvRdmaWithImm,
            offset: 16,
        })
        .unwrap();
        assert_eq!(
            line,
            r#"{"cmd":"check_recv","seed":5,"len":8,"imm":7,"opcode":"recv_rdma_with_imm","offset":16}"#
        );
        assert_eq!(
            serde_json::to_string(&Request::Done).unwrap(),
            r#"{"cmd":"done"}"#
        );
    }
}
