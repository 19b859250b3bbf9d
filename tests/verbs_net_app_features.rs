//! Inline sends, solicited events, a fence and a CQ resize between two processes over AF_XDP
//! (two namespaces, a veth pair; this binary re-run as the helper of each side).
//!
//! The sender (client) posts: an unsolicited SEND, a solicited SEND, an inline SEND whose
//! source it overwrites at once, and a READ followed by a fenced SEND. The receiver (server)
//! arms its receive CQ `solicited_only` and checks the channel stays quiet for the first,
//! fires for the second, and that every message carries the bytes of post time.
//!
//! Needs root: under XROCE_CI=1 a missing privilege fails; otherwise the test skips visibly.
mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::{expect_both, privileged_or_skip, Helper};
use xroce::netns::{LinkConfig, VethLink};
use xroce::verbs::*;

const TCP_PORT: u16 = 18690;
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

fn one(cq: &Cq, what: &str) -> Result<Wc, String> {
    let wcs = cq.wait(1, WAIT).map_err(|e| e.to_string())?;
    let wc = *wcs.first().ok_or(format!("no completion for {what}"))?;
    if wc.status != WcStatus::Success {
        return Err(format!("{what}: {:?}", wc.status));
    }
    Ok(wc)
}

fn send(wr_id: u64, sge: Sge, flags: SendFlags) -> SendWr {
    SendWr {
        wr_id,
        op: WrOp::Send,
        sg_list: vec![sge],
        flags: SendFlags::SIGNALED | flags,
        ud: None,
    }
}

fn side(role: &str) -> Result<String, String> {
    let ifname = std::env::var("XV_IFNAME").map_err(|e| e.to_string())?;
    let addr: SocketAddr = std::env::var("XV_ADDR")
        .map_err(|e| e.to_string())?
        .parse()
        .map_err(|e| format!("{e}"))?;
    let e = |e: VerbsError| e.to_string();
    let dev = Device::open(&ifname, DeviceConfig::default()).map_err(e)?;
    let sgid = dev.ipv4_gid_index().ok_or("no IPv4 GID")?;
    let channel = dev.create_comp_channel().map_err(e)?;
    let pd = dev.alloc_pd().map_err(e)?;
    let scq = dev.create_cq(64, None).map_err(e)?;
    let rcq = dev.create_cq(64, Some(&channel)).map_err(e)?;
    let qp = pd.create_qp(&QpInitAttr::rc(&scq, &rcq)).map_err(e)?;
    let mr = pd.reg_mr(16384, Access::ALL).map_err(e)?;
    mr.write(8192, b"read me before you say done").map_err(e)?;
    qp.to_init(Access::ALL, 0).map_err(e)?;
    for i in 0..4 {
        qp.post_recv(&RecvWr {
            wr_id: i,
            sg_list: vec![mr.sge(i as usize * 1024, 1024).map_err(e)?],
        })
        .map_err(e)?;
    }
    let stream = if role == "server" {
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
    let mut w = stream.try_clone().map_err(|e| e.to_string())?;
    let mut r = BufReader::new(stream);
    let gid = dev.query_gid(sgid).map_err(e)?;
    writeln!(
        w,
        "{} {} {} {}",
        qp.qp_num(),
        u128::from_be_bytes(gid.0),
        mr.addr(),
        mr.rkey()
    )
    .map_err(|e| e.to_string())?;
    let mut line = String::new();
    r.read_line(&mut line).map_err(|e| e.to_string())?;
    let f: Vec<u128> = line
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
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
            ..RcOptions::default()
        },
    )
    .map_err(e)?;
    // Both sides are connected before the first SEND.
    writeln!(w, "ready").map_err(|e| e.to_string())?;
    line.clear();
    r.read_line(&mut line).map_err(|e| e.to_string())?;

    if role == "server" {
        rcq.req_notify(true).map_err(e)?;
        writeln!(w, "armed").map_err(|e| e.to_string())?;
        // 0: unsolicited. The channel must stay quiet.
        let wc = one(&rcq, "unsolicited SEND")?;
        if channel
            .get_cq_event(Some(Duration::from_millis(200)))
            .is_ok()
        {
            return Err("an unsolicited SEND woke a solicited-only CQ".into());
        }
        if mr.to_vec(0, wc.byte_len as usize).map_err(e)? != b"unsolicited" {
            return Err("unsolicited SEND: wrong bytes".into());
        }
        // 1: solicited. It fires.
        let cq = channel.get_cq_event(Some(WAIT)).map_err(e)?;
        if cq != rcq.id() {
            return Err(format!("event for {cq:?}, not the receive CQ"));
        }
        let wc = one(&rcq, "solicited SEND")?;
        if mr.to_vec(1024, wc.byte_len as usize).map_err(e)? != b"solicited" {
            return Err("solicited SEND: wrong bytes".into());
        }
        // 2: inline, its source overwritten at the sender right after the post.
        let wc = one(&rcq, "inline SEND")?;
        if mr.to_vec(2048, wc.byte_len as usize).map_err(e)? != b"inline original" {
            return Err("inline SEND: not the bytes of post time".into());
        }
        // 3: the fenced SEND after the client's READ of our 8192..
        one(&rcq, "fenced SEND")?;
        // Resize the receive CQ while QPs use it.
        rcq.resize(16).map_err(e)?;
        Ok(format!("server depth {}", rcq.depth()))
    } else {
        line.clear();
        r.read_line(&mut line).map_err(|e| e.to_string())?;
        mr.write(0, b"unsolicited").map_err(e)?;
        qp.post_send(&send(0, mr.sge(0, 11).map_err(e)?, SendFlags::empty()))
            .map_err(e)?;
        one(&scq, "unsolicited SEND")?;
        // Give the server time to see that no event came.
        std::thread::sleep(Duration::from_millis(300));
        mr.write(64, b"solicited").map_err(e)?;
        qp.post_send(&send(1, mr.sge(64, 9).map_err(e)?, SendFlags::SOLICITED))
            .map_err(e)?;
        one(&scq, "solicited SEND")?;
        mr.write(128, b"inline original").map_err(e)?;
        let bogus = Sge {
            lkey: 0x0bad_0bad,
            ..mr.sge(128, 15).map_err(e)?
        };
        qp.post_send(&send(2, bogus, SendFlags::INLINE))
            .map_err(e)?;
        mr.write(128, b"overwritten!!!!").map_err(e)?;
        one(&scq, "inline SEND")?;
        qp.post_send(&SendWr {
            wr_id: 3,
            op: WrOp::Read {
                remote_addr: peer_addr + 8192,
                rkey: peer_rkey,
            },
            sg_list: vec![mr.sge(4096, 27).map_err(e)?],
            flags: SendFlags::SIGNALED,
            ud: None,
        })
        .map_err(e)?;
        mr.write(256, b"done").map_err(e)?;
        qp.post_send(&send(4, mr.sge(256, 4).map_err(e)?, SendFlags::FENCE))
            .map_err(e)?;
        let wcs = scq.wait(2, WAIT).map_err(e)?;
        let ids: Vec<(u64, WcStatus)> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
        if ids != [(3, WcStatus::Success), (4, WcStatus::Success)] {
            return Err(format!("READ then fenced SEND completed as {ids:?}"));
        }
        if mr.to_vec(4096, 27).map_err(e)? != b"read me before you say done" {
            return Err("READ: wrong bytes".into());
        }
        Ok("client".into())
    }
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn inline_solicited_fence_and_resize_over_af_xdp() {
    if !privileged_or_skip("inline_solicited_fence_and_resize_over_af_xdp") {
        return;
    }
    let link = VethLink::create(&LinkConfig::default()).expect("namespaces and veth");
    link.add_static_neighbours().expect("static neighbours");
    let addr = SocketAddr::new(link.b_ip.into(), TCP_PORT).to_string();
    let env = |ifname: &str| vec![("XV_IFNAME", ifname.to_string()), ("XV_ADDR", addr.clone())];
    let mut server = Helper::spawn(&link.b, "server", &env(&link.b_if));
    server.expect("LISTENING", Duration::from_secs(30));
    let mut client = Helper::spawn(&link.a, "client", &env(&link.a_if));
    let (c, s) = expect_both(&mut client, &mut server, "PASS", Duration::from_secs(60));
    assert_eq!(s, "PASS server depth 16");
    assert_eq!(c, "PASS client");
}
