//! Raw driver throughput over a veth pair between two namespaces (needs root):
//! `cargo bench --bench driver_throughput [-- FRAMES]`.
//!
//! For each driver (AF_XDP, UDP socket) and frame size, a sender process in namespace A
//! pushes FRAMES RoCE frames as fast as the driver takes them, and a receiver process in
//! namespace B counts them. Reported: frames received, loss, and the receive rate measured
//! from the first to the last frame. The sender emits each frame as the engine does; `xdp`
//! hands it to `Driver::send` (one copy into the UMEM), `xdp-with` emits it straight into the
//! UMEM frame through `Driver::send_with`. There is no flow control at this level, so a receiver
//! slower than the sender shows up as loss, not as a lower send rate.
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use xroce::driver::udp::{UdpConfig, UdpDriver};
use xroce::driver::xdp::{XdpConfig, XdpDriver};
use xroce::driver::{poll_readable, Driver, DriverError};
use xroce::netns::{LinkConfig, Netns, VethLink};
use xroce::wire::{EthRepr, FrameRepr};

/// The frame of packet `psn`, as the engine would build it.
fn frame_repr(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    dst_mac: [u8; 6],
    payload: &[u8],
    psn: u32,
) -> FrameRepr<'_> {
    let eth = EthRepr {
        dst: dst_mac,
        src: [2, 0, 0, 0, 0, 1],
        vlan: None,
    };
    FrameRepr::rc_write_only_v4(eth, src, dst, payload, psn)
}

fn open(kind: &str, ifname: &str, ip: Ipv4Addr) -> Box<dyn Driver> {
    match kind {
        "xdp" | "xdp-with" => {
            Box::new(XdpDriver::open(&XdpConfig::new(ifname)).expect("open AF_XDP driver"))
        }
        _ => Box::new(
            UdpDriver::open(&UdpConfig::new(ifname, IpAddr::V4(ip))).expect("open UDP driver"),
        ),
    }
}

fn child_main(role: &str) {
    let var = |n: &str| std::env::var(n).unwrap();
    let kind = var("KIND");
    let ip: Ipv4Addr = var("LOCAL_IP").parse().unwrap();
    let mut d = open(&kind, &var("IFNAME"), ip);
    let count: u64 = var("COUNT").parse().unwrap();
    let mut out = std::io::stdout();
    writeln!(out, "READY").unwrap();
    out.flush().unwrap();
    if role == "send" {
        let peer: Ipv4Addr = var("PEER_IP").parse().unwrap();
        let mac: Vec<u8> = (0..6)
            .map(|i| u8::from_str_radix(&var("PEER_MAC")[i * 2..i * 2 + 2], 16).unwrap())
            .collect();
        let size: usize = var("SIZE").parse().unwrap();
        let payload = vec![0xa5u8; size];
        let mac: [u8; 6] = mac.try_into().unwrap();
        // Each frame is emitted anew, as the engine does: into a buffer handed to `send`
        // (which copies it into the driver's memory), or with `send_with` ("xdp-with")
        // straight into the AF_XDP UMEM frame.
        let mut buf = vec![0u8; 9216];
        let in_place = kind == "xdp-with";
        let start = Instant::now();
        let mut sent = 0u64;
        while sent < count {
            let f = frame_repr(ip, peer, mac, &payload, sent as u32);
            let result = if in_place {
                d.send_with(f.buffer_len(), &mut |b| f.emit(b).ok())
                    .map(|_| ())
            } else {
                let n = f.emit(&mut buf).expect("valid frame");
                d.send(&buf[..n])
            };
            match result {
                Ok(()) => sent += 1,
                Err(DriverError::TxBusy) => d.flush().unwrap(),
                Err(e) => panic!("send: {e}"),
            }
            if sent % 64 == 0 {
                d.flush().unwrap();
            }
        }
        d.flush().unwrap();
        let secs = start.elapsed().as_secs_f64();
        writeln!(out, "SENT {sent} {secs}").unwrap();
        std::thread::sleep(Duration::from_millis(300));
    } else {
        let mut got = 0u64;
        let mut bytes = 0u64;
        let mut first = None;
        let mut last = Instant::now();
        let started = Instant::now();
        loop {
            let readable =
                poll_readable(d.wait_fd().unwrap(), Some(Duration::from_millis(500))).unwrap();
            let n = d.recv(256, &mut |f, _| bytes += f.len() as u64).unwrap() as u64;
            if n > 0 {
                first.get_or_insert_with(Instant::now);
                last = Instant::now();
                got += n;
            }
            let quiet = n == 0 && !readable;
            let gave_up = first.is_none() && started.elapsed() > Duration::from_secs(20);
            if got >= count || (quiet && first.is_some()) || gave_up {
                break;
            }
        }
        let secs = first.map(|f| (last - f).as_secs_f64()).unwrap_or(0.0);
        writeln!(out, "GOT {got} {bytes} {secs}").unwrap();
    }
    out.flush().unwrap();
}

fn spawn(
    ns: &Netns,
    role: &str,
    env: &[(&str, String)],
) -> (Child, std::sync::mpsc::Receiver<String>) {
    let mut cmd = ns.command(std::env::current_exe().unwrap());
    cmd.env("XROCE_BENCH_ROLE", role).stdout(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    (child, rx)
}

fn main() {
    if let Ok(role) = std::env::var("XROCE_BENCH_ROLE") {
        return child_main(&role);
    }
    if !xroce::netns::is_privileged() {
        eprintln!("SKIPPED: driver_throughput needs root (namespaces, XDP)");
        return;
    }
    let count: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(200_000);
    println!(
        "driver throughput over veth, {count} frames per run (receive rate, first to last frame)"
    );
    println!(
        "{:<8} {:>6} {:>10} {:>8} {:>12} {:>10} {:>12}",
        "drv", "frame", "received", "loss", "frames/s", "Gbit/s", "sent/s"
    );
    for (mtu, sizes) in [(1500u32, &[64usize, 1024][..]), (9000, &[4096][..])] {
        let link = VethLink::create(&LinkConfig {
            mtu,
            ..LinkConfig::default()
        })
        .expect("veth");
        link.add_static_neighbours().expect("neighbours");
        for kind in ["xdp", "xdp-with", "udp"] {
            for &size in sizes {
                let base = |ifn: &str, ip: Ipv4Addr| {
                    vec![
                        ("KIND", kind.to_string()),
                        ("IFNAME", ifn.to_string()),
                        ("LOCAL_IP", ip.to_string()),
                        ("COUNT", count.to_string()),
                    ]
                };
                let (mut rx, rx_lines) = spawn(&link.b, "recv", &base(&link.b_if, link.b_ip));
                assert_eq!(
                    rx_lines.recv_timeout(Duration::from_secs(20)).unwrap(),
                    "READY"
                );
                let mut env = base(&link.a_if, link.a_ip);
                env.push(("PEER_IP", link.b_ip.to_string()));
                env.push((
                    "PEER_MAC",
                    link.b_mac.iter().map(|b| format!("{b:02x}")).collect(),
                ));
                env.push(("SIZE", size.to_string()));
                let (mut tx, tx_lines) = spawn(&link.a, "send", &env);
                let _ = tx_lines.recv_timeout(Duration::from_secs(20));
                let got = rx_lines
                    .recv_timeout(Duration::from_secs(120))
                    .expect("receiver result");
                let sent = tx_lines
                    .recv_timeout(Duration::from_secs(120))
                    .unwrap_or_default();
                let _ = tx.wait();
                let _ = rx.wait();
                let f: Vec<f64> = got
                    .split_whitespace()
                    .skip(1)
                    .map(|v| v.parse().unwrap())
                    .collect();
                let (n, bytes, secs) = (f[0], f[1], f[2].max(1e-9));
                let frame_len = if n > 0.0 { bytes / n } else { 0.0 };
                // The sender's own rate: how fast the driver took the frames.
                let tx: Vec<f64> = sent
                    .split_whitespace()
                    .skip(1)
                    .filter_map(|v| v.parse().ok())
                    .collect();
                let tx_rate = match tx[..] {
                    [frames, secs] if secs > 0.0 => frames / secs,
                    _ => 0.0,
                };
                println!(
                    "{:<8} {:>6.0} {:>10.0} {:>7.2}% {:>12.0} {:>10.2} {:>12.0}",
                    kind,
                    frame_len,
                    n,
                    100.0 * (1.0 - n / count as f64),
                    n / secs,
                    bytes * 8.0 / secs / 1e9,
                    tx_rate
                );
            }
        }
    }
}
