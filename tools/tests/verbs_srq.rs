//! Shared receive queues through the verbs API and the tools, on two devices joined in
//! memory (no root): `Pd::create_srq`, `Srq::post_recv`/`modify`/`query`, QPs created on an
//! SRQ, the SRQ-limit and last-WQE-reached async events; `xroce pingpong --srq`
//! (ibv_srq_pingpong's logic) both roles, over a clean and a lossy link; `xroce perf send_bw
//! --use-srq` and `send_lat --use-srq`.
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use xroce::verbs::*;
use xroce_tools::endpoint::verbs::{open_on_with_srq, DriverChoice, EndpointSpec};
use xroce_tools::endpoint::ToolEndpoint;
use xroce_tools::perftest::oob::{self as perftest_oob, PerftestComm, Role, TestKind};
use xroce_tools::perftest::report;
use xroce_tools::perftest::run::{PerfOptions, PerfRunner};
use xroce_tools::pingpong::srq::{SrqPingpong, SrqPingpongOptions};

fn devices(loss: f64) -> (Device, Device, MemLink) {
    Device::mem_pair(&mem_link_config(1500, loss, 11), DeviceConfig::default()).unwrap()
}

fn wait_event(dev: &Device, want: Event) -> Vec<Event> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        while let Some(ev) = dev.poll_async_event() {
            seen.push(ev);
        }
        if seen.contains(&want) {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("no {want:?} within 5 s; saw {seen:?}");
}

#[test]
fn qps_on_one_srq_receive_and_raise_the_srq_events() {
    let (a, b, _link) = devices(0.0);
    let opts = RcOptions {
        sgid_index: 1,
        ..RcOptions::default()
    };
    let (pd_a, pd_b) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (
        a.create_cq(64, None).unwrap(),
        b.create_cq(64, None).unwrap(),
    );
    let srq = pd_b
        .create_srq(&SrqAttr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let mr_a = pd_a.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    let mr_b = pd_b.reg_mr(8 * 512, Access::LOCAL_WRITE).unwrap();
    let mut pairs = Vec::new();
    for _ in 0..3 {
        let qa = pd_a.create_qp(&QpInitAttr::rc(&cq_a, &cq_a)).unwrap();
        let qb = pd_b
            .create_qp(&QpInitAttr {
                srq: Some(&srq),
                ..QpInitAttr::rc(&cq_b, &cq_b)
            })
            .unwrap();
        let peer = |q: &Qp, d: &Device| RcPeer {
            qpn: q.qp_num(),
            psn: 0,
            gid: d.query_gid(1).unwrap(),
        };
        qa.connect_rc(&peer(&qb, &b), &opts).unwrap();
        qb.connect_rc(&peer(&qa, &a), &opts).unwrap();
        pairs.push((qa, qb));
    }
    // The QP's own receive queue is not there to post to.
    let err = pairs[0]
        .1
        .post_recv(&RecvWr {
            wr_id: 0,
            sg_list: vec![mr_b.sge(0, 64).unwrap()],
        })
        .unwrap_err();
    assert!(
        matches!(
            err,
            VerbsError::Engine(xroce::engine::EngineError::ReceivesFromSrq(_))
        ),
        "{err}"
    );
    let wrs: Vec<RecvWr> = (0..4)
        .map(|i| RecvWr {
            wr_id: 100 + i,
            sg_list: vec![mr_b.sge(i as usize * 512, 512).unwrap()],
        })
        .collect();
    srq.post_recv_batch(&wrs).unwrap();
    assert_eq!(srq.queued().unwrap(), 4);
    srq.modify(
        &SrqAttr {
            srq_limit: 3,
            ..SrqAttr::default()
        },
        SrqAttrMask::LIMIT,
    )
    .unwrap();
    assert_eq!(
        srq.query().unwrap(),
        SrqAttr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 3
        }
    );
    // Two SENDs on different QPs: the second leaves 2 < 3 WRs, the limit event fires.
    for (i, (qa, _)) in [&pairs[2], &pairs[0]].into_iter().enumerate() {
        mr_a.write(0, &[i as u8 + 1; 100]).unwrap();
        qa.post_send(&SendWr {
            wr_id: i as u64,
            op: WrOp::Send,
            sg_list: vec![mr_a.sge(0, 100).unwrap()],
            flags: SendFlags::SIGNALED,
            ud: None,
        })
        .unwrap();
        cq_a.wait(1, Duration::from_secs(5)).unwrap();
        let wc = cq_b.wait(1, Duration::from_secs(5)).unwrap()[0];
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(wc.wr_id, 100 + i as u64);
        assert_eq!(wc.byte_len, 100);
        assert_eq!(wc.qp_num, [&pairs[2], &pairs[0]][i].1.qp_num());
        assert_eq!(mr_b.to_vec(i * 512, 100).unwrap(), vec![i as u8 + 1; 100]);
    }
    let seen = wait_event(&b, Event::SrqLimitReached(srq.id()));
    assert_eq!(seen, vec![Event::SrqLimitReached(srq.id())]);
    assert_eq!(srq.query().unwrap().srq_limit, 0, "disarmed by the event");
    // A QP on the SRQ moved to ERR: last WQE reached, the SRQ keeps its WRs.
    pairs[1]
        .1
        .modify(
            &QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    wait_event(&b, Event::QpLastWqeReached(pairs[1].1.qp_num()));
    assert_eq!(srq.queued().unwrap(), 2);
    // Bad values are typed errors.
    assert!(matches!(
        pd_b.create_srq(&SrqAttr::default()),
        Err(VerbsError::Zero { what: "max_srq_wr" })
    ));
    assert!(matches!(
        pd_b.create_srq(&SrqAttr {
            max_wr: xroce::engine::limits::MAX_SRQ_WR + 1,
            ..SrqAttr::default()
        }),
        Err(VerbsError::LimitExceeded {
            what: "max_srq_wr",
            ..
        })
    ));
    let attr = b.query_device();
    assert_eq!(attr.max_srq_wr, xroce::engine::limits::MAX_SRQ_WR);
    assert_eq!(attr.max_srq, xroce::engine::limits::MAX_SRQ);
    // The SRQ lives while a QP on it does, whatever the handle.
    drop(srq);
    let qb = &pairs[0].1;
    assert_eq!(qb.state().unwrap(), QpState::Rts);
}

fn srq_pingpong(opts: SrqPingpongOptions, loss: f64) -> (String, String, Vec<u64>) {
    let (a, b, _link) = devices(loss);
    let gid_a = a.ipv4_gid_index().unwrap();
    let gid_b = b.ipv4_gid_index().unwrap();
    let mut server = SrqPingpong::create(&a, gid_a, &opts).unwrap();
    let mut client = SrqPingpong::create(&b, gid_b, &opts).unwrap();
    let (sa, sb) = UnixStream::pair().unwrap();
    let o2 = opts.clone();
    let server = std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut psn = 0x1000;
        let outcome = server
            .run(
                || Ok(sa),
                Role::Server,
                &o2,
                || {
                    psn += 1;
                    psn
                },
                &mut out,
            )
            .unwrap();
        (String::from_utf8(out).unwrap(), outcome.recvs_per_qp)
    });
    let mut out = Vec::new();
    let mut psn = 0x2000;
    client
        .run(
            || Ok(sb),
            Role::Client,
            &opts,
            || {
                psn += 1;
                psn
            },
            &mut out,
        )
        .unwrap();
    let (server_out, per_qp) = server.join().unwrap();
    (server_out, String::from_utf8(out).unwrap(), per_qp)
}

#[test]
fn srq_pingpong_both_roles_over_verbs() {
    let opts = SrqPingpongOptions {
        num_qp: 4,
        rx_depth: 20,
        iters: 200,
        size: 3000,
        ..SrqPingpongOptions::default()
    };
    let (server, client, per_qp) = srq_pingpong(opts, 0.0);
    for out in [&server, &client] {
        assert_eq!(
            out.matches("  local address:  LID 0x0000, QPN 0x").count(),
            4,
            "{out}"
        );
        assert_eq!(
            out.matches("  remote address: LID 0x0000, QPN 0x").count(),
            4,
            "{out}"
        );
        assert!(out.contains("1200000 bytes in "), "{out}");
        assert!(out.contains("200 iters in "), "{out}");
    }
    // Every QP took receives from the one SRQ (the client sends once on each at first).
    assert_eq!(per_qp.len(), 4);
    assert!(per_qp.iter().all(|&n| n > 0), "{per_qp:?}");
    assert!(per_qp.iter().sum::<u64>() >= 200);
}

#[test]
fn srq_pingpong_survives_loss() {
    let opts = SrqPingpongOptions {
        num_qp: 3,
        rx_depth: 12,
        iters: 100,
        size: 2500,
        ..SrqPingpongOptions::default()
    };
    let (_, client, _) = srq_pingpong(opts, 0.02);
    assert!(client.contains("100 iters in "), "{client}");
}

#[test]
fn srq_pingpong_refuses_what_ibv_srq_pingpong_refuses() {
    let err = SrqPingpongOptions {
        num_qp: 16,
        rx_depth: 8,
        ..SrqPingpongOptions::default()
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(
        err.contains(
            "rx_depth 8 is too small for 16 QPs -- must have at least one receive per QP."
        ),
        "{err}"
    );
    for num_qp in [0, 257] {
        let opts = SrqPingpongOptions {
            num_qp,
            ..SrqPingpongOptions::default()
        };
        assert!(opts.validate().is_err(), "-q {num_qp}");
    }
}

fn spec(recv: u32) -> EndpointSpec {
    EndpointSpec {
        qp_type: xroce::engine::QpType::Rc,
        buf_len: 2 * 4096,
        max_send_wr: 128,
        max_recv_wr: recv,
        driver: DriverChoice::Xdp,
        events: false,
        pcap: None,
        progress: Default::default(),
        shards: 1,
    }
}

fn perf_side(
    dev: &Device,
    stream: UnixStream,
    role: Role,
    opts: PerfOptions,
) -> anyhow::Result<(String, usize)> {
    let gid = dev.ipv4_gid_index().unwrap();
    let srq_depth = opts.srq_depth(role)?;
    let mut eps = open_on_with_srq(dev, gid, &spec(opts.rx_depth), opts.num_qps, srq_depth)?;
    let dests: Vec<_> = eps
        .iter()
        .enumerate()
        .map(|(i, ep)| opts.dest(&ep.local(), 0x100 * (i as u32 + 1)))
        .collect();
    let local = opts.local_side(3, 16, dests.clone());
    let steps = perftest_oob::script(opts.kind, role, &opts.sizes(1024), opts.num_qps);
    let info = report::TestInfo {
        kind: opts.kind,
        device: "mem".into(),
        num_qps: opts.num_qps,
        connection: "RC",
        is_client: role == Role::Client,
        tx_depth: opts.tx_depth,
        rx_depth: opts.rx_depth,
        cq_mod: opts.cq_mod,
        mtu: 1024,
        gid_index: Some(gid),
        inline_size: 0,
        out_reads: 16,
        atomic_type: None,
        use_srq: opts.use_srq,
        duplex: false,
        rdma_cm: false,
    };
    let mut out: Vec<u8> = Vec::new();
    let rows;
    {
        let refs: Vec<&mut (dyn ToolEndpoint + 'static)> =
            eps.iter_mut().map(|e| e.as_mut()).collect();
        let mut runner =
            PerfRunner::new(refs, opts.clone(), role, dests, &mut out).with_test_info(info);
        let mut comm = PerftestComm::new(stream, role, "6.06", false, true);
        perftest_oob::run_script(&mut comm, &steps, &local, &mut runner)?;
        rows = runner.results.len();
    }
    Ok((String::from_utf8(out).unwrap(), rows))
}

fn perf_over(opts: PerfOptions) -> (String, String, usize) {
    let (a, b, _link) = devices(0.0);
    let (sa, sb) = UnixStream::pair().unwrap();
    let o2 = opts.clone();
    let server = std::thread::spawn(move || perf_side(&a, sa, Role::Server, o2));
    let (client, rows) = perf_side(&b, sb, Role::Client, opts).unwrap();
    let (server, _) = server.join().unwrap().unwrap();
    (server, client, rows)
}

#[test]
fn perf_send_tests_with_use_srq() {
    for (kind, qps) in [(TestKind::SendBw, 4), (TestKind::SendLat, 1)] {
        let mut opts = PerfOptions::defaults(kind);
        opts.use_srq = true;
        opts.num_qps = qps;
        opts.iters = if kind.is_bw() { 400 } else { 100 };
        opts.size = 2048;
        opts.rx_depth = 64;
        opts.stall_timeout = Duration::from_secs(20);
        opts.validate().unwrap();
        opts.settle_depths();
        let (server, client, rows) = perf_over(opts);
        assert_eq!(rows, 1, "{kind:?}\n{client}\n{server}");
        assert!(server.contains("Using SRQ      : ON"), "{server}");
        assert!(server.contains(" 2048 "), "{kind:?}\n{server}");
    }
}

#[test]
fn use_srq_is_for_the_send_tests_and_needs_a_wr_per_qp() {
    let mut opts = PerfOptions::defaults(TestKind::WriteBw);
    opts.use_srq = true;
    let err = opts.validate().unwrap_err().to_string();
    assert!(
        err.contains("--use-srq works only with send_bw and send_lat"),
        "{err}"
    );
    let mut opts = PerfOptions::defaults(TestKind::SendBw);
    opts.use_srq = true;
    opts.num_qps = 8;
    opts.rx_depth = 4;
    assert!(opts.srq_depth(Role::Server).is_err());
    // The sending side of send_bw has no SRQ (perftest creates it where receives are).
    assert_eq!(opts.srq_depth(Role::Client).unwrap(), None);
    opts.rx_depth = 8;
    assert_eq!(opts.srq_depth(Role::Server).unwrap(), Some(8));
}
