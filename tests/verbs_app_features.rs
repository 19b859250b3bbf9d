//! Inline sends, solicited events and CQ resizing through the verbs API, over the in-memory
//! pair with a completion channel (issue 13 item 7).
use std::time::Duration;

use xroce::engine::EngineError;
use xroce::verbs::*;

const WAIT: Duration = Duration::from_secs(20);
const QUIET: Duration = Duration::from_millis(100);

struct Side {
    dev: Device,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn side(dev: &Device, channel: Option<&CompletionChannel>) -> Side {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64, channel).unwrap();
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let mr = pd.reg_mr(8192, Access::ALL).unwrap();
    Side {
        dev: dev.clone(),
        _pd: pd,
        cq,
        qp,
        mr,
    }
}

/// A connected pair; B's CQ reports to `channel`.
fn pair() -> (Side, Side, CompletionChannel, MemLink) {
    let (da, db, link) =
        Device::mem_pair(&mem_link_config(1500, 0.0, 1), DeviceConfig::default()).unwrap();
    let channel = db.create_comp_channel().unwrap();
    let (a, b) = (side(&da, None), side(&db, Some(&channel)));
    for (from, to) in [(&a, &b), (&b, &a)] {
        let sgid = from.dev.ipv4_gid_index().unwrap() as u8;
        let gid = to.dev.query_gid(to.dev.ipv4_gid_index().unwrap()).unwrap();
        from.qp
            .connect_rc(
                &RcPeer {
                    qpn: to.qp.qp_num(),
                    psn: 0,
                    gid,
                },
                &RcOptions {
                    sgid_index: sgid,
                    ..RcOptions::default()
                },
            )
            .unwrap();
    }
    (a, b, channel, link)
}

fn send(wr_id: u64, sge: Sge, flags: SendFlags) -> SendWr {
    SendWr {
        wr_id,
        op: WrOp::Send,
        sg_list: vec![sge],
        flags: SendFlags::SIGNALED | flags,
        ud: None,
    }
}

fn recv(b: &Side, wr_id: u64, len: u32) {
    b.qp.post_recv(&RecvWr {
        wr_id,
        sg_list: vec![b.mr.sge(0, len).unwrap()],
    })
    .unwrap();
}

fn one(cq: &Cq) -> Wc {
    let wcs = cq.wait(1, WAIT).unwrap();
    assert_eq!(wcs.len(), 1, "no completion within {WAIT:?}");
    wcs[0]
}

#[test]
fn inline_send_with_a_bogus_lkey_delivers_the_bytes_of_post_time() {
    let (a, b, _channel, _link) = pair();
    let original: Vec<u8> = (0..=255u8).collect();
    a.mr.write(0, &original).unwrap();
    recv(&b, 1, 4096);
    let sge = Sge {
        lkey: 0x0bad_0bad,
        ..a.mr.sge(0, 256).unwrap()
    };
    a.qp.post_send(&send(1, sge, SendFlags::INLINE)).unwrap();
    a.mr.write(0, &[0u8; 256]).unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    let wc = one(&b.cq);
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 256));
    assert_eq!(b.mr.to_vec(0, 256).unwrap(), original);

    // From a plain slice, reused at once.
    let mut buf = b"not in any region".to_vec();
    recv(&b, 2, 4096);
    a.qp.post_send_inline(&send(2, sge, SendFlags::empty()), &buf)
        .unwrap();
    buf.fill(b'x');
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert_eq!(one(&b.cq).byte_len, 17);
    assert_eq!(b.mr.to_vec(0, 17).unwrap(), b"not in any region");

    // One byte over the QP's max_inline_data is refused, typed.
    let (_, caps) = a.qp.query().unwrap();
    let over = Sge {
        length: caps.max_inline_data + 1,
        ..sge
    };
    let err =
        a.qp.post_send(&send(3, over, SendFlags::INLINE))
            .unwrap_err();
    assert!(
        matches!(
            err,
            VerbsError::Engine(EngineError::LimitExceeded {
                what: "max_inline_data",
                ..
            })
        ),
        "{err:?}"
    );
}

#[test]
fn solicited_only_wakes_for_solicited_and_error_completions() {
    let (a, b, channel, _link) = pair();
    a.mr.write(0, &[7u8; 64]).unwrap();
    let sge = a.mr.sge(0, 64).unwrap();
    b.cq.req_notify(true).unwrap();
    // Unsolicited: B completes it, the channel stays quiet.
    recv(&b, 1, 4096);
    a.qp.post_send(&send(1, sge, SendFlags::empty())).unwrap();
    assert_eq!(one(&b.cq).wr_id, 1);
    assert!(matches!(
        channel.get_cq_event(Some(QUIET)),
        Err(VerbsError::Timeout(_))
    ));
    // Solicited: the still-armed CQ fires.
    recv(&b, 2, 4096);
    a.qp.post_send(&send(2, sge, SendFlags::SOLICITED)).unwrap();
    assert_eq!(channel.get_cq_event(Some(WAIT)).unwrap(), b.cq.id());
    assert_eq!(one(&b.cq).wr_id, 2);
    // An error completion fires a solicited-only arm too: an unsolicited SEND into a
    // receive too small for it (Local Length Error at B).
    b.cq.req_notify(true).unwrap();
    recv(&b, 3, 8);
    a.qp.post_send(&send(3, sge, SendFlags::empty())).unwrap();
    assert_eq!(channel.get_cq_event(Some(WAIT)).unwrap(), b.cq.id());
    let wc = one(&b.cq);
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::LocLenErr));
}

#[test]
fn resize_keeps_the_completions_a_cq_holds() {
    let (a, b, _channel, _link) = pair();
    let sge = a.mr.sge(0, 16).unwrap();
    for i in 0..4 {
        recv(&b, i, 4096);
        a.qp.post_send(&send(i, sge, SendFlags::empty())).unwrap();
    }
    // B completes a receive before it ACKs the SEND: once A has its four completions, B's
    // CQ holds four (nobody polled it).
    assert_eq!(a.cq.wait(4, WAIT).unwrap().len(), 4);
    let err = b.cq.resize(3).unwrap_err();
    assert!(
        matches!(
            err,
            VerbsError::Engine(EngineError::CqTooSmall {
                held: 4,
                requested: 3
            })
        ),
        "{err:?}"
    );
    assert!(matches!(b.cq.resize(0), Err(VerbsError::Zero { .. })));
    assert!(matches!(
        b.cq.resize(u32::MAX),
        Err(VerbsError::LimitExceeded { what: "cqe", .. })
    ));
    b.cq.resize(4).unwrap();
    assert_eq!(b.cq.depth(), 4);
    let ids: Vec<u64> =
        b.cq.wait(4, WAIT)
            .unwrap()
            .iter()
            .map(|w| w.wr_id)
            .collect();
    assert_eq!(ids, vec![0, 1, 2, 3]);
    b.cq.resize(1000).unwrap();
    assert_eq!(b.cq.depth(), 1000);
}
