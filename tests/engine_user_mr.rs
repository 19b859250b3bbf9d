//! Memory regions on the application's memory at the engine level: the simulator moves
//! WRITEs, READs and SENDs straight into and out of `UserMemory` under loss; `rereg_mr`
//! keeps the key and refuses bad changes with typed errors, leaving the region as it was;
//! a region deregistered or moved to other memory never reaches its old memory again, even
//! with another shard writing at that moment.
#[path = "common/pair.rs"]
mod pair;

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use pair::{drain, Pair, PairOptions};
use xroce::dma::UserMemory;
use xroce::engine::{
    Access, Engine, EngineConfig, EngineError, MrChange, MrMemory, PdId, RecvWr, Sge, WcStatus,
    WrOp,
};
use xroce::sim::workload::{IP_A, MAC_A};
use xroce::sim::LinkConfig;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed) ^ (i >> 6) as u8)
        .collect()
}

#[test]
fn writes_reads_and_sends_move_through_user_memory_in_place_under_loss() {
    let mut p = Pair::new(PairOptions {
        link: LinkConfig {
            loss: 0.15,
            duplicate: 0.05,
            ..LinkConfig::default()
        },
        seed: 7,
        ..PairOptions::default()
    });
    let (pd_a, pd_b) = (p.mr_a.pd, p.mr_b.pd);
    let mem_a = UserMemory::zeroed(16384);
    let mem_b = UserMemory::from_vec(pattern(16384, 1));
    let ua = p.a().reg_user_mr(pd_a, mem_a.clone(), Access::ALL).unwrap();
    let ub = p.b().reg_user_mr(pd_b, mem_b.clone(), Access::ALL).unwrap();
    let sge_a = |offset: u64, length: u32| Sge {
        addr: ua.addr + offset,
        length,
        lkey: ua.lkey,
    };
    let message = pattern(5000, 2);
    mem_a.write(0, &message).unwrap();
    // WRITE A[0..5000] -> B[8000..], READ B[100..3100] -> A[6000..], SEND A[0..2000] -> B's
    // receive at B[14000..].
    let qb = p.qb;
    p.b()
        .post_recv(
            qb,
            &RecvWr {
                wr_id: 9,
                sg_list: vec![Sge {
                    addr: ub.addr + 14000,
                    length: 2384,
                    lkey: ub.lkey,
                }],
            },
        )
        .unwrap();
    p.post_a(
        1,
        WrOp::Write {
            remote_addr: ub.addr + 8000,
            rkey: ub.rkey,
        },
        vec![sge_a(0, 5000)],
    );
    p.post_a(
        2,
        WrOp::Read {
            remote_addr: ub.addr + 100,
            rkey: ub.rkey,
        },
        vec![sge_a(6000, 3000)],
    );
    p.post_a(3, WrOp::Send, vec![sge_a(0, 2000)]);
    let wcs = p.run_for_completions(3, Duration::from_secs(10));
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    let b = mem_b.to_vec();
    assert_eq!(b[8000..13000], message[..], "the WRITE in B's memory");
    assert_eq!(b[14000..16000], message[..2000], "the SEND in B's memory");
    assert_eq!(
        mem_a.to_vec()[6000..9000],
        pattern(16384, 1)[100..3100],
        "the READ in A's memory"
    );
    let cq_b = p.cq_b;
    let recv = drain(p.b(), cq_b);
    assert_eq!(recv.len(), 1);
    assert_eq!(
        (recv[0].status, recv[0].byte_len),
        (WcStatus::Success, 2000)
    );
}

#[test]
fn rereg_keeps_the_key_and_a_refused_change_leaves_the_region_as_it_was() {
    let mut e = Engine::new(EngineConfig::new(MAC_A, IpAddr::V4(IP_A)));
    let pd = e.alloc_pd();
    let pd2 = e.alloc_pd();
    let mem = UserMemory::zeroed(4096);
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let mr = e.reg_user_mr(pd, mem.clone(), rw).unwrap();
    assert_eq!(e.query_mr(mr.lkey), Ok(mr));
    let refused = [
        (MrChange::default(), "nothing"),
        (
            MrChange {
                access: Some(Access::REMOTE_WRITE),
                ..MrChange::default()
            },
            "access",
        ),
        (
            MrChange {
                pd: Some(PdId(77)),
                memory: Some(MrMemory::Device(100)),
                ..MrChange::default()
            },
            "pd",
        ),
        (
            MrChange {
                memory: Some(MrMemory::Device((1 << 30) + 1)),
                ..MrChange::default()
            },
            "size",
        ),
    ];
    for (change, what) in refused {
        let err = e.rereg_mr(mr.lkey, change).unwrap_err();
        let ok = match what {
            "nothing" | "size" => matches!(err, EngineError::InvalidArgument(_)),
            "access" => matches!(err, EngineError::InvalidMrAccess { .. }),
            _ => matches!(err, EngineError::UnknownPd(PdId(77))),
        };
        assert!(ok, "{what}: {err}");
        assert_eq!(e.query_mr(mr.lkey), Ok(mr), "{what} changed the region");
        assert!(e.mr_user_memory(mr.lkey).unwrap().same_memory(&mem));
    }
    assert_eq!(
        e.rereg_mr(0x00de_ad00, MrChange::default()),
        Err(EngineError::UnknownKey(0x00de_ad00))
    );

    // PD and access: same key, same address, same bytes.
    e.mr_write(mr.lkey, mr.addr + 8, b"kept").unwrap();
    let moved = e
        .rereg_mr(
            mr.lkey,
            MrChange {
                pd: Some(pd2),
                access: Some(Access::REMOTE_READ),
                ..MrChange::default()
            },
        )
        .unwrap();
    assert_eq!(
        (moved.lkey, moved.rkey, moved.addr),
        (mr.lkey, mr.rkey, mr.addr)
    );
    assert_eq!((moved.pd, moved.access), (pd2, Access::REMOTE_READ));
    assert_eq!(e.query_mr(mr.lkey), Ok(moved));
    assert_eq!(e.mr_to_vec(mr.lkey, mr.addr + 8, 4).unwrap(), b"kept");
    assert!(matches!(e.dealloc_pd(pd2), Err(EngineError::InUse(_))));
    e.dealloc_pd(pd).expect("the PD the region left is free");

    // Memory: a new address, the old one out of bounds, the old memory left alone.
    let mem2 = UserMemory::zeroed(100);
    let translated = e
        .rereg_mr(
            mr.lkey,
            MrChange {
                memory: Some(MrMemory::User(mem2.clone())),
                ..MrChange::default()
            },
        )
        .unwrap();
    assert_eq!((translated.lkey, translated.length), (mr.lkey, 100));
    assert_ne!(translated.addr, mr.addr);
    e.mr_write(mr.lkey, translated.addr, b"new").unwrap();
    assert_eq!(&mem2.to_vec()[..3], b"new");
    assert!(matches!(
        e.mr_write(mr.lkey, mr.addr + 200, b"old"),
        Err(EngineError::OutOfBounds { .. })
    ));
    let mut expect = vec![0u8; 4096];
    expect[8..12].copy_from_slice(b"kept");
    assert_eq!(mem.to_vec(), expect, "the old memory");
    e.dereg_mr(mr.lkey).unwrap();
    assert!(e.mr_user_memory(mr.lkey).is_none());
    assert_eq!(
        e.mr_write(mr.lkey, translated.addr, b"x"),
        Err(EngineError::UnknownKey(mr.lkey))
    );
}

#[test]
fn shards_share_user_memory_regions() {
    let mut shards = Engine::new_shards(EngineConfig::new(MAC_A, IpAddr::V4(IP_A)), 2);
    let pd = shards[0].alloc_pd();
    let mem = UserMemory::zeroed(64);
    let mr = shards[0]
        .reg_user_mr(pd, mem.clone(), Access::LOCAL_WRITE)
        .unwrap();
    shards[1]
        .mr_write(mr.lkey, mr.addr, b"from shard 1")
        .unwrap();
    assert_eq!(&mem.to_vec()[..12], b"from shard 1");
    let info = shards[1]
        .rereg_mr(
            mr.lkey,
            MrChange {
                memory: Some(MrMemory::Device(32)),
                ..MrChange::default()
            },
        )
        .unwrap();
    assert_eq!(shards[0].query_mr(mr.lkey), Ok(info));
    assert!(shards[0].mr_user_memory(mr.lkey).is_none());
}

/// One shard keeps writing the region while another deregisters it: once `dereg_mr`
/// returns, the memory does not change again, even for a write that found the region
/// before.
#[test]
fn no_write_reaches_user_memory_once_dereg_returns() {
    for round in 0..20u8 {
        let mut shards = Engine::new_shards(EngineConfig::new(MAC_A, IpAddr::V4(IP_A)), 2);
        let pd = shards[0].alloc_pd();
        let mem = UserMemory::zeroed(4096);
        let mr = shards[0]
            .reg_user_mr(pd, mem.clone(), Access::LOCAL_WRITE)
            .unwrap();
        let (first, second) = shards.split_at_mut(1);
        let (owner, writer) = (&mut first[0], &mut second[0]);
        let started = AtomicBool::new(false);
        let snapshot = std::thread::scope(|s| {
            let writing = s.spawn(|| {
                let mut n = 0u8;
                loop {
                    n = n.wrapping_add(1).max(1);
                    if writer.mr_write(mr.lkey, mr.addr, &[n; 4096]).is_err() {
                        return;
                    }
                    started.store(true, Ordering::Release);
                }
            });
            while !started.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            owner.dereg_mr(mr.lkey).unwrap();
            let snapshot = mem.to_vec();
            writing.join().unwrap();
            snapshot
        });
        assert!(
            snapshot.iter().all(|&b| b != 0),
            "round {round}: written before"
        );
        assert!(
            mem.to_vec() == snapshot,
            "round {round}: a write landed after deregistration"
        );
    }
}
