//! Two agents joined by a simulated link (latency, seeded loss, duplication, reordering, and a
//! filter that drops chosen messages), on a virtual clock, with a "user" on each side that
//! answers events as the rdma_cm layer would.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::Ipv4Addr;
use std::time::Duration;

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::agent::*;
use super::*;
use crate::wire::addr::Gid;
use crate::wire::cm::*;

const A: usize = 0;
const B: usize = 1;
const SERVICE: u64 = 0x0106_0000_0000_4e20;
const LATENCY: Duration = Duration::from_micros(10);
const PACKET_LIFE: u8 = 10;
const GUID: [u64; 2] = [0xa0a0_0000_0000_0001, 0xb0b0_0000_0000_0002];

fn t(us: u64) -> Instant {
    Instant::from_nanos(us * 1000)
}

fn config(side: usize) -> CmConfig {
    CmConfig {
        local_ca_guid: GUID[side],
        packet_life_time: PACKET_LIFE,
        local_cm_response_timeout: 12,
        duplicate_req_mra_timeout: 14,
        first_comm_id: 0x1000 * (side as u32 + 1),
        first_tid: 0x100 * (side as u64 + 1),
        ..CmConfig::default()
    }
}

fn peer(side: usize) -> MadPeer {
    MadPeer {
        gid: Gid::from_ip(Ipv4Addr::new(198, 18, 0, side as u8 + 1).into()),
        qpn: 1,
        pkey_index: 0,
        mac: None,
    }
}

/// The REQ resend interval of A: 2 × packet lifetime + 4.096 µs × 2^response_timeout.
fn req_interval(response_timeout: u8) -> Duration {
    iba_time(PACKET_LIFE) * 2 + iba_time(response_timeout)
}

#[derive(Clone, Copy)]
struct Auto {
    accept: bool,
    rtu: bool,
    answer_dreq: bool,
    disconnect_when_established: bool,
}

const AUTO: Auto = Auto {
    accept: true,
    rtu: true,
    answer_dreq: true,
    disconnect_when_established: false,
};

struct Sent {
    at: Instant,
    from: usize,
    message: CmMessage,
    bytes: Vec<u8>,
    dropped: bool,
}

type Filter = Box<dyn FnMut(usize, &CmMessage) -> bool>;

/// A MAD on the link: (arrival, sequence for ties, receiving side, bytes).
type InFlight = Reverse<(Instant, u64, usize, Vec<u8>)>;

struct Sim {
    now: Instant,
    agents: [CmAgent; 2],
    loss: f64,
    duplicate: f64,
    reorder: f64,
    rng: ChaCha8Rng,
    flight: BinaryHeap<InFlight>,
    seq: u64,
    log: Vec<Sent>,
    events: [Vec<(Instant, CmEvent)>; 2],
    /// Returns true for a message to drop.
    filter: Option<Filter>,
    auto: [Auto; 2],
    next_qpn: [u32; 2],
}

impl Sim {
    fn new() -> Sim {
        Sim::lossy(0, 0.0, 0.0, 0.0)
    }

    fn lossy(seed: u64, loss: f64, duplicate: f64, reorder: f64) -> Sim {
        let mut agents = [CmAgent::new(config(A)), CmAgent::new(config(B))];
        agents[B].listen(SERVICE, None).unwrap();
        Sim {
            now: Instant::ZERO,
            agents,
            loss,
            duplicate,
            reorder,
            rng: ChaCha8Rng::seed_from_u64(seed),
            flight: BinaryHeap::new(),
            seq: 0,
            log: Vec::new(),
            events: [Vec::new(), Vec::new()],
            filter: None,
            auto: [AUTO; 2],
            next_qpn: [0x100, 0x200],
        }
    }

    fn drop_when(&mut self, f: impl FnMut(usize, &CmMessage) -> bool + 'static) {
        self.filter = Some(Box::new(f));
    }

    fn request(&mut self) -> ConnectRequest {
        let qpn = self.next_qpn[A];
        self.next_qpn[A] += 1;
        ConnectRequest {
            to: peer(B),
            service_id: SERVICE,
            local_gid: peer(A).gid,
            remote_gid: peer(B).gid,
            qpn,
            starting_psn: 0x1234,
            cm_response_timeout: 12,
            max_cm_retries: 15,
            private_data: b"hello".to_vec(),
            ..ConnectRequest::default()
        }
    }

    fn connect(&mut self) -> ConnId {
        let request = self.request();
        self.agents[A].connect(self.now, request).unwrap()
    }

    fn reply(&mut self) -> ReplyParams {
        let qpn = self.next_qpn[B];
        self.next_qpn[B] += 1;
        ReplyParams {
            qpn,
            starting_psn: 0x5678,
            target_ack_delay: 8,
            rnr_retry_count: 7,
            private_data: b"welcome".to_vec(),
            ..ReplyParams::default()
        }
    }

    /// Hand events to the users, who answer as told by `auto`.
    fn users(&mut self) {
        for side in [A, B] {
            while let Some(event) = self.agents[side].poll_event() {
                let now = self.now;
                let auto = self.auto[side];
                match &event {
                    CmEvent::ReqReceived { conn, .. } if auto.accept => {
                        let params = self.reply();
                        self.agents[side].accept(now, *conn, params).unwrap();
                    }
                    CmEvent::RepReceived { conn, .. } if auto.rtu => {
                        self.agents[side].send_rtu(now, *conn, b"rtu").unwrap();
                    }
                    CmEvent::DisconnectRequested { conn, .. } if auto.answer_dreq => {
                        self.agents[side].disconnect(now, *conn, b"bye").unwrap();
                    }
                    CmEvent::Established { conn } if auto.disconnect_when_established => {
                        // The state may have moved on (DREQ already received).
                        let _ = self.agents[side].disconnect(now, *conn, &[]);
                    }
                    _ => {}
                }
                self.events[side].push((now, event));
            }
        }
    }

    fn flush(&mut self) {
        for side in [A, B] {
            while let Some(out) = self.agents[side].poll_transmit() {
                assert_eq!(out.to.gid, peer(1 - side).gid, "sent to the wrong peer");
                let mad = CmMad::parse(&out.bytes).expect("the agent's own MADs parse");
                let mut dropped = self.rng.gen_bool(self.loss);
                if let Some(filter) = self.filter.as_mut() {
                    dropped |= filter(side, &mad.message);
                }
                self.log.push(Sent {
                    at: self.now,
                    from: side,
                    message: mad.message,
                    bytes: out.bytes.clone(),
                    dropped,
                });
                if dropped {
                    continue;
                }
                let mut delay = LATENCY;
                if self.rng.gen_bool(self.reorder) {
                    delay += Duration::from_micros(self.rng.gen_range(1..50));
                }
                self.seq += 1;
                self.flight.push(Reverse((
                    self.now + delay,
                    self.seq,
                    1 - side,
                    out.bytes.clone(),
                )));
                if self.rng.gen_bool(self.duplicate) {
                    self.seq += 1;
                    let later = self.now + delay + Duration::from_micros(3);
                    self.flight
                        .push(Reverse((later, self.seq, 1 - side, out.bytes)));
                }
            }
        }
    }

    fn settle_now(&mut self) {
        loop {
            self.users();
            self.flush();
            if self
                .agents
                .iter()
                .all(|a| a.transmit.is_empty() && a.events.is_empty())
            {
                return;
            }
        }
    }

    fn next_time(&self) -> Option<Instant> {
        let arrival = self.flight.peek().map(|Reverse((at, ..))| *at);
        let timers = self.agents.iter().filter_map(|a| a.poll_timeout());
        arrival.into_iter().chain(timers).min()
    }

    /// Advance to the next thing that happens; false when nothing is left.
    fn step(&mut self, limit: Option<Instant>) -> bool {
        self.settle_now();
        let Some(next) = self.next_time() else {
            return false;
        };
        if limit.is_some_and(|l| next > l) {
            return false;
        }
        assert!(next >= self.now, "time went backwards");
        self.now = next;
        while self
            .flight
            .peek()
            .is_some_and(|Reverse((at, ..))| *at <= self.now)
        {
            let Reverse((_, _, to, bytes)) = self.flight.pop().unwrap();
            self.agents[to].handle_mad(self.now, peer(1 - to), &bytes);
        }
        for agent in &mut self.agents {
            if agent.poll_timeout().is_some_and(|d| d <= self.now) {
                agent.handle_timeout(self.now);
            }
        }
        true
    }

    /// Run until nothing is left to happen (no MAD in flight, no timer).
    fn run(&mut self) {
        for _ in 0..2_000_000 {
            if !self.step(None) {
                return;
            }
        }
        panic!("the simulation did not settle");
    }

    fn run_until(&mut self, until: Instant) {
        while self.step(Some(until)) {}
        self.now = self.now.max(until);
        self.settle_now();
    }

    fn sent_times(&self, from: usize, name: &str) -> Vec<Instant> {
        self.log
            .iter()
            .filter(|s| s.from == from && message_name(&s.message) == name)
            .map(|s| s.at)
            .collect()
    }

    fn events_of(&self, side: usize) -> Vec<CmEvent> {
        self.events[side].iter().map(|(_, e)| e.clone()).collect()
    }

    fn event_time(&self, side: usize, f: impl Fn(&CmEvent) -> bool) -> Option<Instant> {
        self.events[side]
            .iter()
            .find(|(_, e)| f(e))
            .map(|(at, _)| *at)
    }

    fn count(&self, side: usize, f: impl Fn(&CmEvent) -> bool) -> usize {
        self.events[side].iter().filter(|(_, e)| f(e)).count()
    }

    fn passive_conn(&self) -> ConnId {
        self.events[B]
            .iter()
            .find_map(|(_, e)| match e {
                CmEvent::ReqReceived { conn, .. } => Some(*conn),
                _ => None,
            })
            .expect("B got a REQ")
    }
}

fn message_name(m: &CmMessage) -> &'static str {
    crate::wire::cm::attribute_name(m.attribute_id()).unwrap_or("?")
}

fn is_established(e: &CmEvent) -> bool {
    matches!(e, CmEvent::Established { .. })
}

#[test]
fn iba_time_is_4096ns_times_two_to_the_exponent() {
    assert_eq!(iba_time(0), Duration::from_nanos(4096));
    assert_eq!(iba_time(10), Duration::from_nanos(4_194_304));
    assert_eq!(iba_time(31), iba_time(200));
}

#[test]
fn handshake_and_teardown_at_exact_times() {
    let mut sim = Sim::new();
    let conn = sim.connect();
    sim.run_until(t(1000));
    // REQ at 0 reaches B at 10 µs, REP at 20 µs, RTU at 30 µs.
    let b = sim.passive_conn();
    assert_eq!(sim.sent_times(A, "REQ"), vec![t(0)]);
    assert_eq!(sim.sent_times(B, "REP"), vec![t(10)]);
    assert_eq!(sim.sent_times(A, "RTU"), vec![t(20)]);
    assert_eq!(sim.event_time(A, is_established), Some(t(20)));
    assert_eq!(sim.event_time(B, is_established), Some(t(30)));
    match &sim.events[B][0].1 {
        CmEvent::ReqReceived { req, from, .. } => {
            assert_eq!(req.service_id, SERVICE);
            assert_eq!(req.local_qpn, 0x100);
            assert_eq!(req.starting_psn, 0x1234);
            assert_eq!(req.local_ca_guid, GUID[A]);
            assert_eq!(&req.private_data.as_bytes()[..5], b"hello");
            assert_eq!(req.primary_path.remote_gid, peer(B).gid.0);
            assert_eq!(from.gid, peer(A).gid);
        }
        other => panic!("{other:?}"),
    }
    match &sim.events[A][0].1 {
        CmEvent::RepReceived { rep, .. } => {
            assert_eq!(rep.local_qpn, 0x200);
            assert_eq!(rep.starting_psn, 0x5678);
            assert_eq!(rep.remote_comm_id, conn.0);
            assert_eq!(rep.local_comm_id, b.0);
            assert_eq!(&rep.private_data.as_bytes()[..7], b"welcome");
        }
        other => panic!("{other:?}"),
    }
    // The REQ, REP and RTU are one transaction; the DREQ/DREP another.
    let tids: Vec<u64> = sim
        .log
        .iter()
        .map(|s| CmMad::parse(&s.bytes).unwrap().header.transaction_id)
        .collect();
    assert!(tids.iter().all(|&tid| tid == tids[0]));

    sim.agents[A].disconnect(sim.now, conn, b"done").unwrap();
    sim.run();
    let dreq_tid = CmMad::parse(&sim.log[3].bytes)
        .unwrap()
        .header
        .transaction_id;
    assert_ne!(dreq_tid, tids[0]);
    assert_eq!(
        CmMad::parse(&sim.log[4].bytes)
            .unwrap()
            .header
            .transaction_id,
        dreq_tid
    );
    let requested = sim.event_time(B, |e| matches!(e, CmEvent::DisconnectRequested { .. }));
    assert_eq!(requested, Some(t(1010)));
    assert_eq!(
        sim.event_time(A, |e| matches!(
            e,
            CmEvent::Disconnected {
                timed_out: false,
                ..
            }
        )),
        Some(t(1020))
    );
    // Time wait: 2 × packet lifetime + the target ACK delay of the REP (8) on both sides.
    let time_wait = iba_time(PACKET_LIFE) * 2 + iba_time(8);
    assert_eq!(
        sim.event_time(A, |e| matches!(e, CmEvent::TimewaitExit { .. })),
        Some(t(1020) + time_wait)
    );
    assert_eq!(
        sim.event_time(B, |e| matches!(e, CmEvent::TimewaitExit { .. })),
        Some(t(1010) + time_wait)
    );
    assert_eq!(sim.agents[A].connection_count(), 0);
    assert_eq!(sim.agents[B].connection_count(), 0);
    assert_eq!(sim.agents[A].stats().retransmits, 0);
    assert_eq!(sim.agents[B].stats().retransmits, 0);
}

#[test]
fn req_resent_max_cm_retries_times_then_timeout_and_rej() {
    let mut sim = Sim::new();
    sim.drop_when(|from, _| from == A);
    let mut request = sim.request();
    request.max_cm_retries = 3;
    let conn = sim.agents[A].connect(Instant::ZERO, request).unwrap();
    sim.run();
    let every = req_interval(12);
    let zero = Instant::ZERO;
    assert_eq!(
        sim.sent_times(A, "REQ"),
        vec![zero, zero + every, zero + every * 2, zero + every * 3]
    );
    assert_eq!(
        sim.event_time(A, |e| matches!(e, CmEvent::Timeout { .. })),
        Some(zero + every * 4)
    );
    assert_eq!(sim.events_of(A), vec![CmEvent::Timeout { conn }]);
    let rej = sim.log.last().unwrap();
    assert_eq!(rej.at, zero + every * 4);
    match rej.message {
        CmMessage::Rej(rej) => {
            assert_eq!(rej.reason, RejectReason::Timeout);
            assert_eq!(rej.ari_bytes(), GUID[A].to_be_bytes());
            assert_eq!(rej.local_comm_id, conn.0);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(sim.agents[A].stats().retransmits, 3);
    assert_eq!(sim.agents[A].state(conn), None);
}

#[test]
fn duplicate_req_while_the_user_decides_is_answered_with_mra() {
    let mut sim = Sim::new();
    sim.auto[B].accept = false;
    let conn = sim.connect();
    let every = req_interval(12);
    let mra_wait = iba_time(14) + iba_time(PACKET_LIFE);
    sim.run_until(Instant::ZERO + every + mra_wait + LATENCY * 3);
    let mra_arrives = Instant::ZERO + every + LATENCY * 2;
    assert_eq!(
        sim.sent_times(A, "REQ"),
        vec![Instant::ZERO, Instant::ZERO + every, mra_arrives + mra_wait]
    );
    // Each duplicate REQ got the same MRA again.
    assert_eq!(sim.sent_times(B, "MRA").len(), 2);
    assert_eq!(
        sim.event_time(A, |e| matches!(e, CmEvent::MraReceived { .. })),
        Some(mra_arrives)
    );
    assert_eq!(
        sim.count(A, |e| matches!(e, CmEvent::MraReceived { .. })),
        1
    );
    assert_eq!(
        sim.count(B, |e| matches!(e, CmEvent::ReqReceived { .. })),
        1
    );
    assert_eq!(sim.agents[A].state(conn), Some(State::MraReqRcvd));
    let b = sim.passive_conn();
    assert_eq!(sim.agents[B].state(b), Some(State::MraReqSent));
    let params = sim.reply();
    sim.agents[B].accept(sim.now, b, params).unwrap();
    sim.run_until(sim.now + Duration::from_millis(1));
    assert_eq!(sim.agents[A].state(conn), Some(State::Established));
    assert_eq!(sim.agents[B].state(b), Some(State::Established));
}

#[test]
fn duplicate_req_after_rep_gets_the_rep_again() {
    let mut sim = Sim::new();
    let mut first_rep = true;
    sim.drop_when(move |_, m| matches!(m, CmMessage::Rep(_)) && std::mem::take(&mut first_rep));
    let mut request = sim.request();
    // A's REQ timer (11) runs out before B's REP timer (A's local response timeout, 12).
    request.cm_response_timeout = 11;
    let conn = sim.agents[A].connect(Instant::ZERO, request).unwrap();
    sim.run_until(t(100_000));
    let again = Instant::ZERO + req_interval(11);
    assert_eq!(sim.sent_times(A, "REQ"), vec![Instant::ZERO, again]);
    assert_eq!(sim.sent_times(B, "REP"), vec![t(10), again + LATENCY]);
    assert_eq!(sim.agents[B].stats().duplicate_answers, 1);
    assert_eq!(sim.event_time(B, is_established), Some(again + LATENCY * 3));
    assert_eq!(sim.agents[A].state(conn), Some(State::Established));
}

#[test]
fn lost_rtu_rep_resent_and_rtu_sent_again() {
    let mut sim = Sim::new();
    let mut first_rtu = true;
    sim.drop_when(move |_, m| matches!(m, CmMessage::Rtu(_)) && std::mem::take(&mut first_rtu));
    sim.connect();
    sim.run_until(t(100_000));
    let rep_again = t(10) + req_interval(12);
    assert_eq!(sim.sent_times(B, "REP"), vec![t(10), rep_again]);
    assert_eq!(sim.sent_times(A, "RTU"), vec![t(20), rep_again + LATENCY]);
    assert_eq!(sim.agents[A].stats().duplicate_answers, 1);
    assert_eq!(
        sim.event_time(B, is_established),
        Some(rep_again + LATENCY * 2)
    );
    assert_eq!(sim.count(A, is_established), 1);
}

#[test]
fn first_data_establishes_without_rtu_and_stops_rep_resends() {
    let mut sim = Sim::new();
    sim.drop_when(|_, m| matches!(m, CmMessage::Rtu(_)));
    let conn = sim.connect();
    sim.run_until(t(100));
    let b = sim.passive_conn();
    assert_eq!(sim.agents[B].state(b), Some(State::RepSent));
    sim.agents[B].establish(sim.now, b).unwrap();
    sim.agents[B].establish(sim.now, b).unwrap();
    sim.run_until(t(1_000_000));
    assert_eq!(sim.event_time(B, is_established), Some(t(100)));
    assert_eq!(sim.count(B, is_established), 1);
    assert_eq!(sim.sent_times(B, "REP"), vec![t(10)]);
    sim.agents[A].disconnect(sim.now, conn, &[]).unwrap();
    sim.run();
    assert_eq!(
        sim.agents[A].connection_count() + sim.agents[B].connection_count(),
        0
    );
}

#[test]
fn dreq_while_waiting_for_rtu_establishes_then_disconnects() {
    let mut sim = Sim::new();
    sim.drop_when(|_, m| matches!(m, CmMessage::Rtu(_)));
    let conn = sim.connect();
    sim.run_until(t(100));
    sim.agents[A].disconnect(sim.now, conn, &[]).unwrap();
    sim.run();
    let b = sim.events_of(B);
    let established = b.iter().position(is_established).unwrap();
    let requested = b
        .iter()
        .position(|e| matches!(e, CmEvent::DisconnectRequested { .. }))
        .unwrap();
    assert!(established < requested);
    assert_eq!(
        sim.count(A, |e| matches!(
            e,
            CmEvent::Disconnected {
                timed_out: false,
                ..
            }
        )),
        1
    );
    assert_eq!(sim.agents[B].connection_count(), 0);
}

#[test]
fn mra_from_the_user_extends_the_wait_by_its_service_timeout() {
    let mut sim = Sim::new();
    sim.auto[B].accept = false;
    let conn = sim.connect();
    sim.run_until(t(15));
    let b = sim.passive_conn();
    sim.agents[B].send_mra(sim.now, b, 16, b"wait").unwrap();
    // Without the MRA the REQ would go again at `req_interval(12)`.
    let resend = t(25) + iba_time(16) + iba_time(PACKET_LIFE);
    sim.run_until(resend - Duration::from_nanos(1));
    assert_eq!(sim.sent_times(A, "REQ"), vec![Instant::ZERO]);
    match &sim.events[A][0] {
        (
            at,
            CmEvent::MraReceived {
                service_timeout, ..
            },
        ) => {
            assert_eq!(*at, t(25));
            assert_eq!(*service_timeout, iba_time(16));
        }
        other => panic!("{other:?}"),
    }
    sim.run_until(resend);
    assert_eq!(sim.sent_times(A, "REQ"), vec![Instant::ZERO, resend]);
    let params = sim.reply();
    sim.agents[B].accept(sim.now, b, params).unwrap();
    sim.run_until(sim.now + Duration::from_millis(1));
    assert_eq!(sim.agents[A].state(conn), Some(State::Established));
}

fn reject_with(reason: RejectReason) -> Sim {
    let mut sim = Sim::new();
    sim.auto[B].accept = false;
    let conn = sim.connect();
    sim.run_until(t(15));
    let b = sim.passive_conn();
    sim.agents[B]
        .reject(sim.now, b, reason, &[1, 2, 3], b"no")
        .unwrap();
    assert_eq!(sim.agents[B].state(b), None);
    sim.run_until(t(100));
    let events = sim.events_of(A);
    match events.as_slice() {
        [CmEvent::Rejected {
            conn: c,
            reason: r,
            ari,
            private_data,
            from_peer: true,
        }] => {
            assert_eq!(*c, conn);
            assert_eq!(*r, reason);
            assert_eq!(ari, &[1, 2, 3]);
            assert_eq!(&private_data[..2], b"no");
        }
        other => panic!("{reason:?}: {other:?}"),
    }
    sim
}

#[test]
fn every_reject_reason_reaches_the_active_side() {
    for &reason in RejectReason::ALL.iter().chain(&[RejectReason::Unknown(99)]) {
        let mut sim = reject_with(reason);
        let conn = ConnId(0x1000);
        // A stale connection goes to time wait (IBTA 12.9.8.3); any other reason ends it.
        if reason == RejectReason::StaleConnection {
            assert_eq!(sim.agents[A].state(conn), Some(State::TimeWait));
        } else {
            assert_eq!(sim.agents[A].state(conn), None, "{reason:?}");
        }
        sim.run();
        assert_eq!(sim.agents[A].connection_count(), 0);
        assert_eq!(sim.agents[A].stats().retransmits, 0, "{reason:?}");
    }
}

#[test]
fn active_side_rejects_the_rep_and_both_sides_enter_time_wait() {
    let mut sim = Sim::new();
    sim.auto[A].rtu = false;
    let conn = sim.connect();
    sim.run_until(t(25));
    sim.agents[A]
        .reject(
            sim.now,
            conn,
            RejectReason::InsufficientRespResources,
            &[],
            &[],
        )
        .unwrap();
    assert_eq!(sim.agents[A].state(conn), Some(State::TimeWait));
    sim.run_until(t(40));
    let b = sim.passive_conn();
    assert_eq!(sim.agents[B].state(b), Some(State::TimeWait));
    assert!(sim.events_of(B).contains(&CmEvent::Rejected {
        conn: b,
        reason: RejectReason::InsufficientRespResources,
        ari: Vec::new(),
        private_data: vec![0; 148],
        from_peer: true,
    }));
    sim.run();
    assert_eq!(sim.agents[B].connection_count(), 0);
}

#[test]
fn no_listener_is_rejected_with_invalid_service_id() {
    let mut sim = Sim::new();
    let mut request = sim.request();
    request.service_id = SERVICE + 1;
    let conn = sim.agents[A].connect(Instant::ZERO, request).unwrap();
    sim.run();
    assert!(matches!(
        sim.events_of(A).as_slice(),
        [CmEvent::Rejected { conn: c, reason: RejectReason::InvalidServiceId, .. }] if *c == conn
    ));
    assert!(sim.events_of(B).is_empty());
    assert_eq!(sim.agents[A].connection_count(), 0);
}

/// B holds REQs for 100 ms for a listener (`CmConfig::listen_grace`); A connects at time 0
/// to a service B does not listen on yet.
fn connect_before_the_listener() -> (Sim, ConnId) {
    let mut sim = Sim::new();
    sim.agents[B].config.listen_grace = Duration::from_millis(100);
    let mut request = sim.request();
    request.service_id = SERVICE + 1;
    let conn = sim.agents[A].connect(Instant::ZERO, request).unwrap();
    (sim, conn)
}

#[test]
fn a_req_before_its_listener_waits_for_it_within_the_grace() {
    // CmConfig::listen_grace: perftest 4.5's -R server listens for its test QPs a moment
    // after its client connects them; the REQ waits for the listener instead of a REJ.
    let (mut sim, conn) = connect_before_the_listener();
    sim.run_until(t(50_000));
    assert!(sim.events_of(A).is_empty(), "{:?}", sim.events_of(A));
    assert_eq!(sim.agents[B].stats().held_for_listener, 1);
    // The REQ resent meanwhile (the active side's response timer) is the same request.
    assert!(sim.agents[B].stats().dropped_duplicate >= 1);
    sim.agents[B].listen(SERVICE + 1, None).unwrap();
    sim.run();
    assert!(
        sim.events_of(B)
            .iter()
            .any(|e| matches!(e, CmEvent::ReqReceived { .. })),
        "{:?}",
        sim.events_of(B)
    );
    assert_eq!(sim.agents[A].state(conn), Some(State::Established));
    assert_eq!(sim.agents[B].stats().rejects_sent, 0);
}

#[test]
fn a_req_no_listener_comes_for_is_rejected_once_the_grace_ends() {
    let (mut sim, conn) = connect_before_the_listener();
    sim.run_until(t(99_000));
    assert!(sim.events_of(A).is_empty());
    sim.run();
    let rejected_at = sim.events[A].iter().find_map(|(at, e)| match e {
        CmEvent::Rejected {
            conn: c,
            reason: RejectReason::InvalidServiceId,
            ..
        } if *c == conn => Some(*at),
        _ => None,
    });
    assert!(
        rejected_at.is_some_and(|at| at >= t(100_000)),
        "{:?}",
        sim.events_of(A)
    );
    assert_eq!(sim.agents[B].stats().rejects_sent, 1);
    assert!(sim.events_of(B).is_empty());
}

#[test]
fn listeners_with_masks_and_overlaps() {
    let mut agent = CmAgent::new(config(B));
    let ps_tcp = agent.listen(0x0106_0000_0000_0000, Some(!0xffff)).unwrap();
    assert!(matches!(
        agent.listen(0x0106_0000_0000_4e20, None),
        Err(CmError::ServiceIdInUse { .. })
    ));
    let other = agent.listen(0x0111_0000_0000_0001, None).unwrap();
    assert_eq!(agent.find_listener(0x0106_0000_0000_1234), Some(ps_tcp));
    assert_eq!(agent.find_listener(0x0111_0000_0000_0001), Some(other));
    assert_eq!(agent.find_listener(0x0111_0000_0000_0002), None);
    agent.unlisten(ps_tcp).unwrap();
    assert_eq!(agent.unlisten(ps_tcp), Err(CmError::NoSuchListener(ps_tcp)));
    assert_eq!(agent.find_listener(0x0106_0000_0000_1234), None);
}

/// Feed B a MAD made by hand and return what B sends back.
fn answer_to(agent: &mut CmAgent, now: Instant, message: CmMessage) -> Vec<CmMessage> {
    let bytes = CmMad::new(0x77, message).to_bytes().unwrap();
    agent.handle_mad(now, peer(A), &bytes);
    std::iter::from_fn(|| agent.poll_transmit())
        .map(|out| CmMad::parse(&out.bytes).unwrap().message)
        .collect()
}

fn hand_made_req() -> CmReq {
    CmReq {
        local_comm_id: 0x4242,
        service_id: SERVICE,
        local_ca_guid: GUID[A],
        local_qpn: 0x300,
        path_mtu: PathMtu::Mtu1024,
        max_cm_retries: 2,
        remote_cm_response_timeout: 12,
        local_cm_response_timeout: 12,
        ..CmReq::default()
    }
}

fn rej_reason(answers: &[CmMessage]) -> Option<RejectReason> {
    match answers {
        [CmMessage::Rej(rej)] => Some(rej.reason),
        _ => None,
    }
}

#[test]
fn bad_transport_mtu_and_full_table_are_rejected() {
    let mut agent = CmAgent::new(CmConfig {
        max_connections: 1,
        ..config(B)
    });
    agent.listen(SERVICE, None).unwrap();
    let now = Instant::ZERO;
    let rd = CmReq {
        transport_type: TransportType::Rd,
        ..hand_made_req()
    };
    assert_eq!(
        rej_reason(&answer_to(&mut agent, now, CmMessage::Req(rd))),
        Some(RejectReason::InvalidTransportType)
    );
    let mtu = CmReq {
        path_mtu: PathMtu::Reserved(7),
        ..hand_made_req()
    };
    assert_eq!(
        rej_reason(&answer_to(&mut agent, now, CmMessage::Req(mtu))),
        Some(RejectReason::InvalidMtu)
    );
    assert!(answer_to(&mut agent, now, CmMessage::Req(hand_made_req())).is_empty());
    let second = CmReq {
        local_comm_id: 0x4243,
        local_qpn: 0x301,
        ..hand_made_req()
    };
    assert_eq!(
        rej_reason(&answer_to(&mut agent, now, CmMessage::Req(second))),
        Some(RejectReason::NoResources)
    );
    assert_eq!(agent.stats().rejects_sent, 3);
    // The REJ names the REQ's comm id so the peer finds its connection.
    let rd = CmReq {
        transport_type: TransportType::Rd,
        ..hand_made_req()
    };
    match answer_to(&mut agent, now, CmMessage::Req(rd)).as_slice() {
        // A duplicate of the REQ that is waiting for the user: an MRA, not a REJ.
        [CmMessage::Mra(mra)] => assert_eq!(mra.remote_comm_id, 0x4242),
        other => panic!("{other:?}"),
    }
}

#[test]
fn rep_for_no_req_is_rejected_with_invalid_comm_id() {
    let mut agent = CmAgent::new(config(A));
    let rep = CmRep {
        local_comm_id: 9,
        remote_comm_id: 0xdead,
        ..CmRep::default()
    };
    match answer_to(&mut agent, Instant::ZERO, CmMessage::Rep(rep)).as_slice() {
        [CmMessage::Rej(rej)] => {
            assert_eq!(rej.reason, RejectReason::InvalidCommId);
            assert_eq!(rej.remote_comm_id, 9);
        }
        other => panic!("{other:?}"),
    }
    // RTU, MRA, DREP, REJ for nothing: counted drops, no answer.
    let rtu = CmRtu {
        remote_comm_id: 0xdead,
        ..CmRtu::default()
    };
    assert!(answer_to(&mut agent, Instant::ZERO, CmMessage::Rtu(rtu)).is_empty());
    let drep = CmDrep {
        remote_comm_id: 0xdead,
        ..CmDrep::default()
    };
    assert!(answer_to(&mut agent, Instant::ZERO, CmMessage::Drep(drep)).is_empty());
    assert_eq!(agent.stats().dropped_unknown_connection, 3);
    // A DREQ for nothing is answered with DREP, so the peer can finish (IBTA 12.9.6).
    let dreq = CmDreq {
        local_comm_id: 5,
        remote_comm_id: 0xdead,
        ..CmDreq::default()
    };
    match answer_to(&mut agent, Instant::ZERO, CmMessage::Dreq(dreq)).as_slice() {
        [CmMessage::Drep(drep)] => assert_eq!(drep.remote_comm_id, 5),
        other => panic!("{other:?}"),
    }
}

#[test]
fn req_from_a_qpn_in_use_is_stale_but_one_in_time_wait_may_connect_again() {
    let mut sim = Sim::new();
    let first = sim.connect();
    sim.run_until(t(100));
    // Same QP of A, new comm id: B still has a connection with that QP.
    let mut request = sim.request();
    request.qpn = 0x100;
    let second = sim.agents[A].connect(sim.now, request.clone()).unwrap();
    sim.run_until(t(200));
    assert!(sim.events_of(A).contains(&CmEvent::Rejected {
        conn: second,
        reason: RejectReason::StaleConnection,
        ari: Vec::new(),
        private_data: vec![0; 148],
        from_peer: true,
    }));
    assert_eq!(sim.agents[A].state(second), Some(State::TimeWait));
    assert_eq!(sim.agents[A].state(first), Some(State::Established));
    // Closed: B is in time wait with it, but has freed the QPN (as Linux's CM does), so the
    // same QP connects again at once (a restarted program gets the same QPN).
    sim.agents[A].disconnect(sim.now, first, &[]).unwrap();
    sim.run_until(t(300));
    let b = sim.passive_conn();
    assert_eq!(sim.agents[B].state(b), Some(State::TimeWait));
    let third = sim.agents[A].connect(sim.now, request.clone()).unwrap();
    sim.run_until(t(400));
    assert_eq!(sim.agents[A].state(third), Some(State::Established));
    assert_eq!(sim.agents[B].state(b), Some(State::TimeWait));
    assert_eq!(
        sim.count(A, |e| matches!(
            e,
            CmEvent::Rejected {
                reason: RejectReason::StaleConnection,
                ..
            }
        )),
        1
    );
    // And while that new connection lives, its QPN is stale again.
    let fourth = sim.agents[A].connect(sim.now, request).unwrap();
    sim.run_until(t(500));
    assert_eq!(sim.agents[A].state(fourth), Some(State::TimeWait));
    assert_eq!(sim.agents[A].state(third), Some(State::Established));
}

#[test]
fn rep_from_a_qpn_of_an_established_connection_is_stale_and_closes_it() {
    let mut sim = Sim::new();
    let old = sim.connect();
    sim.run_until(t(100));
    // B restarts: a fresh agent that forgot the connection and gives out the same QPN.
    sim.agents[B] = CmAgent::new(CmConfig {
        first_comm_id: 0x9000,
        ..config(B)
    });
    sim.agents[B].listen(SERVICE, None).unwrap();
    sim.next_qpn[B] = 0x200;
    let new = sim.connect();
    sim.run_until(t(200));
    let a = sim.events_of(A);
    assert!(a.contains(&CmEvent::Rejected {
        conn: new,
        reason: RejectReason::StaleConnection,
        ari: Vec::new(),
        private_data: Vec::new(),
        from_peer: false,
    }));
    // The old connection got a DREQ, which the new B answered with DREP.
    assert!(a.contains(&CmEvent::Disconnected {
        conn: old,
        private_data: vec![0; 224],
        timed_out: false,
    }));
    assert!(sim.events_of(B).iter().any(|e| matches!(
        e,
        CmEvent::Rejected {
            reason: RejectReason::StaleConnection,
            ..
        }
    )));
    sim.run();
    assert_eq!(sim.agents[A].connection_count(), 0);
    assert_eq!(sim.agents[B].connection_count(), 0);
}

#[test]
fn duplicate_req_during_time_wait_gets_rej_stale() {
    let mut sim = Sim::new();
    let conn = sim.connect();
    sim.run_until(t(100));
    sim.agents[A].disconnect(sim.now, conn, &[]).unwrap();
    sim.run_until(t(200));
    let req = sim.log[0].bytes.clone();
    sim.agents[B].handle_mad(sim.now, peer(A), &req);
    let out = sim.agents[B].poll_transmit().unwrap();
    match CmMad::parse(&out.bytes).unwrap().message {
        CmMessage::Rej(rej) => {
            assert_eq!(rej.reason, RejectReason::StaleConnection);
            assert_eq!(rej.remote_comm_id, conn.0);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn comm_ids_are_not_reused_while_in_time_wait() {
    let mut sim = Sim::new();
    let first = sim.connect();
    sim.run_until(t(100));
    sim.agents[A].disconnect(sim.now, first, &[]).unwrap();
    sim.run_until(t(200));
    assert_eq!(sim.agents[A].state(first), Some(State::TimeWait));
    sim.auto[A].disconnect_when_established = true;
    // The counter comes round to the id in time wait: it is skipped.
    sim.agents[A].next_comm_id = first.0;
    let second = sim.connect();
    assert_eq!(second.0, first.0 + 1);
    // And 0 is never an id.
    sim.agents[A].next_comm_id = u32::MAX;
    assert_eq!(sim.connect().0, u32::MAX);
    assert_eq!(sim.connect().0, 1);
    sim.run();
    assert_eq!(sim.agents[A].connection_count(), 0);
}

#[test]
fn a_comm_id_prefix_fills_bits_24_to_31_of_every_local_id() {
    // Behind a relay (issue 28) the slot names the process a MAD echoing our id is for.
    let mut sim = Sim::new();
    let slotted = |side: usize, slot: u8| {
        CmAgent::new(CmConfig {
            comm_id_prefix: Some(slot),
            first_comm_id: 0x00ff_fffe,
            ..config(side)
        })
    };
    sim.agents[A] = slotted(A, 3);
    sim.agents[B] = slotted(B, 9);
    sim.agents[B].listen(SERVICE, None).unwrap();
    let ids: Vec<u32> = (0..3).map(|_| sim.connect().0).collect();
    // The low 24 bits count up and wrap; the top byte stays the slot.
    assert_eq!(ids, vec![0x03ff_fffe, 0x03ff_ffff, 0x0300_0000]);
    sim.run_until(t(100));
    // B's REPs carry its slot, and A's RTUs (which echo them) reached it: established.
    for id in &ids {
        assert_eq!(sim.agents[A].state(ConnId(*id)), Some(State::Established));
    }
    let sidr = sim.agents[A]
        .sidr_request(
            sim.now,
            SidrRequest {
                to: peer(B),
                service_id: SERVICE,
                pkey: 0xffff,
                timeout: 12,
                max_retries: 2,
                private_data: Vec::new(),
            },
        )
        .unwrap();
    assert_eq!(sidr.0 >> 24, 3, "{:#x}", sidr.0);
}

#[test]
fn dreq_resent_then_disconnected_timed_out() {
    let mut sim = Sim::new();
    let mut request = sim.request();
    request.max_cm_retries = 2;
    let conn = sim.agents[A].connect(Instant::ZERO, request).unwrap();
    sim.run_until(t(100));
    sim.drop_when(|_, _| true);
    sim.agents[A].disconnect(t(100), conn, &[]).unwrap();
    sim.run();
    let every = req_interval(12);
    assert_eq!(
        sim.sent_times(A, "DREQ"),
        vec![t(100), t(100) + every, t(100) + every * 2]
    );
    let gave_up = t(100) + every * 3;
    assert_eq!(
        sim.event_time(A, |e| matches!(
            e,
            CmEvent::Disconnected {
                timed_out: true,
                ..
            }
        )),
        Some(gave_up)
    );
    assert_eq!(
        sim.event_time(A, |e| matches!(e, CmEvent::TimewaitExit { .. })),
        Some(gave_up + iba_time(PACKET_LIFE) * 2 + iba_time(8))
    );
}

#[test]
fn lost_drep_dreq_resent_and_answered_from_time_wait() {
    let mut sim = Sim::new();
    // A's DREQ timer (2 × 4.19 ms + 0.52 ms) is shorter than B's time wait (2 × 4.19 ms +
    // 1.05 ms), so the DREQ sent again finds B in time wait.
    let mut request = sim.request();
    request.cm_response_timeout = 7;
    let conn = sim.agents[A].connect(Instant::ZERO, request).unwrap();
    sim.run_until(t(100));
    let mut first_drep = true;
    sim.drop_when(move |_, m| matches!(m, CmMessage::Drep(_)) && std::mem::take(&mut first_drep));
    sim.agents[A].disconnect(t(100), conn, &[]).unwrap();
    sim.run();
    let again = t(100) + req_interval(7);
    assert_eq!(sim.sent_times(A, "DREQ"), vec![t(100), again]);
    assert_eq!(sim.sent_times(B, "DREP"), vec![t(110), again + LATENCY]);
    assert_eq!(
        sim.event_time(A, |e| matches!(
            e,
            CmEvent::Disconnected {
                timed_out: false,
                ..
            }
        )),
        Some(again + LATENCY * 2)
    );
    assert_eq!(sim.agents[B].stats().duplicate_answers, 1);
    assert_eq!(sim.agents[B].stats().dropped_unknown_connection, 0);
}

#[test]
fn simultaneous_disconnect_both_answer_and_close() {
    let mut sim = Sim::new();
    let a = sim.connect();
    sim.run_until(t(100));
    let b = sim.passive_conn();
    sim.agents[A].disconnect(t(100), a, &[]).unwrap();
    sim.agents[B].disconnect(t(100), b, &[]).unwrap();
    sim.run();
    for (side, conn) in [(A, a), (B, b)] {
        assert_eq!(
            sim.event_time(side, |e| matches!(
                e,
                CmEvent::Disconnected {
                    timed_out: false,
                    ..
                }
            )),
            Some(t(110))
        );
        assert_eq!(
            sim.count(side, |e| matches!(e, CmEvent::DisconnectRequested { .. })),
            0
        );
        assert!(sim
            .events_of(side)
            .contains(&CmEvent::TimewaitExit { conn }));
        assert_eq!(sim.sent_times(side, "DREQ"), vec![t(100)]);
        assert_eq!(sim.sent_times(side, "DREP"), vec![t(110)]);
        assert_eq!(sim.agents[side].stats().retransmits, 0);
        // The other side's DREP arrives in time wait.
        assert_eq!(sim.agents[side].stats().dropped_duplicate, 1);
        assert_eq!(sim.agents[side].connection_count(), 0);
    }
}

#[test]
fn sidr_request_reply_unsupported_and_timeout() {
    let mut sim = Sim::new();
    let request = SidrRequest {
        to: peer(B),
        service_id: SERVICE,
        pkey: 0xffff,
        timeout: 12,
        max_retries: 2,
        private_data: b"ud?".to_vec(),
    };
    let sidr = sim.agents[A].sidr_request(t(0), request.clone()).unwrap();
    sim.run_until(t(15));
    let (theirs, pkey) = match &sim.events[B][0].1 {
        CmEvent::SidrReqReceived {
            sidr,
            service_id,
            pkey,
            private_data,
            ..
        } => {
            assert_eq!(*service_id, SERVICE);
            assert_eq!(&private_data[..3], b"ud?");
            (*sidr, *pkey)
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(pkey, 0xffff);
    let reply = SidrReply {
        status: SidrStatus::Success,
        qpn: 0x77,
        qkey: 0x1111_2222,
        private_data: b"here".to_vec(),
    };
    sim.agents[B]
        .sidr_reply(t(15), theirs, reply.clone())
        .unwrap();
    assert_eq!(
        sim.agents[B].sidr_reply(t(15), theirs, reply.clone()),
        Err(CmError::NoSuchSidr(theirs))
    );
    sim.run();
    match &sim.events[A][0] {
        (
            at,
            CmEvent::SidrRepReceived {
                sidr: s,
                status,
                qpn,
                qkey,
                private_data,
                ..
            },
        ) => {
            assert_eq!(*at, t(25));
            assert_eq!(*s, sidr);
            assert_eq!(*status, SidrStatus::Success);
            assert_eq!((*qpn, *qkey), (0x77, 0x1111_2222));
            assert_eq!(&private_data[..4], b"here");
        }
        other => panic!("{other:?}"),
    }
    // The answering side forgets the reply after its linger time.
    assert_eq!(sim.agents[B].sidr_in.len(), 0);

    // No listener: "service id not supported".
    let other = SidrRequest {
        service_id: SERVICE + 1,
        ..request.clone()
    };
    sim.agents[A].sidr_request(sim.now, other).unwrap();
    sim.run();
    assert!(matches!(
        sim.events[A].last(),
        Some((
            _,
            CmEvent::SidrRepReceived {
                status: SidrStatus::Unsupported,
                ..
            }
        ))
    ));

    // Nothing comes back: sent 1 + max_retries times, then SidrTimeout.
    sim.drop_when(|_, _| true);
    let start = sim.now;
    let lost = sim.agents[A].sidr_request(start, request).unwrap();
    sim.run();
    let every = req_interval(12);
    let sent = sim.sent_times(A, "SIDR_REQ");
    assert_eq!(&sent[2..], &[start, start + every, start + every * 2]);
    assert_eq!(
        sim.events[A].last(),
        Some(&(start + every * 3, CmEvent::SidrTimeout { sidr: lost }))
    );
}

#[test]
fn duplicate_sidr_req_after_the_reply_gets_it_again() {
    let mut sim = Sim::new();
    let mut first = true;
    sim.drop_when(move |_, m| matches!(m, CmMessage::SidrRep(_)) && std::mem::take(&mut first));
    let request = SidrRequest {
        to: peer(B),
        service_id: SERVICE,
        pkey: 0xffff,
        timeout: 12,
        max_retries: 3,
        private_data: Vec::new(),
    };
    sim.agents[A].sidr_request(t(0), request).unwrap();
    sim.run_until(t(15));
    let CmEvent::SidrReqReceived { sidr, .. } = sim.events[B][0].1.clone() else {
        panic!("no SIDR_REQ");
    };
    let reply = SidrReply {
        status: SidrStatus::Success,
        qpn: 0x78,
        qkey: 1,
        private_data: Vec::new(),
    };
    sim.agents[B].sidr_reply(t(15), sidr, reply).unwrap();
    sim.run();
    assert_eq!(
        sim.count(B, |e| matches!(e, CmEvent::SidrReqReceived { .. })),
        1
    );
    assert_eq!(sim.sent_times(B, "SIDR_REP").len(), 2);
    assert_eq!(
        sim.count(A, |e| matches!(
            e,
            CmEvent::SidrRepReceived { qpn: 0x78, .. }
        )),
        1
    );
}

#[test]
fn garbage_and_mangled_mads_are_counted_never_a_panic() {
    let mut sim = Sim::new();
    sim.connect();
    sim.run_until(t(100));
    let samples: Vec<Vec<u8>> = sim.log.iter().map(|s| s.bytes.clone()).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut agent = CmAgent::new(config(B));
    agent.listen(SERVICE, None).unwrap();
    for i in 0..5000u64 {
        let mut bytes = match i % 3 {
            0 => (0..rng.gen_range(0..300)).map(|_| rng.gen()).collect(),
            1 => samples[rng.gen_range(0..samples.len())][..rng.gen_range(0..256)].to_vec(),
            _ => samples[rng.gen_range(0..samples.len())].clone(),
        };
        if i % 3 == 2 {
            for _ in 0..rng.gen_range(1..6) {
                let at = rng.gen_range(0..bytes.len());
                bytes[at] = rng.gen();
            }
        }
        agent.handle_mad(Instant::from_nanos(i * 1000), peer(A), &bytes);
        while agent.poll_transmit().is_some() {}
        while agent.poll_event().is_some() {}
        if let Some(at) = agent.poll_timeout() {
            agent.handle_timeout(at);
        }
    }
    let stats = agent.stats();
    assert_eq!(stats.received, 5000);
    // Every random or truncated MAD is malformed; many mangled ones are too.
    assert!(stats.dropped_malformed >= 3333, "{stats:?}");
    assert_eq!(stats.unencodable, 0);
}

#[test]
fn absurd_peer_timeouts_are_clamped() {
    let mut agent = CmAgent::new(config(B));
    agent.listen(SERVICE, None).unwrap();
    let req = CmReq {
        local_cm_response_timeout: 31,
        remote_cm_response_timeout: 31,
        max_cm_retries: 15,
        ..hand_made_req()
    };
    assert!(answer_to(&mut agent, Instant::ZERO, CmMessage::Req(req)).is_empty());
    let Some(CmEvent::ReqReceived { conn, .. }) = agent.poll_event() else {
        panic!("no REQ event");
    };
    agent
        .accept(Instant::ZERO, conn, ReplyParams::default())
        .unwrap();
    // A peer's 31 would be 2.4 hours; the agent waits at most 4.096 µs × 2^24 (68.7 s).
    assert_eq!(
        agent.poll_timeout(),
        Some(Instant::ZERO + iba_time(PACKET_LIFE) * 2 + iba_time(24))
    );
    assert_eq!(agent.stats().clamped_timeouts, 1);
    // An MRA asking for 2^31 is clamped the same way.
    let mra = CmMra {
        local_comm_id: 0x4242,
        remote_comm_id: conn.0,
        message_mraed: MraedMessage::Rep,
        service_timeout: 31,
        ..CmMra::default()
    };
    answer_to(&mut agent, Instant::ZERO, CmMessage::Mra(mra));
    assert_eq!(agent.state(conn), Some(State::MraRepRcvd));
    assert_eq!(
        agent.poll_timeout(),
        Some(Instant::ZERO + iba_time(24) + iba_time(PACKET_LIFE))
    );
    // An MRA naming the wrong message is dropped.
    let wrong = CmMra {
        message_mraed: MraedMessage::Lap,
        ..mra
    };
    answer_to(&mut agent, Instant::ZERO, CmMessage::Mra(wrong));
    assert_eq!(agent.stats().dropped_wrong_state, 1);
}

#[test]
fn user_api_refuses_what_the_messages_cannot_carry() {
    let mut sim = Sim::new();
    let mut request = sim.request();
    request.private_data = vec![1; 93];
    assert_eq!(
        sim.agents[A].connect(t(0), request.clone()),
        Err(CmError::PrivateDataTooLong { len: 93, max: 92 })
    );
    request.private_data = vec![1; 92];
    request.qpn = 1 << 24;
    assert!(matches!(
        sim.agents[A].connect(t(0), request.clone()),
        Err(CmError::OutOfRange { field: "qpn", .. })
    ));
    request.qpn = 0x100;
    request.path_mtu = PathMtu::Reserved(0);
    assert!(sim.agents[A].connect(t(0), request.clone()).is_err());
    request.path_mtu = PathMtu::Mtu1024;
    request.max_cm_retries = 16;
    assert!(sim.agents[A].connect(t(0), request.clone()).is_err());
    assert_eq!(sim.agents[A].connection_count(), 0);

    sim.auto[B].accept = false;
    let conn = sim.connect();
    sim.run_until(t(15));
    let b = sim.passive_conn();
    let bad = ReplyParams {
        private_data: vec![0; 197],
        ..ReplyParams::default()
    };
    assert!(sim.agents[B].accept(t(15), b, bad).is_err());
    assert_eq!(
        sim.agents[B].reject(t(15), b, RejectReason::ConsumerDefined, &[0; 73], &[]),
        Err(CmError::AriTooLong { len: 73 })
    );
    // Nothing was sent by the refused calls; the connection is still waiting.
    assert_eq!(sim.agents[B].state(b), Some(State::ReqRcvd));
    assert_eq!(
        sim.agents[B].send_rtu(t(15), b, &[]),
        Err(CmError::WrongState {
            conn: b,
            state: State::ReqRcvd
        })
    );
    assert_eq!(
        sim.agents[A].disconnect(t(15), conn, &[]),
        Err(CmError::WrongState {
            conn,
            state: State::ReqSent
        })
    );
    assert_eq!(
        sim.agents[A].establish(t(15), ConnId(77)),
        Err(CmError::NoSuchConnection(ConnId(77)))
    );
}

fn hundred(seed: u64, loss: f64, duplicate: f64, reorder: f64) -> Sim {
    let mut sim = Sim::lossy(seed, loss, duplicate, reorder);
    sim.auto[A].disconnect_when_established = true;
    for _ in 0..100 {
        sim.connect();
    }
    sim.run();
    sim
}

fn assert_all_up_and_down(sim: &Sim) {
    for side in [A, B] {
        assert_eq!(sim.count(side, is_established), 100, "side {side}");
        assert_eq!(
            sim.count(side, |e| matches!(e, CmEvent::Disconnected { .. })),
            100,
            "side {side}"
        );
        assert_eq!(
            sim.count(side, |e| matches!(e, CmEvent::TimewaitExit { .. })),
            100,
            "side {side}"
        );
        assert_eq!(sim.agents[side].connection_count(), 0);
    }
}

#[test]
fn hundred_connections_at_once() {
    let sim = hundred(1, 0.0, 0.0, 0.0);
    assert_all_up_and_down(&sim);
    assert_eq!(sim.agents[A].stats().retransmits, 0);
    // 100 × (REQ, RTU, DREQ) and 100 × (REP, DREP).
    assert_eq!(sim.log.len(), 500);
}

#[test]
fn hundred_connections_under_loss_duplication_and_reordering() {
    for seed in 1..=3 {
        let sim = hundred(seed, 0.05, 0.05, 0.1);
        assert_all_up_and_down(&sim);
        assert!(
            sim.log.iter().any(|s| s.dropped),
            "seed {seed} lost nothing"
        );
        assert!(sim.agents[A].stats().retransmits + sim.agents[B].stats().retransmits > 0);
    }
}

/// Every connection ends: on the active side in Established or a Timeout/Rejected event, on
/// the passive side likewise for every REQ it saw, and nothing is left once time wait is over.
fn check_outcomes(sim: &Sim, conns: &[ConnId]) -> Result<(), TestCaseError> {
    for conn in conns {
        let ended = sim.events[A].iter().any(|(_, e)| match e {
            CmEvent::Established { conn: c }
            | CmEvent::Timeout { conn: c }
            | CmEvent::Rejected { conn: c, .. } => c == conn,
            _ => false,
        });
        prop_assert!(ended, "active {conn:?}: {:?}", sim.events[A]);
    }
    for (_, e) in &sim.events[B] {
        if let CmEvent::ReqReceived { conn, .. } = e {
            let ended = sim.events[B].iter().any(|(_, e)| match e {
                CmEvent::Established { conn: c }
                | CmEvent::Timeout { conn: c }
                | CmEvent::Rejected { conn: c, .. } => c == conn,
                _ => false,
            });
            prop_assert!(ended, "passive {conn:?}: {:?}", sim.events[B]);
        }
    }
    prop_assert_eq!(sim.agents[A].connection_count(), 0);
    // B may keep a connection only when it is up and A gave up on its DREQs: IBTA has no
    // keepalive, the QP's transport errors tell B (IBTA 12.9.6).
    for c in sim.agents[B].conns.values() {
        prop_assert_eq!(c.state, State::Established);
    }
    let a_gave_up = sim.count(A, |e| {
        matches!(
            e,
            CmEvent::Disconnected {
                timed_out: true,
                ..
            }
        )
    });
    prop_assert!(sim.agents[B].connection_count() <= a_gave_up);
    prop_assert!(sim.agents[A].poll_timeout().is_none());
    prop_assert!(sim.agents[B].poll_timeout().is_none());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn every_connect_ends_never_stuck(
        seed in any::<u64>(),
        loss in 0.0..0.5f64,
        duplicate in 0.0..0.3f64,
        reorder in 0.0..0.5f64,
        count in 1usize..8,
        max_cm_retries in 0u8..4,
    ) {
        let mut sim = Sim::lossy(seed, loss, duplicate, reorder);
        sim.auto[A].disconnect_when_established = true;
        let mut conns = Vec::new();
        for _ in 0..count {
            let mut request = sim.request();
            request.max_cm_retries = max_cm_retries;
            conns.push(sim.agents[A].connect(Instant::ZERO, request).unwrap());
        }
        sim.run();
        check_outcomes(&sim, &conns)?;
    }
}

#[test]
fn abandon_tells_the_peer_as_the_state_requires() {
    // Our REQ outstanding: REJ "timeout", gone at once.
    let mut sim = Sim::new();
    sim.auto[B].accept = false;
    let conn = sim.connect();
    sim.run_until(t(15));
    sim.agents[A].abandon(t(15), conn).unwrap();
    assert_eq!(sim.agents[A].state(conn), None);
    sim.run_until(t(100));
    let b = sim.passive_conn();
    assert!(matches!(
        sim.events_of(B).last(),
        Some(CmEvent::Rejected { conn: c, reason: RejectReason::Timeout, .. }) if *c == b
    ));
    assert_eq!(sim.agents[B].connection_count(), 0);

    // A REQ waiting for the user: REJ "consumer defined".
    let mut sim = Sim::new();
    sim.auto[B].accept = false;
    let conn = sim.connect();
    sim.run_until(t(15));
    let b = sim.passive_conn();
    sim.agents[B].abandon(t(15), b).unwrap();
    sim.run_until(t(100));
    assert!(matches!(
        sim.events_of(A).as_slice(),
        [CmEvent::Rejected { conn: c, reason: RejectReason::ConsumerDefined, .. }] if *c == conn
    ));

    // Established: one DREQ, time wait, and no more events for the abandoned side even
    // though the peer's DREP comes and time wait ends.
    let mut sim = Sim::new();
    let conn = sim.connect();
    sim.run_until(t(100));
    let before = sim.events[A].len();
    sim.agents[A].abandon(t(100), conn).unwrap();
    assert_eq!(sim.agents[A].state(conn), Some(State::TimeWait));
    sim.run();
    assert_eq!(sim.events[A].len(), before);
    assert_eq!(sim.sent_times(A, "DREQ"), vec![t(100)]);
    assert_eq!(
        sim.count(B, |e| matches!(e, CmEvent::DisconnectRequested { .. })),
        1
    );
    assert_eq!(
        sim.agents[A].connection_count() + sim.agents[B].connection_count(),
        0
    );

    // After the peer's DREQ: DREP.
    let mut sim = Sim::new();
    sim.auto[B].answer_dreq = false;
    let conn = sim.connect();
    sim.run_until(t(100));
    sim.agents[A].disconnect(t(100), conn, &[]).unwrap();
    sim.run_until(t(200));
    let b = sim.passive_conn();
    assert_eq!(sim.agents[B].state(b), Some(State::DreqRcvd));
    sim.agents[B].abandon(t(200), b).unwrap();
    sim.run();
    assert_eq!(sim.sent_times(B, "DREP"), vec![t(200)]);
    assert!(!sim.events_of(B).iter().any(|e| matches!(
        e,
        CmEvent::Disconnected { .. } | CmEvent::TimewaitExit { .. }
    )));
    assert_eq!(
        sim.count(A, |e| matches!(
            e,
            CmEvent::Disconnected {
                timed_out: false,
                ..
            }
        )),
        1
    );
    assert_eq!(sim.agents[B].abandoned.len(), 0);
}

#[test]
fn active_timeout_rej_finds_the_passive_by_ca_guid_and_comm_id() {
    // Every REP lost: A never learns B's comm id; its REJ "timeout" names its own id and
    // GUID, which is how B finds the connection (and stops resending its REP).
    let mut sim = Sim::new();
    sim.drop_when(|_, m| matches!(m, CmMessage::Rep(_)));
    let mut request = sim.request();
    request.max_cm_retries = 1;
    // A gives up (2 × 16.8 ms) before B would (2 × 25.2 ms).
    request.cm_response_timeout = 11;
    sim.agents[A].connect(Instant::ZERO, request).unwrap();
    sim.run();
    let gave_up = Instant::ZERO + req_interval(11) * 2;
    let b = sim.passive_conn();
    assert_eq!(
        sim.event_time(B, |e| matches!(
            e,
            CmEvent::Rejected {
                reason: RejectReason::Timeout,
                from_peer: true,
                ..
            }
        )),
        Some(gave_up + LATENCY)
    );
    assert!(!sim.events_of(B).contains(&CmEvent::Timeout { conn: b }));
    assert_eq!(sim.agents[B].connection_count(), 0);
}

#[test]
fn mra_for_the_rep_holds_the_passive_side_and_is_sent_again_for_a_duplicate_rep() {
    let mut sim = Sim::new();
    sim.auto[A].rtu = false;
    let conn = sim.connect();
    sim.run_until(t(20));
    sim.agents[A].send_mra(t(20), conn, 13, &[]).unwrap();
    assert_eq!(sim.agents[A].state(conn), Some(State::MraRepSent));
    sim.run_until(t(30));
    let b = sim.passive_conn();
    assert_eq!(sim.agents[B].state(b), Some(State::MraRepRcvd));
    // B's REP goes again after the service timeout + packet lifetime, not its usual wait;
    // A answers the duplicate with its MRA again.
    let resend = t(30) + iba_time(13) + iba_time(PACKET_LIFE);
    sim.run_until(resend + LATENCY);
    assert_eq!(sim.sent_times(B, "REP"), vec![t(10), resend]);
    assert_eq!(sim.sent_times(A, "MRA"), vec![t(20), resend + LATENCY]);
    sim.agents[A].send_rtu(sim.now, conn, &[]).unwrap();
    sim.run_until(sim.now + Duration::from_millis(1));
    assert_eq!(sim.agents[B].state(b), Some(State::Established));
}

/// The passive side's (B's) connection and QP as the peer's DREQ names them.
fn established_pair(sim: &mut Sim) -> (ConnId, ConnId, u32) {
    let a = sim.connect();
    sim.run_until(sim.now + Duration::from_micros(100));
    let b = sim.events[B]
        .iter()
        .rev()
        .find_map(|(_, e)| match e {
            CmEvent::ReqReceived { conn, .. } => Some(*conn),
            _ => None,
        })
        .expect("B got the REQ");
    let b_qpn = sim.agents[B].conns[&b.0].local_qpn;
    (a, b, b_qpn)
}

#[test]
fn dreq_naming_no_connection_of_ours_is_answered_with_drep() {
    // Our comm id, but the peer's comm id is not the one our connection knows: the DREQ is
    // for a connection we no longer have (the id went to a newer one). IBTA 12.9.6 and
    // Linux's cm_dreq_handler (cm_issue_drep): DREP, so that the peer can finish; the
    // connection holding the id now is not touched.
    let mut sim = Sim::new();
    let (_, b, b_qpn) = established_pair(&mut sim);
    let stale = CmMessage::Dreq(CmDreq {
        local_comm_id: 0x5151,
        remote_comm_id: b.0,
        remote_qpn: b_qpn,
        private_data: PrivateData::zeroed(),
    });
    let answers = answer_to(&mut sim.agents[B], sim.now, stale);
    assert!(
        matches!(
            answers.as_slice(),
            [CmMessage::Drep(d)] if d.local_comm_id == b.0 && d.remote_comm_id == 0x5151
        ),
        "{answers:?}"
    );
    assert_eq!(sim.agents[B].state(b), Some(State::Established));
    assert_eq!(sim.agents[B].poll_event(), None);
}

#[test]
fn dreq_for_an_abandoned_connection_is_answered_in_and_after_time_wait() {
    // perftest's server destroys its id while the client disconnects: the server's one DREQ
    // (abandon) is lost, so only the client's DREQs tell; each is answered, first from time
    // wait, then (time wait over, the connection forgotten) as a DREQ of no connection.
    for late in [false, true] {
        let mut sim = Sim::new();
        sim.auto[A].answer_dreq = false;
        let (a, b, _) = established_pair(&mut sim);
        sim.drop_when(|from, m| from == B && matches!(m, CmMessage::Dreq(_)));
        let now = sim.now;
        sim.agents[B].abandon(now, b).unwrap();
        assert_eq!(sim.agents[B].state(b), Some(State::TimeWait));
        if late {
            sim.run();
            assert_eq!(sim.agents[B].state(b), None);
        }
        let now = sim.now;
        sim.agents[A].disconnect(now, a, &[]).unwrap();
        sim.run();
        assert_eq!(sim.sent_times(A, "DREQ"), vec![now], "answered at once");
        assert_eq!(sim.sent_times(B, "DREP"), vec![now + LATENCY]);
        assert!(sim.events_of(A).contains(&CmEvent::Disconnected {
            conn: a,
            private_data: vec![0; 224],
            timed_out: false,
        }));
    }
}

#[test]
fn perftest_teardown_every_dreq_gets_its_drep() {
    // perftest 4.5-0.17 -R over two connections: the client (A) sends DREQ on both at once;
    // the server (B) sends its own DREQ on the second (crossing A's) and destroys the first
    // without a disconnect (abandon while its DREQ waits for the user), under duplication
    // and reordering. Every DREQ of A is answered and A sees both connections end without
    // a timeout.
    for seed in 0..32 {
        let mut sim = Sim::lossy(seed, 0.0, 0.3, 0.3);
        sim.auto[A].answer_dreq = false;
        sim.auto[B].answer_dreq = false;
        let (a1, b1, _) = established_pair(&mut sim);
        let (a2, b2, _) = established_pair(&mut sim);
        let now = sim.now;
        sim.agents[A].disconnect(now, a1, &[]).unwrap();
        sim.agents[A].disconnect(now, a2, &[]).unwrap();
        sim.agents[B].disconnect(now, b2, &[]).unwrap();
        sim.run_until(now + Duration::from_micros(20 + seed));
        let now = sim.now;
        sim.agents[B].abandon(now, b1).unwrap();
        sim.run();
        for a in [a1, a2] {
            let ended = sim.count(
                A,
                |e| matches!(e, CmEvent::Disconnected { conn, timed_out: false, .. } if *conn == a),
            );
            assert_eq!(ended, 1, "seed {seed}: {:?}", sim.events_of(A));
        }
        assert_eq!(sim.agents[A].stats().retransmits, 0, "seed {seed}");
        assert_eq!(
            sim.agents[A].connection_count() + sim.agents[B].connection_count(),
            0
        );
    }
}
