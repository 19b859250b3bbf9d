//! The verbs API over real (virtual) links: two network namespaces joined by a veth pair, an
//! xroce endpoint process in each (this test binary re-run as a helper via `ip netns exec`),
//! over AF_XDP and over the kernel UDP driver.
//!
//! Both endpoints run the whole operation suite towards each other at the same time (both
//! directions): SEND, SEND_WITH_IMM, RDMA_WRITE (checked by reading it back), RDMA_WRITE_WITH_IMM,
//! RDMA_READ, FETCH_ADD, CMP_SWAP, for message sizes from 0 bytes to several MiB, at path MTU
//! 1024 (1500-byte link) and 4096 (9000-byte link), on many QPs at once; a peer that vanishes
//! gives RETRY_EXC_ERR within the configured timeout; ping still works while xroce runs.
//!
//! Needs root: under XROCE_CI=1 a missing privilege fails; otherwise the tests skip visibly.
mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::{privileged_or_skip, Helper};
use xroce::netns::{LinkConfig, VethLink};
use xroce::verbs::*;

const HELPER_TIMEOUT: Duration = Duration::from_secs(120);
const TCP_PORT: u16 = 18600;

// ---------------------------------------------------------------------------------------
// The helper: one endpoint, configured by environment variables.

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("helper needs {name}"))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(seed | 1).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
struct Info {
    qpn: u32,
    psn: u32,
    rkey: u32,
    addr: u64,
}

/// Per-QP memory layout (identical on both sides).
#[derive(Clone, Copy)]
struct Layout {
    max: usize,
    sizes_total: usize,
}

impl Layout {
    fn src(&self) -> usize {
        0
    }
    fn written(&self) -> usize {
        self.max
    }
    fn read_src(&self) -> usize {
        2 * self.max
    }
    fn read_dst(&self) -> usize {
        3 * self.max
    }
    fn atomic(&self) -> usize {
        (4 * self.max).div_ceil(8) * 8
    }
    fn atomic_result(&self) -> usize {
        self.atomic() + 8
    }
    fn recv(&self) -> usize {
        self.atomic() + 16
    }
    fn len(&self) -> usize {
        self.recv() + 2 * self.sizes_total + 64
    }
}

struct QpSide {
    /// Send completions.
    cq: Cq,
    /// Receive completions (a separate CQ, so waiting for one kind never takes the other).
    rcq: Cq,
    qp: Qp,
    mr: Mr,
    psn: u32,
}

fn line_io(stream: &TcpStream) -> (TcpStream, BufReader<TcpStream>) {
    (
        stream.try_clone().unwrap(),
        BufReader::new(stream.try_clone().unwrap()),
    )
}

fn send_line<T: serde::Serialize>(w: &mut TcpStream, v: &T) {
    let mut s = serde_json::to_string(v).unwrap();
    s.push('\n');
    w.write_all(s.as_bytes()).unwrap();
}

fn recv_line<T: for<'de> serde::Deserialize<'de>>(r: &mut BufReader<TcpStream>) -> Option<T> {
    let mut s = String::new();
    match r.read_line(&mut s) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(serde_json::from_str(&s).unwrap()),
    }
}

fn say(s: String) {
    let out = std::io::stdout();
    let mut o = out.lock();
    writeln!(o, "{s}").unwrap();
    o.flush().unwrap();
}

fn wait_wc(cq: &Cq, what: &str) -> Result<Wc, String> {
    let wcs = cq
        .wait(1, Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    wcs.into_iter()
        .next()
        .ok_or_else(|| format!("no completion for {what} within 30 s"))
}

fn post(qp: &Qp, op: WrOp, sg: Vec<Sge>) -> Result<(), String> {
    qp.post_send(&SendWr {
        wr_id: 0,
        op,
        sg_list: sg,
        flags: SendFlags::SIGNALED,
        ud: None,
    })
    .map_err(|e| e.to_string())
}

fn expect_ok(wc: Wc, what: &str) -> Result<Wc, String> {
    if wc.status == WcStatus::Success {
        Ok(wc)
    } else {
        Err(format!(
            "{what}: completion {:?} ({})",
            wc.status,
            wc.status.as_str()
        ))
    }
}

/// This side's operations towards the peer on one QP, checking every byte and value.
fn run_ops(side: &QpSide, peer: &Info, layout: Layout, sizes: &[usize]) -> Result<(), String> {
    let mr = &side.mr;
    let remote = |off: usize| peer.addr + off as u64;
    let sg = |off: usize, len: usize| -> Vec<Sge> {
        if len == 0 {
            vec![]
        } else {
            vec![mr.sge(off, len as u32).unwrap()]
        }
    };
    for (k, &len) in sizes.iter().enumerate() {
        let seed = (k as u8).wrapping_mul(7).wrapping_add(1);
        mr.write(layout.src(), &pattern(len, seed)).unwrap();
        expect_ok(wait_after(side, WrOp::Send, sg(layout.src(), len))?, "SEND")?;
        expect_ok(
            wait_after(
                side,
                WrOp::SendWithImm {
                    imm: 0xabc0_0000 | k as u32,
                },
                sg(layout.src(), len),
            )?,
            "SEND_WITH_IMM",
        )?;
        // WRITE, then READ it back: the bytes really landed in the peer's memory.
        mr.write(layout.src(), &pattern(len, seed ^ 0x55)).unwrap();
        expect_ok(
            wait_after(
                side,
                WrOp::Write {
                    remote_addr: remote(layout.written()),
                    rkey: peer.rkey,
                },
                sg(layout.src(), len),
            )?,
            "RDMA_WRITE",
        )?;
        read_and_check(
            side,
            peer,
            layout,
            layout.written(),
            len,
            seed ^ 0x55,
            "RDMA_WRITE",
        )?;
        mr.write(layout.src(), &pattern(len, seed ^ 0x66)).unwrap();
        expect_ok(
            wait_after(
                side,
                WrOp::WriteWithImm {
                    remote_addr: remote(layout.written()),
                    rkey: peer.rkey,
                    imm: 0xdef0_0000 | k as u32,
                },
                sg(layout.src(), len),
            )?,
            "RDMA_WRITE_WITH_IMM",
        )?;
        read_and_check(
            side,
            peer,
            layout,
            layout.written(),
            len,
            seed ^ 0x66,
            "WRITE_WITH_IMM",
        )?;
        // READ of the peer's pre-filled region.
        read_and_check(
            side,
            peer,
            layout,
            layout.read_src(),
            len,
            0x77,
            "RDMA_READ",
        )?;
    }
    // Atomics on the peer's 64-bit word that only we touch.
    let result = layout.atomic_result();
    let target = remote(layout.atomic());
    let atomic = |op: WrOp, expect_orig: u64, what: &str| -> Result<(), String> {
        expect_ok(
            wait_after(side, op, vec![mr.sge(result, 8).unwrap()])?,
            what,
        )?;
        let orig = mr.read_u64(result).unwrap();
        if orig != expect_orig {
            return Err(format!(
                "{what}: original value {orig}, expected {expect_orig}"
            ));
        }
        Ok(())
    };
    atomic(
        WrOp::FetchAdd {
            remote_addr: target,
            rkey: peer.rkey,
            add: 5,
        },
        1000,
        "FETCH_ADD",
    )?;
    atomic(
        WrOp::CompareSwap {
            remote_addr: target,
            rkey: peer.rkey,
            compare: 1005,
            swap: 99,
        },
        1005,
        "CMP_SWAP (equal)",
    )?;
    atomic(
        WrOp::CompareSwap {
            remote_addr: target,
            rkey: peer.rkey,
            compare: 1,
            swap: 7,
        },
        99,
        "CMP_SWAP (not equal)",
    )?;
    atomic(
        WrOp::FetchAdd {
            remote_addr: target,
            rkey: peer.rkey,
            add: 1,
        },
        99,
        "FETCH_ADD 2",
    )?;
    Ok(())
}

fn wait_after(side: &QpSide, op: WrOp, sg: Vec<Sge>) -> Result<Wc, String> {
    post(&side.qp, op, sg)?;
    wait_wc(&side.cq, "send")
}

fn read_and_check(
    side: &QpSide,
    peer: &Info,
    layout: Layout,
    remote_off: usize,
    len: usize,
    seed: u8,
    what: &str,
) -> Result<(), String> {
    let sg = if len == 0 {
        vec![]
    } else {
        vec![side.mr.sge(layout.read_dst(), len as u32).unwrap()]
    };
    let wc = wait_after(
        side,
        WrOp::Read {
            remote_addr: peer.addr + remote_off as u64,
            rkey: peer.rkey,
        },
        sg,
    )?;
    expect_ok(wc, &format!("RDMA_READ after {what}"))?;
    let got = side.mr.to_vec(layout.read_dst(), len).unwrap();
    if got != pattern(len, seed) {
        let at = got
            .iter()
            .zip(pattern(len, seed))
            .position(|(a, b)| *a != b);
        return Err(format!("{what}: {len} bytes differ (first at {at:?})"));
    }
    Ok(())
}

/// The receive side: 3 receive completions per size, in order, with the right data.
fn check_receives(side: &QpSide, layout: Layout, sizes: &[usize]) -> Result<(), String> {
    let mut off = layout.recv();
    for (k, &len) in sizes.iter().enumerate() {
        let seed = (k as u8).wrapping_mul(7).wrapping_add(1);
        for (i, imm) in [None, Some(0xabc0_0000 | k as u32)].into_iter().enumerate() {
            let wc = expect_ok(wait_wc(&side.rcq, "receive")?, "receive")?;
            if wc.opcode != WcOpcode::Recv || wc.byte_len as usize != len || wc.imm_data != imm {
                return Err(format!(
                    "SEND {i} of size {len}: unexpected completion {wc:?}"
                ));
            }
            if side.mr.to_vec(off, len).unwrap() != pattern(len, seed) {
                return Err(format!("SEND {i} of size {len}: data differs"));
            }
            off += len.max(1);
        }
        let wc = expect_ok(
            wait_wc(&side.rcq, "write-imm receive")?,
            "WRITE_WITH_IMM receive",
        )?;
        if wc.opcode != WcOpcode::RecvRdmaWithImm
            || wc.imm_data != Some(0xdef0_0000 | k as u32)
            || wc.byte_len as usize != len
        {
            return Err(format!(
                "WRITE_WITH_IMM of size {len}: unexpected completion {wc:?}"
            ));
        }
    }
    Ok(())
}

/// Neighbour resolution through the kernel's table, from inside a namespace.
fn neigh_main() -> Result<String, String> {
    let ifname = env("XV_IFNAME");
    let peer: std::net::IpAddr = env("XV_PEER_IP").parse().unwrap();
    let absent: std::net::IpAddr = env("XV_ABSENT_IP").parse().unwrap();
    let before = xroce::netdev::neighbour_lookup(&ifname, peer).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mac = xroce::netdev::resolve_neighbour(&ifname, peer, Duration::from_secs(3))
        .map_err(|e| e.to_string())?;
    let resolve_ms = start.elapsed().as_millis();
    let start = Instant::now();
    let err = xroce::netdev::resolve_neighbour(&ifname, absent, Duration::from_millis(500))
        .expect_err("nobody has the absent address");
    let fail_ms = start.elapsed().as_millis();
    let typed = matches!(
        err,
        xroce::netdev::NetdevError::NeighbourTimeout { .. }
            | xroce::netdev::NetdevError::NeighbourFailed { .. }
    );
    Ok(format!(
        "before={before:?} mac={mac} resolve_ms={resolve_ms} absent_typed={typed} absent_ms={fail_ms} err={err}"
    ))
}

/// UD: the client sends datagrams of several sizes through an address handle.
fn ud_main(role: &str) -> Result<String, String> {
    let ifname = env("XV_IFNAME");
    let addr: SocketAddr = env("XV_ADDR").parse().unwrap();
    let sizes: Vec<usize> = env("XV_SIZES")
        .split(',')
        .map(|s| s.parse().unwrap())
        .collect();
    let driver = match env("XV_DRIVER").as_str() {
        "udp" => DriverKind::Udp,
        _ => DriverKind::Xdp,
    };
    let dev = Device::open(
        &ifname,
        DeviceConfig {
            driver,
            ..DeviceConfig::default()
        },
    )
    .map_err(|e| format!("opening {ifname}: {e}"))?;
    let sgid = dev.ipv4_gid_index().ok_or("no IPv4 GID")?;
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(256, None).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr::ud(&cq, &cq))
        .map_err(|e| e.to_string())?;
    const QKEY: u32 = 0x1111_2222;
    qp.ready_ud(QKEY, 0).map_err(|e| e.to_string())?;
    let slot = 40 + 4096;
    let mr = pd.reg_mr(slot * sizes.len(), Access::LOCAL_WRITE).unwrap();
    let gid = dev.query_gid(sgid).unwrap().to_hex();
    if role == "ud-server" {
        for i in 0..sizes.len() {
            qp.post_recv(&RecvWr {
                wr_id: i as u64,
                sg_list: vec![mr.sge(i * slot, slot as u32).unwrap()],
            })
            .unwrap();
        }
        let listener = TcpListener::bind(addr).map_err(|e| format!("listen {addr}: {e}"))?;
        say("LISTENING".into());
        let stream = listener.accept().map_err(|e| e.to_string())?.0;
        let (mut w, mut r) = line_io(&stream);
        send_line(&mut w, &(qp.qp_num(), gid));
        let client_qpn: u32 = recv_line(&mut r).ok_or("client closed")?;
        for (i, &len) in sizes.iter().enumerate() {
            let wc = expect_ok(wait_wc(&cq, "UD receive")?, "UD receive")?;
            let data = mr.to_vec(i * slot + 40, len).unwrap();
            if wc.wr_id != i as u64
                || wc.byte_len as usize != 40 + len
                || !wc.grh_present
                || wc.src_qp != client_qpn
                || data != pattern(len, i as u8 + 1)
            {
                return Err(format!(
                    "datagram {i} ({len} bytes): {wc:?}, data ok: {}",
                    data == pattern(len, i as u8 + 1)
                ));
            }
        }
        send_line(&mut w, &"ok");
        Ok(format!("received {} datagrams", sizes.len()))
    } else {
        let stream = {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match TcpStream::connect(addr) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() > deadline => return Err(format!("connect: {e}")),
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        };
        let (mut w, mut r) = line_io(&stream);
        let (server_qpn, server_gid): (u32, String) = recv_line(&mut r).ok_or("server closed")?;
        let ah = pd
            .create_ah(&AhAttr::new(
                Gid::from_hex(&server_gid).unwrap(),
                sgid as u8,
            ))
            .map_err(|e| format!("create_ah: {e}"))?;
        send_line(&mut w, &qp.qp_num());
        for (i, &len) in sizes.iter().enumerate() {
            mr.write(i * slot, &pattern(len, i as u8 + 1)).unwrap();
            let sg = if len == 0 {
                vec![]
            } else {
                vec![mr.sge(i * slot, len as u32).unwrap()]
            };
            qp.post_send(&SendWr {
                wr_id: i as u64,
                op: WrOp::Send,
                sg_list: sg,
                flags: SendFlags::SIGNALED,
                ud: Some(UdDest {
                    av: ah.av(),
                    remote_qpn: server_qpn,
                    remote_qkey: QKEY,
                }),
            })
            .map_err(|e| e.to_string())?;
            expect_ok(wait_wc(&cq, "UD send")?, "UD send")?;
        }
        let verdict: String = recv_line(&mut r).ok_or("server closed before its verdict")?;
        Ok(format!(
            "sent {} datagrams, server: {verdict}, dest mac {:?}",
            sizes.len(),
            ah.av().dest_mac
        ))
    }
}

fn helper_main(role: &str) -> Result<String, String> {
    if role == "neigh" {
        return neigh_main();
    }
    if role.starts_with("ud-") {
        return ud_main(role);
    }
    let ifname = env("XV_IFNAME");
    let driver = match env("XV_DRIVER").as_str() {
        "xdp" => DriverKind::Xdp,
        "udp" => DriverKind::Udp,
        other => return Err(format!("unknown driver {other}")),
    };
    let addr: SocketAddr = env("XV_ADDR").parse().unwrap();
    let sizes: Vec<usize> = env("XV_SIZES")
        .split(',')
        .map(|s| s.parse().unwrap())
        .collect();
    let qps: usize = env("XV_QPS").parse().unwrap();
    let mtu = Mtu::from_bytes(env("XV_MTU").parse().unwrap()).unwrap();
    let vanish = std::env::var("XV_VANISH").is_ok();
    let hold = Duration::from_millis(std::env::var("XV_HOLD_MS").map_or(0, |v| v.parse().unwrap()));
    let family6 = std::env::var("XV_FAMILY").is_ok_and(|v| v == "6");
    // The UDP driver sends from the one address it binds: for IPv6 GIDs, the global IPv6 one.
    let udp_local_ip = if family6 && driver == DriverKind::Udp {
        let net = xroce::netdev::query(&ifname).map_err(|e| e.to_string())?;
        net.addrs
            .iter()
            .map(|a| a.ip)
            .find(|ip| matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 != 0xfe80))
    } else {
        None
    };
    let dev = Device::open(
        &ifname,
        DeviceConfig {
            driver,
            udp_local_ip,
            ..DeviceConfig::default()
        },
    )
    .map_err(|e| format!("opening {ifname}: {e}"))?;
    let layout = Layout {
        max: sizes.iter().copied().max().unwrap_or(0).max(8),
        sizes_total: sizes.iter().map(|s| s.max(&1)).sum(),
    };
    // The source GID: IPv4-mapped by default; with XV_FAMILY=6 the global IPv6 address.
    let sgid = if family6 {
        dev.gid_table()
            .iter()
            .rev()
            .find(|e| !e.gid.is_ipv4())
            .ok_or("no IPv6 GID")?
            .index
    } else {
        dev.ipv4_gid_index().ok_or("no IPv4 GID")?
    };
    let pd = dev.alloc_pd().unwrap();
    let access =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let sides: Vec<QpSide> = (0..qps)
        .map(|i| {
            let cq = dev.create_cq(1024, None).unwrap();
            let rcq = dev.create_cq(1024, None).unwrap();
            let qp = pd.create_qp(&QpInitAttr::rc(&cq, &rcq)).unwrap();
            let mr = pd.reg_mr(layout.len(), access).unwrap();
            mr.write(layout.read_src(), &pattern(layout.max, 0x77))
                .unwrap();
            mr.write_u64(layout.atomic(), 1000).unwrap();
            qp.to_init(access, 0).unwrap();
            let mut off = layout.recv();
            for &len in &sizes {
                for _ in 0..2 {
                    qp.post_recv(&RecvWr {
                        wr_id: off as u64,
                        sg_list: vec![mr.sge(off, len.max(1) as u32).unwrap()],
                    })
                    .unwrap();
                    off += len.max(1);
                }
                qp.post_recv(&RecvWr {
                    wr_id: 1,
                    sg_list: vec![],
                })
                .unwrap();
            }
            QpSide {
                cq,
                rcq,
                qp,
                mr,
                psn: (0xfff000 + i as u32 * 0x101) & 0xffffff,
            }
        })
        .collect();
    let stream = if role == "server" {
        let listener = TcpListener::bind(addr).map_err(|e| format!("listen {addr}: {e}"))?;
        say(format!("LISTENING sgid={sgid} table={:?}", dev.gid_table()));
        listener.accept().map_err(|e| e.to_string())?.0
    } else {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match TcpStream::connect(addr) {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => return Err(format!("connect {addr}: {e}")),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    };
    let (mut w, mut r) = line_io(&stream);
    let mine: Vec<Info> = sides
        .iter()
        .map(|s| Info {
            qpn: s.qp.qp_num(),
            psn: s.psn,
            rkey: s.mr.rkey(),
            addr: s.mr.addr(),
        })
        .collect();
    send_line(
        &mut w,
        &(mine.clone(), dev.query_gid(sgid).unwrap().to_hex()),
    );
    let (theirs, gid): (Vec<Info>, String) = recv_line(&mut r).ok_or("peer closed early")?;
    let gid = Gid::from_hex(&gid).unwrap();
    let vanish_timeout = 12; // 4.096 us x 2^12 = 16.8 ms
    for (side, peer) in sides.iter().zip(&theirs) {
        let opts = RcOptions {
            sgid_index: sgid as u8,
            path_mtu: mtu,
            sq_psn: side.psn,
            timeout: if vanish { vanish_timeout } else { 14 },
            retry_cnt: if vanish { 3 } else { 7 },
            ..RcOptions::default()
        };
        side.qp
            .connect_rc(
                &RcPeer {
                    qpn: peer.qpn,
                    psn: peer.psn,
                    gid,
                },
                &opts,
            )
            .map_err(|e| format!("connect: {e}"))?;
    }
    // Both sides have posted their receives and are connected before anyone sends.
    send_line(&mut w, &"ready");
    let _: String = recv_line(&mut r).ok_or("peer closed before ready")?;
    if vanish {
        if role == "server" {
            say("VANISHING".into());
            std::process::exit(0);
        }
        // Wait for the peer's process to be gone (its end of the TCP connection closes).
        let gone: Option<String> = recv_line(&mut r);
        assert!(gone.is_none());
        std::thread::sleep(Duration::from_millis(50));
        let side = &sides[0];
        let start = Instant::now();
        post(
            &side.qp,
            WrOp::Write {
                remote_addr: theirs[0].addr,
                rkey: theirs[0].rkey,
            },
            vec![side.mr.sge(0, 64).unwrap()],
        )?;
        let wc = wait_wc(&side.cq, "write to a vanished peer")?;
        let took = start.elapsed();
        return Ok(format!(
            "status={:?} ms={} state={:?} retry_exceeded_err={}",
            wc.status,
            took.as_millis(),
            side.qp.state().unwrap(),
            dev.counters().retry_exceeded_err
        ));
    }
    let start = Instant::now();
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = sides
            .iter()
            .zip(&theirs)
            .map(|(side, peer)| {
                let sizes = &sizes;
                s.spawn(move || {
                    run_ops(side, peer, layout, sizes)?;
                    check_receives(side, layout, sizes)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let elapsed = start.elapsed();
    // Tell the peer we are done, and keep answering its requests until it is done too.
    send_line(&mut w, &"done");
    let _: Option<String> = recv_line(&mut r);
    for r in &results {
        r.clone()?;
    }
    let c = dev.counters();
    let summary = format!(
        "qps={qps} sizes={sizes:?} gid={} mtu={} driver={} secs={:.3} sent_pkts={} rcvd_pkts={} bad_icrc={} xdp={:?} drops={:?} retrans={} dup={}",
        dev.query_gid(sgid).unwrap(),
        mtu.bytes(),
        dev.driver_info().mode,
        elapsed.as_secs_f64(),
        c.sent_pkts,
        c.rcvd_pkts,
        c.drops.bad_icrc,
        dev.xdp_stats().map(|x| (x.redirected, x.passed, x.sock_rx_dropped, x.sock_rx_ring_full, x.sock_fill_ring_empty)),
        c.drops,
        c.retransmitted_packets,
        c.duplicate_request,
    );
    if !hold.is_zero() {
        say(format!("HOLDING {summary}"));
        std::thread::sleep(hold);
    }
    Ok(summary)
}

#[test]
fn helper() {
    let Ok(role) = std::env::var("XROCE_DRIVER_HELPER") else {
        return;
    };
    match helper_main(&role) {
        Ok(summary) => say(format!("PASS {summary}")),
        Err(e) => say(format!("ERROR {e}")),
    }
}

// ---------------------------------------------------------------------------------------
// The tests: create the link, start both helpers, read their verdicts.

struct Run {
    link: VethLink,
    server: Helper,
    client: Helper,
}

fn start(
    driver: &str,
    link_mtu: u32,
    path_mtu: u32,
    qps: usize,
    sizes: &[usize],
    extra: &[(&str, String)],
) -> Run {
    let link = VethLink::create(&LinkConfig {
        mtu: link_mtu,
        ipv6: extra.iter().any(|(k, v)| *k == "XV_FAMILY" && v == "6"),
        ..LinkConfig::default()
    })
    .expect("creating namespaces and veth");
    let addr = SocketAddr::new(link.b_ip.into(), TCP_PORT).to_string();
    let sizes: Vec<String> = sizes.iter().map(|s| s.to_string()).collect();
    let env_for = |ifname: &str| {
        let mut env = vec![
            ("XV_IFNAME", ifname.to_string()),
            ("XV_DRIVER", driver.to_string()),
            ("XV_ADDR", addr.clone()),
            ("XV_SIZES", sizes.join(",")),
            ("XV_QPS", qps.to_string()),
            ("XV_MTU", path_mtu.to_string()),
        ];
        env.extend(extra.iter().cloned());
        env
    };
    let mut server = Helper::spawn(&link.b, "server", &env_for(&link.b_if));
    let listening = server.expect("LISTENING", Duration::from_secs(30));
    eprintln!("server: {listening}");
    let client = Helper::spawn(&link.a, "client", &env_for(&link.a_if));
    Run {
        link,
        server,
        client,
    }
}

fn both_pass(run: &mut Run) -> (String, String) {
    let c = run.client.expect("PASS", HELPER_TIMEOUT);
    let s = run.server.expect("PASS", HELPER_TIMEOUT);
    eprintln!("client: {c}\nserver: {s}");
    (c, s)
}

const MIB: usize = 1 << 20;

#[test]
fn xdp_every_op_both_directions_path_mtu_1024() {
    if !privileged_or_skip("xdp_every_op_both_directions_path_mtu_1024") {
        return;
    }
    let mut run = start(
        "xdp",
        1500,
        1024,
        1,
        &[0, 1, 1023, 1024, 1025, 65536, 3 * MIB],
        &[],
    );
    let (c, _) = both_pass(&mut run);
    assert!(c.contains("driver=xdp-"), "{c}");
    assert!(c.contains("bad_icrc=0"), "{c}");
}

#[test]
fn xdp_every_op_both_directions_path_mtu_4096_on_9000_link() {
    if !privileged_or_skip("xdp_every_op_both_directions_path_mtu_4096_on_9000_link") {
        return;
    }
    let mut run = start("xdp", 9000, 4096, 1, &[0, 4095, 4096, 4097, 4 * MIB], &[]);
    let (c, _) = both_pass(&mut run);
    assert!(c.contains("mtu=4096"), "{c}");
}

#[test]
fn udp_every_op_both_directions() {
    if !privileged_or_skip("udp_every_op_both_directions") {
        return;
    }
    let mut run = start("udp", 1500, 1024, 1, &[0, 1, 1025, 65536, 2 * MIB], &[]);
    let (c, _) = both_pass(&mut run);
    assert!(c.contains("driver=udp"), "{c}");
}

#[test]
fn udp_path_mtu_4096_on_9000_link() {
    if !privileged_or_skip("udp_path_mtu_4096_on_9000_link") {
        return;
    }
    let mut run = start("udp", 9000, 4096, 1, &[0, 4097, MIB], &[]);
    both_pass(&mut run);
}

#[test]
fn xdp_many_qps_and_ping_still_reaches_the_kernel() {
    if !privileged_or_skip("xdp_many_qps_and_ping_still_reaches_the_kernel") {
        return;
    }
    let mut run = start(
        "xdp",
        1500,
        1024,
        24,
        &[0, 3000, 20000],
        &[("XV_HOLD_MS", "3000".into())],
    );
    let c = run.client.expect("HOLDING", HELPER_TIMEOUT);
    run.server.expect("HOLDING", HELPER_TIMEOUT);
    // Both endpoints hold their devices (XDP attached) while ICMP and TCP flow.
    assert!(
        run.link.a.has_xdp(&run.link.a_if).unwrap(),
        "XDP attached on a"
    );
    assert!(
        run.link.b.has_xdp(&run.link.b_if).unwrap(),
        "XDP attached on b"
    );
    let ping = run
        .link
        .a
        .command("ping")
        .args([
            "-c",
            "3",
            "-i",
            "0.2",
            "-W",
            "2",
            &run.link.b_ip.to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        ping.status.success(),
        "ping failed while xroce runs: {ping:?}"
    );
    eprintln!("client: {c}");
    assert!(c.contains("qps=24"));
    run.client.expect("PASS", HELPER_TIMEOUT);
    run.server.expect("PASS", HELPER_TIMEOUT);
}

#[test]
fn xdp_every_op_over_ipv6_gids() {
    if !privileged_or_skip("xdp_every_op_over_ipv6_gids") {
        return;
    }
    let mut run = start(
        "xdp",
        1500,
        1024,
        2,
        &[0, 1500, 100_000],
        &[("XV_FAMILY", "6".into())],
    );
    let (c, _) = both_pass(&mut run);
    assert!(c.contains("gid=2001:2::"), "{c}");
}

#[test]
fn udp_every_op_over_ipv6_gids() {
    if !privileged_or_skip("udp_every_op_over_ipv6_gids") {
        return;
    }
    let mut run = start(
        "udp",
        1500,
        1024,
        2,
        &[0, 1500, 100_000],
        &[("XV_FAMILY", "6".into())],
    );
    let (c, _) = both_pass(&mut run);
    assert!(c.contains("gid=2001:2::"), "{c}");
}

fn vanished_peer(driver: &str) {
    let mut run = start(driver, 1500, 1024, 1, &[64], &[("XV_VANISH", "1".into())]);
    run.server.expect("VANISHING", HELPER_TIMEOUT);
    let c = run.client.expect("PASS", HELPER_TIMEOUT);
    eprintln!("client: {c}");
    assert!(c.contains("status=RetryExcErr"), "{c}");
    assert!(c.contains("state=Err"), "{c}");
    assert!(c.contains("retry_exceeded_err=1"), "{c}");
    let ms: u64 = c
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ms="))
        .unwrap()
        .parse()
        .unwrap();
    // timeout 12 (16.8 ms) x (1 + retry_cnt 3) = 67 ms; allow scheduling slack.
    assert!(
        (60..2000).contains(&ms),
        "RETRY_EXC_ERR after {ms} ms, expected about 67 ms"
    );
}

#[test]
fn xdp_vanished_peer_gives_retry_exceeded() {
    if !privileged_or_skip("xdp_vanished_peer_gives_retry_exceeded") {
        return;
    }
    vanished_peer("xdp");
}

#[test]
fn udp_vanished_peer_gives_retry_exceeded() {
    if !privileged_or_skip("udp_vanished_peer_gives_retry_exceeded") {
        return;
    }
    vanished_peer("udp");
}

#[test]
fn neighbour_resolution_through_the_kernel() {
    if !privileged_or_skip("neighbour_resolution_through_the_kernel") {
        return;
    }
    let link = VethLink::create(&LinkConfig {
        ipv6: false,
        ..LinkConfig::default()
    })
    .unwrap();
    let mut helper = Helper::spawn(
        &link.a,
        "neigh",
        &[
            ("XV_IFNAME", link.a_if.clone()),
            ("XV_PEER_IP", link.b_ip.to_string()),
            ("XV_ABSENT_IP", "198.18.0.77".into()),
        ],
    );
    let out = helper.expect("PASS", HELPER_TIMEOUT);
    eprintln!("{out}");
    let mac = link
        .b_mac
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    assert!(
        out.contains("before=None"),
        "a fresh namespace has no entry yet: {out}"
    );
    assert!(
        out.contains(&format!("mac={mac}")),
        "resolved to the peer's MAC {mac}: {out}"
    );
    assert!(out.contains("absent_typed=true"), "{out}");
    let ms: u64 = out
        .split_whitespace()
        .find_map(|w| w.strip_prefix("absent_ms="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (500..3000).contains(&ms),
        "gave up after {ms} ms, timeout was 500 ms"
    );
}

fn ud_datagrams(driver: &str) {
    let link = VethLink::create(&LinkConfig {
        ipv6: false,
        ..LinkConfig::default()
    })
    .unwrap();
    let addr = SocketAddr::new(link.b_ip.into(), TCP_PORT).to_string();
    let env_for = |ifname: &str| {
        vec![
            ("XV_IFNAME", ifname.to_string()),
            ("XV_DRIVER", driver.to_string()),
            ("XV_ADDR", addr.clone()),
            ("XV_SIZES", "0,1,1000,1024".to_string()),
        ]
    };
    let mut server = Helper::spawn(&link.b, "ud-server", &env_for(&link.b_if));
    server.expect("LISTENING", Duration::from_secs(30));
    let mut client = Helper::spawn(&link.a, "ud-client", &env_for(&link.a_if));
    let c = client.expect("PASS", HELPER_TIMEOUT);
    let s = server.expect("PASS", HELPER_TIMEOUT);
    eprintln!("client: {c}\nserver: {s}");
    assert!(s.contains("received 4 datagrams"));
}

#[test]
fn xdp_ud_datagrams_through_an_address_handle() {
    if !privileged_or_skip("xdp_ud_datagrams_through_an_address_handle") {
        return;
    }
    ud_datagrams("xdp");
}

#[test]
fn udp_ud_datagrams_through_an_address_handle() {
    if !privileged_or_skip("udp_ud_datagrams_through_an_address_handle") {
        return;
    }
    ud_datagrams("udp");
}
