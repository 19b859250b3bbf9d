//! `xroce demo`: two xroce endpoints doing every RDMA operation over a real (virtual) link,
//! explained for a newcomer, verified byte for byte.
//!
//! As root (default driver `xdp`): two network namespaces joined by a veth pair, one
//! endpoint process in each (`xroce demo-peer`, started with `ip netns exec`), each on its
//! own AF_XDP socket. Without root: the same two endpoints in one process over the kernel
//! UDP driver on loopback (`udp`), or over the in-memory link (`sim`).
//!
//! The endpoints set up an RC connection the way `ibv_rc_pingpong` does (QPN, PSN, GID,
//! and here also R_Key and address exchanged over TCP), then the client runs SEND,
//! SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ, FETCH_ADD and CMP_SWAP; after
//! each, the side that can see the result checks it (the server over the same TCP
//! connection) and the demo fails on the first difference.
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};

use xroce::netdev::Gid;
use xroce::verbs::{
    mem_link_config, Access, Cq, Device, DeviceConfig, DriverKind, Mr, Mtu, Qp, QpInitAttr,
    RcOptions, RcPeer, RecvWr, SendFlags, SendWr, TracedFrame, Wc, WcOpcode, WcStatus, WrOp,
};

/// Which driver the demo runs on.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DemoDriver {
    /// AF_XDP in two network namespaces joined by a veth pair (needs root).
    Xdp,
    /// Kernel UDP sockets on port 4791, both endpoints on loopback (no root needed).
    Udp,
    /// The in-memory link: no kernel at all.
    Sim,
}

/// Two xroce endpoints run every RDMA operation over a virtual link, explained step by step.
///
/// Examples:
///   sudo xroce demo                   AF_XDP between two network namespaces
///   xroce demo --driver udp           kernel UDP sockets on loopback, no root needed
///   sudo xroce demo --mtu 9000        a 9000-byte link: path MTU 4096
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Driver (default: xdp as root, udp otherwise).
    #[arg(long, value_enum)]
    pub driver: Option<DemoDriver>,
    /// Link MTU of the veth pair (1500 gives path MTU 1024, 9000 gives 4096).
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u32).range(576..=9000))]
    pub mtu: u32,
    /// Message size in bytes of SEND, WRITE and READ.
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u32).range(0..=(64 << 20)))]
    pub size: u32,
    /// Most packets to show in the trace (0: no trace).
    #[arg(long, default_value_t = 40)]
    pub trace: usize,
    /// Write every frame the client endpoint sends and receives to FILE (pcap, Ethernet).
    #[arg(long = "pcap", value_name = "FILE")]
    pub pcap: Option<std::path::PathBuf>,
}

/// The endpoint process `xroce demo` starts in each namespace (not for direct use).
#[derive(clap::Args, Debug)]
pub struct PeerArgs {
    /// server or client.
    #[arg(long)]
    pub role: String,
    /// Interface to open.
    #[arg(long)]
    pub ifname: String,
    /// Driver.
    #[arg(long, value_enum)]
    pub driver: DemoDriver,
    /// Server: address to listen on; client: server address to connect to.
    #[arg(long)]
    pub addr: SocketAddr,
    /// Message size.
    #[arg(long)]
    pub size: u32,
    /// Most packets to show in the trace.
    #[arg(long, default_value_t = 40)]
    pub trace: usize,
    /// Write this endpoint's frames to FILE (pcap).
    #[arg(long = "pcap", value_name = "FILE")]
    pub pcap: Option<std::path::PathBuf>,
}

/// Runs `xroce demo`.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let root = xroce::netns::is_privileged();
    let driver = match args.driver {
        Some(DemoDriver::Xdp) if !cfg!(feature = "xdp") => {
            return Err(xroce::driver::DriverError::XdpNotBuilt.into())
        }
        Some(DemoDriver::Xdp) if !root => bail!(
            "--driver xdp needs root (namespaces, XDP and AF_XDP need CAP_SYS_ADMIN, \
             CAP_NET_ADMIN, CAP_BPF); run with sudo, or use --driver udp or --driver sim"
        ),
        Some(d) => d,
        None if root && cfg!(feature = "xdp") => DemoDriver::Xdp,
        None if root => {
            println!(
                "This xroce was built without the `xdp` feature (no AF_XDP). Running the same \
                 demo over the kernel UDP driver on loopback instead.\n"
            );
            DemoDriver::Udp
        }
        None => {
            println!(
                "Not running as root: network namespaces and AF_XDP need it. Running the same \
                 demo over the kernel UDP driver on loopback instead (sudo xroce demo for AF_XDP).\n"
            );
            DemoDriver::Udp
        }
    };
    intro(driver, &args);
    let ok = match driver {
        DemoDriver::Xdp => run_namespaces(&args)?,
        DemoDriver::Udp => run_in_process(&args, DemoDriver::Udp)?,
        DemoDriver::Sim => run_in_process(&args, DemoDriver::Sim)?,
    };
    if ok {
        println!(
            "\nAll operations verified: every byte and every atomic value is what it should be."
        );
        Ok(0)
    } else {
        println!("\nDEMO FAILED: see the first ✗ above.");
        Ok(1)
    }
}

fn intro(driver: DemoDriver, args: &Args) {
    println!(
        "xroce demo: RDMA over Converged Ethernet v2 (RoCEv2) between two userspace endpoints"
    );
    println!("==================================================================================");
    println!(
        "RoCEv2 carries InfiniBand transport packets (BTH + extension headers + payload + ICRC)"
    );
    println!(
        "inside UDP datagrams to port 4791. Each endpoint here is an xroce device: a verbs API,"
    );
    println!(
        "a transport engine (requester, responder, completer) and a driver that moves frames."
    );
    let how = match driver {
        DemoDriver::Xdp => format!(
            "two network namespaces joined by a veth pair (link MTU {}), one endpoint process in\n\
             each. An XDP program on each veth end steers UDP port 4791 into an AF_XDP socket;\n\
             everything else (ARP, the TCP set-up connection) still goes to the kernel.",
            args.mtu
        ),
        DemoDriver::Udp => "two endpoints in this process, each on its own loopback address and\n\
             kernel UDP socket on port 4791 (the kernel builds the IP/UDP headers)."
            .to_string(),
        DemoDriver::Sim => {
            "two endpoints in this process joined by an in-memory link (no kernel).".to_string()
        }
    };
    println!("Set-up: {how}\n");
}

/// `xroce demo --driver xdp`: namespaces, veth, one `demo-peer` process per side.
fn run_namespaces(args: &Args) -> anyhow::Result<bool> {
    let link = xroce::netns::VethLink::create(&xroce::netns::LinkConfig {
        mtu: args.mtu,
        ipv6: false,
        ..Default::default()
    })
    .context("creating the namespaces and the veth pair")?;
    println!(
        "created namespaces {} ({} {}) and {} ({} {}), joined by a veth pair",
        link.a.name(),
        link.a_if,
        link.a_ip,
        link.b.name(),
        link.b_if,
        link.b_ip
    );
    let exe = std::env::current_exe().context("locating the xroce binary")?;
    let server_addr = SocketAddr::new(IpAddr::V4(link.b_ip), 18515);
    let peer = |ns: &xroce::netns::Netns, role: &str, ifname: &str| {
        let mut cmd = ns.command(&exe);
        cmd.args([
            "demo-peer",
            "--role",
            role,
            "--ifname",
            ifname,
            "--driver",
            "xdp",
        ])
        .args(["--addr", &server_addr.to_string()])
        .args([
            "--size",
            &args.size.to_string(),
            "--trace",
            &args.trace.to_string(),
        ])
        .stdin(Stdio::null());
        cmd
    };
    let mut server_cmd = peer(&link.b, "server", &link.b_if);
    server_cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let server = link.b.spawn(&mut server_cmd)?;
    let mut client_cmd = peer(&link.a, "client", &link.a_if);
    if let Some(pcap) = &args.pcap {
        client_cmd.arg("--pcap").arg(pcap);
    }
    let mut client = link.a.spawn(&mut client_cmd)?;
    let client_status = client.child().wait().context("waiting for the client")?;
    // The server exits by itself after "done"; if the client failed early, do not hang.
    let server_out = {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut server = server;
        loop {
            if server.child().try_wait()?.is_some() || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = server.child().kill();
        server.wait_with_output()?
    };
    println!("\n--- server side ({}) ---", link.b.name());
    print!("{}", String::from_utf8_lossy(&server_out.stdout));
    eprint!("{}", String::from_utf8_lossy(&server_out.stderr));
    let ok = client_status.success() && server_out.status.success();
    let (a_ns, b_ns) = (link.a.name().to_string(), link.b.name().to_string());
    drop(link);
    println!(
        "\nremoved namespaces {a_ns} and {b_ns} (and with them the veth pair and XDP programs)"
    );
    Ok(ok)
}

/// `xroce demo --driver udp|sim`: both endpoints in this process.
fn run_in_process(args: &Args, driver: DemoDriver) -> anyhow::Result<bool> {
    let config = DeviceConfig {
        driver: DriverKind::Udp,
        trace_frames: 1 << 16,
        ..DeviceConfig::default()
    };
    // `sim` ignores the driver kind: the in-memory link is its driver.
    let (client_dev, server_dev) = match driver {
        DemoDriver::Sim => {
            let (a, b, _link) = Device::mem_pair(
                &mem_link_config(args.mtu, 0.0, 1),
                DeviceConfig {
                    pcap: args.pcap.clone(),
                    ..config.clone()
                },
            )?;
            (a, b)
        }
        _ => {
            let ip = |slot| IpAddr::V4(xroce::driver::udp::unique_loopback_v4(slot));
            let a = Device::open(
                "lo",
                DeviceConfig {
                    udp_local_ip: Some(ip(1)),
                    pcap: args.pcap.clone(),
                    ..config.clone()
                },
            )?;
            let b = Device::open(
                "lo",
                DeviceConfig {
                    udp_local_ip: Some(ip(2)),
                    ..config.clone()
                },
            )?;
            (a, b)
        }
    };
    let listener = TcpListener::bind("127.0.0.1:0").context("binding the set-up TCP port")?;
    let addr = listener.local_addr()?;
    let size = args.size as usize;
    let server = std::thread::spawn(move || -> anyhow::Result<String> {
        let mut log = Vec::new();
        let (stream, _) = listener.accept()?;
        serve(&server_dev, stream, size, &mut log)?;
        Ok(String::from_utf8_lossy(&log).into_owned())
    });
    let stream = TcpStream::connect(addr)?;
    let mut out = std::io::stdout();
    let client_result = drive(&client_dev, stream, size, args.trace, &mut out);
    let server_log = server
        .join()
        .map_err(|_| anyhow!("the server thread panicked"))?;
    let client_ok = match client_result {
        Ok(ok) => ok,
        Err(e) => {
            if let Err(server_err) = &server_log {
                println!("server failed: {server_err:#}");
            }
            return Err(e.context("client"));
        }
    };
    println!("\n--- server side ---");
    match server_log {
        Ok(log) => print!("{log}"),
        Err(e) => {
            println!("server failed: {e:#}");
            return Ok(false);
        }
    }
    Ok(client_ok)
}

/// Runs `xroce demo-peer` (one endpoint, inside a namespace).
pub fn run_peer(args: PeerArgs) -> anyhow::Result<i32> {
    let config = DeviceConfig {
        driver: match args.driver {
            DemoDriver::Xdp => DriverKind::Xdp,
            DemoDriver::Udp => DriverKind::Udp,
            DemoDriver::Sim => {
                bail!("the sim driver runs in one process: use `xroce demo --driver sim`")
            }
        },
        trace_frames: 1 << 16,
        pcap: args.pcap.clone(),
        ..DeviceConfig::default()
    };
    let dev = Device::open(&args.ifname, config)
        .with_context(|| format!("opening the xroce device on {}", args.ifname))?;
    let size = args.size as usize;
    match args.role.as_str() {
        "server" => {
            let listener = TcpListener::bind(args.addr)
                .with_context(|| format!("listening on {}", args.addr))?;
            let (stream, _) = listener.accept()?;
            let mut out = std::io::stdout();
            serve(&dev, stream, size, &mut out)?;
            Ok(0)
        }
        "client" => {
            let deadline = Instant::now() + Duration::from_secs(10);
            let stream = loop {
                match TcpStream::connect_timeout(&args.addr, Duration::from_secs(1)) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() < deadline => {
                        tracing::debug!("server not ready yet: {e}");
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Err(e) => {
                        return Err(e).with_context(|| format!("connecting to {}", args.addr))
                    }
                }
            };
            let mut out = std::io::stdout();
            let ok = drive(&dev, stream, size, args.trace, &mut out)?;
            Ok(if ok { 0 } else { 1 })
        }
        other => bail!("--role must be server or client, not {other:?}"),
    }
}

/// What each side tells the other before connecting (like ibv_rc_pingpong's exchange, plus
/// the memory region the other side may access).
#[derive(Serialize, Deserialize, Debug, Clone)]
struct EndpointInfo {
    qpn: u32,
    psn: u32,
    gid: String,
    rkey: u32,
    addr: u64,
    len: u64,
    /// Active path MTU of the port, bytes.
    mtu: u32,
}

/// One request from the client to the server, and the server's answer.
#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "cmd", rename_all = "snake_case")]
enum Request {
    /// Wait for the next receive completion and check it.
    CheckRecv {
        seed: u8,
        len: usize,
        imm: Option<u32>,
        opcode: String,
        offset: usize,
    },
    /// Check a memory range.
    CheckMem { offset: usize, len: usize, seed: u8 },
    /// Check the atomic target.
    CheckU64 { expect: u64 },
    /// Finished: report counters and exit.
    Done,
}

#[derive(Serialize, Deserialize, Debug)]
struct Reply {
    ok: bool,
    detail: String,
}

/// The server's memory layout: [recv area | write area | read source | atomic u64].
struct Layout {
    size: usize,
}

impl Layout {
    fn recv(&self) -> usize {
        0
    }
    fn write(&self) -> usize {
        self.size
    }
    fn read_src(&self) -> usize {
        2 * self.size
    }
    fn atomic(&self) -> usize {
        (3 * self.size).div_ceil(8) * 8
    }
    fn len(&self) -> usize {
        self.atomic() + 8
    }
}

const ATOMIC_INITIAL: u64 = 100;
const WAIT: Duration = Duration::from_secs(10);

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(seed | 1).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

struct Endpoint {
    dev: Device,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    psn: u32,
}

fn endpoint(dev: &Device, mr_len: usize) -> anyhow::Result<Endpoint> {
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(256, None)?;
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq))?;
    let access =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mr = pd.reg_mr(mr_len.max(8), access)?;
    let psn = rand::random::<u32>() & 0xff_ffff;
    Ok(Endpoint {
        dev: dev.clone(),
        cq,
        qp,
        mr,
        psn,
    })
}

fn info_of(ep: &Endpoint) -> anyhow::Result<EndpointInfo> {
    let gid_index = ep
        .dev
        .ipv4_gid_index()
        .ok_or_else(|| anyhow!("{} has no IPv4 address (no IPv4 GID)", ep.dev.name()))?;
    Ok(EndpointInfo {
        qpn: ep.qp.qp_num(),
        psn: ep.psn,
        gid: ep.dev.query_gid(gid_index)?.to_hex(),
        rkey: ep.mr.rkey(),
        addr: ep.mr.addr(),
        len: ep.mr.len() as u64,
        mtu: ep.dev.active_mtu().bytes(),
    })
}

fn connect(ep: &Endpoint, me: &EndpointInfo, peer: &EndpointInfo) -> anyhow::Result<Mtu> {
    let gid = Gid::from_hex(&peer.gid).ok_or_else(|| anyhow!("bad GID {:?}", peer.gid))?;
    let mtu = Mtu::from_bytes(me.mtu.min(peer.mtu)).unwrap_or(Mtu::Mtu1024);
    let opts = RcOptions {
        sgid_index: ep.dev.ipv4_gid_index().unwrap_or(0) as u8,
        path_mtu: mtu,
        sq_psn: me.psn,
        ..RcOptions::default()
    };
    ep.qp.connect_rc(
        &RcPeer {
            qpn: peer.qpn,
            psn: peer.psn,
            gid,
        },
        &opts,
    )?;
    Ok(mtu)
}

fn send_json<T: Serialize>(stream: &mut TcpStream, value: &T) -> anyhow::Result<()> {
    let mut line = serde_json::to_string(value)?;
    line.push('\n');
    stream.write_all(line.as_bytes())?;
    Ok(())
}

fn recv_json<T: for<'de> Deserialize<'de>>(reader: &mut impl BufRead) -> anyhow::Result<T> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        bail!("the other side closed the set-up connection");
    }
    Ok(serde_json::from_str(&line)?)
}

fn one_wc(cq: &Cq) -> anyhow::Result<Wc> {
    cq.wait(1, WAIT)?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("no completion within {WAIT:?}"))
}

/// The server: answers RDMA from its progress thread; checks what the client asks it to.
fn serve(dev: &Device, stream: TcpStream, size: usize, out: &mut dyn Write) -> anyhow::Result<()> {
    let layout = Layout { size };
    let ep = endpoint(dev, layout.len())?;
    ep.mr.write(layout.read_src(), &pattern(size, 4))?;
    ep.mr.write_u64(layout.atomic(), ATOMIC_INITIAL)?;
    // Receives may be posted from INIT on; RTR/RTS come with the peer's details.
    ep.qp.to_init(ep.mr.access(), 0)?;
    // Receives for SEND, SEND_WITH_IMM (data into the receive area) and WRITE_WITH_IMM (no
    // data: the payload goes where the RETH says; the receive only carries the immediate).
    for wr_id in 1..=2 {
        ep.qp.post_recv(&RecvWr {
            wr_id,
            sg_list: vec![ep.mr.sge(layout.recv(), size.max(1) as u32)?],
        })?;
    }
    ep.qp.post_recv(&RecvWr {
        wr_id: 3,
        sg_list: vec![],
    })?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let client: EndpointInfo = recv_json(&mut reader)?;
    let me = info_of(&ep)?;
    connect(&ep, &me, &client)?;
    send_json(&mut writer, &me)?;
    writeln!(
        out,
        "server {}: QP {:#x} connected to client QP {:#x}; it never polls for RDMA READ, WRITE \
         or atomics: its progress thread answers them",
        dev.name(),
        me.qpn,
        client.qpn
    )?;
    loop {
        let request: Request = recv_json(&mut reader)?;
        let reply = match request {
            Request::CheckRecv {
                seed,
                len,
                imm,
                opcode,
                offset,
            } => {
                let wc = one_wc(&ep.cq)?;
                let data = ep.mr.to_vec(offset, len)?;
                let expect_opcode = if opcode == "recv" {
                    WcOpcode::Recv
                } else {
                    WcOpcode::RecvRdmaWithImm
                };
                let ok = wc.status == WcStatus::Success
                    && wc.opcode == expect_opcode
                    && wc.byte_len as usize == len
                    && wc.imm_data == imm
                    && data == pattern(len, seed);
                Reply {
                    ok,
                    detail: format!(
                        "receive completion: {:?} {:?}, {} bytes, imm {}; data {}",
                        wc.status,
                        wc.opcode,
                        wc.byte_len,
                        wc.imm_data
                            .map_or("none".to_string(), |v| format!("{v:#x}")),
                        if data == pattern(len, seed) {
                            "matches"
                        } else {
                            "DIFFERS"
                        }
                    ),
                }
            }
            Request::CheckMem { offset, len, seed } => {
                let ok = ep.mr.to_vec(offset, len)? == pattern(len, seed);
                Reply {
                    ok,
                    detail: format!(
                        "{len} bytes at offset {offset} {}",
                        if ok { "match" } else { "DIFFER" }
                    ),
                }
            }
            Request::CheckU64 { expect } => {
                let value = ep.mr.read_u64(layout.atomic())?;
                Reply {
                    ok: value == expect,
                    detail: format!("atomic target now holds {value:#x} (expected {expect:#x})"),
                }
            }
            Request::Done => {
                let c = dev.counters();
                send_json(
                    &mut writer,
                    &Reply {
                        ok: true,
                        detail: String::new(),
                    },
                )?;
                writeln!(
                    out,
                    "server counters: sent_pkts {} rcvd_pkts {} duplicate_request {} \
                     out_of_seq_request {} send_rnr_err {}",
                    c.sent_pkts,
                    c.rcvd_pkts,
                    c.duplicate_request,
                    c.out_of_seq_request,
                    c.send_rnr_err
                )?;
                if let Some(x) = dev.xdp_stats() {
                    writeln!(
                        out,
                        "server XDP program: {} frames seen, {} RoCE frames redirected to AF_XDP, \
                         {} passed to the kernel",
                        x.seen, x.redirected, x.passed
                    )?;
                }
                return Ok(());
            }
        };
        writeln!(
            out,
            "  server check: {} {}",
            if reply.ok { "✓" } else { "✗" },
            reply.detail
        )?;
        send_json(&mut writer, &reply)?;
    }
}

/// The client: runs every operation, explains it, verifies it.
fn drive(
    dev: &Device,
    stream: TcpStream,
    size: usize,
    trace: usize,
    out: &mut dyn Write,
) -> anyhow::Result<bool> {
    let layout = Layout { size };
    let ep = endpoint(dev, 2 * size + 8)?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let me = info_of(&ep)?;
    send_json(&mut writer, &me)?;
    let server: EndpointInfo = recv_json(&mut reader)?;
    let mtu = connect(&ep, &me, &server)?;
    writeln!(
        out,
        "client {} (driver {}): QP {:#x}, GID {}\n\
         server: QP {:#x}, GID {}, memory region {:#x} (+{} bytes), R_Key {:#x}\n\
         connected: path MTU {} bytes, so a {}-byte message travels as {} packet(s)\n",
        dev.name(),
        dev.driver_info().mode,
        me.qpn,
        Gid::from_hex(&me.gid).unwrap_or_default(),
        server.qpn,
        Gid::from_hex(&server.gid).unwrap_or_default(),
        server.addr,
        server.len,
        server.rkey,
        mtu.bytes(),
        size,
        size.div_ceil(mtu.bytes() as usize).max(1)
    )?;
    let local = |offset: usize, len: usize| -> anyhow::Result<Vec<xroce::verbs::Sge>> {
        Ok(if len == 0 {
            vec![]
        } else {
            vec![ep.mr.sge(offset, len as u32)?]
        })
    };
    let remote = |offset: usize| server.addr + offset as u64;
    let mut all_ok = true;
    let mut step = |name: &str,
                    what: &str,
                    op: WrOp,
                    sg_list: Vec<xroce::verbs::Sge>,
                    check: &mut dyn FnMut(&Wc) -> anyhow::Result<(bool, String)>|
     -> anyhow::Result<()> {
        writeln!(out, "{name}: {what}")?;
        let t = Instant::now();
        ep.qp.post_send(&SendWr {
            wr_id: 1,
            op,
            sg_list,
            flags: SendFlags::SIGNALED,
            ud: None,
        })?;
        let wc = one_wc(&ep.cq)?;
        let took = t.elapsed();
        let (ok, detail) = if wc.status != WcStatus::Success {
            (false, format!("completion status {:?}", wc.status))
        } else {
            check(&wc)?
        };
        all_ok &= ok;
        writeln!(
            out,
            "  {} completed in {:.0} us; {}",
            if ok { "✓" } else { "✗" },
            took.as_secs_f64() * 1e6,
            detail
        )?;
        Ok(())
    };
    let mut ask = |request: Request| -> anyhow::Result<(bool, String)> {
        send_json(&mut writer, &request)?;
        let reply: Reply = recv_json(&mut reader)?;
        Ok((reply.ok, format!("server says: {}", reply.detail)))
    };

    ep.mr.write(0, &pattern(size, 1))?;
    step(
        "SEND",
        "copies our buffer into the next receive buffer the server posted; both sides get a completion",
        WrOp::Send,
        local(0, size)?,
        &mut |_| {
            ask(Request::CheckRecv {
                seed: 1,
                len: size,
                imm: None,
                opcode: "recv".into(),
                offset: layout.recv(),
            })
        },
    )?;
    ep.mr.write(0, &pattern(size, 2))?;
    step(
        "SEND_WITH_IMM",
        "a SEND that also carries 32 bits of immediate data, delivered in the server's completion",
        WrOp::SendWithImm { imm: 0x1234_abcd },
        local(0, size)?,
        &mut |_| {
            ask(Request::CheckRecv {
                seed: 2,
                len: size,
                imm: Some(0x1234_abcd),
                opcode: "recv".into(),
                offset: layout.recv(),
            })
        },
    )?;
    ep.mr.write(0, &pattern(size, 3))?;
    step(
        "RDMA_WRITE",
        "writes straight into the server's memory at an address + R_Key it gave us; the server's CPU is not involved",
        WrOp::Write {
            remote_addr: remote(layout.write()),
            rkey: server.rkey,
        },
        local(0, size)?,
        &mut |_| {
            ask(Request::CheckMem {
                offset: layout.write(),
                len: size,
                seed: 3,
            })
        },
    )?;
    ep.mr.write(0, &pattern(size, 5))?;
    step(
        "RDMA_WRITE_WITH_IMM",
        "an RDMA WRITE whose last packet carries immediate data; it consumes a receive so the server learns it happened",
        WrOp::WriteWithImm {
            remote_addr: remote(layout.write()),
            rkey: server.rkey,
            imm: 0xfeed_f00d,
        },
        local(0, size)?,
        &mut |_| {
            ask(Request::CheckRecv {
                seed: 5,
                len: size,
                imm: Some(0xfeed_f00d),
                opcode: "recv_rdma_with_imm".into(),
                offset: layout.write(),
            })
        },
    )?;
    let read_dst = size;
    step(
        "RDMA_READ",
        "fetches bytes from the server's memory into ours; the server answers with READ response packets",
        WrOp::Read {
            remote_addr: remote(layout.read_src()),
            rkey: server.rkey,
        },
        local(read_dst, size)?,
        &mut |wc| {
            let ok = ep.mr.to_vec(read_dst, size)? == pattern(size, 4) && wc.opcode == WcOpcode::RdmaRead;
            Ok((ok, format!("{size} bytes read {}", if ok { "match" } else { "DIFFER" })))
        },
    )?;
    let result_at = 2 * size;
    step(
        "FETCH_ADD",
        "atomically adds 23 to a 64-bit value in the server's memory and returns the old value",
        WrOp::FetchAdd {
            remote_addr: remote(layout.atomic()),
            rkey: server.rkey,
            add: 23,
        },
        vec![ep.mr.sge(result_at, 8)?],
        &mut |_| {
            let orig = ep.mr.read_u64(result_at)?;
            let (ok, detail) = ask(Request::CheckU64 {
                expect: ATOMIC_INITIAL + 23,
            })?;
            Ok((
                ok && orig == ATOMIC_INITIAL,
                format!("returned old value {orig} (expected {ATOMIC_INITIAL}); {detail}"),
            ))
        },
    )?;
    step(
        "CMP_SWAP",
        "atomically replaces the value with 0xC0FFEE if it equals 123, and returns the old value",
        WrOp::CompareSwap {
            remote_addr: remote(layout.atomic()),
            rkey: server.rkey,
            compare: ATOMIC_INITIAL + 23,
            swap: 0xC0FFEE,
        },
        vec![ep.mr.sge(result_at, 8)?],
        &mut |_| {
            let orig = ep.mr.read_u64(result_at)?;
            let (ok, detail) = ask(Request::CheckU64 { expect: 0xC0FFEE })?;
            Ok((
                ok && orig == ATOMIC_INITIAL + 23,
                format!("returned old value {orig} (expected 123); {detail}"),
            ))
        },
    )?;
    send_json(&mut writer, &Request::Done)?;
    let _: Reply = recv_json(&mut reader)?;

    let frames = dev.take_trace();
    if trace > 0 {
        writeln!(out, "\nPacket trace (client side; → sent, ← received):")?;
        writeln!(
            out,
            "  Every packet carries a PSN (packet sequence number, 24 bits). A message longer than\n  \
             the path MTU is split into FIRST, MIDDLE..., LAST packets; AckReq asks the responder\n  \
             to acknowledge. The ACK's AETH says ACK (or NAK) and the MSN, the count of messages\n  \
             the responder has completed. RETH carries the remote address, R_Key and length of an\n  \
             RDMA WRITE or READ; AtomicETH the operands of an atomic."
        )?;
        print_trace(&frames, trace, out)?;
    }
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
    Ok(all_ok)
}

/// Prints a packet trace, folding runs of MIDDLE packets into one line.
fn print_trace(frames: &[TracedFrame], limit: usize, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut lines: Vec<String> = Vec::new();
    let mut i = 0;
    while i < frames.len() {
        let f = &frames[i];
        let arrow = if f.outgoing { "→" } else { "←" };
        let Ok(parsed) = xroce::wire::parse_frame(&f.bytes) else {
            lines.push(format!(
                "{:>9.3} ms {arrow} (not a RoCE frame, {} bytes)",
                ms(f.at),
                f.bytes.len()
            ));
            i += 1;
            continue;
        };
        let roce = &parsed.repr.roce;
        let name = roce.bth.opcode.name();
        if name.contains("MIDDLE") {
            let mut j = i + 1;
            while j < frames.len()
                && frames[j].outgoing == f.outgoing
                && xroce::wire::parse_frame(&frames[j].bytes)
                    .map(|p| p.repr.roce.bth.opcode.name() == name)
                    .unwrap_or(false)
            {
                j += 1;
            }
            if j - i > 1 {
                lines.push(format!(
                    "{:>9.3} ms {arrow} {} x {name} (PSN {:#08x} ..), {} bytes each",
                    ms(f.at),
                    j - i,
                    roce.bth.psn.value(),
                    roce.payload.len()
                ));
                i = j;
                continue;
            }
        }
        let mut extra = String::new();
        if let Some(reth) = &roce.reth {
            extra += &format!(
                " RETH va {:#x} rkey {:#x} len {}",
                reth.va, reth.rkey, reth.dma_len
            );
        }
        if let Some(aeth) = &roce.aeth {
            extra += &format!(" AETH {} msn {}", aeth.syndrome, aeth.msn);
        }
        if let Some(imm) = roce.immdt {
            extra += &format!(" imm {imm:#x}");
        }
        if let Some(a) = &roce.atomic_eth {
            extra += &format!(
                " AtomicETH va {:#x} add/swap {:#x} compare {:#x}",
                a.va, a.swap_add, a.compare
            );
        }
        if let Some(a) = &roce.atomic_ack_eth {
            extra += &format!(" original value {:#x}", a.orig_data);
        }
        lines.push(format!(
            "{:>9.3} ms {arrow} {name} QP {:#x} PSN {:#08x}{}{} {} B payload{}",
            ms(f.at),
            roce.bth.dest_qp,
            roce.bth.psn.value(),
            if roce.bth.ack_req { " AckReq" } else { "" },
            extra,
            roce.payload.len(),
            if parsed.icrc_ok() {
                ""
            } else {
                " (ICRC not checkable here)"
            }
        ));
        i += 1;
    }
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

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
