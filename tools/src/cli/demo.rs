//! `xroce demo`: two xroce endpoints doing every RDMA operation over a real (virtual) link,
//! explained for a newcomer, verified byte for byte.
//!
//! This file is the set-up: which driver, and where the two endpoints run. As root (default
//! driver `xdp`): two network namespaces joined by a veth pair, one endpoint process in each
//! (`xroce demo-peer`, started with `ip netns exec`), each on its own AF_XDP socket. Without
//! root: the same two endpoints in one process over the kernel UDP driver on loopback
//! (`udp`), or over the in-memory link (`sim`). What the endpoints do, say and check is the
//! story in `xroce_tools::demo`.
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

use xroce::verbs::{mem_link_config, Device, DeviceConfig};
use xroce_tools::demo::{self as story, device_config, Side};
use xroce_tools::endpoint::verbs::DriverChoice;
use xroce_tools::setup;

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
    let config = device_config(DriverChoice::Udp, None);
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
        let (mut stream, _) = listener.accept()?;
        server(&server_dev, &mut stream, size, &mut log)?;
        Ok(String::from_utf8_lossy(&log).into_owned())
    });
    let mut stream = TcpStream::connect(addr)?;
    let mut out = std::io::stdout();
    let client_result = client(&client_dev, &mut stream, size, args.trace, &mut out);
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

/// The server's whole part: the story, then the counters.
fn server(
    dev: &Device,
    stream: &mut TcpStream,
    size: usize,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut ep = story::open_endpoint(dev, Side::Server, size)?;
    story::server(ep.as_mut(), stream, size, dev.name(), out)?;
    story::server_counters(dev, out)
}

/// The client's whole part: the story, then the packet trace and the counters.
fn client(
    dev: &Device,
    stream: &mut TcpStream,
    size: usize,
    trace: usize,
    out: &mut dyn Write,
) -> anyhow::Result<bool> {
    let mut ep = story::open_endpoint(dev, Side::Client, size)?;
    let driver = dev.driver_info().mode.as_str();
    let ok = story::client(ep.as_mut(), stream, size, dev.name(), driver, out)?;
    let frames = dev.take_trace();
    if trace > 0 {
        story::print_trace(&frames, trace, out)?;
    }
    story::client_counters(dev, out)?;
    Ok(ok)
}

/// Runs `xroce demo-peer` (one endpoint, inside a namespace).
pub fn run_peer(args: PeerArgs) -> anyhow::Result<i32> {
    let driver = match args.driver {
        DemoDriver::Xdp => DriverChoice::Xdp,
        DemoDriver::Udp => DriverChoice::Udp,
        DemoDriver::Sim => {
            bail!("the sim driver runs in one process: use `xroce demo --driver sim`")
        }
    };
    let dev = Device::open(&args.ifname, device_config(driver, args.pcap.clone()))
        .with_context(|| format!("opening the xroce device on {}", args.ifname))?;
    let size = args.size as usize;
    let mut out = std::io::stdout();
    match args.role.as_str() {
        "server" => {
            let listener = TcpListener::bind(args.addr)
                .with_context(|| format!("listening on {}", args.addr))?;
            let (mut stream, _) = listener.accept()?;
            stream.set_nodelay(true)?;
            server(&dev, &mut stream, size, &mut out)?;
            Ok(0)
        }
        "client" => {
            let mut stream = setup::connect(
                &args.addr.ip().to_string(),
                args.addr.port(),
                Duration::from_secs(10),
            )?;
            let ok = client(&dev, &mut stream, size, args.trace, &mut out)?;
            Ok(if ok { 0 } else { 1 })
        }
        other => bail!("--role must be server or client, not {other:?}"),
    }
}
