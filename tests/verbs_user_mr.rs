//! Memory regions over the application's own memory (issue 13 item 1), through the verbs
//! API over the in-memory pair: the transport reads and writes the caller's buffer in place
//! (no `Mr::write`/`Mr::read` copy in between), re-registration (`ibv_rereg_mr`: memory,
//! PD, access) keeps the keys, the access rules are typed errors, and every refused access
//! leaves the memory as it was, byte for byte.
use std::time::{Duration, Instant};

use xroce::engine::EngineError;
use xroce::verbs::*;

const WAIT: Duration = Duration::from_secs(20);
const LW: Access = Access::LOCAL_WRITE;
const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

/// One device's objects (QPs are made per test case: a refused access ends a connection).
struct End {
    dev: Device,
    pd: Pd,
    cq: Cq,
}

fn ends() -> (End, End, MemLink) {
    let (da, db, link) =
        Device::mem_pair(&mem_link_config(1500, 0.0, 1), DeviceConfig::default()).unwrap();
    let end = |dev: Device| End {
        pd: dev.alloc_pd().unwrap(),
        cq: dev.create_cq(256, None).unwrap(),
        dev,
    };
    (end(da), end(db), link)
}

/// A fresh connected pair of RC QPs, A's in `pd_a`, B's in `pd_b`.
fn connect(a: &End, pd_a: &Pd, b: &End, pd_b: &Pd) -> (Qp, Qp) {
    let qa = pd_a.create_qp(&QpInitAttr::rc(&a.cq, &a.cq)).unwrap();
    let qb = pd_b.create_qp(&QpInitAttr::rc(&b.cq, &b.cq)).unwrap();
    for (qp, from, to, peer) in [(&qa, a, b, &qb), (&qb, b, a, &qa)] {
        let sgid = from.dev.ipv4_gid_index().unwrap();
        let gid = to.dev.query_gid(to.dev.ipv4_gid_index().unwrap()).unwrap();
        qp.connect_rc(
            &RcPeer {
                qpn: peer.qp_num(),
                psn: 0,
                gid,
            },
            &RcOptions {
                sgid_index: sgid as u8,
                retry_cnt: 1,
                ..RcOptions::default()
            },
        )
        .unwrap();
    }
    (qa, qb)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 7) as u8)
        .collect()
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

fn one(cq: &Cq) -> Wc {
    let wcs = cq.wait(1, WAIT).unwrap();
    assert_eq!(wcs.len(), 1, "no completion within {WAIT:?}");
    wcs[0]
}

fn write(remote: &Mr, offset: usize) -> WrOp {
    WrOp::Write {
        remote_addr: remote.addr() + offset as u64,
        rkey: remote.rkey(),
    }
}

#[test]
fn a_remote_write_lands_in_the_callers_buffer_in_place() {
    let (a, b, _link) = ends();
    let buf = vec![0xEEu8; 8192];
    let at = buf.as_ptr();
    let mem = UserMemory::from_vec(buf);
    assert_eq!(mem.as_ptr(), at, "the Vec's bytes were not moved");
    let mr_b = b.pd.reg_user_mr(mem.clone(), RW).unwrap();
    assert!(mr_b.user_memory().unwrap().same_memory(&mem));
    let data = pattern(3000, 1); // three packets at MTU 1024
    let mr_a = a.pd.reg_mr_with(&data, LW).unwrap();
    let (qa, _qb) = connect(&a, &a.pd, &b, &b.pd);
    qa.post_send(&wr(1, write(&mr_b, 100), vec![mr_a.sge(0, 3000).unwrap()]))
        .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    // The caller looks at its own bytes: no copy out of the device.
    mem.with_bytes(|bytes| {
        assert_eq!(&bytes[100..3100], &data[..], "the WRITE's bytes");
        assert!(bytes[..100].iter().all(|&x| x == 0xEE), "before it");
        assert!(bytes[3100..].iter().all(|&x| x == 0xEE), "after it");
    });
    assert_eq!(mem.as_ptr(), at);
    // Both views are the same bytes.
    assert_eq!(mr_b.to_vec(100, 3000).unwrap(), data);
}

#[test]
fn a_send_takes_the_callers_bytes_and_a_receive_lands_in_place() {
    let (a, b, _link) = ends();
    let mem_a = UserMemory::zeroed(4096);
    let mem_b = UserMemory::zeroed(4096);
    let mr_a = a.pd.reg_user_mr(mem_a.clone(), LW).unwrap();
    let mr_b = b.pd.reg_user_mr(mem_b.clone(), LW).unwrap();
    let (qa, qb) = connect(&a, &a.pd, &b, &b.pd);
    for (round, len) in [(0u8, 2500usize), (1, 700)] {
        // The caller writes its own buffer and posts: nothing is copied into the device.
        let message = pattern(len, 10 + round);
        mem_a.with_bytes(|bytes| bytes[..len].copy_from_slice(&message));
        qb.post_recv(&RecvWr {
            wr_id: 10 + round as u64,
            sg_list: vec![mr_b.sge(1000, 3000).unwrap()],
        })
        .unwrap();
        qa.post_send(&wr(
            round as u64,
            WrOp::Send,
            vec![mr_a.sge(0, len as u32).unwrap()],
        ))
        .unwrap();
        assert_eq!(one(&a.cq).status, WcStatus::Success);
        let wc = one(&b.cq);
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, len as u32));
        let got = mem_b.with_bytes(|bytes| bytes[1000..1000 + len].to_vec());
        assert_eq!(got, message, "round {round}: the receive buffer in place");
    }
}

#[test]
fn read_and_atomics_work_on_user_memory_both_ends() {
    let (a, b, _link) = ends();
    let mem_a = UserMemory::zeroed(4096);
    let mem_b = UserMemory::from_vec(pattern(4096, 3));
    let mr_a = a.pd.reg_user_mr(mem_a.clone(), LW).unwrap();
    let all = RW | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mr_b = b.pd.reg_user_mr(mem_b.clone(), all).unwrap();
    let (qa, _qb) = connect(&a, &a.pd, &b, &b.pd);
    qa.post_send(&wr(
        1,
        WrOp::Read {
            remote_addr: mr_b.addr() + 8,
            rkey: mr_b.rkey(),
        },
        vec![mr_a.sge(0, 2100).unwrap()],
    ))
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert_eq!(mem_a.to_vec()[..2100], pattern(4096, 3)[8..2108]);
    mem_b.write(4000, &40u64.to_ne_bytes()).unwrap();
    qa.post_send(&wr(
        2,
        WrOp::FetchAdd {
            remote_addr: mr_b.addr() + 4000,
            rkey: mr_b.rkey(),
            add: 2,
        },
        vec![mr_a.sge(3000, 8).unwrap()],
    ))
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    let mut word = [0u8; 8];
    mem_b.read(4000, &mut word).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 42, "the sum in B's memory");
    mem_a.read(3000, &mut word).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 40, "the original in A's memory");
    qa.post_send(&wr(
        3,
        WrOp::CompareSwap {
            remote_addr: mr_b.addr() + 4000,
            rkey: mr_b.rkey(),
            compare: 42,
            swap: 7,
        },
        vec![mr_a.sge(3008, 8).unwrap()],
    ))
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    mem_b.read(4000, &mut word).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 7, "swapped in B's memory");
}

#[test]
fn two_regions_over_one_buffer_see_each_others_bytes() {
    let (a, b, _link) = ends();
    let mem = UserMemory::zeroed(8192);
    let low = b.pd.reg_user_mr(mem.slice(0, 6144).unwrap(), RW).unwrap();
    let high =
        b.pd.reg_user_mr(mem.slice(4096, 4096).unwrap(), RW)
            .unwrap();
    assert_ne!(
        low.addr(),
        high.addr(),
        "each region has its own iova range"
    );
    let data = pattern(1500, 4);
    let mr_a = a.pd.reg_mr_with(&data, LW).unwrap();
    let (qa, _qb) = connect(&a, &a.pd, &b, &b.pd);
    // Through `low` at 4500 = `high` at 404 = the buffer at 4500.
    qa.post_send(&wr(1, write(&low, 4500), vec![mr_a.sge(0, 1500).unwrap()]))
        .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert_eq!(high.to_vec(404, 1500).unwrap(), data);
    assert_eq!(mem.to_vec()[4500..6000], data[..]);
}

/// A refused remote access (each on a fresh connection: the error ends it) leaves the user
/// memory exactly as it was.
#[test]
fn every_refused_access_leaves_user_memory_untouched() {
    let (a, b, _link) = ends();
    let other_pd = b.dev.alloc_pd().unwrap();
    let source = pattern(2048, 5);
    let mr_a = a.pd.reg_mr_with(&source, LW).unwrap();
    let mem = UserMemory::from_vec(pattern(8192, 6));
    let read_only =
        b.pd.reg_user_mr(mem.slice(0, 4096).unwrap(), LW | Access::REMOTE_READ)
            .unwrap();
    let writable =
        b.pd.reg_user_mr(mem.slice(4096, 4096).unwrap(), RW)
            .unwrap();
    let elsewhere = other_pd
        .reg_user_mr(mem.slice(0, 8192).unwrap(), RW | Access::REMOTE_ATOMIC)
        .unwrap();
    let before = mem.to_vec();
    let gone = {
        let mr = b.pd.reg_user_mr(mem.slice(0, 8192).unwrap(), RW).unwrap();
        (mr.addr(), mr.rkey())
    };
    let cases: Vec<(&str, WrOp, u32)> = vec![
        ("no REMOTE_WRITE right", write(&read_only, 0), 100),
        (
            "crosses the end of the region",
            write(&writable, 4096 - 1000),
            1001,
        ),
        (
            "starts before the region",
            WrOp::Write {
                remote_addr: writable.addr() - 1,
                rkey: writable.rkey(),
            },
            10,
        ),
        (
            "another key",
            WrOp::Write {
                remote_addr: writable.addr(),
                rkey: writable.rkey() ^ 0x8000_0000,
            },
            10,
        ),
        ("a region of another PD", write(&elsewhere, 0), 100),
        (
            "an atomic without REMOTE_ATOMIC",
            WrOp::FetchAdd {
                remote_addr: writable.addr(),
                rkey: writable.rkey(),
                add: 1,
            },
            8,
        ),
        (
            "a deregistered region's key",
            WrOp::Write {
                remote_addr: gone.0,
                rkey: gone.1,
            },
            100,
        ),
    ];
    for (what, op, len) in cases {
        let (qa, _qb) = connect(&a, &a.pd, &b, &b.pd);
        qa.post_send(&wr(1, op, vec![mr_a.sge(0, len).unwrap()]))
            .unwrap();
        let wc = one(&a.cq);
        assert_eq!(wc.status, WcStatus::RemAccessErr, "{what}");
        assert!(mem.to_vec() == before, "{what}: the memory changed");
    }
    // A READ from a region without REMOTE_READ leaves the reader's user memory alone too.
    let mem_a = UserMemory::from_vec(pattern(4096, 7));
    let dest = a.pd.reg_user_mr(mem_a.clone(), LW).unwrap();
    let (qa, _qb) = connect(&a, &a.pd, &b, &b.pd);
    qa.post_send(&wr(
        2,
        WrOp::Read {
            remote_addr: writable.addr(),
            rkey: writable.rkey(),
        },
        vec![dest.sge(0, 2000).unwrap()],
    ))
    .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::RemAccessErr);
    assert_eq!(mem_a.to_vec(), pattern(4096, 7), "the READ's destination");
    assert!(mem.to_vec() == before);
}

#[test]
fn rereg_changes_access_pd_and_memory_and_keeps_the_keys() {
    let (a, b, _link) = ends();
    let data = pattern(1200, 8);
    let mr_a = a.pd.reg_mr_with(&data, LW).unwrap();
    let mem = UserMemory::from_vec(pattern(4096, 9));
    let mr = b.pd.reg_user_mr(mem.clone(), LW).unwrap();
    let (lkey, rkey, addr) = (mr.lkey(), mr.rkey(), mr.addr());
    let try_write = |mr: &Mr, expect: WcStatus| {
        let (qa, _qb) = connect(&a, &a.pd, &b, &b.pd);
        qa.post_send(&wr(1, write(mr, 64), vec![mr_a.sge(0, 1200).unwrap()]))
            .unwrap();
        assert_eq!(one(&a.cq).status, expect);
    };

    // IBV_REREG_MR_CHANGE_ACCESS: refused, then allowed, then refused again.
    try_write(&mr, WcStatus::RemAccessErr);
    assert_eq!(mem.to_vec(), pattern(4096, 9));
    mr.rereg(&MrRereg {
        access: Some(RW),
        ..MrRereg::default()
    })
    .unwrap();
    assert_eq!(
        (mr.lkey(), mr.rkey(), mr.addr(), mr.access()),
        (lkey, rkey, addr, RW)
    );
    try_write(&mr, WcStatus::Success);
    assert_eq!(mem.to_vec()[64..1264], data[..]);
    mr.rereg(&MrRereg {
        access: Some(LW | Access::REMOTE_READ),
        ..MrRereg::default()
    })
    .unwrap();
    mem.write(64, &[0; 1200]).unwrap();
    try_write(&mr, WcStatus::RemAccessErr);
    assert_eq!(
        &mem.to_vec()[64..1264],
        &[0; 1200][..],
        "write refused after rereg"
    );

    // IBV_REREG_MR_CHANGE_PD: in another PD than the QP the write is refused; moved back, it
    // lands.
    mr.rereg(&MrRereg {
        access: Some(RW),
        ..MrRereg::default()
    })
    .unwrap();
    {
        let other = b.dev.alloc_pd().unwrap();
        mr.rereg(&MrRereg {
            pd: Some(&other),
            ..MrRereg::default()
        })
        .unwrap();
        assert_eq!(mr.pd(), other.id());
        try_write(&mr, WcStatus::RemAccessErr);
        assert_eq!(&mem.to_vec()[64..1264], &[0; 1200][..], "wrong PD");
        mr.rereg(&MrRereg {
            pd: Some(&b.pd),
            ..MrRereg::default()
        })
        .unwrap();
    }
    assert_eq!(mr.pd(), b.pd.id());
    try_write(&mr, WcStatus::Success);
    assert_eq!(mem.to_vec()[64..1264], data[..]);

    // IBV_REREG_MR_CHANGE_TRANSLATION: other user memory at a new address, same keys.
    let old_addr = mr.addr();
    let mem2 = UserMemory::zeroed(2048);
    mr.rereg(&MrRereg {
        memory: Some(MrMemory::User(mem2.clone())),
        ..MrRereg::default()
    })
    .unwrap();
    assert_eq!((mr.lkey(), mr.rkey(), mr.len()), (lkey, rkey, 2048));
    assert_ne!(mr.addr(), old_addr, "new memory, new iova");
    assert!(mr.user_memory().unwrap().same_memory(&mem2));
    let old_bytes = mem.to_vec();
    {
        // The old address is outside the region now.
        let (qa, _qb) = connect(&a, &a.pd, &b, &b.pd);
        qa.post_send(&wr(
            1,
            WrOp::Write {
                remote_addr: old_addr + 64,
                rkey,
            },
            vec![mr_a.sge(0, 1200).unwrap()],
        ))
        .unwrap();
        assert_eq!(one(&a.cq).status, WcStatus::RemAccessErr);
    }
    try_write(&mr, WcStatus::Success);
    assert_eq!(mem2.to_vec()[64..1264], data[..]);
    assert_eq!(
        mem.to_vec(),
        old_bytes,
        "the old memory is not reached any more"
    );
    // And to the device's own bytes: the user memory is left alone from then on.
    mr.rereg(&MrRereg {
        memory: Some(MrMemory::Device(4096)),
        ..MrRereg::default()
    })
    .unwrap();
    assert!(mr.user_memory().is_none());
    assert_eq!(
        mr.to_vec(0, 4096).unwrap(),
        vec![0; 4096],
        "fresh zeroed bytes"
    );
    let mem2_bytes = mem2.to_vec();
    try_write(&mr, WcStatus::Success);
    assert_eq!(mr.to_vec(64, 1200).unwrap(), data);
    assert_eq!(mem2.to_vec(), mem2_bytes);
}

#[test]
fn refused_rereg_is_a_typed_error_and_changes_nothing() {
    let (a, b, _link) = ends();
    let mem = UserMemory::zeroed(4096);
    let mr = b.pd.reg_user_mr(mem.clone(), RW).unwrap();
    let before = format!("{mr:?} {:?} {:?}", mr.access(), mr.pd());
    let refusals = [
        ("nothing to change", MrRereg::default(), "invalid argument"),
        (
            "remote write without local write",
            MrRereg {
                access: Some(Access::REMOTE_WRITE),
                ..MrRereg::default()
            },
            "access",
        ),
        (
            "remote atomic without local write",
            MrRereg {
                access: Some(Access::REMOTE_ATOMIC | Access::REMOTE_READ),
                memory: Some(MrMemory::Device(64)),
                ..MrRereg::default()
            },
            "access",
        ),
        (
            "a PD of another device",
            MrRereg {
                pd: Some(&a.pd),
                ..MrRereg::default()
            },
            "device",
        ),
        (
            "empty memory",
            MrRereg {
                memory: Some(MrMemory::User(UserMemory::zeroed(0))),
                ..MrRereg::default()
            },
            "zero",
        ),
        (
            "memory over max_mr_size",
            MrRereg {
                memory: Some(MrMemory::Device((1 << 30) + 1)),
                ..MrRereg::default()
            },
            "limit",
        ),
    ];
    let kind = |e: &VerbsError| match e {
        VerbsError::Engine(EngineError::InvalidArgument(_)) => "invalid argument",
        VerbsError::Engine(EngineError::InvalidMrAccess { .. }) => "access",
        VerbsError::WrongDevice { .. } => "device",
        VerbsError::Zero { .. } => "zero",
        VerbsError::LimitExceeded { .. } => "limit",
        _ => "other",
    };
    for (what, change, expected) in refusals {
        let err = mr.rereg(&change).unwrap_err();
        assert_eq!(kind(&err), expected, "{what}: {err}");
        let now = format!("{mr:?} {:?} {:?}", mr.access(), mr.pd());
        assert_eq!(now, before, "{what} changed the region");
    }
    // The region still works as registered.
    let data = pattern(500, 11);
    let mr_a = a.pd.reg_mr_with(&data, LW).unwrap();
    let (qa, _qb) = connect(&a, &a.pd, &b, &b.pd);
    qa.post_send(&wr(1, write(&mr, 0), vec![mr_a.sge(0, 500).unwrap()]))
        .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert_eq!(mem.to_vec()[..500], data[..]);
}

#[test]
fn access_rules_at_registration_are_typed_errors() {
    let (a, _b, _link) = ends();
    for access in [
        Access::REMOTE_WRITE,
        Access::REMOTE_ATOMIC,
        Access::REMOTE_WRITE | Access::REMOTE_READ,
        Access::REMOTE_ATOMIC | Access::REMOTE_READ | Access::REMOTE_WRITE,
    ] {
        for err in [
            a.pd.reg_mr(64, access).unwrap_err(),
            a.pd.reg_user_mr(UserMemory::zeroed(64), access)
                .unwrap_err(),
        ] {
            match &err {
                VerbsError::Engine(EngineError::InvalidMrAccess { access: got, .. }) => {
                    assert_eq!(*got, access)
                }
                other => panic!("{access:?}: {other}"),
            }
            assert!(err.to_string().contains("LOCAL_WRITE"), "{err}");
        }
    }
    for access in [
        Access::NONE,
        Access::REMOTE_READ,
        LW,
        RW,
        Access::ALL,
        LW | Access::REMOTE_ATOMIC,
    ] {
        a.pd.reg_mr(64, access).unwrap();
        a.pd.reg_user_mr(UserMemory::zeroed(64), access).unwrap();
    }
    assert!(matches!(
        a.pd.reg_user_mr(UserMemory::zeroed(0), LW),
        Err(VerbsError::Zero { .. })
    ));
}

/// Dropping the region while a peer keeps writing into it: once the drop returns, not one
/// more byte of the memory changes, whatever was in flight.
#[test]
fn no_write_lands_once_deregistration_returns() {
    let (a, b, _link) = ends();
    let source = pattern(4096, 12);
    let mr_a = a.pd.reg_mr_with(&source, LW).unwrap();
    let mem = UserMemory::zeroed(1 << 16);
    let mr = b.pd.reg_user_mr(mem.clone(), RW).unwrap();
    let (qa, _qb) = connect(&a, &a.pd, &b, &b.pd);
    let (addr, rkey) = (mr.addr(), mr.rkey());
    // Start writing, and deregister once the first writes have landed.
    let mut posted = 0u64;
    for i in 0..64u64 {
        let op = WrOp::Write {
            remote_addr: addr + (i % 16) * 4096,
            rkey,
        };
        qa.post_send(&wr(i, op, vec![mr_a.sge(0, 4096).unwrap()]))
            .unwrap();
        posted += 1;
    }
    let deadline = Instant::now() + WAIT;
    while mem.with_bytes(|b| b[..4096] != source[..]) {
        assert!(Instant::now() < deadline, "the first WRITE never landed");
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(mr);
    let after_dereg = mem.to_vec();
    let mut done = 0;
    let mut refused = 0;
    while done < posted {
        let wc = one(&a.cq);
        done += 1;
        if wc.status != WcStatus::Success {
            refused += 1;
        }
    }
    assert!(
        mem.to_vec() == after_dereg,
        "memory changed after deregistration"
    );
    // The connection ends at the first refused WRITE, or all had landed before the drop.
    if refused == 0 {
        assert!(after_dereg.chunks(4096).all(|c| c == &source[..]));
    }
}

#[test]
fn user_memory_handles_cross_threads() {
    fn check<T: Send + Sync>() {}
    check::<UserMemory>();
    check::<MrRereg<'static>>();
    // A region re-registered on one thread is seen re-registered on another.
    let (_a, b, _link) = ends();
    let mr = b.pd.reg_user_mr(UserMemory::zeroed(64), LW).unwrap();
    let other = mr.clone();
    std::thread::spawn(move || {
        other
            .rereg(&MrRereg {
                memory: Some(MrMemory::User(UserMemory::zeroed(128))),
                access: Some(RW),
                ..MrRereg::default()
            })
            .unwrap()
    })
    .join()
    .unwrap();
    assert_eq!((mr.len(), mr.access()), (128, RW));
    assert_eq!(mr.user_memory().unwrap().len(), 128);
}

/// A receive posted on a region that then moves to another PD (`ibv_rereg_mr` with
/// `IBV_REREG_MR_CHANGE_PD`) is refused when the message arrives, not when it was posted:
/// the receive completes with a local protection error, the sender gets a remote operational
/// error (IBTA 9.9.3.1, a malformed receive WQE), and the buffer is untouched. Posted again
/// on the region moved back, the message lands. (rdma-core's test_mr_rereg_pd.)
#[test]
fn a_receive_on_a_region_moved_to_another_pd_fails_when_used() {
    let (a, b, _link) = ends();
    let mem_a = UserMemory::from_vec(pattern(4096, 3));
    let mem_b = UserMemory::zeroed(4096);
    let mr_a = a.pd.reg_user_mr(mem_a.clone(), LW).unwrap();
    let mr_b = b.pd.reg_user_mr(mem_b.clone(), LW).unwrap();
    let other_pd = b.dev.alloc_pd().unwrap();
    mr_b.rereg(&MrRereg {
        pd: Some(&other_pd),
        ..MrRereg::default()
    })
    .unwrap();
    let (qa, qb) = connect(&a, &a.pd, &b, &b.pd);
    // Accepted: the PD is checked when the buffer is written.
    qb.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: vec![mr_b.sge(0, 4096).unwrap()],
    })
    .unwrap();
    qa.post_send(&wr(2, WrOp::Send, vec![mr_a.sge(0, 1000).unwrap()]))
        .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::RemOpErr);
    let wc = one(&b.cq);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::LocProtErr));
    assert_eq!(mem_b.to_vec(), vec![0; 4096], "nothing written");
    // Back in the QP's PD, on fresh QPs, the same message lands.
    mr_b.rereg(&MrRereg {
        pd: Some(&b.pd),
        ..MrRereg::default()
    })
    .unwrap();
    let (qa, qb) = connect(&a, &a.pd, &b, &b.pd);
    qb.post_recv(&RecvWr {
        wr_id: 3,
        sg_list: vec![mr_b.sge(0, 4096).unwrap()],
    })
    .unwrap();
    qa.post_send(&wr(4, WrOp::Send, vec![mr_a.sge(0, 1000).unwrap()]))
        .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    loop {
        // The first QP pair's flushes may still be in B's CQ.
        let wc = one(&b.cq);
        if wc.wr_id == 3 {
            assert_eq!(wc.status, WcStatus::Success);
            break;
        }
    }
    assert_eq!(mem_b.to_vec()[..1000], pattern(4096, 3)[..1000]);
}
