//! The processes `xroce bench` starts inside its namespaces (`xroce bench-child '<spec>'`):
//! raw AF_XDP frames and kernel UDP datagrams, each as a one-way stream (a sender and a
//! counting receiver) or a ping-pong (a pinger and an echo), and the in-process measure of
//! what a connected QP costs in memory.
//!
//! Each child prints `READY` once it can take traffic, then (except the echoes, which run
//! until they are killed) one JSON line with its result, and exits.
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::perftest::stats::LatencyStats;

/// UDP port of the kernel UDP rows (not 4791: the XDP program would take RoCE's port).
pub const UDP_PORT: u16 = 5201;
/// A receiver that saw frames ends after this long without one.
const QUIET: Duration = Duration::from_millis(500);
/// A receiver that never saw a frame gives up after this long.
const NOTHING_ARRIVED: Duration = Duration::from_secs(15);
/// A ping whose reply takes longer than this counts as lost.
const PING_TIMEOUT: Duration = Duration::from_millis(200);

/// What a child does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChildRole {
    /// Send `count` RoCE WRITE_ONLY frames through the AF_XDP driver as fast as it takes them.
    XdpSend,
    /// Count the frames the AF_XDP driver receives.
    XdpRecv,
    /// Answer every received frame with one of the same size (until killed).
    XdpEcho,
    /// `count` ping-pongs against an [`ChildRole::XdpEcho`].
    XdpPing,
    /// Send `count` UDP datagrams as fast as the socket takes them.
    UdpSend,
    /// Count the UDP datagrams received.
    UdpRecv,
    /// Send every datagram back (until killed).
    UdpEcho,
    /// `count` ping-pongs against a [`ChildRole::UdpEcho`].
    UdpPing,
    /// Memory of `qps` connected QP pairs over two in-memory devices.
    QpMemory,
}

/// Everything a child needs, passed as one JSON argument.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildSpec {
    /// The role.
    pub role: ChildRole,
    /// The veth end to use.
    pub ifname: String,
    /// This side's address.
    pub local_ip: Ipv4Addr,
    /// The other side's address.
    pub peer_ip: Ipv4Addr,
    /// The other side's MAC (raw frames).
    pub peer_mac: [u8; 6],
    /// Payload bytes per frame or datagram (QpMemory: perf's message size).
    pub size: usize,
    /// Frames, datagrams or round trips (receivers stop at this count).
    pub count: u64,
    /// Ping-pongs spin on the socket instead of sleeping in poll(2) or recv(2).
    pub busy: bool,
    /// QpMemory: how many QPs per device.
    pub qps: usize,
}

/// A sender's result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sent {
    /// Frames or datagrams handed to the driver or socket.
    pub sent: u64,
    /// How long that took.
    pub seconds: f64,
    /// The driver's mode ("xdp-copy"), or "udp".
    pub mode: String,
}

/// A receiver's result: the rate is measured from the first to the last arrival.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Received {
    /// Frames or datagrams received.
    pub received: u64,
    /// Their bytes (whole Ethernet frames for AF_XDP, UDP payload for UDP).
    pub bytes: u64,
    /// First to last arrival.
    pub seconds: f64,
    /// The driver's mode, or "udp".
    pub mode: String,
}

/// A pinger's result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Pinged {
    /// Round trips answered.
    pub answered: u64,
    /// Pings without an answer within the ping timeout.
    pub lost: u64,
    /// Round-trip statistics (µs), computed as perftest computes its latency.
    pub rtt: LatencyStats,
    /// The driver's mode, or "udp".
    pub mode: String,
}

/// The memory measurement's result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QpMemory {
    /// QPs per device.
    pub qps: usize,
    /// VmRSS with both devices open, before any QP (KiB).
    pub rss_before_kib: u64,
    /// VmRSS after creating, connecting and writing every QP's buffer (KiB).
    pub rss_after_kib: u64,
    /// (after - before) / (2 x qps), bytes.
    pub bytes_per_qp: f64,
    /// Each QP's registered buffer (bytes), part of the figure above.
    pub buffer_bytes: usize,
}

/// Runs a child: `READY`, then its result as one JSON line on `out`.
pub fn run(spec: &ChildSpec, out: &mut dyn Write) -> anyhow::Result<()> {
    match spec.role {
        ChildRole::XdpSend | ChildRole::XdpRecv | ChildRole::XdpEcho | ChildRole::XdpPing => {
            xdp::run(spec, out)
        }
        ChildRole::UdpSend => udp_send(spec, out),
        ChildRole::UdpRecv => udp_recv(spec, out),
        ChildRole::UdpEcho => udp_echo(spec, out),
        ChildRole::UdpPing => udp_ping(spec, out),
        ChildRole::QpMemory => qp_memory(spec, out),
    }
}

fn ready(out: &mut dyn Write) -> anyhow::Result<()> {
    writeln!(out, "READY")?;
    out.flush()?;
    Ok(())
}

fn result<T: Serialize>(out: &mut dyn Write, value: &T) -> anyhow::Result<()> {
    writeln!(out, "{}", serde_json::to_string(value)?)?;
    out.flush()?;
    Ok(())
}

/// Statistics of round trips (µs); an error if too few were answered.
fn rtt_stats(rtts: &[f64]) -> anyhow::Result<LatencyStats> {
    LatencyStats::from_samples(rtts).ok_or_else(|| {
        anyhow::anyhow!(
            "only {} round trips were answered: too few for statistics",
            rtts.len()
        )
    })
}

fn udp_socket(spec: &ChildSpec) -> anyhow::Result<UdpSocket> {
    let sock = UdpSocket::bind(SocketAddrV4::new(spec.local_ip, UDP_PORT))?;
    sock.connect(SocketAddrV4::new(spec.peer_ip, UDP_PORT))?;
    Ok(sock)
}

fn udp_send(spec: &ChildSpec, out: &mut dyn Write) -> anyhow::Result<()> {
    let sock = udp_socket(spec)?;
    let payload = vec![0xa5u8; spec.size];
    ready(out)?;
    let start = Instant::now();
    let mut sent = 0;
    while sent < spec.count {
        match sock.send(&payload) {
            Ok(_) => sent += 1,
            // The device queue was full (veth has none to speak of): try again.
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOBUFS.raw_os_error()) => {
                std::thread::yield_now()
            }
            Err(e) => return Err(e.into()),
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    result(
        out,
        &Sent {
            sent,
            seconds,
            mode: "udp".into(),
        },
    )
}

fn udp_recv(spec: &ChildSpec, out: &mut dyn Write) -> anyhow::Result<()> {
    let sock = UdpSocket::bind(SocketAddrV4::new(spec.local_ip, UDP_PORT))?;
    sock.set_read_timeout(Some(Duration::from_millis(50)))?;
    let mut buf = vec![0u8; 65536];
    ready(out)?;
    let mut clock = ArrivalClock::start();
    let (mut received, mut bytes) = (0u64, 0u64);
    while received < spec.count {
        match sock.recv(&mut buf) {
            Ok(n) => {
                clock.arrived();
                received += 1;
                bytes += n as u64;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if clock.stream_is_over() {
                    break;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    result(
        out,
        &Received {
            received,
            bytes,
            seconds: clock.seconds(),
            mode: "udp".into(),
        },
    )
}

/// When a stream's first and last packets arrived, and whether the receiver should stop
/// waiting for more: after [`QUIET`] without a packet, or [`NOTHING_ARRIVED`] without any.
struct ArrivalClock {
    started: Instant,
    first: Option<Instant>,
    last: Instant,
}

impl ArrivalClock {
    fn start() -> ArrivalClock {
        let now = Instant::now();
        ArrivalClock {
            started: now,
            first: None,
            last: now,
        }
    }

    fn arrived(&mut self) {
        self.last = Instant::now();
        self.first.get_or_insert(self.last);
    }

    fn stream_is_over(&self) -> bool {
        let now = Instant::now();
        match self.first {
            Some(_) => now - self.last > QUIET,
            None => now - self.started > NOTHING_ARRIVED,
        }
    }

    /// First to last packet.
    fn seconds(&self) -> f64 {
        self.first
            .map_or(0.0, |first| (self.last - first).as_secs_f64())
    }
}

/// One datagram from `sock`: blocking (a read timeout set) or spinning until `deadline`.
fn udp_recv_one(
    sock: &UdpSocket,
    buf: &mut [u8],
    busy: bool,
    deadline: Instant,
) -> anyhow::Result<Option<usize>> {
    loop {
        match sock.recv(buf) {
            Ok(n) => return Ok(Some(n)),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                if !busy {
                    continue;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn udp_prepare(sock: &UdpSocket, busy: bool) -> anyhow::Result<()> {
    if busy {
        sock.set_nonblocking(true)?;
    } else {
        sock.set_read_timeout(Some(PING_TIMEOUT))?;
    }
    Ok(())
}

fn udp_echo(spec: &ChildSpec, out: &mut dyn Write) -> anyhow::Result<()> {
    let sock = udp_socket(spec)?;
    udp_prepare(&sock, spec.busy)?;
    let mut buf = vec![0u8; 65536];
    ready(out)?;
    loop {
        let forever = Instant::now() + Duration::from_secs(3600);
        if let Some(n) = udp_recv_one(&sock, &mut buf, spec.busy, forever)? {
            sock.send(&buf[..n])?;
        }
    }
}

fn udp_ping(spec: &ChildSpec, out: &mut dyn Write) -> anyhow::Result<()> {
    let sock = udp_socket(spec)?;
    udp_prepare(&sock, spec.busy)?;
    let mut ping = vec![0u8; spec.size.max(8)];
    let mut buf = vec![0u8; 65536];
    ready(out)?;
    let mut rtts = Vec::with_capacity(spec.count as usize);
    let mut lost = 0u64;
    for seq in 0..spec.count {
        ping[..8].copy_from_slice(&seq.to_le_bytes());
        let start = Instant::now();
        sock.send(&ping)?;
        let deadline = start + PING_TIMEOUT;
        loop {
            match udp_recv_one(&sock, &mut buf, spec.busy, deadline)? {
                Some(n) if n >= 8 && buf[..8] == ping[..8] => {
                    rtts.push(start.elapsed().as_secs_f64() * 1e6);
                    break;
                }
                // A late answer to an earlier ping: keep waiting for this one.
                Some(_) => continue,
                None => {
                    lost += 1;
                    break;
                }
            }
        }
    }
    result(
        out,
        &Pinged {
            answered: rtts.len() as u64,
            lost,
            rtt: rtt_stats(&rtts)?,
            mode: "udp".into(),
        },
    )
}

/// VmRSS of this process in KiB.
pub fn vm_rss_kib() -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmRSS line in /proc/self/status"))
}

/// `qps` QPs on each of two in-memory devices, made as `xroce perf write_bw -s SIZE -q QPS`
/// makes them (its queue depths and buffer size), connected pairwise, each buffer written
/// once (as a run touches it). What the devices cost without QPs is measured first and left
/// out.
fn qp_memory(spec: &ChildSpec, out: &mut dyn Write) -> anyhow::Result<()> {
    use crate::endpoint::verbs::{open_on, DriverChoice, EndpointSpec};
    use crate::endpoint::RemoteInfo;
    use crate::perftest::oob::TestKind;
    use crate::perftest::run::PerfOptions;
    use xroce::verbs::{mem_link_config, Device, DeviceConfig};

    let mut opts = PerfOptions::defaults(TestKind::WriteBw);
    opts.size = spec.size as u64;
    opts.num_qps = spec.qps;
    opts.validate()?;
    opts.settle_depths();
    // The same EndpointSpec as tools/src/perftest/command.rs builds.
    let endpoint = EndpointSpec {
        qp_type: xroce::engine::QpType::Rc,
        buf_len: 2 * opts.half_len(),
        max_send_wr: opts.tx_depth.max(2),
        max_recv_wr: opts.rx_depth.max(2),
        driver: DriverChoice::Udp,
        events: false,
        pcap: None,
        progress: xroce::verbs::ProgressMode::Wakeup,
        shards: 1,
    };
    let (a, b, _link) = Device::mem_pair(&mem_link_config(1500, 0.0, 1), DeviceConfig::default())?;
    let gid = |d: &Device| {
        d.ipv4_gid_index()
            .ok_or_else(|| anyhow::anyhow!("the in-memory device has no IPv4 GID"))
    };
    let (gid_a, gid_b) = (gid(&a)?, gid(&b)?);
    ready(out)?;
    let rss_before_kib = vm_rss_kib()?;
    let mut side_a = open_on(&a, gid_a, &endpoint, spec.qps)?;
    let mut side_b = open_on(&b, gid_b, &endpoint, spec.qps)?;
    let fill = vec![0x5au8; endpoint.buf_len];
    for (ea, eb) in side_a.iter_mut().zip(side_b.iter_mut()) {
        let (la, lb) = (ea.local(), eb.local());
        let (psn_a, psn_b) = (crate::setup::random_psn(), crate::setup::random_psn());
        let mtu = la.active_mtu.min(lb.active_mtu);
        ea.connect(
            &RemoteInfo {
                qpn: lb.qpn,
                psn: psn_b,
                gid: lb.gid,
            },
            &opts.connect_params(psn_a, mtu),
        )?;
        eb.connect(
            &RemoteInfo {
                qpn: la.qpn,
                psn: psn_a,
                gid: la.gid,
            },
            &opts.connect_params(psn_b, mtu),
        )?;
        ea.write_local(0, &fill)?;
        eb.write_local(0, &fill)?;
    }
    let rss_after_kib = vm_rss_kib()?;
    let grown = rss_after_kib.saturating_sub(rss_before_kib) as f64 * 1024.0;
    result(
        out,
        &QpMemory {
            qps: spec.qps,
            rss_before_kib,
            rss_after_kib,
            bytes_per_qp: grown / (2 * spec.qps) as f64,
            buffer_bytes: endpoint.buf_len,
        },
    )
}

/// Raw AF_XDP: RoCE WRITE_ONLY frames built with `xroce::wire`, through the same
/// [`XdpDriver`](xroce::driver::xdp::XdpDriver) the verbs layer uses, no engine.
#[cfg(feature = "xdp")]
mod xdp {
    use super::*;
    use xroce::driver::xdp::{XdpConfig, XdpDriver};
    use xroce::driver::{poll_readable, Driver, DriverError};
    use xroce::wire::{Bth, EthRepr, FrameRepr, Psn};

    /// Where the BTH starts in the frames built here: Ethernet (14), IPv4 (20), UDP (8).
    const BTH_OFFSET: usize = 14 + 20 + 8;

    /// One RC RDMA WRITE_ONLY frame (BTH + RETH + payload + ICRC) from `spec`'s side.
    pub fn frame(spec: &ChildSpec, src_mac: [u8; 6], psn: u32) -> anyhow::Result<Vec<u8>> {
        let payload = vec![0xa5u8; spec.size];
        let eth = EthRepr {
            dst: spec.peer_mac,
            src: src_mac,
            vlan: None,
        };
        let f = FrameRepr::rc_write_only_v4(eth, spec.local_ip, spec.peer_ip, &payload, psn);
        let mut buf = vec![0; f.buffer_len()];
        f.emit(&mut buf)
            .map_err(|e| anyhow::anyhow!("building a {}-byte frame: {e}", spec.size))?;
        Ok(buf)
    }

    fn psn_of(frame: &[u8]) -> Option<u32> {
        let bth = Bth::new_checked(frame.get(BTH_OFFSET..)?).ok()?;
        Some(bth.psn().value())
    }

    /// Rewrites the PSN in place. The ICRC is left stale on purpose: nobody checks it here,
    /// and recomputing it would add work no ceiling should carry.
    fn set_psn(frame: &mut [u8], psn: u32) {
        if let Some(bytes) = frame.get_mut(BTH_OFFSET..) {
            if let Ok(mut bth) = Bth::new_checked(bytes) {
                bth.set_psn(Psn::new(psn & 0xff_ffff));
            }
        }
    }

    fn send_one(d: &mut XdpDriver, frame: &[u8]) -> anyhow::Result<()> {
        loop {
            match d.send(frame) {
                Ok(()) => break,
                Err(DriverError::TxBusy) => d.flush()?,
                Err(e) => return Err(e.into()),
            }
        }
        d.flush()?;
        Ok(())
    }

    /// Waits for frames (poll(2), or a spin with `busy`) until `deadline`, handing each to
    /// `on_frame`; returns once `on_frame` says done (true) or the deadline passes (false).
    fn receive_until(
        d: &mut XdpDriver,
        busy: bool,
        deadline: Instant,
        on_frame: &mut dyn FnMut(&[u8]) -> bool,
    ) -> anyhow::Result<bool> {
        loop {
            let mut done = false;
            d.recv(64, &mut |f, _| done |= on_frame(f))?;
            if done {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            if !busy {
                if let Some(fd) = d.wait_fd() {
                    poll_readable(fd, Some(deadline - now))?;
                }
            }
        }
    }

    pub fn run(spec: &ChildSpec, out: &mut dyn Write) -> anyhow::Result<()> {
        let mut d = XdpDriver::open(&XdpConfig::new(spec.ifname.clone()))?;
        let info = d.info();
        let mode = info.mode.to_string();
        match spec.role {
            ChildRole::XdpSend => {
                let f = frame(spec, info.mac, 0)?;
                ready(out)?;
                let start = Instant::now();
                let mut sent = 0u64;
                while sent < spec.count {
                    match d.send(&f) {
                        Ok(()) => sent += 1,
                        Err(DriverError::TxBusy) => d.flush()?,
                        Err(e) => return Err(e.into()),
                    }
                    if sent % 64 == 0 {
                        d.flush()?;
                    }
                }
                d.flush()?;
                let seconds = start.elapsed().as_secs_f64();
                // Let the last frames leave before the socket closes.
                std::thread::sleep(Duration::from_millis(100));
                result(
                    out,
                    &Sent {
                        sent,
                        seconds,
                        mode,
                    },
                )
            }
            ChildRole::XdpRecv => {
                ready(out)?;
                let mut clock = ArrivalClock::start();
                let (mut received, mut bytes) = (0u64, 0u64);
                while received < spec.count {
                    let n = d.recv(256, &mut |f, _| bytes += f.len() as u64)? as u64;
                    if n > 0 {
                        clock.arrived();
                        received += n;
                        continue;
                    }
                    if clock.stream_is_over() {
                        break;
                    }
                    if let Some(fd) = d.wait_fd() {
                        poll_readable(fd, Some(Duration::from_millis(50)))?;
                    }
                }
                result(
                    out,
                    &Received {
                        received,
                        bytes,
                        seconds: clock.seconds(),
                        mode,
                    },
                )
            }
            ChildRole::XdpEcho => {
                let mut reply = frame(spec, info.mac, 0)?;
                ready(out)?;
                loop {
                    let mut psn = None;
                    let forever = Instant::now() + Duration::from_secs(3600);
                    receive_until(&mut d, spec.busy, forever, &mut |f| {
                        psn = psn_of(f);
                        psn.is_some()
                    })?;
                    if let Some(psn) = psn {
                        set_psn(&mut reply, psn);
                        send_one(&mut d, &reply)?;
                    }
                }
            }
            ChildRole::XdpPing => {
                let mut ping = frame(spec, info.mac, 0)?;
                ready(out)?;
                let mut rtts = Vec::with_capacity(spec.count as usize);
                let mut lost = 0u64;
                for seq in 0..spec.count {
                    let psn = (seq & 0xff_ffff) as u32;
                    set_psn(&mut ping, psn);
                    let start = Instant::now();
                    send_one(&mut d, &ping)?;
                    let answered =
                        receive_until(&mut d, spec.busy, start + PING_TIMEOUT, &mut |f| {
                            psn_of(f) == Some(psn)
                        })?;
                    if answered {
                        rtts.push(start.elapsed().as_secs_f64() * 1e6);
                    } else {
                        lost += 1;
                    }
                }
                result(
                    out,
                    &Pinged {
                        answered: rtts.len() as u64,
                        lost,
                        rtt: rtt_stats(&rtts)?,
                        mode,
                    },
                )
            }
            other => anyhow::bail!("{other:?} is not an AF_XDP role"),
        }
    }
}

#[cfg(not(feature = "xdp"))]
mod xdp {
    use super::*;

    pub fn run(_spec: &ChildSpec, _out: &mut dyn Write) -> anyhow::Result<()> {
        Err(xroce::driver::DriverError::XdpNotBuilt.into())
    }
}
