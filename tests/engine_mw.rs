//! Memory windows (IBTA 10.6.7) in the simulator: type 1 windows bound by the bind verb,
//! type 2 windows bound by a BIND_MW work request, LOCAL_INV, SEND_WITH_INV from the peer,
//! and every remote access a window refuses NAKed with a remote access error while the
//! memory stays untouched byte for byte; then bind and invalidate racing WRITEs in flight
//! under loss. B owns the memory and the windows, A is the remote peer.
//!
//! Run with `--nocapture --test-threads 1` to see the trace docs/transport.md shows.
#[path = "common/pair.rs"]
mod pair;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use pair::{drain, Pair, PairOptions};
use xroce::engine::*;
use xroce::sim::workload::{connect, WorkloadConfig, IP_A, IP_B, MAC_A, MAC_B};
use xroce::sim::LinkConfig;

const SEC: Duration = Duration::from_secs(1);
/// Where B's windows start in its memory (so bytes before them exist to stay untouched).
const WIN_OFF: u64 = 4096;
const WIN_LEN: u64 = 8192;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) | 1)
        .collect()
}

fn sge_a(p: &Pair, offset: u64, len: u32) -> Vec<Sge> {
    vec![p.sge_a(offset, len)]
}

fn write_a(p: &mut Pair, offset: u64, data: &[u8]) {
    let (lkey, addr) = (p.mr_a.lkey, p.mr_a.addr);
    p.a().mr_write(lkey, addr + offset, data).unwrap();
}

/// All of B's memory.
fn memory_b(p: &mut Pair) -> Vec<u8> {
    let (lkey, addr, len) = (p.mr_b.lkey, p.mr_b.addr, p.mr_b.length);
    p.b().mr_to_vec(lkey, addr, len).unwrap()
}

fn fill_b(p: &mut Pair, seed: u8) {
    let (lkey, addr, len) = (p.mr_b.lkey, p.mr_b.addr, p.mr_b.length);
    p.b().mr_write(lkey, addr, &pattern(len, seed)).unwrap();
}

fn window_range() -> (u64, u64) {
    (WIN_OFF, WIN_LEN)
}

/// The bind of `[WIN_OFF, +WIN_LEN)` of B's memory with `access`.
fn bind_info(p: &Pair, access: Access) -> MwBindInfo {
    let (off, len) = window_range();
    MwBindInfo {
        mr_lkey: p.mr_b.lkey,
        addr: p.mr_b.addr + off,
        length: len,
        access,
    }
}

/// Post a signaled local operation on B's QP and run until it completes.
fn local_op_b(p: &mut Pair, wr_id: u64, op: WrOp) -> Wc {
    let qb = p.qb;
    p.b()
        .post_send(
            qb,
            &SendWr {
                wr_id,
                op,
                sg_list: vec![],
                flags: SendFlags::SIGNALED,
                ud: None,
            },
        )
        .expect("post local op");
    run_b(p, 1).pop().expect("a completion on B")
}

/// Run until B's CQ holds `n` completions (or the network is idle) and take them.
fn run_b(p: &mut Pair, n: usize) -> Vec<Wc> {
    let cq = p.cq_b;
    let deadline = p.net.now() + SEC;
    p.net
        .run_until(deadline, |net| net.engines[1].cq_len(cq).unwrap_or(0) >= n);
    drain(p.b(), cq)
}

/// A type 2 window of B bound (by a BIND_MW WR on B's QP) over the window range.
fn type2_window(p: &mut Pair, access: Access) -> (MwId, u32) {
    let pd = p.mr_b.pd;
    let mw = p.b().alloc_mw(pd, MwType::Type2).unwrap();
    assert_eq!(mw.bound, None, "a type 2 window starts free");
    let rkey = inc_rkey(mw.rkey);
    let bind = bind_info(p, access);
    let wc = local_op_b(
        p,
        7,
        WrOp::BindMw {
            mw: mw.id,
            rkey,
            bind,
        },
    );
    assert_eq!(
        (wc.status, wc.opcode, wc.wr_id),
        (WcStatus::Success, WcOpcode::BindMw, 7)
    );
    let now = p.b().query_mw(mw.id).unwrap();
    assert_eq!(now.rkey, rkey);
    assert_eq!(now.bound, Some(bind));
    assert_eq!(now.bound_qp, Some(p.qb));
    (mw.id, rkey)
}

/// One signaled WR from A, run to its completion.
fn one_a(p: &mut Pair, wr_id: u64, op: WrOp, sges: Vec<Sge>) -> Wc {
    p.post_a(wr_id, op, sges);
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    wcs[0]
}

/// A's WRITE of `len` bytes (from A's offset 0) to B's `va` through `rkey`.
fn write_through(p: &mut Pair, rkey: u32, va: u64, len: u32) -> Wc {
    write_a(p, 0, &pattern(len as usize, 0x40));
    let sges = sge_a(p, 0, len);
    one_a(
        p,
        1,
        WrOp::Write {
            remote_addr: va,
            rkey,
        },
        sges,
    )
}

/// The refusal every test ends with: A's WR completes with a remote access error, both QPs
/// are in ERR, and not one byte of B's memory changed.
fn assert_refused_untouched(p: &mut Pair, wc: Wc, before: &[u8]) {
    assert_eq!(wc.status, WcStatus::RemAccessErr, "{wc:?}");
    let (qa, qb) = (p.qa, p.qb);
    assert_eq!(p.a().query_qp(qa).unwrap().0.cur_qp_state, QpState::Err);
    assert_eq!(p.b().query_qp(qb).unwrap().0.cur_qp_state, QpState::Err);
    let after = memory_b(p);
    assert!(after == before, "B's memory changed under a refused access");
}

#[test]
fn type2_window_serves_its_range_and_rights_only() {
    let mut p = Pair::new(PairOptions::default());
    let (_mw, rkey) = type2_window(&mut p, Access::REMOTE_WRITE | Access::REMOTE_READ);
    let base = p.mr_b.addr + WIN_OFF;
    // A multi-packet WRITE filling the window, then a READ of it back.
    let wc = write_through(&mut p, rkey, base, WIN_LEN as u32);
    assert_eq!(wc.status, WcStatus::Success);
    let mem = memory_b(&mut p);
    let (s, e) = (WIN_OFF as usize, (WIN_OFF + WIN_LEN) as usize);
    assert_eq!(&mem[s..e], &pattern(WIN_LEN as usize, 0x40)[..]);
    assert!(mem[..s].iter().chain(&mem[e..]).all(|&b| b == 0));
    let sges = sge_a(&p, 65536, WIN_LEN as u32);
    let wc = one_a(
        &mut p,
        2,
        WrOp::Read {
            remote_addr: base,
            rkey,
        },
        sges,
    );
    assert_eq!(wc.status, WcStatus::Success);
    let (lkey, addr) = (p.mr_a.lkey, p.mr_a.addr);
    let back = p
        .a()
        .mr_to_vec(lkey, addr + 65536, WIN_LEN as usize)
        .unwrap();
    assert_eq!(back, pattern(WIN_LEN as usize, 0x40));
    // One byte past the window (inside the MR, which the MR's own key would allow).
    let before = memory_b(&mut p);
    let wc = write_through(&mut p, rkey, base + 1, WIN_LEN as u32);
    assert_refused_untouched(&mut p, wc, &before);
}

#[test]
fn a_window_grants_only_the_rights_it_was_bound_with() {
    for (access, op_is_atomic) in [(Access::REMOTE_READ, false), (Access::REMOTE_WRITE, true)] {
        let mut p = Pair::new(PairOptions::default());
        fill_b(&mut p, 3);
        let (_mw, rkey) = type2_window(&mut p, access);
        let before = memory_b(&mut p);
        let va = p.mr_b.addr + WIN_OFF;
        let wc = if op_is_atomic {
            let sges = sge_a(&p, 0, 8);
            one_a(
                &mut p,
                3,
                WrOp::FetchAdd {
                    remote_addr: va,
                    rkey,
                    add: 1,
                },
                sges,
            )
        } else {
            write_through(&mut p, rkey, va, 64)
        };
        assert_refused_untouched(&mut p, wc, &before);
    }
}

#[test]
fn send_with_inv_frees_a_type2_window_and_later_access_is_nakked() {
    let mut p = Pair::new(PairOptions::default());
    fill_b(&mut p, 9);
    let (mw, rkey) = type2_window(&mut p, Access::REMOTE_WRITE);
    p.post_recv_b(50, 1 << 19, 256);
    write_a(&mut p, 0, b"done with the window");
    let sges = sge_a(&p, 0, 20);
    let wc = one_a(&mut p, 4, WrOp::SendWithInv { rkey }, sges);
    assert_eq!(wc.status, WcStatus::Success);
    let recv = run_b(&mut p, 1);
    assert_eq!(recv.len(), 1, "{recv:?}");
    assert_eq!(recv[0].status, WcStatus::Success);
    assert_eq!(recv[0].invalidated_rkey, Some(rkey));
    assert_eq!(p.b().query_mw(mw).unwrap().bound, None, "free again");
    let before = memory_b(&mut p);
    let va = p.mr_b.addr + WIN_OFF;
    let wc = write_through(&mut p, rkey, va, 3000);
    assert_refused_untouched(&mut p, wc, &before);
}

#[test]
fn local_inv_frees_a_type2_window_and_later_access_is_nakked() {
    let mut p = Pair::new(PairOptions::default());
    fill_b(&mut p, 11);
    let (mw, rkey) = type2_window(&mut p, Access::REMOTE_WRITE | Access::REMOTE_READ);
    let wc = local_op_b(&mut p, 8, WrOp::LocalInv { rkey });
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::LocalInv)
    );
    assert_eq!(p.b().query_mw(mw).unwrap().bound, None);
    let before = memory_b(&mut p);
    let va = p.mr_b.addr + WIN_OFF;
    let wc = write_through(&mut p, rkey, va, 100);
    assert_refused_untouched(&mut p, wc, &before);
}

#[test]
fn a_freed_type2_window_binds_again_with_a_new_rkey() {
    let mut p = Pair::new(PairOptions::default());
    let (mw, rkey) = type2_window(&mut p, Access::REMOTE_WRITE);
    let wc = local_op_b(&mut p, 8, WrOp::LocalInv { rkey });
    assert_eq!(wc.status, WcStatus::Success);
    let next = inc_rkey(rkey);
    let bind = bind_info(&p, Access::REMOTE_WRITE);
    let wc = local_op_b(
        &mut p,
        9,
        WrOp::BindMw {
            mw,
            rkey: next,
            bind,
        },
    );
    assert_eq!(wc.status, WcStatus::Success);
    let va = p.mr_b.addr + WIN_OFF;
    assert_eq!(
        write_through(&mut p, next, va, 64).status,
        WcStatus::Success
    );
    // The R_Key of the first binding names nothing now.
    let before = memory_b(&mut p);
    let wc = write_through(&mut p, rkey, va, 64);
    assert_refused_untouched(&mut p, wc, &before);
}

#[test]
fn type1_rebind_moves_the_window_and_the_old_rkey_is_nakked() {
    let mut p = Pair::new(PairOptions::default());
    fill_b(&mut p, 5);
    let pd = p.mr_b.pd;
    let qb = p.qb;
    let mw = p.b().alloc_mw(pd, MwType::Type1).unwrap();
    let bind = bind_info(&p, Access::REMOTE_READ | Access::REMOTE_WRITE);
    let first = p
        .b()
        .bind_mw(qb, 20, SendFlags::SIGNALED, mw.id, bind)
        .unwrap();
    assert_eq!(first, inc_rkey(mw.rkey));
    let wc = run_b(&mut p, 1);
    assert_eq!(
        (wc[0].status, wc[0].opcode),
        (WcStatus::Success, WcOpcode::BindMw)
    );
    assert_eq!(
        p.b().query_mw(mw.id).unwrap().bound_qp,
        None,
        "type 1: any QP"
    );
    let va = p.mr_b.addr + WIN_OFF;
    let sges = sge_a(&p, 0, 512);
    let wc = one_a(
        &mut p,
        5,
        WrOp::Read {
            remote_addr: va,
            rkey: first,
        },
        sges,
    );
    assert_eq!(wc.status, WcStatus::Success);
    // Rebind further on: a new R_Key; the old one is refused.
    let moved = MwBindInfo {
        addr: bind.addr + WIN_LEN,
        ..bind
    };
    let second = p
        .b()
        .bind_mw(qb, 21, SendFlags::SIGNALED, mw.id, moved)
        .unwrap();
    assert_ne!(second, first);
    assert_eq!(run_b(&mut p, 1)[0].status, WcStatus::Success);
    assert_eq!(
        write_through(&mut p, second, moved.addr, 64).status,
        WcStatus::Success
    );
    let before = memory_b(&mut p);
    let wc = write_through(&mut p, first, va, 64);
    assert_refused_untouched(&mut p, wc, &before);
}

#[test]
fn send_with_inv_of_a_type1_window_is_an_invalid_request() {
    let mut p = Pair::new(PairOptions::default());
    let (pd, qb) = (p.mr_b.pd, p.qb);
    let mw = p.b().alloc_mw(pd, MwType::Type1).unwrap();
    let bind = bind_info(&p, Access::REMOTE_WRITE);
    let rkey = p
        .b()
        .bind_mw(qb, 1, SendFlags::empty(), mw.id, bind)
        .unwrap();
    p.run_idle(SEC);
    p.post_recv_b(50, 1 << 19, 256);
    let sges = sge_a(&p, 0, 16);
    let wc = one_a(&mut p, 4, WrOp::SendWithInv { rkey }, sges);
    // IBTA 10.6.7.1: only a type 2 window may be invalidated.
    assert_eq!(wc.status, WcStatus::RemInvReqErr);
    assert!(
        p.b().query_mw(mw.id).unwrap().bound.is_some(),
        "still bound"
    );
}

#[test]
fn bind_checks_refuse_with_mw_bind_err_and_change_nothing() {
    type Tweak = fn(&mut Pair, &mut MwBindInfo);
    let cases: [(&str, Tweak); 4] = [
        ("region without MW_BIND", |p, b| {
            let pd = p.mr_b.pd;
            let mr = p.b().reg_mr(pd, 65536, Access::LOCAL_WRITE).unwrap();
            b.mr_lkey = mr.lkey;
            b.addr = mr.addr;
        }),
        ("writable window on a region without local write", |p, b| {
            let pd = p.mr_b.pd;
            let mr = p.b().reg_mr(pd, 65536, Access::MW_BIND).unwrap();
            b.mr_lkey = mr.lkey;
            b.addr = mr.addr;
        }),
        ("beyond the region", |p, b| b.length = p.mr_b.length as u64),
        ("zero length", |_, b| b.length = 0),
    ];
    for (what, tweak) in cases {
        let mut p = Pair::new(PairOptions::default());
        let pd = p.mr_b.pd;
        let mw = p.b().alloc_mw(pd, MwType::Type2).unwrap();
        let mut bind = bind_info(&p, Access::REMOTE_WRITE);
        tweak(&mut p, &mut bind);
        let op = WrOp::BindMw {
            mw: mw.id,
            rkey: inc_rkey(mw.rkey),
            bind,
        };
        let wc = local_op_b(&mut p, 1, op);
        assert_eq!(wc.status, WcStatus::MwBindErr, "{what}");
        let qb = p.qb;
        assert_eq!(
            p.b().query_qp(qb).unwrap().0.cur_qp_state,
            QpState::Err,
            "{what}"
        );
        let now = p.b().query_mw(mw.id).unwrap();
        assert_eq!((now.rkey, now.bound), (mw.rkey, None), "{what}");
    }
    // A bound type 2 window does not bind again before it is invalidated (o10-37.2.30).
    let mut p = Pair::new(PairOptions::default());
    let (mw, rkey) = type2_window(&mut p, Access::REMOTE_WRITE);
    let bind = bind_info(&p, Access::REMOTE_READ);
    let wc = local_op_b(
        &mut p,
        2,
        WrOp::BindMw {
            mw,
            rkey: inc_rkey(rkey),
            bind,
        },
    );
    assert_eq!(wc.status, WcStatus::MwBindErr);
    assert_eq!(p.b().query_mw(mw).unwrap().rkey, rkey);
}

#[test]
fn misused_binds_are_refused_at_post_time() {
    let mut p = Pair::new(PairOptions::default());
    let (pd, qb) = (p.mr_b.pd, p.qb);
    let t1 = p.b().alloc_mw(pd, MwType::Type1).unwrap();
    let t2 = p.b().alloc_mw(pd, MwType::Type2).unwrap();
    let bind = bind_info(&p, Access::REMOTE_WRITE);
    let post = |p: &mut Pair, op: WrOp, sg: Vec<Sge>| {
        p.b().post_send(
            qb,
            &SendWr {
                wr_id: 1,
                op,
                sg_list: sg,
                flags: SendFlags::SIGNALED,
                ud: None,
            },
        )
    };
    let bind_wr = |mw: &MwInfo, rkey: u32, bind: MwBindInfo| WrOp::BindMw {
        mw: mw.id,
        rkey,
        bind,
    };
    let invalid = |r: Result<(), EngineError>| matches!(r, Err(EngineError::InvalidWr(_)));
    // A type 1 window by WR, a type 2 window by the verb.
    assert!(invalid(post(
        &mut p,
        bind_wr(&t1, inc_rkey(t1.rkey), bind),
        vec![]
    )));
    assert!(matches!(
        p.b().bind_mw(qb, 1, SendFlags::empty(), t2.id, bind),
        Err(EngineError::InvalidWr(_))
    ));
    // An R_Key of another index, local rights, SGEs.
    assert!(invalid(post(&mut p, bind_wr(&t2, t1.rkey, bind), vec![])));
    let local = MwBindInfo {
        access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        ..bind
    };
    assert!(invalid(post(
        &mut p,
        bind_wr(&t2, inc_rkey(t2.rkey), local),
        vec![]
    )));
    let sge = p.sge_b(0, 8);
    assert!(invalid(post(&mut p, WrOp::LocalInv { rkey: 1 }, vec![sge])));
    // Unknown window.
    assert_eq!(
        p.b().query_mw(MwId(0xFFFF)),
        Err(EngineError::UnknownMw(MwId(0xFFFF)))
    );
    // Nothing was queued.
    assert_eq!(p.b().send_queue_len(qb).unwrap(), 0);
}

#[test]
fn a_failed_local_invalidate_completes_with_loc_qp_op_err() {
    let mut p = Pair::new(PairOptions::default());
    let wc = local_op_b(&mut p, 3, WrOp::LocalInv { rkey: 0x00AB_CD01 });
    assert_eq!(wc.status, WcStatus::LocQpOpErr);
}

#[test]
fn a_type2_window_serves_only_the_qp_that_bound_it() {
    let mut p = Pair::new(PairOptions::default());
    let (_mw, rkey) = type2_window(&mut p, Access::REMOTE_WRITE);
    // A second connection between the same engines.
    let caps = QpCaps::default();
    let (pd_a, pd_b, cq_a, cq_b) = (p.mr_a.pd, p.mr_b.pd, p.cq_a, p.cq_b);
    let init = |pd, cq| QpInit {
        qp_type: QpType::Rc,
        pd,
        send_cq: cq,
        recv_cq: cq,
        caps,
        sq_sig_all: false,
        srq: None,
    };
    let qa2 = p.a().create_qp(init(pd_a, cq_a)).unwrap();
    let qb2 = p.b().create_qp(init(pd_b, cq_b)).unwrap();
    let wc = WorkloadConfig::default();
    connect(p.a(), qa2, qb2, MAC_B, IP_B, 1, 2, &wc).unwrap();
    connect(p.b(), qb2, qa2, MAC_A, IP_A, 2, 1, &wc).unwrap();
    let before = memory_b(&mut p);
    write_a(&mut p, 0, &[0xEE; 64]);
    let (sge, va) = (p.sge_a(0, 64), p.mr_b.addr + WIN_OFF);
    p.a()
        .post_send(
            qa2,
            &SendWr {
                wr_id: 9,
                op: WrOp::Write {
                    remote_addr: va,
                    rkey,
                },
                sg_list: vec![sge],
                flags: SendFlags::SIGNALED,
                ud: None,
            },
        )
        .unwrap();
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(wcs[0].status, WcStatus::RemAccessErr, "{wcs:?}");
    assert!(memory_b(&mut p) == before);
    // The QP that bound it still works.
    let va = p.mr_b.addr + WIN_OFF;
    assert_eq!(
        write_through(&mut p, rkey, va, 64).status,
        WcStatus::Success
    );
}

#[test]
fn regions_with_bound_windows_stay_registered_unchanged_and_windows_keep_their_pd() {
    let mut p = Pair::new(PairOptions::default());
    let (pd, qb, lkey) = (p.mr_b.pd, p.qb, p.mr_b.lkey);
    let mw = p.b().alloc_mw(pd, MwType::Type1).unwrap();
    let bind = bind_info(&p, Access::REMOTE_READ);
    p.b()
        .bind_mw(qb, 1, SendFlags::empty(), mw.id, bind)
        .unwrap();
    p.run_idle(SEC);
    assert!(matches!(p.b().dereg_mr(lkey), Err(EngineError::InUse(_))));
    // Nor is it re-registered (rdma-core: EBUSY): neither its access nor its memory moves.
    let before = p.b().query_mr(lkey).unwrap();
    for change in [
        MrChange {
            access: Some(Access::LOCAL_WRITE),
            ..MrChange::default()
        },
        MrChange {
            memory: Some(MrMemory::Device(4096)),
            ..MrChange::default()
        },
    ] {
        assert!(matches!(
            p.b().rereg_mr(lkey, change),
            Err(EngineError::InUse(_))
        ));
    }
    assert_eq!(p.b().query_mr(lkey).unwrap(), before);
    // A window alone keeps its PD too.
    let pd2 = p.b().alloc_pd();
    let lone = p.b().alloc_mw(pd2, MwType::Type2).unwrap();
    assert!(matches!(p.b().dealloc_pd(pd2), Err(EngineError::InUse(_))));
    p.b().dealloc_mw(lone.id).unwrap();
    p.b().dealloc_pd(pd2).unwrap();
    // Deallocating the window releases the region.
    p.b().dealloc_mw(mw.id).unwrap();
    assert_eq!(p.b().dealloc_mw(mw.id), Err(EngineError::UnknownMw(mw.id)));
    let access = Access::LOCAL_WRITE | Access::REMOTE_READ;
    let change = MrChange {
        access: Some(access),
        ..MrChange::default()
    };
    assert_eq!(p.b().rereg_mr(lkey, change).unwrap().access, access);
    p.b().dereg_mr(lkey).unwrap();
}

#[test]
fn a_window_bound_on_one_shard_serves_the_others() {
    let mut shards = Engine::new_shards(EngineConfig::new(MAC_B, IP_B.into()), 2);
    let pd = shards[0].alloc_pd();
    let mr = shards[0].reg_mr(pd, 65536, Access::ALL).unwrap();
    let cq = shards[1].create_cq(16).unwrap();
    let qpn = shards[1]
        .create_qp(QpInit {
            qp_type: QpType::Rc,
            pd,
            send_cq: cq,
            recv_cq: cq,
            caps: QpCaps::default(),
            sq_sig_all: true,
            srq: None,
        })
        .unwrap();
    connect(
        &mut shards[1],
        qpn,
        0x22,
        MAC_A,
        IP_A,
        0,
        0,
        &WorkloadConfig::default(),
    )
    .unwrap();
    let mw = shards[0].alloc_mw(pd, MwType::Type1).unwrap();
    let bind = MwBindInfo {
        mr_lkey: mr.lkey,
        addr: mr.addr + 256,
        length: 1024,
        access: Access::REMOTE_READ,
    };
    let rkey = shards[1]
        .bind_mw(qpn, 1, SendFlags::SIGNALED, mw.id, bind)
        .unwrap();
    // The bind runs when shard 1's requester reaches it (no frame goes out for it).
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    assert_eq!(
        shards[1].poll_transmit(Instant::from_nanos(0), &mut buf),
        None
    );
    assert_eq!(
        shards[1].poll_cq_one(cq).unwrap().unwrap().opcode,
        WcOpcode::BindMw
    );
    let seen = shards[0].query_mw(mw.id).unwrap();
    assert_eq!((seen.rkey, seen.bound), (rkey, Some(bind)));
}

/// A bind between WRITEs on a lossy link: go-back-N rewinds over it many times, and it
/// must run exactly once (a type 2 window binds only when free: a second run would fail
/// with MW_BIND_ERR) and complete in its place, between the WRITEs around it.
#[test]
fn a_bind_between_writes_runs_once_through_retries() {
    for seed in 1..=4u64 {
        let link = LinkConfig {
            loss: 0.05,
            ..LinkConfig::default()
        };
        let mut p = Pair::new(PairOptions {
            link,
            seed,
            retry_cnt: 7,
            ..PairOptions::default()
        });
        let pd = p.mr_a.pd;
        let mw = p.a().alloc_mw(pd, MwType::Type2).unwrap();
        let rkey = inc_rkey(mw.rkey);
        let bind = MwBindInfo {
            mr_lkey: p.mr_a.lkey,
            addr: p.mr_a.addr + 65536,
            length: 4096,
            access: Access::REMOTE_READ,
        };
        let (va, rkey_b) = (p.mr_b.addr, p.mr_b.rkey);
        for i in 0..8u64 {
            let op = if i == 4 {
                WrOp::BindMw {
                    mw: mw.id,
                    rkey,
                    bind,
                }
            } else {
                WrOp::Write {
                    remote_addr: va + i * 8192,
                    rkey: rkey_b,
                }
            };
            let sges = if i == 4 {
                vec![]
            } else {
                sge_a(&p, i * 8192, 5000)
            };
            p.post_a(i, op, sges);
        }
        let wcs = p.run_for_completions(8, 10 * SEC);
        let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
        let want: Vec<_> = (0..8u64)
            .map(|i| {
                let opcode = if i == 4 {
                    WcOpcode::BindMw
                } else {
                    WcOpcode::RdmaWrite
                };
                (i, WcStatus::Success, opcode)
            })
            .collect();
        assert_eq!(got, want, "seed {seed}");
        assert!(
            p.net.engines[0].counters().retransmitted_packets > 0,
            "seed {seed}: no retransmission, the rewind was not exercised"
        );
        assert_eq!(p.a().query_mw(mw.id).unwrap().rkey, rkey);
    }
}

// ---------------------------------------------------------------------------------------
// Bind and invalidate racing WRITEs in flight, under loss.

/// Each WRITE targets its own slot of the window.
const SLOT: usize = 4096;
const SLOTS: usize = 24;

#[derive(Clone, Copy, Debug)]
enum Change {
    /// LOCAL_INV of the type 2 window.
    Invalidate,
    /// A type 1 window rebound elsewhere (its old R_Key stops).
    Rebind,
}

/// A posts SLOTS multi-packet WRITEs through B's window on a lossy link; after `after` of
/// them completed, B invalidates or rebinds the window. Returns (successes, refusals).
fn race(seed: u64, after: usize, change: Change) -> (usize, usize) {
    let link = LinkConfig {
        loss: 0.03,
        reorder: 0.03,
        reorder_delay: Duration::from_micros(20),
        ..LinkConfig::default()
    };
    let mut p = Pair::new(PairOptions {
        link,
        seed,
        retry_cnt: 7,
        ..PairOptions::default()
    });
    let (pd, qb) = (p.mr_b.pd, p.qb);
    let len = (SLOT * SLOTS) as u64;
    let bind = MwBindInfo {
        mr_lkey: p.mr_b.lkey,
        addr: p.mr_b.addr + WIN_OFF,
        length: len,
        access: Access::REMOTE_WRITE,
    };
    let (mw, rkey) = match change {
        Change::Invalidate => {
            let mw = p.b().alloc_mw(pd, MwType::Type2).unwrap();
            let rkey = inc_rkey(mw.rkey);
            let op = WrOp::BindMw {
                mw: mw.id,
                rkey,
                bind,
            };
            assert_eq!(local_op_b(&mut p, 1, op).status, WcStatus::Success);
            (mw.id, rkey)
        }
        Change::Rebind => {
            let mw = p.b().alloc_mw(pd, MwType::Type1).unwrap();
            let rkey = p
                .b()
                .bind_mw(qb, 1, SendFlags::SIGNALED, mw.id, bind)
                .unwrap();
            assert_eq!(run_b(&mut p, 1)[0].status, WcStatus::Success);
            (mw.id, rkey)
        }
    };
    for slot in 0..SLOTS {
        let data = pattern(SLOT, slot as u8 * 7);
        write_a(&mut p, (slot * SLOT) as u64, &data);
        let sges = sge_a(&p, (slot * SLOT) as u64, SLOT as u32);
        p.post_a(
            slot as u64,
            WrOp::Write {
                remote_addr: bind.addr + (slot * SLOT) as u64,
                rkey,
            },
            sges,
        );
    }
    // Let `after` WRITEs complete, then change the window while the rest are in flight.
    let cq_a = p.cq_a;
    let deadline = p.net.now() + SEC;
    p.net.run_until(deadline, |net| {
        net.engines[0].cq_len(cq_a).unwrap_or(0) >= after
    });
    match change {
        Change::Invalidate => {
            let wr = SendWr {
                wr_id: 2,
                op: WrOp::LocalInv { rkey },
                sg_list: vec![],
                flags: SendFlags::SIGNALED,
                ud: None,
            };
            p.b().post_send(qb, &wr).unwrap();
        }
        Change::Rebind => {
            // Onto the other half of B's memory.
            let elsewhere = MwBindInfo {
                addr: p.mr_b.addr + (p.mr_b.length / 2) as u64,
                ..bind
            };
            let next = p
                .b()
                .bind_mw(qb, 2, SendFlags::SIGNALED, mw, elsewhere)
                .unwrap();
            assert_ne!(next, rkey);
        }
    }
    // The moment the change has executed, B's memory is what it will stay.
    let changed = run_b(&mut p, 1);
    assert_eq!(changed.len(), 1, "seed {seed}: {changed:?}");
    assert_eq!(changed[0].status, WcStatus::Success, "seed {seed}");
    let at_change = memory_b(&mut p);
    let deadline = p.net.now() + 10 * SEC;
    p.net.run_until(deadline, |net| {
        net.engines[0].cq_len(cq_a).unwrap_or(0) >= SLOTS
    });
    let wcs = drain(p.a(), cq_a);
    assert_eq!(wcs.len(), SLOTS, "seed {seed}: every WRITE completes");
    let after_change = memory_b(&mut p);
    assert!(
        after_change == at_change,
        "seed {seed} {change:?}: B's memory changed after the window did"
    );
    // Outside the window nothing was ever written.
    let (s, e) = (WIN_OFF as usize, WIN_OFF as usize + SLOT * SLOTS);
    assert!(
        after_change[..s]
            .iter()
            .chain(&after_change[e..])
            .all(|&b| b == 0),
        "seed {seed}: bytes outside the window changed"
    );
    let mut ok = 0;
    let mut refused = 0;
    for wc in &wcs {
        let slot = wc.wr_id as usize;
        let got = &after_change[s + slot * SLOT..s + (slot + 1) * SLOT];
        let want = pattern(SLOT, slot as u8 * 7);
        match wc.status {
            WcStatus::Success => {
                ok += 1;
                assert_eq!(
                    got,
                    &want[..],
                    "seed {seed}: slot {slot} completed but differs"
                );
            }
            WcStatus::RemAccessErr | WcStatus::WrFlushErr => {
                refused += 1;
                // A WRITE cut off part-way leaves some packets' bytes, never other bytes.
                assert!(
                    got.iter().zip(&want).all(|(g, w)| *g == 0 || g == w),
                    "seed {seed}: slot {slot} holds bytes nobody wrote"
                );
            }
            other => panic!("seed {seed}: unexpected {other:?}"),
        }
    }
    (ok, refused)
}

#[test]
fn bind_and_invalidate_race_writes_in_flight_under_loss() {
    let mut totals = [(0, 0); 2];
    for seed in 1..=6u64 {
        for (i, change) in [Change::Invalidate, Change::Rebind].into_iter().enumerate() {
            let after = 2 + (seed as usize * 5) % 12;
            let (ok, refused) = race(seed, after, change);
            totals[i].0 += ok;
            totals[i].1 += refused;
        }
    }
    // The race really happened: WRITEs completed before the change and were refused after.
    for (i, (ok, refused)) in totals.iter().enumerate() {
        assert!(
            *ok > 0 && *refused > 0,
            "variant {i}: ok {ok} refused {refused}"
        );
    }
}

/// The trace docs/transport.md quotes: a bind, a WRITE through the window, SEND_WITH_INV,
/// and the WRITE after it NAKed.
#[test]
fn window_trace() {
    let mut p = Pair::new(PairOptions::default());
    let out = Rc::new(RefCell::new(Vec::<u8>::new()));
    struct Sink(Rc<RefCell<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.borrow_mut().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    p.net.set_trace(Box::new(Sink(out.clone())));
    let (_mw, rkey) = type2_window(&mut p, Access::REMOTE_WRITE);
    let va = p.mr_b.addr + WIN_OFF;
    assert_eq!(
        write_through(&mut p, rkey, va, 1500).status,
        WcStatus::Success
    );
    p.post_recv_b(50, 1 << 19, 256);
    let sges = sge_a(&p, 0, 16);
    assert_eq!(
        one_a(&mut p, 4, WrOp::SendWithInv { rkey }, sges).status,
        WcStatus::Success
    );
    let before = memory_b(&mut p);
    let wc = write_through(&mut p, rkey, va, 64);
    assert_refused_untouched(&mut p, wc, &before);
    let text = String::from_utf8_lossy(&out.borrow()).into_owned();
    println!("{text}");
    assert!(text.contains("RC_SEND_ONLY_WITH_INVALIDATE"), "{text}");
    assert!(text.contains("NAK RemoteAccessError"), "{text}");
}
