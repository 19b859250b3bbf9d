//! Memory regions on the application's own memory between two processes over AF_XDP (two
//! namespaces, a veth pair; this binary re-run as the helper of each side).
//!
//! The client fills its buffer in place and SENDs from it, WRITEs with immediate, and READs
//! the server's buffer into its own; the server sees the SEND and the WRITE in its buffer
//! without a copy call. Then the server re-registers its region without remote write, and
//! the client's next WRITE is NAKed with a remote access error: the server's memory is the
//! same byte for byte. The client captures its frames; the test reads the capture with
//! `xroce dump`.
//!
//! Needs root: under XROCE_CI=1 a missing privilege fails; otherwise the test skips visibly.
#[path = "../../tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::{expect_both, privileged_or_skip, xroce_bin, Helper};
use xroce::netns::{LinkConfig, VethLink};
use xroce::verbs::*;

const TCP_PORT: u16 = 18695;
const WAIT: Duration = Duration::from_secs(20);

#[test]
fn helper() {
    let Ok(role) = std::env::var("XROCE_DRIVER_HELPER") else {
        return;
    };
    let line = match side(&role) {
        Ok(summary) => format!("PASS {summary}"),
        Err(e) => format!("ERROR {e}"),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

fn say(s: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{s}").unwrap();
    out.flush().unwrap();
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(41).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

fn one(cq: &Cq, what: &str) -> Result<Wc, String> {
    let wcs = cq.wait(1, WAIT).map_err(|e| e.to_string())?;
    wcs.first()
        .copied()
        .ok_or(format!("no completion for {what}"))
}

fn ok(cq: &Cq, what: &str) -> Result<Wc, String> {
    let wc = one(cq, what)?;
    if wc.status != WcStatus::Success {
        return Err(format!("{what}: {:?}", wc.status));
    }
    Ok(wc)
}

fn wr(wr_id: u64, op: WrOp, sge: Sge) -> SendWr {
    SendWr {
        wr_id,
        op,
        sg_list: vec![sge],
        flags: SendFlags::SIGNALED,
        ud: None,
    }
}

struct Lines {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Lines {
    fn send(&mut self, line: &str) -> Result<(), String> {
        writeln!(self.w, "{line}").map_err(|e| e.to_string())
    }
    fn expect(&mut self, what: &str) -> Result<String, String> {
        let mut line = String::new();
        self.r.read_line(&mut line).map_err(|e| e.to_string())?;
        if !line.starts_with(what) {
            return Err(format!("expected {what:?} from the peer, got {line:?}"));
        }
        Ok(line.trim_end().to_string())
    }
}

fn side(role: &str) -> Result<String, String> {
    let ifname = std::env::var("XV_IFNAME").map_err(|e| e.to_string())?;
    let addr: SocketAddr = std::env::var("XV_ADDR")
        .map_err(|e| e.to_string())?
        .parse()
        .map_err(|e| format!("{e}"))?;
    let e = |e: VerbsError| e.to_string();
    let config = DeviceConfig {
        pcap: std::env::var("XV_PCAP").ok().map(Into::into),
        ..DeviceConfig::default()
    };
    let dev = Device::open(&ifname, config).map_err(e)?;
    let sgid = dev.ipv4_gid_index().ok_or("no IPv4 GID")?;
    let pd = dev.alloc_pd().map_err(e)?;
    let scq = dev.create_cq(64, None).map_err(e)?;
    let rcq = dev.create_cq(64, None).map_err(e)?;
    let qp = pd.create_qp(&QpInitAttr::rc(&scq, &rcq)).map_err(e)?;
    qp.to_init(Access::ALL, 0).map_err(e)?;
    let server = role == "server";
    let mem = if server {
        UserMemory::from_vec(pattern(16384, 1))
    } else {
        UserMemory::zeroed(16384)
    };
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = pd.reg_user_mr(mem.clone(), access).map_err(e)?;
    if server {
        for (wr_id, offset) in [(1, 8192), (2, 12288)] {
            qp.post_recv(&RecvWr {
                wr_id,
                sg_list: vec![mr.sge(offset, 4096).map_err(e)?],
            })
            .map_err(e)?;
        }
    }
    let stream = if server {
        let listener = TcpListener::bind(addr).map_err(|e| format!("listen {addr}: {e}"))?;
        say("LISTENING");
        listener.accept().map_err(|e| e.to_string())?.0
    } else {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match TcpStream::connect(addr) {
                Ok(s) => break s,
                Err(err) if Instant::now() > deadline => return Err(format!("connect: {err}")),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    };
    let mut io = Lines {
        w: stream.try_clone().map_err(|e| e.to_string())?,
        r: BufReader::new(stream),
    };
    let gid = dev.query_gid(sgid).map_err(e)?;
    io.send(&format!(
        "peer {} {} {} {}",
        qp.qp_num(),
        u128::from_be_bytes(gid.0),
        mr.addr(),
        mr.rkey()
    ))?;
    let line = io.expect("peer")?;
    let f: Vec<u128> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().map_err(|e| format!("{line:?}: {e}")))
        .collect::<Result<_, _>>()?;
    let (peer_qpn, peer_gid, peer_addr, peer_rkey) = (
        f[0] as u32,
        Gid(f[1].to_be_bytes()),
        f[2] as u64,
        f[3] as u32,
    );
    qp.connect_rc(
        &RcPeer {
            qpn: peer_qpn,
            psn: 0,
            gid: peer_gid,
        },
        &RcOptions {
            sgid_index: sgid as u8,
            retry_cnt: 2,
            ..RcOptions::default()
        },
    )
    .map_err(e)?;
    io.send("ready")?;
    io.expect("ready")?;

    if server {
        // The SEND and the WRITE with immediate land in this buffer: look at it in place.
        let wc = ok(&rcq, "SEND")?;
        let sent = mem.with_bytes(|b| b[8192..8192 + wc.byte_len as usize].to_vec());
        if (wc.wr_id, sent) != (1, pattern(3000, 2)) {
            return Err("the SEND's bytes are not in the buffer".into());
        }
        let wc = ok(&rcq, "WRITE with immediate")?;
        if (wc.wr_id, wc.imm_data) != (2, Some(0x1234)) {
            return Err(format!("WRITE with immediate completed as {wc:?}"));
        }
        if mem.with_bytes(|b| b[..5000] != pattern(5000, 3)[..]) {
            return Err("the WRITE's bytes are not in the buffer".into());
        }
        io.expect("read done")?;
        // No more remote writes: the next one must leave every byte as it is.
        let before = mem.to_vec();
        mr.rereg(&MrRereg {
            access: Some(Access::LOCAL_WRITE | Access::REMOTE_READ),
            ..MrRereg::default()
        })
        .map_err(e)?;
        io.send("rereg")?;
        io.expect("refused")?;
        if mem.to_vec() != before {
            return Err("a refused WRITE changed the memory".into());
        }
        Ok(format!("server rkey {:#x} kept", mr.rkey()))
    } else {
        // Fill the buffer in place and send from it: no copy into the device.
        mem.with_bytes(|b| b[..3000].copy_from_slice(&pattern(3000, 2)));
        qp.post_send(&wr(1, WrOp::Send, mr.sge(0, 3000).map_err(e)?))
            .map_err(e)?;
        ok(&scq, "SEND")?;
        mem.with_bytes(|b| b[..5000].copy_from_slice(&pattern(5000, 3)));
        let op = WrOp::WriteWithImm {
            remote_addr: peer_addr,
            rkey: peer_rkey,
            imm: 0x1234,
        };
        qp.post_send(&wr(2, op, mr.sge(0, 5000).map_err(e)?))
            .map_err(e)?;
        ok(&scq, "WRITE with immediate")?;
        let op = WrOp::Read {
            remote_addr: peer_addr + 12288,
            rkey: peer_rkey,
        };
        qp.post_send(&wr(3, op, mr.sge(8192, 4096).map_err(e)?))
            .map_err(e)?;
        ok(&scq, "READ")?;
        if mem.with_bytes(|b| b[8192..12288] != pattern(16384, 1)[12288..]) {
            return Err("the READ's bytes are not in the buffer".into());
        }
        io.send("read done")?;
        io.expect("rereg")?;
        let op = WrOp::Write {
            remote_addr: peer_addr + 100,
            rkey: peer_rkey,
        };
        qp.post_send(&wr(4, op, mr.sge(0, 1000).map_err(e)?))
            .map_err(e)?;
        let wc = one(&scq, "refused WRITE")?;
        io.send("refused")?;
        if wc.status != WcStatus::RemAccessErr {
            return Err(format!("WRITE after rereg completed {:?}", wc.status));
        }
        Ok("client".into())
    }
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn user_memory_in_place_and_rereg_over_af_xdp() {
    if !privileged_or_skip("user_memory_in_place_and_rereg_over_af_xdp") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("client.pcap");
    let link = VethLink::create(&LinkConfig::default()).expect("namespaces and veth");
    link.add_static_neighbours().expect("static neighbours");
    let addr = SocketAddr::new(link.b_ip.into(), TCP_PORT).to_string();
    let env = |ifname: &str| vec![("XV_IFNAME", ifname.to_string()), ("XV_ADDR", addr.clone())];
    let mut server = Helper::spawn(&link.b, "server", &env(&link.b_if));
    server.expect("LISTENING", Duration::from_secs(30));
    let mut client_env = env(&link.a_if);
    client_env.push(("XV_PCAP", pcap.display().to_string()));
    let mut client = Helper::spawn(&link.a, "client", &client_env);
    let (c, s) = expect_both(&mut client, &mut server, "PASS", Duration::from_secs(60));
    assert_eq!(c, "PASS client");
    assert!(
        s.starts_with("PASS server rkey") && s.ends_with("kept"),
        "{s}"
    );
    client.wait();
    // The capture: the client's requests, the server's READ responses and its NAK.
    let out = std::process::Command::new(xroce_bin())
        .arg("dump")
        .arg(&pcap)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "xroce dump: {text}");
    for opcode in [
        "RC_SEND_FIRST",
        "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        "RC_RDMA_READ_REQUEST",
        "RC_RDMA_READ_RESPONSE_LAST",
    ] {
        assert!(text.contains(opcode), "no {opcode} in the capture:\n{text}");
    }
    let nak = text
        .lines()
        .find(|l| l.contains("NAK"))
        .unwrap_or_else(|| panic!("no NAK in the capture:\n{text}"));
    assert!(nak.to_lowercase().contains("remote access"), "{nak}");
}
