//! A device of several engine shards (`DeviceConfig::shards`), over in-memory lanes (one per
//! shard, like the queues of a veth pair: what shard `i` sends, the peer's shard `i`
//! receives). Threads that each own a CQ and its QPs get a shard each; a flow that arrives on
//! the wrong shard is handed to the right one; a CQ fed by QPs of two shards gets all their
//! completions. No root.
use std::sync::atomic::Ordering;

use xroce::verbs::*;

#[path = "common/sides.rs"]
mod sides;
use sides::*;

fn sharded(shards: u32, loss: f64) -> (Device, Device, Pd, Pd) {
    let config = DeviceConfig {
        shards,
        ..DeviceConfig::default()
    };
    let (da, db, _links) =
        Device::mem_pair_sharded(&mem_link_config(1500, loss, 11), config).unwrap();
    assert_eq!((da.shard_count(), db.shard_count()), (shards, shards));
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    (da, db, pa, pb)
}

fn handed_off(dev: &Device) -> u64 {
    dev.progress_stats()
        .handed_off_frames
        .load(Ordering::Relaxed)
}

#[test]
fn threads_that_each_own_a_cq_and_its_qp_get_a_shard_each() {
    let (da, db, pa, pb) = sharded(2, 0.0);
    let pairs: Vec<(Side, Side)> = (0..2)
        .map(|_| {
            let (a, b) = (side(&da, &pa), side(&db, &pb));
            connect(&a, &b);
            (a, b)
        })
        .collect();
    for (i, (a, b)) in pairs.iter().enumerate() {
        assert_eq!(a.cq.shard(), i as u32, "CQs are placed round robin");
        assert_eq!((a.qp.shard(), b.qp.shard()), (i as u32, i as u32));
    }
    std::thread::scope(|scope| {
        for (a, b) in &pairs {
            scope.spawn(move || ping_pong(a, b, 1000));
        }
    });
    // Both ends placed each flow on the same lane: nothing crossed between shards.
    assert_eq!((handed_off(&da), handed_off(&db)), (0, 0));
    // The device's counters are the sum of its shards'.
    let rcvd = da.counters().rcvd_pkts;
    assert!(rcvd >= 2000, "A received {rcvd} packets for 2 x 1000 SENDs");
}

#[test]
fn a_flow_that_arrives_on_another_shard_is_handed_to_its_qps_shard() {
    // With 2% loss on each lane: retransmissions cross shards too.
    let (da, db, pa, pb) = sharded(2, 0.02);
    // B's first CQ goes to shard 0 and is not used: B's QP lands on shard 1, A's on 0.
    let _unused = db.create_cq(1, None).unwrap();
    let (a, b) = (side(&da, &pa), side(&db, &pb));
    assert_eq!((a.qp.shard(), b.qp.shard()), (0, 1));
    connect(&a, &b);
    ping_pong(&a, &b, 300);
    // A sends on lane 0, so B receives on its shard 0 and hands to shard 1; B answers on
    // lane 1, so A receives on its shard 1 and hands to shard 0.
    assert!(handed_off(&da) >= 300, "A handed off {}", handed_off(&da));
    assert!(handed_off(&db) >= 300, "B handed off {}", handed_off(&db));
}

#[test]
fn a_cq_fed_by_qps_of_two_shards_gets_every_completion() {
    let (da, db, pa, pb) = sharded(2, 0.0);
    // On A: CQ x on shard 0, CQ y on shard 1. QP p sends into y (so lives on shard 1) and
    // receives into x, which must then be polled on both shards.
    let x = da.create_cq(256, None).unwrap();
    let y = da.create_cq(256, None).unwrap();
    assert_eq!((x.shard(), y.shard()), (0, 1));
    let p = pa
        .create_qp(&QpInitAttr {
            cap: QpCaps {
                max_send_wr: 64,
                max_recv_wr: 64,
                ..QpCaps::default()
            },
            ..QpInitAttr::rc(&y, &x)
        })
        .unwrap();
    assert_eq!(p.shard(), 1);
    let a = Side {
        dev: da.clone(),
        _pd: pa.clone(),
        cq: x,
        qp: p,
        mr: pa.reg_mr(8192, Access::ALL).unwrap(),
    };
    let b = side(&db, &pb);
    connect(&a, &b);
    for i in 0..32 {
        post_recv(&a, i);
    }
    for i in 0..32u64 {
        send(&b, i, i as u8);
    }
    let mut got = 0;
    let deadline = std::time::Instant::now() + WAIT;
    while got < 32 {
        if let Some(wc) = a.cq.poll_one().unwrap() {
            assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::Recv));
            assert_eq!(wc.wr_id, got);
            got += 1;
        }
        assert!(std::time::Instant::now() < deadline, "{got} of 32 receives");
    }
}

#[test]
fn memory_written_through_any_shard_is_read_whole() {
    let (da, db, pa, pb) = sharded(2, 0.0);
    let pairs: Vec<(Side, Side)> = (0..2)
        .map(|_| {
            let (a, b) = (side(&da, &pa), side(&db, &pb));
            connect(&a, &b);
            (a, b)
        })
        .collect();
    // One region of A, written by B's QPs of both shards at once, at different offsets.
    let target = pa.reg_mr(1 << 16, Access::ALL).unwrap();
    std::thread::scope(|scope| {
        for (i, (_, b)) in pairs.iter().enumerate() {
            let target = &target;
            scope.spawn(move || {
                b.mr.write(0, &[0xA0 + i as u8; 4096]).unwrap();
                for k in 0..8u64 {
                    b.qp.post_send(&SendWr {
                        wr_id: k,
                        op: WrOp::Write {
                            remote_addr: target.addr() + (i as u64 * 8 + k) * 4096,
                            rkey: target.rkey(),
                        },
                        sg_list: vec![b.mr.sge(0, 4096).unwrap()],
                        flags: SendFlags::SIGNALED,
                        ud: None,
                    })
                    .unwrap();
                }
                let wcs = b.cq.wait(8, WAIT).unwrap();
                assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
            });
        }
    });
    for i in 0..2u64 {
        for k in 0..8 {
            let got = target.to_vec(((i * 8 + k) * 4096) as usize, 4096).unwrap();
            assert_eq!(got, vec![0xA0 + i as u8; 4096], "block {i}/{k}");
        }
    }
}

#[test]
fn a_cq_can_be_placed_on_a_chosen_shard() {
    let (da, _db, pa, _pb) = sharded(3, 0.0);
    for shard in [2, 0, 2, 1] {
        let cq = da.create_cq_on_shard(16, None, shard).unwrap();
        assert_eq!(cq.shard(), shard);
        let qp = pa.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
        assert_eq!(qp.shard(), shard);
    }
    let err = da.create_cq_on_shard(16, None, 3).unwrap_err();
    assert!(
        matches!(&err, VerbsError::InvalidArgument(m) if m.contains("3 engine shard")),
        "{err}"
    );
}

#[test]
fn shard_counts_out_of_range_are_typed_errors() {
    for shards in [0, MAX_SHARDS + 1] {
        let config = DeviceConfig {
            shards,
            ..DeviceConfig::default()
        };
        let err = Device::mem_pair_sharded(&mem_link_config(1500, 0.0, 1), config).unwrap_err();
        assert!(
            matches!(&err, VerbsError::InvalidArgument(m) if m.contains("1 to 64")),
            "{err}"
        );
    }
    let two = DeviceConfig {
        shards: 2,
        ..DeviceConfig::default()
    };
    let err = Device::mem_pair(&mem_link_config(1500, 0.0, 1), two.clone()).unwrap_err();
    assert!(matches!(err, VerbsError::InvalidArgument(_)), "{err}");
    // The UDP driver has one socket: one shard.
    let udp = DeviceConfig {
        driver: DriverKind::Udp,
        udp_local_ip: Some([127, 0, 0, 1].into()),
        ..two.clone()
    };
    let err = Device::open("lo", udp).unwrap_err();
    assert!(
        matches!(&err, VerbsError::InvalidArgument(m) if m.contains("one socket")),
        "{err}"
    );
    // One capture file, one shard.
    let capture = DeviceConfig {
        pcap: Some(std::env::temp_dir().join("xroce-shards-refused.pcap")),
        ..two
    };
    let err = Device::mem_pair_sharded(&mem_link_config(1500, 0.0, 1), capture).unwrap_err();
    assert!(
        matches!(&err, VerbsError::InvalidArgument(m) if m.contains("capture")),
        "{err}"
    );
}
