//! Who makes progress (src/verbs/progress.rs): a thread that polls its CQ receives, answers
//! and transmits itself; the background thread serves nobody-polls work; work posted while
//! another thread holds the progress token is never left behind; busy-poll mode does not
//! starve the application. Over the in-memory driver: no root.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use xroce::verbs::*;

/// The poller's lease (src/verbs/runtime/progress.rs, POLLER_LEASE).
const LEASE: Duration = Duration::from_millis(20);

#[path = "common/sides.rs"]
mod sides;
use sides::*;

#[test]
fn a_thread_polling_its_cq_receives_and_transmits_itself() {
    let (sides, da, db, _link) = pairs(ProgressMode::Wakeup, 1);
    let (a, b) = &sides[0];
    ping_pong(a, b, 2000);
    for dev in [&da, &db] {
        let stats = dev.progress_stats();
        let rx = stats.rx_frames.load(Ordering::Relaxed);
        let driven = stats.driven_rx_frames.load(Ordering::Relaxed);
        // 2000 SENDs each way and (coalesced) ACKs.
        assert!(rx >= 3000, "{}: only {rx} frames received", dev.name());
        // The background thread may take a few rounds while a poller is descheduled, but
        // the pollers must do most of the receiving.
        assert!(
            driven * 2 > rx,
            "{}: pollers received {driven} of {rx} frames",
            dev.name()
        );
        assert!(stats.driven_rounds.load(Ordering::Relaxed) > 0);
        // Every frame sent left in some kick, and no kick left empty.
        let (tx, kicks) = (
            stats.tx_frames.load(Ordering::Relaxed),
            stats.kicks.load(Ordering::Relaxed),
        );
        assert!(
            kicks > 0 && kicks <= tx,
            "{}: {kicks} kicks for {tx} frames",
            dev.name()
        );
    }
}

#[test]
fn busy_poll_mode_does_not_starve_a_polling_application() {
    // Two applications and two spinning progress threads on this machine's few cores: the
    // spinning threads must leave the driver to the pollers.
    let (sides, _da, _db, _link) = pairs(ProgressMode::BusyPoll, 1);
    let (a, b) = &sides[0];
    ping_pong(a, b, 2000);
}

#[test]
fn work_posted_while_another_thread_holds_the_token_is_never_left_behind() {
    // Four QP pairs, a sender and a receiver thread each: posts and polls from eight
    // threads race for the one progress token of each device. Every message must arrive,
    // in order, and every send complete.
    const MESSAGES: u64 = 1500;
    let (sides, _da, _db, _link) = pairs(ProgressMode::Wakeup, 4);
    let sides: Vec<Arc<(Side, Side)>> = sides.into_iter().map(Arc::new).collect();
    let reposted: Vec<AtomicU64> = (0..sides.len()).map(|_| AtomicU64::new(0)).collect();
    std::thread::scope(|scope| {
        for (pair, reposted) in sides.iter().zip(&reposted) {
            let (a, b) = (&pair.0, &pair.1);
            for i in 0..128 {
                post_recv(b, i);
            }
            scope.spawn(move || {
                let mut sends = 0;
                let mut expected = 0u64;
                while expected < MESSAGES {
                    let wc = poll_until_recv(&b.cq, &mut sends);
                    assert_eq!(wc.byte_len, 64);
                    expected += 1;
                    post_recv(b, wc.wr_id);
                    reposted.store(expected, Ordering::Release);
                }
            });
            scope.spawn(move || {
                let mut done = 0u64;
                let mut wcs = [Wc::EMPTY; 32];
                let deadline = Instant::now() + WAIT;
                for i in 0..MESSAGES {
                    // At most 64 messages not yet taken by the receiver, which keeps 128
                    // receives posted: no RNR NAK, so every message goes through at once.
                    while i - reposted.load(Ordering::Acquire) >= 64 || i - done >= 128 {
                        let n = a.cq.poll(&mut wcs).unwrap();
                        assert!(wcs[..n].iter().all(|w| w.status == WcStatus::Success));
                        done += n as u64;
                        assert!(Instant::now() < deadline, "sends stopped completing");
                    }
                    send(a, i, i as u8);
                }
                while done < MESSAGES {
                    let n = a.cq.poll(&mut wcs).unwrap();
                    assert!(wcs[..n].iter().all(|w| w.status == WcStatus::Success));
                    done += n as u64;
                    assert!(
                        Instant::now() < deadline,
                        "{done} of {MESSAGES} sends completed"
                    );
                }
            });
        }
    });
}

#[test]
fn a_thread_that_stops_polling_hands_progress_back() {
    // After a burst of polling, the application sleeps on a completion channel: the
    // background thread must take over receiving, or the event never comes.
    let (da, db, _link) =
        Device::mem_pair(&mem_link_config(1500, 0.0, 7), DeviceConfig::default()).unwrap();
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let a = side(&da, &pa);
    let channel = db.create_comp_channel().unwrap();
    let cq = db.create_cq(64, Some(&channel)).unwrap();
    let b = Side {
        qp: pb.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap(),
        mr: pb.reg_mr(8192, Access::ALL).unwrap(),
        cq,
        dev: db.clone(),
        _pd: pb.clone(),
    };
    connect(&a, &b);
    post_recv(&b, 1);
    let until = Instant::now() + Duration::from_millis(20);
    let mut wcs = [Wc::EMPTY; 4];
    while Instant::now() < until {
        assert_eq!(b.cq.poll(&mut wcs).unwrap(), 0);
    }
    b.cq.req_notify(false).unwrap();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(5));
            send(&a, 1, 0x5a);
        });
        assert_eq!(channel.get_cq_event(Some(WAIT)).unwrap(), b.cq.id());
    });
    let n = b.cq.poll(&mut wcs).unwrap();
    assert_eq!(n, 1);
    assert_eq!(wcs[0].opcode, WcOpcode::Recv);
    assert_eq!(b.mr.to_vec(4096, 64).unwrap(), vec![0x5a; 64]);
}

#[test]
fn a_polling_application_holds_a_lease_and_is_not_woken_against() {
    // A poll takes a lease on progress: while an application keeps polling, the background
    // thread sleeps through the lease and wakes once per watchdog period to look, not every
    // millisecond (each wake-up can preempt the spinning application).
    let (sides, _da, db, _link) = pairs(ProgressMode::Wakeup, 1);
    let (_a, b) = &sides[0];
    let mut wcs = [Wc::EMPTY; 4];
    // Settle: the first poll takes the lease.
    assert_eq!(b.cq.poll(&mut wcs).unwrap(), 0);
    std::thread::sleep(Duration::from_millis(2));
    let sleeps = || db.progress_stats().sleeps.load(Ordering::Relaxed);
    let before = sleeps();
    let spin = Duration::from_millis(300);
    let until = Instant::now() + spin;
    while Instant::now() < until {
        assert_eq!(b.cq.poll(&mut wcs).unwrap(), 0);
    }
    let woke = sleeps() - before;
    // 300 ms / 20 ms = 15 looks; the old 1 ms grace made about 300.
    assert!(
        woke <= 40,
        "the background thread slept {woke} times in {spin:?}"
    );
}

#[test]
fn a_poller_that_goes_away_without_a_word_is_caught_by_the_watchdog() {
    // B polls, then stops without arming a CQ or waiting on a channel: its lease runs out,
    // and the background thread takes over, so A's SEND is still acknowledged.
    let (sides, _da, _db, _link) = pairs(ProgressMode::Wakeup, 1);
    let (a, b) = &sides[0];
    post_recv(b, 1);
    let mut wcs = [Wc::EMPTY; 4];
    let until = Instant::now() + Duration::from_millis(10);
    while Instant::now() < until {
        assert_eq!(b.cq.poll(&mut wcs).unwrap(), 0);
    }
    let start = Instant::now();
    send(a, 7, 0x33);
    let wc = loop {
        if a.cq.poll(&mut wcs).unwrap() == 1 {
            break wcs[0];
        }
        assert!(start.elapsed() < WAIT, "the SEND was never acknowledged");
    };
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(wc.wr_id, 7);
    // Received by B's background thread, the completion waits in B's CQ.
    assert_eq!(b.cq.poll(&mut wcs).unwrap(), 1);
    assert_eq!(wcs[0].opcode, WcOpcode::Recv);
}

#[test]
fn a_post_left_for_a_poller_that_never_polls_again_still_leaves() {
    // A's background thread sleeps without a timer (nothing in flight). A polls once (a
    // lease), posts a SEND, which only waits in the engine for A's next poll, and then
    // never polls again: when the lease ends, the background thread must send it, although
    // no frame was built and so no timer armed to wake it.
    let (sides, _da, _db, _link) = pairs(ProgressMode::Wakeup, 1);
    let (a, b) = &sides[0];
    post_recv(b, 1);
    std::thread::sleep(Duration::from_millis(100));
    let mut wcs = [Wc::EMPTY; 4];
    assert_eq!(a.cq.poll(&mut wcs).unwrap(), 0);
    send(a, 7, 0x44);
    // B is polled from another thread: polling B here would end A's lease at once.
    let (b_cq, start) = (b.cq.clone(), Instant::now());
    let received = std::thread::spawn(move || {
        let mut wcs = [Wc::EMPTY; 4];
        while start.elapsed() < WAIT {
            if b_cq.poll(&mut wcs).unwrap() == 1 {
                return Some((wcs[0], start.elapsed()));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        None
    })
    .join()
    .unwrap();
    let (wc, after) = received.expect("the SEND never left");
    assert_eq!((wc.wr_id, wc.opcode), (1, WcOpcode::Recv));
    assert!(after < Duration::from_secs(1), "it took {after:?}");
}

/// A and B exchange one message each way, B answering what it received: B is then a
/// ping-pong's side, whose polls leave their ACKs for its answers.
fn ping_and_answer(a: &Side, b: &Side) {
    post_recv(b, 100);
    post_recv(a, 200);
    let mut wcs = [Wc::EMPTY; 4];
    assert_eq!(b.cq.poll(&mut wcs).unwrap(), 0);
    send(a, 101, 0x11);
    let mut b_sends = 0;
    assert_eq!(poll_until_recv(&b.cq, &mut b_sends).wr_id, 100);
    send(b, 201, 0x22);
    // The answer is out (its post or B's next poll sent it, with the ACK once B is known to
    // answer); B's poll may already find it acknowledged. A gets it, and both SENDs complete.
    let mut a_sends = 0;
    let b_polled = b.cq.poll(&mut wcs).unwrap();
    let a_side = std::thread::scope(|scope| {
        scope
            .spawn(|| poll_until_recv(&a.cq, &mut a_sends).wr_id)
            .join()
    });
    assert_eq!(a_side.unwrap(), 200);
    assert_eq!(
        send_status_after(&b.cq, b_polled, &wcs, 201),
        WcStatus::Success
    );
    if a_sends == 0 {
        assert_eq!(send_status(&a.cq, 101), WcStatus::Success);
    }
}

/// B, a busy-polling ping-pong side, receives A's SEND: the poll that hands over its
/// completion leaves the ACK for B's next call (B's transmit count is unchanged when the
/// completion is in hand). Returns the SEND's wr_id. Up to five tries: on a loaded machine a
/// descheduled test thread can outlive its lease, and the background thread's round then
/// sends the ACK (and forgets that B answers).
fn receive_with_the_ack_deferred(a: &Side, b: &Side, db: &Device) -> u64 {
    let tx = || db.progress_stats().tx_frames.load(Ordering::Relaxed);
    for attempt in 0..5 {
        ping_and_answer(a, b);
        post_recv(b, 1);
        // B polls first: its lease keeps its background thread away from the driver.
        let mut wcs = [Wc::EMPTY; 4];
        assert_eq!(b.cq.poll(&mut wcs).unwrap(), 0);
        let before = tx();
        let wr_id = 7 + 10 * attempt;
        send(a, wr_id, 0x33);
        let mut sends = 0;
        let wc = poll_until_recv(&b.cq, &mut sends);
        assert_eq!(wc.wr_id, 1);
        if tx() == before {
            return wr_id;
        }
        let status = std::thread::scope(|scope| scope.spawn(|| send_status(&a.cq, wr_id)).join());
        assert_eq!(status.unwrap(), WcStatus::Success);
    }
    panic!("five times the ACK left before the completion was handed over");
}

#[test]
fn the_ack_of_a_polled_send_leaves_with_the_reply_in_one_kick() {
    // IBTA 9.7.5.1.1 lets a responder acknowledge when it will: a poller's round hands the
    // completion over first, and the ACK goes out with the application's next frames.
    let (sides, _da, db, _link) = pairs(ProgressMode::Wakeup, 1);
    let (a, b) = &sides[0];
    let stats = db.progress_stats();
    let mut wcs = [Wc::EMPTY; 4];
    // Up to five tries, as in `receive_with_the_ack_deferred`: a test thread descheduled
    // past its lease lets the background thread send the ACK on its own.
    for _ in 0..5 {
        let sent = receive_with_the_ack_deferred(a, b, &db);
        post_recv(a, 2);
        let (tx, kicks) = (
            stats.tx_frames.load(Ordering::Relaxed),
            stats.kicks.load(Ordering::Relaxed),
        );
        send(b, 8, 0x44);
        // The reply's post (under B's lease) is the answer the poll left the ACK for: its
        // own round builds the ACK and the SEND and kicks both out at once, before it
        // returns, as a hardware HCA's doorbell would. (A lease that ran out meanwhile, on a
        // loaded machine, lets the background thread send the ACK alone first, and the try
        // does not count.)
        let one_kick = stats.tx_frames.load(Ordering::Relaxed) == tx + 2
            && stats.kicks.load(Ordering::Relaxed) == kicks + 1;
        let polled = b.cq.poll(&mut wcs).unwrap();
        // A gets both: its SEND acknowledged, the reply received.
        let mut sends = 0;
        assert_eq!(poll_until_recv(&a.cq, &mut sends).wr_id, 2);
        if one_kick {
            assert_eq!(sends, 1, "A's SEND did not complete before the reply");
            return;
        }
        if sends == 0 {
            assert_eq!(send_status(&a.cq, sent), WcStatus::Success);
        }
        assert_eq!(send_status_after(&b.cq, polled, &wcs, 8), WcStatus::Success);
    }
    panic!("five times the ACK and the reply did not leave in one kick");
}

#[test]
fn a_deferred_ack_leaves_when_the_poller_goes_quiet() {
    // B polls, gets the completion, then neither polls nor posts again (a compute phase):
    // its background thread sends the ACK when B's lease runs out, and A's SEND completes.
    let (sides, _da, db, _link) = pairs(ProgressMode::Wakeup, 1);
    let (a, b) = &sides[0];
    let sent = receive_with_the_ack_deferred(a, b, &db);
    let stats = db.progress_stats();
    let b_rounds = stats.driven_rounds.load(Ordering::Relaxed);
    let start = Instant::now();
    // A is polled from another thread: this one still holds B's lease (a thread that polls
    // another device ends the lease it held).
    let status = std::thread::scope(|scope| scope.spawn(|| send_status(&a.cq, sent)).join());
    assert_eq!(status.unwrap(), WcStatus::Success);
    assert_eq!(
        stats.driven_rounds.load(Ordering::Relaxed),
        b_rounds,
        "B's thread ran a round: the ACK was not left to the background thread"
    );
    assert!(start.elapsed() < LEASE * 10, "{:?}", start.elapsed());
}

#[test]
fn a_receiver_that_does_not_answer_leaves_no_ack_waiting() {
    // B only receives (a stream's sink) while A keeps 16 SENDs in flight: B's polls never
    // leave their ACKs for an answer that will not come (A would wait for them), while a
    // ping-pong's side does.
    let (sides, _da, db, _link) = pairs(ProgressMode::Wakeup, 1);
    let (a, b) = &sides[0];
    for i in 0..200 {
        post_recv(b, i);
    }
    let mut wcs = [Wc::EMPTY; 16];
    assert_eq!(b.cq.poll(&mut wcs).unwrap(), 0);
    let start = Instant::now();
    std::thread::scope(|scope| {
        let sender = scope.spawn(|| {
            for i in 0..200 {
                send(a, 1000 + i, i as u8);
                // Keep at most 16 in flight: completions need ACKs.
                if i >= 16 {
                    assert_eq!(send_status(&a.cq, 1000 + i - 16), WcStatus::Success);
                }
            }
            for i in 184..200 {
                assert_eq!(send_status(&a.cq, 1000 + i), WcStatus::Success);
            }
        });
        let mut received = 0;
        while received < 200 {
            received += b.cq.poll(&mut wcs).unwrap();
            assert!(start.elapsed() < WAIT, "only {received} of 200 received");
        }
        sender.join().unwrap();
    });
    let stats = db.progress_stats();
    assert_eq!(stats.deferred_rounds.load(Ordering::Relaxed), 0);
    // The same B, once it answers, leaves the ACK of what it receives for its answer.
    let before = stats.deferred_rounds.load(Ordering::Relaxed);
    for _ in 0..5 {
        ping_and_answer(a, b);
    }
    assert!(stats.deferred_rounds.load(Ordering::Relaxed) > before);
}
/// UCX's progress polls a QP's receive CQ and then its send CQ: B, built that way, receives
/// A's SEND in its receive CQ's poll and polls the (empty) send CQ before it answers. That
/// second poll neither sends the ACK nor makes B a side that does not answer: the ACK still
/// leaves with B's answer, in one kick.
#[test]
fn an_empty_poll_of_the_other_cq_leaves_the_ack_for_the_answer() {
    let (da, db, _link) = device_pair(ProgressMode::Wakeup);
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let a = side(&da, &pa);
    let b_send_cq = db.create_cq(4096, None).unwrap();
    let b = side_with_send_cq(&db, &pb, &b_send_cq, db.create_cq(4096, None).unwrap());
    connect(&a, &b);
    let stats = db.progress_stats();
    let (tx, kicks) = (
        || stats.tx_frames.load(Ordering::Relaxed),
        || stats.kicks.load(Ordering::Relaxed),
    );
    // B's loop: its receive CQ, then its send CQ, until a receive completes; then one more
    // poll of the send CQ, as UCX's progress ends its pass. Whether the last poll sent.
    let receive_then_poll_sends = || {
        let start = Instant::now();
        loop {
            let mut wcs = [Wc::EMPTY; 4];
            let received = b.cq.poll(&mut wcs).unwrap();
            let before = tx();
            b_send_cq.poll(&mut wcs).unwrap();
            if received > 0 {
                return tx() != before;
            }
            assert!(start.elapsed() < WAIT, "B received nothing");
        }
    };
    // A runs in a thread of its own, busy-polling for each answer (its lease stays there).
    let (go, a_go) = std::sync::mpsc::channel::<u64>();
    let (a_got, got) = std::sync::mpsc::channel::<u64>();
    std::thread::scope(|scope| {
        let a = &a;
        scope.spawn(move || {
            let mut sends = 0;
            for wr_id in a_go {
                post_recv(a, wr_id);
                send(a, wr_id, wr_id as u8);
                a_got
                    .send(poll_until_recv(&a.cq, &mut sends).wr_id)
                    .unwrap();
            }
        });
        // `go` is the call's own, dropped also when it panics: A's thread then ends.
        let b_side = |go: std::sync::mpsc::Sender<u64>| {
            let mut wcs = [Wc::EMPTY; 4];
            for attempt in 0..10u64 {
                // Four exchanges in B's way: by the last, B is known to answer.
                let mut aside_sent = false;
                let mut answer_kicks = (0, 0);
                for i in 0..4 {
                    let wr_id = 100 * attempt + i;
                    post_recv(&b, wr_id);
                    assert_eq!(b.cq.poll(&mut wcs).unwrap(), 0);
                    go.send(wr_id).unwrap();
                    aside_sent = receive_then_poll_sends();
                    let before = (tx(), kicks());
                    send(&b, wr_id, i as u8);
                    assert_eq!(b.cq.poll(&mut wcs).unwrap(), 0);
                    answer_kicks = (tx() - before.0, kicks() - before.1);
                    // B keeps polling (its lease) while A takes the answer.
                    let start = Instant::now();
                    let answered = loop {
                        if let Ok(id) = got.try_recv() {
                            break id;
                        }
                        assert_eq!(b.cq.poll(&mut wcs).unwrap(), 0);
                        assert!(start.elapsed() < WAIT, "A got no answer");
                    };
                    assert_eq!(answered, wr_id);
                }
                // The last exchange: the poll aside sent nothing, and the answer's poll sent the
                // ACK and the answer in one kick.
                if !aside_sent && answer_kicks == (2, 1) {
                    return;
                }
            }
            panic!("ten times B's poll of its send CQ did not leave the ACK for the answer");
        };
        b_side(go);
    });
}

/// The status of send `wr_id` after a poll of `cq` that took `polled` completions into `wcs`:
/// the one that poll took (it must be that send's), or the next one polled now.
fn send_status_after(cq: &Cq, polled: usize, wcs: &[Wc], wr_id: u64) -> WcStatus {
    if polled == 0 {
        return send_status(cq, wr_id);
    }
    assert_eq!(wcs[0].wr_id, wr_id);
    wcs[0].status
}

/// Polls `cq` until its next completion (a send's); its status.
fn send_status(cq: &Cq, wr_id: u64) -> WcStatus {
    let start = Instant::now();
    loop {
        if let Some(wc) = cq.poll_one().unwrap() {
            assert_eq!(wc.wr_id, wr_id);
            return wc.status;
        }
        assert!(start.elapsed() < WAIT, "send {wr_id} never completed");
    }
}

#[test]
fn a_qp_destroyed_right_after_its_poll_still_acknowledges() {
    // The ACK of what the last poll received leaves before the QP is gone (perftest's
    // write_lat server destroys its QP right after its last poll).
    let (mut sides, _da, db, _link) = pairs(ProgressMode::Wakeup, 1);
    let (a, b) = sides.pop().unwrap();
    let sent = receive_with_the_ack_deferred(&a, &b, &db);
    drop(b);
    assert_eq!(send_status(&a.cq, sent), WcStatus::Success);
}

#[test]
fn a_device_closed_right_after_its_poll_still_acknowledges() {
    let (mut sides, _da, db, _link) = pairs(ProgressMode::Wakeup, 1);
    let (a, b) = sides.pop().unwrap();
    let sent = receive_with_the_ack_deferred(&a, &b, &db);
    drop((b, db));
    assert_eq!(send_status(&a.cq, sent), WcStatus::Success);
}

#[test]
fn a_chain_of_posts_is_one_round_and_stops_at_its_first_refusal() {
    // `ibv_post_send` with a list: one engine lock and at most one progress round for the
    // whole chain, nothing allocated per WR; a refused WR ends it, those before it stay
    // posted.
    let (sides, da, _db, _link) = pairs(ProgressMode::Wakeup, 1);
    let (a, b) = &sides[0];
    for i in 0..16 {
        post_recv(b, i);
    }
    let mut wcs = [Wc::EMPTY; 32];
    // A's own poll first: its lease keeps A's background thread out of the rounds counted.
    assert_eq!(a.cq.poll(&mut wcs).unwrap(), 0);
    let rounds = || da.progress_stats().driven_rounds.load(Ordering::Relaxed);
    let before = rounds();
    let sge = [a.mr.sge(0, 64).unwrap()];
    let bad = [Sge {
        lkey: sge[0].lkey ^ 0x100,
        ..sge[0]
    }];
    let mut posted = 0;
    let refused = a.qp.post_send_chain(|post| {
        for i in 0..12u64 {
            let wr = SendWrRef {
                wr_id: i,
                op: WrOp::Send,
                sg_list: if i == 10 { &bad } else { &sge },
                flags: SendFlags::SIGNALED,
                ud: None,
            };
            post(&wr, None)?;
            posted += 1;
        }
        Ok(())
    });
    assert!(refused.is_err(), "a WR with a wrong lkey was accepted");
    assert_eq!(posted, 10);
    // Under A's lease the chain only enqueues (no round); a chain posting alone would take
    // one: never one per WR.
    assert!(
        rounds() <= before + 1,
        "the chain took {} rounds",
        rounds() - before
    );
    // The ten before it arrive and complete.
    let start = Instant::now();
    let mut done = 0;
    while done < 10 {
        done += a.cq.poll(&mut wcs).unwrap();
        assert!(start.elapsed() < WAIT, "{done} of 10 sends completed");
    }
    let mut got = 0;
    while got < 10 {
        got += b.cq.poll(&mut wcs).unwrap();
        assert!(start.elapsed() < WAIT, "{got} of 10 received");
    }
}

#[test]
fn a_lone_post_transmits_in_its_own_call() {
    // With nobody polling, a post builds its frame and kicks it out before it returns: no
    // hand-over to the (asleep) background thread, whose wake-up could take milliseconds.
    let (sides, da, _db, _link) = pairs(ProgressMode::Wakeup, 1);
    let (a, b) = &sides[0];
    post_recv(b, 1);
    let stats = da.progress_stats();
    for i in 0..3 {
        std::thread::sleep(Duration::from_millis(50));
        let (kicks, rounds) = (
            stats.kicks.load(Ordering::Relaxed),
            stats.driven_rounds.load(Ordering::Relaxed),
        );
        send(a, i, 0x55);
        assert_eq!(
            stats.kicks.load(Ordering::Relaxed),
            kicks + 1,
            "post {i} did not kick"
        );
        assert_eq!(stats.driven_rounds.load(Ordering::Relaxed), rounds + 1);
        let mut sends = 0;
        poll_until_recv(&b.cq, &mut sends);
        post_recv(b, 1);
        assert_eq!(send_status(&a.cq, i), WcStatus::Success);
    }
}

#[test]
fn a_burst_of_posts_before_any_poll_leaves_in_few_kicks() {
    // perftest's first window: a burst of posts, no poll yet. The burst's first posts leave
    // one kick each; from then on the poster kicks once per POST_FLUSH_BATCH posts, and the
    // background thread sends the burst's tail: not one kick (and one acknowledged message)
    // per post. A burst is posts closer than POST_BURST_GAP: a test thread descheduled
    // mid-burst starts a new one, so a loaded machine gets a few attempts.
    const BURST: u64 = 200;
    let mut seen = Vec::new();
    for _ in 0..5 {
        let (sides, da, db, _link) = pairs(ProgressMode::Wakeup, 1);
        let (a, b) = &sides[0];
        for i in 0..BURST {
            post_recv(b, i);
        }
        std::thread::sleep(Duration::from_millis(100));
        let kicks = |dev: &Device| dev.progress_stats().kicks.load(Ordering::Relaxed);
        let (a_kicks, b_kicks) = (kicks(&da), kicks(&db));
        for i in 0..BURST {
            send(a, i, i as u8);
        }
        let mut sends = 0;
        for i in 0..BURST {
            let wc = poll_until_recv(&b.cq, &mut sends);
            assert_eq!(wc.wr_id, i);
        }
        for i in 0..BURST {
            assert_eq!(send_status(&a.cq, i), WcStatus::Success);
        }
        let (a_kicks, b_kicks) = (kicks(&da) - a_kicks, kicks(&db) - b_kicks);
        let batched = da.progress_stats().batched_posts.load(Ordering::Relaxed);
        // One kick per post would be BURST kicks, and as many ACKs from B.
        if batched >= BURST / 2 && a_kicks < BURST / 4 && b_kicks < BURST / 4 {
            return;
        }
        seen.push((batched, a_kicks, b_kicks));
    }
    panic!("five bursts of {BURST} posts: (batched, A kicks, B kicks) {seen:?}");
}

#[test]
fn the_first_posts_of_a_burst_each_leave_in_their_own_call() {
    // A short burst (a few WRs, a CM exchange) never waits for a batch or for the background
    // thread: each of its first BURST_POSTS_SENT_AT_ONCE posts transmits in its own call.
    let (sides, da, _db, _link) = pairs(ProgressMode::Wakeup, 1);
    let (a, b) = &sides[0];
    let count = BURST_POSTS_SENT_AT_ONCE as u64;
    for i in 0..count {
        post_recv(b, i);
    }
    std::thread::sleep(Duration::from_millis(50));
    let stats = da.progress_stats();
    for i in 0..count {
        send(a, i, 0x33);
        // Counted, not timed: a post that finds the token taken leaves its frame to the
        // holder's next round, which is no batch either.
        assert_eq!(
            stats.batched_posts.load(Ordering::Relaxed),
            0,
            "post {i} of a burst waited for a batch"
        );
    }
    let mut sends = 0;
    for i in 0..count {
        assert_eq!(poll_until_recv(&b.cq, &mut sends).wr_id, i);
    }
}
