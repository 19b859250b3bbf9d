//! Engine shards (`Engine::new_shards`): the engines of one device share its PDs, MRs and
//! CQs, each numbers its QPs in its own lane, and the lane of a frame's destination QPN
//! names the shard that must handle it. Device A has two shards here; device B is one engine.
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::Barrier;

use xroce::engine::{
    shard_of_qpn, Access, CqId, Engine, EngineConfig, EngineError, Instant, MrInfo, PdId, QpCaps,
    QpInit, QpType, SendFlags, SendWr, Sge, Wc, WcStatus, WrOp, MAX_FRAME_LEN,
};
use xroce::sim::workload::{connect, WorkloadConfig, IP_A, IP_B, MAC_A, MAC_B};
use xroce::wire::frame::frame_dest_qpn;

fn rc(pd: PdId, cq: CqId) -> QpInit {
    QpInit {
        qp_type: QpType::Rc,
        pd,
        send_cq: cq,
        recv_cq: cq,
        caps: QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            ..QpCaps::default()
        },
        sq_sig_all: false,
        srq: None,
    }
}

fn engine_a(shards: u32) -> Vec<Engine> {
    Engine::new_shards(EngineConfig::new(MAC_A, IpAddr::V4(IP_A)), shards)
}

/// Moves frames until nobody has anything to send: A's shards to B, and B's frames to the
/// A shard that owns their destination QPN. Returns how many frames B sent to each shard.
fn pump(a: &mut [Engine], b: &mut Engine) -> Vec<usize> {
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let mut to_shard = vec![0; a.len()];
    let now = Instant::ZERO;
    loop {
        let mut moved = false;
        for shard in a.iter_mut() {
            while let Some(n) = shard.poll_transmit(now, &mut buf) {
                b.handle_frame(now, &buf[..n]);
                moved = true;
            }
        }
        while let Some(n) = b.poll_transmit(now, &mut buf) {
            let qpn = frame_dest_qpn(&buf[..n]).expect("B sends RoCE");
            let s = shard_of_qpn(qpn, a.len() as u32) as usize;
            to_shard[s] += 1;
            a[s].handle_frame(now, &buf[..n]);
            moved = true;
        }
        if !moved {
            return to_shard;
        }
    }
}

fn poll_all(e: &mut Engine, cq: CqId) -> Vec<Wc> {
    let mut out = vec![Wc::EMPTY; 64];
    let n = e.poll_cq(cq, &mut out).unwrap();
    out.truncate(n);
    out
}

#[test]
fn each_shard_numbers_its_qps_in_its_own_lane() {
    let mut shards = engine_a(3);
    let pd = shards[0].alloc_pd();
    let cq = shards[0].create_cq(16).unwrap();
    let mut seen = std::collections::HashSet::new();
    for (index, shard) in shards.iter_mut().enumerate() {
        assert_eq!(shard.shard(), (index as u32, 3));
        for _ in 0..5 {
            let qpn = shard.create_qp(rc(pd, cq)).unwrap();
            assert_eq!(shard_of_qpn(qpn, 3), index as u32, "QPN {qpn:#x}");
            assert!(qpn >= 0x11, "QPN {qpn:#x} is a special QP's");
            assert!(seen.insert(qpn), "QPN {qpn:#x} given twice");
        }
    }
    // A chosen QPN must be in the shard's lane.
    let qpn = (0x100..).find(|q| shard_of_qpn(*q, 3) == 2).unwrap();
    assert!(matches!(
        shards[0].create_qp_with_qpn(rc(pd, cq), qpn),
        Err(EngineError::InvalidArgument(_))
    ));
    assert_eq!(shards[2].create_qp_with_qpn(rc(pd, cq), qpn), Ok(qpn));
    // A lone engine keeps rxe's numbering from 17.
    let mut lone = Engine::new(EngineConfig::new(MAC_B, IpAddr::V4(IP_B)));
    let pd = lone.alloc_pd();
    let cq = lone.create_cq(4).unwrap();
    assert_eq!(lone.create_qp(rc(pd, cq)), Ok(0x11));
    assert_eq!(lone.create_qp(rc(pd, cq)), Ok(0x12));
}

#[test]
fn pds_mrs_and_cqs_are_the_devices_not_a_shards() {
    let mut shards = engine_a(2);
    let pd = shards[1].alloc_pd();
    let mr = shards[0].reg_mr(pd, 4096, Access::ALL).unwrap();
    assert_eq!(shards[1].query_mr(mr.lkey), Ok(mr));
    shards[1].mr_write(mr.lkey, mr.addr + 8, b"shared").unwrap();
    assert_eq!(
        shards[0].mr_to_vec(mr.lkey, mr.addr + 8, 6).unwrap(),
        b"shared"
    );
    let cq = shards[0].create_cq(8).unwrap();
    let qpn = shards[1].create_qp(rc(pd, cq)).unwrap();
    // In use by a QP of the other shard: neither the CQ nor the PD can go.
    assert_eq!(
        shards[0].destroy_cq(cq),
        Err(EngineError::InUse("completion queue"))
    );
    shards[0].dereg_mr(mr.lkey).unwrap();
    assert_eq!(
        shards[0].dealloc_pd(pd),
        Err(EngineError::InUse("protection domain"))
    );
    assert_eq!(
        shards[1].query_mr(mr.lkey),
        Err(EngineError::UnknownKey(mr.lkey))
    );
    shards[1].destroy_qp(qpn).unwrap();
    assert_eq!(shards[0].destroy_cq(cq), Ok(()));
    assert_eq!(shards[0].dealloc_pd(pd), Ok(()));
    assert_eq!(shards[1].dealloc_pd(pd), Err(EngineError::UnknownPd(pd)));
}

/// One connection per shard of A, each QP's CQ and memory created through the other shard:
/// B's WRITEs land in the memory and its completions in the CQs whatever shard handles them,
/// and each shard receives exactly the frames of its own QP.
#[test]
fn frames_reach_the_shard_of_their_qp_and_land_in_shared_memory() {
    let mut a = engine_a(2);
    let mut b = Engine::new(EngineConfig::new(MAC_B, IpAddr::V4(IP_B)));
    let pd_a = a[0].alloc_pd();
    let pd_b = b.alloc_pd();
    let mr_b = b.reg_mr(pd_b, 1 << 16, Access::ALL).unwrap();
    let cfg = WorkloadConfig::default();
    let mut conns: Vec<(u32, u32, CqId, MrInfo, CqId)> = Vec::new();
    for s in 0..2 {
        let other = 1 - s;
        let cq_a = a[other].create_cq(64).unwrap();
        let mr_a = a[other].reg_mr(pd_a, 4096, Access::ALL).unwrap();
        let qa = a[s].create_qp(rc(pd_a, cq_a)).unwrap();
        let cq_b = b.create_cq(64).unwrap();
        let qb = b.create_qp(rc(pd_b, cq_b)).unwrap();
        connect(&mut a[s], qa, qb, MAC_B, IP_B, 100, 900, &cfg).unwrap();
        connect(&mut b, qb, qa, MAC_A, IP_A, 900, 100, &cfg).unwrap();
        conns.push((qa, qb, cq_a, mr_a, cq_b));
    }
    for (i, (_, qb, _, mr_a, _)) in conns.iter().enumerate() {
        b.mr_write(mr_b.lkey, mr_b.addr, &[0x40 + i as u8; 3000])
            .unwrap();
        b.post_send(
            *qb,
            &SendWr {
                wr_id: i as u64,
                op: WrOp::Write {
                    remote_addr: mr_a.addr,
                    rkey: mr_a.rkey,
                },
                sg_list: vec![Sge {
                    addr: mr_b.addr,
                    length: 3000,
                    lkey: mr_b.lkey,
                }],
                flags: SendFlags::SIGNALED,
                ud: None,
            },
        )
        .unwrap();
        let to_shard = pump(&mut a, &mut b);
        let s = i; // connection i's QP is on shard i
        assert!(to_shard[s] >= 3, "3 KiB at MTU 1024: {to_shard:?}");
        assert_eq!(to_shard[1 - s], 0, "frames for shard {s}: {to_shard:?}");
    }
    for (i, (_, _, _, mr_a, cq_b)) in conns.iter().enumerate() {
        let wcs = poll_all(&mut b, *cq_b);
        assert_eq!(wcs.len(), 1);
        assert_eq!((wcs[0].wr_id, wcs[0].status), (i as u64, WcStatus::Success));
        // Read through either shard: the memory is the device's.
        for shard in a.iter() {
            assert_eq!(
                shard.mr_to_vec(mr_a.lkey, mr_a.addr, 3000).unwrap(),
                vec![0x40 + i as u8; 3000]
            );
        }
    }
    assert_eq!(a[0].counters().rcvd_pkts + a[1].counters().rcvd_pkts, 6);
    assert!(a[0].counters().rcvd_pkts >= 3 && a[1].counters().rcvd_pkts >= 3);
}

/// Two threads, each driving its own shard of A against its own peer, fetch-and-add the same
/// 64-bit word of A's memory: the per-region lock makes each atomic whole, so no add is lost.
#[test]
fn atomics_from_two_shards_at_once_lose_no_add() {
    const ADDS: u64 = 2000;
    let mut a = engine_a(2);
    let pd_a = a[0].alloc_pd();
    let word = a[0].reg_mr(pd_a, 4096, Access::ALL).unwrap();
    let cfg = WorkloadConfig::default();
    let mut lanes = Vec::new();
    for (s, shard) in a.iter_mut().enumerate() {
        let mut b = Engine::new(EngineConfig::new(MAC_B, IpAddr::V4(IP_B)));
        let pd_b = b.alloc_pd();
        let mr_b = b.reg_mr(pd_b, 4096, Access::ALL).unwrap();
        let cq_b = b.create_cq(64).unwrap();
        let qb = b.create_qp(rc(pd_b, cq_b)).unwrap();
        let cq_a = shard.create_cq(64).unwrap();
        let qa = shard.create_qp(rc(pd_a, cq_a)).unwrap();
        assert_eq!(shard_of_qpn(qa, 2), s as u32);
        connect(shard, qa, qb, MAC_B, IP_B, 1, 7, &cfg).unwrap();
        connect(&mut b, qb, qa, MAC_A, IP_A, 7, 1, &cfg).unwrap();
        lanes.push((b, qb, cq_b, mr_b));
    }
    let start = Arc::new(Barrier::new(2));
    let threads: Vec<_> = a
        .into_iter()
        .zip(lanes)
        .map(|(shard, (mut b, qb, cq_b, mr_b))| {
            let start = start.clone();
            std::thread::spawn(move || {
                let mut shard = [shard];
                start.wait();
                let mut done = 0;
                for k in 0..ADDS {
                    b.post_send(
                        qb,
                        &SendWr {
                            wr_id: k,
                            op: WrOp::FetchAdd {
                                remote_addr: word.addr,
                                rkey: word.rkey,
                                add: 1,
                            },
                            sg_list: vec![Sge {
                                addr: mr_b.addr,
                                length: 8,
                                lkey: mr_b.lkey,
                            }],
                            flags: SendFlags::SIGNALED,
                            ud: None,
                        },
                    )
                    .unwrap();
                    pump(&mut shard, &mut b);
                    for wc in poll_all(&mut b, cq_b) {
                        assert_eq!(wc.status, WcStatus::Success);
                        done += 1;
                    }
                }
                let [shard] = shard;
                (done, shard)
            })
        })
        .collect();
    let mut shards = Vec::new();
    for t in threads {
        let (done, shard) = t.join().unwrap();
        assert_eq!(done, ADDS);
        shards.push(shard);
    }
    let mut value = [0u8; 8];
    shards[1].mr_read(word.lkey, word.addr, &mut value).unwrap();
    assert_eq!(u64::from_ne_bytes(value), 2 * ADDS);
}
