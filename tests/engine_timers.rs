//! The engine's timer queue with many QPs: `poll_timeout` finds the one armed timer among
//! 1,024 QPs, and `handle_timeout` visits only the QP whose timer expired.
use std::time::Duration;

use xroce::engine::*;
use xroce::sim::workload::{connect, WorkloadConfig, IP_A, IP_B, MAC_A, MAC_B};

/// An engine with `n` RC QPs in RTS, all connected to (absent) QPs at B; nothing posted.
fn engine_with_qps(n: u32, cfg: &WorkloadConfig) -> (Engine, Vec<u32>, MrInfo) {
    let mut e = Engine::new(EngineConfig::new(MAC_A, IP_A.into()));
    let pd = e.alloc_pd();
    let cq = e.create_cq(4096).unwrap();
    let mr = e.reg_mr(pd, 4096, Access::LOCAL_WRITE).unwrap();
    let init = QpInit {
        qp_type: QpType::Rc,
        pd,
        send_cq: cq,
        recv_cq: cq,
        caps: QpCaps::default(),
        sq_sig_all: true,
        srq: None,
    };
    let qpns = (0..n)
        .map(|i| {
            let qpn = e.create_qp(init).unwrap();
            connect(&mut e, qpn, 0x1000 + i, MAC_B, IP_B, 0, 0, cfg).unwrap();
            qpn
        })
        .collect();
    (e, qpns, mr)
}

fn write_wr(mr: &MrInfo) -> SendWr {
    SendWr {
        wr_id: 1,
        op: WrOp::Write {
            remote_addr: 0x1000,
            rkey: 0x42,
        },
        sg_list: vec![Sge {
            addr: mr.addr,
            length: 64,
            lkey: mr.lkey,
        }],
        flags: SendFlags::SIGNALED,
        ud: None,
    }
}

#[test]
fn one_armed_timer_among_1024_qps() {
    let cfg = WorkloadConfig::default();
    let timeout = timers::local_ack_timeout(cfg.timeout).unwrap();
    let (mut e, qpns, mr) = engine_with_qps(1024, &cfg);
    assert_eq!(e.poll_timeout(), None);

    let armed = qpns[700];
    e.post_send(armed, &write_wr(&mr)).unwrap();
    let t0 = Instant::ZERO + Duration::from_millis(5);
    let mut buf = vec![0; MAX_FRAME_LEN];
    assert!(e.poll_transmit(t0, &mut buf).is_some());
    assert!(e.poll_transmit(t0, &mut buf).is_none());
    let deadline = t0 + timeout;
    assert_eq!(e.poll_timeout(), Some(deadline));

    // Not yet due: no QP is visited.
    e.handle_timeout(deadline - Duration::from_nanos(1));
    assert_eq!(e.timer_visits(), 0);
    assert_eq!(e.counters().local_ack_timeout_err, 0);

    // Due: the one QP is visited, not the 1,024.
    e.handle_timeout(deadline);
    assert_eq!(e.timer_visits(), 1);
    assert_eq!(e.counters().local_ack_timeout_err, 1);
    // The retry re-armed the timer and resends the WRITE.
    assert_eq!(e.poll_timeout(), Some(deadline + timeout));
    assert!(e.poll_transmit(deadline, &mut buf).is_some());
    assert_eq!(e.counters().retransmitted_packets, 1);

    // A destroyed QP leaves no timer behind.
    e.destroy_qp(armed).unwrap();
    assert_eq!(e.poll_timeout(), None);
    e.handle_timeout(deadline + timeout * 10);
    assert_eq!(e.timer_visits(), 1);
}

#[test]
fn timers_fire_in_deadline_order_and_only_when_due() {
    let cfg = WorkloadConfig::default();
    let timeout = timers::local_ack_timeout(cfg.timeout).unwrap();
    let (mut e, qpns, mr) = engine_with_qps(64, &cfg);
    let mut buf = vec![0; MAX_FRAME_LEN];
    // Three QPs armed 1 ms apart, in reverse QPN order.
    let picked = [qpns[50], qpns[20], qpns[3]];
    for (i, &qpn) in picked.iter().enumerate() {
        let now = Instant::ZERO + Duration::from_millis(i as u64);
        e.post_send(qpn, &write_wr(&mr)).unwrap();
        while e.poll_transmit(now, &mut buf).is_some() {}
    }
    let first = Instant::ZERO + timeout;
    assert_eq!(e.poll_timeout(), Some(first));
    e.handle_timeout(first + Duration::from_micros(1_500));
    // The first two expired, the third (armed at 2 ms) did not.
    assert_eq!(e.timer_visits(), 2);
    assert_eq!(e.counters().local_ack_timeout_err, 2);
    assert_eq!(e.poll_timeout(), Some(first + Duration::from_millis(2)));
}
