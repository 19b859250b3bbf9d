//! The verbs API end to end over the in-memory driver: no root, no kernel in the data path.
//! Every operation, both directions, path MTUs 1024 and 4096, sizes 0 B to several MiB,
//! many QPs at once, loss, a peer that disappears, completion channels, typed errors.
use std::time::{Duration, Instant};

use xroce::verbs::*;

const ALL_REMOTE: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);
const WAIT: Duration = Duration::from_secs(20);

struct Side {
    dev: Device,
    pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn side(dev: &Device, mr_len: usize, cap: QpCaps) -> Side {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4096, None).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            cap,
            ..QpInitAttr::rc(&cq, &cq)
        })
        .unwrap();
    let mr = pd.reg_mr(mr_len, ALL_REMOTE).unwrap();
    Side {
        dev: dev.clone(),
        pd,
        cq,
        qp,
        mr,
    }
}

fn connect(a: &Side, b: &Side, mtu: Mtu, opts: RcOptions) {
    let ga = a.dev.ipv4_gid_index().unwrap();
    let gb = b.dev.ipv4_gid_index().unwrap();
    let oa = RcOptions {
        sgid_index: ga as u8,
        path_mtu: mtu,
        sq_psn: 0x00ff_fff0, // wraps past 2^24 within the first messages
        ..opts
    };
    let ob = RcOptions {
        sgid_index: gb as u8,
        path_mtu: mtu,
        sq_psn: 0x12345,
        ..opts
    };
    a.qp.connect_rc(
        &RcPeer {
            qpn: b.qp.qp_num(),
            psn: ob.sq_psn,
            gid: b.dev.query_gid(gb).unwrap(),
        },
        &oa,
    )
    .unwrap();
    b.qp.connect_rc(
        &RcPeer {
            qpn: a.qp.qp_num(),
            psn: oa.sq_psn,
            gid: a.dev.query_gid(ga).unwrap(),
        },
        &ob,
    )
    .unwrap();
}

fn pair(mtu_link: u32, mr_len: usize) -> (Side, Side, MemLink) {
    let (da, db, link) =
        Device::mem_pair(&mem_link_config(mtu_link, 0.0, 1), DeviceConfig::default()).unwrap();
    let cap = QpCaps {
        max_send_wr: 512,
        max_recv_wr: 512,
        ..QpCaps::default()
    };
    (side(&da, mr_len, cap), side(&db, mr_len, cap), link)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

fn one(cq: &Cq) -> Wc {
    let wcs = cq.wait(1, WAIT).unwrap();
    assert_eq!(wcs.len(), 1, "no completion within {WAIT:?}");
    wcs[0]
}

fn wr(wr_id: u64, op: WrOp, sg_list: Vec<Sge>) -> SendWr {
    SendWr {
        wr_id,
        op,
        sg_list,
        flags: SendFlags::SIGNALED,
        ud: None,
    }
}

/// Runs every RC operation from `a` to `b` with a message of `len` bytes and checks every
/// byte and value.
fn all_ops(a: &Side, b: &Side, len: usize) {
    let len32 = len as u32;
    // SEND and SEND_WITH_IMM: b posts receives into the second half of its MR.
    let data = pattern(len, 1);
    a.mr.write(0, &data).unwrap();
    for (i, imm) in [None, Some(0xdead_beef_u32)].into_iter().enumerate() {
        b.qp.post_recv(&RecvWr {
            wr_id: 100 + i as u64,
            sg_list: vec![b.mr.sge(len, len32.max(1)).unwrap()],
        })
        .unwrap();
        let op = match imm {
            None => WrOp::Send,
            Some(imm) => WrOp::SendWithImm { imm },
        };
        let sg = if len == 0 {
            vec![]
        } else {
            vec![a.mr.sge(0, len32).unwrap()]
        };
        a.qp.post_send(&wr(1, op, sg)).unwrap();
        let sc = one(&a.cq);
        assert_eq!((sc.status, sc.opcode), (WcStatus::Success, WcOpcode::Send));
        let rc = one(&b.cq);
        assert_eq!(rc.status, WcStatus::Success, "{rc:?}");
        assert_eq!(rc.opcode, WcOpcode::Recv);
        assert_eq!(rc.byte_len, len32);
        assert_eq!(rc.imm_data, imm);
        assert_eq!(rc.wr_id, 100 + i as u64);
        assert_eq!(b.mr.to_vec(len, len).unwrap(), data, "SEND payload");
    }
    // RDMA WRITE into b's first half, then WRITE_WITH_IMM (consumes a receive).
    let data = pattern(len, 2);
    a.mr.write(0, &data).unwrap();
    let sg = if len == 0 {
        vec![]
    } else {
        vec![a.mr.sge(0, len32).unwrap()]
    };
    a.qp.post_send(&wr(
        2,
        WrOp::Write {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
        },
        sg.clone(),
    ))
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert_eq!(b.mr.to_vec(0, len).unwrap(), data, "WRITE payload");
    let data = pattern(len, 3);
    a.mr.write(0, &data).unwrap();
    b.qp.post_recv(&RecvWr {
        wr_id: 200,
        sg_list: vec![],
    })
    .unwrap();
    a.qp.post_send(&wr(
        3,
        WrOp::WriteWithImm {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
            imm: 0x0102_0304,
        },
        sg,
    ))
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    let rc = one(&b.cq);
    assert_eq!(
        (rc.status, rc.opcode, rc.imm_data, rc.byte_len),
        (
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            Some(0x0102_0304),
            len32
        )
    );
    assert_eq!(b.mr.to_vec(0, len).unwrap(), data, "WRITE_WITH_IMM payload");
    // RDMA READ of b's second half into a's second half.
    let data = pattern(len, 4);
    b.mr.write(len, &data).unwrap();
    let sg = if len == 0 {
        vec![]
    } else {
        vec![a.mr.sge(len, len32).unwrap()]
    };
    a.qp.post_send(&wr(
        4,
        WrOp::Read {
            remote_addr: b.mr.addr() + len as u64,
            rkey: b.mr.rkey(),
        },
        sg,
    ))
    .unwrap();
    let wc = one(&a.cq);
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert_eq!(a.mr.to_vec(len, len).unwrap(), data, "READ payload");
}

fn atomics(a: &Side, b: &Side) {
    let at = b.mr.len() - 8;
    b.mr.write_u64(at, 40).unwrap();
    let result_at = a.mr.len() - 8;
    a.qp.post_send(&wr(
        5,
        WrOp::FetchAdd {
            remote_addr: b.mr.addr() + at as u64,
            rkey: b.mr.rkey(),
            add: 2,
        },
        vec![a.mr.sge(result_at, 8).unwrap()],
    ))
    .unwrap();
    let wc = one(&a.cq);
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::FetchAdd)
    );
    assert_eq!(a.mr.read_u64(result_at).unwrap(), 40, "FETCH_ADD original");
    assert_eq!(b.mr.read_u64(at).unwrap(), 42, "FETCH_ADD result");
    for (compare, swap, expect_orig, expect_after) in [(42, 7, 42, 7), (42, 9, 7, 7)] {
        a.qp.post_send(&wr(
            6,
            WrOp::CompareSwap {
                remote_addr: b.mr.addr() + at as u64,
                rkey: b.mr.rkey(),
                compare,
                swap,
            },
            vec![a.mr.sge(result_at, 8).unwrap()],
        ))
        .unwrap();
        let wc = one(&a.cq);
        assert_eq!(
            (wc.status, wc.opcode),
            (WcStatus::Success, WcOpcode::CompSwap)
        );
        assert_eq!(a.mr.read_u64(result_at).unwrap(), expect_orig);
        assert_eq!(b.mr.read_u64(at).unwrap(), expect_after);
    }
}

#[test]
fn every_op_both_directions_mtu_1024() {
    let (a, b, _link) = pair(1500, 64 * 1024);
    connect(&a, &b, Mtu::Mtu1024, RcOptions::default());
    for len in [0, 1, 1023, 1024, 1025, 5000, 30 * 1024] {
        all_ops(&a, &b, len);
        all_ops(&b, &a, len);
    }
    atomics(&a, &b);
    atomics(&b, &a);
    assert_eq!(a.dev.counters().drops.bad_icrc, 0);
}

#[test]
fn every_op_both_directions_mtu_4096_on_9000_link() {
    let (a, b, _link) = pair(9000, 64 * 1024);
    assert_eq!(a.dev.active_mtu(), Mtu::Mtu4096);
    assert_eq!(a.dev.query_port(1).unwrap().active_mtu, Mtu::Mtu4096);
    connect(&a, &b, Mtu::Mtu4096, RcOptions::default());
    for len in [0, 4095, 4096, 4097, 30 * 1024] {
        all_ops(&a, &b, len);
        all_ops(&b, &a, len);
    }
    atomics(&a, &b);
}

#[test]
fn several_mib_write_and_read() {
    let len = 4 << 20;
    let (a, b, _link) = pair(9000, 2 * len);
    connect(&a, &b, Mtu::Mtu4096, RcOptions::default());
    let start = Instant::now();
    all_ops(&a, &b, len);
    eprintln!("4 MiB: every op in {:?}", start.elapsed());
}

#[test]
fn lossy_link_still_delivers_every_byte() {
    let (da, db, link) =
        Device::mem_pair(&mem_link_config(1500, 0.05, 42), DeviceConfig::default()).unwrap();
    let a = side(&da, 256 * 1024, QpCaps::default());
    let b = side(&db, 256 * 1024, QpCaps::default());
    // A short ACK timeout so the test does not wait 67 ms per loss (4.096 us x 2^10 = 4 ms).
    let opts = RcOptions {
        timeout: 10,
        ..RcOptions::default()
    };
    connect(&a, &b, Mtu::Mtu1024, opts);
    all_ops(&a, &b, 100 * 1024);
    atomics(&a, &b);
    let lost = link.stats().lost.load(std::sync::atomic::Ordering::Relaxed);
    assert!(lost > 0, "the link lost nothing: the test proves nothing");
    let counters = a.dev.counters();
    assert!(counters.completer_retry_err + b.dev.counters().completer_retry_err > 0);
}

#[test]
fn many_qps_at_once() {
    let (da, db, _link) =
        Device::mem_pair(&mem_link_config(1500, 0.0, 1), DeviceConfig::default()).unwrap();
    let pairs: Vec<(Side, Side)> = (0..16)
        .map(|_| {
            let a = side(&da, 64 * 1024, QpCaps::default());
            let b = side(&db, 64 * 1024, QpCaps::default());
            connect(&a, &b, Mtu::Mtu1024, RcOptions::default());
            (a, b)
        })
        .collect();
    // All QPs write at the same time, each its own pattern.
    for (i, (a, b)) in pairs.iter().enumerate() {
        a.mr.write(0, &pattern(60_000, i as u8)).unwrap();
        a.qp.post_send(&wr(
            i as u64,
            WrOp::Write {
                remote_addr: b.mr.addr(),
                rkey: b.mr.rkey(),
            },
            vec![a.mr.sge(0, 60_000).unwrap()],
        ))
        .unwrap();
    }
    for (i, (a, b)) in pairs.iter().enumerate() {
        let wc = one(&a.cq);
        assert_eq!((wc.status, wc.wr_id), (WcStatus::Success, i as u64));
        assert_eq!(b.mr.to_vec(0, 60_000).unwrap(), pattern(60_000, i as u8));
    }
}

#[test]
fn vanished_peer_gives_retry_exceeded_within_timeout() {
    let (a, b, link) = pair(1500, 4096);
    // timeout 12 = 16.8 ms, retry_cnt 3: about 4 x 16.8 ms = 67 ms until RETRY_EXC_ERR.
    let opts = RcOptions {
        timeout: 12,
        retry_cnt: 3,
        ..RcOptions::default()
    };
    connect(&a, &b, Mtu::Mtu1024, opts);
    link.set_cut(true);
    let start = Instant::now();
    a.qp.post_send(&wr(
        9,
        WrOp::Write {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
        },
        vec![a.mr.sge(0, 100).unwrap()],
    ))
    .unwrap();
    let wc = one(&a.cq);
    let took = start.elapsed();
    assert_eq!(wc.status, WcStatus::RetryExcErr, "{wc:?}");
    assert!(
        took >= Duration::from_millis(60) && took < Duration::from_secs(2),
        "RETRY_EXC_ERR after {took:?}, expected about 67 ms"
    );
    assert_eq!(a.qp.state().unwrap(), QpState::Err);
    assert!(a.dev.counters().retry_exceeded_err >= 1);
    // Later WRs are flushed.
    a.qp.post_send(&wr(10, WrOp::Send, vec![])).unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::WrFlushErr);
}

#[test]
fn responder_answers_without_the_application_polling() {
    // b never polls its CQ nor touches its QP after connecting: READs must still be answered.
    let (a, b, _link) = pair(1500, 8192);
    connect(&a, &b, Mtu::Mtu1024, RcOptions::default());
    b.mr.write(0, &pattern(8192, 9)).unwrap();
    for i in 0..20 {
        a.qp.post_send(&wr(
            i,
            WrOp::Read {
                remote_addr: b.mr.addr(),
                rkey: b.mr.rkey(),
            },
            vec![a.mr.sge(0, 8192).unwrap()],
        ))
        .unwrap();
    }
    let wcs = a.cq.wait(20, WAIT).unwrap();
    assert_eq!(wcs.len(), 20);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    assert_eq!(a.mr.to_vec(0, 8192).unwrap(), pattern(8192, 9));
}

#[test]
fn busy_poll_mode_works_too() {
    let config = DeviceConfig {
        progress: ProgressMode::BusyPoll,
        ..DeviceConfig::default()
    };
    let (da, db, _link) = Device::mem_pair(&mem_link_config(1500, 0.0, 1), config).unwrap();
    let a = side(&da, 16384, QpCaps::default());
    let b = side(&db, 16384, QpCaps::default());
    connect(&a, &b, Mtu::Mtu1024, RcOptions::default());
    all_ops(&a, &b, 5000);
}

#[test]
fn completion_channel_wakes_a_blocked_thread() {
    let (da, db, _link) =
        Device::mem_pair(&mem_link_config(1500, 0.0, 1), DeviceConfig::default()).unwrap();
    let channel = db.create_comp_channel().unwrap();
    let pdb = db.alloc_pd().unwrap();
    let cqb = db.create_cq(16, Some(&channel)).unwrap();
    let qpb = pdb.create_qp(&QpInitAttr::rc(&cqb, &cqb)).unwrap();
    let mrb = pdb.reg_mr(64, ALL_REMOTE).unwrap();
    let a = side(&da, 64, QpCaps::default());
    let b = Side {
        dev: db.clone(),
        pd: pdb,
        cq: cqb.clone(),
        qp: qpb,
        mr: mrb,
    };
    connect(&a, &b, Mtu::Mtu1024, RcOptions::default());
    b.qp.post_recv(&RecvWr {
        wr_id: 77,
        sg_list: vec![b.mr.sge(0, 64).unwrap()],
    })
    .unwrap();
    cqb.req_notify(false).unwrap();
    assert!(channel.try_get_cq_event().is_none());
    let waiter = {
        let channel = channel.clone();
        std::thread::spawn(move || channel.get_cq_event(Some(WAIT)))
    };
    std::thread::sleep(Duration::from_millis(20));
    a.mr.write(0, b"ping").unwrap();
    a.qp.post_send(&wr(1, WrOp::Send, vec![a.mr.sge(0, 4).unwrap()]))
        .unwrap();
    let fired = waiter.join().unwrap().unwrap();
    assert_eq!(fired, cqb.id());
    let wc = cqb.poll_one().unwrap().unwrap();
    assert_eq!((wc.wr_id, wc.byte_len), (77, 4));
    // Not re-armed: a second completion raises no event.
    b.qp.post_recv(&RecvWr {
        wr_id: 78,
        sg_list: vec![b.mr.sge(0, 64).unwrap()],
    })
    .unwrap();
    a.qp.post_send(&wr(2, WrOp::Send, vec![a.mr.sge(0, 4).unwrap()]))
        .unwrap();
    assert_eq!(one(&cqb).wr_id, 78);
    assert!(matches!(
        channel.get_cq_event(Some(Duration::from_millis(50))),
        Err(VerbsError::Timeout(_))
    ));
}

#[test]
fn ud_send_through_an_address_handle() {
    let (da, db, _link) =
        Device::mem_pair(&mem_link_config(1500, 0.0, 1), DeviceConfig::default()).unwrap();
    let mk = |dev: &Device| {
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(16, None).unwrap();
        let qp = pd.create_qp(&QpInitAttr::ud(&cq, &cq)).unwrap();
        qp.ready_ud(0x1111_1111, 0).unwrap();
        let mr = pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
        (pd, cq, qp, mr)
    };
    let (pda, cqa, qpa, mra) = mk(&da);
    let (_pdb, cqb, qpb, mrb) = mk(&db);
    qpb.post_recv(&RecvWr {
        wr_id: 5,
        sg_list: vec![mrb.sge(0, 40 + 1024).unwrap()],
    })
    .unwrap();
    let gb = db.ipv4_gid_index().unwrap();
    let ah = pda
        .create_ah(&AhAttr::new(
            db.query_gid(gb).unwrap(),
            da.ipv4_gid_index().unwrap() as u8,
        ))
        .unwrap();
    mra.write(0, b"datagram").unwrap();
    qpa.post_send(&SendWr {
        ud: Some(UdDest {
            av: ah.av(),
            remote_qpn: qpb.qp_num(),
            remote_qkey: 0x1111_1111,
        }),
        ..wr(1, WrOp::Send, vec![mra.sge(0, 8).unwrap()])
    })
    .unwrap();
    assert_eq!(one(&cqa).status, WcStatus::Success);
    let wc = one(&cqb);
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(wc.src_qp, qpa.qp_num());
    assert!(wc.grh_present);
    assert_eq!(mrb.to_vec(40, 8).unwrap(), b"datagram");
}

/// Every address-vector field is checked where it is set, with an error naming it: in
/// create_ah, in modify_qp to RTR and in a UD send's destination. Nothing invalid reaches
/// the transmit path, where the frame would be lost after its PSN was assigned.
#[test]
fn invalid_address_vector_fields_are_refused_where_set_and_named() {
    let (da, db, _link) =
        Device::mem_pair(&mem_link_config(1500, 0.0, 1), DeviceConfig::default()).unwrap();
    let pd = da.alloc_pd().unwrap();
    let sgid = da.ipv4_gid_index().unwrap() as u8;
    let dgid = db.query_gid(db.ipv4_gid_index().unwrap()).unwrap();
    let field_of = |err: VerbsError| match err {
        VerbsError::Engine(xroce::engine::EngineError::InvalidAddressVector { field, .. }) => field,
        other => panic!("expected an address vector error, got {other}"),
    };
    // create_ah
    let mut attr = AhAttr::new(dgid, sgid);
    attr.flow_label = 1 << 20;
    let err = pd.create_ah(&attr).unwrap_err();
    assert!(err.to_string().contains("flow_label"), "{err}");
    assert_eq!(field_of(err), "flow_label");
    let mut attr = AhAttr::new(dgid, sgid);
    attr.hop_limit = 0;
    assert_eq!(field_of(pd.create_ah(&attr).unwrap_err()), "hop_limit");
    let attr = AhAttr::new(Gid::from_ip("224.0.0.1".parse().unwrap()), sgid);
    assert_eq!(field_of(pd.create_ah(&attr).unwrap_err()), "dest_ip");
    let err = pd.create_ah(&AhAttr::new(dgid, 9)).unwrap_err();
    assert!(err.to_string().contains("no GID at index 9"), "{err}");
    let ah = pd.create_ah(&AhAttr::new(dgid, sgid)).unwrap();
    // modify_qp to RTR
    let cq = da.create_cq(16, None).unwrap();
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    qp.to_init(ALL_REMOTE, 0).unwrap();
    let mut av = ah.av();
    av.vlan_id = Some(4096);
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: Some(av),
        dest_qp_num: 0x22,
        ..QpAttr::default()
    };
    let mask = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    let err = qp.modify(&rtr, mask).unwrap_err();
    assert!(err.to_string().contains("vlan_id"), "{err}");
    assert_eq!(field_of(err), "vlan_id");
    assert_eq!(qp.state().unwrap(), QpState::Init);
    // A UD send's destination
    let ud = pd.create_qp(&QpInitAttr::ud(&cq, &cq)).unwrap();
    ud.ready_ud(0x1111_1111, 0).unwrap();
    let mr = pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    let mut av = ah.av();
    av.dest_mac = [0; 6];
    let err = ud
        .post_send(&SendWr {
            ud: Some(UdDest {
                av,
                remote_qpn: 0x22,
                remote_qkey: 0x1111_1111,
            }),
            ..wr(1, WrOp::Send, vec![mr.sge(0, 8).unwrap()])
        })
        .unwrap_err();
    assert_eq!(field_of(err), "dest_mac");
    assert!(
        cq.poll_one().unwrap().is_none(),
        "no completion for a refused WR"
    );
    assert_eq!(da.counters().emit_failed, 0);
}

#[test]
fn typed_errors_name_what_was_wrong() {
    let (da, _db, _link) =
        Device::mem_pair(&mem_link_config(1500, 0.0, 1), DeviceConfig::default()).unwrap();
    let pd = da.alloc_pd().unwrap();
    let cq = da.create_cq(16, None).unwrap();
    let err = pd
        .create_qp(&QpInitAttr {
            cap: QpCaps {
                max_send_wr: 1 << 20,
                ..QpCaps::default()
            },
            ..QpInitAttr::rc(&cq, &cq)
        })
        .unwrap_err();
    assert!(
        matches!(
            err,
            VerbsError::LimitExceeded {
                what: "max_send_wr",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("max_send_wr"));
    let err = pd
        .create_qp(&QpInitAttr {
            cap: QpCaps {
                max_inline_data: 100_000,
                ..QpCaps::default()
            },
            ..QpInitAttr::rc(&cq, &cq)
        })
        .unwrap_err();
    assert!(err.to_string().contains("max_inline_data"), "{err}");
    assert!(matches!(
        da.create_cq(0, None),
        Err(VerbsError::Zero { what: "cqe" })
    ));
    assert!(matches!(
        da.query_gid(99),
        Err(VerbsError::NoSuchGid { index: 99, .. })
    ));
    assert!(matches!(da.query_port(2), Err(VerbsError::NoSuchPort(2))));
    let mr = pd.reg_mr(16, Access::LOCAL_WRITE).unwrap();
    assert!(matches!(
        mr.write(10, &[0; 7]),
        Err(VerbsError::MrRange {
            offset: 10,
            len: 7,
            mr_len: 16
        })
    ));
    assert!(
        pd.reg_mr(16, Access::REMOTE_WRITE).is_err(),
        "remote write needs local write"
    );
    // A missing required attribute: RESET -> INIT without PORT.
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let err = qp
        .modify(
            &QpAttr {
                qp_state: QpState::Init,
                ..QpAttr::default()
            },
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::ACCESS_FLAGS,
        )
        .unwrap_err();
    assert!(err.to_string().contains("PORT"), "{err}");
    // Posting a send in RESET.
    let err = qp.post_send(&wr(1, WrOp::Send, vec![])).unwrap_err();
    assert!(err.to_string().contains("Reset"), "{err}");
    // A batch stops at the refused WR and says which.
    qp.to_init(ALL_REMOTE, 0).unwrap();
    let good = RecvWr {
        wr_id: 1,
        sg_list: vec![mr.sge(0, 16).unwrap()],
    };
    let bad = RecvWr {
        wr_id: 2,
        sg_list: vec![Sge {
            addr: mr.addr(),
            length: 16,
            lkey: 0xdead,
        }],
    };
    let err = qp.post_recv_batch(&[good, bad]).unwrap_err();
    assert!(
        matches!(
            err,
            VerbsError::PostFailed {
                index: 1,
                wr_id: 2,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn objects_are_usable_from_many_threads() {
    let (a, b, _link) = pair(1500, 64 * 1024);
    connect(&a, &b, Mtu::Mtu1024, RcOptions::default());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let qp = a.qp.clone();
            let mr = a.mr.clone();
            let (raddr, rkey) = (b.mr.addr(), b.mr.rkey());
            std::thread::spawn(move || {
                for i in 0..25u64 {
                    let off = (t * 25 + i) as usize * 64;
                    mr.write(off, &[t as u8 + 1; 64]).unwrap();
                    loop {
                        match qp.post_send(&wr(
                            t * 1000 + i,
                            WrOp::Write {
                                remote_addr: raddr + off as u64,
                                rkey,
                            },
                            vec![mr.sge(off, 64).unwrap()],
                        )) {
                            Ok(()) => break,
                            Err(VerbsError::Engine(_)) => std::thread::yield_now(),
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let wcs = a.cq.wait(100, WAIT).unwrap();
    assert_eq!(wcs.len(), 100);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    for t in 0..4u64 {
        for i in 0..25u64 {
            let off = (t * 25 + i) as usize * 64;
            assert_eq!(b.mr.to_vec(off, 64).unwrap(), vec![t as u8 + 1; 64]);
        }
    }
    let _ = (&a.pd, &b.pd);
}

#[test]
fn dropping_the_peer_device_looks_like_a_vanished_peer() {
    let (a, b, _link) = pair(1500, 4096);
    let opts = RcOptions {
        timeout: 10,
        retry_cnt: 2,
        ..RcOptions::default()
    };
    connect(&a, &b, Mtu::Mtu1024, opts);
    let (raddr, rkey) = (b.mr.addr(), b.mr.rkey());
    drop(b); // the whole peer device: its progress thread stops, its driver end closes
    a.qp.post_send(&wr(
        1,
        WrOp::Write {
            remote_addr: raddr,
            rkey,
        },
        vec![a.mr.sge(0, 10).unwrap()],
    ))
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::RetryExcErr);
    assert_eq!(
        a.dev.stopped_reason(),
        None,
        "a lost peer is not a local failure"
    );
}

#[test]
fn object_limits_are_enforced_and_released() {
    let (da, _db, _link) =
        Device::mem_pair(&mem_link_config(1500, 0.0, 1), DeviceConfig::default()).unwrap();
    let max_pd = da.query_device().max_pd as usize;
    let mut pds: Vec<Pd> = (0..max_pd).map(|_| da.alloc_pd().unwrap()).collect();
    let err = da.alloc_pd().unwrap_err();
    assert!(
        matches!(err, VerbsError::LimitExceeded { what: "max_pd", .. }),
        "{err}"
    );
    pds.pop();
    let pd = da.alloc_pd().expect("a slot was given back");
    let cq = da.create_cq(4, None).unwrap();
    let max_qp = da.query_device().max_qp as usize;
    let mut qps: Vec<Qp> = (0..max_qp)
        .map(|_| {
            pd.create_qp(&QpInitAttr {
                cap: QpCaps {
                    max_send_wr: 1,
                    max_recv_wr: 1,
                    ..QpCaps::default()
                },
                ..QpInitAttr::rc(&cq, &cq)
            })
            .unwrap()
        })
        .collect();
    let err = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap_err();
    assert!(err.to_string().contains("max_qp"), "{err}");
    qps.truncate(10);
    pd.create_qp(&QpInitAttr::rc(&cq, &cq))
        .expect("QP slots were given back");
}

#[test]
fn handles_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Device>();
    check::<Pd>();
    check::<Mr>();
    check::<Cq>();
    check::<Qp>();
    check::<CompletionChannel>();
    check::<AddressHandle>();
}

#[test]
fn posting_receives_does_not_wake_the_progress_thread_and_a_send_at_most_once() {
    // A receive creates no frame and arms no timer, so it costs no wake-up write (one
    // system call each). A send is transmitted by the posting thread itself (the progress
    // token is free); it arms a retransmission timer that the background thread, if it is
    // asleep with no timer, must learn of: at most one wake-up.
    let (a, b, _link) = pair(1500, 8192);
    connect(&a, &b, Mtu::Mtu1024, RcOptions::default());
    let wakeups = |s: &Side| {
        s.dev
            .progress_stats()
            .wakeups
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = wakeups(&b);
    for i in 0..100 {
        b.qp.post_recv(&RecvWr {
            wr_id: i,
            sg_list: vec![b.mr.sge(0, 64).unwrap()],
        })
        .unwrap();
    }
    let batch: Vec<RecvWr> = (100..150)
        .map(|i| RecvWr {
            wr_id: i,
            sg_list: vec![b.mr.sge(0, 64).unwrap()],
        })
        .collect();
    b.qp.post_recv_batch(&batch).unwrap();
    assert_eq!(
        wakeups(&b),
        before,
        "posting 150 receives woke the progress thread"
    );

    let before = wakeups(&a);
    a.qp.post_send(&wr(1, WrOp::Send, vec![a.mr.sge(0, 64).unwrap()]))
        .unwrap();
    let woke = wakeups(&a) - before;
    assert!(
        woke <= 1,
        "a send woke the progress thread {woke} times (at most once, for its timer)"
    );
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert_eq!(one(&b.cq).wr_id, 0);
}

#[test]
fn a_receive_posted_after_an_rnr_nak_completes_the_send_without_a_wake_up() {
    // The SEND arrives before any receive: b answers RNR NAK, a waits min_rnr_timer and
    // retries; the receive posted meanwhile (no wake-up) takes the retried SEND.
    let (a, b, _link) = pair(1500, 8192);
    let opts = RcOptions {
        min_rnr_timer: 1, // 0.01 ms
        ..RcOptions::default()
    };
    connect(&a, &b, Mtu::Mtu1024, opts);
    a.mr.write(0, &pattern(256, 4)).unwrap();
    a.qp.post_send(&wr(7, WrOp::Send, vec![a.mr.sge(0, 256).unwrap()]))
        .unwrap();
    let deadline = Instant::now() + WAIT;
    while b.dev.counters().send_rnr_err == 0 {
        assert!(Instant::now() < deadline, "b never answered RNR NAK");
        std::thread::sleep(Duration::from_millis(1));
    }
    b.qp.post_recv(&RecvWr {
        wr_id: 9,
        sg_list: vec![b.mr.sge(0, 256).unwrap()],
    })
    .unwrap();
    let received = one(&b.cq);
    assert_eq!((received.wr_id, received.status), (9, WcStatus::Success));
    assert_eq!(b.mr.to_vec(0, 256).unwrap(), pattern(256, 4));
    let sent = one(&a.cq);
    assert_eq!((sent.wr_id, sent.status), (7, WcStatus::Success));
}
