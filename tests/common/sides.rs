//! Connected RC (or UC) sides over the in-memory pair, and a busy-polled SEND ping-pong
//! between them: the fixture of the progress and shard tests and of the verbs ping-pong
//! bench. Include with `#[path = "common/sides.rs"] mod sides;` (from `benches/`, with the
//! path to this file).
#![allow(dead_code)]
use std::time::{Duration, Instant};

use xroce::verbs::*;

pub const WAIT: Duration = Duration::from_secs(30);

pub struct Side {
    pub dev: Device,
    pub _pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
    pub mr: Mr,
}

pub fn side(dev: &Device, pd: &Pd) -> Side {
    let cq = dev.create_cq(4096, None).unwrap();
    side_with_send_cq(dev, pd, &cq, cq.clone())
}

/// A side whose sends complete into `send_cq` and receives into `cq` (the side's CQ), as UCX
/// builds its QPs; `send_cq` may be `cq` itself.
pub fn side_with_send_cq(dev: &Device, pd: &Pd, send_cq: &Cq, cq: Cq) -> Side {
    let attr = QpInitAttr::rc(send_cq, &cq);
    side_of(dev, pd, attr, cq.clone())
}

/// A UC side (IBTA 9.8: no ACK, no retry), one CQ for both directions; join two with
/// [`connect_uc`].
pub fn uc_side(dev: &Device, pd: &Pd) -> Side {
    let cq = dev.create_cq(4096, None).unwrap();
    let attr = QpInitAttr::uc(&cq, &cq);
    side_of(dev, pd, attr, cq.clone())
}

/// A side with a QP made from `attr` (its caps set here) and `cq`, the CQ its receives
/// complete in.
fn side_of(dev: &Device, pd: &Pd, attr: QpInitAttr<'_>, cq: Cq) -> Side {
    let qp = pd
        .create_qp(&QpInitAttr {
            cap: QpCaps {
                max_send_wr: 256,
                max_recv_wr: 256,
                ..QpCaps::default()
            },
            ..attr
        })
        .unwrap();
    let mr = pd.reg_mr(8192, Access::ALL).unwrap();
    Side {
        dev: dev.clone(),
        _pd: pd.clone(),
        cq,
        qp,
        mr,
    }
}

pub fn connect(a: &Side, b: &Side) {
    connect_with(a, b, Qp::connect_rc);
}

/// [`connect`] for two [`uc_side`]s.
pub fn connect_uc(a: &Side, b: &Side) {
    connect_with(a, b, Qp::connect_uc);
}

fn connect_with(a: &Side, b: &Side, join: impl Fn(&Qp, &RcPeer, &RcOptions) -> Result<()>) {
    for (me, peer, psn, peer_psn) in [(a, b, 100, 200), (b, a, 200, 100)] {
        let gid = peer.dev.ipv4_gid_index().unwrap();
        join(
            &me.qp,
            &RcPeer {
                qpn: peer.qp.qp_num(),
                psn: peer_psn,
                gid: peer.dev.query_gid(gid).unwrap(),
            },
            &RcOptions {
                sgid_index: me.dev.ipv4_gid_index().unwrap() as u8,
                path_mtu: Mtu::Mtu1024,
                sq_psn: psn,
                ..RcOptions::default()
            },
        )
        .unwrap();
    }
}

/// Two devices on an in-memory link (MTU 1500, no loss).
pub fn device_pair(mode: ProgressMode) -> (Device, Device, MemLink) {
    let config = DeviceConfig {
        progress: mode,
        ..DeviceConfig::default()
    };
    Device::mem_pair(&mem_link_config(1500, 0.0, 7), config).unwrap()
}

pub fn pairs(mode: ProgressMode, count: usize) -> (Vec<(Side, Side)>, Device, Device, MemLink) {
    let (da, db, link) = device_pair(mode);
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let sides = (0..count)
        .map(|_| {
            let (a, b) = (side(&da, &pa), side(&db, &pb));
            connect(&a, &b);
            (a, b)
        })
        .collect();
    (sides, da, db, link)
}

pub fn send(s: &Side, wr_id: u64, byte: u8) {
    s.mr.write(0, &[byte; 64]).unwrap();
    s.qp.post_send(&SendWr {
        wr_id,
        op: WrOp::Send,
        sg_list: vec![s.mr.sge(0, 64).unwrap()],
        flags: SendFlags::SIGNALED,
        ud: None,
    })
    .unwrap();
}

pub fn post_recv(s: &Side, wr_id: u64) {
    s.qp.post_recv(&RecvWr {
        wr_id,
        sg_list: vec![s.mr.sge(4096, 64).unwrap()],
    })
    .unwrap();
}

/// Busy-polls `cq` until a receive completes (sends' completions on the way are counted in
/// `sends`); panics after `WAIT`.
pub fn poll_until_recv(cq: &Cq, sends: &mut u64) -> Wc {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(wc) = cq.poll_one().unwrap() {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            if wc.opcode == WcOpcode::Recv {
                return wc;
            }
            *sends += 1;
        }
        assert!(Instant::now() < deadline, "no receive within {WAIT:?}");
    }
}

/// `rounds` SEND ping-pongs: `a` sends, `b` answers each one; both busy-poll their CQs.
pub fn ping_pong(a: &Side, b: &Side, rounds: u64) {
    for i in 0..8 {
        post_recv(a, i);
        post_recv(b, i);
    }
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut sends = 0;
            for i in 0..rounds {
                let wc = poll_until_recv(&b.cq, &mut sends);
                assert_eq!(b.mr.to_vec(4096, 64).unwrap(), vec![i as u8; 64]);
                post_recv(b, wc.wr_id);
                send(b, i, i as u8);
            }
        });
        let mut sends = 0;
        for i in 0..rounds {
            send(a, i, i as u8);
            let wc = poll_until_recv(&a.cq, &mut sends);
            assert_eq!(a.mr.to_vec(4096, 64).unwrap(), vec![i as u8; 64]);
            post_recv(a, wc.wr_id);
        }
    });
}
