//! Memory windows through the verbs API over the in-memory driver: `Pd::alloc_mw`,
//! `Qp::bind_mw` (type 1), a `WrOp::BindMw` WR (type 2), LOCAL_INV, SEND_WITH_INV from the
//! peer, and every refused access NAKed (REM_ACCESS_ERR) with the memory untouched byte for
//! byte, with and without loss.
use std::time::Duration;

use xroce::verbs::*;

const WAIT: Duration = Duration::from_secs(10);
const WIN_OFF: usize = 8192;
const WIN_LEN: usize = 16384;

struct Side {
    dev: Device,
    pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn side(dev: &Device) -> Side {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1024, None).unwrap();
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let mr = pd.reg_mr(1 << 18, Access::ALL).unwrap();
    Side {
        dev: dev.clone(),
        pd,
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
                    sq_psn: psn,
                    timeout: 8,
                    ..RcOptions::default()
                },
            )
            .unwrap();
    }
}

fn pair(loss: f64) -> (Side, Side, MemLink) {
    let (da, db, link) =
        Device::mem_pair(&mem_link_config(1500, loss, 7), DeviceConfig::default()).unwrap();
    let (a, b) = (side(&da), side(&db));
    connect(&a, &b);
    (a, b, link)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 0x80)
        .collect()
}

fn post(s: &Side, wr_id: u64, op: WrOp, sg_list: Vec<Sge>) {
    s.qp.post_send(&SendWr {
        wr_id,
        op,
        sg_list,
        flags: SendFlags::SIGNALED,
        ud: None,
    })
    .unwrap();
}

fn one(s: &Side) -> Wc {
    let wcs = s.cq.wait(1, WAIT).unwrap();
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    wcs[0]
}

fn bind_info(b: &Side, access: Access) -> MwBindInfo {
    MwBindInfo {
        mr_lkey: b.mr.lkey(),
        addr: b.mr.addr() + WIN_OFF as u64,
        length: WIN_LEN as u64,
        access,
    }
}

fn all(s: &Side) -> Vec<u8> {
    s.mr.to_vec(0, s.mr.len()).unwrap()
}

/// A's WRITE of `len` pattern bytes to `va` through `rkey`.
fn write(a: &Side, rkey: u32, va: u64, len: usize, seed: u8) -> Wc {
    a.mr.write(0, &pattern(len, seed)).unwrap();
    post(
        a,
        1,
        WrOp::Write {
            remote_addr: va,
            rkey,
        },
        vec![a.mr.sge(0, len as u32).unwrap()],
    );
    one(a)
}

fn type2_over_send_with_inv(loss: f64) {
    let (a, b, _link) = pair(loss);
    b.mr.write(0, &pattern(b.mr.len(), 3)).unwrap();
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    assert_eq!(mw.mw_type(), MwType::Type2);
    let rkey = inc_rkey(mw.rkey().unwrap());
    post(
        &b,
        2,
        WrOp::BindMw {
            mw: mw.id(),
            rkey,
            bind: bind_info(&b, Access::REMOTE_WRITE | Access::REMOTE_READ),
        },
        vec![],
    );
    let wc = one(&b);
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::BindMw)
    );
    assert_eq!(mw.rkey().unwrap(), rkey);
    // A multi-packet WRITE through the window lands where the window says.
    let va = b.mr.addr() + WIN_OFF as u64;
    assert_eq!(write(&a, rkey, va, WIN_LEN, 9).status, WcStatus::Success);
    let mut expect = pattern(b.mr.len(), 3);
    expect[WIN_OFF..WIN_OFF + WIN_LEN].copy_from_slice(&pattern(WIN_LEN, 9));
    assert!(all(&b) == expect, "the WRITE landed elsewhere");
    // SEND_WITH_INV: B's receive reports the R_Key, the window is free again.
    b.qp.post_recv(&RecvWr {
        wr_id: 40,
        sg_list: vec![b.mr.sge(0, 64).unwrap()],
    })
    .unwrap();
    a.mr.write(0, b"release").unwrap();
    post(
        &a,
        3,
        WrOp::SendWithInv { rkey },
        vec![a.mr.sge(0, 7).unwrap()],
    );
    assert_eq!(one(&a).status, WcStatus::Success);
    let recv = one(&b);
    assert_eq!(recv.status, WcStatus::Success);
    assert_eq!(recv.invalidated_rkey, Some(rkey));
    assert_eq!(mw.query().unwrap().bound, None);
    // The WRITE after it is refused, and not one byte of B's memory moves.
    let before = all(&b);
    let wc = write(&a, rkey, va, 5000, 11);
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    assert!(all(&b) == before, "memory changed under a refused WRITE");
    assert_eq!(b.qp.state().unwrap(), QpState::Err);
}

#[test]
fn type2_window_bound_used_and_invalidated_by_the_peer() {
    type2_over_send_with_inv(0.0);
}

#[test]
fn type2_window_under_loss() {
    type2_over_send_with_inv(0.02);
}

#[test]
fn type1_window_bound_by_the_verb_and_rebound() {
    let (a, b, _link) = pair(0.0);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    b.mr.write(WIN_OFF, &pattern(WIN_LEN, 21)).unwrap();
    let first =
        b.qp.bind_mw(
            &mw,
            5,
            SendFlags::SIGNALED,
            bind_info(&b, Access::REMOTE_READ),
        )
        .unwrap();
    assert_eq!(one(&b).opcode, WcOpcode::BindMw);
    assert_eq!(mw.rkey().unwrap(), first);
    post(
        &a,
        6,
        WrOp::Read {
            remote_addr: b.mr.addr() + WIN_OFF as u64,
            rkey: first,
        },
        vec![a.mr.sge(0, WIN_LEN as u32).unwrap()],
    );
    assert_eq!(one(&a).status, WcStatus::Success);
    assert_eq!(a.mr.to_vec(0, WIN_LEN).unwrap(), pattern(WIN_LEN, 21));
    // A READ-only window refuses a WRITE.
    let before = all(&b);
    let va = b.mr.addr() + WIN_OFF as u64;
    // Rebound: a new R_Key with write access; the old key is refused.
    let second =
        b.qp.bind_mw(
            &mw,
            7,
            SendFlags::SIGNALED,
            bind_info(&b, Access::REMOTE_WRITE),
        )
        .unwrap();
    assert_ne!(first, second);
    assert_eq!(one(&b).status, WcStatus::Success);
    let wc = write(&a, first, va, 100, 1);
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    assert!(all(&b) == before, "memory changed under a refused WRITE");
}

#[test]
fn local_invalidate_and_the_region_stays_while_a_window_is_bound() {
    let (a, b, _link) = pair(0.0);
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let rkey = inc_rkey(mw.rkey().unwrap());
    let bind = bind_info(&b, Access::REMOTE_WRITE);
    post(
        &b,
        2,
        WrOp::BindMw {
            mw: mw.id(),
            rkey,
            bind,
        },
        vec![],
    );
    assert_eq!(one(&b).status, WcStatus::Success);
    post(&b, 3, WrOp::LocalInv { rkey }, vec![]);
    let wc = one(&b);
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::LocalInv)
    );
    let before = all(&b);
    let wc = write(&a, rkey, bind.addr, 64, 2);
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    assert!(all(&b) == before);
}

#[test]
fn a_bind_on_a_region_without_mw_bind_fails_with_mw_bind_err() {
    let (_a, b, _link) = pair(0.0);
    let plain = b.pd.reg_mr(65536, Access::LOCAL_WRITE).unwrap();
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let bind = MwBindInfo {
        mr_lkey: plain.lkey(),
        addr: plain.addr(),
        length: 4096,
        access: Access::REMOTE_READ,
    };
    b.qp.bind_mw(&mw, 1, SendFlags::SIGNALED, bind).unwrap();
    assert_eq!(one(&b).status, WcStatus::MwBindErr);
    assert_eq!(b.qp.state().unwrap(), QpState::Err);
    // A type 2 window is not bound by the verb (a typed error, nothing posted).
    let t2 = b.pd.alloc_mw(MwType::Type2).unwrap();
    assert!(b.qp.bind_mw(&t2, 1, SendFlags::SIGNALED, bind).is_err());
}
