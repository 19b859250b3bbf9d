//! perftest's `-R` (`--rdma_cm`) over [`xroce::rdmacm`]: the side channel and the test QPs
//! connected through rdma_cm, as perftest 4.5-0.17 does it.
//!
//! `-R` sets perftest's `use_rdma_cm` too, so there is no TCP at all: the exchange of
//! [`crate::perftest::oob`] runs over a first rdma_cm connection on the test's port
//! (RDMA_PS_TCP, service id 0x1060000 + port), one RC SEND per message
//! (`rdma_write_data`/`rdma_read_data`), the QP addresses as the binary
//! `struct pingpong_dest` ([`crate::perftest::oob::PerftestDest::encode_binary`]).
//! Then `create_rdma_cm_connection` connects the test QPs, one id per QP, on the same port:
//!
//! | perftest (client / server) | here |
//! |---|---|
//! | `rdma_resolve_addr` per id, 2000 ms / `rdma_bind_addr(0.0.0.0:port)`, `rdma_listen(q)` | [`CmQps::connect`]: one id at a time, each ESTABLISHED before the next (see `try_client`) / [`CmQps::new`]: listening before the sync rounds end, so no REQ is early |
//! | ADDR_RESOLVED: `rdma_resolve_route(2000)` | the same |
//! | ROUTE_RESOLVED: `rdma_create_qp` on the id, `rdma_connect` / CONNECT_REQUEST: `rdma_accept` | [`CmId::attach_qp`] of the next test QP, connect / accept |
//! | `responder_resources = initiator_depth = out_reads` (READ, atomics; else 0), `retry_count = rnr_retry_count = 7` | [`ConnParam`] |
//! | server: `ibv_modify_qp(MIN_RNR_TIMER 12)` after accept | the Cm's `min_rnr_timer` (12) |
//! | client: REJECTED (the server not listening yet): destroy the ids, 100 ms, again (10 times) | the same |
//! | teardown: `rdma_disconnect` per id, DISCONNECTED per id | [`CmQps::disconnect`] |

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::setup::OobStream;
use crate::setup::Role;
use xroce::rdmacm::{Cm, CmId, ConnParam, EventChannel, EventKind, PortSpace, RdmaCmEvent};
use xroce::verbs::{
    Access, CompletionChannel, Cq, Device, Mr, Pd, Qp, QpAttr, QpAttrMask, QpCaps, QpInitAttr,
    QpState, RecvWr, SendFlags, SendWr, VerbsError, Wc, WrOp,
};

/// perftest's 2000 ms for address and route resolution.
const RESOLVE_TIMEOUT: Duration = Duration::from_millis(2000);
/// Receives kept posted on the side channel, and their size (perftest posts one of
/// `sizeof(struct pingpong_dest)`; a larger buffer takes any message it sends).
const RECVS: usize = 4;
const RECV_LEN: usize = 512;
/// How long a CM step may take before the set-up fails.
const CM_STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// A client whose test QPs' connection is rejected asks again after this long, at least
/// [`REJECTED_MIN_TRIES`] times, as perftest does ...
const REJECTED_RETRY_DELAY: Duration = Duration::from_millis(100);
const REJECTED_MIN_TRIES: u32 = 10;
/// ... and for this long since the first rejection. perftest's server listens for the test
/// QPs only once its last sync message is acknowledged; when that ACK is lost, the message
/// comes again one local ACK timeout later (2.1 s at the CM's default exponent 19, 4.3 s at
/// 20), and only its new ACK lets the server listen: a client that stopped after perftest's
/// 1 s of tries failed a run that one lost frame only delayed (seen in the rxe lab over a
/// 1 %-loss link).
const REJECTED_PATIENCE: Duration = Duration::from_secs(10);

/// Whether a client rejected `tries + 1` times, the first `since` ago, asks again.
fn asks_again(tries: u32, since: Duration) -> bool {
    tries < REJECTED_MIN_TRIES || since < REJECTED_PATIENCE
}

fn wait_event(ch: &EventChannel, timeout: Duration) -> anyhow::Result<RdmaCmEvent> {
    ch.get_event(Some(timeout))
        .map_err(|e| anyhow::anyhow!("rdma_cm: {e}"))
}

fn event_error(e: &RdmaCmEvent, what: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "rdma_cm: {} (status {}) while {what}",
        e.kind.name(),
        e.status
    )
}

/// The `-R` side channel: an RC QP connected through rdma_cm, read and written as a stream
/// whose every `write` is one SEND and whose reads take the received messages in order.
pub struct CmStream {
    id: CmId,
    channel: EventChannel,
    _pd: Pd,
    qp: Qp,
    send_cq: Cq,
    recv_cq: Cq,
    /// `recv_cq` reports here: a reader waiting for the next message sleeps on it instead of
    /// polling, so the device's progress thread keeps running the test QPs meanwhile.
    recv_channel: CompletionChannel,
    mr: Mr,
    pending: Vec<u8>,
    read_bound: Option<Duration>,
    nonblocking: bool,
}

impl CmStream {
    /// The side channel's QP on `id`, its receives posted, as a stream.
    fn on_id(id: CmId, channel: EventChannel) -> anyhow::Result<Self> {
        let device = id
            .device()
            .context("rdma_cm: the id has no device after resolving")?;
        let pd = device.alloc_pd()?;
        let send_cq = device.create_cq(16, None)?;
        let recv_channel = device.create_comp_channel()?;
        let recv_cq = device.create_cq(16, Some(&recv_channel))?;
        let mut init = QpInitAttr::rc(&send_cq, &recv_cq);
        init.cap = QpCaps {
            max_send_wr: 4,
            max_recv_wr: RECVS as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = id.create_qp(&pd, &init)?;
        let mr = pd.reg_mr((RECVS + 1) * RECV_LEN, Access::LOCAL_WRITE)?;
        for slot in 0..RECVS {
            qp.post_recv(&RecvWr {
                wr_id: slot as u64,
                sg_list: vec![mr.sge(slot * RECV_LEN, RECV_LEN as u32)?],
            })?;
        }
        Ok(CmStream {
            id,
            channel,
            _pd: pd,
            qp,
            send_cq,
            recv_cq,
            recv_channel,
            mr,
            pending: Vec::new(),
            read_bound: None,
            nonblocking: false,
        })
    }

    fn conn_param() -> ConnParam {
        // perftest's comm context is a SEND test: no READs, 7 retries, RNR forever.
        ConnParam {
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            ..ConnParam::default()
        }
    }

    /// `rdma_client_connect`: resolve, route, QP, connect, ESTABLISHED. A REJECTED (the
    /// server is not listening yet) is tried again for up to `patience`.
    pub fn connect(cm: &Cm, host: &str, port: u16, patience: Duration) -> anyhow::Result<Self> {
        let ip: IpAddr = host
            .parse()
            .with_context(|| format!("-R needs the server's IP address, not {host:?}"))?;
        let dst = SocketAddr::new(ip, port);
        let started = Instant::now();
        loop {
            let channel = EventChannel::new()?;
            let id = cm.create_id(&channel, PortSpace::Tcp)?;
            id.resolve_addr(None, dst, RESOLVE_TIMEOUT)?;
            let e = wait_event(&channel, CM_STEP_TIMEOUT)?;
            if e.kind != EventKind::AddrResolved {
                return Err(event_error(&e, &format!("resolving {dst}")));
            }
            id.resolve_route(RESOLVE_TIMEOUT)?;
            let e = wait_event(&channel, CM_STEP_TIMEOUT)?;
            if e.kind != EventKind::RouteResolved {
                return Err(event_error(&e, &format!("resolving the route to {dst}")));
            }
            let stream = Self::on_id(id, channel)?;
            stream.id.connect(&Self::conn_param())?;
            let e = wait_event(&stream.channel, CM_STEP_TIMEOUT)?;
            match e.kind {
                EventKind::Established => return Ok(stream),
                EventKind::Rejected if started.elapsed() < patience => {
                    stream.id.destroy();
                    std::thread::sleep(Duration::from_millis(100));
                }
                _ => {
                    return Err(event_error(
                        &e,
                        &format!(
                            "connecting the side channel to {dst} (is the server running with -R?)"
                        ),
                    ))
                }
            }
        }
    }

    /// `rdma_server_connect`: listen on `port`, take one CONNECT_REQUEST, accept it, drop
    /// the listener (the test ids listen on the same port next). `listening` runs once the
    /// listener is up (to print perftest's banner then: a client may start from then on).
    pub fn accept(
        cm: &Cm,
        port: u16,
        listening: impl FnOnce() -> anyhow::Result<()>,
    ) -> anyhow::Result<Self> {
        let channel = EventChannel::new()?;
        let listen = cm.create_id(&channel, PortSpace::Tcp)?;
        listen.bind_addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port))?;
        listen.listen(1)?;
        listening()?;
        let e = channel.get_event(None)?;
        if e.kind != EventKind::ConnectRequest {
            return Err(event_error(&e, "waiting for the client's side channel"));
        }
        let stream = Self::on_id(e.id, channel)?;
        stream.id.accept(&Self::conn_param())?;
        listen.destroy();
        Ok(stream)
    }

    /// Takes the next received message into `pending`; false when none came in `limit`.
    ///
    /// Between polls it sleeps on the CQ's completion channel. Polling in a loop instead
    /// would make this thread the device's poller, which keeps the progress thread off the
    /// driver: a READ test's responder would then run only at these polls (perftest -R's
    /// server waits here for the whole test).
    fn fill(&mut self, limit: Option<Duration>) -> std::io::Result<bool> {
        let deadline = limit.map(|l| Instant::now() + l);
        let mut wcs = [Wc::EMPTY; 1];
        let mut armed = false;
        loop {
            let got = self.recv_cq.poll(&mut wcs).map_err(std::io::Error::other)?;
            if got == 1 {
                let wc = &wcs[0];
                if wc.status != xroce::verbs::WcStatus::Success {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionReset,
                        format!("side-channel receive failed: {:?}", wc.status),
                    ));
                }
                let slot = wc.wr_id as usize % RECVS;
                let mut msg = vec![0u8; (wc.byte_len as usize).min(RECV_LEN)];
                self.mr
                    .read(slot * RECV_LEN, &mut msg)
                    .map_err(std::io::Error::other)?;
                self.pending.extend_from_slice(&msg);
                self.qp
                    .post_recv(&RecvWr {
                        wr_id: slot as u64,
                        sg_list: vec![self
                            .mr
                            .sge(slot * RECV_LEN, RECV_LEN as u32)
                            .map_err(std::io::Error::other)?],
                    })
                    .map_err(std::io::Error::other)?;
                return Ok(true);
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return Ok(false);
            }
            if !armed {
                // Armed, then polled once more: a completion between the poll above and
                // the arming is found by that poll, not lost.
                self.recv_cq
                    .req_notify(false)
                    .map_err(std::io::Error::other)?;
                armed = true;
                continue;
            }
            match self.recv_channel.get_cq_event(left) {
                Ok(_) => armed = false,
                Err(VerbsError::Timeout(_)) => {}
                Err(e) => return Err(std::io::Error::other(e)),
            }
        }
    }

    /// Disconnects the side channel and waits (briefly) for DISCONNECTED.
    pub fn shutdown(self) {
        let _ = self.id.disconnect();
        let deadline = Instant::now() + Duration::from_secs(2);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.channel.get_event(Some(left)) {
                Ok(e) if e.kind == EventKind::Disconnected => break,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        self.id.destroy();
    }
}

impl Read for CmStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.pending.is_empty() {
            let limit = if self.nonblocking {
                Some(Duration::ZERO)
            } else {
                self.read_bound
            };
            if !self.fill(limit)? {
                return Err(std::io::Error::new(
                    if self.nonblocking {
                        std::io::ErrorKind::WouldBlock
                    } else {
                        std::io::ErrorKind::TimedOut
                    },
                    "no side-channel message",
                ));
            }
        }
        let n = buf.len().min(self.pending.len());
        buf[..n].copy_from_slice(&self.pending[..n]);
        self.pending.drain(..n);
        Ok(n)
    }
}

impl Write for CmStream {
    /// One SEND of all of `buf`, waited for (perftest's `rdma_write_data`).
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let len = buf.len().min(RECV_LEN);
        let at = RECVS * RECV_LEN;
        let other = std::io::Error::other;
        self.mr.write(at, &buf[..len]).map_err(other)?;
        self.qp
            .post_send(&SendWr {
                wr_id: u64::MAX,
                op: WrOp::Send,
                sg_list: vec![self.mr.sge(at, len as u32).map_err(other)?],
                flags: SendFlags::SIGNALED,
                ud: None,
            })
            .map_err(other)?;
        let mut wcs = [Wc::EMPTY; 1];
        loop {
            if self.send_cq.poll(&mut wcs).map_err(other)? == 1 {
                if wcs[0].status != xroce::verbs::WcStatus::Success {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::BrokenPipe,
                        format!("side-channel SEND failed: {:?}", wcs[0].status),
                    ));
                }
                return Ok(len);
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl OobStream for CmStream {
    fn bound_reads(&mut self, limit: Option<Duration>) -> std::io::Result<()> {
        self.read_bound = limit;
        Ok(())
    }

    fn nonblocking_reads(&mut self, on: bool) -> std::io::Result<()> {
        self.nonblocking = on;
        Ok(())
    }
}

/// The test QPs' rdma_cm ids (`create_rdma_cm_connection`, one id per QP).
pub struct CmQps {
    cm: Cm,
    channel: EventChannel,
    role: Role,
    /// The server (client role); the port in both.
    server: Option<IpAddr>,
    port: u16,
    param: ConnParam,
    ack_timeout: Option<u8>,
    ids: Vec<CmId>,
    /// The server's listener for the test QPs, up from [`Self::new`]: the client sends its
    /// REQs as soon as the last sync message arrives, before this side could start
    /// listening after sending it (a REQ then meets REJ "invalid service id", and Debian's
    /// perftest client crashes on that REJECTED).
    listener: Option<CmId>,
}

impl CmQps {
    /// `out_reads`: `Some` for READ and atomic tests (both depths), `None` for SEND/WRITE.
    pub fn new(
        cm: &Cm,
        role: Role,
        server: Option<&str>,
        port: u16,
        out_reads: Option<u8>,
    ) -> anyhow::Result<Self> {
        let server = server
            .map(|h| {
                h.parse::<IpAddr>()
                    .with_context(|| format!("-R needs the server's IP address, not {h:?}"))
            })
            .transpose()?;
        let channel = EventChannel::new()?;
        let listener = match role {
            Role::Server => {
                let listen = cm.create_id(&channel, PortSpace::Tcp)?;
                listen.bind_addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port))?;
                listen.listen(64)?;
                Some(listen)
            }
            Role::Client => None,
        };
        Ok(CmQps {
            cm: cm.clone(),
            channel,
            role,
            server,
            port,
            param: ConnParam {
                responder_resources: out_reads.unwrap_or(0),
                initiator_depth: out_reads.unwrap_or(0),
                retry_count: 7,
                rnr_retry_count: 7,
                ..ConnParam::default()
            },
            ack_timeout: None,
            ids: Vec::new(),
            listener,
        })
    }

    /// The local ACK timeout exponent of the client's connections (`-u`, as newer perftest
    /// sets `RDMA_OPTION_ID_ACK_TIMEOUT`; without it the Cm's 19, 2.1 s: a READ whose last
    /// responses are lost then waits 2.1 s per retry). The server's QPs take the client's.
    pub fn with_ack_timeout(mut self, exponent: u8) -> Self {
        self.ack_timeout = Some(exponent);
        self
    }

    /// Connects `qps` (in RESET or INIT), in order (client) or in the order their requests
    /// arrive (server), as perftest's `connection_index`.
    pub fn connect(&mut self, qps: &[Qp]) -> anyhow::Result<()> {
        match self.role {
            Role::Client => {
                let (mut tries, mut first_rejected) = (0, None);
                loop {
                    if self.try_client(qps)? {
                        return Ok(());
                    }
                    let since = first_rejected.get_or_insert_with(Instant::now).elapsed();
                    if !asks_again(tries, since) {
                        anyhow::bail!(
                            "rdma_cm: the server rejected the test QPs' connections {} times over {:.1} s (is it running with -R and the same -q?)",
                            tries + 1,
                            since.as_secs_f64()
                        );
                    }
                    tries += 1;
                    for id in self.ids.drain(..) {
                        let _ = id.detach_qp();
                        id.destroy();
                    }
                    for qp in qps {
                        qp.modify(
                            &QpAttr {
                                qp_state: QpState::Reset,
                                ..QpAttr::default()
                            },
                            QpAttrMask::STATE,
                        )?;
                    }
                    // Events of the destroyed ids stay behind with the old channel.
                    self.channel = EventChannel::new()?;
                    std::thread::sleep(REJECTED_RETRY_DELAY);
                }
            }
            Role::Server => self.serve(qps),
        }
    }

    /// One attempt; false when a connection was rejected. The ids connect one at a time
    /// (resolve, route, connect, ESTABLISHED, then the next), where perftest resolves them
    /// all at once: perftest's server listens for the test QPs only once its last sync
    /// message is acknowledged, so an early REQ meets REJ. With several REQs in flight the
    /// first could be rejected while the next was accepted, and the retry then asked the
    /// server for more connections than it has QPs (Debian's server fails: "Couldn't create
    /// rdma old QP"). One at a time, only the first can come early, and nothing was accepted
    /// before it.
    fn try_client(&mut self, qps: &[Qp]) -> anyhow::Result<bool> {
        let dst = SocketAddr::new(self.server.context("client without server")?, self.port);
        for qp in qps {
            let id = self.cm.create_id(&self.channel, PortSpace::Tcp)?;
            id.resolve_addr(None, dst, RESOLVE_TIMEOUT)?;
            self.ids.push(id);
            loop {
                let e = wait_event(&self.channel, CM_STEP_TIMEOUT)?;
                match e.kind {
                    EventKind::AddrResolved => {
                        if let Some(t) = self.ack_timeout {
                            e.id.set_ack_timeout(t)?;
                        }
                        e.id.resolve_route(RESOLVE_TIMEOUT)?
                    }
                    EventKind::RouteResolved => {
                        e.id.attach_qp(qp.clone())?;
                        e.id.connect(&self.param)?;
                    }
                    EventKind::Established => break,
                    EventKind::Rejected => return Ok(false),
                    _ => {
                        return Err(event_error(
                            &e,
                            &format!("connecting the test QPs to {dst}"),
                        ))
                    }
                }
            }
        }
        Ok(true)
    }

    fn serve(&mut self, qps: &[Qp]) -> anyhow::Result<()> {
        let listen = self
            .listener
            .take()
            .context("rdma_cm: the test QPs' listener is gone (connect called twice?)")?;
        while self.ids.len() < qps.len() {
            let e = match wait_event(&self.channel, CM_STEP_TIMEOUT) {
                Ok(e) => e,
                Err(err) => {
                    listen.destroy();
                    return Err(err);
                }
            };
            match e.kind {
                EventKind::ConnectRequest => {
                    e.id.attach_qp(qps[self.ids.len()].clone())?;
                    e.id.accept(&self.param)?;
                    self.ids.push(e.id);
                }
                // An earlier id's RTU: perftest counts requests, not these.
                EventKind::Established => {}
                _ => {
                    listen.destroy();
                    return Err(event_error(&e, "accepting the test QPs"));
                }
            }
        }
        listen.destroy();
        Ok(())
    }

    /// `rdma_cm_disconnect_nodes`: disconnect every id, wait for a DISCONNECTED per id.
    pub fn disconnect(&mut self) -> anyhow::Result<()> {
        for id in &self.ids {
            let _ = id.disconnect();
        }
        let mut left: Vec<CmId> = self.ids.clone();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !left.is_empty() {
            let Some(limit) = deadline.checked_duration_since(Instant::now()) else {
                anyhow::bail!(
                    "rdma_cm: {} of {} test connections did not report DISCONNECTED within 10 s",
                    left.len(),
                    self.ids.len()
                );
            };
            let e = wait_event(&self.channel, limit)?;
            if e.kind == EventKind::Disconnected {
                left.retain(|id| *id != e.id);
            }
        }
        for id in self.ids.drain(..) {
            let _ = id.detach_qp();
            id.destroy();
        }
        Ok(())
    }
}

/// A [`Cm`] on the device the test QPs live on.
pub fn cm_for(device: &Device) -> anyhow::Result<Cm> {
    Cm::new(std::slice::from_ref(device)).context("rdma_cm on the device (-R)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejected_client_asks_ten_times_and_for_ten_seconds() {
        // Fewer than ten tries: always again, however long it took.
        assert!(asks_again(0, Duration::ZERO));
        assert!(asks_again(9, Duration::from_secs(60)));
        // Where perftest stops, a lost ACK's sync message is still to come again.
        assert!(asks_again(10, Duration::from_secs(1)));
        assert!(asks_again(80, Duration::from_millis(9_900)));
        // Both spent: the server is not there.
        assert!(!asks_again(10, REJECTED_PATIENCE));
        assert!(!asks_again(95, Duration::from_secs(11)));
    }
}
