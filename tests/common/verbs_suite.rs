//! The helper side of the verbs tests over real (virtual) links (`tests/verbs_net.rs`,
//! `tests/net_router.rs`): one endpoint, configured by environment variables, run as this
//! test binary's `helper` test inside a namespace. Include with
//! `#[path = "common/verbs_suite.rs"] mod verbs_suite;`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use xroce::verbs::*;

// ---------------------------------------------------------------------------------------
// The helper: one endpoint, configured by environment variables.

pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("helper needs {name}"))
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(seed | 1).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub struct Info {
    pub qpn: u32,
    pub psn: u32,
    pub rkey: u32,
    pub addr: u64,
}

/// Per-QP memory layout (identical on both sides).
#[derive(Clone, Copy)]
pub struct Layout {
    pub max: usize,
    pub sizes_total: usize,
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

pub struct QpSide {
    /// Send completions.
    cq: Cq,
    /// Receive completions (a separate CQ, so waiting for one kind never takes the other).
    rcq: Cq,
    qp: Qp,
    mr: Mr,
    psn: u32,
}

pub fn line_io(stream: &TcpStream) -> (TcpStream, BufReader<TcpStream>) {
    (
        stream.try_clone().unwrap(),
        BufReader::new(stream.try_clone().unwrap()),
    )
}

pub fn send_line<T: serde::Serialize>(w: &mut TcpStream, v: &T) {
    let mut s = serde_json::to_string(v).unwrap();
    s.push('\n');
    w.write_all(s.as_bytes()).unwrap();
}

pub fn recv_line<T: for<'de> serde::Deserialize<'de>>(r: &mut BufReader<TcpStream>) -> Option<T> {
    let mut s = String::new();
    match r.read_line(&mut s) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(serde_json::from_str(&s).unwrap()),
    }
}

pub fn say(s: String) {
    let out = std::io::stdout();
    let mut o = out.lock();
    writeln!(o, "{s}").unwrap();
    o.flush().unwrap();
}

pub fn wait_wc(cq: &Cq, what: &str) -> Result<Wc, String> {
    let wcs = cq
        .wait(1, Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    wcs.into_iter()
        .next()
        .ok_or_else(|| format!("no completion for {what} within 30 s"))
}

pub fn post(qp: &Qp, op: WrOp, sg: Vec<Sge>) -> Result<(), String> {
    qp.post_send(&SendWr {
        wr_id: 0,
        op,
        sg_list: sg,
        flags: SendFlags::SIGNALED,
        ud: None,
    })
    .map_err(|e| e.to_string())
}

pub fn expect_ok(wc: Wc, what: &str) -> Result<Wc, String> {
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
pub fn run_ops(side: &QpSide, peer: &Info, layout: Layout, sizes: &[usize]) -> Result<(), String> {
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

pub fn wait_after(side: &QpSide, op: WrOp, sg: Vec<Sge>) -> Result<Wc, String> {
    post(&side.qp, op, sg)?;
    wait_wc(&side.cq, "send")
}

pub fn read_and_check(
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
pub fn check_receives(side: &QpSide, layout: Layout, sizes: &[usize]) -> Result<(), String> {
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
pub fn neigh_main() -> Result<String, String> {
    let ifname = env("XV_IFNAME");
    let peer: std::net::IpAddr = env("XV_PEER_IP").parse().unwrap();
    let absent: std::net::IpAddr = env("XV_ABSENT_IP").parse().unwrap();
    // With XV_TRAP_IP, an `ip` first in PATH records any run: resolution must not spawn it.
    let trap = std::env::var("XV_TRAP_IP").is_ok().then(|| {
        let dir = std::env::temp_dir().join(format!("xroce-ip-trap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let marker = dir.join("ran");
        let script = dir.join("ip");
        std::fs::write(
            &script,
            format!("#!/bin/sh\necho \"$@\" >> {}\nexit 1\n", marker.display()),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = std::env::var("PATH").unwrap_or_default();
        std::env::set_var("PATH", format!("{}:{path}", dir.display()));
        (dir, marker)
    });
    let before = xroce::netdev::neighbour_lookup(&ifname, peer).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mac = xroce::netdev::resolve_neighbour(&ifname, peer, Duration::from_secs(3))
        .map_err(|e| e.to_string())?;
    let resolve_ms = start.elapsed().as_millis();
    let start = Instant::now();
    let err = xroce::netdev::resolve_neighbour(&ifname, absent, Duration::from_millis(500))
        .expect_err("nobody has the absent address");
    let fail_ms = start.elapsed().as_millis();
    let ip_runs = match trap {
        Some((dir, marker)) => {
            let runs = std::fs::read_to_string(&marker).unwrap_or_default();
            let _ = std::fs::remove_dir_all(dir);
            runs.lines().count()
        }
        None => 0,
    };
    let typed = matches!(
        err,
        xroce::netdev::NetdevError::NeighbourTimeout { .. }
            | xroce::netdev::NetdevError::NeighbourFailed { .. }
    );
    Ok(format!(
        "before={before:?} mac={mac} resolve_ms={resolve_ms} absent_typed={typed} absent_ms={fail_ms} ip_runs={ip_runs} err={err}"
    ))
}

/// UD: the client sends datagrams of several sizes through an address handle.
pub fn ud_main(role: &str) -> Result<String, String> {
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

pub fn helper_main(role: &str) -> Result<String, String> {
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
    // XV_SHARDS: engine shards, QP i on shard i % shards (both ends alike).
    let shards: u32 = std::env::var("XV_SHARDS").map_or(1, |v| v.parse().unwrap());
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
            shards,
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
    // CQs are placed on the shards in turn, and a QP lives on its send CQ's shard: an
    // unused CQ now and then puts QP i on shard i % shards.
    let mut placement_cqs = Vec::new();
    let mut cqs_made = 0usize;
    let sides: Vec<QpSide> = (0..qps)
        .map(|i| {
            while cqs_made % shards as usize != i % shards as usize {
                placement_cqs.push(dev.create_cq(1, None).unwrap());
                cqs_made += 1;
            }
            cqs_made += 2;
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
        "qps={qps} sizes={sizes:?} gid={} mtu={} driver={} secs={:.3} sent_pkts={} rcvd_pkts={} bad_icrc={} xdp={:?} drops={:?} retrans={} dup={} shards={} qp_shards={:?} handed_off={}",
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
        dev.shard_count(),
        sides.iter().map(|s| s.qp.shard()).collect::<Vec<_>>(),
        dev.progress_stats()
            .handed_off_frames
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    if !hold.is_zero() {
        say(format!("HOLDING {summary}"));
        std::thread::sleep(hold);
    }
    Ok(summary)
}
