//! UC queue pairs through the verbs API over the in-memory driver: `QpInitAttr::uc`,
//! `Qp::connect_uc`, SEND and WRITE with immediate, loss, and the typed errors (READ/atomics
//! refused, RC-only calls on UC and UC calls on RC refused).
use std::time::Duration;

use xroce::engine::EngineError;
use xroce::verbs::*;

const WAIT: Duration = Duration::from_secs(10);

struct Side {
    dev: Device,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn side(dev: &Device) -> Side {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1024, None).unwrap();
    let qp = pd.create_qp(&QpInitAttr::uc(&cq, &cq)).unwrap();
    let mr = pd.reg_mr(1 << 20, Access::ALL).unwrap();
    Side {
        dev: dev.clone(),
        _pd: pd,
        cq,
        qp,
        mr,
    }
}

fn peer(s: &Side, psn: u32) -> RcPeer {
    let g = s.dev.ipv4_gid_index().unwrap();
    RcPeer {
        qpn: s.qp.qp_num(),
        psn,
        gid: s.dev.query_gid(g).unwrap(),
    }
}

fn opts(s: &Side, psn: u32) -> RcOptions {
    RcOptions {
        sgid_index: s.dev.ipv4_gid_index().unwrap() as u8,
        sq_psn: psn,
        ..RcOptions::default()
    }
}

fn uc_pair(loss: f64) -> (Side, Side, MemLink) {
    let (da, db, link) =
        Device::mem_pair(&mem_link_config(1500, loss, 3), DeviceConfig::default()).unwrap();
    let (a, b) = (side(&da), side(&db));
    a.qp.connect_uc(&peer(&b, 0x222), &opts(&a, 0xff_fffe))
        .unwrap();
    b.qp.connect_uc(&peer(&a, 0xff_fffe), &opts(&b, 0x222))
        .unwrap();
    (a, b, link)
}

fn wr(wr_id: u64, op: WrOp, sg: Sge) -> SendWr {
    SendWr {
        wr_id,
        op,
        sg_list: vec![sg],
        flags: SendFlags::SIGNALED,
        ud: None,
    }
}

#[test]
fn uc_send_and_write_with_immediate() {
    let (a, b, _link) = uc_pair(0.0);
    assert_eq!(a.qp.qp_type(), QpType::Uc);
    assert_eq!(a.qp.state().unwrap(), QpState::Rts);
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    a.mr.write(0, &data).unwrap();
    for i in 0..2 {
        b.qp.post_recv(&RecvWr {
            wr_id: 50 + i,
            sg_list: vec![b.mr.sge(0x10000 * i as usize, 8192).unwrap()],
        })
        .unwrap();
    }
    let sg = a.mr.sge(0, 5000).unwrap();
    a.qp.post_send(&wr(1, WrOp::SendWithImm { imm: 9 }, sg))
        .unwrap();
    let op = WrOp::WriteWithImm {
        remote_addr: b.mr.addr() + 0x40000,
        rkey: b.mr.rkey(),
        imm: 10,
    };
    a.qp.post_send(&wr(2, op, sg)).unwrap();
    let sent = a.cq.wait(2, WAIT).unwrap();
    assert_eq!(sent.len(), 2);
    assert!(sent.iter().all(|w| w.status == WcStatus::Success));
    let got = b.cq.wait(2, WAIT).unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!((got[0].wr_id, got[0].opcode), (50, WcOpcode::Recv));
    assert_eq!((got[0].byte_len, got[0].imm_data), (5000, Some(9)));
    assert_eq!(
        (got[1].wr_id, got[1].opcode),
        (51, WcOpcode::RecvRdmaWithImm)
    );
    assert_eq!((got[1].byte_len, got[1].imm_data), (5000, Some(10)));
    assert_eq!(b.mr.to_vec(0, 5000).unwrap(), data);
    assert_eq!(b.mr.to_vec(0x40000, 5000).unwrap(), data);
}

#[test]
fn uc_under_loss_delivers_whole_messages_in_order() {
    let (a, b, _link) = uc_pair(0.05);
    const N: u64 = 100;
    for i in 0..N {
        let mut msg = vec![i as u8; 3000];
        msg[..8].copy_from_slice(&i.to_le_bytes());
        a.mr.write(i as usize * 4096, &msg).unwrap();
        b.qp.post_recv(&RecvWr {
            wr_id: i,
            sg_list: vec![b.mr.sge(i as usize * 4096, 4096).unwrap()],
        })
        .unwrap();
    }
    for i in 0..N {
        let sg = a.mr.sge(i as usize * 4096, 3000).unwrap();
        a.qp.post_send(&wr(i, WrOp::Send, sg)).unwrap();
    }
    let sent = a.cq.wait(N as usize, WAIT).unwrap();
    assert_eq!(sent.len(), N as usize, "every UC send completes once sent");
    std::thread::sleep(Duration::from_millis(200));
    let mut got = Vec::new();
    while let Some(wc) = b.cq.poll_one().unwrap() {
        got.push(wc);
    }
    assert!(!got.is_empty() && got.len() < N as usize, "{}", got.len());
    let mut last = None;
    for (k, wc) in got.iter().enumerate() {
        // WQEs are used in order; a lost message consumed none.
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (k as u64, WcStatus::Success, 3000)
        );
        let msg = b.mr.to_vec(k * 4096, 3000).unwrap();
        let i = u64::from_le_bytes(msg[..8].try_into().unwrap());
        assert!(msg[8..].iter().all(|&x| x == i as u8), "message {i} whole");
        assert!(last < Some(i));
        last = Some(i);
    }
}

#[test]
fn uc_refuses_read_and_atomics_and_rc_calls() {
    let (a, b, _link) = uc_pair(0.0);
    let sg = a.mr.sge(0, 8).unwrap();
    let read = WrOp::Read {
        remote_addr: b.mr.addr(),
        rkey: b.mr.rkey(),
    };
    let atomic = WrOp::FetchAdd {
        remote_addr: b.mr.addr(),
        rkey: b.mr.rkey(),
        add: 1,
    };
    for op in [read, atomic] {
        match a.qp.post_send(&wr(1, op, sg)) {
            Err(VerbsError::Engine(EngineError::UnsupportedOperation { qp_type, .. })) => {
                assert_eq!(qp_type, QpType::Uc)
            }
            other => panic!("{op:?} on UC: {other:?}"),
        }
    }
    match a.qp.connect_rc(&peer(&b, 0), &opts(&a, 0)) {
        Err(VerbsError::WrongQpType {
            expected, actual, ..
        }) => assert_eq!((expected, actual), (QpType::Rc, QpType::Uc)),
        other => panic!("connect_rc on UC: {other:?}"),
    }
    let cq = a.dev.create_cq(16, None).unwrap();
    let pd = a.dev.alloc_pd().unwrap();
    let rc = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let err = rc.connect_uc(&peer(&b, 0), &opts(&a, 0)).unwrap_err();
    assert!(
        err.to_string().contains("connect_uc needs a UC queue pair"),
        "{err}"
    );
    // An RC-only attribute on a UC transition is refused by name.
    let err =
        a.qp.modify(&QpAttr::default(), QpAttrMask::MIN_RNR_TIMER)
            .unwrap_err();
    assert!(err.to_string().contains("MIN_RNR_TIMER"), "{err}");
}
