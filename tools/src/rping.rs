//! `xroce rping`'s logic: librdmacm's `rping` (rdma-core `librdmacm/examples/rping.c`) on
//! [`xroce::rdmacm`]: the same options, the same exchange on the wire, the same `-v` lines,
//! so it interoperates with the C rping on rxe (or on xroce) either way round.
//!
//! One ping, as rping does it (every message is a SEND of the 16-byte `rping_rdma_info`
//! {be64 buf, be32 rkey, be32 size}):
//! 1. the client advertises its start buffer (the ASCII ping);
//! 2. the server RDMA READs it, prints `server ping data: ...` and SENDs a go-ahead;
//! 3. the client advertises its sink buffer;
//! 4. the server RDMA WRITEs the ping back into it and SENDs a go-ahead;
//! 5. the client compares (`-V`) and prints `ping data: ...`.
//!
//! After `-C` pings the client disconnects; the server sees DISCONNECTED and exits (with
//! `-P` it serves the next client; clients are served at once, one thread each).
//!
//! The command's arguments are in `tools/src/cli/rping.rs`; this is everything it does.
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::setup;
use anyhow::{anyhow, bail, Context as _};
use xroce::netdev::{self, NetdevInfo};
use xroce::rdmacm::{
    Cm, CmId, ConnParam, EventChannel, EventKind, PortSpace, RdmaCmError, RdmaCmEvent,
};
use xroce::verbs::{
    Access, CompletionChannel, Cq, Mr, Pd, Qp, QpAttr, QpAttrMask, QpCaps, QpInitAttr, QpState,
    RecvWr, SendFlags, SendWr, VerbsError, Wc, WcOpcode, WcStatus, WrOp,
};

/// rping's `RPING_BUFSIZE`: a ping is at most this minus one byte.
pub const RPING_BUFSIZE: usize = 64 * 1024;
/// rping's `RPING_MIN_BUFSIZE` as Debian's rping computes it (the message of `-S 1`).
pub const RPING_MIN_BUFSIZE: usize = 23;
/// rping's `RPING_SQ_DEPTH`.
const RPING_SQ_DEPTH: u32 = 16;
/// `struct rping_rdma_info`.
const INFO_LEN: usize = 16;
/// rping's port.
pub const DEFAULT_PORT: u16 = 7174;
/// rping's timeout of rdma_resolve_addr and rdma_resolve_route.
const RESOLVE_TIMEOUT: Duration = Duration::from_millis(2000);
/// At most how long the client waits for the DREP after its DREQ: the CM resends an
/// unanswered DREQ (IBTA 12.9.6) and reports DISCONNECTED when it gives up; a process that
/// exited at once would take the resends with it, and a server that never sees the DREQ
/// waits forever (the kernel's CM goes on resending after rping exits; ours cannot).
const DISCONNECT_WAIT: Duration = Duration::from_secs(60);
/// How long the server stays after its DREP: the frame is posted, not yet on the wire.
const LINGER: Duration = Duration::from_millis(200);

/// Settings every connection uses (rping's `-C`, `-S`, `-v`, `-V`, `-d`, `-q`, `-t`).
#[derive(Clone, Debug)]
pub struct RpingOptions {
    /// Pings per connection (0: forever).
    pub count: u64,
    /// Ping size in bytes.
    pub size: usize,
    /// Print the ping data.
    pub verbose: bool,
    /// Validate the ping data (client).
    pub validate: bool,
    /// Debug lines.
    pub debug: bool,
    /// Create and move the QP in the program instead of letting the CM do it.
    pub self_create_qp: bool,
    /// Type of service of the connection.
    pub tos: Option<u8>,
}

impl RpingOptions {
    /// rping's own checks of `-S` and `-C`, with its messages.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.size < RPING_MIN_BUFSIZE || self.size > RPING_BUFSIZE - 1 {
            bail!(
                "Invalid size {} (valid range is {RPING_MIN_BUFSIZE} to {RPING_BUFSIZE})",
                self.size
            );
        }
        if self.count > i32::MAX as u64 {
            bail!("Invalid count {}", self.count);
        }
        Ok(())
    }

    /// Prints a debug line (`-d`).
    pub fn debug(&self, line: impl FnOnce() -> String) {
        if self.debug {
            println!("{}", line());
        }
    }
}

/// An address or host name (rping's getaddrinfo).
pub fn resolve_host(text: &str) -> anyhow::Result<IpAddr> {
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok(ip);
    }
    (text, 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut it| it.next())
        .map(|sa| sa.ip())
        .ok_or_else(|| anyhow!("getaddrinfo failed ({text}) - invalid hostname or IP address"))
}

/// The interface to open: the named one, else the one holding `local`, else the one the
/// route to `dest` leaves by, else the first up with an IPv4 address.
pub fn pick_interface(
    typed: Option<&str>,
    local: Option<IpAddr>,
    dest: Option<IpAddr>,
) -> anyhow::Result<NetdevInfo> {
    if typed.is_some() {
        return setup::pick_device(typed);
    }
    let all: Vec<NetdevInfo> = netdev::list()?
        .iter()
        .filter_map(|n| netdev::query(n).ok())
        .collect();
    if let Some(ip) = local {
        return all
            .into_iter()
            .find(|i| i.addrs.iter().any(|a| a.ip == ip))
            .ok_or_else(|| anyhow!("no interface here has the address {ip}; pick one with -D"));
    }
    if let Some(ip) = dest {
        let route = netdev::route_to(ip).map_err(|e| anyhow!("no route to {ip}: {e}"))?;
        if let Some(info) = all
            .into_iter()
            .find(|i| i.ifindex == route.oif && i.name != "lo")
        {
            return Ok(info);
        }
    }
    setup::pick_device(None)
}

// ---------------------------------------------------------------------------------------------
// What the threads report: completions and CM events in one queue (rping's semaphore)
// ---------------------------------------------------------------------------------------------

enum Happening {
    Wc(Wc),
    Cm(RdmaCmEvent),
    Failed(String),
}

/// Threads that move the CQ's completions and the channel's events into one queue; stopped
/// and joined on drop.
struct Pump {
    tx: mpsc::Sender<Happening>,
    rx: mpsc::Receiver<Happening>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// Completions that came while an event was awaited, and the other way round.
    early: VecDeque<Happening>,
}

const PUMP_TICK: Duration = Duration::from_millis(100);

impl Pump {
    fn new() -> Pump {
        let (tx, rx) = mpsc::channel();
        Pump {
            tx,
            rx,
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
            early: VecDeque::new(),
        }
    }

    fn events(&mut self, channel: &EventChannel) -> anyhow::Result<()> {
        let (tx, stop, channel) = (self.tx.clone(), self.stop.clone(), channel.clone());
        self.threads
            .push(
                std::thread::Builder::new()
                    .name("rping-cm".into())
                    .spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            match channel.get_event(Some(PUMP_TICK)) {
                                Ok(e) => {
                                    if tx.send(Happening::Cm(e)).is_err() {
                                        return;
                                    }
                                }
                                Err(RdmaCmError::Timeout(_)) => {}
                                Err(e) => {
                                    let _ = tx
                                        .send(Happening::Failed(format!("rdma_get_cm_event: {e}")));
                                    return;
                                }
                            }
                        }
                    })?,
            );
        Ok(())
    }

    /// rping's cq_thread: arm, poll everything, sleep on the channel.
    fn completions(&mut self, cq: &Cq, comp: &CompletionChannel) -> anyhow::Result<()> {
        let (tx, stop, cq, comp) = (self.tx.clone(), self.stop.clone(), cq.clone(), comp.clone());
        self.threads
            .push(
                std::thread::Builder::new()
                    .name("rping-cq".into())
                    .spawn(move || {
                        let fail = |e: VerbsError| {
                            let _ = tx.send(Happening::Failed(format!("CQ: {e}")));
                        };
                        if let Err(e) = cq.req_notify(false) {
                            return fail(e);
                        }
                        while !stop.load(Ordering::Relaxed) {
                            loop {
                                match cq.poll_one() {
                                    Ok(Some(wc)) => {
                                        if tx.send(Happening::Wc(wc)).is_err() {
                                            return;
                                        }
                                    }
                                    Ok(None) => break,
                                    Err(e) => return fail(e),
                                }
                            }
                            match comp.get_cq_event(Some(PUMP_TICK)) {
                                Ok(_) => {
                                    if let Err(e) = cq.req_notify(false) {
                                        return fail(e);
                                    }
                                }
                                Err(VerbsError::Timeout(_)) => {}
                                Err(e) => return fail(e),
                            }
                        }
                    })?,
            );
        Ok(())
    }

    fn next(&mut self, timeout: Option<Duration>) -> anyhow::Result<Option<Happening>> {
        if let Some(h) = self.early.pop_front() {
            return Ok(Some(h));
        }
        let got = match timeout {
            None => self.rx.recv().ok(),
            Some(t) => match self.rx.recv_timeout(t) {
                Ok(h) => Some(h),
                Err(mpsc::RecvTimeoutError::Timeout) => return Ok(None),
                Err(mpsc::RecvTimeoutError::Disconnected) => None,
            },
        };
        got.map(Some)
            .ok_or_else(|| anyhow!("the event threads stopped"))
    }
}

impl Drop for Pump {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Why a wait ended without what it waited for.
#[derive(Debug)]
enum Stop {
    /// The peer disconnected (rping's DISCONNECTED state).
    Disconnected,
    Error(anyhow::Error),
}

impl From<anyhow::Error> for Stop {
    fn from(e: anyhow::Error) -> Stop {
        Stop::Error(e)
    }
}

impl From<VerbsError> for Stop {
    fn from(e: VerbsError) -> Stop {
        Stop::Error(e.into())
    }
}

impl From<RdmaCmError> for Stop {
    fn from(e: RdmaCmError) -> Stop {
        Stop::Error(e.into())
    }
}

fn is_error_event(kind: EventKind) -> bool {
    matches!(
        kind,
        EventKind::AddrError
            | EventKind::RouteError
            | EventKind::ConnectError
            | EventKind::Unreachable
            | EventKind::Rejected
    )
}

/// One side's view of its queue: waits for an event or a completion of a kind, as rping's
/// main threads wait on the semaphore its CM and CQ threads post.
struct Waiter<'a> {
    pump: Pump,
    opts: &'a RpingOptions,
    server: bool,
    /// The id whose events count (the listener's other requests are not this waiter's).
    id: Option<CmId>,
}

impl Waiter<'_> {
    fn side(&self) -> &'static str {
        if self.server {
            "server"
        } else {
            "client"
        }
    }

    /// A CM event that is not the one awaited: an error ends the wait, DISCONNECTED too.
    fn other_event(&self, e: &RdmaCmEvent) -> Result<(), Stop> {
        self.opts.debug(|| {
            format!(
                "cma_event type {} cma_id {} ({})",
                e.kind.name(),
                e.id.key(),
                if self.server { "child" } else { "parent" }
            )
        });
        if is_error_event(e.kind) {
            eprintln!("cma event {}, error {}", e.kind.name(), e.status);
            return Err(Stop::Error(anyhow!(
                "{}{}",
                e.kind.name(),
                event_reason(e.kind, e.status)
            )));
        }
        match e.kind {
            EventKind::Disconnected => {
                eprintln!("{} DISCONNECT EVENT...", self.side());
                Err(Stop::Disconnected)
            }
            EventKind::DeviceRemoval => {
                eprintln!("cma detected device removal!!!!");
                Err(Stop::Error(anyhow!("device removed")))
            }
            EventKind::Established | EventKind::ConnectResponse => Ok(()),
            kind => {
                eprintln!("unhandled event: {}, ignoring", kind.name());
                Ok(())
            }
        }
    }

    fn wait_event(&mut self, kind: EventKind) -> Result<RdmaCmEvent, Stop> {
        let mut held = VecDeque::new();
        let result = loop {
            match self.pump.next(None)? {
                Some(Happening::Cm(e)) => {
                    if self.id.as_ref().is_some_and(|id| *id != e.id) {
                        continue;
                    }
                    if e.kind == kind {
                        self.opts.debug(|| {
                            format!("cma_event type {} cma_id {}", e.kind.name(), e.id.key())
                        });
                        break Ok(e);
                    }
                    if let Err(stop) = self.other_event(&e) {
                        break Err(stop);
                    }
                }
                Some(Happening::Wc(wc)) => held.push_back(Happening::Wc(wc)),
                Some(Happening::Failed(why)) => break Err(Stop::Error(anyhow!(why))),
                None => {}
            }
        };
        // Completions that came first are the next waits'.
        held.extend(self.pump.early.drain(..));
        self.pump.early = held;
        result
    }

    /// The next successful completion of `opcode`; SEND completions and flushed WRs pass.
    fn wait_wc(&mut self, opcode: WcOpcode) -> Result<Wc, Stop> {
        loop {
            match self.pump.next(None)? {
                Some(Happening::Wc(wc)) => {
                    if wc.status == WcStatus::WrFlushErr {
                        continue;
                    }
                    if wc.status != WcStatus::Success {
                        eprintln!("cq completion failed status {}", wc.status.code());
                        return Err(Stop::Error(anyhow!(
                            "{:?} completion: {}",
                            wc.opcode,
                            wc.status.as_str()
                        )));
                    }
                    match wc.opcode {
                        op if op == opcode => return Ok(wc),
                        WcOpcode::Send => self.opts.debug(|| "send completion".into()),
                        op => {
                            return Err(Stop::Error(anyhow!(
                                "a {op:?} completion while waiting for {opcode:?}"
                            )))
                        }
                    }
                }
                Some(Happening::Cm(e)) if self.id.as_ref().is_none_or(|id| *id == e.id) => {
                    self.other_event(&e)?;
                }
                Some(Happening::Failed(why)) => return Err(Stop::Error(anyhow!(why))),
                Some(Happening::Cm(_)) | None => {}
            }
        }
    }
}

/// What a REJ reason or errno means, for the error line.
fn event_reason(kind: EventKind, status: i32) -> String {
    match (kind, status) {
        (EventKind::Rejected, 8) => {
            " (REJ reason 8, invalid service ID: nobody listens on that port)".into()
        }
        (EventKind::Rejected, 28) => " (REJ reason 28, consumer defined)".into(),
        (EventKind::Rejected, r) => format!(" (REJ reason {r}, IBTA 12.6.7 table 112)"),
        (_, s) if s < 0 => format!(" ({})", std::io::Error::from_raw_os_error(-s)),
        _ => String::new(),
    }
}

// ---------------------------------------------------------------------------------------------
// The connection's verbs objects (rping_setup_qp, rping_setup_buffers)
// ---------------------------------------------------------------------------------------------

struct Resources {
    qp: Qp,
    cq: Cq,
    comp: CompletionChannel,
    _pd: Pd,
    recv_mr: Mr,
    send_mr: Mr,
    /// RDMA sink (client) / READ target and WRITE source (server).
    rdma_mr: Mr,
    /// The ping the server READs (client only).
    start_mr: Option<Mr>,
}

const WR_RECV: u64 = 1;
const WR_SEND: u64 = 2;
const WR_RDMA: u64 = 3;

impl Resources {
    fn new(id: &CmId, opts: &RpingOptions, server: bool) -> anyhow::Result<Resources> {
        let device = id.device().ok_or_else(|| anyhow!("the id has no device"))?;
        let pd = device.alloc_pd()?;
        let comp = device.create_comp_channel()?;
        let cq = device.create_cq(RPING_SQ_DEPTH * 2, Some(&comp))?;
        let init = QpInitAttr {
            cap: QpCaps {
                max_send_wr: RPING_SQ_DEPTH,
                max_recv_wr: 2,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
            ..QpInitAttr::rc(&cq, &cq)
        };
        let qp = if opts.self_create_qp {
            // rping -q: the program's own QP, in INIT, announced by number.
            let qp = pd.create_qp(&init)?;
            let attr = QpAttr {
                qp_state: QpState::Init,
                pkey_index: 0,
                port_num: 1,
                qp_access_flags: Access::empty(),
                ..QpAttr::default()
            };
            qp.modify(
                &attr,
                QpAttrMask::STATE
                    | QpAttrMask::PKEY_INDEX
                    | QpAttrMask::PORT
                    | QpAttrMask::ACCESS_FLAGS,
            )?;
            qp
        } else {
            id.create_qp(&pd, &init)?
        };
        opts.debug(|| format!("created qp {:#x}", qp.qp_num()));
        let remote = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        let recv_mr = pd.reg_mr(INFO_LEN, Access::LOCAL_WRITE)?;
        let send_mr = pd.reg_mr(INFO_LEN, Access::empty())?;
        let rdma_mr = pd.reg_mr(opts.size, remote)?;
        let start_mr = if server {
            None
        } else {
            Some(pd.reg_mr(opts.size, remote)?)
        };
        opts.debug(|| "allocated & registered buffers...".into());
        Ok(Resources {
            qp,
            cq,
            comp,
            _pd: pd,
            recv_mr,
            send_mr,
            rdma_mr,
            start_mr,
        })
    }

    fn post_recv(&self) -> anyhow::Result<()> {
        self.qp.post_recv(&RecvWr {
            wr_id: WR_RECV,
            sg_list: vec![self.recv_mr.sge_all()],
        })?;
        Ok(())
    }

    /// SENDs the send buffer (the advertisement, or the server's go-ahead).
    fn post_send(&self) -> anyhow::Result<()> {
        self.qp
            .post_send(&SendWr {
                wr_id: WR_SEND,
                op: WrOp::Send,
                sg_list: vec![self.send_mr.sge_all()],
                flags: SendFlags::SIGNALED,
                ud: None,
            })
            .map_err(|e| anyhow!("post send error: {e}"))
    }

    /// rping_format_send: advertise `mr` (whole: rping sends its own -S as the size).
    fn format_send(&self, mr: &Mr, size: usize, opts: &RpingOptions) -> anyhow::Result<()> {
        let mut info = [0u8; INFO_LEN];
        info[..8].copy_from_slice(&mr.addr().to_be_bytes());
        info[8..12].copy_from_slice(&mr.rkey().to_be_bytes());
        info[12..].copy_from_slice(&(size as u32).to_be_bytes());
        opts.debug(|| format!("RDMA addr {:x} rkey {:x} len {size}", mr.addr(), mr.rkey()));
        self.send_mr.write(0, &info)?;
        Ok(())
    }

    /// A RECV completed: the peer's advertisement (rping's server_recv / client_recv).
    fn received(&self, wc: &Wc) -> Result<(u64, u32, u32), Stop> {
        if wc.byte_len as usize != INFO_LEN {
            eprintln!("Received bogus data, size {}", wc.byte_len);
            return Err(Stop::Error(anyhow!(
                "received {} bytes, not a 16-byte rping_rdma_info",
                wc.byte_len
            )));
        }
        let mut info = [0u8; INFO_LEN];
        self.recv_mr.read(0, &mut info)?;
        // Re-post at once, as rping's CQ handler does, before the peer's next SEND.
        self.post_recv()?;
        Ok((
            u64::from_be_bytes(info[..8].try_into().expect("8 bytes")),
            u32::from_be_bytes(info[8..12].try_into().expect("4 bytes")),
            u32::from_be_bytes(info[12..].try_into().expect("4 bytes")),
        ))
    }

    /// rping -q: the program moves its QP with the CM's attributes.
    fn self_modify(&self, id: &CmId) -> anyhow::Result<()> {
        for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
            let (attr, mask) = id.init_qp_attr(state)?;
            self.qp
                .modify(&attr, mask)
                .with_context(|| format!("moving the QP to {state:?}"))?;
        }
        Ok(())
    }

    fn conn_param(&self, opts: &RpingOptions) -> ConnParam {
        ConnParam {
            qp_num: if opts.self_create_qp {
                self.qp.qp_num()
            } else {
                0
            },
            ..ConnParam::default()
        }
    }

    /// rping_disconnect.
    fn disconnect(&self, id: &CmId, opts: &RpingOptions) -> anyhow::Result<()> {
        if opts.self_create_qp {
            let attr = QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            };
            self.qp.modify(&attr, QpAttrMask::STATE)?;
        }
        id.disconnect()?;
        Ok(())
    }
}

/// The text of a C string in `bytes` (up to the first NUL), as rping's `%s` prints it.
fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// The client's ping number `ping` (rping_test_client): "rdma-ping-N: " and then the
/// letters A..z from `start`, wrapping, NUL-terminated at `size - 1`.
pub fn ping_payload(ping: u64, start: u8, size: usize) -> Vec<u8> {
    let mut buf = format!("rdma-ping-{ping}: ").into_bytes();
    // snprintf truncates to size - 1 characters.
    buf.truncate(size - 1);
    let mut c = start;
    while buf.len() < size {
        buf.push(c);
        c += 1;
        if c > 122 {
            c = 65;
        }
    }
    buf[size - 1] = 0;
    buf
}

// ---------------------------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------------------------

pub fn run_server(
    cm: &Cm,
    addr: SocketAddr,
    persistent: bool,
    opts: &RpingOptions,
) -> anyhow::Result<()> {
    let channel = EventChannel::new()?;
    let listen = cm.create_id(&channel, PortSpace::Tcp)?;
    opts.debug(|| format!("created cm_id {}", listen.key()));
    if let Some(tos) = opts.tos {
        listen.set_tos(tos);
    }
    listen
        .bind_addr(addr)
        .map_err(|e| anyhow!("rdma_bind_addr: {e}"))?;
    opts.debug(|| "rdma_bind_addr successful".into());
    opts.debug(|| "rdma_listen".into());
    listen.listen(3).map_err(|e| anyhow!("rdma_listen: {e}"))?;
    let result = loop {
        let event = match channel.get_event(None) {
            Ok(e) => e,
            Err(e) => break Err(anyhow!("rdma_get_cm_event: {e}")),
        };
        if event.kind != EventKind::ConnectRequest {
            eprintln!("unhandled event: {}, ignoring", event.kind.name());
            continue;
        }
        let child = event.id;
        opts.debug(|| format!("child cma {}", child.key()));
        // The connection's events go to a channel of its own: the listener's stays for
        // the next requests (-P).
        let conn_channel = match EventChannel::new() {
            Ok(c) => c,
            Err(e) => break Err(e.into()),
        };
        child.migrate(&conn_channel);
        if persistent {
            let opts = opts.clone();
            let spawned = std::thread::Builder::new()
                .name("rping-conn".into())
                .spawn(move || {
                    if let Err(e) = serve(&child, &conn_channel, &opts) {
                        eprintln!("xroce rping: connection failed: {e:#}");
                    }
                    child.destroy();
                });
            if let Err(e) = spawned {
                break Err(e.into());
            }
            continue;
        }
        let r = serve(&child, &conn_channel, opts).map_err(|e| e.context("rping server failed"));
        child.destroy();
        break r;
    };
    opts.debug(|| format!("destroy cm_id {}", listen.key()));
    listen.destroy();
    result
}

/// One connection of the server: accept, then ping after ping until DISCONNECTED.
fn serve(child: &CmId, channel: &EventChannel, opts: &RpingOptions) -> anyhow::Result<()> {
    let res = Resources::new(child, opts, true)?;
    let mut pump = Pump::new();
    pump.events(channel)?;
    pump.completions(&res.cq, &res.comp)?;
    let mut w = Waiter {
        pump,
        opts,
        server: true,
        id: Some(child.clone()),
    };
    res.post_recv()?;
    opts.debug(|| "accepting client connection request".into());
    if opts.self_create_qp {
        res.self_modify(child)?;
    }
    child
        .accept(&res.conn_param(opts))
        .map_err(|e| anyhow!("rdma_accept: {e}"))?;
    let outcome = match w.wait_event(EventKind::Established) {
        Ok(_) => server_loop(&mut w, &res, opts),
        Err(stop) => Err(stop),
    };
    let result = match outcome {
        Ok(()) | Err(Stop::Disconnected) => Ok(()),
        Err(Stop::Error(e)) => Err(e),
    };
    // After the client's DREQ this sends the DREP (IBTA 12.9.6), as rping's
    // rping_disconnect does; then a moment for the frame to leave.
    let _ = res.disconnect(child, opts);
    std::thread::sleep(LINGER);
    result
}

/// rping_test_server.
fn server_loop(w: &mut Waiter<'_>, res: &Resources, opts: &RpingOptions) -> Result<(), Stop> {
    loop {
        // The client's start buffer.
        let wc = w.wait_wc(WcOpcode::Recv)?;
        let (addr, rkey, len) = res.received(&wc)?;
        opts.debug(|| format!("Received rkey {rkey:x} addr {addr:x} len {len} from peer"));
        if len as usize > opts.size {
            return Err(Stop::Error(anyhow!(
                "the client's ping is {len} bytes, more than this server's -S {}",
                opts.size
            )));
        }
        res.qp
            .post_send(&SendWr {
                wr_id: WR_RDMA,
                op: WrOp::Read {
                    remote_addr: addr,
                    rkey,
                },
                sg_list: vec![res.rdma_mr.sge(0, len)?],
                flags: SendFlags::SIGNALED,
                ud: None,
            })
            .map_err(|e| anyhow!("post send error: {e}"))?;
        opts.debug(|| "server posted rdma read req ".into());
        w.wait_wc(WcOpcode::RdmaRead)?;
        opts.debug(|| "server received read complete".into());
        let data = res.rdma_mr.to_vec(0, opts.size)?;
        let text = c_string(&data);
        if opts.verbose {
            println!("server ping data: {text}");
        }
        // Go ahead: the client advertises its sink.
        res.post_send()?;
        opts.debug(|| "server posted go ahead".into());
        let wc = w.wait_wc(WcOpcode::Recv)?;
        let (addr, rkey, _len) = res.received(&wc)?;
        opts.debug(|| "server received sink adv".into());
        // Echo: strlen + 1 bytes, as rping writes.
        let echo = (text.len() + 1).min(opts.size) as u32;
        res.qp
            .post_send(&SendWr {
                wr_id: WR_RDMA,
                op: WrOp::Write {
                    remote_addr: addr,
                    rkey,
                },
                sg_list: vec![res.rdma_mr.sge(0, echo)?],
                flags: SendFlags::SIGNALED,
                ud: None,
            })
            .map_err(|e| anyhow!("post send error: {e}"))?;
        w.wait_wc(WcOpcode::RdmaWrite)?;
        opts.debug(|| "server rdma write complete ".into());
        res.post_send()?;
        opts.debug(|| "server posted go ahead".into());
    }
}

// ---------------------------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------------------------

pub fn run_client(
    cm: &Cm,
    source: Option<SocketAddr>,
    dst: SocketAddr,
    opts: &RpingOptions,
) -> anyhow::Result<()> {
    let channel = EventChannel::new()?;
    let id = cm.create_id(&channel, PortSpace::Tcp)?;
    opts.debug(|| format!("created cm_id {}", id.key()));
    if let Some(tos) = opts.tos {
        id.set_tos(tos);
    }
    let mut pump = Pump::new();
    pump.events(&channel)?;
    let mut w = Waiter {
        pump,
        opts,
        server: false,
        id: Some(id.clone()),
    };
    let result = client(&id, &mut w, source, dst, opts);
    drop(w);
    opts.debug(|| format!("destroy cm_id {}", id.key()));
    id.destroy();
    result
}

fn stop_to_error(stop: Stop, what: &str) -> anyhow::Error {
    match stop {
        Stop::Error(e) => e.context(what.to_string()),
        Stop::Disconnected => anyhow!("{what}: the server disconnected"),
    }
}

fn client(
    id: &CmId,
    w: &mut Waiter<'_>,
    source: Option<SocketAddr>,
    dst: SocketAddr,
    opts: &RpingOptions,
) -> anyhow::Result<()> {
    // rping_bind_client.
    id.resolve_addr(source, dst, RESOLVE_TIMEOUT)
        .map_err(|e| anyhow!("rdma_resolve_addr: {e}"))?;
    let resolve = |w: &mut Waiter<'_>| -> Result<(), Stop> {
        w.wait_event(EventKind::AddrResolved)?;
        id.resolve_route(RESOLVE_TIMEOUT)
            .map_err(|e| anyhow!("rdma_resolve_route: {e}"))?;
        w.wait_event(EventKind::RouteResolved)?;
        Ok(())
    };
    resolve(w).map_err(|s| stop_to_error(s, &format!("resolving {dst}")))?;
    opts.debug(|| "rdma_resolve_addr - rdma_resolve_route successful".into());

    let res = Resources::new(id, opts, false)?;
    w.pump.completions(&res.cq, &res.comp)?;
    res.post_recv()?;

    // rping_connect_client.
    id.connect(&res.conn_param(opts))
        .map_err(|e| anyhow!("rdma_connect: {e}"))?;
    let connected = if opts.self_create_qp {
        w.wait_event(EventKind::ConnectResponse).and_then(|_| {
            res.self_modify(id)?;
            id.establish().map_err(|e| anyhow!("rdma_establish: {e}"))?;
            Ok(())
        })
    } else {
        w.wait_event(EventKind::Established).map(|_| ())
    };
    connected.map_err(|s| stop_to_error(s, &format!("connect error (to {dst})")))?;
    opts.debug(|| "rdma_connect successful".into());

    let pinged = client_loop(w, &res, opts);
    // rping_disconnect, then the DREP (or the server's own DREQ): a lost DREQ is resent.
    let _ = res.disconnect(id, opts);
    if !matches!(pinged, Err(Stop::Disconnected)) {
        wait_disconnected(w);
    }
    pinged.map_err(|s| stop_to_error(s, "rping client failed"))
}

/// Waits (bounded) for the DISCONNECTED that follows our DREQ.
fn wait_disconnected(w: &mut Waiter<'_>) {
    let deadline = std::time::Instant::now() + DISCONNECT_WAIT;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return;
        }
        match w.pump.next(Some(left)) {
            Ok(Some(Happening::Cm(e))) if e.kind == EventKind::Disconnected => {
                eprintln!("client DISCONNECT EVENT...");
                return;
            }
            Ok(Some(_)) => {}
            _ => return,
        }
    }
}

/// rping_test_client.
fn client_loop(w: &mut Waiter<'_>, res: &Resources, opts: &RpingOptions) -> Result<(), Stop> {
    let start_mr = res
        .start_mr
        .as_ref()
        .expect("the client has a start buffer");
    let mut start = 65u8;
    let mut ping = 0u64;
    while opts.count == 0 || ping < opts.count {
        let payload = ping_payload(ping, start, opts.size);
        start += 1;
        if start > 122 {
            start = 65;
        }
        start_mr.write(0, &payload)?;
        res.format_send(start_mr, opts.size, opts)?;
        res.post_send()?;
        // The server READ the ping.
        let wc = w.wait_wc(WcOpcode::Recv)?;
        res.received(&wc)?;
        res.format_send(&res.rdma_mr, opts.size, opts)?;
        res.post_send()?;
        // The server WROTE it back.
        let wc = w.wait_wc(WcOpcode::Recv)?;
        res.received(&wc)?;
        let echoed = res.rdma_mr.to_vec(0, opts.size)?;
        if opts.validate && echoed != payload {
            eprintln!("data mismatch!");
            return Err(Stop::Error(anyhow!("ping {ping}: data mismatch")));
        }
        if opts.verbose {
            println!("ping data: {}", c_string(&echoed));
        }
        ping += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_is_rpings() {
        // rping -S 30, ping 0: "rdma-ping-0: " then A.. up to size - 1, then NUL.
        let p = ping_payload(0, 65, 30);
        assert_eq!(&p[..], b"rdma-ping-0: ABCDEFGHIJKLMNOP\0");
        // The letters wrap after 'z' (122) to 'A'.
        let p = ping_payload(7, 120, 20);
        assert_eq!(&p[..], b"rdma-ping-7: xyzABC\0");
        assert_eq!(c_string(&p), "rdma-ping-7: xyzABC");
    }

    #[test]
    fn payload_shorter_than_the_prefix_is_truncated() {
        let p = ping_payload(123456, 65, 23);
        assert_eq!(p.len(), 23);
        assert_eq!(&p[..], b"rdma-ping-123456: ABCD\0");
    }
}
