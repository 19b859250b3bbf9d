//! What applications also expect of the transport (issue 13 item 7), in the simulator:
//! inline sends, solicited events, fences after READs, resizing a CQ.
#[path = "common/pair.rs"]
mod pair;

use std::cell::RefCell;
use std::net::IpAddr;
use std::rc::Rc;
use std::time::Duration;

use pair::{drain, Pair, PairOptions};
use xroce::engine::*;
use xroce::sim::{FrameInfo, LinkConfig, Verdict};
use xroce::wire::Opcode;

const SEC: Duration = Duration::from_secs(1);

/// One frame as a filter saw it: who sent it, its opcode, its SE bit, its bytes.
#[derive(Clone, Debug)]
struct Seen {
    from: usize,
    opcode: Opcode,
    solicited: bool,
    bytes: Vec<u8>,
}

/// Records every RoCE frame on the link, passing all of them.
fn record(p: &mut Pair) -> Rc<RefCell<Vec<Seen>>> {
    let log = Rc::new(RefCell::new(Vec::new()));
    let l = log.clone();
    p.net.set_filter(move |f: &FrameInfo<'_>| {
        if let Some(pkt) = f.packet() {
            l.borrow_mut().push(Seen {
                from: f.from,
                opcode: pkt.bth.opcode,
                solicited: pkt.bth.solicited,
                bytes: f.bytes.to_vec(),
            });
        }
        Verdict::Pass
    });
    log
}

/// A trace sink the test can read back (and print: run with `--nocapture` to see the
/// traces docs/transport.md shows).
#[derive(Clone, Default)]
struct Trace(Rc<RefCell<Vec<u8>>>);

impl std::io::Write for Trace {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn trace(p: &mut Pair) -> Trace {
    let t = Trace::default();
    p.net.set_trace(Box::new(t.clone()));
    t
}

impl Trace {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.borrow()).into_owned()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

fn post(p: &mut Pair, wr_id: u64, op: WrOp, sges: Vec<Sge>, flags: SendFlags) {
    let qa = p.qa;
    p.a()
        .post_send(
            qa,
            &SendWr {
                wr_id,
                op,
                sg_list: sges,
                flags,
                ud: None,
            },
        )
        .expect("post_send");
}

fn write_a(p: &mut Pair, offset: u64, data: &[u8]) {
    let (lkey, addr) = (p.mr_a.lkey, p.mr_a.addr);
    p.a().mr_write(lkey, addr + offset, data).unwrap();
}

fn read_b(p: &mut Pair, offset: u64, len: usize) -> Vec<u8> {
    let (lkey, addr) = (p.mr_b.lkey, p.mr_b.addr);
    p.b().mr_to_vec(lkey, addr + offset, len).unwrap()
}

fn events(e: &mut Engine) -> Vec<Event> {
    std::iter::from_fn(|| e.poll_event()).collect()
}

// ----- inline data -----

#[test]
fn inline_send_is_copied_at_post_time_and_its_lkey_is_not_checked() {
    let mut p = Pair::new(PairOptions::default());
    let original = pattern(200, 1);
    write_a(&mut p, 0, &original);
    p.post_recv_b(7, 0, 4096);
    let bogus = Sge {
        lkey: 0xdead_beef,
        ..p.sge_a(0, 200)
    };
    post(
        &mut p,
        1,
        WrOp::Send,
        vec![bogus],
        SendFlags::SIGNALED | SendFlags::INLINE,
    );
    // The source is reused at once: the peer must still get the original bytes.
    write_a(&mut p, 0, &[0xee; 200]);
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(read_b(&mut p, 0, 200), original);
    // The same bogus lkey without INLINE is refused at post time.
    let qa = p.qa;
    let err = p
        .a()
        .post_send(
            qa,
            &SendWr {
                wr_id: 2,
                op: WrOp::Send,
                sg_list: vec![bogus],
                flags: SendFlags::SIGNALED,
                ud: None,
            },
        )
        .unwrap_err();
    assert!(matches!(err, EngineError::InvalidWr(_)), "{err:?}");
}

#[test]
fn inline_write_from_a_callers_slice() {
    let mut p = Pair::new(PairOptions::default());
    let mut data = pattern(256, 9);
    let (qa, addr, rkey) = (p.qa, p.mr_b.addr + 4096, p.mr_b.rkey);
    let wr = SendWr {
        wr_id: 1,
        op: WrOp::Write {
            remote_addr: addr,
            rkey,
        },
        sg_list: vec![],
        flags: SendFlags::SIGNALED,
        ud: None,
    };
    p.a().post_send_inline(qa, &wr.borrowed(), &data).unwrap();
    let original = data.clone();
    data.fill(0);
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(read_b(&mut p, 4096, 256), original);
}

#[test]
fn inline_over_max_inline_data_or_on_a_read_is_refused() {
    let mut p = Pair::new(PairOptions::default());
    let qa = p.qa;
    let max = QpCaps::default().max_inline_data;
    let too_long = Sge {
        lkey: 0,
        ..p.sge_a(0, max + 1)
    };
    let wr = |op, sge| SendWr {
        wr_id: 1,
        op,
        sg_list: vec![sge],
        flags: SendFlags::SIGNALED | SendFlags::INLINE,
        ud: None,
    };
    let err = p.a().post_send(qa, &wr(WrOp::Send, too_long)).unwrap_err();
    assert_eq!(
        err,
        EngineError::LimitExceeded {
            what: "max_inline_data",
            requested: max as u64 + 1,
            max: max as u64,
        }
    );
    let slice = vec![0u8; max as usize + 1];
    let send = wr(WrOp::Send, too_long);
    let err = p
        .a()
        .post_send_inline(qa, &send.borrowed(), &slice)
        .unwrap_err();
    assert!(matches!(err, EngineError::LimitExceeded { .. }), "{err:?}");
    // Exactly max_inline_data is fine.
    let exact = p.sge_a(0, max);
    p.post_recv_b(1, 0, 4096);
    p.a().post_send(qa, &wr(WrOp::Send, exact)).unwrap();
    let read = WrOp::Read {
        remote_addr: p.mr_b.addr,
        rkey: p.mr_b.rkey,
    };
    let eight = p.sge_a(0, 8);
    let err = p.a().post_send(qa, &wr(read, eight)).unwrap_err();
    assert!(matches!(err, EngineError::InvalidWr(_)), "{err:?}");
    // An inline SGE outside every region has no bytes to copy.
    let nowhere = Sge {
        addr: 0x10,
        length: 8,
        lkey: 0,
    };
    let err = p.a().post_send(qa, &wr(WrOp::Send, nowhere)).unwrap_err();
    assert!(matches!(err, EngineError::InvalidWr(_)), "{err:?}");
    let wcs = p.run_for_completions(1, SEC);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success);
}

#[test]
fn inline_is_invisible_on_the_wire() {
    let frames = |flags: SendFlags| {
        let mut p = Pair::new(PairOptions::default());
        write_a(&mut p, 0, &pattern(100, 3));
        p.post_recv_b(1, 0, 4096);
        let log = record(&mut p);
        let t = trace(&mut p);
        let s = p.sge_a(0, 100);
        post(&mut p, 1, WrOp::Send, vec![s], SendFlags::SIGNALED | flags);
        p.run_for_completions(1, SEC);
        println!("flags {flags:?}:\n{}", t.text());
        let out: Vec<Vec<u8>> = log.borrow().iter().map(|s| s.bytes.clone()).collect();
        out
    };
    let plain = frames(SendFlags::empty());
    assert_eq!(plain.len(), 2, "SEND_ONLY and its ACK");
    assert_eq!(frames(SendFlags::INLINE), plain);
}

// ----- solicited events -----

#[test]
fn solicited_sets_se_on_the_last_packet_only() {
    let mut p = Pair::new(PairOptions::default());
    let log = record(&mut p);
    let t = trace(&mut p);
    p.post_recv_b(1, 0, 8192);
    let s = p.sge_a(0, 3000);
    post(
        &mut p,
        1,
        WrOp::Send,
        vec![s],
        SendFlags::SIGNALED | SendFlags::SOLICITED,
    );
    let op = WrOp::WriteWithImm {
        remote_addr: p.mr_b.addr + 65536,
        rkey: p.mr_b.rkey,
        imm: 5,
    };
    p.post_recv_b(2, 0, 8192);
    post(
        &mut p,
        2,
        op,
        vec![s],
        SendFlags::SIGNALED | SendFlags::SOLICITED,
    );
    // Unsolicited: no SE anywhere.
    p.post_recv_b(3, 0, 8192);
    post(&mut p, 3, WrOp::Send, vec![s], SendFlags::SIGNALED);
    let wcs = p.run_for_completions(3, SEC);
    assert_eq!(wcs.len(), 3);
    println!("{}", t.text());
    assert_eq!(t.text().matches(" se").count(), 2, "{}", t.text());
    let requests: Vec<(Opcode, bool)> = log
        .borrow()
        .iter()
        .filter(|s| s.from == 0)
        .map(|s| (s.opcode, s.solicited))
        .collect();
    assert_eq!(
        requests,
        vec![
            (Opcode::RC_SEND_FIRST, false),
            (Opcode::RC_SEND_MIDDLE, false),
            (Opcode::RC_SEND_LAST, true),
            (Opcode::RC_RDMA_WRITE_FIRST, false),
            (Opcode::RC_RDMA_WRITE_MIDDLE, false),
            (Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, true),
            (Opcode::RC_SEND_FIRST, false),
            (Opcode::RC_SEND_MIDDLE, false),
            (Opcode::RC_SEND_LAST, false),
        ]
    );
}

#[test]
fn solicited_only_arm_fires_for_solicited_and_error_completions() {
    let mut p = Pair::new(PairOptions::default());
    let cq = p.cq_b;
    let s = p.sge_a(0, 64);
    p.b().req_notify_cq(cq, true).unwrap();
    // An unsolicited SEND completes at B without an event.
    p.post_recv_b(1, 0, 4096);
    post(&mut p, 1, WrOp::Send, vec![s], SendFlags::SIGNALED);
    p.run_for_completions(1, SEC);
    let b = p.b();
    assert!(!events(b).contains(&Event::CqNotify(cq)));
    assert_eq!(drain(b, cq).len(), 1);
    // A solicited one raises it.
    p.post_recv_b(2, 0, 4096);
    post(
        &mut p,
        2,
        WrOp::Send,
        vec![s],
        SendFlags::SIGNALED | SendFlags::SOLICITED,
    );
    p.run_for_completions(1, SEC);
    assert!(events(p.b()).contains(&Event::CqNotify(cq)));
    // The arm is used up: another solicited SEND raises nothing until re-armed.
    p.post_recv_b(3, 0, 4096);
    post(
        &mut p,
        3,
        WrOp::Send,
        vec![s],
        SendFlags::SIGNALED | SendFlags::SOLICITED,
    );
    p.run_for_completions(1, SEC);
    assert!(!events(p.b()).contains(&Event::CqNotify(cq)));
    // Re-armed solicited-only: an unsolicited SEND into a too-small receive completes in
    // error at B (Local Length Error), and an error completion always raises the event.
    drain(p.b(), cq);
    p.b().req_notify_cq(cq, true).unwrap();
    p.post_recv_b(4, 0, 8);
    post(&mut p, 4, WrOp::Send, vec![s], SendFlags::SIGNALED);
    p.run_for_completions(1, SEC);
    let wcs = drain(p.b(), cq);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::LocLenErr);
    assert!(events(p.b()).contains(&Event::CqNotify(cq)));
}

// ----- fence -----

/// The order of A's request opcodes and B's READ response, with a 10 µs link.
fn read_then_send(fence: bool) -> Vec<(usize, Opcode)> {
    let mut p = Pair::new(PairOptions {
        link: LinkConfig {
            latency: Duration::from_micros(10),
            ..LinkConfig::default()
        },
        ..PairOptions::default()
    });
    let log = record(&mut p);
    let t = trace(&mut p);
    p.post_recv_b(1, 0, 4096);
    let read = WrOp::Read {
        remote_addr: p.mr_b.addr + 8192,
        rkey: p.mr_b.rkey,
    };
    let s = p.sge_a(0, 512);
    post(&mut p, 1, read, vec![s], SendFlags::SIGNALED);
    let flags = if fence {
        SendFlags::SIGNALED | SendFlags::FENCE
    } else {
        SendFlags::SIGNALED
    };
    let s = p.sge_a(4096, 64);
    post(&mut p, 2, WrOp::Send, vec![s], flags);
    let wcs = p.run_for_completions(2, SEC);
    assert_eq!(wcs.len(), 2);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    println!("fence {fence}:\n{}", t.text());
    let order: Vec<(usize, Opcode)> = log
        .borrow()
        .iter()
        .filter(|s| s.opcode != Opcode::RC_ACKNOWLEDGE)
        .map(|s| (s.from, s.opcode))
        .collect();
    order
}

#[test]
fn fenced_send_after_a_read_waits_for_the_read_response() {
    assert_eq!(
        read_then_send(true),
        vec![
            (0, Opcode::RC_RDMA_READ_REQUEST),
            (1, Opcode::RC_RDMA_READ_RESPONSE_ONLY),
            (0, Opcode::RC_SEND_ONLY),
        ]
    );
    // Without the fence the SEND follows the READ request at once.
    assert_eq!(
        read_then_send(false),
        vec![
            (0, Opcode::RC_RDMA_READ_REQUEST),
            (0, Opcode::RC_SEND_ONLY),
            (1, Opcode::RC_RDMA_READ_RESPONSE_ONLY),
        ]
    );
}

/// A's request opcodes, in the order they left, for `first` then a fenced SEND.
fn first_then_fenced_send(first: impl Fn(&Pair) -> (WrOp, u32)) -> Vec<Opcode> {
    let mut p = Pair::new(PairOptions {
        link: LinkConfig {
            latency: Duration::from_micros(10),
            ..LinkConfig::default()
        },
        ..PairOptions::default()
    });
    let log = record(&mut p);
    p.post_recv_b(1, 0, 4096);
    let (op, len) = first(&p);
    let s = p.sge_a(0, len);
    post(&mut p, 1, op, vec![s], SendFlags::SIGNALED);
    let s = p.sge_a(4096, 64);
    post(
        &mut p,
        2,
        WrOp::Send,
        vec![s],
        SendFlags::SIGNALED | SendFlags::FENCE,
    );
    let wcs = p.run_for_completions(2, SEC);
    assert!(wcs.len() == 2 && wcs.iter().all(|w| w.status == WcStatus::Success));
    let order: Vec<Opcode> = log
        .borrow()
        .iter()
        .filter(|s| s.opcode != Opcode::RC_ACKNOWLEDGE)
        .map(|s| s.opcode)
        .collect();
    order
}

#[test]
fn fence_waits_for_an_atomic_but_not_for_a_write() {
    let fadd = |p: &Pair| {
        let op = WrOp::FetchAdd {
            remote_addr: p.mr_b.addr + 64,
            rkey: p.mr_b.rkey,
            add: 1,
        };
        (op, 8)
    };
    assert_eq!(
        first_then_fenced_send(fadd),
        vec![
            Opcode::RC_FETCH_ADD,
            Opcode::RC_ATOMIC_ACKNOWLEDGE,
            Opcode::RC_SEND_ONLY
        ]
    );
    // IBTA's fence is about READ and atomics only: a fenced SEND does not wait for an
    // earlier WRITE's ACK (rxe's stricter requester would).
    let write = |p: &Pair| {
        let op = WrOp::Write {
            remote_addr: p.mr_b.addr + 8192,
            rkey: p.mr_b.rkey,
        };
        (op, 512)
    };
    assert_eq!(
        first_then_fenced_send(write),
        vec![Opcode::RC_RDMA_WRITE_ONLY, Opcode::RC_SEND_ONLY]
    );
}

// ----- resizing a CQ -----

#[test]
fn resize_cq_keeps_its_completions_and_refuses_to_drop_any() {
    let mut p = Pair::new(PairOptions::default());
    let cq = p.cq_a;
    for i in 0..5 {
        p.post_recv_b(i, 0, 4096);
        let s = p.sge_a(0, 16);
        post(&mut p, i, WrOp::Send, vec![s], SendFlags::SIGNALED);
    }
    let deadline = p.net.now() + SEC;
    p.net
        .run_until(deadline, |n| n.engines[0].cq_len(cq).unwrap_or(0) >= 5);
    let a = p.a();
    assert_eq!(a.cq_len(cq).unwrap(), 5);
    assert_eq!(
        a.resize_cq(cq, 4),
        Err(EngineError::CqTooSmall {
            held: 5,
            requested: 4
        })
    );
    assert!(matches!(
        a.resize_cq(cq, 0),
        Err(EngineError::LimitExceeded { what: "cqe", .. })
    ));
    assert!(matches!(
        a.resize_cq(cq, limits::MAX_CQE + 1),
        Err(EngineError::LimitExceeded { what: "cqe", .. })
    ));
    assert_eq!(a.cq_depth(cq).unwrap(), 4096);
    a.resize_cq(cq, 6).unwrap();
    assert_eq!(a.cq_depth(cq).unwrap(), 6);
    // One more fits; the next overflows the new depth (CQ error).
    for i in 5..7 {
        p.post_recv_b(i, 0, 4096);
        let s = p.sge_a(0, 16);
        post(&mut p, i, WrOp::Send, vec![s], SendFlags::SIGNALED);
    }
    p.run_idle(SEC);
    let a = p.a();
    assert!(events(a).contains(&Event::CqError(cq)));
    let ids: Vec<u64> = drain(a, cq).iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, vec![0, 1, 2, 3, 4, 5]);
}

#[test]
fn resize_cq_on_one_shard_is_seen_by_the_others() {
    let cfg = EngineConfig::new([2, 0, 0, 0, 0, 1], IpAddr::V4([198, 18, 0, 1].into()));
    let mut shards = Engine::new_shards(cfg, 2);
    let cq = shards[0].create_cq(16).unwrap();
    shards[1].resize_cq(cq, 1000).unwrap();
    assert_eq!(shards[0].cq_depth(cq).unwrap(), 1000);
    shards[0].destroy_cq(cq).unwrap();
    assert_eq!(shards[1].resize_cq(cq, 10), Err(EngineError::UnknownCq(cq)));
}
