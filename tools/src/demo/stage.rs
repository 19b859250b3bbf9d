//! Where `xroce demo`'s two endpoints run: as root, two network namespaces joined by a veth
//! pair with one endpoint process in each (`xroce demo-peer`, started with `ip netns exec`),
//! each on its own AF_XDP socket; without root, both endpoints in one process over the
//! kernel UDP driver on loopback, or over the in-memory link. What the endpoints do, say and
//! check is the story in [`super`].
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

use xroce::verbs::{mem_link_config, Device, DeviceConfig};

use super::{client_counters, device_config, open_endpoint, print_trace, server_counters, Side};
use crate::endpoint::verbs::DriverChoice;
use crate::setup;

/// Which driver the demo runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DemoDriver {
    /// AF_XDP in two network namespaces joined by a veth pair.
    Xdp,
    /// Kernel UDP sockets on port 4791, both endpoints on loopback.
    Udp,
    /// The in-memory link.
    Sim,
}

impl DemoDriver {
    /// Every choice, in the order `--help` lists them.
    pub const ALL: [DemoDriver; 3] = [DemoDriver::Xdp, DemoDriver::Udp, DemoDriver::Sim];

    /// The name `--driver` takes.
    pub fn name(self) -> &'static str {
        match self {
            DemoDriver::Xdp => "xdp",
            DemoDriver::Udp => "udp",
            DemoDriver::Sim => "sim",
        }
    }

    /// One line for `--help`.
    pub fn about(self) -> &'static str {
        match self {
            DemoDriver::Xdp => {
                "AF_XDP in two network namespaces joined by a veth pair (needs root)"
            }
            DemoDriver::Udp => {
                "Kernel UDP sockets on port 4791, both endpoints on loopback (no root needed)"
            }
            DemoDriver::Sim => "The in-memory link: no kernel at all",
        }
    }
}

impl std::str::FromStr for DemoDriver {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DemoDriver::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("unknown demo driver {s:?}: choose xdp, udp or sim"))
    }
}

/// What the demo shows.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Link MTU of the veth pair.
    pub mtu: u32,
    /// Message size of SEND, WRITE and READ.
    pub size: u32,
    /// Most packets to show in the trace (0: no trace).
    pub trace: usize,
    /// Write every frame the client endpoint sends and receives here (pcap).
    pub pcap: Option<PathBuf>,
}

/// One endpoint process of the namespaced demo.
#[derive(Debug, Clone)]
pub struct PeerOptions {
    /// Server or client.
    pub side: Side,
    /// Interface to open.
    pub ifname: String,
    /// The driver (xdp or udp).
    pub driver: DemoDriver,
    /// Server: address to listen on; client: the server's.
    pub addr: SocketAddr,
    /// Message size.
    pub size: u32,
    /// Most packets to show in the trace.
    pub trace: usize,
    /// This endpoint's frames to a pcap file.
    pub pcap: Option<PathBuf>,
}

/// The driver the demo uses when none is asked for (xdp as root when built with it, udp
/// otherwise, saying why), or the error for one this process cannot use.
pub fn choose_driver(requested: Option<DemoDriver>) -> anyhow::Result<DemoDriver> {
    let root = xroce::netns::is_privileged();
    Ok(match requested {
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
    })
}

/// The whole demo on `driver`: the introduction, both endpoints, the verdict; whether every
/// operation was verified. `exe` is the `xroce` binary the namespaced endpoints run.
pub fn run_demo(
    driver: DemoDriver,
    opts: &DemoOptions,
    exe: &std::path::Path,
) -> anyhow::Result<bool> {
    intro(driver, opts);
    let ok = match driver {
        DemoDriver::Xdp => run_namespaces(opts, exe)?,
        DemoDriver::Udp | DemoDriver::Sim => run_in_process(opts, driver)?,
    };
    if ok {
        println!(
            "\nAll operations verified: every byte and every atomic value is what it should be."
        );
    } else {
        println!("\nDEMO FAILED: see the first ✗ above.");
    }
    Ok(ok)
}

pub fn intro(driver: DemoDriver, opts: &DemoOptions) {
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
            opts.mtu
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
pub fn run_namespaces(opts: &DemoOptions, exe: &std::path::Path) -> anyhow::Result<bool> {
    let link = xroce::netns::VethLink::create(&xroce::netns::LinkConfig {
        mtu: opts.mtu,
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
    let server_addr = SocketAddr::new(IpAddr::V4(link.b_ip), 18515);
    let peer = |ns: &xroce::netns::Netns, role: &str, ifname: &str| {
        let mut cmd = ns.command(exe);
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
            &opts.size.to_string(),
            "--trace",
            &opts.trace.to_string(),
        ])
        .stdin(Stdio::null());
        cmd
    };
    let mut server_cmd = peer(&link.b, "server", &link.b_if);
    server_cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let server = link.b.spawn(&mut server_cmd)?;
    let mut client_cmd = peer(&link.a, "client", &link.a_if);
    if let Some(pcap) = &opts.pcap {
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
pub fn run_in_process(opts: &DemoOptions, driver: DemoDriver) -> anyhow::Result<bool> {
    let config = device_config(DriverChoice::Udp, None);
    // `sim` ignores the driver kind: the in-memory link is its driver.
    let (client_dev, server_dev) = match driver {
        DemoDriver::Sim => {
            let (a, b, _link) = Device::mem_pair(
                &mem_link_config(opts.mtu, 0.0, 1),
                DeviceConfig {
                    pcap: opts.pcap.clone(),
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
                    pcap: opts.pcap.clone(),
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
    let size = opts.size as usize;
    let server = std::thread::spawn(move || -> anyhow::Result<String> {
        let mut log = Vec::new();
        let (mut stream, _) = listener.accept()?;
        server_part(&server_dev, &mut stream, size, &mut log)?;
        Ok(String::from_utf8_lossy(&log).into_owned())
    });
    let mut stream = TcpStream::connect(addr)?;
    let mut out = std::io::stdout();
    let client_result = client_part(&client_dev, &mut stream, size, opts.trace, &mut out);
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
fn server_part(
    dev: &Device,
    stream: &mut TcpStream,
    size: usize,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut ep = open_endpoint(dev, Side::Server, size)?;
    super::server(ep.as_mut(), stream, size, dev.name(), out)?;
    server_counters(dev, out)
}

/// The client's whole part: the story, then the packet trace and the counters.
fn client_part(
    dev: &Device,
    stream: &mut TcpStream,
    size: usize,
    trace: usize,
    out: &mut dyn Write,
) -> anyhow::Result<bool> {
    let mut ep = open_endpoint(dev, Side::Client, size)?;
    let driver = dev.driver_info().mode.as_str();
    let ok = super::client(ep.as_mut(), stream, size, dev.name(), driver, out)?;
    let frames = dev.take_trace();
    if trace > 0 {
        print_trace(&frames, trace, out)?;
    }
    client_counters(dev, out)?;
    Ok(ok)
}

/// One endpoint of `run_namespaces`, in its namespace; whether its part went well.
pub fn run_peer(args: PeerOptions) -> anyhow::Result<bool> {
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
    match args.side {
        Side::Server => {
            let listener = TcpListener::bind(args.addr)
                .with_context(|| format!("listening on {}", args.addr))?;
            let (mut stream, _) = listener.accept()?;
            stream.set_nodelay(true)?;
            server_part(&dev, &mut stream, size, &mut out)?;
            Ok(true)
        }
        Side::Client => {
            let mut stream = setup::connect(
                &args.addr.ip().to_string(),
                args.addr.port(),
                Duration::from_secs(10),
            )?;
            client_part(&dev, &mut stream, size, args.trace, &mut out)
        }
    }
}
