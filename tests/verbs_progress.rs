//! Who makes progress (src/verbs/progress.rs): a thread that polls its CQ receives, answers
//! and transmits itself; the background thread serves nobody-polls work; work posted while
//! another thread holds the progress token is never left behind; busy-poll mode does not
//! starve the application. Over the in-memory driver: no root.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use xroce::verbs::*;

const WAIT: Duration = Duration::from_secs(30);

struct Side {
    dev: Device,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn side(dev: &Device, pd: &Pd) -> Side {
    let cq = dev.create_cq(4096, None).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            cap: QpCaps {
                max_send_wr: 256,
                max_recv_wr: 256,
                ..QpCaps::default()
            },
            ..QpInitAttr::rc(&cq, &cq)
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

fn connect(a: &Side, b: &Side) {
    for (me, peer, psn, peer_psn) in [(a, b, 100, 200), (b, a, 200, 100)] {
        let gid = peer.dev.ipv4_gid_index().unwrap();
        me.qp
            .connect_rc(
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

fn pairs(mode: ProgressMode, count: usize) -> (Vec<(Side, Side)>, Device, Device, MemLink) {
    let config = DeviceConfig {
        progress: mode,
        ..DeviceConfig::default()
    };
    let (da, db, link) = Device::mem_pair(&mem_link_config(1500, 0.0, 7), config).unwrap();
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

fn send(s: &Side, wr_id: u64, byte: u8) {
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

fn post_recv(s: &Side, wr_id: u64) {
    s.qp.post_recv(&RecvWr {
        wr_id,
        sg_list: vec![s.mr.sge(4096, 64).unwrap()],
    })
    .unwrap();
}

/// Busy-polls `cq` until a receive completes (sends' completions on the way are counted in
/// `sends`); panics after `WAIT`.
fn poll_until_recv(cq: &Cq, sends: &mut u64) -> Wc {
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
fn ping_pong(a: &Side, b: &Side, rounds: u64) {
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

#[test]
fn a_thread_polling_its_cq_receives_and_transmits_itself() {
    let (sides, da, db, _link) = pairs(ProgressMode::Wakeup, 1);
    let (a, b) = &sides[0];
    ping_pong(a, b, 2000);
    for dev in [&da, &db] {
        let stats = dev.progress_stats();
        let rx = stats.rx_frames.load(Ordering::Relaxed);
        let driven = stats.driven_rx_frames.load(Ordering::Relaxed);
        // 2000 SENDs each way and (coalesced) ACKs.
        assert!(rx >= 3000, "{}: only {rx} frames received", dev.name());
        // The background thread may take a few rounds while a poller is descheduled, but
        // the pollers must do most of the receiving.
        assert!(
            driven * 2 > rx,
            "{}: pollers received {driven} of {rx} frames",
            dev.name()
        );
        assert!(stats.driven_rounds.load(Ordering::Relaxed) > 0);
    }
}

#[test]
fn busy_poll_mode_does_not_starve_a_polling_application() {
    // Two applications and two spinning progress threads on this machine's few cores: the
    // spinning threads must leave the driver to the pollers.
    let (sides, _da, _db, _link) = pairs(ProgressMode::BusyPoll, 1);
    let (a, b) = &sides[0];
    ping_pong(a, b, 2000);
}

#[test]
fn work_posted_while_another_thread_holds_the_token_is_never_left_behind() {
    // Four QP pairs, a sender and a receiver thread each: posts and polls from eight
    // threads race for the one progress token of each device. Every message must arrive,
    // in order, and every send complete.
    const MESSAGES: u64 = 1500;
    let (sides, _da, _db, _link) = pairs(ProgressMode::Wakeup, 4);
    let sides: Vec<Arc<(Side, Side)>> = sides.into_iter().map(Arc::new).collect();
    let reposted: Vec<AtomicU64> = (0..sides.len()).map(|_| AtomicU64::new(0)).collect();
    std::thread::scope(|scope| {
        for (pair, reposted) in sides.iter().zip(&reposted) {
            let (a, b) = (&pair.0, &pair.1);
            for i in 0..128 {
                post_recv(b, i);
            }
            scope.spawn(move || {
                let mut sends = 0;
                let mut expected = 0u64;
                while expected < MESSAGES {
                    let wc = poll_until_recv(&b.cq, &mut sends);
                    assert_eq!(wc.byte_len, 64);
                    expected += 1;
                    post_recv(b, wc.wr_id);
                    reposted.store(expected, Ordering::Release);
                }
            });
            scope.spawn(move || {
                let mut done = 0u64;
                let mut wcs = [Wc::EMPTY; 32];
                let deadline = Instant::now() + WAIT;
                for i in 0..MESSAGES {
                    // At most 64 messages not yet taken by the receiver, which keeps 128
                    // receives posted: no RNR NAK, so every message goes through at once.
                    while i - reposted.load(Ordering::Acquire) >= 64 || i - done >= 128 {
                        let n = a.cq.poll(&mut wcs).unwrap();
                        assert!(wcs[..n].iter().all(|w| w.status == WcStatus::Success));
                        done += n as u64;
                        assert!(Instant::now() < deadline, "sends stopped completing");
                    }
                    send(a, i, i as u8);
                }
                while done < MESSAGES {
                    let n = a.cq.poll(&mut wcs).unwrap();
                    assert!(wcs[..n].iter().all(|w| w.status == WcStatus::Success));
                    done += n as u64;
                    assert!(
                        Instant::now() < deadline,
                        "{done} of {MESSAGES} sends completed"
                    );
                }
            });
        }
    });
}

#[test]
fn a_thread_that_stops_polling_hands_progress_back() {
    // After a burst of polling, the application sleeps on a completion channel: the
    // background thread must take over receiving, or the event never comes.
    let (da, db, _link) =
        Device::mem_pair(&mem_link_config(1500, 0.0, 7), DeviceConfig::default()).unwrap();
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let a = side(&da, &pa);
    let channel = db.create_comp_channel().unwrap();
    let cq = db.create_cq(64, Some(&channel)).unwrap();
    let b = Side {
        qp: pb.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap(),
        mr: pb.reg_mr(8192, Access::ALL).unwrap(),
        cq,
        dev: db.clone(),
        _pd: pb.clone(),
    };
    connect(&a, &b);
    post_recv(&b, 1);
    let until = Instant::now() + Duration::from_millis(20);
    let mut wcs = [Wc::EMPTY; 4];
    while Instant::now() < until {
        assert_eq!(b.cq.poll(&mut wcs).unwrap(), 0);
    }
    b.cq.req_notify(false).unwrap();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(5));
            send(&a, 1, 0x5a);
        });
        assert_eq!(channel.get_cq_event(Some(WAIT)).unwrap(), b.cq.id());
    });
    let n = b.cq.poll(&mut wcs).unwrap();
    assert_eq!(n, 1);
    assert_eq!(wcs[0].opcode, WcOpcode::Recv);
    assert_eq!(b.mr.to_vec(4096, 64).unwrap(), vec![0x5a; 64]);
}
